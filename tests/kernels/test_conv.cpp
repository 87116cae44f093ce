// The vision kernels (kernels/vision.h): oneDNN's f32 convolutions against the naive
// reference over a grid of geometries (kernel 1/3/5, stride 1/2, dilation 1/2, groups,
// padding, asymmetric padding), the reference's gradients against finite differences in
// f64, batch normalisation (training statistics, running statistics, evaluation) and
// pooling against finite differences and hand-computed values.
#include <gtest/gtest.h>

#include <random>

#include "kernels/cpu/vision_cpu.h"
#include "kernels/vision.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

struct ConvCase {
  int64_t k, stride, dilation, groups, pad_t, pad_b, pad_l, pad_r;
  bool bias;
};

std::string describe(const ConvCase& c) {
  return "k" + std::to_string(c.k) + " s" + std::to_string(c.stride) + " d" +
         std::to_string(c.dilation) + " g" + std::to_string(c.groups) + " pad " +
         std::to_string(c.pad_t) + "/" + std::to_string(c.pad_b) + "/" + std::to_string(c.pad_l) +
         "/" + std::to_string(c.pad_r) + (c.bias ? " bias" : "");
}

Conv2dOptions options_of(const ConvCase& c) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = c.stride;
  o.dilation_h = o.dilation_w = c.dilation;
  o.groups = c.groups;
  o.pad_top = c.pad_t;
  o.pad_bottom = c.pad_b;
  o.pad_left = c.pad_l;
  o.pad_right = c.pad_r;
  return o;
}

Shape out_shape(const Shape& x, const Shape& w, const Conv2dOptions& o) {
  return {x[0], w[0],
          conv_output_size(x[2], w[2], o.stride_h, o.pad_top, o.pad_bottom, o.dilation_h),
          conv_output_size(x[3], w[3], o.stride_w, o.pad_left, o.pad_right, o.dilation_w)};
}

std::vector<ConvCase> grid() {
  std::vector<ConvCase> cases;
  for (int64_t k : {1, 3, 5})
    for (int64_t s : {1, 2})
      for (int64_t d : {1, 2})
        for (int64_t g : {1, 2}) {
          // Groups alternate with the other parameters: each combination of kernel, stride
          // and dilation once, with each group count half of the time (oneDNN builds a
          // primitive per geometry, which costs more than running it).
          if ((k + s + d + g) % 2 != 0) continue;
          const int64_t p = d * (k - 1) / 2;  // "same" padding
          cases.push_back({k, s, d, g, p, p, p, p, (k + s + g) % 4 < 2});
          if (k == 3) cases.push_back({k, s, d, g, 0, 0, 0, 0, true});
        }
  cases.push_back({3, 1, 1, 1, 1, 0, 0, 2, true});   // asymmetric (a spatial tile's edge)
  cases.push_back({3, 2, 1, 4, 1, 1, 1, 1, false});  // depthwise (groups = channels)
  return cases;
}

// oneDNN (f32) against the reference in f64 on the same rounded inputs, all three
// directions, with and without accumulation.
TEST(Conv2d, OneDnnMatchesReference) {
  ASSERT_TRUE(built_with_onednn());
  auto rng = std::mt19937_64(test_seed(1));
  // Small problems: one thread (on a loaded machine, two threads' barriers cost more than
  // the work).
  const int threads = num_threads();
  set_num_threads(1);
  for (const ConvCase& c : grid()) {
    SCOPED_TRACE(describe(c));
    const Conv2dOptions o = options_of(c);
    const Shape xs{2, 4, 11, 9}, ws{8, 4 / c.groups, c.k, c.k};
    const Shape ys = out_shape(xs, ws, o);
    ASSERT_GE(ys[2], 1);
    Tensor x = randn(xs, rng, 1.0, DType::f32), w = randn(ws, rng, 0.3, DType::f32);
    Tensor b = c.bias ? randn({8}, rng, 1.0, DType::f32) : Tensor();
    Tensor dy = randn(ys, rng, 1.0, DType::f32);
    Tensor x64 = x.to(DType::f64), w64 = w.to(DType::f64), dy64 = dy.to(DType::f64);
    Tensor b64 = c.bias ? b.to(DType::f64) : Tensor();

    Tensor y = Tensor::empty(ys, DType::f32), y64 = Tensor::empty(ys, DType::f64);
    conv2d_forward(x, w, b, o, y);
    conv2d_forward(x64, w64, b64, o, y64);
    EXPECT_LT(rel_error(y, y64), 1e-5) << "forward";

    Tensor dx = Tensor::empty(xs, DType::f32), dx64 = Tensor::empty(xs, DType::f64);
    conv2d_backward_input(dy, w, o, dx, false);
    conv2d_backward_input(dy64, w64, o, dx64, false);
    EXPECT_LT(rel_error(dx, dx64), 1e-5) << "backward_input";

    Tensor dw = Tensor::empty(ws, DType::f32), dw64 = Tensor::empty(ws, DType::f64);
    Tensor db = c.bias ? Tensor::empty({8}, DType::f32) : Tensor();
    Tensor db64 = c.bias ? Tensor::empty({8}, DType::f64) : Tensor();
    conv2d_backward_weight(dy, x, o, dw, db, false);
    conv2d_backward_weight(dy64, x64, o, dw64, db64, false);
    EXPECT_LT(rel_error(dw, dw64), 1e-5) << "backward_weight";
    if (c.bias) {
      EXPECT_LT(rel_error(db, db64), 1e-5) << "dbias";
    }

    // accumulate = true adds to what is there (twice the gradient).
    conv2d_backward_input(dy, w, o, dx, true);
    conv2d_backward_weight(dy, x, o, dw, db, true);
    Tensor two_dx = dx64.clone(), two_dw = dw64.clone();
    scale_inplace(two_dx, 2.0);
    scale_inplace(two_dw, 2.0);
    EXPECT_LT(rel_error(dx, two_dx), 1e-5) << "backward_input accumulate";
    EXPECT_LT(rel_error(dw, two_dw), 1e-5) << "backward_weight accumulate";
  }
  set_num_threads(threads);
}

// The f32 reference agrees with the f64 one (the same loops) and the reference with a
// direct evaluation of the definition at a few points.
TEST(Conv2d, ReferenceDefinition) {
  auto rng = std::mt19937_64(test_seed(2));
  ConvCase c{3, 2, 2, 2, 2, 1, 0, 2, true};
  const Conv2dOptions o = options_of(c);
  const Shape xs{1, 4, 10, 8}, ws{6, 2, 3, 3};
  const Shape ys = out_shape(xs, ws, o);
  Tensor x = randn(xs, rng), w = randn(ws, rng), b = randn({6}, rng);
  Tensor y = Tensor::empty(ys, DType::f64);
  conv2d_forward(x, w, b, o, y);
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  for (auto [oc, i, j] :
       {std::tuple<int64_t, int64_t, int64_t>{0, 0, 0}, {5, ys[2] - 1, ys[3] - 1}, {3, 1, 2}}) {
    double want = b.data<double>()[oc];
    const int64_t grp = oc / 3;
    for (int64_t cc = 0; cc < 2; ++cc)
      for (int64_t a = 0; a < 3; ++a)
        for (int64_t bb = 0; bb < 3; ++bb) {
          int64_t r = i * 2 - 2 + a * 2, s = j * 2 - 0 + bb * 2;
          if (r < 0 || r >= 10 || s < 0 || s >= 8) continue;
          want += X[((grp * 2 + cc) * 10 + r) * 8 + s] * W[((oc * 2 + cc) * 3 + a) * 3 + bb];
        }
    EXPECT_NEAR(y.data<double>()[(oc * ys[2] + i) * ys[3] + j], want, 1e-12);
  }
}

// Gradients of the f64 convolution against central differences of sum(r * y).
TEST(Conv2d, GradientsMatchFiniteDifferences) {
  auto rng = std::mt19937_64(test_seed(3));
  for (const ConvCase& c :
       {ConvCase{3, 1, 1, 1, 1, 1, 1, 1, true}, ConvCase{3, 2, 2, 2, 2, 1, 1, 0, true},
        ConvCase{5, 2, 1, 1, 2, 2, 2, 2, false}}) {
    SCOPED_TRACE(describe(c));
    const Conv2dOptions o = options_of(c);
    const Shape xs{2, 4, 7, 6}, ws{4, 4 / c.groups, c.k, c.k};
    const Shape ys = out_shape(xs, ws, o);
    Tensor x = randn(xs, rng), w = randn(ws, rng), b = c.bias ? randn({4}, rng) : Tensor();
    Tensor r = randn(ys, rng);
    auto loss = [&] {
      Tensor y = Tensor::empty(ys, DType::f64);
      conv2d_forward(x, w, b, o, y);
      return dot(r, y);
    };
    Tensor dx = Tensor::empty(xs, DType::f64), dw = Tensor::empty(ws, DType::f64);
    Tensor db = c.bias ? Tensor::empty({4}, DType::f64) : Tensor();
    conv2d_backward_input(r, w, o, dx, false);
    conv2d_backward_weight(r, x, o, dw, db, false);
    EXPECT_LT(fd_check(x, dx, loss, rng, 120), 1e-6) << "dx";
    EXPECT_LT(fd_check(w, dw, loss, rng, 120), 1e-6) << "dw";
    if (c.bias) {
      EXPECT_LT(fd_check(b, db, loss, rng), 1e-6) << "dbias";
    }
  }
}

TEST(Conv2d, BadArguments) {
  Tensor x = Tensor::zeros({1, 4, 5, 5}, DType::f32);
  Tensor w = Tensor::zeros({6, 3, 3, 3}, DType::f32), y = Tensor::zeros({1, 6, 3, 3}, DType::f32);
  EXPECT_THROW(conv2d_forward(x, w, Tensor(), Conv2dOptions{}, y), std::invalid_argument);
  Tensor w2 = Tensor::zeros({6, 2, 3, 3}, DType::f32);
  Conv2dOptions g2;
  g2.groups = 2;
  conv2d_forward(x, w2, Tensor(), g2, y);  // fine
  Tensor big = Tensor::zeros({6, 2, 7, 7}, DType::f32);
  try {
    conv2d_forward(x, big, Tensor(), g2, y);
    FAIL() << "a kernel larger than the image";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

// ---- batch normalisation ----

TEST(BatchNorm, TrainingStatisticsAndRunningUpdate) {
  auto rng = std::mt19937_64(test_seed(4));
  const int64_t n = 3, c = 2, plane = 5;
  Tensor x = randn({n, c, 1, plane}, rng, 2.0);
  Tensor w = randn({c}, rng), b = randn({c}, rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64), mean = Tensor::empty({c}, DType::f64),
         rstd = Tensor::empty({c}, DType::f64);
  Tensor rm = Tensor::from_vector(std::vector<double>{0.5, -1.0}, {c});
  Tensor rv = Tensor::from_vector(std::vector<double>{2.0, 1.0}, {c});
  batchnorm_forward_train(x, w, b, 1e-5, 0.1, y, mean, rstd, rm, rv);
  const double* X = x.data<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < plane; ++k) s += X[(i * c + ch) * plane + k];
    const double mu = s / (n * plane);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < plane; ++k) s2 += std::pow(X[(i * c + ch) * plane + k] - mu, 2);
    const double var = s2 / (n * plane), unbiased = s2 / (n * plane - 1);
    EXPECT_NEAR(mean.data<double>()[ch], mu, 1e-12);
    EXPECT_NEAR(rstd.data<double>()[ch], 1 / std::sqrt(var + 1e-5), 1e-10);
    const double r0 = ch == 0 ? 0.5 : -1.0, v0 = ch == 0 ? 2.0 : 1.0;
    EXPECT_NEAR(rm.data<double>()[ch], 0.9 * r0 + 0.1 * mu, 1e-12);
    EXPECT_NEAR(rv.data<double>()[ch], 0.9 * v0 + 0.1 * unbiased, 1e-12);
    const int64_t at = (1 * c + ch) * plane + 3;
    EXPECT_NEAR(y.data<double>()[at],
                (X[at] - mu) / std::sqrt(var + 1e-5) * w.data<double>()[ch] + b.data<double>()[ch],
                1e-10);
  }
  // Evaluation normalises with the running statistics.
  Tensor ye = Tensor::empty(x.shape(), DType::f64);
  batchnorm_forward_eval(x, w, b, rm, rv, 1e-5, ye);
  const int64_t at = (2 * c + 1) * plane + 1;
  EXPECT_NEAR(ye.data<double>()[at],
              (X[at] - rm.data<double>()[1]) / std::sqrt(rv.data<double>()[1] + 1e-5) *
                      w.data<double>()[1] +
                  b.data<double>()[1],
              1e-12);
}

TEST(BatchNorm, GradientsMatchFiniteDifferences) {
  auto rng = std::mt19937_64(test_seed(5));
  const Shape xs{3, 4, 3, 5};
  Tensor x = randn(xs, rng, 1.5), w = randn({4}, rng), b = randn({4}, rng), r = randn(xs, rng);
  Tensor none;
  auto loss = [&] {
    Tensor y = Tensor::empty(xs, DType::f64), m = Tensor::empty({4}, DType::f64),
           s = Tensor::empty({4}, DType::f64);
    batchnorm_forward_train(x, w, b, 1e-5, 0.1, y, m, s, none, none);
    return dot(r, y);
  };
  Tensor y = Tensor::empty(xs, DType::f64), m = Tensor::empty({4}, DType::f64),
         s = Tensor::empty({4}, DType::f64);
  batchnorm_forward_train(x, w, b, 1e-5, 0.1, y, m, s, none, none);
  Tensor dx = Tensor::empty(xs, DType::f64), dw = Tensor::empty({4}, DType::f64),
         db = Tensor::empty({4}, DType::f64);
  batchnorm_backward_input(r, x, w, m, s, dx, false);
  batchnorm_backward_weight(r, x, m, s, dw, db, false);
  EXPECT_LT(fd_check(x, dx, loss, rng, 120), 1e-6);
  EXPECT_LT(fd_check(w, dw, loss, rng), 1e-6);
  EXPECT_LT(fd_check(b, db, loss, rng), 1e-6);
  // f32 against f64, and accumulate.
  Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32), b32 = b.to(DType::f32),
         r32 = r.to(DType::f32);
  Tensor y32 = Tensor::empty(xs, DType::f32), m32 = Tensor::empty({4}, DType::f32),
         s32 = Tensor::empty({4}, DType::f32), dx32 = Tensor::empty(xs, DType::f32);
  batchnorm_forward_train(x32, w32, b32, 1e-5, 0.1, y32, m32, s32, none, none);
  batchnorm_backward_input(r32, x32, w32, m32, s32, dx32, false);
  EXPECT_LT(rel_error(y32, y), 1e-5);
  EXPECT_LT(rel_error(dx32, dx), 1e-4);
  batchnorm_backward_input(r32, x32, w32, m32, s32, dx32, true);
  Tensor two = dx.clone();
  scale_inplace(two, 2.0);
  EXPECT_LT(rel_error(dx32, two), 1e-4);
}

// ---- pooling ----

TEST(Pool, MaxAndAverageMatchFiniteDifferences) {
  auto rng = std::mt19937_64(test_seed(6));
  const Shape xs{2, 3, 7, 6};
  Tensor x = randn(xs, rng);
  for (Pool2dOptions o :
       {Pool2dOptions{3, 3, 2, 2, 1, 1, true}, Pool2dOptions{2, 2, 2, 2, 0, 0, true},
        Pool2dOptions{3, 2, 1, 2, 1, 0, false}}) {
    SCOPED_TRACE(std::to_string(o.kernel_h) + "x" + std::to_string(o.kernel_w) + " stride " +
                 std::to_string(o.stride_h) + " pad " + std::to_string(o.pad_h));
    const Shape ys{2, 3, conv_output_size(7, o.kernel_h, o.stride_h, o.pad_h, o.pad_h, 1),
                   conv_output_size(6, o.kernel_w, o.stride_w, o.pad_w, o.pad_w, 1)};
    Tensor r = randn(ys, rng);
    Tensor y = Tensor::empty(ys, DType::f64), idx = Tensor::empty(ys, DType::i32);
    auto max_loss = [&] {
      maxpool2d_forward(x, o, y, idx);
      return dot(r, y);
    };
    auto avg_loss = [&] {
      avgpool2d_forward(x, o, y);
      return dot(r, y);
    };
    Tensor dx = Tensor::empty(xs, DType::f64);
    maxpool2d_forward(x, o, y, idx);
    maxpool2d_backward(r, idx, dx, false);
    EXPECT_LT(fd_check(x, dx, max_loss, rng, 150), 1e-6) << "max";
    avgpool2d_backward(r, o, dx, false);
    EXPECT_LT(fd_check(x, dx, avg_loss, rng, 150), 1e-6) << "average";
  }
  // torch's count_include_pad: a 3x3 window at the corner of a padded image divides by 9.
  Tensor ones = Tensor::from_vector(std::vector<double>(16, 1.0), {1, 1, 4, 4});
  Tensor y = Tensor::empty({1, 1, 2, 2}, DType::f64);
  avgpool2d_forward(ones, Pool2dOptions{3, 3, 2, 2, 1, 1, true}, y);
  EXPECT_NEAR(y.data<double>()[0], 4.0 / 9.0, 1e-15);
  avgpool2d_forward(ones, Pool2dOptions{3, 3, 2, 2, 1, 1, false}, y);
  EXPECT_NEAR(y.data<double>()[0], 1.0, 1e-15);
}

// The spatial split's max pooling re-bases a strip's argmax onto its tile: a strip of 4
// rows of width 3 whose row 1 is the tile's row 0 (a tile of 2 rows): maxima in the halo
// rows (strip rows 0 and 3) and "no maximum" (-1) become -1, the others move up a row.
TEST(Pool, MaxArgmaxRebasedOntoRows) {
  Tensor strip =
      Tensor::from_vector(std::vector<int32_t>{0, 2, 3, 5, 6, 8, 9, 11, -1}, {1, 1, 3, 3});
  Tensor out = Tensor::empty({1, 1, 3, 3}, DType::i32);
  maxpool2d_argmax_rows(strip, 3, 1, 2, out);
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{-1, -1, 0, 2, 3, 5, -1, -1, -1}));
  // A plane starting above the strip (the bottom border's strip begins inside the tile).
  maxpool2d_argmax_rows(strip, 3, -1, 2, out);
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{3, 5, -1, -1, -1, -1, -1, -1, -1}));
}

TEST(Pool, GlobalAverage) {
  auto rng = std::mt19937_64(test_seed(7));
  Tensor x = randn({2, 3, 4, 5}, rng), r = randn({2, 3}, rng);
  Tensor y = Tensor::empty({2, 3}, DType::f64);
  auto loss = [&] {
    global_avgpool_forward(x, y);
    return dot(r, y);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  global_avgpool_backward(r, dx, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  double s = 0;
  for (int64_t k = 0; k < 20; ++k) s += x.data<double>()[20 + k];
  global_avgpool_forward(x, y);
  EXPECT_NEAR(y.data<double>()[1], s / 20, 1e-14);
}

}  // namespace
}  // namespace baton::kernels::test
