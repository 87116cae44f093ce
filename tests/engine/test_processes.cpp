// Real processes: `baton launch -n N -- baton train --plan ...` over UCX against
// `baton train` on one process, comparing the --loss-log files line by line: PP2 x TP2 x
// DP2 GPT under 1F1B and ZB-V, PP4 GPT interleaved, the MLP under DualPipeV with data
// parallelism, a hand-written schedule file from examples/ (pure pipeline: bit for bit),
// and a plan made by `baton plan`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "engine_harness.h"
#include "process_helpers.h"

namespace baton::engine_testing {
namespace {

struct LossLine {
  int64_t step;
  double loss, grad_norm;
};

std::vector<LossLine> read_loss_log(const std::string& path) {
  std::vector<LossLine> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    out.push_back({j["step"].get<int64_t>(), j["loss"].get<double>(), j["grad_norm"].get<double>()});
  }
  return out;
}

void compare(const std::string& got_path, const std::string& want_path, bool bitwise, int64_t steps) {
  std::vector<LossLine> got = read_loss_log(got_path), want = read_loss_log(want_path);
  ASSERT_EQ(int64_t(want.size()), steps);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i].step);
    if (bitwise) {
      EXPECT_EQ(got[i].loss, want[i].loss) << "step " << i + 1;
      EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << i + 1;
    } else {
      EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm) << "step " << i + 1;
    }
  }
}

// The one-process run of the same model, seed, data and global batch.
void reference(const Workspace& ws, int64_t batch, int64_t micro_batches, int64_t steps, const std::string& log) {
  std::string cmd = baton() + " train --model " + ws.path("model.json") + " --data " + data_file() +
                    " --steps " + std::to_string(steps) + " --batch " + std::to_string(batch) +
                    " --micro-batches " + std::to_string(micro_batches) + common_flags() + " --loss-log " + log;
  ASSERT_EQ(run(cmd, ws.path("reference.out")), 0) << slurp(ws.path("reference.out"));
}

void plan_run(const Workspace& ws, const PlanSpec& p, const std::string& extra, bool bitwise, int64_t steps = 20) {
  SCOPED_TRACE(p.describe() + extra);
  std::ofstream(ws.path("plan.json")) << plan_json(p, ws).dump(2);
  int n = 0;
  for (int t : p.tp) n += t * p.dp;
  std::string cmd = baton() + " launch -n " + std::to_string(n) + " -- " + baton() + " train --plan " +
                    ws.path("plan.json") + " --data " + data_file() + " --steps " + std::to_string(steps) +
                    common_flags() + " --loss-log " + ws.path("plan.jsonl") + extra;
  ASSERT_EQ(run(cmd, ws.path("plan.out")), 0) << slurp(ws.path("plan.out"));
  reference(ws, int64_t(p.dp) * p.micro_batches * p.micro_batch_size, int64_t(p.dp) * p.micro_batches, steps,
            ws.path("reference.jsonl"));
  compare(ws.path("plan.jsonl"), ws.path("reference.jsonl"), bitwise, steps);
}

TEST(Processes, GptPp2Tp2Dp2OneFOneB) {
  Workspace ws("proc");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {2, 2};
  p.dp = 2;
  p.schedule = "1f1b";
  plan_run(ws, p, "", false);
}

TEST(Processes, GptPp2Tp2Dp2ZeroBubbleV) {
  Workspace ws("proc");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {2, 2};
  p.dp = 2;
  p.schedule = "zb-v";
  plan_run(ws, p, "", false);
}

TEST(Processes, GptPp4Interleaved) {
  Workspace ws("proc");
  PlanSpec p;
  p.model = tiny_gpt_json(6);
  p.tp = {1, 1, 1, 1};
  p.schedule = "interleaved-1f1b";
  p.micro_batches = 8;
  p.micro_batch_size = 1;
  plan_run(ws, p, "", true);
}

TEST(Processes, MlpDualPipeVWithDataParallelism) {
  Workspace ws("proc");
  PlanSpec p;
  p.model = tiny_mlp_json();
  p.tp = {1, 1};
  p.dp = 2;
  p.schedule = "dualpipev";
  plan_run(ws, p, "", false);
}

// examples/schedules/1f1b_p4_m8.txt replaces the plan's generator: pure pipeline
// parallelism in the one-process trainer's accumulation order, so bit for bit.
TEST(Processes, HandWrittenScheduleFile) {
  Workspace ws("proc");
  PlanSpec p;
  p.model = tiny_gpt_json(6);
  p.tp = {1, 1, 1, 1};
  p.schedule = "1f1b";
  p.micro_batches = 8;
  p.micro_batch_size = 1;
  plan_run(ws, p, " --schedule " + source_dir() + "/examples/schedules/1f1b_p4_m8.txt", true);
}

// A plan `baton plan` chose for 4 devices.
TEST(Processes, PlanFromBatonPlan) {
  Workspace ws("proc");
  std::ofstream(ws.path("model.json")) << tiny_gpt_json(2).dump(2);
  std::string cmd = baton() + " plan --model " + ws.path("model.json") + " --devices 4 --batch 8 -o " +
                    ws.path("plan.json");
  ASSERT_EQ(run(cmd, ws.path("plan-search.out")), 0) << slurp(ws.path("plan-search.out"));
  json plan = json::parse(slurp(ws.path("plan.json")));
  std::printf("baton plan chose: parallel %s, schedule %s, batch %s\n", plan["parallel"].dump().c_str(),
              plan["schedule"].dump().c_str(), plan["batch"].dump().c_str());
  const int64_t dp = plan["parallel"].value("dp", 1);
  const int64_t m = plan["schedule"]["micro_batches"].get<int64_t>();
  const int64_t b = plan["batch"]["micro_batch_size"].get<int64_t>();
  cmd = baton() + " launch -n 4 -- " + baton() + " train --plan " + ws.path("plan.json") + " --data " +
        data_file() + " --steps 20" + common_flags() + " --loss-log " + ws.path("plan.jsonl");
  ASSERT_EQ(run(cmd, ws.path("plan.out")), 0) << slurp(ws.path("plan.out"));
  reference(ws, dp * m * b, dp * m, 20, ws.path("reference.jsonl"));
  compare(ws.path("plan.jsonl"), ws.path("reference.jsonl"), false, 20);
}

}  // namespace
}  // namespace baton::engine_testing
