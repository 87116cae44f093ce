// Helpers for the kernel tests: seeded random tensors, norm-based relative errors, and
// gradient checks against central finite differences.
//
// The metric: for an analytic gradient g and a finite-difference estimate f over the same
// coordinates, rel = ||g - f||_2 / max(||g||_2, ||f||_2, 1e-30). A norm-based error does
// not blow up on coordinates whose gradient is near zero (where an elementwise relative
// error is meaningless), yet any wrong coordinate of normal size shows up at its size.
// In float64 with step h = 1e-5 the central difference is accurate to about h^2 |f'''|
// plus eps |L| / h, i.e. 1e-9 or better for these small losses, so the bar is 1e-6.
// float32 kernels are compared with the float64 ones on the same (rounded) inputs with
// the same norm metric and a bar of 1e-4.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "memory/tensor.h"

namespace baton::kernels::test {

using memory::DType;
using memory::Shape;
using memory::Tensor;

// A seed for a test's random inputs: BATON_TEST_SEED if set, else `fallback`; printed
// so a failing run can be repeated.
inline uint64_t test_seed(uint64_t fallback) {
  uint64_t s = fallback;
  if (const char* e = std::getenv("BATON_TEST_SEED")) s = std::strtoull(e, nullptr, 10);
  std::cout << "[ seed     ] " << ::testing::UnitTest::GetInstance()->current_test_info()->name()
            << ": " << s << " (set BATON_TEST_SEED to repeat)\n";
  return s;
}

inline Tensor randn(const Shape& shape, std::mt19937_64& rng, double scale = 1.0,
                    DType dtype = DType::f64) {
  std::normal_distribution<double> dist(0.0, scale);
  Tensor t = Tensor::empty(shape, DType::f64);
  for (double& v : t.span<double>()) v = dist(rng);
  return dtype == DType::f64 ? t : t.to(dtype);
}

inline double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  std::vector<double> d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = got[i] - want[i];
  return norm2(d) / std::max({norm2(got), norm2(want), 1e-30});
}

inline std::vector<double> as_f64(const Tensor& t) {
  return t.to(DType::f64).to_vector<double>();
}

inline double rel_error(const Tensor& got, const Tensor& want) {
  return rel_error(as_f64(got), as_f64(want));
}

// Attention forward and backward of qkv [B, T, ...] under `o` (g: the output gradient,
// of the output's shape) at 1 and at 2 threads: the output and the input gradient must be
// the same bits.
inline void expect_attention_same_at_1_and_2_threads(const Tensor& qkv, const Tensor& g,
                                                     const AttentionOptions& o) {
  const DType f = qkv.dtype();
  std::vector<Tensor> res;
  const int before = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    Tensor out = Tensor::empty(g.shape(), f),
           lse = Tensor::empty({qkv.size(0), o.heads, qkv.size(1)}, f),
           d = Tensor::empty(qkv.shape(), f);
    attention_forward(qkv, o, out, lse);
    attention_backward(qkv, out, lse, g, o, d, false);
    res.insert(res.end(), {out, d});
  }
  set_num_threads(before);
  EXPECT_EQ(std::memcmp(res[0].raw_data(), res[2].raw_data(), res[0].nbytes()), 0);
  EXPECT_EQ(std::memcmp(res[1].raw_data(), res[3].raw_data(), res[1].nbytes()), 0);
}

// t's values plus one: what a gradient accumulated into a tensor of ones must equal.
inline std::vector<double> plus_one(const Tensor& t) {
  std::vector<double> v = as_f64(t);
  for (double& e : v) e += 1;
  return v;
}

// sum(w * y) in double.
inline double dot(const Tensor& w, const Tensor& y) {
  const auto a = as_f64(w), b = as_f64(y);
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Relative error between `analytic` (the gradient of loss() with respect to the f64
// tensor x) and central differences of loss() over up to max_coords coordinates of x
// (all of them when x is small; otherwise a random subset).
inline double fd_check(Tensor& x, const Tensor& analytic, const std::function<double()>& loss,
                       std::mt19937_64& rng, int64_t max_coords = 400, double h = 1e-5) {
  auto xs = x.span<double>();
  const auto g = as_f64(analytic);
  EXPECT_EQ(int64_t(g.size()), x.numel());
  std::vector<int64_t> coords(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) coords[size_t(i)] = i;
  if (int64_t(coords.size()) > max_coords) {
    std::shuffle(coords.begin(), coords.end(), rng);
    coords.resize(size_t(max_coords));
  }
  std::vector<double> fd, an;
  // Hundreds of small evaluations: one thread avoids a fork per call (results do not
  // depend on the thread count).
  const int threads = num_threads();
  set_num_threads(1);
  for (int64_t i : coords) {
    const double saved = xs[size_t(i)];
    xs[size_t(i)] = saved + h;
    const double up = loss();
    xs[size_t(i)] = saved - h;
    const double down = loss();
    xs[size_t(i)] = saved;
    fd.push_back((up - down) / (2 * h));
    an.push_back(g[size_t(i)]);
  }
  set_num_threads(threads);
  return rel_error(an, fd);
}

}  // namespace baton::kernels::test
