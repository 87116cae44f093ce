// Equivalences the distributed engine builds on: K micro-batches give the gradients of one
// batch; recompute, deferred W and a pipeline cut change no bit of the loss or gradients.
#include <cmath>
#include <cstring>

#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

using testing::random_tokens;
using testing::rows;
using testing::value_of;

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  double norm2 = 0;
};

struct Batch {
  Tensor tokens, targets;
  int64_t samples;
};

Batch make_batch(int64_t samples, int64_t t, int64_t vocab, uint64_t seed) {
  return {random_tokens(samples, t, vocab, seed), random_tokens(samples, t, vocab, seed + 1),
          samples};
}

MicroBatch micro(const Batch& b, int64_t k, int64_t parts) {
  int64_t n = b.samples / parts;
  return MicroBatch{k, k * n, n, b.samples, double(b.tokens.numel()), 5};
}

TensorMap data_of(const Batch& b, const MicroBatch& mb) {
  return {{"tokens", rows(b.tokens, mb.sample_offset, mb.samples)},
          {"targets", rows(b.targets, mb.sample_offset, mb.samples)}};
}

// One step's forward and backward on one stage holding every layer.
Result run_single(const std::shared_ptr<Graph>& g, const Batch& b, int64_t parts, StageOptions so,
                  bool defer_w = false) {
  Stage st(g, 0, g->num_layers(), so);
  st.zero_grad();
  Result r;
  for (int64_t k = 0; k < parts; ++k) {
    MicroBatch mb = micro(b, k, parts);
    r.loss += value_of(st.forward(mb, data_of(b, mb)).at("loss"));
    if (defer_w)
      st.backward_input(k);
    else
      st.backward(k);
  }
  if (defer_w)
    for (int64_t k = 0; k < parts; ++k) st.backward_weight(k);
  st.finish_grads();
  for (int id : st.param_ids())
    r.grads[g->params[size_t(id)].name] = st.grad(id).to_vector<float>();
  r.norm2 = st.grad_sum_squares();
  return r;
}

// The same step through two stages cut at `cut`, micro-batches passed between them as
// a pipeline would (all forwards, then all backwards in order).
Result run_pipeline(const std::shared_ptr<Graph>& g, const Batch& b, int64_t parts, int cut,
                    StageOptions so) {
  Stage s0(g, 0, cut, so), s1(g, cut, g->num_layers(), so);
  s0.zero_grad();
  s1.zero_grad();
  Result r;
  std::vector<TensorMap> sent(static_cast<size_t>(parts));
  for (int64_t k = 0; k < parts; ++k) {
    MicroBatch mb = micro(b, k, parts);
    TensorMap in = data_of(b, mb);
    sent[size_t(k)] = s0.forward(mb, in);
    TensorMap in1 = in;
    for (auto& [name, t] : sent[size_t(k)]) in1[name] = t;
    r.loss += value_of(s1.forward(mb, in1).at("loss"));
  }
  for (int64_t k = 0; k < parts; ++k) {
    TensorMap grads = s1.backward(k);
    s0.backward(k, grads);
  }
  s0.finish_grads();
  s1.finish_grads();
  // The tied wte: each stage holds a copy; the engine all-reduces their gradients.
  for (int id : s0.shared_params()) kernels::add_inplace(s0.grad(id), s1.grad(id));
  for (int id : s1.shared_params()) s1.grad(id).copy_from(s0.grad(id));
  for (Stage* st : {&s0, &s1})
    for (int id : st->param_ids())
      r.grads[g->params[size_t(id)].name] = st->grad(id).to_vector<float>();
  std::vector<double> pieces = s0.grad_sum_squares_by_layer();
  for (double p : s1.grad_sum_squares_by_layer()) pieces.push_back(p);
  for (double p : pieces) r.norm2 += p;
  return r;
}

void expect_bit_identical(const Result& a, const Result& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  EXPECT_EQ(std::memcmp(&a.norm2, &b.norm2, sizeof(double)), 0) << a.norm2 << " vs " << b.norm2;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    const auto& h = b.grads.at(name);
    ASSERT_EQ(g.size(), h.size());
    EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * sizeof(float)), 0) << name;
  }
}

TEST(Equivalence, MicroBatchesGiveTheFullBatchGradients) {
  const uint64_t seed = 21;
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 16, 8, 13);
  Batch b = make_batch(8, 8, 13, seed);
  StageOptions so;
  so.seed = seed;
  Result one = run_single(g, b, 1, so);
  Result four = run_single(g, b, 4, so);
  EXPECT_NEAR(four.loss, one.loss, 1e-6 * std::fabs(one.loss));
  for (const auto& [name, g1] : one.grads) {
    const auto& g4 = four.grads.at(name);
    double num = 0, den = 0;
    for (size_t i = 0; i < g1.size(); ++i) {
      num += (double(g4[i]) - g1[i]) * (double(g4[i]) - g1[i]);
      den += double(g1[i]) * g1[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << name << " (seed " << seed << ")";
  }
}

TEST(Equivalence, DropoutMasksDoNotDependOnTheSplit) {
  const uint64_t seed = 22;
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 16, 8, 13, 0.3);
  auto g0 = testing::tiny_gpt(DType::f32, 2, 2, 16, 8, 13, 0.0);
  Batch b = make_batch(8, 8, 13, seed);
  StageOptions so;
  so.seed = seed;
  Result one = run_single(g, b, 1, so), four = run_single(g, b, 4, so);
  Result none = run_single(g0, b, 1, so);
  EXPECT_NEAR(four.loss, one.loss, 1e-6 * std::fabs(one.loss));
  EXPECT_GT(std::fabs(one.loss - none.loss), 1e-3) << "dropout had no effect";
}

TEST(Equivalence, RecomputeChangesNoBit) {
  const uint64_t seed = 23;
  auto g = testing::tiny_gpt(DType::f32, 3, 2, 16, 8, 13, 0.1);
  Batch b = make_batch(4, 8, 13, seed);
  StageOptions plain, rc;
  plain.seed = rc.seed = seed;
  for (int l = 0; l < g->num_layers(); ++l) rc.recompute_layers.insert(l);
  expect_bit_identical(run_single(g, b, 2, plain), run_single(g, b, 2, rc));
}

TEST(Equivalence, DeferredWeightGradientsChangeNoBit) {
  const uint64_t seed = 24;
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 16, 8, 13, 0.1);
  Batch b = make_batch(6, 8, 13, seed);
  StageOptions so;
  so.seed = seed;
  expect_bit_identical(run_single(g, b, 3, so), run_single(g, b, 3, so, true));
}

// B and W as one pass (backward()) against B then W as two calls: the same bits in the
// gradients, the ready callbacks (the step's last micro-batch) and a ZeRO-2 receiver's
// whole gradients, in the same order.
TEST(Equivalence, FusedBackwardChangesNoBit) {
  const uint64_t seed = 26;
  auto g = testing::tiny_gpt(DType::f32, 3, 2, 16, 8, 13, 0.1);
  Batch b = make_batch(6, 8, 13, seed);
  const int64_t parts = 3;
  for (bool rc : {false, true}) {
    SCOPED_TRACE(rc ? "recompute" : "no recompute");
    auto run = [&](bool fused) {
      StageOptions so;
      so.seed = seed;
      if (rc)
        for (int l = 0; l < g->num_layers(); ++l) so.recompute_layers.insert(l);
      Stage st(g, 0, g->num_layers(), so);
      // Events in order: (param id, the gradient's bits) from ready and the receiver.
      std::vector<std::pair<int, std::vector<float>>> events;
      // ZeRO-2 on the tied wte (two layers' buffers summed) and on ln_f's weight.
      for (const char* name : {"wte.weight", "ln_f.weight"}) {
        const int id = g->find_param(name);
        st.set_optimizer_shard(id, 0, st.param(id).numel() / 2);
        st.set_grad_shard(id);
      }
      st.set_micro_grad_fn(
          [&](int id, Tensor t) { events.emplace_back(id, t.to_vector<float>()); });
      st.zero_grad();
      Result r;
      for (int64_t k = 0; k < parts; ++k) {
        MicroBatch mb = micro(b, k, parts);
        r.loss += value_of(st.forward(mb, data_of(b, mb)).at("loss"));
        Stage::ParamReadyFn ready;
        if (k == parts - 1)
          ready = [&](int id) {
            events.emplace_back(-1 - id, st.grad_sharded(id) ? std::vector<float>{}
                                                             : st.grad(id).to_vector<float>());
          };
        if (fused) {
          st.backward(k, {}, ready);
        } else {
          st.backward_input(k);
          st.backward_weight(k, ready);
        }
      }
      for (int id : st.param_ids())
        r.grads[g->params[size_t(id)].name] = st.grad(id).to_vector<float>();
      return std::make_pair(r, events);
    };
    const auto [fused, fused_events] = run(true);
    const auto [split, split_events] = run(false);
    expect_bit_identical(fused, split);
    ASSERT_EQ(fused_events.size(), split_events.size());
    EXPECT_EQ(fused_events.size(), size_t(parts * 2 + g->params.size()));
    for (size_t i = 0; i < fused_events.size(); ++i) {
      EXPECT_EQ(fused_events[i].first, split_events[i].first) << "event " << i;
      const auto &x = fused_events[i].second, &y = split_events[i].second;
      ASSERT_EQ(x.size(), y.size()) << "event " << i;
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "event " << i;
    }
  }
}

TEST(Equivalence, PipelineCutChangesNoBit) {
  const uint64_t seed = 25;
  auto g = testing::tiny_gpt(DType::f32, 3, 2, 16, 8, 13, 0.1);
  Batch b = make_batch(6, 8, 13, seed);
  StageOptions so;
  so.seed = seed;
  Result single = run_single(g, b, 3, so);
  for (int cut = 1; cut < g->num_layers(); ++cut) {
    SCOPED_TRACE("cut before layer " + std::to_string(cut));
    expect_bit_identical(single, run_pipeline(g, b, 3, cut, so));
  }
}

TEST(Equivalence, CutCarriesOnlyTheResidualStream) {
  auto g = testing::tiny_gpt(DType::f32, 3, 2, 16, 8, 13);
  for (int cut = 1; cut < g->num_layers(); ++cut) {
    auto v = g->cut_values(cut);
    ASSERT_EQ(v.size(), 1u) << "cut " << cut;
    EXPECT_EQ(g->values[size_t(v[0])].type.shape, (memory::Shape{8, 16}));
  }
  // wte is used by the embedding (first layer) and the tied LM head (last layer).
  const Param& wte = g->params[size_t(g->find_param("wte.weight"))];
  EXPECT_EQ(wte.layers, (std::vector<int>{0, g->num_layers() - 1}));
}

}  // namespace
}  // namespace baton::stages
