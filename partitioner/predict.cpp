#include "partitioner/predict.h"

#include <cmath>
#include <cstdio>

#include "memory/error.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"

namespace baton::partitioner {
namespace {

std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string seconds_text(double s) {
  return number_text(s) + " s";
}

// The cost file's longest op time, by its JSON path: what made a step too long to hold.
std::string longest_op_time(const MeasuredCosts& c) {
  std::string where;
  double most = -1;
  auto scan = [&](const std::string& at, const std::map<std::string, MeasuredCosts::Op>& ops) {
    for (const auto& [name, op] : ops)
      for (const auto& [field, t] :
           {std::pair{"forward", op.forward}, std::pair{"backward_input", op.backward_input},
            std::pair{"backward_weight", op.backward_weight}})
        if (t > most) {
          most = t;
          where = at + "." + name + "." + field;
        }
  };
  auto scan_batch = [&](const std::string& at, const auto& ops, const auto& tp_ops) {
    scan(at + "ops", ops);
    for (const auto& [t, o] : tp_ops) scan(at + "tp_ops." + std::to_string(t), o);
  };
  scan_batch("$.", c.ops, c.tp_ops);
  for (size_t i = 0; i < c.more_batches.size(); ++i)
    scan_batch("$.more_batches[" + std::to_string(i) + "].", c.more_batches[i].ops,
               c.more_batches[i].tp_ops);
  return where.empty() ? "no op time" : where + " = " + seconds_text(most);
}

// A step a Chrome trace can hold (the bound to_chrome_trace and from_chrome_trace share):
// every event ends by the makespan, so the makespan within it bounds them all. Checked
// before anything is printed: absurd costs had printed a step time of hundreds of digits.
void check_step_time(const Prediction& p, const CostModel& model, const std::string& costs_path) {
  const double limit = schedule::kMaxTraceMicroseconds * 1e-6;
  if (std::isfinite(p.step_time) && p.step_time <= limit) return;
  const schedule::TimelineEvent* longest = nullptr;
  for (const schedule::TimelineEvent& e : p.timeline.events)
    if (!longest || !(e.end - e.start <= longest->end - longest->start)) longest = &e;
  std::string what = "the predicted step takes " + seconds_text(p.step_time);
  if (longest)
    what += " (" +
            schedule::to_token(schedule::Action{longest->kind, longest->micro_batch, longest->stage,
                                                longest->peer}) +
            " on rank " + std::to_string(longest->rank) + " alone " +
            seconds_text(longest->end - longest->start) + ")";
  what += ", beyond the " + seconds_text(limit) +
          " (1e15 us, about 31 years) a timeline holds: costs too large";
  if (const MeasuredCosts* m = model.measured_costs())
    throw InputError((costs_path.empty() ? std::string("the cost file") : costs_path) + ": " +
                     what + " (its longest op time is " + longest_op_time(*m) + ", in_step " +
                     number_text(m->in_step) + ")");
  throw InputError(what + " at --flops " + number_text(model.machine().flops) + " FLOP/s");
}

}  // namespace

Prediction predict_step(const ResolvedPlan& r, CostModel& model, const std::string& costs_path) {
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
  check_step_time(p, model, costs_path);
  return p;
}

}  // namespace baton::partitioner
