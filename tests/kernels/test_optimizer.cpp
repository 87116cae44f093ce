// AdamW and SGD against scalar references of torch.optim's formulas over several steps;
// sum_squares (in double, independent of the thread count).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>

#include "kernels/mixed_precision.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

// torch.optim.AdamW, one element, written out as torch's single-tensor path does it.
struct RefAdamW {
  double p, m = 0, v = 0;
  void step(double grad, const AdamW& c, int64_t t) {
    p *= 1 - c.lr * c.weight_decay;
    m = c.beta1 * m + (1 - c.beta1) * grad;
    v = c.beta2 * v + (1 - c.beta2) * grad * grad;
    const double bc1 = 1 - std::pow(c.beta1, double(t)), bc2 = 1 - std::pow(c.beta2, double(t));
    p -= c.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + c.eps);
  }
};

// torch.optim.SGD (dampening 0), one element; the buffer starts as a clone of d.
struct RefSgd {
  double p, buf = 0;
  bool started = false;
  void step(double grad, const Sgd& c) {
    double d = grad + c.weight_decay * p;
    if (c.momentum != 0) {
      buf = started ? c.momentum * buf + d : d;
      started = true;
      d = c.nesterov ? d + c.momentum * buf : buf;
    }
    p -= c.lr * d;
  }
};

TEST(AdamW, MatchesTorchFormulasOverSeveralSteps) {
  std::mt19937_64 rng(test_seed(81));
  const int64_t n = 70001;  // past the threading grain
  AdamW cfg;
  cfg.lr = 3e-3;
  cfg.weight_decay = 0.1;
  cfg.beta2 = 0.95;
  const double grad_scale = 0.25;
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor p = randn({n}, rng, 1.0, dt), m = Tensor::zeros({n}, dt), v = Tensor::zeros({n}, dt);
    std::vector<RefAdamW> ref;
    for (double x : as_f64(p)) ref.push_back({x});
    for (int64_t t = 1; t <= 5; ++t) {
      const Tensor g = randn({n}, rng, 1.0, dt);
      adamw_step(p, g, m, v, cfg, t, grad_scale);
      const auto gv = as_f64(g);
      for (int64_t i = 0; i < n; ++i) ref[size_t(i)].step(gv[size_t(i)] * grad_scale, cfg, t);
    }
    std::vector<double> want_p, want_m, want_v;
    for (const auto& r : ref) {
      want_p.push_back(r.p);
      want_m.push_back(r.m);
      want_v.push_back(r.v);
    }
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    EXPECT_LT(rel_error(as_f64(p), want_p), tol) << memory::dtype_name(dt);
    EXPECT_LT(rel_error(as_f64(m), want_m), tol * 10) << memory::dtype_name(dt);
    EXPECT_LT(rel_error(as_f64(v), want_v), tol * 10) << memory::dtype_name(dt);
  }
}

// adamw_step_each: each tensor's own adamw_step (its own weight decay), and a working
// copy, where given, holds the updated value as cast() rounds it.
TEST(AdamW, EachIsEveryTensorsOwnStepAndWritesWorkingCopies) {
  std::mt19937_64 rng(test_seed(82));
  AdamW cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  std::vector<AdamWTensors> ts;
  std::vector<std::array<Tensor, 4>> one;  // p, g, m, v for the one-at-a-time steps
  for (int64_t n : {5, 0, 3000, 17}) {
    Tensor p = randn({n}, rng, 1.0, DType::f32), g = randn({n}, rng, 1.0, DType::f32);
    Tensor m = randn({n}, rng, 0.1, DType::f32), v = Tensor::full({n}, 0.01);
    one.push_back({p.clone(), g, m.clone(), v.clone()});
    ts.push_back({p, g, m, v, ts.size() % 2 == 0 ? 0.1 : 0.0,
                  n == 3000 ? Tensor::zeros({n}, DType::bf16) : Tensor()});
  }
  for (int64_t step = 1; step <= 2; ++step) {
    adamw_step_each(ts, cfg, step, 0.5);
    for (size_t i = 0; i < ts.size(); ++i) {
      AdamW c = cfg;
      c.weight_decay = ts[i].weight_decay;
      adamw_step(one[i][0], one[i][1], one[i][2], one[i][3], c, step, 0.5);
    }
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(ts[i].param.to_vector<float>(), one[i][0].to_vector<float>()) << i;
    EXPECT_EQ(ts[i].v.to_vector<float>(), one[i][3].to_vector<float>()) << i;
  }
  Tensor want = Tensor::zeros({3000}, DType::bf16);
  cast(ts[2].param, want);
  EXPECT_EQ(as_f64(ts[2].working), as_f64(want));
  EXPECT_NE(as_f64(ts[2].working), std::vector<double>(3000, 0.0));
}

// A scale derived from the squared norm (GradScale) is the number the host would pass:
// clipped, unscaled by the loss scale, and no update at all for a norm that is not
// finite. The expected scales are worked out by hand.
TEST(AdamW, ScaleFromTheNormIsTheNumberTheHostWouldPass) {
  std::mt19937_64 rng(test_seed(83));
  AdamW cfg;
  cfg.lr = 1e-2;
  const double inf = std::numeric_limits<double>::infinity();
  struct NormCase {
    double norm2, clip, loss_scale, scale;  // scale < 0: no update
  };
  for (const NormCase c :
       {NormCase{9.0, 0, 0, 1.0}, NormCase{9.0, 4.0, 0, 1.0}, NormCase{16.0, 2.0, 0, 0.5},
        NormCase{16.0 * 1024 * 1024, 2.0, 1024, 0.5 / 1024},
        NormCase{16.0 * 1024 * 1024, 0, 1024, 1.0 / 1024}, NormCase{inf, 1.0, 0, -1},
        NormCase{std::nan(""), 0, 1024, -1}}) {
    const Tensor p = randn({300}, rng, 1.0, DType::f32), g = randn({300}, rng, 1.0, DType::f32);
    const Tensor m = randn({300}, rng, 0.1, DType::f32), v = Tensor::full({300}, 0.01);
    std::vector<AdamWTensors> derived = {{p.clone(), g, m.clone(), v.clone(), 0.1}};
    std::vector<AdamWTensors> given = {{p.clone(), g, m.clone(), v.clone(), 0.1}};
    adamw_step_each(
        derived, cfg, 3,
        GradScale(Tensor::from_vector(std::vector<double>{c.norm2}, {1}), c.clip, c.loss_scale));
    if (c.scale >= 0) {
      adamw_step_each(given, cfg, 3, c.scale);
      EXPECT_NE(derived[0].param.to_vector<float>(), p.to_vector<float>()) << c.norm2;
    }
    EXPECT_EQ(derived[0].param.to_vector<float>(), given[0].param.to_vector<float>()) << c.norm2;
    EXPECT_EQ(derived[0].m.to_vector<float>(), given[0].m.to_vector<float>()) << c.norm2;
    EXPECT_EQ(derived[0].v.to_vector<float>(), given[0].v.to_vector<float>()) << c.norm2;
  }
  // Bad input: the norm as anything but one f64 element.
  std::vector<AdamWTensors> ts = {{randn({3}, rng, 1.0, DType::f32),
                                   randn({3}, rng, 1.0, DType::f32), Tensor::zeros({3}),
                                   Tensor::zeros({3})}};
  EXPECT_THROW(adamw_step_each(ts, cfg, 1, GradScale(Tensor::zeros({2}, DType::f64), 0, 0)),
               std::invalid_argument);
  EXPECT_THROW(adamw_step_each(ts, cfg, 1, GradScale(Tensor::zeros({1}, DType::f32), 0, 0)),
               std::invalid_argument);
}

// Groups added in order: tensor sums into their groups, then the groups.
TEST(SumSquares, GroupedAddsEachGroupThenTheGroups) {
  const std::vector<Tensor> ts = {Tensor::from_vector(std::vector<float>{1, 2}, {2}),
                                  Tensor::from_vector(std::vector<float>{3}, {1}),
                                  Tensor::from_vector(std::vector<float>{0.5}, {1})};
  const Tensor total = sum_squares_grouped(ts, {1, 0, 1}, 3);
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_EQ(total.to_vector<double>(), std::vector<double>{9.0 + (5.0 + 0.25)});
  // The order is the groups': by tensors 1e16 + 1 + 1 rounds each one away (the spacing
  // there is 2, ties to even), by groups the ones add first.
  const std::vector<Tensor> big = {Tensor::from_vector(std::vector<double>{1e8}, {1}),
                                   Tensor::from_vector(std::vector<double>{1}, {1}),
                                   Tensor::from_vector(std::vector<double>{1}, {1})};
  EXPECT_EQ(sum_squares_grouped(big, {0, 1, 1}, 2).to_vector<double>()[0], 1e16 + 2.0);
  EXPECT_EQ(sum_squares_grouped({}, {}, 0).to_vector<double>(), std::vector<double>{0.0});
  EXPECT_THROW(sum_squares_grouped(ts, {0, 1}, 2), std::invalid_argument);
  EXPECT_THROW(sum_squares_grouped(ts, {0, 1, 2}, 2), std::invalid_argument);
}

struct SgdCase {
  double momentum, weight_decay;
  bool nesterov;
};

class SgdTest : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdTest, MatchesTorchFormulasOverSeveralSteps) {
  const auto c = GetParam();
  std::mt19937_64 rng(test_seed(82));
  const int64_t n = 70001;
  Sgd cfg;
  cfg.lr = 0.05;
  cfg.momentum = c.momentum;
  cfg.weight_decay = c.weight_decay;
  cfg.nesterov = c.nesterov;
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor p = randn({n}, rng, 1.0, dt);
    Tensor buf = c.momentum != 0 ? Tensor::zeros({n}, dt) : Tensor();
    std::vector<RefSgd> ref;
    for (double x : as_f64(p)) ref.push_back({x});
    for (int t = 0; t < 4; ++t) {
      const Tensor g = randn({n}, rng, 1.0, dt);
      sgd_step(p, g, buf, cfg, 2.0);
      const auto gv = as_f64(g);
      for (int64_t i = 0; i < n; ++i) ref[size_t(i)].step(2.0 * gv[size_t(i)], cfg);
    }
    std::vector<double> want;
    for (const auto& r : ref) want.push_back(r.p);
    EXPECT_LT(rel_error(as_f64(p), want), dt == DType::f64 ? 1e-14 : 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, SgdTest,
                         ::testing::Values(SgdCase{0, 0, false}, SgdCase{0, 0.01, false},
                                           SgdCase{0.9, 0, false}, SgdCase{0.9, 0.01, true}),
                         [](const auto& param_info) {
                           const auto& c = param_info.param;
                           return std::string(c.momentum != 0 ? "momentum" : "plain") +
                                  (c.weight_decay != 0 ? "_decay" : "") +
                                  (c.nesterov ? "_nesterov" : "");
                         });

TEST(SumSquares, IsExactInDoubleAndThreadInvariant) {
  std::mt19937_64 rng(test_seed(83));
  const int64_t n = 1000003;
  const Tensor t = randn({n}, rng, 1.0, DType::f32);
  double want = 0;
  for (float x : t.to_vector<float>()) want += double(x) * double(x);
  const int before = num_threads();
  set_num_threads(1);
  const double one = sum_squares(t);
  set_num_threads(2);
  const double two = sum_squares(t);
  set_num_threads(before);
  EXPECT_NEAR(one, want, 1e-12 * want);
  EXPECT_EQ(one, two);
  EXPECT_EQ(sum_squares(Tensor::zeros({0})), 0.0);
  const Tensor u = randn({777}, rng, 1.0, DType::f32);
  EXPECT_EQ(sum_squares_each({t, Tensor::zeros({0}), u}),
            (std::vector<double>{one, 0.0, sum_squares(u)}));
  EXPECT_TRUE(sum_squares_each({}).empty());
}

}  // namespace
}  // namespace baton::kernels::test
