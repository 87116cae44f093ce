// Schedules beyond the literature's fixed generators, run for real: the building-block
// V family (V-Min, V-Half, V-ZB) from the plan's schedule name, and PyTorch's own
// DualPipeV dumped to CSV (tests/fixtures/torch_schedules, with composite
// (a;b)OVERLAP_F_B actions) in place of the plan's generated schedule (as `baton train
// --schedule FILE` does), each rank a thread over the local
// transport. Losses and gradient norms equal the one-process trainer's bit for bit when
// every stage accumulates its micro-batches in ascending order, else within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine_harness.h"
#include "partitioner/resolved_plan.h"
#include "schedule/schedule_io.h"
#include "schedule/validate.h"

namespace baton::engine_testing {
namespace {

void schedules_expect_same(const std::vector<engine::StepRecord>& got,
                           const std::vector<engine::StepRecord>& want, bool bitwise) {
  std::printf("%s\n", bitwise ? "bit for bit" : "within 1e-5 relative");
  expect_steps_match(got, want, bitwise);
}

PlanSpec spec(const std::string& schedule, int pp, int m, bool gpt) {
  PlanSpec p;
  p.model = gpt ? tiny_gpt_json() : tiny_mlp_json();
  p.tp.assign(size_t(pp), 1);
  p.schedule = schedule;
  p.micro_batches = m;
  p.micro_batch_size = 8 / m;
  return p;
}

TEST(Schedules, VFamilyMatchesOneProcess) {
  struct VCase {
    const char* name;
    int pp, m;
    bool gpt;
  };
  for (const VCase& c : {VCase{"v-half", 2, 4, true}, VCase{"v-half", 4, 8, false},
                         VCase{"v-min", 4, 8, false}, VCase{"v-zb", 4, 8, false}}) {
    PlanSpec p = spec(c.name, c.pp, c.m, c.gpt);
    SCOPED_TRACE(p.describe());
    Workspace ws("vfamily");
    RunSettings s;
    s.steps = 10;
    auto plan = resolve(p, ws);
    EXPECT_EQ(plan->schedule.name, c.name);
    const auto want = run_reference(p, ws, s);
    const auto got = run_threads(plan, train_options(ws, s));
    schedules_expect_same(got, want, same_accumulation_order(plan->schedule));
  }
}

TEST(Schedules, TorchDualPipeVCsvMatchesOneProcess) {
  struct CsvCase {
    const char* file;
    int pp, m;
    bool gpt;
  };
  for (const CsvCase& c :
       {CsvCase{"dualpipev_p2_m4.csv", 2, 4, true}, CsvCase{"dualpipev_p4_m8.csv", 4, 8, false}}) {
    const std::string path =
        std::string(BATON_SOURCE_DIR "/tests/fixtures/torch_schedules/") + c.file;
    const schedule::Schedule csv = schedule::load_schedule(path);
    ASSERT_TRUE(schedule::validate(csv).ok);
    size_t composites = 0;
    for (const auto& list : csv.ranks)
      for (const auto& a : list) composites += a.overlap ? 1 : 0;
    EXPECT_GT(composites, 0u) << path;  // the schedule runs OVERLAP_F_B actions
    // The plan's generator gives the V placement; the CSV replaces its schedule.
    PlanSpec p = spec("dualpipev", c.pp, c.m, c.gpt);
    SCOPED_TRACE(p.describe() + " " + c.file);
    Workspace ws("torch-dualpipev");
    RunSettings s;
    s.steps = 10;
    auto plan = std::make_shared<partitioner::ResolvedPlan>(*resolve(p, ws));
    partitioner::use_schedule(*plan, csv, path);  // what `baton train --schedule` does
    EXPECT_EQ(plan->schedule, csv);
    const auto want = run_reference(p, ws, s);
    const auto got = run_threads(plan, train_options(ws, s));
    schedules_expect_same(got, want, same_accumulation_order(csv));
  }
}

}  // namespace
}  // namespace baton::engine_testing
