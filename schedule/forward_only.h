// Evaluation schedules: forward passes through the pipeline and nothing else. The
// validator takes a forward-only schedule as complete without backward, the simulator
// keeps no activations after its forwards, and generate("forward-only", ...) makes one.
#pragma once

#include "schedule/schedule.h"

namespace baton::schedule {

// Every rank runs the forward of each micro-batch on its stage, in order, and nothing
// else (no backward, REDUCE or STEP); one stage per rank. Not a training schedule, so
// not in schedule_names().
Schedule forward_only(int ranks, int micro_batches);

// The evaluation pass of a training schedule: its ranks, micro-batches, directions and
// placement; each rank runs its stages in increasing order, every micro-batch of a stage's
// direction before the next stage (no cycle: each rank follows the global (stage,
// micro-batch) order). A plan's schedule of any kind (interleaved, V, DualPipe) has one.
Schedule forward_only_like(const Schedule& training);

// True when the schedule has forwards and no backward (B, W, BW), REDUCE or STEP.
bool is_forward_only(const Schedule& s);

}  // namespace baton::schedule
