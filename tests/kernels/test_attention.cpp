// Causal self-attention: forward against a naive O(T^2) reference (with and without
// dropout on the probabilities), backward against finite differences, float32 against
// float64, accumulate, and the dropout mask's independence of batch/head partitioning.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "kernels/random.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

struct Naive {
  std::vector<double> out, lse;
};

// Straightforward attention over a [B, T, 3 H D] qkv in double.
Naive naive_attention(const Tensor& qkv, const AttentionOptions& opt) {
  const auto v = as_f64(qkv);
  const int64_t B = qkv.size(0), T = qkv.size(1), H = opt.heads, D = qkv.size(2) / (3 * H);
  const int64_t ld = 3 * H * D;
  const double scale = opt.scale.value_or(1 / std::sqrt(double(D)));
  const int64_t Hg = opt.global_heads > 0 ? opt.global_heads : H;
  const uint32_t thr = random::dropout_threshold(opt.dropout);
  Naive r{std::vector<double>(size_t(B * T * H * D)), std::vector<double>(size_t(B * H * T))};
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dotp = 0;
          for (int64_t d = 0; d < D; ++d)
            dotp += v[size_t((b * T + i) * ld + h * D + d)] *
                    v[size_t((b * T + j) * ld + (H + h) * D + d)];
          s[size_t(j)] = scale * dotp;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[size_t(j)] - mx);
        r.lse[size_t((b * H + h) * T + i)] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          double p = std::exp(s[size_t(j)] - mx) / sum;
          if (opt.dropout > 0) {
            const uint64_t idx =
                uint64_t((((b + opt.batch_offset) * Hg + h + opt.head_offset) * T + i) * T + j);
            p = random::dropout_keep(random::random_bits(opt.seed, opt.stream, idx), thr)
                    ? p / (1 - opt.dropout)
                    : 0.0;
          }
          for (int64_t d = 0; d < D; ++d)
            r.out[size_t((b * T + i) * H * D + h * D + d)] +=
                p * v[size_t((b * T + j) * ld + (2 * H + h) * D + d)];
        }
      }
  return r;
}

struct Case {
  int64_t B, T, H, D;
  double dropout;
};

std::string case_name(const Case& c) {
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) +
         "_D" + std::to_string(c.D) + (c.dropout > 0 ? "_dropout" : "");
}

AttentionOptions options(const Case& c) {
  AttentionOptions o;
  o.heads = c.H;
  o.dropout = c.dropout;
  o.seed = 2024;
  o.stream = stream_of("attn");
  return o;
}

class AttentionForward : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionForward, MatchesNaiveReference) {
  const Case c = GetParam();
  std::mt19937_64 rng(test_seed(61));
  const Tensor qkv = randn({c.B, c.T, 3 * c.H * c.D}, rng);
  const auto opt = options(c);
  Tensor out = Tensor::empty({c.B, c.T, c.H * c.D}, DType::f64),
         lse = Tensor::empty({c.B, c.H, c.T}, DType::f64);
  attention_forward(qkv, opt, out, lse);
  const Naive want = naive_attention(qkv, opt);
  EXPECT_LT(rel_error(as_f64(out), want.out), 1e-12);
  EXPECT_LT(rel_error(as_f64(lse), want.lse), 1e-12);
  Tensor out32 = Tensor::empty(out.shape(), DType::f32),
         lse32 = Tensor::empty(lse.shape(), DType::f32);
  attention_forward(qkv.to(DType::f32), opt, out32, lse32);
  EXPECT_LT(rel_error(out32, out), 1e-4);
  EXPECT_LT(rel_error(lse32, lse), 1e-4);
}

// T beyond one query block (64) and one key chunk (512), not multiples of either.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionForward,
                         ::testing::Values(Case{1, 1, 1, 4, 0}, Case{2, 70, 2, 8, 0},
                                           Case{1, 130, 3, 16, 0}, Case{2, 64, 1, 32, 0},
                                           Case{1, 600, 1, 8, 0}, Case{1, 1100, 2, 4, 0},
                                           Case{2, 70, 2, 8, 0.2}, Case{1, 600, 2, 4, 0.3},
                                           // head sizes with float tile kernels (16 W)
                                           Case{1, 600, 1, 32, 0}, Case{2, 100, 2, 64, 0.1},
                                           Case{1, 150, 1, 128, 0}, Case{1, 70, 2, 48, 0}),
                         [](const auto& param_info) { return case_name(param_info.param); });

class AttentionBackward : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBackward, MatchesFiniteDifferences) {
  const Case c = GetParam();
  std::mt19937_64 rng(test_seed(62));
  Tensor qkv = randn({c.B, c.T, 3 * c.H * c.D}, rng);
  const auto opt = options(c);
  const Shape os{c.B, c.T, c.H * c.D}, ls{c.B, c.H, c.T};
  const Tensor g = randn(os, rng);
  Tensor out = Tensor::empty(os, DType::f64), lse = Tensor::empty(ls, DType::f64);
  attention_forward(qkv, opt, out, lse);
  Tensor dqkv = Tensor::full(qkv.shape(), std::nan(""), DType::f64);  // overwritten
  attention_backward(qkv, out, lse, g, opt, dqkv, false);
  auto loss = [&] {
    Tensor o = Tensor::empty(os, DType::f64), l = Tensor::empty(ls, DType::f64);
    attention_forward(qkv, opt, o, l);
    return dot(g, o);
  };
  // Long sequences (several key chunks) cost a forward per coordinate: fewer coordinates
  // there; the float32-vs-float64 check below covers every element.
  EXPECT_LT(fd_check(qkv, dqkv, loss, rng, c.T > 200 ? 50 : 250), 1e-6);

  Tensor acc = Tensor::full(qkv.shape(), 1.0, DType::f64);
  attention_backward(qkv, out, lse, g, opt, acc, true);
  auto want = as_f64(dqkv);
  for (double& v : want) v += 1;
  EXPECT_LT(rel_error(as_f64(acc), want), 1e-13);

  const DType f = DType::f32;
  const Tensor q32 = qkv.to(f);
  Tensor o32 = Tensor::empty(os, f), l32 = Tensor::empty(ls, f),
         d32 = Tensor::full(qkv.shape(), std::nan(""), f);  // overwritten
  attention_forward(q32, opt, o32, l32);
  attention_backward(q32, o32, l32, g.to(f), opt, d32, false);
  EXPECT_LT(rel_error(d32, dqkv), 1e-4);
  // Accumulated, the float32 kernels add the same gradient (one pair: its query blocks
  // split among tasks, the later ones' key gradients added last).
  Tensor acc32 = Tensor::full(qkv.shape(), 1.0, f);
  attention_backward(q32, o32, l32, g.to(f), opt, acc32, true);
  EXPECT_LT(rel_error(as_f64(acc32), plus_one(d32)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBackward,
                         ::testing::Values(Case{1, 1, 1, 4, 0}, Case{2, 70, 2, 8, 0},
                                           Case{1, 130, 3, 16, 0}, Case{1, 600, 1, 4, 0},
                                           Case{2, 70, 2, 8, 0.2}, Case{1, 530, 1, 4, 0.1},
                                           Case{1, 530, 1, 16, 0.1}, Case{2, 67, 1, 64, 0},
                                           Case{1, 40, 1, 128, 0.2},
                                           // tile kernels over two key chunks, no dropout
                                           Case{1, 530, 1, 32, 0}),
                         [](const auto& param_info) { return case_name(param_info.param); });

// The first query sees one key, so its dS (and with it the query's gradient, and at T = 1
// every key's) is exactly 0, as torch computes it: rounding there had moved every q/k
// weight by AdamW steps of up to 0.9 lr at context 1. Both the generic (D = 8, f64) and
// the tile (D = 16, f32) paths, with and without dropout.
TEST(Attention, TheFirstQueryHasExactlyZeroGradients) {
  std::mt19937_64 rng(test_seed(64));
  for (const DType dt : {DType::f64, DType::f32})
    for (const int64_t D : {8, 16})
      for (const int64_t T : {1, 37})
        for (const double dropout : {0.0, 0.2}) {
          const Case c{2, T, 2, D, dropout};
          const auto opt = options(c);
          const Tensor qkv = randn({c.B, T, 3 * c.H * D}, rng).to(dt);
          const Shape os{c.B, T, c.H * D}, ls{c.B, c.H, T};
          Tensor out = Tensor::empty(os, dt), lse = Tensor::empty(ls, dt),
                 d = Tensor::empty(qkv.shape(), dt);
          attention_forward(qkv, opt, out, lse);
          attention_backward(qkv, out, lse, randn(os, rng).to(dt), opt, d, false);
          const auto g = as_f64(d);
          const int64_t ld = 3 * c.H * D;
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t col = 0; col < (T == 1 ? 2 : 1) * c.H * D; ++col)
              ASSERT_EQ(g[size_t(b * T * ld + col)], 0.0)
                  << case_name(c) << " " << dtype_name(dt) << " batch " << b << " column " << col;
        }
}

// The columns of heads [h0, h0 + n) of each of q, k, v, for batches [b0, b0 + nb).
Tensor head_slice(const Tensor& qkv, int64_t H, int64_t D, int64_t b0, int64_t nb, int64_t h0,
                  int64_t n) {
  std::vector<Tensor> parts;
  Tensor rows = qkv.narrow(0, b0, nb);
  Tensor out = Tensor::empty({nb, qkv.size(1), 3 * n * D}, qkv.dtype());
  for (int64_t part = 0; part < 3; ++part)
    out.narrow(2, part * n * D, n * D).copy_from(rows.narrow(2, (part * H + h0) * D, n * D));
  return out;
}

TEST(Attention, DropoutMaskDoesNotDependOnBatchOrHeadPartitioning) {
  std::mt19937_64 rng(test_seed(63));
  const int64_t B = 4, T = 40, H = 4, D = 8;
  const Tensor qkv = randn({B, T, 3 * H * D}, rng);
  AttentionOptions whole;
  whole.heads = H;
  whole.dropout = 0.25;
  whole.seed = 77;
  whole.stream = 3;
  Tensor out = Tensor::empty({B, T, H * D}, DType::f64), lse = Tensor::empty({B, H, T}, DType::f64);
  attention_forward(qkv, whole, out, lse);
  // Batches 1..2, heads 2..3 as a tensor-parallel rank with data-parallel split sees them.
  AttentionOptions part = whole;
  part.heads = 2;
  part.batch_offset = 1;
  part.head_offset = 2;
  part.global_batch = B;
  part.global_heads = H;
  const Tensor local = head_slice(qkv, H, D, 1, 2, 2, 2);
  Tensor lout = Tensor::empty({2, T, 2 * D}, DType::f64),
         llse = Tensor::empty({2, 2, T}, DType::f64);
  attention_forward(local, part, lout, llse);
  const Tensor want = out.narrow(0, 1, 2).narrow(2, 2 * D, 2 * D).contiguous();
  EXPECT_LT(rel_error(as_f64(lout), as_f64(want)), 1e-14);
  // And backward: the local dqkv equals the same columns of the whole one.
  const Tensor g = randn(out.shape(), rng);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f64);
  attention_backward(qkv, out, lse, g, whole, dqkv, false);
  Tensor ldq = Tensor::empty(local.shape(), DType::f64);
  attention_backward(local, lout, llse, g.narrow(0, 1, 2).narrow(2, 2 * D, 2 * D).contiguous(),
                     part, ldq, false);
  EXPECT_LT(rel_error(as_f64(ldq), as_f64(head_slice(dqkv, H, D, 1, 2, 2, 2))), 1e-13);
}

TEST(Attention, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(64));
  const DType f = DType::f32;
  const Tensor qkv = randn({2, 200, 3 * 4 * 16}, rng, 1.0, f), g = randn({2, 200, 64}, rng, 1.0, f);
  AttentionOptions o;
  o.heads = 4;
  o.dropout = 0.1;
  expect_attention_same_at_1_and_2_threads(qkv, g, o);
}

// One (batch, head) pair over ten query blocks: its backward's query blocks are split among
// tasks by the shape alone, so 1 and 2 threads give the same bits.
TEST(Attention, OnePairsSplitBackwardDoesNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(65));
  const DType f = DType::f32;
  const Tensor qkv = randn({1, 600, 3 * 32}, rng, 1.0, f), g = randn({1, 600, 32}, rng, 1.0, f);
  AttentionOptions o;
  o.heads = 1;
  expect_attention_same_at_1_and_2_threads(qkv, g, o);
}

// Head size 8 (no tile kernels: the GEMM path) with one pair: its one backward task runs
// alone, its GEMMs on one thread as inside a parallel region. oneDNN had split their sums
// among both threads: the bits of a LLaMA's q, k and v gradients depended on --threads.
TEST(Attention, OnePairsGemmPathDoesNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(66));
  const DType f = DType::f32;
  const Tensor qkv = randn({1, 700, (2 + 2) * 8}, rng, 1.0, f),
               g = randn({1, 700, 16}, rng, 1.0, f);
  AttentionOptions o;
  o.heads = 2;
  o.kv_heads = 1;
  expect_attention_same_at_1_and_2_threads(qkv, g, o);
}

// scale 0 is a scale, not "the default": every visible key weighs the same, so output row i
// is the mean of value rows 0..i (f64 and the f32 tile kernels, D = 32).
TEST(Attention, ZeroScaleAveragesTheVisibleValues) {
  std::mt19937_64 rng(test_seed(65));
  const int64_t T = 70, H = 2, D = 32;
  const Tensor qkv = randn({1, T, 3 * H * D}, rng);
  AttentionOptions o;
  o.heads = H;
  o.scale = 0.0;
  const auto v = as_f64(qkv);
  std::vector<double> want(size_t(T * H * D));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) {
      double sum = 0;
      for (int64_t i = 0; i < T; ++i) {
        sum += v[size_t(i * 3 * H * D + (2 * H + h) * D + d)];
        want[size_t(i * H * D + h * D + d)] = sum / double(i + 1);
      }
    }
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor out = Tensor::empty({1, T, H * D}, dt), lse = Tensor::empty({1, H, T}, dt);
    attention_forward(qkv.to(dt), o, out, lse);
    EXPECT_LT(rel_error(as_f64(out), want), dt == DType::f64 ? 1e-13 : 1e-5) << dtype_name(dt);
  }
}

TEST(Attention, RejectsBadShapes) {
  AttentionOptions o;
  o.heads = 2;
  Tensor qkv = Tensor::zeros({1, 4, 18}), out = Tensor::zeros({1, 4, 6}),
         lse = Tensor::zeros({1, 2, 4});
  EXPECT_NO_THROW(attention_forward(qkv, o, out, lse));
  Tensor bad = Tensor::zeros({1, 4, 16});
  EXPECT_THROW(attention_forward(bad, o, out, lse), std::invalid_argument);
  Tensor bad_lse = Tensor::zeros({1, 4, 2});
  EXPECT_THROW(attention_forward(qkv, o, out, bad_lse), std::invalid_argument);
}

}  // namespace
}  // namespace baton::kernels::test
