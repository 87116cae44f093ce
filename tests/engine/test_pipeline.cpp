// Pure pipeline parallelism under every generated schedule, each rank a thread over the
// local transport: the loss and gradient norm of 20 training steps equal the one-process
// trainer's bit for bit where every stage accumulates its micro-batches' gradients in
// ascending order (as the one-process trainer does), and within 1e-5 relative otherwise
// (DualPipe, whose two model replicas each sum half of the micro-batches).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "engine_harness.h"
#include "schedule/generators.h"

namespace baton::engine_testing {
namespace {

struct PipelineCase {
  std::string schedule;
  int pp;
  int m;
  std::string model;  // "gpt" or "mlp"
};

std::string pipeline_name_of(const ::testing::TestParamInfo<PipelineCase>& info) {
  std::string s = info.param.schedule + "_pp" + std::to_string(info.param.pp) + "_m" +
                  std::to_string(info.param.m) + "_" + info.param.model;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Which schedules must equal the one-process trainer bit for bit: all whose stages sum
// their micro-batches' gradients in ascending order. DualPipe's two replicas each sum
// half of the micro-batches, so it is held to 1e-5 relative.
const std::map<std::string, bool> kBitForBit = {
    {"gpipe", true}, {"1f1b", true}, {"interleaved-1f1b", true}, {"zb-h1", true},
    {"zb-h2", true}, {"zb-v", true}, {"dualpipev", true},        {"dualpipe", false}};

class Pipeline : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(Pipeline, MatchesOneProcess) {
  const PipelineCase& c = GetParam();
  PlanSpec p;
  p.model = c.model == "gpt" ? tiny_gpt_json() : tiny_mlp_json();
  p.tp.assign(size_t(c.pp), 1);
  p.schedule = c.schedule;
  p.micro_batches = c.m;
  p.micro_batch_size = 8 / c.m;
  Workspace ws("pipeline");
  RunSettings s;
  auto plan = resolve(p, ws);
  SCOPED_TRACE(p.describe());
  std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  const auto it = kBitForBit.find(c.schedule);
  ASSERT_NE(it, kBitForBit.end()) << "state in kBitForBit whether " << c.schedule
                                  << " must match bit for bit";
  const bool bitwise = it->second;
  // The stated list agrees with the schedule's own accumulation order.
  EXPECT_EQ(same_accumulation_order(plan->schedule), bitwise);
  std::printf("%s: %s\n", p.describe().c_str(), bitwise ? "bit for bit" : "within 1e-5 relative");
  expect_steps_match(got, want, bitwise);
}

std::vector<PipelineCase> pipeline_cases() {
  std::vector<PipelineCase> out;
  for (std::string model : {"gpt", "mlp"})
    for (int pp : {1, 2, 4})
      for (const std::string& name : schedule::schedule_names()) {
        int m = pp == 4 ? 8 : 4;
        if (name == "dualpipe" && pp % 2 != 0) continue;
        out.push_back({name, pp, m, model});
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Schedules, Pipeline, ::testing::ValuesIn(pipeline_cases()),
                         pipeline_name_of);

// The pipeline's traffic over a communicator per direction of each pair (NCCL's form,
// transport/pair_routes.h; here each split from the local world): the same losses bit
// for bit, under a V schedule (a rank sending both ways) and across a change of
// tensor-parallel degree (one rank to two), every route split once per direction.
TEST(Pipeline, RoutedPerPairAndDirection) {
  for (const auto& [schedule, tp] : {std::pair{std::string("dualpipev"), std::vector<int>{1, 1}},
                                     std::pair{std::string("1f1b"), std::vector<int>{1, 2}}}) {
    PlanSpec p;
    // The MLP, whose layers tie nothing, for the change of degree.
    p.model = tp == std::vector<int>{1, 1} ? tiny_gpt_json() : tiny_mlp_json();
    p.tp = tp;
    p.schedule = schedule;
    p.micro_batches = 4;
    Workspace ws("pipeline-pairs");
    RunSettings s;
    s.steps = 4;
    SCOPED_TRACE(p.describe());
    auto plan = resolve(p, ws);
    std::vector<engine::StepRecord> want = run_threads(plan, train_options(ws, s));
    std::atomic<int> splits{0};
    engine::PlanTrainOptions o = train_options(ws, s);
    o.split_p2p_pair = [&](transport::Communicator& world, const std::vector<int>& members) {
      EXPECT_EQ(members.size(), 2u);
      EXPECT_LT(members[0], members[1]);
      ++splits;
      return world.split(members);
    };
    std::vector<engine::StepRecord> got = run_threads(plan, o);
    // Each pair of ranks that exchange values, both directions, on both of its ranks.
    const int pairs = tp == std::vector<int>{1, 2} ? 2 : 1;
    EXPECT_EQ(splits.load(), pairs * 2 * 2);
    expect_steps_match(got, want, true);
  }
}

}  // namespace
}  // namespace baton::engine_testing
