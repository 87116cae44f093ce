#include "partitioner/predict.h"

#include "schedule/lower.h"
#include "schedule/simulate.h"

namespace baton::partitioner {

Prediction predict_step(const ResolvedPlan& r, CostModel& model) {
  model.warn_threads(r.world(), r.plan.device);
  CostTable table = model.table_for(r.sharding, r.plan.micro_batch_size);
  schedule::Costs costs = schedule_costs(r, table, model.machine());
  // As evaluate_plan: transfers implicit (they cost their latency and bandwidth on the
  // link), reductions and the optimizer step explicit.
  schedule::LowerOptions lo;
  lo.transfers = false;
  schedule::Schedule lowered = schedule::lower(r.schedule, lo);
  schedule::Simulator sim(lowered);
  const schedule::SimResult& res = sim.run(costs);
  Prediction p;
  p.step_time = res.makespan;
  p.bubble = res.bubble;
  p.timeline = sim.timeline(1.0);
  p.timeline.name = "predicted: " + r.schedule.name;
  return p;
}

}  // namespace baton::partitioner
