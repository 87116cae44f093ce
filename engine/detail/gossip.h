// Gossip averaging (plan field dp_sync "gossip"; engine/executor.h's DpSyncConfig): after
// every optimizer step, `peers` rounds in which the replicas are paired at random and each
// pair averages its parameters. The pairing of a round is a permutation of the replicas
// drawn from (seed, step, round) by a fixed generator (splitmix64 and a Fisher-Yates
// shuffle, the same on every platform), consecutive entries paired, the last one idle
// when the count is odd; every replica computes it alone, so a run is reproducible and
// needs no agreement. A pair exchanges its trainable parameters point to point (all
// posted, then waited for) and both set (mine + theirs) / 2, which has the same bits on
// both sides (addition commutes, halving is exact).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/executor.h"

namespace baton::engine::detail {

class Gossip {
 public:
  Gossip(const DpSyncConfig& config, const std::map<int, stages::Stage*>& stages);

  // After the optimizer step of `step`: the rounds of averaging.
  void after_step(int64_t step);

  // Each replica's partner in round `round` of step `step` (-1: idle this round).
  static std::vector<int> pairing(uint64_t seed, int64_t step, int round, int replicas);

 private:
  DpSyncConfig cfg_;
  std::vector<std::pair<stages::Stage*, int>> params_;  // trainable (stage, parameter id)
};

}  // namespace baton::engine::detail
