// The fused kernels: the residual add with LayerNorm, and bias with GELU. Backward
// against finite differences (float64), and the same bits as the unfused path (the add,
// then layernorm_forward; bias_add_inplace, then gelu_forward) in float32.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/fused.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(AddLayerNorm, SameBitsAsAddThenLayerNorm) {
  std::mt19937_64 rng(test_seed(81));
  // Widths with vector tails and rows enough to show a 1-ulp difference in rstd.
  for (int64_t c : {64, 37, 29, 8, 7}) {
    SCOPED_TRACE(c);
    const DType f = DType::f32;
    const Tensor a = randn({7, 11, c}, rng, 2.0, f), b = randn({7, 11, c}, rng, 1.0, f);
    const Tensor w = randn({c}, rng, 1.0, f), bias = randn({c}, rng, 1.0, f);
    Tensor s = Tensor::empty(a.shape(), f), y = Tensor::empty(a.shape(), f),
           mean = Tensor::empty({77}, f), rstd = Tensor::empty({77}, f);
    add_layernorm_forward(a, b, w, bias, 1e-5, s, y, mean, rstd);
    Tensor s2 = Tensor::empty(a.shape(), f), y2 = Tensor::empty(a.shape(), f),
           mean2 = Tensor::empty({77}, f), rstd2 = Tensor::empty({77}, f);
    add(a, b, s2);
    layernorm_forward(s2, w, bias, 1e-5, y2, mean2, rstd2);
    EXPECT_TRUE(same_bits(s, s2));
    EXPECT_TRUE(same_bits(y, y2));
    EXPECT_TRUE(same_bits(mean, mean2));
    EXPECT_TRUE(same_bits(rstd, rstd2));

    // Backward: ds + LayerNorm's gradient, as the unfused gradient slot adds them.
    const Tensor dy = randn(a.shape(), rng, 1.0, f), ds = randn(a.shape(), rng, 1.0, f);
    Tensor dx = Tensor::empty(a.shape(), f);
    add_layernorm_backward_input(dy, ds, s, w, mean, rstd, dx, false);
    Tensor dx2 = ds.clone();
    layernorm_backward_input(dy, s2, w, mean2, rstd2, dx2, true);
    EXPECT_TRUE(same_bits(dx, dx2));
    // No residual gradient: LayerNorm's alone.
    Tensor none, dx3 = Tensor::empty(a.shape(), f), dx4 = Tensor::empty(a.shape(), f);
    add_layernorm_backward_input(dy, none, s, w, mean, rstd, dx3, false);
    layernorm_backward_input(dy, s2, w, mean2, rstd2, dx4, false);
    EXPECT_TRUE(same_bits(dx3, dx4));
  }
}

TEST(AddLayerNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(test_seed(82));
  const int64_t n = 6, c = 23;
  Tensor a = randn({n, c}, rng, 2.0), b = randn({n, c}, rng), w = randn({c}, rng),
         bias = randn({c}, rng);
  // The loss reads both outputs: y (through the norm) and s (the residual stream).
  const Tensor gy = randn({n, c}, rng), gs = randn({n, c}, rng);
  auto forward = [&](Tensor& s, Tensor& y, Tensor& mean, Tensor& rstd) {
    s = Tensor::empty({n, c}, DType::f64);
    y = Tensor::empty({n, c}, DType::f64);
    mean = Tensor::empty({n}, DType::f64);
    rstd = Tensor::empty({n}, DType::f64);
    add_layernorm_forward(a, b, w, bias, 1e-5, s, y, mean, rstd);
  };
  auto loss = [&] {
    Tensor s, y, m, r;
    forward(s, y, m, r);
    return dot(gy, y) + dot(gs, s);
  };
  Tensor s, y, mean, rstd;
  forward(s, y, mean, rstd);
  Tensor dx = Tensor::empty({n, c}, DType::f64), dw = Tensor::empty({c}, DType::f64),
         db = Tensor::empty({c}, DType::f64);
  add_layernorm_backward_input(gy, gs, s, w, mean, rstd, dx, false);
  layernorm_backward_weight(gy, s, mean, rstd, dw, db, false);
  EXPECT_LT(fd_check(a, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(b, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(w, dw, loss, rng), 1e-6);
  EXPECT_LT(fd_check(bias, db, loss, rng), 1e-6);

  // accumulate adds to what dx held.
  Tensor acc = Tensor::full({n, c}, 1.0, DType::f64);
  add_layernorm_backward_input(gy, gs, s, w, mean, rstd, acc, true);
  auto want = as_f64(dx);
  for (double& v : want) v += 1;
  EXPECT_LT(rel_error(as_f64(acc), want), 1e-14);
}

TEST(BiasGelu, SameBitsAsBiasAddThenGelu) {
  std::mt19937_64 rng(test_seed(83));
  const DType f = DType::f32;
  for (int64_t c : {64, 37}) {
    SCOPED_TRACE(c);
    const Tensor x = randn({4, 6, c}, rng, 2.0, f), bias = randn({c}, rng, 1.0, f);
    Tensor h = Tensor::empty(x.shape(), f), y = Tensor::empty(x.shape(), f);
    bias_gelu_forward(x, bias, h, y);
    Tensor h2 = x.clone(), y2 = Tensor::empty(x.shape(), f);
    bias_add_inplace(h2, bias);
    gelu_forward(h2, y2);
    EXPECT_TRUE(same_bits(h, h2));
    // Rows a multiple of the vector width run GELU at the same positions: the same bits.
    // Otherwise the row tails take the scalar path (an exact reciprocal): round-off.
    if (c % 16 == 0)
      EXPECT_TRUE(same_bits(y, y2));
    else
      EXPECT_LT(rel_error(y, y2), 1e-6);
    // In place: h is x.
    Tensor xi = x.clone(), yi = Tensor::empty(x.shape(), f);
    bias_gelu_forward(xi, bias, xi, yi);
    EXPECT_TRUE(same_bits(xi, h));
    EXPECT_TRUE(same_bits(yi, y));
  }
}

TEST(BiasGelu, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(test_seed(84));
  const int64_t n = 5, c = 21;
  Tensor x = randn({n, c}, rng, 2.0), bias = randn({c}, rng);
  const Tensor g = randn({n, c}, rng);
  auto loss = [&] {
    Tensor h = Tensor::empty({n, c}, DType::f64), y = Tensor::empty({n, c}, DType::f64);
    bias_gelu_forward(x, bias, h, y);
    return dot(g, y);
  };
  Tensor h = Tensor::empty({n, c}, DType::f64), y = Tensor::empty({n, c}, DType::f64);
  bias_gelu_forward(x, bias, h, y);
  Tensor dx = Tensor::empty({n, c}, DType::f64), db = Tensor::empty({c}, DType::f64);
  gelu_backward(h, g, dx, false);
  bias_backward(dx, db, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(bias, db, loss, rng), 1e-6);
}

}  // namespace
}  // namespace baton::kernels::test
