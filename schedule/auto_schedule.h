// The automatic scheduler: given ranks, micro-batches, costs and a per-rank activation
// memory limit, builds a B/W-split schedule with the smallest simulated makespan it
// finds within the limit, and reports how the fixed schedules do under the same costs
// and limit.
//
// Method (docs/schedules.md, "Automatic schedule"): a memory-aware list scheduler
// (like the zero-bubble paper's heuristic) is run on the costs for several placements
// (one stage per rank, the V placement, two chunks per rank in a loop) and policies (a
// cap on in-flight micro-batches per rank, when a W may fill an idle gap, forward or
// backward first); the zero-bubble paper's round-by-round heuristic (zb_greedy_schedule)
// over its knobs, and every fixed generator's schedule split into B and W, are candidates
// too. Each candidate is simulated; the fastest whose peak memory fits wins, and a
// local search (moving single actions of a rank while the makespan drops and
// memory fits) polishes it. So the result never exceeds the limit and is never slower
// than the best fixed schedule that fits.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace baton::schedule {

struct AutoOptions {
  int num_ranks = 0;
  int num_micro_batches = 0;
  // The activation memory limit of each rank: one value for all, or one per rank.
  std::vector<double> memory_limit = {std::numeric_limits<double>::infinity()};
  // The limit's unit: bytes (against Costs::activation_bytes) or micro-batches (against
  // the simulator's peak_micro_batches).
  bool limit_in_bytes = false;
  bool include_fixed = true;  // fixed schedules are candidates (and listed in `fixed`)
  bool refine = true;         // local search (adjacent swaps) from the best candidate
  // At most this many list-scheduler runs (the policy grid is cut to fit); big
  // problems take time per run.
  int max_greedy_runs = 128;
  // What "fastest" means: the makespan of one iteration, or the longest rank span (from
  // a rank's first action to its last: the iteration time when iterations follow each
  // other without a barrier, the Zero Bubble paper's bubble rate). Ties: the lower peak.
  enum class Objective { makespan, span } objective = Objective::makespan;
  // Names the cost file in the errors of its values ("uc.json: costs: forward: ...").
  std::string costs_source;
  // Called between candidates and between the local search's tries; it may throw to stop
  // the search (the Python module raises Ctrl-C's KeyboardInterrupt through it: a search
  // at p = 128, m = 1024 takes half a minute).
  std::function<void()> poll;
};

// The objective's value of a simulation.
double objective_value(const SimResult& r, AutoOptions::Objective objective);
// "makespan" or "span"; InputError naming `where` otherwise.
AutoOptions::Objective parse_objective(const std::string& text, const std::string& where);

struct AutoCandidate {
  std::string name;     // "zb-h1", "greedy v-shape cap=p w-gap=0.5 B-first"
  bool defined = true;  // false: the generator does not apply (see note)
  bool fits = false;    // peak memory within the limit on every rank
  std::string note;     // why not defined
  double makespan = 0.0, bubble = 0.0, span_bubble = 0.0, peak_micro_batches = 0.0,
         peak_bytes = 0.0;
};

struct AutoResult {
  Schedule schedule;                 // the chosen one, compute-only with B and W split
  SimResult sim;                     // its simulation
  std::string chosen;                // the winning candidate's name
  std::vector<AutoCandidate> fixed;  // each fixed schedule under the same costs and limit
  AutoCandidate best_greedy;         // the best list-scheduler candidate
  int greedy_runs = 0;
};

// Throws InputError when the parameters are out of range, when no candidate could be
// simulated (the first candidate's error: e.g. per-stage costs for another stage count),
// or when no candidate fits the limit (naming the smallest peak any candidate reached).
AutoResult auto_schedule(const CostSpec& costs, const AutoOptions& options);

// One run of the list scheduler, exposed for tests and research: placement "loop" (v
// stages per rank) or "v" (V placement, v = 2); `cap` per rank in micro-batches (may be
// infinite); `w_gap`: a W fills an idle gap only if the gap is at least w_gap times
// its duration (0: always); `forward_first`: prefer F over B while under the cap.
// The limit is in the unit of `limit_in_bytes`. Returns a compute-only, B/W-split
// schedule; throws InputError if the limit cannot hold one micro-batch.
struct GreedyPolicy {
  std::string placement = "loop";
  int chunks = 1;
  std::vector<double> cap;  // per rank; empty: no cap
  double w_gap = 0.0;
  bool forward_first = false;
};
Schedule list_schedule(int ranks, int micro_batches, const Costs& costs,
                       const std::vector<double>& limit, bool limit_in_bytes,
                       const GreedyPolicy& policy);

// The round-by-round zero-bubble heuristic (one stage per rank; docs/schedules.md,
// "Automatic schedule"): a warm-up of as many forwards as memory holds and as fit before
// the first B arrives (`warm_up_delta` more or fewer), then rounds of one F per stage top
// down and one B per stage bottom up, W passes put where a rank would wait or must free
// memory. `forwards_fit_before_first_b`: a warm-up forward must end before the first B's
// gradient arrives (else it may run past it); `fill_small_waits`: a W also fills a wait
// shorter than the idle time other ranks already have (else that wait stays idle);
// `first_stage_drains_w`: once rank 0 has run every F, it runs its pending W's before
// each B. The limit is in the unit of `limit_in_bytes`. Returns a compute-only, B/W-split
// schedule; throws InputError if the limit cannot hold one micro-batch.
struct ZbGreedyPolicy {
  bool forwards_fit_before_first_b = false;
  bool fill_small_waits = true;
  bool first_stage_drains_w = true;
  int warm_up_delta = 0;
};
Schedule zb_greedy_schedule(int ranks, int micro_batches, const Costs& costs,
                            const std::vector<double>& limit, bool limit_in_bytes,
                            const ZbGreedyPolicy& policy);

// The local search alone: from a compute-only, one-direction schedule, moves single
// actions of a rank up to six places while the makespan (no link contention) drops, or
// holds while F and B end earlier in sum, keeping every rank's peak within `limit`.
// At most `budget` tries; `poll`, when given, before each. Returns the schedule unchanged
// if it deadlocks or does not fit.
Schedule refine_schedule(Schedule s, const Costs& costs, const std::vector<double>& limit,
                         bool limit_in_bytes, long long budget,
                         const std::function<void()>& poll = {});

}  // namespace baton::schedule
