// Comparing a measured timeline (the executor's) with a predicted one (the simulator's):
// per action, the start, duration and end of both, and their difference; per kind, the
// mean durations; and the makespan of each. Actions are matched by (kind, micro-batch,
// stage); a measured run of several tensor-parallel or data-parallel ranks per pipeline
// rank contributes its lowest rank's events (the others run the same actions), and of
// several steps only the first (a post-validation rollback's redone STEP included in its
// makespan, reported apart). Each side is timed from its own first action.
#pragma once

#include <string>
#include <vector>

#include "schedule/timeline.h"

namespace baton::schedule {

struct ActionDiff {
  ActionKind kind = ActionKind::forward;
  int micro_batch = -1, stage = -1;
  int measured_rank = -1, predicted_rank = -1;
  double measured_start = 0, measured_end = 0;    // seconds
  double predicted_start = 0, predicted_end = 0;  // seconds
  bool matched = false;                           // found in both
};

struct KindSummary {
  ActionKind kind = ActionKind::forward;
  int count = 0;
  double measured_mean = 0, predicted_mean = 0;  // mean duration, seconds
};

struct TraceComparison {
  std::vector<ActionDiff> actions;  // in predicted order (rank, start)
  std::vector<KindSummary> kinds;
  double measured_makespan = 0, predicted_makespan = 0;  // seconds
  int unmatched_measured = 0, unmatched_predicted = 0;
  double mean_abs_start_diff = 0, mean_abs_duration_diff = 0;  // over matched compute actions
  // Post-validation rollbacks in the measured step: each redone update is a second STEP
  // event of its rank, in the makespan but not in `actions` or `kinds` (the simulator does
  // not model rollbacks); their count and mean duration (seconds).
  int redone_steps = 0;
  double redo_mean = 0;
  // The schedules the timelines name when they differ (a run of `--schedule FILE` against
  // the plan's own prediction): a note the report opens with; empty otherwise.
  std::string schedule_note;
};

// InputError when either timeline holds no pipeline action, when the two differ in
// pipeline ranks (counted by the sets of stages ranks run), stages or micro-batches (the
// traces of different plans), when they share no action (a trace of another kind or
// schedule), or when the prediction holds an action twice (a measured trace of several
// steps or ranks), or when the two are given the wrong way round (the timeline passed as
// measured is named "predicted: ..." and the other "measured: ..."), naming them by the
// names given.
TraceComparison compare_timelines(const Timeline& measured, const Timeline& predicted,
                                  const std::string& measured_name = "the measured timeline",
                                  const std::string& predicted_name = "the predicted timeline");

// A text report: the summary, the kinds, and (with `actions`) one line per action.
std::string format_comparison(const TraceComparison& c, bool actions);

}  // namespace baton::schedule
