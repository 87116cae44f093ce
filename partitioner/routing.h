// Boundary routing: how the values crossing a pipeline boundary move between the ranks
// of the two stages, given per-stage tensor-parallel degrees, so the executor only
// executes the list. For the boundary after schedule stage s (to s + 1 in the same
// direction), with t senders and u receivers in the same replica:
//
//   replicated value (every rank of a group holds all of it; the residual stream):
//     t == u   one to one: rank i of s sends it whole to rank i of s + 1
//     t <  u   broadcast: receiver j gets it whole from sender j mod t
//     t >  u   gather: receiver j gets it in parts from the senders i with i mod u == j,
//              part k from the k-th of them
//   split value (tensor-parallel shards; only where t == u): rank i sends its shard to rank i
//
// Gradients flow back over the same boundary by the same rule with the roles swapped
// (the gradient of a replicated value is the same on every rank of the receiving group:
// its tp_copy all-reduced it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "partitioner/evaluate.h"

namespace baton::partitioner {

struct Transfer {
  enum class Kind { send, recv };
  enum class Phase { activation, gradient };  // forward values, or their gradients backward
  Kind kind = Kind::send;
  Phase phase = Phase::activation;
  int peer = -1;      // global rank
  std::string value;  // the value's name (the same in both physical graphs)
  int part = 0;       // part `part` of `parts` equal parts of the flattened tensor
  int parts = 1;
};

// The transfers `rank` takes part in across the boundary after schedule stage `stage`,
// for one micro-batch: activations in the forward phase, gradients in the backward one.
// Empty when the rank holds neither side, when both stages sit on the same rank (they
// hand values over in memory), or when `stage` ends its direction.
std::vector<Transfer> boundary_transfers(const ResolvedPlan& r, int rank, int stage);

// Elements [begin, end) of part `part` of `parts` of a tensor of `numel` elements, cut
// at rows of `row` elements (the last dimension) so that parts are whole rows when they
// can be.
std::pair<int64_t, int64_t> part_range(int64_t numel, int64_t row, int part, int parts);

}  // namespace baton::partitioner
