// The cost model's bytes equal what the allocator measures: parameters, gradients and
// optimizer state; the stash a micro-batch keeps between F and B (with and without
// recompute, whole model and a middle stage); W's stash is bounded by its estimate. The
// linear FLOPs are the 2 N T of the usual formula.
#include "memory/allocator.h"
#include "stages/cost.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

int64_t in_use() {
  return int64_t(memory::allocator_for(memory::Device::cpu()).stats().in_use);
}

struct Measured {
  int64_t persistent, stash, kept_inputs, weight_stash;
};

Measured measure(const std::shared_ptr<Graph>& g, int first, int last, int64_t batch,
                 const std::set<int>& recompute) {
  Measured m{};
  int64_t t = g->value("tokens").type.shape[0];
  int64_t c = g->values[size_t(g->cut_values(1)[0])].type.shape[1];
  int64_t before = in_use();
  StageOptions so;
  so.recompute_layers = recompute;
  Stage st(g, first, last, so);
  st.set_optimizer(OptimizerConfig{});
  m.persistent = in_use() - before;
  EXPECT_EQ(m.persistent, st.persistent_bytes());
  st.zero_grad();
  int64_t base = in_use();
  TensorMap in{{"tokens", testing::random_tokens(batch, t, 13, 1)},
               {"targets", testing::random_tokens(batch, t, 13, 2)}};
  for (int v : st.boundary_inputs())
    in[g->values[size_t(v)].name] = testing::random_like({batch, t, c}, DType::f32, 1.0, 3);
  int64_t with_inputs = in_use();
  MicroBatch mb{0, 0, batch, batch, double(batch * t), 0};
  st.forward(mb, in);
  m.stash = in_use() - with_inputs;
  in.clear();
  m.kept_inputs = in_use() - base - m.stash;
  TensorMap grads;
  for (int v : st.boundary_outputs())
    if (v != g->loss)
      grads[g->values[size_t(v)].name] = testing::random_like({batch, t, c}, DType::f32, 1.0, 4);
  int64_t before_b = in_use();
  st.backward_input(0, grads);
  grads.clear();
  m.weight_stash = in_use() - before_b + 0;
  st.backward_weight(0);
  EXPECT_EQ(in_use(), base) << "W must free everything the micro-batch held";
  return m;
}

void check(const std::shared_ptr<Graph>& g, int first, int last, int64_t batch,
           const std::set<int>& recompute) {
  StageCost e = estimate_stage(*g, first, last, batch, recompute);
  Measured m = measure(g, first, last, batch, recompute);
  EXPECT_EQ(m.persistent, e.persistent_bytes());
  EXPECT_EQ(m.stash, e.stash_bytes);
  EXPECT_EQ(m.kept_inputs, e.kept_input_bytes);
  EXPECT_LE(m.weight_stash, e.weight_stash_bytes + e.kept_input_bytes);
  EXPECT_GT(m.weight_stash, 0);
}

TEST(Cost, StashBytesEqualTheMeasuredGrowth) {
  auto g = testing::tiny_gpt(DType::f32, 3, 2, 16, 8, 13, 0.1);
  const int L = g->num_layers();
  {
    SCOPED_TRACE("whole model");
    check(g, 0, L, 4, {});
  }
  {
    SCOPED_TRACE("whole model, every block recomputed");
    check(g, 0, L, 4, {1, 2, 3});
  }
  {
    SCOPED_TRACE("middle stage");
    check(g, 1, 3, 2, {});
  }
  {
    SCOPED_TRACE("middle stage, recomputed");
    check(g, 1, 3, 2, {1, 2});
  }
  EXPECT_LT(estimate_stage(*g, 0, L, 4, {1, 2, 3}).stash_bytes,
            estimate_stage(*g, 0, L, 4).stash_bytes);
}

TEST(Cost, LinearFlopsAreTwoNT) {
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 16, 8, 13);
  const int64_t batch = 3, tokens = batch * 8;
  double expect = 0;
  for (const Node& n : g->nodes) {
    if (n.op != "linear") continue;
    expect +=
        2.0 * double(tokens) * double(memory::shape_numel(g->params[size_t(n.params[0])].shape));
    if (n.params[1] >= 0)
      expect += double(tokens) * double(g->params[size_t(n.params[1])].shape[0]);
  }
  double got = 0;
  for (const Node& n : g->nodes)
    if (n.op == "linear") got += n.impl->cost(batch).forward_flops;
  EXPECT_EQ(got, expect);
  StageCost c = estimate_stage(*g, 0, g->num_layers(), batch);
  EXPECT_GT(c.forward_flops, got);
  EXPECT_GT(c.backward_input_flops, 0);
  EXPECT_GT(c.backward_weight_flops, 0);
}

}  // namespace
}  // namespace baton::stages
