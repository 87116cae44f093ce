// Schedules beyond the literature's fixed generators, run for real: the building-block
// V family (V-Min, V-Half, V-ZB) from the plan's schedule name, and PyTorch's own
// schedules dumped to CSV (tests/fixtures/torch_schedules: 1F1B, GPipe, interleaved,
// looped BFS, interleaved zero bubble, ZB-V and DualPipeV with composite
// (a;b)OVERLAP_F_B actions) in place of the plan's generated schedule (as `baton train
// --schedule FILE` does), each rank a thread over the local transport. Losses and gradient norms
// equal the one-process trainer's bit for bit when every stage accumulates its micro-batches in
// ascending order, else within 1e-5.
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

// Every schedule PyTorch wrote that baton takes (tests/fixtures/make_torch_schedules.py,
// both dialects), in place of the plan's generated one. Not here: PyTorch's own 1F1B
// dumps, which are invalid (tests/schedule/test_torch_csv.cpp), and the lowered `_comms`
// files, whose FSDP UNSHARD baton refuses.
TEST(Schedules, TorchCsvSchedulesMatchOneProcess) {
  struct CsvCase {
    const char* file;
    const char* generator;  // the plan's, for the stage placement the CSV assumes
    int pp, m;
    bool overlaps;  // runs composite OVERLAP_F_B actions
  };
  const CsvCase cases[] = {
      {"gpipe_p4_m8.csv", "gpipe", 4, 8, false},
      {"interleaved1f1b_p2_m4.csv", "interleaved-1f1b", 2, 4, false},
      {"interleaved1f1b_p4_m8.csv", "interleaved-1f1b", 4, 8, false},
      {"interleavedzb_p2_m4.csv", "interleaved-1f1b", 2, 4, false},
      {"interleavedzb_p4_m8.csv", "interleaved-1f1b", 4, 8, false},
      {"loopedbfs_p2_m4.csv", "interleaved-1f1b", 2, 4, false},
      {"zbv_p2_m4.csv", "zb-v", 2, 4, false},
      {"zbv_p4_m8.csv", "zb-v", 4, 8, false},
      {"dualpipev_p2_m4.csv", "dualpipev", 2, 4, true},
      {"dualpipev_p4_m8.csv", "dualpipev", 4, 8, true},
  };
  for (const CsvCase& c : cases) {
    const std::string path =
        std::string(BATON_SOURCE_DIR "/tests/fixtures/torch_schedules/") + c.file;
    SCOPED_TRACE(path);
    const schedule::Schedule csv = schedule::load_schedule(path);
    ASSERT_TRUE(schedule::validate(csv).ok);
    size_t composites = 0;
    for (const auto& list : csv.ranks)
      for (const auto& a : list) composites += a.overlap ? 1 : 0;
    EXPECT_EQ(composites > 0, c.overlaps);
    // The GPT has the layers for p = 2's four stages; the MLP for the rest.
    PlanSpec p = spec(c.generator, c.pp, c.m, c.pp == 2);
    SCOPED_TRACE(p.describe());
    Workspace ws("torch-csv");
    RunSettings s;
    s.steps = 4;
    auto plan = std::make_shared<partitioner::ResolvedPlan>(*resolve(p, ws));
    partitioner::use_schedule(*plan, csv, path);  // what `baton train --schedule` does
    EXPECT_EQ(plan->schedule, csv);
    const auto want = run_reference(p, ws, s);
    const auto got = run_threads(plan, train_options(ws, s));
    schedules_expect_same(got, want, same_accumulation_order(csv));
  }
}

// A schedule file may place the plan's chunks otherwise than its generator: a V over three
// chunks per rank (no generator makes one) under a plan that names interleaved-1f1b with 3
// chunks, which places them in a loop. It trains as one process does; the plan's own
// pipeline_ranks, if it lists them, must be the file's.
TEST(Schedules, AnotherPlacementFromAFileMatchesOneProcess) {
  PlanSpec p = spec("interleaved-1f1b", 2, 4, true);
  p.chunks = 3;
  SCOPED_TRACE(p.describe());
  Workspace ws("v3");
  RunSettings s;
  s.steps = 4;
  // rank 0 holds chunks 0, 3 and 4; rank 1 chunks 1, 2 and 5: the V's placement.
  const schedule::Schedule v3 = schedule::parse_text(
      "placement: 0 1 1 0 0 1\n"
      "0: 0F0 0F1 0F2 0F3 3F0 3F1 3F2 3F3 4F0 4F1 4F2 4F3 4BW0 4BW1 4BW2 4BW3 "
      "3BW0 3BW1 3BW2 3BW3 0BW0 0BW1 0BW2 0BW3\n"
      "1: 1F0 1F1 1F2 1F3 2F0 2F1 2F2 2F3 5F0 5F1 5F2 5F3 5BW0 5BW1 5BW2 5BW3 "
      "2BW0 2BW1 2BW2 2BW3 1BW0 1BW1 1BW2 1BW3\n",
      "v3.txt");
  auto plan = std::make_shared<partitioner::ResolvedPlan>(*resolve(p, ws));
  ASSERT_EQ(plan->schedule.placement, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  partitioner::use_schedule(*plan, v3, "v3.txt");
  EXPECT_EQ(plan->schedule.placement, v3.placement);
  EXPECT_EQ(plan->plan.stages[2].pipeline_ranks, std::vector<int>{1});
  EXPECT_EQ(plan->plan.stages[3].pipeline_ranks, std::vector<int>{0});
  const auto want = run_reference(p, ws, s);
  const auto got = run_threads(plan, train_options(ws, s));
  schedules_expect_same(got, want, true);

  // The plan's own pipeline_ranks (baton plan writes the generator's) name the conflict.
  json j = plan_json(p, ws);
  partitioner::Plan listed = partitioner::parse_plan(j, "plan.json", ws.dir);
  auto graph = partitioner::load_plan_model(listed);
  for (size_t k = 0; k < listed.stages.size(); ++k) listed.stages[k].pipeline_ranks = {int(k % 2)};
  partitioner::ResolvedPlan r = partitioner::resolve_plan(listed, graph);
  try {
    partitioner::use_schedule(r, v3, "v3.txt");
    ADD_FAILURE() << "the loop's pipeline_ranks were taken for a V";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "$.stages[2].pipeline_ranks: expected [1] (the v3.txt placement of model chunk "
                  "2), found [0]; a plan run with a schedule of another placement lists that "
                  "placement's ranks, or none"),
              std::string::npos)
        << e.what();
  }
  // Listing the file's ranks is what the message asks for, and is taken when the plan is
  // resolved with the file (it had been refused by the generator's placement first).
  for (size_t k = 0; k < listed.stages.size(); ++k)
    listed.stages[k].pipeline_ranks = {v3.placement[k]};
  const partitioner::ResolvedPlan with_file =
      partitioner::resolve_plan(listed, graph, &v3, "v3.txt");
  EXPECT_EQ(with_file.schedule.placement, v3.placement);
}

}  // namespace
}  // namespace baton::engine_testing
