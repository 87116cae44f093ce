// Kernel fusion as a graph rewrite (partitioner/fusion.h): which pairs fuse, that the fused
// graph's gradients agree with central finite differences (f64) and with the unfused
// graph's, that a whole small GPT trains to the unfused losses within float round-off,
// and that a tensor-parallel split that breaks a pair leaves it unfused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "partitioner/fusion.h"
#include "partitioner/tensor_parallel.h"
#include "tests/stages/helpers.h"

namespace baton::partitioner {
namespace {

using memory::DType;
using memory::Tensor;
using stages::MicroBatch;
using stages::Stage;
using stages::TensorMap;
using stages::testing::random_tokens;
using stages::testing::tiny_gpt;

int count_ops(const stages::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op == op;
  return n;
}

TEST(Fusion, FusesEachBlocksPairs) {
  auto g = tiny_gpt(DType::f32, 3);
  FusionCount count;
  auto f = fuse_kernels(*g, &count);
  EXPECT_EQ(count.add_layernorm,
            3);                   // add_1 + ln_2 of each block (add_2's norm is the next layer's)
  EXPECT_EQ(count.bias_gelu, 3);  // mlp.c_fc's bias + mlp.gelu
  EXPECT_EQ(count_ops(*f, "add_layernorm"), 3);
  EXPECT_EQ(count_ops(*f, "bias_gelu"), 3);
  EXPECT_EQ(count_ops(*f, "gelu"), 0);
  EXPECT_EQ(f->nodes.size(), g->nodes.size() - 3);
  // Values (one more per bias_gelu: h), parameters (ids included) and layers are the
  // unfused graph's.
  ASSERT_EQ(f->values.size(), g->values.size() + 3);
  for (const auto& v : g->values) EXPECT_GE(f->find_value(v.name), 0) << v.name;
  ASSERT_EQ(f->params.size(), g->params.size());
  for (size_t p = 0; p < g->params.size(); ++p) {
    EXPECT_EQ(f->params[p].name, g->params[p].name);
    EXPECT_EQ(f->params[p].layers, g->params[p].layers);
  }
  for (int l = 0; l < g->num_layers(); ++l) {
    EXPECT_EQ(f->cut_values(l).size(), g->cut_values(l).size());
  }
  EXPECT_EQ(f->values[size_t(f->loss)].name, g->values[size_t(g->loss)].name);
  // Nothing left to fuse the second time.
  FusionCount again;
  fuse_kernels(*f, &again);
  EXPECT_EQ(again.add_layernorm + again.bias_gelu, 0);
}

// The new value h is `<gelu node>.pre`, numbered past the model's values of that name (the
// rewrite had failed: "value defined twice: act.pre").
TEST(Fusion, NewValueNamesAvoidTheModels) {
  const std::string reshape = R"({"op": "reshape", "attrs": {"shape": [3, 4]}, )";
  const std::string taken1 = reshape + R"("inputs": ["a"], "outputs": ["act.pre"]})";
  const std::string taken2 = reshape + R"("inputs": ["act.pre"], "outputs": ["act.pre.2"]})";
  for (const auto& [nodes, logits, expected] :
       {std::tuple{taken1, "act.pre", "act.pre.2"},
        std::tuple{taken1 + ", " + taken2, "act.pre.2", "act.pre.3"}}) {
    SCOPED_TRACE(expected);
    const std::string text = R"({"type": "graph",
      "inputs": [{"name": "x", "shape": [3, 4], "dtype": "f32"},
                 {"name": "y", "shape": [3], "dtype": "i32"}],
      "params": [{"name": "w", "shape": [4, 4], "init": {"type": "normal", "std": 0.1}},
                 {"name": "b", "shape": [4], "init": {"type": "zeros"}}],
      "layers": [{"name": "l", "nodes": [
        {"name": "fc", "op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w", "bias": "b"}},
        {"name": "act", "op": "gelu", "inputs": ["h"], "outputs": ["a"]}, )" +
                             nodes + R"(,
        {"op": "cross_entropy", "inputs": [")" +
                             logits +
                             R"(", "y"], "outputs": ["loss"]}]}],
      "loss": "loss"})";
    const stages::Graph g =
        stages::load_model_json(memory::parse_json_text(text, "m.json"), "m.json");
    FusionCount count;
    auto f = fuse_kernels(g, &count);
    EXPECT_EQ(count.bias_gelu, 1);
    const stages::Node& bg = f->nodes[1];
    ASSERT_EQ(bg.op, "bias_gelu");
    EXPECT_EQ(f->values[size_t(bg.outputs[1])].name, expected);
  }
}

void randomize(Stage& st, uint64_t seed) {
  for (int id : st.param_ids())
    kernels::random_normal(st.param(id), 0.0, 0.3, seed, uint64_t(id) + 1, kernels::Block{});
}

// Every parameter's gradient: the fused graph's against the unfused graph's (analytic, the
// same function, f64) and, for the parameters the fused ops use, against central
// differences.
TEST(Fusion, GradientsF64) {
  const uint64_t seed = 21;
  auto g = tiny_gpt(DType::f64, 2);
  auto f = fuse_kernels(*g);
  TensorMap in{{"tokens", random_tokens(2, 5, 11, seed)},
               {"targets", random_tokens(2, 5, 11, seed + 1)}};
  MicroBatch mb{0, 0, 2, 2, 10, 3};
  stages::StageOptions so;
  so.seed = seed;
  Stage plain(g, 0, g->num_layers(), so), fused(f, 0, f->num_layers(), so);
  randomize(plain, seed);
  randomize(fused, seed);
  double losses[2];
  Stage* stages[2] = {&plain, &fused};
  for (int k = 0; k < 2; ++k) {
    stages[k]->zero_grad();
    losses[k] = stages::testing::value_of(stages[k]->forward(mb, in).at("loss"));
    stages[k]->backward(0);
    stages[k]->finish_grads();
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-12 * std::abs(losses[0]));
  auto loss = [&] {
    TensorMap out = fused.forward(mb, in, true);
    fused.discard(0);
    return stages::testing::value_of(out.at("loss"));
  };
  std::mt19937_64 rng(seed);
  int checked = 0;
  for (int id : fused.param_ids()) {
    const std::string& name = f->params[size_t(id)].name;
    std::vector<double> a = fused.grad(id).to_vector<double>(),
                        b = plain.grad(id).to_vector<double>();
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    EXPECT_LE(std::sqrt(num), 1e-10 * std::sqrt(den) + 1e-300) << name;
    const bool fused_op = name.find("ln_2") != std::string::npos ||
                          name.find("c_fc.bias") != std::string::npos ||
                          name.find("attn.c_proj") != std::string::npos;
    if (!fused_op) continue;
    // Central differences on a few elements.
    Tensor p = fused.param(id);
    double* v = p.data<double>();
    double num_fd = 0, den_fd = 0;
    for (int s = 0; s < 6; ++s) {
      const size_t i = size_t(rng() % uint64_t(p.numel()));
      const double orig = v[i], h = 1e-5;
      v[i] = orig + h;
      const double lp = loss();
      v[i] = orig - h;
      const double lm = loss();
      v[i] = orig;
      const double fd = (lp - lm) / (2 * h);
      num_fd += (fd - a[i]) * (fd - a[i]);
      den_fd += fd * fd;
    }
    EXPECT_GT(den_fd, 0) << name;
    EXPECT_LT(std::sqrt(num_fd), 1e-6 * std::sqrt(den_fd)) << name;
    ++checked;
  }
  EXPECT_GE(checked, 6);  // ln_2 weight and bias, c_fc bias, c_proj (the add's input) x 2 blocks
}

// Ten AdamW steps of the small GPT in f32, fused against unfused: the same losses within
// float round-off.
TEST(Fusion, TrainsLikeTheUnfusedGraph) {
  auto g = tiny_gpt(DType::f32, 2, 2, 16, 8, 32);
  auto f = fuse_kernels(*g);
  stages::StageOptions so;
  so.seed = 5;
  Stage plain(g, 0, g->num_layers(), so), fused(f, 0, f->num_layers(), so);
  stages::OptimizerConfig opt;
  opt.adamw.lr = 1e-2;
  plain.set_optimizer(opt);
  fused.set_optimizer(opt);
  double worst = 0;
  for (int64_t step = 0; step < 10; ++step) {
    TensorMap in{{"tokens", random_tokens(4, 8, 32, 100 + uint64_t(step))},
                 {"targets", random_tokens(4, 8, 32, 200 + uint64_t(step))}};
    MicroBatch mb{0, 0, 4, 4, 32, step};
    double l[2];
    Stage* st[2] = {&plain, &fused};
    for (int k = 0; k < 2; ++k) {
      st[k]->zero_grad();
      l[k] = stages::testing::value_of(st[k]->forward(mb, in).at("loss"));
      st[k]->backward(0);
      st[k]->step();
    }
    worst = std::max(worst, std::abs(l[1] - l[0]) / std::abs(l[0]));
    EXPECT_NEAR(l[1], l[0], 1e-5 * std::abs(l[0])) << "step " << step;
  }
  std::printf("  worst relative loss difference over 10 steps: %.2e\n", worst);
}

// Under tensor parallelism the pairs fuse where the split leaves them adjacent on each
// rank: c_fc split by columns (each rank's bias part, then its GELU) or whole, add_1 after
// the row-split c_proj's all-reduce and bias. A linear whose output has another reader
// than the GELU (here the tensor-parallel gather a replicated consumer needs is on the
// GELU's output, not between) would stay unfused.
TEST(Fusion, TensorParallelPhysicalGraphs) {
  auto g = tiny_gpt(DType::f32, 2, 2, 8, 5, 12);
  const std::vector<int> tp(size_t(g->num_layers()), 2);
  for (int r = 0; r < 2; ++r) {
    const std::vector<int> index(size_t(g->num_layers()), r);
    FusionCount c1;
    auto f = fuse_kernels(*build_physical(*g, plan_sharding(*g, tp, {}, "test"), index), &c1);
    EXPECT_EQ(c1.bias_gelu, 2);
    EXPECT_EQ(c1.add_layernorm, 2);
    EXPECT_EQ(
        count_ops(*f, "tp_reduce"),
        count_ops(*build_physical(*g, plan_sharding(*g, tp, {}, "test"), index), "tp_reduce"));
    SplitOverrides ov;
    ov.kinds["h.0.mlp.c_fc"] = SplitKind::none;
    ov.kinds["h.0.mlp.c_proj"] = SplitKind::none;
    FusionCount c2;
    fuse_kernels(*build_physical(*g, plan_sharding(*g, tp, ov, "test"), index), &c2);
    EXPECT_EQ(c2.bias_gelu, 2);
    EXPECT_EQ(c2.add_layernorm, 2);
  }
}

}  // namespace
}  // namespace baton::partitioner
