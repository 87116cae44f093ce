// Elementwise ops: add, scale, bias add and its backward, GELU and ReLU (finite
// differences, float32 against float64, accumulate semantics).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

TEST(Elementwise, AddScaleAndBias) {
  std::mt19937_64 rng(test_seed(31));
  for (DType dt : {DType::f32, DType::f64}) {
    // Sizes beyond the threading grain too.
    for (int64_t n : {int64_t(7), int64_t(100003)}) {
      const Tensor a = randn({n}, rng, 1.0, dt), b = randn({n}, rng, 1.0, dt);
      Tensor out = Tensor::empty({n}, dt);
      add(a, b, out);
      Tensor acc = a.clone();
      add_inplace(acc, b);
      scale_inplace(acc, -0.5);
      const auto av = as_f64(a), bv = as_f64(b), ov = as_f64(out), cv = as_f64(acc);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_DOUBLE_EQ(ov[size_t(i)], dt == DType::f32
                                            ? double(float(av[size_t(i)] + bv[size_t(i)]))
                                            : av[size_t(i)] + bv[size_t(i)]);
        ASSERT_NEAR(cv[size_t(i)], -0.5 * ov[size_t(i)], 1e-6 * (1 + std::abs(ov[size_t(i)])));
      }
    }
    const Tensor y0 = randn({3, 5, 9}, rng, 1.0, dt), bias = randn({9}, rng, 1.0, dt);
    Tensor y = y0.clone();
    bias_add_inplace(y, bias);
    const auto yv = as_f64(y), y0v = as_f64(y0), bv = as_f64(bias);
    for (size_t i = 0; i < yv.size(); ++i) ASSERT_NEAR(yv[i], y0v[i] + bv[i % 9], 1e-6);
  }
}

TEST(Elementwise, BiasBackwardSumsRowsAndAccumulates) {
  std::mt19937_64 rng(test_seed(32));
  const Tensor dy = randn({4, 6, 300}, rng);
  Tensor db = Tensor::empty({300}, DType::f64);
  bias_backward(dy, db, false);
  const auto d = as_f64(dy), got = as_f64(db);
  for (int64_t c = 0; c < 300; ++c) {
    double s = 0;
    for (int64_t r = 0; r < 24; ++r) s += d[size_t(r * 300 + c)];
    ASSERT_NEAR(got[size_t(c)], s, 1e-12);
  }
  Tensor db2 = Tensor::full({300}, 2.0, DType::f64);
  bias_backward(dy, db2, true);
  const auto got2 = as_f64(db2);
  for (size_t c = 0; c < 300; ++c) ASSERT_NEAR(got2[c], got[c] + 2.0, 1e-12);
  Tensor db32 = Tensor::empty({300}, DType::f32);
  bias_backward(dy.to(DType::f32), db32, false);
  EXPECT_LT(rel_error(db32, db), 1e-4);
}

TEST(Gelu, MatchesTheTanhFormula) {
  const Tensor x = Tensor::from_vector<double>({-3.0, -1.0, 0.0, 0.5, 2.0}, {5});
  Tensor y = Tensor::empty({5}, DType::f64);
  gelu_forward(x, y);
  const auto xv = as_f64(x), yv = as_f64(y);
  for (size_t i = 0; i < 5; ++i) {
    const double v = xv[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(yv[i], want, 1e-15);
  }
}

// Checks forward (float32 vs float64), backward (finite differences) and accumulate of a
// unary op; x avoids the neighbourhood of zero, where ReLU has its kink.
void check_unary(void (*fwd)(const Tensor&, Tensor&),
                 void (*bwd)(const Tensor&, const Tensor&, Tensor&, bool), uint64_t seed) {
  std::mt19937_64 rng(test_seed(seed));
  Tensor x = randn({2, 50}, rng, 2.0);
  for (double& v : x.span<double>())
    if (std::abs(v) < 1e-3) v = 0.5;
  const Tensor g = randn(x.shape(), rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  fwd(x, y);
  Tensor y32 = Tensor::empty(x.shape(), DType::f32);
  fwd(x.to(DType::f32), y32);
  EXPECT_LT(rel_error(y32, y), 1e-4);

  Tensor dx = Tensor::full(x.shape(), std::nan(""), DType::f64);  // garbage must not leak
  bwd(x, g, dx, false);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64);
    fwd(x, yy);
    return dot(g, yy);
  };
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  Tensor dx32 = Tensor::empty(x.shape(), DType::f32);
  bwd(x.to(DType::f32), g.to(DType::f32), dx32, false);
  EXPECT_LT(rel_error(dx32, dx), 1e-4);

  Tensor acc = Tensor::full(x.shape(), 1.0, DType::f64);
  bwd(x, g, acc, true);
  auto want = as_f64(dx);
  for (double& v : want) v += 1.0;
  EXPECT_LT(rel_error(as_f64(acc), want), 1e-15);
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  check_unary(gelu_forward, gelu_backward, 33);
}
TEST(Relu, BackwardMatchesFiniteDifferences) {
  check_unary(relu_forward, relu_backward, 34);
}
// A NaN passes through (as PyTorch's relu), so a NaN input shows as a NaN loss.
TEST(Relu, NanPassesThrough) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector(std::vector<float>{-1.f, nan, 2.f, -0.f}, {4});
  Tensor y = Tensor::empty({4});
  relu_forward(x, y);
  const std::vector<float> v = y.to_vector<float>();
  EXPECT_EQ(v[0], 0.f);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], 2.f);
  EXPECT_EQ(v[3], 0.f);
}

TEST(Gelu, Float32IsAccurateOverAWideRange) {
  // The float path uses a vectorised exp: check it across the whole useful range,
  // including the saturated tails.
  std::vector<double> xs;
  for (double v = -12; v <= 12; v += 0.01) xs.push_back(v);
  const Tensor x = Tensor::from_vector(xs, {int64_t(xs.size())});
  Tensor y = Tensor::empty(x.shape(), DType::f64), y32 = Tensor::empty(x.shape(), DType::f32);
  gelu_forward(x, y);
  gelu_forward(x.to(DType::f32), y32);
  const auto a = as_f64(y), b = as_f64(y32);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(b[i], a[i], 2e-6 * (1 + std::abs(a[i]))) << "x = " << xs[i];
}

// Far out on the negative side the float sigmoid used to bottom out at vexp's saturation
// (about 4e-39) instead of 0, and multiplied by x^3 or x it gave gelu'(-1e12) = -9e-4,
// gelu'(-1e13) = -0.9 and silu(-1e38) = -0.4; torch gives 0. Both the vector lanes and the
// scalar tail (19 elements).
TEST(Gelu, Float32GradientIsZeroFarOnTheNegativeSide) {
  const std::vector<double> xs = {-90,   -100,  -1e4,  -1e8,  -1e10, -1e12, -1e13,
                                  -1e15, -1e20, -1e25, -1e30, -1e32, -1e35, -1e36,
                                  -1e37, -1e38, -3e38, -1e13, -1e38};
  const Tensor x = Tensor::from_vector(xs, {int64_t(xs.size())}).to(DType::f32);
  const Tensor dy = Tensor::full(x.shape(), 1.0, DType::f32);
  Tensor g = Tensor::empty(x.shape(), DType::f32), s = Tensor::empty(x.shape(), DType::f32),
         sf = Tensor::empty(x.shape(), DType::f32), dgate = Tensor::empty(x.shape(), DType::f32),
         dup = Tensor::empty(x.shape(), DType::f32), y = Tensor::empty(x.shape(), DType::f32);
  gelu_backward(x, dy, g, false);
  silu_backward(x, dy, s, false);
  silu_forward(x, sf);
  gelu_forward(x, y);
  swiglu_backward(x, dy, dy, dgate, dup, false, false);
  const auto vg = as_f64(g), vs = as_f64(s), vsf = as_f64(sf), vdg = as_f64(dgate),
             vdu = as_f64(dup), vy = as_f64(y);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_LT(std::abs(vg[i]), 1e-30) << "gelu' at x = " << xs[i];
    EXPECT_LT(std::abs(vy[i]), 1e-30) << "gelu at x = " << xs[i];
    EXPECT_LT(std::abs(vs[i]), 1e-30) << "silu' at x = " << xs[i];
    EXPECT_LT(std::abs(vsf[i]), 1e-30) << "silu at x = " << xs[i];
    EXPECT_LT(std::abs(vdg[i]), 1e-30) << "swiglu dgate at x = " << xs[i];
    EXPECT_LT(std::abs(vdu[i]), 1e-30) << "swiglu dup at x = " << xs[i];
  }
}

// The ops' results on 2, 3 and 5 threads against 1 thread's, bit for bit, at length n (a
// length past every op's threading grain at 5 threads).
void expect_same_at_1_2_3_5_threads(int64_t n, std::mt19937_64& rng) {
  const DType f = DType::f32;
  const Tensor x = randn({n}, rng, 3.0, f), u = randn({n}, rng, 1.0, f),
               dy = randn({n}, rng, 1.0, f), start = randn({n}, rng, 1.0, f);
  std::vector<std::string> names;
  std::vector<std::vector<Tensor>> got;
  const int before = num_threads();
  const std::vector<int> threads = {1, 2, 3, 5};
  for (int t : threads) {
    set_num_threads(t);
    std::vector<Tensor> r;
    auto keep = [&](const char* name, const Tensor& v) {
      if (t == 1) names.emplace_back(name);
      r.push_back(v);
    };
    auto out = [&] { return Tensor::empty({n}, f); };
    Tensor y = out(), d = out(), a = start.clone();
    gelu_forward(x, y);
    gelu_backward(x, dy, d, false);
    gelu_backward(x, dy, a, true);
    keep("gelu_forward", y), keep("gelu_backward", d), keep("gelu_backward acc", a);
    y = out(), d = out(), a = start.clone();
    silu_forward(x, y);
    silu_backward(x, dy, d, false);
    silu_backward(x, dy, a, true);
    keep("silu_forward", y), keep("silu_backward", d), keep("silu_backward acc", a);
    y = out(), d = out(), a = start.clone();
    Tensor du = out(), dua = start.clone();
    swiglu_forward(x, u, y);
    swiglu_backward(x, u, dy, d, du, false, false);
    swiglu_backward(x, u, dy, a, dua, true, true);
    keep("swiglu_forward", y), keep("swiglu_backward dgate", d), keep("swiglu_backward dup", du);
    keep("swiglu_backward dgate acc", a), keep("swiglu_backward dup acc", dua);
    y = out(), d = out();
    relu_forward(x, y);
    relu_backward(x, dy, d, false);
    keep("relu_forward", y), keep("relu_backward", d);
    y = out(), a = start.clone();
    Tensor s = x.clone();
    add(x, u, y);
    add_inplace(a, x);
    scale_inplace(s, 0.3);
    keep("add", y), keep("add_inplace", a), keep("scale_inplace", s);
    Tensor p = start.clone(), m = u.clone(), v = Tensor::zeros({n}, f);
    adamw_step(p, dy, m, v, AdamW{}, 1, 0.5);
    adamw_step(p, x, m, v, AdamW{1e-3, 0.9, 0.999, 1e-8, 0.01}, 2, 1.0);
    keep("adamw_step param", p), keep("adamw_step m", m), keep("adamw_step v", v);
    p = start.clone(), m = Tensor::zeros({n}, f);
    sgd_step(p, dy, m, Sgd{0.1, 0.9, 0.01, true}, 0.5);
    sgd_step(p, x, m, Sgd{0.1, 0.9, 0.01, true}, 1.0);
    keep("sgd_step param", p), keep("sgd_step momentum", m);
    got.push_back(r);
  }
  set_num_threads(before);
  for (size_t k = 1; k < got.size(); ++k)
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_EQ(std::memcmp(got[k][i].raw_data(), got[0][i].raw_data(), got[0][i].nbytes()), 0)
          << names[i] << " at " << threads[k] << " threads, length " << n;
}

// An element's bits must not depend on which thread's part it falls in. At these lengths
// the threads' parts end off the vector width (16 floats with AVX-512), and GELU, SiLU and
// SwiGLU once computed each part's last few elements in a scalar tail that divides where
// the vector body takes rcp14 and a Newton step (1 ulp apart, for about one element in
// four; two lengths so that some differ whatever the seed). The compiler-vectorised ops
// (ReLU, add, scale, the optimizer steps) are checked alongside.
TEST(Elementwise, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(35));
  for (int64_t n : {5 * 32768 + 7, 7 * 32768 + 1001}) expect_same_at_1_2_3_5_threads(n, rng);
}

}  // namespace
}  // namespace baton::kernels::test
