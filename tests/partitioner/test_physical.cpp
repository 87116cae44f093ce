// Physical graphs: a TP = 2 and TP = 4 run of the tiny GPT, a tiny LLaMA (GQA with key/value
// heads split or replicated, MQA, MHA) and the MLP, each rank a thread
// over the local transport, gives the loss and (gathered) gradients of the logical graph
// on one thread; shards start as exactly their blocks of the unsplit parameters.
#include <gtest/gtest.h>

#include "partitioner/tensor_parallel.h"
#include "stages/model.h"
#include "stages/shorthands.h"
#include "tp_harness.h"

namespace baton::partitioner {
namespace {

using stages::DType;
using stages::Graph;
using namespace testing;

std::shared_ptr<Graph> physical_gpt(DType dtype, double pdrop, int64_t heads = 4) {
  stages::Gpt2Config c;
  c.n_layer = 2;
  c.n_head = heads;
  c.n_embd = 16;
  c.n_positions = 8;
  c.context = 5;
  c.vocab_size = 12;
  c.embd_pdrop = c.resid_pdrop = c.attn_pdrop = pdrop;
  return load_in_dtype(c.to_json(), dtype, "tiny-gpt");
}

std::shared_ptr<Graph> mlp(DType dtype, std::vector<int64_t> hidden) {
  stages::MlpConfig c;
  c.context = 4;
  c.vocab_size = 16;
  c.n_embd = 8;
  c.hidden = hidden;
  return load_in_dtype(stages::mlp_graph_json(c), dtype, "mlp");
}

// A tiny LLaMA: 4 query heads over `kv` key/value heads (split when TP divides them,
// replicated otherwise), rotary, SwiGLU, tied or untied head, optional biases.
std::shared_ptr<Graph> llama(DType dtype, int64_t kv, bool tied, bool bias) {
  nlohmann::json m = {{"type", "llama"},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", kv},
                      {"vocab_size", 12},
                      {"max_position_embeddings", 8},
                      {"context", 5},
                      {"rope_theta", 100.0},
                      {"tie_word_embeddings", tied},
                      {"attention_bias", bias}};
  return load_in_dtype(m, dtype, "tiny-llama");
}

struct Case {
  std::string name;
  std::function<std::shared_ptr<Graph>(DType)> model;
};

class PhysicalGraph : public ::testing::TestWithParam<std::tuple<int, DType, int>> {};

TEST_P(PhysicalGraph, MatchesLogicalGraph) {
  auto [which, dtype, tp] = GetParam();
  std::vector<Case> cases = {
      {"gpt", [](DType d) { return physical_gpt(d, 0.0); }},
      {"gpt-dropout", [](DType d) { return physical_gpt(d, 0.2); }},
      {"mlp-2-hidden",
       [](DType d) {
         return mlp(d, {16, 16});
       }},
      {"mlp-1-hidden", [](DType d) { return mlp(d, {16}); }},
  };
  const Case& c = cases[size_t(which)];
  SCOPED_TRACE(c.name + " tp=" + std::to_string(tp) + " " + std::string(memory::dtype_name(dtype)));
  auto g = c.model(dtype);
  RunSpec spec;
  RunOutput want = run_logical(g, spec);
  RunOutput got = run_tensor_parallel(g, tp, {}, spec);
  expect_same_run(want, got, dtype == DType::f64 ? 1e-11 : 1e-5);
}

class PhysicalLlama : public ::testing::TestWithParam<std::tuple<int, int>> {};

// GQA with kv = 2 heads: split at TP 2, replicated at TP 4; MQA: replicated; MHA: split.
TEST_P(PhysicalLlama, MatchesLogicalGraph) {
  auto [which, tp] = GetParam();
  struct L {
    const char* name;
    int64_t kv;
    bool tied, bias;
  };
  const L cases[] = {{"gqa-untied", 2, false, false},
                     {"mqa-tied-bias", 1, true, true},
                     {"mha-untied-bias", 4, false, true}};
  const L& c = cases[which];
  SCOPED_TRACE(std::string(c.name) + " tp=" + std::to_string(tp));
  auto g = llama(DType::f64, c.kv, c.tied, c.bias);
  RunSpec spec;
  RunOutput want = run_logical(g, spec);
  RunOutput got = run_tensor_parallel(g, tp, {}, spec);
  expect_same_run(want, got, 1e-11);
}

INSTANTIATE_TEST_SUITE_P(Models, PhysicalLlama,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(2, 4)));

TEST(PhysicalLlama, SplitsWhatMegatronSplits) {
  auto g = llama(DType::f64, 2, false, false);
  for (int tp : {2, 4}) {
    Sharding s = plan_sharding(*g, std::vector<int>(size_t(g->num_layers()), tp), {}, "test");
    auto kind = [&](const std::string& name) {
      for (size_t n = 0; n < g->nodes.size(); ++n)
        if (g->nodes[n].name == name) return s.nodes[n].kind;
      ADD_FAILURE() << "no node " << name;
      return SplitKind::none;
    };
    const std::string p = "model.layers.0.";
    EXPECT_EQ(kind(p + "self_attn.q_proj"), SplitKind::column);
    EXPECT_EQ(kind(p + "self_attn.k_proj"), tp == 2 ? SplitKind::column : SplitKind::none);
    EXPECT_EQ(kind(p + "self_attn.v_proj"), tp == 2 ? SplitKind::column : SplitKind::none);
    EXPECT_EQ(kind(p + "self_attn.attn"), SplitKind::heads);
    EXPECT_EQ(kind(p + "self_attn.o_proj"), SplitKind::row);
    EXPECT_EQ(kind(p + "mlp.gate_proj"), SplitKind::column);
    EXPECT_EQ(kind(p + "mlp.up_proj"), SplitKind::column);
    EXPECT_EQ(kind(p + "mlp.down_proj"), SplitKind::row);
    EXPECT_EQ(kind("model.embed_tokens"), SplitKind::vocab);
    EXPECT_EQ(kind("lm_head"), SplitKind::column);
    EXPECT_EQ(kind("loss"), SplitKind::vocab);
  }
  // Query heads the degree does not divide: an error naming the node.
  nlohmann::json m = {{"type", "llama"},          {"hidden_size", 12},
                      {"intermediate_size", 8},   {"num_hidden_layers", 1},
                      {"num_attention_heads", 3}, {"num_key_value_heads", 1},
                      {"vocab_size", 8},          {"max_position_embeddings", 4}};
  auto g3 = std::make_shared<Graph>(stages::load_model_json(m, "m"));
  try {
    plan_sharding(*g3, std::vector<int>(size_t(g3->num_layers()), 2), {}, "plan.json: $.tp");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head = 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("plan.json"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PhysicalGraph,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::f32, DType::f64),
                                            ::testing::Values(2, 4)));

TEST(PhysicalGraph, RecomputeAndOverrides) {
  auto g = physical_gpt(DType::f64, 0.1);
  RunSpec spec;
  spec.recompute_layers = {1, 2};
  RunOutput want = run_logical(g, spec);
  SplitOverrides ov;
  ov.kinds["h.1.mlp.c_fc"] = SplitKind::none;  // then h.1.mlp.c_proj runs replicated too
  ov.kinds["wte"] = SplitKind::none;
  ov.kinds["lm_head"] = SplitKind::none;
  expect_same_run(want, run_tensor_parallel(g, 2, ov, spec), 1e-11);
}

}  // namespace
}  // namespace baton::partitioner
