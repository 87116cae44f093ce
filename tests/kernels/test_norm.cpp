// LayerNorm and softmax: forward against direct formulas, backward against finite
// differences, float32 against float64, accumulate; the row kernels' results at 1 and 2
// threads (their row pipelines split at other rows), and the column sums of the weight
// and bias gradients.
#include <gtest/gtest.h>

#include "kernels/fused.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

TEST(LayerNorm, ForwardNormalisesEachRow) {
  std::mt19937_64 rng(test_seed(51));
  const int64_t rows = 6, c = 37;
  const Tensor x = randn({2, 3, c}, rng, 3.0), w = randn({c}, rng), b = randn({c}, rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64), mean = Tensor::empty({2, 3}, DType::f64),
         rstd = Tensor::empty({2, 3}, DType::f64);
  layernorm_forward(x, w, b, 1e-5, y, mean, rstd);
  const auto xv = as_f64(x), yv = as_f64(y), wv = as_f64(w), bv = as_f64(b);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += xv[size_t(r * c + j)] / c;
    for (int64_t j = 0; j < c; ++j) var += std::pow(xv[size_t(r * c + j)] - mu, 2) / c;
    const double rs = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(as_f64(mean)[size_t(r)], mu, 1e-13);
    EXPECT_NEAR(as_f64(rstd)[size_t(r)], rs, 1e-12);
    for (int64_t j = 0; j < c; ++j)
      EXPECT_NEAR(yv[size_t(r * c + j)],
                  (xv[size_t(r * c + j)] - mu) * rs * wv[size_t(j)] + bv[size_t(j)], 1e-12);
  }
}

// A float row whose squared deviations overflow float (values about 2e19) is normalised
// as in double: its rstd had been 0, the output the bias alone. A row holding inf still
// gives NaN.
TEST(LayerNorm, FloatRowsBeyondTheSquaresRange) {
  std::mt19937_64 rng(test_seed(53));
  const int64_t c = 40;
  const Tensor x64 = randn({3, c}, rng, 2e19), w = randn({c}, rng), b = randn({c}, rng);
  Tensor x = x64.to(DType::f32);
  x.data<float>()[2 * c + 5] = std::numeric_limits<float>::infinity();
  Tensor y = Tensor::empty(x.shape(), DType::f32), mean = Tensor::empty({3}, DType::f32),
         rstd = Tensor::empty({3}, DType::f32);
  layernorm_forward(x, w.to(DType::f32), b.to(DType::f32), 1e-5, y, mean, rstd);
  const auto xv = as_f64(x), yv = as_f64(y), wv = as_f64(w.to(DType::f32)),
             bv = as_f64(b.to(DType::f32));
  for (int64_t r = 0; r < 2; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += xv[size_t(r * c + j)] / c;
    for (int64_t j = 0; j < c; ++j) var += std::pow(xv[size_t(r * c + j)] - mu, 2) / c;
    const double rs = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(as_f64(rstd)[size_t(r)] / rs, 1.0, 1e-5) << "row " << r;
    for (int64_t j = 0; j < c; ++j)
      EXPECT_NEAR(yv[size_t(r * c + j)],
                  (xv[size_t(r * c + j)] - mu) * rs * wv[size_t(j)] + bv[size_t(j)],
                  1e-4 * (1 + std::abs(wv[size_t(j)])))
          << "row " << r << " column " << j;
  }
  EXPECT_TRUE(std::isnan(yv[size_t(2 * c)])) << yv[size_t(2 * c)];
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(test_seed(52));
  const int64_t c = 19;
  Tensor x = randn({5, c}, rng, 2.0), w = randn({c}, rng), b = randn({c}, rng);
  const Tensor g = randn(x.shape(), rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64), mean = Tensor::empty({5}, DType::f64),
         rstd = Tensor::empty({5}, DType::f64);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64), m = Tensor::empty({5}, DType::f64),
           r = Tensor::empty({5}, DType::f64);
    layernorm_forward(x, w, b, 1e-5, yy, m, r);
    return dot(g, yy);
  };
  layernorm_forward(x, w, b, 1e-5, y, mean, rstd);
  Tensor dx = Tensor::empty(x.shape(), DType::f64), dw = Tensor::empty({c}, DType::f64),
         db = Tensor::empty({c}, DType::f64);
  layernorm_backward_input(g, x, w, mean, rstd, dx, false);
  layernorm_backward_weight(g, x, mean, rstd, dw, db, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(w, dw, loss, rng), 1e-6);
  EXPECT_LT(fd_check(b, db, loss, rng), 1e-6);

  // Accumulate, and dbias alone.
  Tensor dx2 = Tensor::full(x.shape(), 1.0, DType::f64), dw2 = Tensor::full({c}, 1.0, DType::f64),
         db2 = Tensor::full({c}, 1.0, DType::f64), none;
  layernorm_backward_input(g, x, w, mean, rstd, dx2, true);
  layernorm_backward_weight(g, x, mean, rstd, dw2, none, true);
  layernorm_backward_weight(g, x, mean, rstd, none, db2, true);
  EXPECT_LT(rel_error(as_f64(dx2), plus_one(dx)), 1e-14);
  EXPECT_LT(rel_error(as_f64(dw2), plus_one(dw)), 1e-14);
  EXPECT_LT(rel_error(as_f64(db2), plus_one(db)), 1e-14);

  // float32 against float64.
  const DType f = DType::f32;
  Tensor y32 = Tensor::empty(x.shape(), f), m32 = Tensor::empty({5}, f),
         r32 = Tensor::empty({5}, f);
  layernorm_forward(x.to(f), w.to(f), b.to(f), 1e-5, y32, m32, r32);
  EXPECT_LT(rel_error(y32, y), 1e-4);
  Tensor dx32 = Tensor::empty(x.shape(), f), dw32 = Tensor::empty({c}, f),
         db32 = Tensor::empty({c}, f);
  layernorm_backward_input(g.to(f), x.to(f), w.to(f), m32, r32, dx32, false);
  layernorm_backward_weight(g.to(f), x.to(f), m32, r32, dw32, db32, false);
  EXPECT_LT(rel_error(dx32, dx), 1e-4);
  EXPECT_LT(rel_error(dw32, dw), 1e-4);
  EXPECT_LT(rel_error(db32, db), 1e-4);
}

// The column sums (LayerNorm's and RMSNorm's weight gradients, the bias gradient) add
// rows in blocks of 128 and then the blocks: 515 rows make five blocks and a partial
// sixth, which 2 threads split. Against sums in f64, fresh and accumulated, and the same
// bits at 1 and 2 threads.
TEST(ColumnSums, WeightAndBiasGradientsOverManyRowBlocksAtAnyThreadCount) {
  std::mt19937_64 rng(test_seed(53));
  const int64_t rows = 515, c = 256;
  const DType f = DType::f32;
  const Tensor x = randn({rows, c}, rng, 1.0, f), w = randn({c}, rng, 1.0, f),
               b = randn({c}, rng, 1.0, f), g = randn({rows, c}, rng, 1.0, f),
               start = randn({c}, rng, 1.0, f);
  Tensor y = Tensor::empty({rows, c}, f), m = Tensor::empty({rows}, f),
         r = Tensor::empty({rows}, f), rr = Tensor::empty({rows}, f);
  layernorm_forward(x, w, b, 1e-5, y, m, r);
  rmsnorm_forward(x, w, 1e-5, y, rr);
  // In f64 from the same f32 inputs: dw, db, the RMSNorm dw.
  const auto xv = as_f64(x), gv = as_f64(g), mv = as_f64(m), rv = as_f64(r), rrv = as_f64(rr),
             sv = as_f64(start);
  std::vector<double> want_dw(static_cast<size_t>(c), 0.0), want_db = want_dw, want_rms = want_dw;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const size_t e = size_t(i * c + j);
      want_dw[size_t(j)] += gv[e] * (xv[e] - mv[size_t(i)]) * rv[size_t(i)];
      want_db[size_t(j)] += gv[e];
      want_rms[size_t(j)] += gv[e] * xv[e] * rrv[size_t(i)];
    }
  std::vector<std::vector<float>> got;
  const int before = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    std::vector<float> all;
    for (bool accumulate : {false, true}) {
      Tensor dw = start.clone(), db = start.clone(), bias = start.clone(), rms = start.clone();
      layernorm_backward_weight(g, x, m, r, dw, db, accumulate);
      bias_backward(g, bias, accumulate);
      rmsnorm_backward_weight(g, x, rr, rms, accumulate);
      auto shifted = [&](std::vector<double> v) {
        if (accumulate)
          for (size_t j = 0; j < v.size(); ++j) v[j] += sv[j];
        return v;
      };
      EXPECT_LT(rel_error(as_f64(dw), shifted(want_dw)), 1e-5) << t << " threads";
      EXPECT_LT(rel_error(as_f64(db), shifted(want_db)), 1e-5) << t << " threads";
      EXPECT_EQ(bias.to_vector<float>(), db.to_vector<float>()) << t << " threads";
      EXPECT_LT(rel_error(as_f64(rms), shifted(want_rms)), 1e-5) << t << " threads";
      for (const Tensor* v : {&dw, &db, &bias, &rms}) {
        const auto e = v->to_vector<float>();
        all.insert(all.end(), e.begin(), e.end());
      }
    }
    got.push_back(all);
  }
  set_num_threads(before);
  EXPECT_EQ(got[0], got[1]);
}

// Each thread runs its rows through the forward's row pipeline, so 2 threads start one at
// another row than 1 thread does: the bits must not change. Sizes give each thread enough
// rows to fork, widths leave vector tails, and 3000 runs softmax's chunked long rows.
TEST(RowKernels, ForwardsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(56));
  const DType f = DType::f32;
  const int64_t rows = 701, c = 100;
  const Tensor x = randn({rows, c}, rng, 3.0, f), x2 = randn({rows, c}, rng, 1.0, f),
               w = randn({c}, rng, 1.0, f), b = randn({c}, rng, 1.0, f),
               xl = randn({5, 3000}, rng, 3.0, f);
  std::vector<int64_t> tv(static_cast<size_t>(rows));
  for (auto& t : tv) t = int64_t(rng() % uint64_t(c));
  tv[350] = -100;
  const Tensor targets = Tensor::from_vector(tv, {rows});
  std::vector<std::vector<float>> got;
  const int before = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    std::vector<float> all;
    auto keep = [&](const Tensor& v) {
      const auto e = v.to_vector<float>();
      all.insert(all.end(), e.begin(), e.end());
    };
    Tensor y = Tensor::empty({rows, c}, f), s = Tensor::empty({rows, c}, f),
           m = Tensor::empty({rows}, f), r = Tensor::empty({rows}, f),
           yl = Tensor::empty({5, 3000}, f);
    layernorm_forward(x, w, b, 1e-5, y, m, r);
    keep(y), keep(m), keep(r);
    add_layernorm_forward(x, x2, w, b, 1e-5, s, y, m, r);
    keep(s), keep(y), keep(m), keep(r);
    softmax_forward(x, y);
    keep(y);
    softmax_forward(xl, yl);
    keep(yl);
    cross_entropy_forward(x, targets, 0.25, m, y);
    keep(m), keep(y);
    got.push_back(all);
  }
  set_num_threads(before);
  EXPECT_EQ(got[0], got[1]);
}

TEST(Softmax, ForwardAndBackward) {
  std::mt19937_64 rng(test_seed(54));
  Tensor x = randn({3, 4, 29}, rng, 3.0);
  const Tensor g = randn(x.shape(), rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  softmax_forward(x, y);
  const auto xv = as_f64(x), yv = as_f64(y);
  for (int64_t r = 0; r < 12; ++r) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < 29; ++j) mx = std::max(mx, xv[size_t(r * 29 + j)]);
    for (int64_t j = 0; j < 29; ++j) s += std::exp(xv[size_t(r * 29 + j)] - mx);
    for (int64_t j = 0; j < 29; ++j)
      EXPECT_NEAR(yv[size_t(r * 29 + j)], std::exp(xv[size_t(r * 29 + j)] - mx) / s, 1e-15);
  }
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  softmax_backward(y, g, dx, false);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64);
    softmax_forward(x, yy);
    return dot(g, yy);
  };
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  Tensor acc = Tensor::full(x.shape(), 2.0, DType::f64);
  softmax_backward(y, g, acc, true);
  auto want = as_f64(dx);
  for (double& v : want) v += 2;
  EXPECT_LT(rel_error(as_f64(acc), want), 1e-14);

  Tensor y32 = Tensor::empty(x.shape(), DType::f32), dx32 = Tensor::empty(x.shape(), DType::f32);
  softmax_forward(x.to(DType::f32), y32);
  EXPECT_LT(rel_error(y32, y), 1e-4);
  softmax_backward(y32, g.to(DType::f32), dx32, false);
  EXPECT_LT(rel_error(dx32, dx), 1e-4);
}

TEST(Softmax, InPlaceAndLargeLogits) {
  Tensor x = Tensor::from_vector<float>({1000.f, 1001.f, 999.f, -1e30f}, {1, 4});
  softmax_forward(x, x);
  const auto v = x.to_vector<float>();
  const double e0 = std::exp(-1.0), e2 = std::exp(-2.0), s = 1 + e0 + e2;
  EXPECT_NEAR(v[0], e0 / s, 1e-6);
  EXPECT_NEAR(v[1], 1 / s, 1e-6);
  EXPECT_NEAR(v[2], e2 / s, 1e-6);
  EXPECT_EQ(v[3], 0.0f);
}

}  // namespace
}  // namespace baton::kernels::test
