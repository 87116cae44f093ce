// The run summary (`--summary`, docs/formats/summary.md) of both loops: the steps, the
// first and last loss equal to the records, every rank's peak and (under a plan) its
// estimate, the schedule.
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "memory/file_io.h"
#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"

namespace baton::engine_testing {
namespace {

json read_summary(const std::string& path) {
  return json::parse(memory::read_file(path));
}

TEST(Summary, OneProcess) {
  Workspace ws("summary1");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  RunSettings s;
  s.steps = 3;
  plan_json(p, ws);  // writes model.json
  engine::TrainOptions o = one_process_options(ws, s, 4, 2);
  o.loss_log = ws.path("loss.jsonl");
  o.summary_path = ws.path("summary.json");
  engine::TrainSummary run = engine::run_training(o);
  json j = read_summary(o.summary_path);
  EXPECT_EQ(j["format"], "baton-train-summary");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["first_step"], 0);
  EXPECT_EQ(j["steps_run"], 3);
  EXPECT_EQ(j["last_step"], 3);
  EXPECT_EQ(j["first_loss"].get<double>(), run.records.front().loss);
  EXPECT_EQ(j["last_loss"].get<double>(), run.records.back().loss);
  EXPECT_EQ(j["loss_log"], o.loss_log);
  EXPECT_EQ(j["tokens_per_step"], 4 * 16);
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  ASSERT_EQ(j["ranks"].size(), 1u);
  EXPECT_EQ(j["ranks"][0]["rank"], 0);
  EXPECT_EQ(j["ranks"][0]["peak_bytes"].get<int64_t>(), int64_t(run.peak_bytes));
  // The one-rank 1F1B plan's estimate, which one process runs as.
  const double estimate = j["ranks"][0]["estimated_peak_bytes"].get<double>();
  EXPECT_GE(estimate, double(run.peak_bytes));
  EXPECT_LE(estimate, 1.03 * double(run.peak_bytes));
  EXPECT_TRUE(j["schedule"].is_null());
  EXPECT_TRUE(j["plan"].is_null());
}

// `baton train` keeps no per-step records (they had grown 72 bytes a step for the whole
// run): the summary is the same from what it keeps apart.
TEST(Summary, WithoutRecordsTheSameFigures) {
  Workspace ws("summary_no_records");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  RunSettings s;
  s.steps = 4;
  plan_json(p, ws);
  engine::TrainOptions o = one_process_options(ws, s, 4, 2);
  o.data.eval_fraction = 0.1;
  o.eval_every = 2;
  o.summary_path = ws.path("kept.json");
  const engine::TrainSummary kept = engine::run_training(o);
  o.keep_records = false;
  o.summary_path = ws.path("apart.json");
  const engine::TrainSummary apart = engine::run_training(o);
  EXPECT_TRUE(apart.records.empty());
  ASSERT_EQ(kept.records.size(), 4u);
  json a = read_summary(ws.path("kept.json")), b = read_summary(ws.path("apart.json"));
  for (const char* key : {"steps_run", "last_step", "first_loss", "last_loss", "last_lr",
                          "evaluations", "last_eval_loss", "skipped_steps"})
    EXPECT_EQ(a[key], b[key]) << key;
  EXPECT_EQ(b["evaluations"].size(), 2u);
  EXPECT_EQ(b["last_loss"].get<double>(), kept.records.back().loss);
  EXPECT_GT(b["tokens_per_second"].get<double>(), 0);
}

// The median's step times stay within StepTimes::kCapacity, evenly spread over the run.
TEST(Summary, StepTimesAreBoundedAndEvenlySpread) {
  engine::StepTimes t;
  const int64_t n = 5 * int64_t(engine::StepTimes::kCapacity) + 3;
  for (int64_t i = 0; i < n; ++i) t.add(double(i));
  const std::vector<double>& kept = t.kept();
  ASSERT_LT(kept.size(), engine::StepTimes::kCapacity);
  ASSERT_GT(kept.size(), engine::StepTimes::kCapacity / 4);
  const double stride = kept[1] - kept[0];
  EXPECT_EQ(stride, 8.0);  // 5 x capacity steps: every 8th
  for (size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(kept[i], double(i) * stride) << i;
  EXPECT_GE(kept.back(), double(n) - stride);
}

TEST(Summary, PlanHasEveryRankAndItsEstimate) {
  Workspace ws("summary2");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {2, 2};
  p.schedule = "zb-h1";
  RunSettings s;
  s.steps = 2;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.summary_path = ws.path("summary.json");
  std::vector<engine::StepRecord> records = run_threads(resolve(p, ws), o);
  json j = read_summary(o.summary_path);
  EXPECT_EQ(j["steps_run"], 2);
  EXPECT_EQ(j["first_loss"].get<double>(), records.front().loss);
  EXPECT_EQ(j["last_loss"].get<double>(), records.back().loss);
  EXPECT_TRUE(j["loss_log"].is_null());
  EXPECT_EQ(j["schedule"], "zb-h1");
  EXPECT_EQ(j["tokens_per_step"], 4 * 2 * 16);
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(j["ranks"][size_t(k)]["rank"], k);
    EXPECT_GT(j["ranks"][size_t(k)]["peak_bytes"].get<int64_t>(), 0);
    EXPECT_GT(j["ranks"][size_t(k)]["estimated_peak_bytes"].get<int64_t>(), 0);
  }
  // A plan naming no optimizer is estimated with the run's: sgd's no state (AdamW's two
  // had been counted, and a run that fits refused) is the estimate of the plan naming sgd.
  o.optimizer.kind = stages::OptimizerConfig::Kind::sgd;
  o.optimizer.sgd.lr = 1e-2;
  run_threads(resolve(p, ws), o);
  const json sgd = read_summary(o.summary_path);
  auto named = std::make_shared<partitioner::ResolvedPlan>(*resolve(p, ws));
  named->plan.optimizer = "sgd";
  named->plan.optimizer_stated = true;
  partitioner::CostModel model(named->graph, partitioner::Machine{});
  partitioner::EvaluateOptions ev;
  ev.bucket_bytes = o.bucket_bytes;
  ev.recv_ahead = o.recv_ahead;
  const partitioner::PlanEstimate e = partitioner::evaluate_plan(*named, model, ev);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(sgd["ranks"][k]["estimated_peak_bytes"].get<int64_t>(), e.ranks[k].peak);
    EXPECT_LT(e.ranks[k].peak, j["ranks"][k]["estimated_peak_bytes"].get<int64_t>());
  }
}

}  // namespace
}  // namespace baton::engine_testing
