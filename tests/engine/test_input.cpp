// Bad input to the engine: a schedule file that does not fit the plan, a world of the
// wrong size, an executor given an unlowered schedule or Stages that do not match it.
// Errors name the file or field and what was expected.
#include <gtest/gtest.h>

#include "engine/executor.h"
#include "engine/rank_engine.h"
#include "engine_harness.h"
#include "memory/error.h"
#include "schedule/forward_only.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "transport/local.h"

namespace baton::engine_testing {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

PlanSpec pp2() {
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {1, 1};
  p.schedule = "1f1b";
  return p;
}

TEST(EngineInput, ScheduleFileMustFitThePlan) {
  Workspace ws("input");
  auto plan = resolve(pp2(), ws);
  partitioner::ResolvedPlan r = *plan;
  schedule::Schedule other = schedule::generate("1f1b", 2, 8);
  EXPECT_EQ(message_of([&] { partitioner::use_schedule(r, other, "mine.txt"); }),
            "mine.txt: micro_batches: the plan needs 4, the schedule has 8");
  other = schedule::generate("1f1b", 4, 4);
  EXPECT_EQ(message_of([&] { partitioner::use_schedule(r, other, "mine.txt"); }),
            "mine.txt: ranks: the plan needs 2 (pipeline ranks), the schedule has 4");
  other = schedule::generate("interleaved-1f1b", 2, 4);
  EXPECT_EQ(message_of([&] { partitioner::use_schedule(r, other, "mine.txt"); }),
            "mine.txt: model chunks: the plan needs 2 (placement [0 1]), the schedule has 4 "
            "(placement [0 1 0 1])");
  // An evaluation (forward-only) schedule trains nothing.
  EXPECT_EQ(
      message_of([&] { partitioner::use_schedule(r, schedule::forward_only(2, 4), "fwd.txt"); }),
      "fwd.txt: a forward-only schedule (evaluation) cannot train: expected backwards (B "
      "and W, or BW) for every micro-batch");
  // A fitting one (zb-h1 splits B and W) is taken.
  partitioner::use_schedule(r, schedule::generate("zb-h1", 2, 4), "zb.txt");
  EXPECT_EQ(r.schedule.name, "zb-h1");
}

TEST(EngineInput, WorldMustMatchThePlan) {
  Workspace ws("input");
  auto plan = resolve(pp2(), ws);
  auto world = transport::make_local_world(1);
  engine::RankEngineOptions o;
  std::string msg = message_of([&] { engine::RankEngine e(plan, world[0], o); });
  EXPECT_NE(msg.find("$.devices: the plan has 2 ranks, the job 1"), std::string::npos) << msg;
}

TEST(EngineInput, ExecutorChecksItsSchedule) {
  Workspace ws("input");
  auto plan = resolve(pp2(), ws);
  engine::ExecutorConfig c;
  c.schedule = plan->schedule;  // compute-only: not lowered
  c.rank = 0;
  EXPECT_NE(message_of([&] { engine::Executor e(c); }).find("not lowered"), std::string::npos);
  c.schedule = schedule::lower(plan->schedule);
  c.rank = 5;
  EXPECT_NE(
      message_of([&] { engine::Executor e(c); }).find("rank 5 outside the schedule's 2 ranks"),
      std::string::npos);
  c.rank = 0;
  EXPECT_NE(message_of([&] { engine::Executor e(c); }).find("no Stage for schedule stage 0"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::engine_testing
