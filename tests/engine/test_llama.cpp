// A LLaMA-family model (grouped-query attention with key/value heads split or replicated
// by tensor parallelism, rotary, SwiGLU, untied head) under a few plans, each rank a
// thread over the local transport: loss and gradient norm within 1e-5 relative of the
// one-process trainer with the same global batch, and pure pipeline parallelism with the
// one-process accumulation order bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine_harness.h"

namespace baton::engine_testing {
namespace {

json tiny_llama_json(int64_t kv) {
  return {{"type", "llama"},
          {"name", "tiny-llama"},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", kv},
          {"vocab_size", 256},
          {"max_position_embeddings", 16},
          {"context", 16},
          {"rope_theta", 10000.0}};
}

struct Case {
  int pp, tp, dp;
  std::string schedule;
  int64_t kv;
};

class LlamaPlans : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaPlans, MatchesOneProcess) {
  const Case c = GetParam();
  PlanSpec p;
  p.model = tiny_llama_json(c.kv);
  p.dp = c.dp;
  p.tp.assign(size_t(c.pp), c.tp);
  p.schedule = c.schedule;
  SCOPED_TRACE(p.describe());
  Workspace ws("llama");
  RunSettings s;
  s.steps = 6;
  auto plan = resolve(p, ws);
  std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  const bool exact = c.tp == 1 && c.dp == 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (exact) {
      EXPECT_EQ(got[i].loss, want[i].loss) << "step " << i + 1;
      EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << i + 1;
    } else {
      EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
          << "step " << i + 1;
    }
  }
}

// kv 2: split at TP 2; kv 1: replicated (multi-query).
INSTANTIATE_TEST_SUITE_P(Plans, LlamaPlans,
                         ::testing::Values(Case{2, 1, 1, "1f1b", 2}, Case{2, 2, 1, "1f1b", 2},
                                           Case{1, 2, 2, "gpipe", 1}, Case{2, 2, 2, "1f1b", 1}),
                         [](const auto& param_info) {
                           const Case& c = param_info.param;
                           return "pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) +
                                  "_dp" + std::to_string(c.dp) + "_" + c.schedule + "_kv" +
                                  std::to_string(c.kv);
                         });

}  // namespace
}  // namespace baton::engine_testing
