// Local SGD and DiLoCo (plan field dp_sync "local-sgd"; engine/executor.h's DpSyncConfig):
// the state a replica keeps between synchronisations and the synchronisation itself.
//
// Each trainable parameter of the rank's stages has an anchor (its value at the last sync,
// the same on every replica) and, for the Nesterov outer optimizer, a momentum buffer.
// After every sync_every-th step the replicas' deltas from the anchor are summed over the
// data-parallel group (one asynchronous all-reduce per parameter, all posted before any
// is waited for) and divided by the number of replicas, giving the outer gradient
// g = -(mean delta). `average` sets the parameter to anchor - g (the replicas' mean);
// `nesterov` keeps m = mu m + g and sets anchor - lr (g + mu m) (PyTorch's SGD with
// nesterov=True, the first m being g). The new value is the next anchor. Every replica
// computes it from the same anchor and the same reduced sum, so they agree bit for bit.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "engine/executor.h"

namespace baton::engine::detail {

class LocalSgd {
 public:
  LocalSgd(const DpSyncConfig& config, const std::map<int, stages::Stage*>& stages);

  // Before a step: takes the anchors from the parameters if none were taken yet (the
  // parameters are final only once the caller has initialised or loaded them).
  void begin_step();
  // After the optimizer step of `step` (0-based): synchronises when step + 1 is a
  // multiple of sync_every. Returns whether it did.
  bool after_step(int64_t step);

  // The outer optimizer's state by (stage, parameter id), for checkpoints: anchors (null
  // until begin_step) and momenta (empty unless nesterov).
  struct Entry {
    int stage = 0;
    int param = 0;
    memory::Tensor anchor, momentum;
  };
  std::vector<Entry>& entries() { return entries_; }
  bool anchored() const { return anchored_; }
  // After a resume has set every entry's anchor (and momentum: zeros where undefined).
  void mark_anchored();
  const DpSyncConfig& config() const { return cfg_; }

 private:
  DpSyncConfig cfg_;
  std::map<int, stages::Stage*> stages_;
  std::vector<Entry> entries_;
  bool anchored_ = false;
};

}  // namespace baton::engine::detail
