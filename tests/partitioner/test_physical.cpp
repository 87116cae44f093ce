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

// A graph of LLaMA's attention block in small: q, k, v linears (4 query heads over `kv`
// key/value heads of 4 features) → rotary → attention (with `attn_attrs` added) → o →
// residual; with `side`, rotary's qkv also goes through gelu into a linear px added to
// the residual (a row split of px reads qkv's columns).
nlohmann::json qkv_graph(int64_t kv, const nlohmann::json& attn_attrs, bool side) {
  using nlohmann::json;
  const int64_t h = 4, d = 4, c = 16, v = 12;
  auto param = [](const char* name, int64_t rows, int64_t cols) {
    return json{
        {"name", name}, {"shape", {rows, cols}}, {"init", {{"type", "normal"}, {"std", 0.3}}}};
  };
  auto node = [](const char* name, const char* op, json inputs, const char* out) {
    return json{{"name", name}, {"op", op}, {"inputs", inputs}, {"outputs", {out}}};
  };
  auto linear = [&](const char* name, const char* in, const char* out, const char* w) {
    json n = node(name, "linear", {in}, out);
    n["params"] = {{"weight", w}};
    return n;
  };
  json heads = {{"n_head", h}, {"n_kv_head", kv}};
  json attn = node("attn", "attention", {"qkv"}, "a");
  attn["attrs"] = heads;
  attn["attrs"].update(attn_attrs);
  json rot = node("rot", "rotary", {"q", "k", "v"}, "qkv");
  rot["attrs"] = heads;
  json embed = node("wte", "embedding", {"tokens"}, "x");
  embed["params"] = {{"weight", "emb"}};
  json blk = {linear("q", "x", "q", "wq"),
              linear("k", "x", "k", "wk"),
              linear("v", "x", "v", "wv"),
              rot,
              attn,
              linear("o", "a", "y", "wo"),
              node("r1", "add", {"x", "y"}, "x1")};
  json params = {param("emb", v, c),     param("wq", h * d, c), param("wk", kv * d, c),
                 param("wv", kv * d, c), param("wo", c, c),     param("lm", v, c)};
  if (side) {
    params.push_back(param("wx", c, (h + 2 * kv) * d));
    blk.push_back(node("g", "gelu", {"qkv"}, "s"));
    blk.push_back(linear("px", "s", "z", "wx"));
    blk.push_back(node("r2", "add", {"x1", "z"}, "x2"));
  }
  return {{"type", "graph"},
          {"name", "qkv"},
          {"inputs",
           {{{"name", "tokens"}, {"shape", {5}}, {"dtype", "i32"}},
            {{"name", "targets"}, {"shape", {5}}, {"dtype", "i32"}}}},
          {"params", params},
          {"layers",
           {{{"name", "embed"}, {"nodes", {embed}}},
            {{"name", "blk"}, {"nodes", blk}},
            {{"name", "head"},
             {"nodes",
              {linear("lmh", side ? "x2" : "x1", "logits", "lm"),
               node("ce", "cross_entropy", {"logits", "targets"}, "loss")}}}}},
          {"loss", "loss"}};
}

std::string sharding_error(const Graph& g, int tp, const SplitOverrides& ov) {
  try {
    plan_sharding(g, std::vector<int>(size_t(g.num_layers()), tp), ov, "plan.json: $.parallel.tp");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

SplitOverrides overrides(const std::map<std::string, SplitKind>& kinds) {
  SplitOverrides ov;
  ov.kinds = kinds;
  for (const auto& [name, kind] : kinds) ov.where[name] = "plan.json: $.splits." + name;
  return ov;
}

// Key/value heads replicated beside split query heads (q split by an override, k and v
// not) reaching a row-split linear: its weight shard held no piece of the replicated
// columns (never initialised) and every rank added their part. Refused, naming the
// override; with k and v split too the row split is exact.
TEST(PhysicalGraph, KeptKeyValueColumnsIntoARowSplitAreRefused) {
  for (int64_t kv : {1, 2}) {
    SCOPED_TRACE("kv " + std::to_string(kv));
    auto g = load_in_dtype(qkv_graph(kv, nlohmann::json::object(), true), DType::f64);
    const std::string e = sharding_error(*g, 2, overrides({{"q", SplitKind::column}}));
    EXPECT_EQ(e.rfind("plan.json: $.splits.q: row split of linear node 'px' (layer blk) reads "
                      "'s', split by heads with its key/value heads replicated on every rank",
                      0),
              0u)
        << e;
    EXPECT_NE(e.find("Split the key and value linears by columns too"), std::string::npos) << e;
  }
  auto g = load_in_dtype(qkv_graph(2, nlohmann::json::object(), true), DType::f64);
  SplitOverrides ov =
      overrides({{"q", SplitKind::column}, {"k", SplitKind::column}, {"v", SplitKind::column}});
  RunSpec spec;
  expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, ov, spec), 1e-11);
}

// An attention's own head_offset / global_heads (its dropout mask's place) and kv_group /
// kv_offset in a model compose with a heads split; they had been overwritten (losses off
// by 11-13%). A split where a rank's query heads read key/value heads it lacks is refused.
TEST(PhysicalGraph, ModelHeadAttributesComposeWithAHeadsSplit) {
  RunSpec spec;
  {
    SCOPED_TRACE("head_offset and global_heads, dropout");
    auto g = load_in_dtype(
        qkv_graph(2, {{"dropout", 0.3}, {"head_offset", 2}, {"global_heads", 8}}, false),
        DType::f64);
    expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, {}, spec), 1e-11);
  }
  {
    SCOPED_TRACE("kv_group 4 over 2 key/value heads, replicated on every rank");
    auto g = load_in_dtype(qkv_graph(2, {{"kv_group", 4}}, false), DType::f64);
    SplitOverrides ov = overrides({{"k", SplitKind::none}, {"v", SplitKind::none}});
    expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, ov, spec), 1e-11);
    // Split, rank 1's query heads 2, 3 would read key/value head 0, which rank 0 holds.
    const std::string e = sharding_error(*g, 2, {});
    EXPECT_EQ(e.rfind("plan.json: $.parallel.tp: attention node 'attn' (layer blk) is split by "
                      "heads over 2 ranks, but its attributes in the model (kv_group = 4; ",
                      0),
              0u)
        << e;
    EXPECT_NE(e.find("make rank 1's query heads read key/value heads 0..0 and it holds 1..1"),
              std::string::npos)
        << e;
  }
  {
    SCOPED_TRACE("kv_offset with head_offset, key/value heads split");
    auto g = load_in_dtype(
        qkv_graph(4, {{"dropout", 0.3}, {"head_offset", 4}, {"global_heads", 8}, {"kv_offset", 4}},
                  false),
        DType::f64);
    expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, {}, spec), 1e-11);
  }
}

// An embedding's vocab_offset (the ids its table starts at) in a model: a vocabulary split
// adds the rank's rows to it (it had replaced it: the losses of a model with offset 0).
TEST(PhysicalGraph, EmbeddingOffsetComposesWithAVocabularySplit) {
  auto g = load_in_dtype(nlohmann::json::parse(R"({"type": "graph", "name": "two-tables",
      "inputs": [{"name": "tokens", "shape": [5], "dtype": "i32"},
                 {"name": "targets", "shape": [5], "dtype": "i32"}],
      "params": [{"name": "a", "shape": [12, 8], "init": {"type": "normal", "std": 0.5}},
                 {"name": "b", "shape": [6, 8], "init": {"type": "normal", "std": 0.5}},
                 {"name": "w", "shape": [12, 8], "init": {"type": "normal", "std": 0.3}}],
      "layers": [{"name": "embed", "nodes": [
          {"name": "ea", "op": "embedding", "inputs": ["tokens"], "outputs": ["ea"],
           "params": {"weight": "a"}},
          {"name": "eb", "op": "embedding", "inputs": ["tokens"], "outputs": ["eb"],
           "params": {"weight": "b"}, "attrs": {"vocab_offset": 3}},
          {"name": "s", "op": "add", "inputs": ["ea", "eb"], "outputs": ["x"]}]},
        {"name": "head", "nodes": [
          {"name": "lm", "op": "linear", "inputs": ["x"], "outputs": ["logits"],
           "params": {"weight": "w"}},
          {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "targets"],
           "outputs": ["loss"]}]}],
      "loss": "loss"})"),
                         DType::f64);
  RunSpec spec;
  spec.samples = 4;
  expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, {}, spec), 1e-11);
}

// A vocabulary the degree does not divide (GPT-2's 50257 at any even degree): parts of
// ceil(V / t) rows and logit columns, the last rank's padded with zero rows and masked
// columns. The loss and gradients are the unpadded model's, the padding stays zero, the
// pieces (checkpoints, exports) hold the real rows only. It had been refused.
TEST(PhysicalGraph, AVocabularyTheDegreeDoesNotDivideIsPadded) {
  RunSpec spec;
  spec.samples = 4;
  for (int64_t vocab : {13, 14}) {
    stages::Gpt2Config c;
    c.n_layer = 1;
    c.n_head = 12;  // divided by 2, 3 and 4
    c.n_embd = 24;
    c.n_positions = 8;
    c.context = 5;
    c.vocab_size = vocab;
    auto gpt = load_in_dtype(c.to_json(), DType::f64, "tiny-gpt");
    // Untied: a LLaMA's lm_head, its own [V, C] weight.
    nlohmann::json m = {{"type", "llama"},
                        {"hidden_size", 24},
                        {"intermediate_size", 24},
                        {"num_hidden_layers", 1},
                        {"num_attention_heads", 12},
                        {"num_key_value_heads", 12},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 8},
                        {"context", 5},
                        {"tie_word_embeddings", false}};
    auto llama_untied = load_in_dtype(m, DType::f64, "tiny-llama");
    for (const auto& g : {gpt, llama_untied})
      for (int t : {2, 3, 4}) {
        SCOPED_TRACE(g->name + " vocabulary " + std::to_string(vocab) + " at degree " +
                     std::to_string(t));
        expect_same_run(run_logical(g, spec), run_tensor_parallel(g, t, {}, spec), 1e-11);
      }
  }
  auto gpt = physical_gpt(DType::f64, 0.0);  // vocabulary 12
  // Every rank needs a real part: 12 over 5 is parts of 3, the last one empty.
  try {
    plan_sharding(*gpt, std::vector<int>(size_t(gpt->num_layers()), 5), {}, "test");
    ADD_FAILURE() << "a degree leaving a rank padding only was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("leaves the last ranks no part (parts of 3)"),
              std::string::npos)
        << e.what();
  }
  // Logits a padded split would give a loss that needs them whole: the linear is refused.
  auto g7 = load_in_dtype(
      [] {
        stages::Gpt2Config c;
        c.n_layer = 1;
        c.n_head = 2;
        c.n_embd = 16;
        c.n_positions = 8;
        c.context = 5;
        c.vocab_size = 7;
        return c.to_json();
      }(),
      DType::f64, "tiny-gpt");
  SplitOverrides ov = overrides({{"lm_head", SplitKind::column}, {"loss", SplitKind::none}});
  try {
    plan_sharding(*g7, std::vector<int>(size_t(g7->num_layers()), 2), ov, "test");
    ADD_FAILURE() << "padded logits gathered";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the output features = 7 of linear "
                                         "node 'lm_head'"),
              std::string::npos)
        << e.what();
  }
}

// "none" on an op that only passes a split (gelu here) is honoured: the op runs on its
// whole input (gathered when the linear before it is split by an override), and the
// default policy no longer splits that linear for it (it had been accepted and ignored).
TEST(PhysicalGraph, NoneOnAPassingOpRunsItWhole) {
  auto g = physical_gpt(DType::f64, 0.0);
  {
    SplitOverrides ov = overrides({{"h.0.mlp.gelu", SplitKind::none}});
    Sharding s = plan_sharding(*g, std::vector<int>(size_t(g->num_layers()), 2), ov, "test");
    auto kind = [&](const std::string& name) {
      for (size_t n = 0; n < g->nodes.size(); ++n)
        if (g->nodes[n].name == name) return s.nodes[n].kind;
      ADD_FAILURE() << "no node " << name;
      return SplitKind::heads;
    };
    EXPECT_EQ(kind("h.0.mlp.c_fc"), SplitKind::none);
    EXPECT_EQ(kind("h.0.mlp.c_proj"), SplitKind::none);
    EXPECT_EQ(kind("h.1.mlp.c_fc"), SplitKind::column);
    EXPECT_EQ(kind("h.1.mlp.c_proj"), SplitKind::row);
  }
  SplitOverrides ov =
      overrides({{"h.0.mlp.c_fc", SplitKind::column}, {"h.0.mlp.gelu", SplitKind::none}});
  Sharding s = plan_sharding(*g, std::vector<int>(size_t(g->num_layers()), 2), ov, "test");
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    if (g->nodes[n].name == "h.0.mlp.gelu") {
      EXPECT_EQ(s.nodes[n].gather_inputs, std::vector<int>{0});
    }
    if (g->nodes[n].name == "h.0.mlp.c_proj") {
      EXPECT_EQ(s.nodes[n].kind, SplitKind::none);
    }
  }
  RunSpec spec;
  expect_same_run(run_logical(g, spec), run_tensor_parallel(g, 2, ov, spec), 1e-11);
}

}  // namespace
}  // namespace baton::partitioner
