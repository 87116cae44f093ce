// The equivalence grid on a LLaMA-family model (grouped-query attention: 4 query heads
// over 2 key/value heads, split by tensor parallelism; rotary, SwiGLU, untied head),
// each rank a thread over the local transport: every schedule x PP in {1, 2, 4} x TP in
// {1, 2} x DP in {1, 2}, the loss and gradient norm of every step within 1e-5 relative of
// the one-process trainer with the same global batch, and bit for bit under pure pipeline
// parallelism wherever the schedule keeps the one-process accumulation order (every
// schedule but DualPipe, whose two replicas each sum half of the micro-batches).
// Labelled slow (92 plans); test_llama.cpp keeps a few of them in the quick suite.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>

#include "engine_harness.h"
#include "schedule/generators.h"

namespace baton::engine_testing {
namespace {

// Six blocks (8 layers with the embedding and the head): PP 4 with two chunks a rank
// (interleaved 1F1B, ZB-V, DualPipeV) has a layer in each of its 8 stages.
json grid_llama_json() {
  return {{"type", "llama"},
          {"name", "grid-llama"},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 6},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 256},
          {"max_position_embeddings", 16},
          {"context", 16},
          {"rope_theta", 10000.0}};
}

struct LlamaGridCase {
  int pp, tp, dp;
  std::string schedule;
};

std::string llama_grid_name(const ::testing::TestParamInfo<LlamaGridCase>& info) {
  const LlamaGridCase& c = info.param;
  std::string s = c.schedule + "_pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) + "_dp" +
                  std::to_string(c.dp);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class LlamaGrid : public ::testing::TestWithParam<LlamaGridCase> {};

TEST_P(LlamaGrid, MatchesOneProcess) {
  const LlamaGridCase& c = GetParam();
  PlanSpec p;
  p.model = grid_llama_json();
  p.tp.assign(size_t(c.pp), c.tp);
  p.dp = c.dp;
  p.schedule = c.schedule;
  p.micro_batches = c.pp == 4 ? 8 : 4;
  p.micro_batch_size = 8 / p.micro_batches;
  SCOPED_TRACE(p.describe());
  Workspace ws("llama-grid");
  // At the harness's rate (3e-3) this tiny LLaMA trains unstably (under TP 2 one run's
  // gradient norm jumps from 1.5 to 20 at step 8) and the round-off of tensor and data
  // parallelism has grown to 3e-5 relative in the gradient norm by step 8; at 1e-3 the
  // worst difference over the grid's 12 steps is 1e-6 (the loss's 1e-8).
  RunSettings s;
  s.steps = 12;
  s.lr = 1e-3;
  auto plan = resolve(p, ws);
  const std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  const std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  const bool bitwise = c.tp == 1 && c.dp == 1 && c.schedule != "dualpipe";
  if (c.tp == 1 && c.dp == 1) {
    EXPECT_EQ(same_accumulation_order(plan->schedule), bitwise);
  }
  expect_steps_match(got, want, bitwise);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i].loss - want[i].loss) / std::abs(want[i].loss));
  std::printf("%s: %s, worst relative loss difference %.2e\n", p.describe().c_str(),
              bitwise ? "bit for bit" : "within 1e-5", worst);
}

std::vector<LlamaGridCase> llama_grid_cases() {
  std::vector<LlamaGridCase> out;
  for (int pp : {1, 2, 4})
    for (int tp : {1, 2})
      for (int dp : {1, 2})
        for (const std::string& name : schedule::schedule_names()) {
          if (name == "dualpipe" && pp % 2 != 0) continue;
          out.push_back({pp, tp, dp, name});
        }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, LlamaGrid, ::testing::ValuesIn(llama_grid_cases()), llama_grid_name);

}  // namespace
}  // namespace baton::engine_testing
