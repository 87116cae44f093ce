// The executor's gradient reduction: the gradients of parameters held by several ranks
// (data-parallel replicas, tied parameters, DualPipe's replicas) are summed over their
// group in buckets, each bucket one asynchronous all-reduce started as soon as the last
// of its gradients is final (Stage::backward_weight's ready callback), so reduction
// overlaps the rest of the backward pass; finish() waits for them before the optimizer.
//
// Determinism: a group's buckets are fixed at construction (its parameters in
// descending id order, cut at bucket_bytes) and started in that order on every member,
// so every member issues the same collectives in the same order and the sums have the
// same bits on every run.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "engine/executor.h"

namespace baton::engine::detail {

class GradReducer {
 public:
  GradReducer(const std::vector<GradGroup>& groups, const std::map<int, stages::Stage*>& stages,
              size_t bucket_bytes);

  void begin_step();
  // Stage `stage`'s gradient of `param` is final for this step.
  void ready(int stage, int param);
  // Starts every bucket whose gradients are all final (in order); REDUCE calls it.
  void start_ready();
  // Waits for every reduction (all gradients must be final) and writes the sums back
  // into every local stage's gradient.
  void finish();
  // True when this rank reduces nothing (no group, no parameter held twice).
  bool empty() const { return groups_.empty(); }

 private:
  struct Param {
    int id = -1;
    std::vector<stages::Stage*> holders;  // local stages holding it, ascending stage
    std::vector<int> holder_stages;
    int waiting = 0;                      // holders not yet final this step
  };
  struct Bucket {
    std::vector<size_t> params;  // indices into Group::params
    int64_t elements = 0;
    memory::Tensor flat;         // several parameters: their gradients side by side
    transport::WorkPtr work;
    bool started = false;
  };
  struct Group {
    transport::Communicator* comm = nullptr;
    std::vector<Param> params;
    std::vector<Bucket> buckets;
    size_t next = 0;  // the first bucket not started
  };
  void try_start(Group& g);
  void start(Group& g, Bucket& b);

  std::vector<Group> groups_;
  std::map<std::pair<int, int>, std::pair<size_t, size_t>> where_;  // (stage, param) -> (group, param index)
};

}  // namespace baton::engine::detail
