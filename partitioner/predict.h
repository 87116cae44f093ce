// The predicted timeline of one training step of a plan: the simulator (schedule/) run on
// the costs the cost model gives (FLOPs at the machine's rate, or the op times `baton
// profile` measured), in the form the executor's measured timelines take, so that
// `baton trace compare` can set the two side by side.
#pragma once

#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"
#include "schedule/timeline.h"

namespace baton::partitioner {

struct Prediction {
  schedule::Timeline timeline;  // seconds
  double step_time = 0;         // seconds (the makespan)
  double bubble = 0;
};

// The step `evaluate_plan` predicts, with its timeline. A step longer than a Chrome trace
// holds (schedule::kMaxTraceMicroseconds, about 31 years) or not finite is an InputError
// naming `costs_path` (the model's measured costs) and its longest op time, or --flops.
Prediction predict_step(const ResolvedPlan& r, CostModel& model,
                        const std::string& costs_path = "");

}  // namespace baton::partitioner
