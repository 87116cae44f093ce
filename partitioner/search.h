// Plan search: for N devices, every tensor-, pipeline- and data-parallel factorisation
// (degrees that divide what they split), micro-batch count, schedule and recompute choice
// the user left open; each candidate cut exactly under its ranks' memory capacity,
// simulated with schedule/'s simulator, and ranked by predicted step time. The best that
// fits comes first with its runners-up; when nothing fits, the candidate that misses by
// the least says which rank is short and by how much.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "partitioner/cost_model.h"
#include "partitioner/cut.h"
#include "partitioner/plan.h"
#include "stages/graph.h"

namespace baton::partitioner {

struct SearchOptions {
  int devices = 1;
  int64_t device_memory = 0;   // bytes per device; 0: unlimited
  int tp = 0, pp = 0, dp = 0;  // 0: searched
  // The spatial split's degree of every stage (partitioner/spatial.h), searched with the
  // tensor-parallel degree as a pair (tp x spatial ranks per pipeline rank): 0 searched
  // (models with image inputs only), 1 off.
  int spatial = 0;
  std::vector<std::string> schedules;  // empty: every generator
  int micro_batches = 0;               // per replica; 0: searched (divisors of its batch)
  int chunks = 0;            // interleaved-1f1b's stages per pipeline rank; 0: its default, 2
  int64_t global_batch = 0;  // samples per step (required)
  int recompute = -1;        // -1: searched, 0: off, 1: every layer
  std::vector<int> layers_per_stage;  // user's layer counts per model chunk (empty: cut)
  std::string optimizer = "adamw";
  // ZeRO: the plans found shard their optimizer state over their data-parallel replicas
  // (a parameter used by one layer holds 1/dp of its state; tied ones are counted whole).
  OptimizerSharding optimizer_sharding = OptimizerSharding::none;
  // How the plans' replicas agree (plan field dp_sync): the step costs its traffic
  // (local-sgd's sync amortised over its H steps), so the ranking compares modes.
  DpSync dp_sync;
  int keep = 5;  // the best and up to keep - 1 runners-up
  // Layers times devices the exact checks may cost in one search (0: the default, 2^16);
  // tests lower it to starve the search.
  int64_t exact_work = 0;
  SplitOverrides splits;
  // What the plans written from the result reference.
  std::string model_path;
  nlohmann::json model_json;
};

struct Candidate {
  Plan plan;
  double step_time = 0, bubble = 0, tokens_per_second = 0;
  int64_t peak = 0;                 // the largest rank's estimated peak (a parameter server's too)
  int peak_rank = 0;                // its pipeline rank; -1: an extra parameter-server rank
  std::vector<int64_t> rank_peaks;  // per pipeline rank (the exact ones once checked exactly)
  bool fits = true;
  double over = 0;  // peak / capacity when it does not fit
  std::string describe() const;
};

struct SearchResult {
  std::vector<Candidate> ranked;     // fitting candidates, fastest first (at most keep)
  std::optional<Candidate> closest;  // when nothing fits: the least over its capacity
  int evaluated = 0;                 // candidates cut under memory and simulated
  int pruned = 0;                    // skipped: their lower bound beat by `keep` plans
  int rejected = 0;                  // over capacity
  int exact_checks = 0;              // over by the composed bound, then evaluated exactly
  // Turned away on the composed bound alone, the exact checks' budget spent (when nothing
  // fits: such candidates are checked again with a fresh budget before this counts them).
  int bound_only = 0;
  std::vector<std::string> skipped;  // degrees or schedules that do not apply, and why
  double seconds = 0;                // time the search took
};

// What a rank holds between steps of each byte of a parameter used by one layer, beside
// the parameter itself: `whole` full copies and `sharded` copies of which it keeps
// 1/shard_over (the data-parallel degree under ZeRO and a parameter server). Parameters
// several layers use (tied) are never sharded: they hold `sharded` whole copies, their
// per-layer gradients and `shared_extra` more (the engine, docs/partitioner.md).
struct PersistentCopies {
  int whole = 1;         // the gradient (zero2: none whole, one sharded)
  int sharded = 2;       // the optimizer state (AdamW: 2)
  int shard_over = 1;    // 1: nothing sharded
  int shared_extra = 0;  // local SGD's anchor and momentum, a parameter server's pulls
};
// The copies under a plan's optimizer, sharding and sync at data-parallel degree dp;
// `shardable` false for schedules whose chunks ZeRO does not shard (DualPipe). Matches
// the exact estimate's terms (evaluate.cpp) but for the transient gradients of zero2's
// bucket in W, which only the exact check counts.
PersistentCopies persistent_copies(int optimizer_states, OptimizerSharding sharding,
                                   const DpSync& sync, int dp, bool shardable);

// What the cut needs from a cost table: per-layer times in ticks (the total scaled to
// 2^50, so sums are exact integers), per-layer memory with or without recompute, and the
// persistent bytes of parameters used by one layer (own) or several (shared).
LayerCosts layer_costs(const CostTable& table, bool recompute, const PersistentCopies& copies);
// Unsharded, synchronous: a gradient and `optimizer_states` copies per parameter byte.
LayerCosts layer_costs(const CostTable& table, bool recompute, int optimizer_states);

SearchResult search_plans(std::shared_ptr<const stages::Graph> graph, CostModel& model,
                          const SearchOptions& options);
// Why a search ranked nothing, as `baton plan` says it: no plan fits (in `device_memory`
// per device) or none matches the options, then the closest plan's overshoot or the first
// reason a degree or schedule was skipped. `more` follows the count of further reasons
// (" with --log-level debug"); empty, they are all listed instead.
std::string no_plan_message(const SearchResult& result, int64_t device_memory,
                            const std::string& more);

}  // namespace baton::partitioner
