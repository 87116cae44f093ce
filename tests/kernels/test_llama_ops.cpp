// The LLaMA family's kernels: RMSNorm, SiLU and the fused SwiGLU gate, rotary position
// embeddings (rotate-half, with the linear and llama3 frequency scalings) and
// grouped-query attention. Forward against direct formulas, backward against finite
// differences in float64, float32 against float64, accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

// ---- RMSNorm ----

TEST(RmsNorm, ForwardMatchesTheFormula) {
  std::mt19937_64 rng(test_seed(81));
  const int64_t c = 37;
  const Tensor x = randn({2, 3, c}, rng, 3.0), w = randn({c}, rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64), rstd = Tensor::empty({2, 3}, DType::f64);
  rmsnorm_forward(x, w, 1e-6, y, rstd);
  const auto xv = as_f64(x), yv = as_f64(y), wv = as_f64(w);
  for (int64_t r = 0; r < 6; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += xv[size_t(r * c + j)] * xv[size_t(r * c + j)] / c;
    const double rs = 1 / std::sqrt(ms + 1e-6);
    EXPECT_NEAR(as_f64(rstd)[size_t(r)], rs, 1e-13);
    for (int64_t j = 0; j < c; ++j)
      EXPECT_NEAR(yv[size_t(r * c + j)], wv[size_t(j)] * xv[size_t(r * c + j)] * rs, 1e-12);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(test_seed(82));
  const int64_t c = 19, n = 5;
  Tensor x = randn({n, c}, rng, 2.0), w = randn({c}, rng);
  const Tensor g = randn(x.shape(), rng);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64), r = Tensor::empty({n}, DType::f64);
    rmsnorm_forward(x, w, 1e-5, yy, r);
    return dot(g, yy);
  };
  Tensor y = Tensor::empty(x.shape(), DType::f64), rstd = Tensor::empty({n}, DType::f64);
  rmsnorm_forward(x, w, 1e-5, y, rstd);
  Tensor dx = Tensor::full(x.shape(), std::nan(""), DType::f64),
         dw = Tensor::full({c}, std::nan(""), DType::f64);
  rmsnorm_backward_input(g, x, w, rstd, dx, false);
  rmsnorm_backward_weight(g, x, rstd, dw, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(w, dw, loss, rng), 1e-6);

  Tensor dx2 = Tensor::full(x.shape(), 1.0, DType::f64), dw2 = Tensor::full({c}, 1.0, DType::f64);
  rmsnorm_backward_input(g, x, w, rstd, dx2, true);
  rmsnorm_backward_weight(g, x, rstd, dw2, true);
  EXPECT_LT(rel_error(as_f64(dx2), plus_one(dx)), 1e-14);
  EXPECT_LT(rel_error(as_f64(dw2), plus_one(dw)), 1e-14);

  const DType f = DType::f32;
  Tensor y32 = Tensor::empty(x.shape(), f), r32 = Tensor::empty({n}, f),
         dx32 = Tensor::empty(x.shape(), f), dw32 = Tensor::empty({c}, f);
  const Tensor x32 = x.to(f), w32 = w.to(f), g32 = g.to(f);
  rmsnorm_forward(x32, w32, 1e-5, y32, r32);
  rmsnorm_backward_input(g32, x32, w32, r32, dx32, false);
  rmsnorm_backward_weight(g32, x32, r32, dw32, false);
  EXPECT_LT(rel_error(y32, y), 1e-6);
  EXPECT_LT(rel_error(dx32, dx), 1e-5);
  EXPECT_LT(rel_error(dw32, dw), 1e-5);
}

// ---- SiLU and SwiGLU ----

TEST(Silu, ForwardAndBackward) {
  std::mt19937_64 rng(test_seed(83));
  Tensor x = randn({3, 41}, rng, 3.0);
  const Tensor g = randn(x.shape(), rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  silu_forward(x, y);
  const auto xv = as_f64(x), yv = as_f64(y);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(yv[i], xv[i] / (1 + std::exp(-xv[i])), 1e-14);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64);
    silu_forward(x, yy);
    return dot(g, yy);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  silu_backward(x, g, dx, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  // float32 over a wide range, saturation included (the vectorised exp and reciprocal).
  Tensor wide = Tensor::empty({1, 2001}, DType::f64);
  for (int64_t i = 0; i < 2001; ++i) wide.span<double>()[size_t(i)] = -100.0 + 0.1 * double(i);
  Tensor w64 = Tensor::empty(wide.shape(), DType::f64),
         w32 = Tensor::empty(wide.shape(), DType::f32);
  silu_forward(wide, w64);
  silu_forward(wide.to(DType::f32), w32);
  EXPECT_LT(rel_error(w32, w64), 1e-6);
  Tensor d64 = Tensor::empty(wide.shape(), DType::f64),
         d32 = Tensor::empty(wide.shape(), DType::f32);
  const Tensor ones = Tensor::full(wide.shape(), 1.0, DType::f64);
  silu_backward(wide, ones, d64, false);
  silu_backward(wide.to(DType::f32), ones.to(DType::f32), d32, false);
  EXPECT_LT(rel_error(d32, d64), 1e-6);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937_64 rng(test_seed(84));
  Tensor gate = randn({2, 5, 23}, rng, 2.0), up = randn({2, 5, 23}, rng);
  const Tensor g = randn(gate.shape(), rng);
  Tensor y = Tensor::empty(gate.shape(), DType::f64);
  swiglu_forward(gate, up, y);
  const auto gv = as_f64(gate), uv = as_f64(up), yv = as_f64(y);
  for (size_t i = 0; i < gv.size(); ++i)
    EXPECT_NEAR(yv[i], gv[i] / (1 + std::exp(-gv[i])) * uv[i], 1e-13);
  auto loss = [&] {
    Tensor yy = Tensor::empty(gate.shape(), DType::f64);
    swiglu_forward(gate, up, yy);
    return dot(g, yy);
  };
  Tensor dg = Tensor::full(gate.shape(), std::nan(""), DType::f64),
         du = Tensor::full(gate.shape(), std::nan(""), DType::f64);
  swiglu_backward(gate, up, g, dg, du, false, false);
  EXPECT_LT(fd_check(gate, dg, loss, rng), 1e-6);
  EXPECT_LT(fd_check(up, du, loss, rng), 1e-6);
  // Each gradient alone, with its own accumulate flag.
  Tensor dg2 = Tensor::full(gate.shape(), 1.0, DType::f64), none;
  Tensor du2 = Tensor::full(gate.shape(), std::nan(""), DType::f64);
  swiglu_backward(gate, up, g, dg2, none, true, false);
  swiglu_backward(gate, up, g, none, du2, false, false);
  auto want = as_f64(dg);
  for (double& v : want) v += 1;
  EXPECT_LT(rel_error(as_f64(dg2), want), 1e-14);
  EXPECT_LT(rel_error(du2, du), 1e-15);

  const DType f = DType::f32;
  Tensor y32 = Tensor::empty(gate.shape(), f), dg32 = Tensor::empty(gate.shape(), f),
         du32 = Tensor::empty(gate.shape(), f);
  swiglu_forward(gate.to(f), up.to(f), y32);
  swiglu_backward(gate.to(f), up.to(f), g.to(f), dg32, du32, false, false);
  EXPECT_LT(rel_error(y32, y), 1e-6);
  EXPECT_LT(rel_error(dg32, dg), 1e-6);
  EXPECT_LT(rel_error(du32, du), 1e-6);
}

// ---- rotary ----

TEST(Rotary, InverseFrequenciesFollowTheScalings) {
  const int64_t D = 16;
  const double theta = 10000;
  RopeScaling none;
  auto f = rope_inv_freq(D, theta, none);
  ASSERT_EQ(f.size(), 8u);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_DOUBLE_EQ(f[size_t(i)], std::pow(theta, -double(2 * i) / double(D)));
  RopeScaling lin{RopeScaling::Kind::linear, 4.0};
  auto fl = rope_inv_freq(D, theta, lin);
  for (size_t i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(fl[i], f[i] / 4.0);
  // llama3 with a short original context so all three bands appear: wavelengths 2 pi /
  // f[i] are 6.3, 20, 63, 199, 628, 1987, ...; low band > 64 / 1 = 64, high band < 64 / 4
  // = 16.
  RopeScaling l3{RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 64};
  auto f3 = rope_inv_freq(D, theta, l3);
  const double pi = 3.14159265358979323846;
  for (size_t i = 0; i < 8; ++i) {
    const double wl = 2 * pi / f[i];
    double want = f[i];
    if (wl > 64) {
      want = f[i] / 8;
    } else if (wl >= 16) {
      const double s = (64 / wl - 1) / 3;
      want = (1 - s) * f[i] / 8 + s * f[i];
    }
    EXPECT_DOUBLE_EQ(f3[i], want) << i;
  }
  EXPECT_EQ(f3[0], f[0]);      // highest frequency kept
  EXPECT_EQ(f3[7], f[7] / 8);  // lowest scaled
  EXPECT_THROW(rope_inv_freq(15, theta, none), std::invalid_argument);
}

TEST(Rotary, RotatesHalvesIntoTheFusedColumnsAndBackwardIsTheTranspose) {
  std::mt19937_64 rng(test_seed(85));
  const int64_t B = 2, T = 7, H = 3, D = 8, C = 40, col = 9;
  const auto inv = rope_inv_freq(D, 500.0, RopeScaling{});
  RotaryOptions o{H, &inv, 3};
  Tensor x = randn({B, T, H * D}, rng);
  Tensor dst = Tensor::full({B, T, C}, 7.0, DType::f64);
  rotary_forward(x, o, dst, col);
  const auto xv = as_f64(x), dv = as_f64(dst);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double got = dv[size_t((b * T + t) * C + c)];
        if (c < col || c >= col + H * D) {
          EXPECT_EQ(got, 7.0);  // other columns untouched
          continue;
        }
        const int64_t h = (c - col) / D, j = (c - col) % D, i = j % (D / 2);
        const double a = double(t + 3) * inv[size_t(i)];
        const double* row = xv.data() + (b * T + t) * H * D + h * D;
        const double want = j < D / 2 ? row[i] * std::cos(a) - row[i + D / 2] * std::sin(a)
                                      : row[i + D / 2] * std::cos(a) + row[i] * std::sin(a);
        EXPECT_NEAR(got, want, 1e-14);
      }
  // Backward: the gradient of sum(g * dst) with respect to x, against finite differences.
  const Tensor g = randn(dst.shape(), rng);
  auto loss = [&] {
    Tensor d = Tensor::zeros({B, T, C}, DType::f64);
    rotary_forward(x, o, d, col);
    return dot(g, d);
  };
  Tensor dx = Tensor::full(x.shape(), std::nan(""), DType::f64);
  rotary_backward(g, col, o, dx, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  Tensor dx2 = Tensor::full(x.shape(), 1.0, DType::f64);
  rotary_backward(g, col, o, dx2, true);
  auto want = as_f64(dx);
  for (double& v : want) v += 1;
  EXPECT_LT(rel_error(as_f64(dx2), want), 1e-14);
  // float32 agrees with float64.
  Tensor d32 = Tensor::zeros({B, T, C}, DType::f32), dx32 = Tensor::empty(x.shape(), DType::f32);
  rotary_forward(x.to(DType::f32), o, d32, col);
  rotary_backward(g.to(DType::f32), col, o, dx32, false);
  Tensor d64 = Tensor::zeros({B, T, C}, DType::f64);
  rotary_forward(x, o, d64, col);
  EXPECT_LT(rel_error(d32, d64), 1e-6);
  EXPECT_LT(rel_error(dx32, dx), 1e-6);
  // Bad arguments.
  Tensor small = Tensor::zeros({B, T, 20}, DType::f64);
  EXPECT_THROW(rotary_forward(x, o, small, 0), std::invalid_argument);
  const std::vector<double> short_freq(3, 1.0);
  RotaryOptions bad{H, &short_freq, 0};
  EXPECT_THROW(rotary_forward(x, bad, dst, 0), std::invalid_argument);
}

// The kernel keeps the last call's cos and sin tables: a call with another offset, other
// frequencies of the same count (another rope_theta), another length or head size gets
// its own, in both precisions. Each call is checked against the rotation computed here.
TEST(Rotary, KeptTablesFollowPositionsFrequenciesAndLengths) {
  std::mt19937_64 rng(test_seed(86));
  const int64_t B = 1, H = 2;
  struct Call {
    int64_t T, D, offset;
    double theta;
  };
  const std::vector<Call> calls = {{5, 8, 0, 500},   {5, 8, 0, 500},   {5, 8, 2, 500},
                                   {5, 8, 2, 10000}, {9, 8, 2, 10000}, {9, 4, 2, 10000},
                                   {5, 8, 0, 500}};
  for (DType dt : {DType::f64, DType::f32})
    for (const Call& k : calls) {
      SCOPED_TRACE("T " + std::to_string(k.T) + " D " + std::to_string(k.D) + " offset " +
                   std::to_string(k.offset) + " theta " + std::to_string(k.theta));
      const auto inv = rope_inv_freq(k.D, k.theta, RopeScaling{});
      RotaryOptions o{H, &inv, k.offset};
      Tensor x = randn({B, k.T, H * k.D}, rng).to(dt);
      Tensor dst = Tensor::zeros({B, k.T, H * k.D}, dt);
      rotary_forward(x, o, dst, 0);
      const auto xv = as_f64(x), dv = as_f64(dst);
      double worst = 0;
      for (int64_t t = 0; t < k.T; ++t)
        for (int64_t c = 0; c < H * k.D; ++c) {
          const int64_t h = c / k.D, j = c % k.D, half = k.D / 2, i = j % half;
          const double a = double(t + k.offset) * inv[size_t(i)];
          const double* row = xv.data() + t * H * k.D + h * k.D;
          const double want = j < half ? row[i] * std::cos(a) - row[i + half] * std::sin(a)
                                       : row[i + half] * std::cos(a) + row[i] * std::sin(a);
          worst = std::max(worst, std::abs(dv[size_t(t * H * k.D + c)] - want));
        }
      EXPECT_LT(worst, dt == DType::f64 ? 1e-14 : 1e-5);
    }
}

// ---- grouped-query attention ----

// qkv [B, T, (H + 2 KV) D] -> [B, T, 3 H D] with each key/value head repeated for the
// query heads that read it (head h reads kv head h / (H / KV)).
Tensor expand_kv(const Tensor& qkv, int64_t H, int64_t KV, int64_t D) {
  const int64_t B = qkv.size(0), T = qkv.size(1), G = H / KV;
  Tensor out = Tensor::empty({B, T, 3 * H * D}, qkv.dtype());
  out.narrow(2, 0, H * D).copy_from(qkv.narrow(2, 0, H * D));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t part = 1; part <= 2; ++part)
      out.narrow(2, (part * H + h) * D, D)
          .copy_from(qkv.narrow(2, (H + (part - 1) * KV + h / G) * D, D));
  return out;
}

// The gradient of the expanded qkv folded back: each kv head's gradient sums its group's.
std::vector<double> fold_kv(const Tensor& d, int64_t H, int64_t KV, int64_t D) {
  const int64_t B = d.size(0), T = d.size(1), G = H / KV, w = (H + 2 * KV) * D;
  const auto v = as_f64(d);
  std::vector<double> out(size_t(B * T * w), 0.0);
  for (int64_t r = 0; r < B * T; ++r) {
    const double* src = v.data() + r * 3 * H * D;
    double* dst = out.data() + r * w;
    for (int64_t c = 0; c < H * D; ++c) dst[c] = src[c];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t part = 1; part <= 2; ++part)
        for (int64_t e = 0; e < D; ++e)
          dst[(H + (part - 1) * KV + h / G) * D + e] += src[(part * H + h) * D + e];
  }
  return out;
}

struct GqaCase {
  int64_t B, T, H, KV, D;
  double dropout;
};

class GroupedQueryAttention : public ::testing::TestWithParam<GqaCase> {};

// Against multi-head attention on repeated key/value heads (itself tested against a naive
// reference), in float64 and float32 (the tile kernels for D = 16 W), then finite
// differences.
TEST_P(GroupedQueryAttention, EqualsMultiHeadAttentionOnRepeatedHeads) {
  const GqaCase c = GetParam();
  std::mt19937_64 rng(test_seed(86));
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(memory::dtype_name(dt));
    const Tensor qkv = randn({c.B, c.T, (c.H + 2 * c.KV) * c.D}, rng, 1.0, dt);
    AttentionOptions gqa;
    gqa.heads = c.H;
    gqa.kv_heads = c.KV;
    gqa.dropout = c.dropout;
    gqa.seed = 5;
    gqa.stream = 9;
    AttentionOptions mha = gqa;
    mha.kv_heads = 0;
    const Shape os{c.B, c.T, c.H * c.D}, ls{c.B, c.H, c.T};
    Tensor o1 = Tensor::empty(os, dt), l1 = Tensor::empty(ls, dt);
    Tensor o2 = Tensor::empty(os, dt), l2 = Tensor::empty(ls, dt);
    const Tensor big = expand_kv(qkv, c.H, c.KV, c.D);
    attention_forward(qkv, gqa, o1, l1);
    attention_forward(big, mha, o2, l2);
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    EXPECT_LT(rel_error(o1, o2), tol);
    EXPECT_LT(rel_error(l1, l2), tol);
    const Tensor g = randn(os, rng, 1.0, dt);
    Tensor d1 = Tensor::full(qkv.shape(), std::nan(""), dt);
    Tensor d2 = Tensor::empty(big.shape(), dt);
    attention_backward(qkv, o1, l1, g, gqa, d1, false);
    attention_backward(big, o2, l2, g, mha, d2, false);
    EXPECT_LT(rel_error(as_f64(d1), fold_kv(d2, c.H, c.KV, c.D)), dt == DType::f64 ? 1e-13 : 1e-5);
    // accumulate adds the same gradient once.
    Tensor acc = Tensor::full(qkv.shape(), 1.0, dt);
    attention_backward(qkv, o1, l1, g, gqa, acc, true);
    auto want = as_f64(d1);
    for (double& v : want) v += 1;
    EXPECT_LT(rel_error(as_f64(acc), want), dt == DType::f64 ? 1e-14 : 1e-6);
  }
  // Finite differences in float64 on a few coordinates.
  Tensor qkv = randn({c.B, std::min<int64_t>(c.T, 20), (c.H + 2 * c.KV) * c.D}, rng);
  AttentionOptions o;
  o.heads = c.H;
  o.kv_heads = c.KV;
  const Shape os{qkv.size(0), qkv.size(1), c.H * c.D}, ls{qkv.size(0), c.H, qkv.size(1)};
  const Tensor g = randn(os, rng);
  Tensor out = Tensor::empty(os, DType::f64), lse = Tensor::empty(ls, DType::f64);
  attention_forward(qkv, o, out, lse);
  Tensor d = Tensor::empty(qkv.shape(), DType::f64);
  attention_backward(qkv, out, lse, g, o, d, false);
  auto loss = [&] {
    Tensor oo = Tensor::empty(os, DType::f64), ll = Tensor::empty(ls, DType::f64);
    attention_forward(qkv, o, oo, ll);
    return dot(g, oo);
  };
  EXPECT_LT(fd_check(qkv, d, loss, rng, 150), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedQueryAttention,
                         ::testing::Values(GqaCase{2, 37, 4, 2, 8, 0},     // GQA, GEMM path
                                           GqaCase{1, 70, 4, 1, 16, 0},    // MQA, tiles
                                           GqaCase{2, 45, 6, 2, 32, 0.2},  // tiles, dropout
                                           GqaCase{1, 20, 3, 3, 16, 0}),   // KV = H
                         [](const auto& p) {
                           const GqaCase& c = p.param;
                           return "H" + std::to_string(c.H) + "_KV" + std::to_string(c.KV) + "_D" +
                                  std::to_string(c.D) + (c.dropout > 0 ? "_dropout" : "");
                         });

// A tensor-parallel rank's view: query heads [2, 4) of 4 with key/value heads either split
// (kv head 1 of 2, kv_offset 1) or replicated (both kv heads, kv_offset 0): the output
// and the query gradient equal the same columns of the whole, the key/value gradient of
// the heads it reads too (the replicated one it does not read gets zero).
TEST(GroupedQueryAttention, TensorParallelSlicesMatchTheWhole) {
  std::mt19937_64 rng(test_seed(87));
  const int64_t B = 2, T = 30, H = 4, KV = 2, D = 16;
  const DType dt = DType::f64;
  const Tensor qkv = randn({B, T, (H + 2 * KV) * D}, rng);
  AttentionOptions whole;
  whole.heads = H;
  whole.kv_heads = KV;
  Tensor out = Tensor::empty({B, T, H * D}, dt), lse = Tensor::empty({B, H, T}, dt);
  attention_forward(qkv, whole, out, lse);
  const Tensor g = randn(out.shape(), rng);
  Tensor dq = Tensor::empty(qkv.shape(), dt);
  attention_backward(qkv, out, lse, g, whole, dq, false);
  const Tensor gl = g.narrow(2, 2 * D, 2 * D).contiguous();
  const Tensor want_out = out.narrow(2, 2 * D, 2 * D).contiguous();
  for (bool replicated : {false, true}) {
    SCOPED_TRACE(replicated ? "replicated" : "split");
    const int64_t kv = replicated ? KV : 1, kv0 = replicated ? 0 : 1;
    Tensor local = Tensor::empty({B, T, (2 + 2 * kv) * D}, dt);
    local.narrow(2, 0, 2 * D).copy_from(qkv.narrow(2, 2 * D, 2 * D));
    local.narrow(2, 2 * D, kv * D).copy_from(qkv.narrow(2, (H + kv0) * D, kv * D));
    local.narrow(2, (2 + kv) * D, kv * D).copy_from(qkv.narrow(2, (H + KV + kv0) * D, kv * D));
    AttentionOptions part;
    part.heads = 2;
    part.kv_heads = kv;
    part.group = H / KV;
    part.head_offset = 2;
    part.global_heads = H;
    part.kv_offset = kv0;
    Tensor lo = Tensor::empty({B, T, 2 * D}, dt), ll = Tensor::empty({B, 2, T}, dt);
    attention_forward(local, part, lo, ll);
    EXPECT_LT(rel_error(lo, want_out), 1e-14);
    Tensor ld = Tensor::full(local.shape(), std::nan(""), dt);
    attention_backward(local, lo, ll, gl, part, ld, false);
    EXPECT_LT(
        rel_error(ld.narrow(2, 0, 2 * D).contiguous(), dq.narrow(2, 2 * D, 2 * D).contiguous()),
        1e-13);
    for (int64_t p = 0; p < 2; ++p) {  // keys, values: head 1 is the one read
      const Tensor got = ld.narrow(2, (2 + p * kv + (replicated ? 1 : 0)) * D, D).contiguous();
      const Tensor want = dq.narrow(2, (H + p * KV + 1) * D, D).contiguous();
      EXPECT_LT(rel_error(got, want), 1e-13);
      if (replicated) {
        const auto unread = as_f64(ld.narrow(2, (2 + p * kv) * D, D).contiguous());
        for (double v : unread) ASSERT_EQ(v, 0.0);
      }
    }
  }
  AttentionOptions bad = whole;
  bad.kv_heads = 3;
  EXPECT_THROW(attention_forward(Tensor::zeros({1, 4, 10 * D}, dt), bad, out, lse),
               std::invalid_argument);
}

TEST(GroupedQueryAttention, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(88));
  const DType f = DType::f32;
  const Tensor qkv = randn({2, 150, (8 + 4) * 16}, rng, 1.0, f),
               g = randn({2, 150, 128}, rng, 1.0, f);
  AttentionOptions o;
  o.heads = 8;
  o.kv_heads = 2;
  expect_attention_same_at_1_and_2_threads(qkv, g, o);
}

// The cos/sin tables are built on the calling thread and read by the pool's threads (a
// per-thread table once crashed every LLaMA run at 2 threads).
TEST(Rotary, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(89));
  const int64_t B = 2, T = 256, H = 8, D = 64;
  const auto inv = rope_inv_freq(D, 10000.0, RopeScaling{});
  const RotaryOptions o{H, &inv, 5};
  const DType f = DType::f32;
  const Tensor x = randn({B, T, H * D}, rng, 1.0, f), g = randn({B, T, H * D}, rng, 1.0, f);
  std::vector<Tensor> res;
  const int before = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    Tensor y = Tensor::zeros({B, T, H * D}, f), dx = Tensor::empty(x.shape(), f);
    rotary_forward(x, o, y, 0);
    rotary_backward(g, 0, o, dx, false);
    res.insert(res.end(), {y, dx});
  }
  set_num_threads(before);
  EXPECT_EQ(std::memcmp(res[0].raw_data(), res[2].raw_data(), res[0].nbytes()), 0);
  EXPECT_EQ(std::memcmp(res[1].raw_data(), res[3].raw_data(), res[1].nbytes()), 0);
}

}  // namespace
}  // namespace baton::kernels::test
