// Post-validated optimizer steps (plan field optimizer_step: "post-validated"; docs/engine.md):
// every rank updates as soon as its own gradients are reduced and validates the update
// against the global norm afterwards. Where nothing is rolled back (no clipping) the
// losses are the synchronous step's bit for bit; where the clip triggers every step is
// rolled back and redone clipped (equal to the synchronous clipped run within 1e-6: in
// fact bit for bit, the redo is the synchronous update); a non-finite gradient on one
// rank skips the step on every rank in both modes, also under master weights (whose
// working copies the rollback must make the next forward cast again).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "engine/rank_engine.h"
#include "engine_harness.h"
#include "partitioner/plan.h"
#include "transport/local.h"

namespace baton::engine_testing {
namespace {

using memory::Tensor;

std::shared_ptr<const partitioner::ResolvedPlan> resolve_mode(const PlanSpec& p,
                                                              const Workspace& ws,
                                                              const std::string& mode) {
  json j = plan_json(p, ws);
  j["optimizer_step"] = mode;
  partitioner::Plan plan = partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
  EXPECT_EQ(plan.post_validated_step, mode == "post-validated");
  auto graph = partitioner::load_plan_model(plan);
  return std::make_shared<const partitioner::ResolvedPlan>(partitioner::resolve_plan(plan, graph));
}

std::vector<engine::StepRecord> post_validation_train(const PlanSpec& p, const std::string& mode,
                                                      const RunSettings& s) {
  Workspace ws("post-validation");
  return run_threads(resolve_mode(p, ws, mode), train_options(ws, s));
}

PlanSpec post_validation_gpt_plan(int dp, std::vector<int> tp, const std::string& schedule) {
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.dp = dp;
  p.tp = std::move(tp);
  p.schedule = schedule;
  p.micro_batches = 4;
  p.micro_batch_size = 2;
  return p;
}

struct PostValidationCase {
  int dp;
  std::vector<int> tp;
  std::string schedule;
};

class PostValidation : public ::testing::TestWithParam<PostValidationCase> {};

TEST_P(PostValidation, SameLossesAsSynchronous) {
  const PostValidationCase& c = GetParam();
  PlanSpec p = post_validation_gpt_plan(c.dp, c.tp, c.schedule);
  SCOPED_TRACE(p.describe());
  RunSettings s;
  s.steps = 4;
  // No clipping: nothing is rolled back, the update is the synchronous one.
  s.grad_clip = 0;
  auto want = post_validation_train(p, "synchronous", s);
  auto got = post_validation_train(p, "post-validated", s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].loss, want[i].loss) << "step " << i + 1;
    EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << i + 1;
  }
  // A clip below every step's norm: every step is rolled back and redone clipped.
  s.grad_clip = 0.05;
  want = post_validation_train(p, "synchronous", s);
  got = post_validation_train(p, "post-validated", s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_GT(want[i].grad_norm, s.grad_clip) << "the clip must trigger, step " << i + 1;
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-6 * std::abs(want[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-6 * want[i].grad_norm) << "step " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, PostValidation,
                         ::testing::Values(PostValidationCase{1, {1, 1}, "1f1b"},
                                           PostValidationCase{1, {1, 1}, "zb-h2"},
                                           PostValidationCase{2, {2}, "gpipe"}));

// Every rank's parameters (the masters under mixed precision), by (rank, stage, parameter id).
using Snapshot = std::map<std::tuple<int, int, int>, std::vector<double>>;

struct PoisonedRun {
  std::vector<engine::StepStats> stats;  // rank 0's
  Snapshot before_poisoned_step, after_poisoned_step;
};

// Three steps of a PP2 x DP2 plan as threads (inputs made from the step and sample
// index); in step 1 rank 0 finds a NaN in one of its gradients. `master`: master weights
// of that dtype beside f32 working copies.
PoisonedRun run_poisoned(const std::string& mode, std::optional<memory::DType> master = {}) {
  PlanSpec p = post_validation_gpt_plan(2, {1, 1}, "1f1b");
  Workspace ws("post-validation-nan");
  auto plan = resolve_mode(p, ws, mode);
  const int n = plan->layout.world();
  auto world = transport::make_local_world(n);
  PoisonedRun run;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      engine::RankEngineOptions o;
      o.grad_clip = 1.0;
      o.master_dtype = master;
      o.inputs = [](const stages::MicroBatch& mb, const std::vector<std::string>& names,
                    stages::TensorMap& out) {
        const int64_t T = 16;
        std::vector<int32_t> tok(size_t(mb.samples * T)), tgt(tok.size());
        for (size_t i = 0; i < tok.size(); ++i) {
          const int64_t k = mb.sample_offset * T + int64_t(i) + 31 * mb.step;
          tok[i] = int32_t((k * 7 + 3) % 256);
          tgt[i] = int32_t((k * 7 + 10) % 256);
        }
        for (const std::string& name : names) {
          Tensor t = Tensor::from_vector(name == "tokens" ? tok : tgt, {mb.samples, T});
          out[name] = t;
        }
      };
      engine::RankEngine e(plan, world[size_t(r)], o);
      auto snapshot = [&](Snapshot& into) {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& [s, st] : e.stages())
          // Read through the const param(): the non-const one marks the working copies
          // stale, which would hide a rollback that left them holding the rejected update.
          for (int id : st->param_ids())
            into[{r, s, id}] =
                std::as_const(*st).param(id).to(memory::DType::f64).to_vector<double>();
      };
      e.executor().set_before_optimizer([&, r](int64_t step) {
        if (step != 1) return;
        snapshot(run.before_poisoned_step);
        if (r == 0) {
          auto& [s, st] = *e.stages().begin();
          Tensor& g = st->grad(st->param_ids().back());
          g.view({g.numel()}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
        }
      });
      for (int64_t step = 0; step < 3; ++step) {
        engine::StepStats st = e.step(step);
        if (step == 1) snapshot(run.after_poisoned_step);
        if (r == 0) run.stats.push_back(st);
      }
    });
  for (auto& t : threads) t.join();
  return run;
}

TEST(PostValidation, NonFiniteGradientSkipsTheStep) {
  // f32, and f64 masters beside f32 working copies (the CPU's stand-in for bf16 ones):
  // there the early update also wrote the working copies, which the rollback must reach.
  for (std::optional<memory::DType> master :
       {std::optional<memory::DType>(), {memory::DType::f64}}) {
    SCOPED_TRACE(master ? "f64 masters" : "f32");
    PoisonedRun sync = run_poisoned("synchronous", master),
                post = run_poisoned("post-validated", master);
    ASSERT_EQ(sync.stats.size(), 3u);
    ASSERT_EQ(post.stats.size(), 3u);
    for (const PoisonedRun* run : {&sync, &post}) {
      EXPECT_FALSE(run->stats[0].skipped);
      EXPECT_TRUE(run->stats[1].skipped);
      EXPECT_TRUE(std::isnan(run->stats[1].grad_norm));
      EXPECT_FALSE(run->stats[2].skipped);
      EXPECT_TRUE(std::isfinite(run->stats[2].loss));
      // No parameter of any rank changed in the skipped step.
      ASSERT_EQ(run->before_poisoned_step.size(), run->after_poisoned_step.size());
      EXPECT_FALSE(run->before_poisoned_step.empty());
      EXPECT_TRUE(run->before_poisoned_step == run->after_poisoned_step);
    }
    EXPECT_FALSE(sync.stats[1].rolled_back);
    EXPECT_TRUE(post.stats[1].rolled_back);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(post.stats[i].loss, sync.stats[i].loss) << "step " << i;
      if (i != 1) {
        EXPECT_EQ(post.stats[i].grad_norm, sync.stats[i].grad_norm) << "step " << i;
      }
    }
  }
}

TEST(PostValidation, PlanFieldIsChecked) {
  Workspace ws("post-validation-bad");
  json j = plan_json(post_validation_gpt_plan(1, {1, 1}, "1f1b"), ws);
  j["optimizer_step"] = "eventually";
  try {
    partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
    FAIL() << "accepted optimizer_step \"eventually\"";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("$.optimizer_step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("post-validated"), std::string::npos) << e.what();
  }
  j["optimizer_step"] = "post-validated";
  partitioner::Plan p = partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
  EXPECT_EQ(partitioner::plan_to_json(p).value("optimizer_step", ""), "post-validated");
}

}  // namespace
}  // namespace baton::engine_testing
