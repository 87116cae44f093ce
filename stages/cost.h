// The cost of a range of layers, for the partitioner's cost model and memory estimate:
// FLOPs of F, B and W per micro-batch (from each op's cost()), and bytes as the device
// allocator counts them: parameters, gradients, optimizer state, and what a micro-batch
// keeps between F and B (by the same StashPlan the Stage runs by, so the figure equals
// the measured growth of the allocator, tested).
#pragma once

#include <cstdint>
#include <set>

#include "stages/graph.h"

namespace baton::stages {

struct StageCost {
  double forward_flops = 0, backward_input_flops = 0, backward_weight_flops = 0;
  int64_t param_bytes = 0;  // parameters held
  int64_t grad_bytes = 0;   // gradient accumulators (one per using layer, + a total when shared)
  int64_t optimizer_bytes = 0;  // optimizer state (optimizer_states tensors per parameter)
  // Per micro-batch in flight between its F and its B:
  int64_t stash_bytes = 0;       // activations the stage allocates and keeps
  int64_t kept_input_bytes = 0;  // inputs it received (boundary, model inputs) and keeps alive
  // Per micro-batch between its B and its W (zero-bubble schedules); an upper bound, since
  // some output gradients share memory.
  int64_t weight_stash_bytes = 0;
  // Per micro-batch: the values received at the first cut and sent at the last (their
  // gradients travel back with the same sizes).
  int64_t boundary_in_bytes = 0, boundary_out_bytes = 0;
  int64_t forward_comm_bytes = 0, backward_comm_bytes = 0;  // tensor-parallel ops' payloads
  int64_t persistent_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// Layers [first, last) for micro-batches of `batch` samples; optimizer_states: 2 for
// AdamW, 1 for SGD with momentum, 0 for plain SGD.
StageCost estimate_stage(const Graph& g, int first, int last, int64_t batch,
                         const std::set<int>& recompute_layers = {}, int optimizer_states = 2);

}  // namespace baton::stages
