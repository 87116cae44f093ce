// Graph-level gradient checks in float64 against central finite differences: a whole GPT
// block (parameters and its input), the whole small GPT (with and without dropout), the
// MLP shorthand, a general graph using every remaining op, the fused ops with both outputs
// read, and LayerNorms sharing parameters.
#include <cmath>
#include <functional>
#include <map>

#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

using testing::gradients_and_loss;
using testing::random_like;
using testing::random_tokens;
using testing::value_of;

constexpr double kGradcheckStep = 1e-5;
constexpr double kTolerance = 1e-6;

// Relative error ||a - n|| / max(||a||, ||n||) over sampled elements of one tensor.
struct Check {
  double num = 0, den_a = 0, den_n = 0;
  void add(double a, double n) {
    num += (a - n) * (a - n);
    den_a += a * a;
    den_n += n * n;
  }
  double rel() const {
    double d = std::sqrt(std::max(den_a, den_n));
    return d == 0 ? 0 : std::sqrt(num) / d;
  }
};

// Compares the analytic gradient `grad` of tensor `x` with central differences of `loss`,
// on up to `samples` elements chosen from `seed`.
void check_tensor(const std::string& what, Tensor x, const Tensor& grad,
                  const std::function<double()>& loss, int samples, uint64_t seed) {
  ASSERT_EQ(x.dtype(), DType::f64);
  ASSERT_EQ(grad.shape(), x.shape()) << what;
  double* p = x.data<double>();
  std::vector<double> g = grad.to_vector<double>();
  std::mt19937_64 rng(seed);
  Check c;
  int64_t n = x.numel();
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    int64_t i = samples >= n ? s : int64_t(rng() % uint64_t(n));
    double orig = p[i];
    p[i] = orig + kGradcheckStep;
    double lp = loss();
    p[i] = orig - kGradcheckStep;
    double lm = loss();
    p[i] = orig;
    c.add(g[size_t(i)], (lp - lm) / (2 * kGradcheckStep));
  }
  EXPECT_LT(c.rel(), kTolerance) << what << " (seed " << seed << ")";
  EXPECT_GT(c.den_n, 0.0) << what << ": every sampled gradient is zero; the check proves nothing";
}

void randomize_params(Stage& st, double std, uint64_t seed) {
  for (int id : st.param_ids())
    kernels::random_normal(st.param(id), 0.0, std, seed, uint64_t(id) + 1, kernels::Block{});
}

void check_whole_model(const std::shared_ptr<Graph>& g, const TensorMap& inputs, int64_t batch,
                       double tokens, uint64_t seed, int samples) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  StageOptions so;
  so.seed = seed;
  Stage st(g, 0, g->num_layers(), so);
  randomize_params(st, 0.3, seed);
  const auto loss = gradients_and_loss(st, MicroBatch{0, 0, batch, batch, tokens, 3}, inputs);
  for (int id : st.param_ids())
    check_tensor(g->params[size_t(id)].name, st.param(id), st.grad(id).clone(), loss, samples,
                 seed + uint64_t(id));
}

TEST(GradCheck, WholeGptF64) {
  const uint64_t seed = 11;
  auto g = testing::tiny_gpt(DType::f64);
  TensorMap in{{"tokens", random_tokens(2, 5, 11, seed)},
               {"targets", random_tokens(2, 5, 11, seed + 1)}};
  check_whole_model(g, in, 2, 10, seed, 12);
}

TEST(GradCheck, WholeGptWithDropoutF64) {
  // Masks are counter-based: the same micro-batch gets the same masks on every forward,
  // so finite differences see the function backward differentiates.
  const uint64_t seed = 12;
  auto g = testing::tiny_gpt(DType::f64, 1, 2, 8, 5, 11, 0.2);
  TensorMap in{{"tokens", random_tokens(2, 5, 11, seed)},
               {"targets", random_tokens(2, 5, 11, seed + 1)}};
  check_whole_model(g, in, 2, 10, seed, 12);
}

TEST(GradCheck, GptBlockF64) {
  const uint64_t seed = 13;
  auto g = testing::tiny_gpt(DType::f64, 2, 2, 8, 5, 11);
  StageOptions so;
  so.seed = seed;
  Stage st(g, 1, 2, so);  // layer h.0 alone
  ASSERT_EQ(st.boundary_inputs().size(), 1u);
  ASSERT_EQ(st.boundary_outputs().size(), 1u);
  randomize_params(st, 0.3, seed);
  const std::string in_name = g->values[size_t(st.boundary_inputs()[0])].name;
  const std::string out_name = g->values[size_t(st.boundary_outputs()[0])].name;
  Tensor x = random_like({2, 5, 8}, DType::f64, 1.0, seed);
  Tensor r = random_like({2, 5, 8}, DType::f64, 1.0, seed + 1);  // L = sum(out * r)
  MicroBatch mb{0, 0, 2, 2, 10, 0};
  auto objective = [&] {
    TensorMap out = st.forward(mb, {{in_name, x}}, true);
    st.discard(0);
    std::vector<double> o = out.at(out_name).to_vector<double>(), w = r.to_vector<double>();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
    return s;
  };
  st.zero_grad();
  st.forward(mb, {{in_name, x}});
  TensorMap dx = st.backward_input(0, {{out_name, r}});
  st.backward_weight(0);
  st.finish_grads();
  check_tensor("block input " + in_name, x, dx.at(in_name).clone(), objective, 16, seed);
  for (int id : st.param_ids())
    check_tensor(g->params[size_t(id)].name, st.param(id), st.grad(id).clone(), objective, 10,
                 seed + uint64_t(id));
}

TEST(GradCheck, MlpF64) {
  const uint64_t seed = 14;
  MlpConfig c;
  c.context = 3;
  c.vocab_size = 7;
  c.n_embd = 4;
  c.hidden = {6, 5};
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  auto g = std::make_shared<Graph>(load_model_json(nlohmann::json{{"type", "mlp"},
                                                                  {"context", 3},
                                                                  {"vocab_size", 7},
                                                                  {"n_embd", 4},
                                                                  {"hidden", {6, 5}},
                                                                  {"activation", "relu"}},
                                                   "mlp", lo));
  TensorMap in{{"tokens", random_tokens(3, 3, 7, seed)},
               {"targets", random_tokens(3, 1, 7, seed + 1).view({3})}};
  check_whole_model(g, in, 3, 3, seed, 12);
}

// The LLaMA shorthand in float64: grouped-query attention with rotary positions, RMSNorm,
// SwiGLU; untied with biases everywhere (Qwen2-style q/k/v and mlp_bias), and tied
// multi-query with llama3 rope scaling and attention dropout.
std::shared_ptr<Graph> tiny_llama(const nlohmann::json& extra) {
  nlohmann::json m = {{"type", "llama"},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 11},
                      {"max_position_embeddings", 16},
                      {"context", 6},
                      {"rope_theta", 100.0}};
  m.update(extra);
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  return std::make_shared<Graph>(load_model_json(m, "llama", lo));
}

TEST(GradCheck, LlamaGqaUntiedWithBiasesF64) {
  const uint64_t seed = 16;
  auto g = tiny_llama({{"attention_bias", true}, {"mlp_bias", true}});
  TensorMap in{{"tokens", random_tokens(2, 6, 11, seed)},
               {"targets", random_tokens(2, 6, 11, seed + 1)}};
  check_whole_model(g, in, 2, 12, seed, 12);
}

TEST(GradCheck, LlamaMqaTiedLlama3RopeWithDropoutF64) {
  const uint64_t seed = 17;
  auto g = tiny_llama({{"num_key_value_heads", 1},
                       {"tie_word_embeddings", true},
                       {"attention_dropout", 0.2},
                       {"rope_scaling",
                        {{"rope_type", "llama3"},
                         {"factor", 4.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8}}}});
  TensorMap in{{"tokens", random_tokens(2, 6, 11, seed)},
               {"targets", random_tokens(2, 6, 11, seed + 1)}};
  check_whole_model(g, in, 2, 12, seed, 12);
}

// The gradients of tiny_llama(extra)'s parameters by name on `in`, its parameters drawn as
// randomize_params(seed) draws them (the same values for the same parameter ids), then
// changed by `edit`.
std::map<std::string, Tensor> llama_grads(const nlohmann::json& extra, const TensorMap& in,
                                          uint64_t seed,
                                          const std::function<void(Stage&)>& edit = {}) {
  auto g = tiny_llama(extra);
  Stage st(g, 0, g->num_layers());
  randomize_params(st, 0.3, seed);
  if (edit) edit(st);
  MicroBatch mb{0, 0, 2, 2, 12, 3};
  st.zero_grad();
  st.forward(mb, in);
  st.backward(0);
  st.finish_grads();
  std::map<std::string, Tensor> out;
  for (int id : st.param_ids()) out[g->params[size_t(id)].name] = st.grad(id).clone();
  return out;
}

int param_id(const Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.params.size(); ++i)
    if (g.params[i].name == name) return int(i);
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

// pad_token_id, the embedding's padding_idx (transformers' nn.Embedding(padding_idx)): the
// lookup gives that row no gradient. Untied, the row's gradient is zero, every other row's
// is the finite-difference one, and every other parameter's is the model's without it.
// Tied, the row keeps the head's share: the gradients of an untied model whose head starts
// equal to the embedding, summed, less the lookup's share of that row.
TEST(GradCheck, LlamaPaddingRowGetsNoGradientFromTheLookupF64) {
  const uint64_t seed = 18;
  const int64_t pad = 4;
  Tensor tokens = random_tokens(2, 6, 11, seed);
  for (int64_t i : {0, 3, 7, 8}) tokens.data<int32_t>()[i] = int32_t(pad);
  TensorMap in{{"tokens", tokens}, {"targets", random_tokens(2, 6, 11, seed + 1)}};
  const std::string E = "model.embed_tokens.weight";

  auto g = tiny_llama({{"pad_token_id", pad}});
  Stage st(g, 0, g->num_layers());
  randomize_params(st, 0.3, seed);
  const auto loss = gradients_and_loss(st, MicroBatch{0, 0, 2, 2, 12, 3}, in);
  const int e = param_id(*g, E);
  Tensor w = st.param(e), dw = st.grad(e).clone();
  EXPECT_EQ(dw.narrow(0, pad, 1).to_vector<double>(), std::vector<double>(16, 0.0));
  check_tensor("rows below the padding row", w.narrow(0, 0, pad), dw.narrow(0, 0, pad), loss, 24,
               seed);
  check_tensor("rows above the padding row", w.narrow(0, pad + 1, 11 - pad - 1),
               dw.narrow(0, pad + 1, 11 - pad - 1), loss, 24, seed + 1);
  const auto plain = llama_grads(nlohmann::json::object(), in, seed);
  EXPECT_NE(plain.at(E).narrow(0, pad, 1).to_vector<double>(), std::vector<double>(16, 0.0));
  for (int id : st.param_ids()) {
    if (id == e) continue;
    const std::string& name = g->params[size_t(id)].name;
    EXPECT_EQ(st.grad(id).to_vector<double>(), plain.at(name).to_vector<double>()) << name;
  }

  const auto tied = llama_grads({{"pad_token_id", pad}, {"tie_word_embeddings", true}}, in, seed);
  const auto untied = llama_grads(nlohmann::json::object(), in, seed, [&](Stage& s) {
    const Graph& ug = s.graph();
    s.param(param_id(ug, "lm_head.weight")).copy_from(s.param(param_id(ug, E)));
  });
  std::vector<double> want = untied.at(E).to_vector<double>();
  const std::vector<double> head = untied.at("lm_head.weight").to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = int64_t(i) / 16 == pad ? head[i] : want[i] + head[i];
  const std::vector<double> got = tied.at(E).to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << "element " << i;
}

// A random initialisation zeroes the padding row, as torch's nn.Embedding(padding_idx) and
// transformers' init do (it had kept its random values, which the lookup never changes):
// in the table of the stage holding the embedding, and tied, in the copy the head's stage
// holds. Without pad_token_id the same row is drawn as the others.
TEST(GradCheck, LlamaPaddingRowStartsAtZero) {
  const int64_t pad = 4;
  const std::string E = "model.embed_tokens.weight";
  auto row = [&](const std::shared_ptr<Graph>& g, int first, int last, int64_t r) {
    StageOptions so;
    so.seed = 7;
    Stage st(g, first, last, so);
    return st.param(param_id(*g, E)).narrow(0, r, 1).to_vector<double>();
  };
  const std::vector<double> zeros(16, 0.0);
  auto g = tiny_llama({{"pad_token_id", pad}});
  EXPECT_EQ(row(g, 0, g->num_layers(), pad), zeros);
  EXPECT_NE(row(g, 0, g->num_layers(), pad + 1), zeros);
  auto tied = tiny_llama({{"pad_token_id", pad}, {"tie_word_embeddings", true}});
  EXPECT_EQ(row(tied, 0, 1, pad), zeros);
  EXPECT_EQ(row(tied, tied->num_layers() - 1, tied->num_layers(), pad), zeros);
  auto plain = tiny_llama(nlohmann::json::object());
  EXPECT_NE(row(plain, 0, plain->num_layers(), pad), zeros);
}

// A general graph with the ops the shorthands do not use: matmul (transposed), softmax,
// gelu, silu, dropout, add, layernorm and a biased torch-layout linear.
TEST(GradCheck, GeneralGraphF64) {
  const uint64_t seed = 15;
  nlohmann::json m = nlohmann::json::parse(R"({
    "type": "graph", "name": "ops",
    "inputs": [{"name": "x", "shape": [4, 6], "dtype": "f32"},
               {"name": "y", "shape": [4], "dtype": "i64"}],
    "params": [{"name": "w1", "shape": [6, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "ln.w", "shape": [4], "init": {"type": "ones"}},
               {"name": "ln.b", "shape": [4], "init": {"type": "zeros"}},
               {"name": "w2", "shape": [5, 4], "init": {"type": "normal", "std": 0.3}},
               {"name": "b2", "shape": [5], "init": {"type": "constant", "value": 0.1}}],
    "layers": [
      {"name": "a", "nodes": [
        {"name": "l1", "op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w1"}},
        {"name": "sm", "op": "softmax", "inputs": ["h"], "outputs": ["s"]},
        {"name": "mm", "op": "matmul", "inputs": ["s", "h"], "outputs": ["p"], "attrs": {"trans_b": true}}]},
      {"name": "b", "nodes": [
        {"name": "g0", "op": "gelu", "inputs": ["p"], "outputs": ["q0"]},
        {"name": "g", "op": "silu", "inputs": ["q0"], "outputs": ["q"]},
        {"name": "d", "op": "dropout", "inputs": ["q"], "outputs": ["dq"], "attrs": {"p": 0.25}},
        {"name": "r", "op": "add", "inputs": ["dq", "p"], "outputs": ["res"]},
        {"name": "mm2", "op": "matmul", "inputs": ["res", "res"], "outputs": ["sq"], "attrs": {"trans_a": true}},
        {"name": "ln", "op": "layernorm", "inputs": ["sq"], "outputs": ["n"], "params": {"weight": "ln.w", "bias": "ln.b"}},
        {"name": "l2", "op": "linear", "inputs": ["n"], "outputs": ["logits"], "params": {"weight": "w2", "bias": "b2"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "y"], "outputs": ["loss"]}]}
    ],
    "loss": "loss"})");
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  auto g = std::make_shared<Graph>(load_model_json(m, "ops.json", lo));
  std::vector<int64_t> ys = {0, 4, -100, 2, 1, 3, 0, 2};  // one ignored target
  TensorMap in{{"x", random_like({2, 4, 6}, DType::f64, 1.0, seed)},
               {"y", Tensor::from_vector(ys, {2, 4})}};
  check_whole_model(g, in, 2, 7, seed, 16);
}

// The fused ops as a model file may name them, both outputs read: bias_gelu's h (its
// gradient had been dropped, and with y unread no gradient flowed at all) and
// add_layernorm's s.
TEST(GradCheck, FusedOpsWithBothOutputsReadF64) {
  const uint64_t seed = 16;
  nlohmann::json m = nlohmann::json::parse(R"({
    "type": "graph", "name": "fused",
    "inputs": [{"name": "x", "shape": [4, 6], "dtype": "f32"},
               {"name": "y", "shape": [4], "dtype": "i64"}],
    "params": [{"name": "w1", "shape": [6, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "bb", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "al.w", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "al.b", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "w2", "shape": [5, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "w3", "shape": [6, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "b3", "shape": [6], "init": {"type": "normal", "std": 0.3}}],
    "layers": [
      {"name": "a", "nodes": [
        {"name": "l1", "op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w1"}},
        {"name": "bg", "op": "bias_gelu", "inputs": ["h"], "outputs": ["g", "hb"], "params": {"bias": "bb"}},
        {"name": "al", "op": "add_layernorm", "inputs": ["g", "hb"], "outputs": ["s", "n"],
         "params": {"weight": "al.w", "bias": "al.b"}},
        {"name": "r", "op": "add", "inputs": ["s", "n"], "outputs": ["r"]},
        {"name": "l3", "op": "linear", "inputs": ["r"], "outputs": ["h3"], "params": {"weight": "w3"}},
        {"name": "bg2", "op": "bias_gelu", "inputs": ["h3"], "outputs": ["unread", "h4"], "params": {"bias": "b3"}},
        {"name": "l2", "op": "linear", "inputs": ["h4"], "outputs": ["logits"], "params": {"weight": "w2"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "y"], "outputs": ["loss"]}]}
    ],
    "loss": "loss"})");
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  auto g = std::make_shared<Graph>(load_model_json(m, "fused.json", lo));
  std::vector<int64_t> ys = {0, 4, 1, 2, 1, 3, 0, 2};
  TensorMap in{{"x", random_like({2, 4, 6}, DType::f64, 1.0, seed)},
               {"y", Tensor::from_vector(ys, {2, 4})}};
  check_whole_model(g, in, 2, 8, seed, 16);
}

// One parameter in both slots of a LayerNorm (torch sums its two gradients), and two
// LayerNorms sharing only their weight: the slots' gradients accumulate apart (this had
// failed an internal check).
TEST(GradCheck, NormsWithSharedParametersF64) {
  const uint64_t seed = 17;
  nlohmann::json m = nlohmann::json::parse(R"({
    "type": "graph", "name": "shared",
    "inputs": [{"name": "x", "shape": [4, 6], "dtype": "f32"},
               {"name": "y", "shape": [4], "dtype": "i64"}],
    "params": [{"name": "w1", "shape": [6, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "p", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "q", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "b", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "w2", "shape": [5, 6], "init": {"type": "normal", "std": 0.3}}],
    "layers": [
      {"name": "a", "nodes": [
        {"name": "l1", "op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w1"}},
        {"name": "ln", "op": "layernorm", "inputs": ["h"], "outputs": ["n"], "params": {"weight": "p", "bias": "p"}},
        {"name": "al", "op": "add_layernorm", "inputs": ["n", "h"], "outputs": ["s", "m"],
         "params": {"weight": "q", "bias": "q"}},
        {"name": "ln2", "op": "layernorm", "inputs": ["m"], "outputs": ["m2"], "params": {"weight": "p", "bias": "b"}},
        {"name": "ln3", "op": "layernorm", "inputs": ["m2"], "outputs": ["m3"], "params": {"weight": "b", "bias": "q"}},
        {"name": "l2", "op": "linear", "inputs": ["m3"], "outputs": ["logits"], "params": {"weight": "w2"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "y"], "outputs": ["loss"]}]}
    ],
    "loss": "loss"})");
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  auto g = std::make_shared<Graph>(load_model_json(m, "shared.json", lo));
  std::vector<int64_t> ys = {0, 4, 1, 2, 1, 3, 0, 2};
  TensorMap in{{"x", random_like({2, 4, 6}, DType::f64, 1.0, seed)},
               {"y", Tensor::from_vector(ys, {2, 4})}};
  check_whole_model(g, in, 2, 8, seed, 16);
}

// Outputs nothing reads: add_layernorm with only its sum read, an RMSNorm whose output is
// unread, and an unread linear sharing its weight with a read one. Their W had returned
// without writing the gradient buffers it was told to overwrite, so the step took
// whatever memory held (norms of 1e30), or the shared weight's gradient kept the last
// step's. The second gradient must equal the first, the unread-only ones be exactly 0.
TEST(GradCheck, OutputsNothingReadsAddNoGradientF64) {
  const uint64_t seed = 18;
  nlohmann::json m = nlohmann::json::parse(R"({
    "type": "graph", "name": "unread",
    "inputs": [{"name": "x", "shape": [4, 6], "dtype": "f32"},
               {"name": "y", "shape": [4], "dtype": "i64"}],
    "params": [{"name": "w1", "shape": [6, 6], "init": {"type": "normal", "std": 0.3}},
               {"name": "al.w", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "al.b", "shape": [6], "init": {"type": "normal", "std": 0.3}},
               {"name": "g", "shape": [6], "init": {"type": "ones"}},
               {"name": "w2", "shape": [5, 6], "init": {"type": "normal", "std": 0.3}}],
    "layers": [
      {"name": "a", "nodes": [
        {"name": "l1", "op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w1"}},
        {"name": "al", "op": "add_layernorm", "inputs": ["h", "x"], "outputs": ["s", "n"],
         "params": {"weight": "al.w", "bias": "al.b"}},
        {"name": "rn", "op": "rmsnorm", "inputs": ["s"], "outputs": ["unread"], "params": {"weight": "g"}},
        {"name": "l2", "op": "linear", "inputs": ["s"], "outputs": ["logits"], "params": {"weight": "w2"}},
        {"name": "l3", "op": "linear", "inputs": ["s"], "outputs": ["unread2"], "params": {"weight": "w2"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "y"], "outputs": ["loss"]}]}
    ],
    "loss": "loss"})");
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  auto g = std::make_shared<Graph>(load_model_json(m, "unread.json", lo));
  std::vector<int64_t> ys = {0, 4, 1, 2, 1, 3, 0, 2};
  TensorMap in{{"x", random_like({2, 4, 6}, DType::f64, 1.0, seed)},
               {"y", Tensor::from_vector(ys, {2, 4})}};
  StageOptions so;
  so.seed = seed;
  Stage st(g, 0, g->num_layers(), so);
  randomize_params(st, 0.3, seed);
  const MicroBatch mb{0, 0, 2, 2, 8, 3};
  std::map<std::string, std::vector<double>> first;
  for (int pass = 0; pass < 3; ++pass) {
    const auto loss = gradients_and_loss(st, mb, in);
    for (int id : st.param_ids()) {
      const std::string& name = g->params[size_t(id)].name;
      std::vector<double> grad = st.grad(id).to_vector<double>();
      if (name == "al.w" || name == "al.b" || name == "g")
        for (double v : grad) EXPECT_EQ(v, 0.0) << name << " pass " << pass;
      else if (pass == 0)
        check_tensor(name, st.param(id), st.grad(id).clone(), loss, 16, seed + uint64_t(id));
      if (pass == 0)
        first[name] = grad;
      else
        EXPECT_EQ(grad, first[name]) << name << " pass " << pass;
    }
  }
}

// Frozen parameters ("trainable": false) of the one-parameter ops: no gradient, and the
// trainable ones' gradients those of the unfrozen model (an embedding's or
// position_embedding's, a bias's or an rmsnorm's W had written into the undefined
// gradient: "data access on an undefined tensor" at the first step).
TEST(GradCheck, FrozenParametersTakeNoGradientF64) {
  const uint64_t seed = 21;
  const std::string text = R"({
    "type": "graph", "name": "frozen",
    "inputs": [{"name": "tokens", "shape": [4], "dtype": "i64"},
               {"name": "targets", "shape": [4], "dtype": "i64"}],
    "params": [{"name": "wte", "shape": [9, 6], "init": {"type": "normal", "std": 0.3}, "trainable": F},
               {"name": "wpe", "shape": [4, 6], "init": {"type": "normal", "std": 0.3}, "trainable": F},
               {"name": "b", "shape": [6], "init": {"type": "normal", "std": 0.3}, "trainable": F},
               {"name": "g", "shape": [6], "init": {"type": "ones"}, "trainable": F},
               {"name": "w", "shape": [9, 6], "init": {"type": "normal", "std": 0.3}}],
    "layers": [
      {"name": "a", "nodes": [
        {"name": "e", "op": "embedding", "inputs": ["tokens"], "outputs": ["x"], "params": {"weight": "wte"}},
        {"name": "p", "op": "position_embedding", "inputs": ["x"], "outputs": ["xp"], "params": {"weight": "wpe"}},
        {"name": "bb", "op": "bias_add", "inputs": ["xp"], "outputs": ["xb"], "params": {"bias": "b"}},
        {"name": "rn", "op": "rmsnorm", "inputs": ["xb"], "outputs": ["n"], "params": {"weight": "g"}},
        {"name": "l", "op": "linear", "inputs": ["n"], "outputs": ["logits"], "params": {"weight": "w"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "targets"], "outputs": ["loss"]}]}
    ],
    "loss": "loss"})";
  auto load = [&](const char* frozen) {
    std::string t = text;
    for (size_t at; (at = t.find(": F}")) != std::string::npos;)
      t.replace(at, 4, std::string(": ") + frozen + "}");
    LoadOptions lo;
    lo.float_dtype = DType::f64;
    return std::make_shared<Graph>(load_model_json(nlohmann::json::parse(t), "frozen.json", lo));
  };
  std::vector<int64_t> ids = {1, 4, 2, 8, 0, 3, 5, 7};
  TensorMap in{
      {"tokens", Tensor::from_vector(ids, {2, 4})},
      {"targets", Tensor::from_vector(std::vector<int64_t>{4, 2, 8, 0, 3, 5, 7, 6}, {2, 4})}};
  const MicroBatch mb{0, 0, 2, 2, 8, 3};
  std::map<std::string, std::vector<double>> want;
  for (const char* frozen : {"true", "false"}) {
    auto g = load(frozen);
    StageOptions so;
    so.seed = seed;
    Stage st(g, 0, g->num_layers(), so);
    const double loss = gradients_and_loss(st, mb, in)();
    for (int id : st.param_ids()) {
      if (g->params[size_t(id)].name != "w") continue;
      if (std::string(frozen) == "true") {
        want["w"] = st.grad(id).to_vector<double>();
        want["loss"] = {loss};
        // The trainable weight's gradient against finite differences, the others frozen.
        check_tensor("w", st.param(id), st.grad(id).clone(), gradients_and_loss(st, mb, in), 16,
                     seed);
      } else {
        EXPECT_EQ(st.grad(id).to_vector<double>(), want["w"]);
        EXPECT_EQ(loss, want["loss"][0]);
      }
    }
  }
}

}  // namespace
}  // namespace baton::stages
