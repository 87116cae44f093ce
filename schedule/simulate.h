// The simulator: runs a schedule on costs and reports the makespan, each rank's bubble
// and peak activation memory, and the timeline. Made to be called in a search loop:
// build a Simulator once per schedule (it validates and indexes), then run() it on as
// many cost sets as needed; run() does no I/O and no allocation after its first call.
//
// Model (docs/schedules.md, "Simulator"). Every rank starts at time 0 and runs its list
// in order, one action at a time. A compute action starts when the rank is free and its
// dependencies are met, and takes F, B, W, B + W (BW) or the optimizer step time of its
// stage. A send costs the rank nothing; its message leaves when the link (one per
// ordered pair of ranks, first come first served) is free, takes bytes / bandwidth on
// it, and arrives latency later. A receive waits for the arrival. A compute-only
// schedule moves the same messages implicitly, sent when the producer ends. REDUCE
// costs the rank nothing and completes `reduce` later, before STEP; a reduction that spans
// pipeline ranks (Costs::reduce_group: a tied parameter's all-reduce) starts only when the
// last rank of its group has issued its REDUCE. STEP waits for every rank to reach its
// STEP (the global gradient norm) unless the optimizer step is post-validated
// (Costs::post_validated_step). Activation memory
// of a (micro-batch, stage) is taken when its F starts, partly released when its B ends
// and fully when its W (or BW) ends. With more ranks than cores (Costs::core_ranks) a
// compute action is slowed by the processes busy on its cores while it runs: the
// schedule is swept again with each action's slowdown moved half way to the load it
// saw, until none moves by more than 0.1% (a mean-field stand-in for the time slices).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"
#include "schedule/timeline.h"

namespace baton::schedule {

struct RankStats {
  double busy = 0.0;         // time in F, B, W, BW and STEP
  double start = 0.0;        // start of the rank's first compute action
  double end = 0.0;          // end of its last compute action
  double bubble = 0.0;       // idle share of the whole iteration: 1 - busy / makespan
  double span_bubble = 0.0;  // idle share of its own span: 1 - busy / (end - start)
  // Peak of live (micro-batch, stage) pairs (F started, W not finished), in micro-batches:
  // pairs / v, v = stages per rank and direction.
  double peak_micro_batches = 0.0;
  double peak_bytes = 0.0;  // from Costs::activation_bytes
};

struct SimResult {
  double makespan = 0.0;     // from 0 until the last action (and reduction) ends
  double bubble = 0.0;       // mean of the ranks' bubble
  double span_bubble = 0.0;  // the largest span_bubble (the zero-bubble paper's "bubble rate")
  double peak_micro_batches = 0.0;  // the largest over ranks
  double peak_bytes = 0.0;
  std::vector<RankStats> ranks;
};

class Simulator {
 public:
  // Validates (InputError carrying the validator's report, naming `source`) and indexes
  // the schedule.
  explicit Simulator(Schedule s, const std::string& source = "schedule");
  // The same on a schedule shared with the caller (not copied; it must not change while
  // the simulator lives): the Python module's simulate() on a Python-owned schedule.
  explicit Simulator(std::shared_ptr<const Schedule> s, const std::string& source = "schedule");

  const Schedule& schedule() const { return *s_; }
  // Runs on per-stage costs (Costs::check(num_stages) must hold; InputError otherwise).
  const SimResult& run(const Costs& c);
  const SimResult& result() const { return result_; }
  // The last run's timeline: compute on lane 0, transfers and reductions on lane 1. A STEP
  // spans from when its rank reached it, as the executor records it: the waits for the
  // reductions and the global norm are inside it.
  Timeline timeline(double seconds_per_unit = 1.0) const;
  // When action (rank, index) started and ended in the last run.
  double start_time(int rank, int index) const;
  double end_time(int rank, int index) const { return end_[position(rank, index)]; }
  // Every action's start and end in the last run, rank by rank in list order (rank 0's
  // actions first): num_actions() values each. One pass here rather than a call per
  // action from a caller (the Python module's result arrays).
  void action_times(double* start, double* end) const;

 private:
  size_t position(int rank, int index) const {
    return size_t(pos_of_[size_t(offset_[size_t(rank)] + index)]);
  }
  double duration(size_t pos) const;
  double composite_duration(size_t forward_pos) const;
  // One pass over the actions in execution order at the slowdowns in scale_.
  const SimResult& sweep();
  // Moves each compute action's slowdown half way to the busy processes its cores held
  // while it ran (the last sweep's); returns the largest relative move.
  double rescale();
  const Action& action_at(size_t pos) const;

  std::shared_ptr<const Schedule> s_;
  double chunks_ = 1.0;
  std::vector<int> offset_;  // per rank: its first node (nodes are numbered rank by rank)
  // Per position in execution order (a topological order of the actions), what run()
  // sweeps through: dependencies point a short way back.
  std::vector<int> pos_of_, node_at_;  // node -> position, position -> node
  std::vector<int32_t> rank_, stage_, link_;
  std::vector<ActionKind> kind_;
  // 1: the forward half of a composite OVERLAP_F_B, 2: its backward half (the next
  // position); 0 otherwise.
  std::vector<uint8_t> composite_;
  // Dependencies as (position << 1) | 1 when the time that counts is avail_ (a message
  // from another rank, or a REDUCE's completion) rather than end_.
  std::vector<int> dep_begin_, deps_;
  std::vector<int> link_dst_;
  std::vector<int> step_pos_;    // positions of the STEP actions when each is its rank's last
  std::vector<int> reduce_pos_;  // positions of the REDUCE actions (with step_pos_)
  // Per run.
  Costs costs_;  // a copy of the last costs (for timeline())
  // When an action starts (kept, not end - duration: (a + b) - b is not a, and a trace's
  // next action on the rank had started before it ended); ends; its result reaches others.
  std::vector<double> start_, end_, avail_;
  std::vector<double> arrived_;     // a STEP's: when its rank was free to run it
  std::vector<double> group_last_;  // per reduce group: its last REDUCE's end
  std::vector<double> free_, mem_, link_free_;
  std::vector<int> live_;
  // Per position: the time-slicing slowdown of a compute action (1 without core_ranks).
  std::vector<double> scale_;
  // Per rank, rescale()'s: its busy intervals in order and their lengths' running sum.
  std::vector<std::vector<double>> busy_start_, busy_end_, busy_sum_;
  SimResult result_;
};

// One-off convenience: Simulator(s).run(c).
SimResult simulate(const Schedule& s, const Costs& c);

}  // namespace baton::schedule
