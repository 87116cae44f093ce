// The pipeline cut: L layers into K contiguous, non-empty stages that minimise the
// slowest stage's time, subject to each stage's memory capacity, optional fixed layer
// counts per stage and cut positions that are allowed. Exact (docs/partitioner.md,
// "Pipeline cut"): a bisection on the bottleneck over integer times, each step an O(K L)
// feasibility test that is exact because every stage constraint is closed under taking
// sub-ranges (a stage that fits still fits with fewer layers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "partitioner/memory_model.h"

namespace baton::partitioner {

// What the layers cost for one kind of stage (a tensor-parallel degree and recompute
// choice): integer times, per-layer memory figures and persistent bytes.
struct LayerCosts {
  std::vector<int64_t> time;          // per layer (F + B + W, in ticks)
  std::vector<MicroBatchMemory> mem;  // per layer, the layer walked alone
  std::vector<int64_t> input_bytes;   // per layer: model inputs it reads first (held through F)
  std::vector<int64_t> own_bytes;     // parameters only this layer uses: params + grads + state
  struct Shared {
    int64_t bytes = 0;        // one copy of the parameter
    std::vector<int> layers;  // the layers that use it, ascending
  };
  std::vector<Shared> shared;  // parameters several layers use (tied embeddings)
  int optimizer_states = 2;    // whole copies of a shared parameter's state
  int shared_extra = 0;        // more whole copies of it (search.h, PersistentCopies)
};

struct CutStage {
  int costs = 0;                // index of its LayerCosts
  int64_t capacity = 0;         // bytes; 0: unlimited
  std::vector<PeakTerm> terms;  // the schedule's peak terms for the stage's rank
  int fixed_layers = 0;         // > 0: exactly this many layers
};

struct CutResult {
  bool feasible = false;
  std::vector<int> bounds;  // K + 1 positions: stage k holds [bounds[k], bounds[k+1])
  int64_t bottleneck = 0;   // the slowest stage's time, in ticks
  std::string reason;       // why not feasible
};

class PreparedCosts;

// Per start i, the furthest end whose memory fits a capacity under given peak terms:
// computed on demand (galloping from what is known: the reach is monotone in the start)
// and kept, because a search asks about the same constraint often and only near the cut.
// Not safe to query from two threads at once.
class MemoryReach {
 public:
  MemoryReach(const PreparedCosts& c, int64_t capacity, std::vector<PeakTerm> terms);
  int at(int i) const;

 private:
  bool fits(int i, int j) const;
  const PreparedCosts& c_;
  int64_t capacity_;
  std::vector<PeakTerm> terms_;
  mutable std::vector<int> reach_;  // -1: not known yet
};

// One LayerCosts with prefix sums and range-maximum tables: O(1) queries on any range.
// Built once and shared by every cut over the same layers.
class PreparedCosts {
 public:
  explicit PreparedCosts(LayerCosts costs);
  int layers() const { return L_; }
  const LayerCosts& costs() const { return c_; }
  int64_t time(int i, int j) const { return pt_[size_t(j)] - pt_[size_t(i)]; }
  int64_t total_time() const { return pt_.back(); }
  MicroBatchMemory micro_batch(int i, int j) const;
  int64_t persistent(int i, int j) const;
  // The largest end j <= limit with time(i, j) <= bound (i when not even one layer fits).
  int time_reach(int i, int64_t bound, int limit) const;
  // The smallest start i <= j with time(i, j) <= bound.
  int time_start(int j, int64_t bound) const;
  // The memory reach of a constraint (cached per capacity and terms).
  std::shared_ptr<const MemoryReach> memory_reach(int64_t capacity,
                                                  const std::vector<PeakTerm>& terms) const;
  int64_t memory(int i, int j, const std::vector<PeakTerm>& terms) const {
    return persistent(i, j) + eval_peak(terms, micro_batch(i, j));
  }

 private:
  int64_t range_max(const std::vector<std::vector<int64_t>>& st, int i, int j) const;
  LayerCosts c_;
  int L_ = 0;
  std::vector<int64_t> pt_, ps_, pw_, pown_, pin_, ph_;
  std::vector<std::vector<int64_t>> fmax_, bmax_, fusedmax_;  // sparse tables of A, Bq, Fq
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const MemoryReach>> reach_cache_;
};

class Cutter {
 public:
  // `allowed[c]` for c in 0..L: may a stage boundary fall before layer c (empty: all).
  Cutter(std::vector<LayerCosts> costs, std::vector<CutStage> stages,
         std::vector<bool> allowed = {});
  Cutter(std::vector<std::shared_ptr<const PreparedCosts>> costs, std::vector<CutStage> stages,
         std::vector<bool> allowed = {});

  int layers() const { return L_; }
  int stages() const { return int(stages_.size()); }
  // Stage k's time and memory if it held [i, j).
  int64_t time(int k, int i, int j) const;
  int64_t memory(int k, int i, int j) const;
  MicroBatchMemory micro_batch(int k, int i, int j) const;  // composed from the layers
  int64_t persistent(int k, int i, int j) const;
  bool fits_memory(int k, int i, int j) const;

  // `at_least`: a bottleneck no cut can beat (the cut without memory limits, say), which
  // is tried first and bounds the bisection; -1: none known.
  CutResult solve(int64_t at_least = -1) const;
  // The bottleneck of given bounds (no feasibility check).
  int64_t bottleneck(const std::vector<int>& bounds) const;

 private:
  struct Prepared;
  using Reach = std::vector<std::shared_ptr<const MemoryReach>>;
  bool feasible(int64_t bound, const Reach& mem_reach, std::vector<int>* bounds) const;
  // Every stage alike, no capacity, no fixed counts, every cut allowed: greedy is exact.
  bool simple() const;
  bool feasible_greedy(int64_t bound, std::vector<int>* bounds) const;
  const PreparedCosts& of(int k) const { return *costs_[size_t(stages_[size_t(k)].costs)]; }

  int L_ = 0;
  std::vector<std::shared_ptr<const PreparedCosts>> costs_;
  std::vector<CutStage> stages_;
  std::vector<bool> allowed_;
};

// Seconds -> integer ticks with the scale `ticks_per_second` (to_ticks rounds).
int64_t to_ticks(double seconds, double ticks_per_second);

}  // namespace baton::partitioner
