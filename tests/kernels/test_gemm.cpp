// matmul (every transpose, batched, shared b, alpha/beta) and linear (both weight layouts,
// with and without bias, accumulate) against naive references and finite differences.
#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "memory/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

// Runs the f32 GEMMs of a scope on one library, then restores the process's choice.
class SgemmScope {
 public:
  explicit SgemmScope(CpuSgemm library) : before_(cpu_sgemm()) { set_cpu_sgemm(library); }
  ~SgemmScope() { set_cpu_sgemm(before_); }
  SgemmScope(const SgemmScope&) = delete;
  SgemmScope& operator=(const SgemmScope&) = delete;

 private:
  CpuSgemm before_;
};

std::string sgemm_name(CpuSgemm library) {
  return library == CpuSgemm::kOneDnn ? "oneDNN" : "OpenBLAS";
}

// c[i, j] = sum_k op(a)[i, k] op(b)[k, j] for one matrix pair, in double.
std::vector<double> naive_matmul(const std::vector<double>& a, bool ta,
                                 const std::vector<double>& b, bool tb, int64_t m, int64_t n,
                                 int64_t k) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[size_t(p * m + i)] : a[size_t(i * k + p)]) *
             (tb ? b[size_t(j * k + p)] : b[size_t(p * n + j)]);
      c[size_t(i * n + j)] = s;
    }
  return c;
}

// The f32 GEMM libraries of this build: OpenBLAS, and oneDNN where baton has it.
std::vector<CpuSgemm> sgemm_libraries() {
  std::vector<CpuSgemm> libs{CpuSgemm::kOpenBlas};
  try {
    const SgemmScope probe(CpuSgemm::kOneDnn);
    libs.push_back(CpuSgemm::kOneDnn);
  } catch (const InputError&) {  // a build without oneDNN
  }
  return libs;
}

struct MatmulCase {
  bool ta, tb;
  int64_t batch;  // 0: plain 2-D
  bool b_shared;
};

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, MatchesNaiveInF64AndF32) {
  const auto p = GetParam();
  std::mt19937_64 rng(test_seed(11));
  const int64_t m = 37, n = 23, k = 19, nb = std::max<int64_t>(p.batch, 1);
  auto mat = [](bool t, int64_t r, int64_t c) { return t ? Shape{c, r} : Shape{r, c}; };
  Shape sa = mat(p.ta, m, k), sb = mat(p.tb, k, n), sc{m, n};
  if (p.batch > 0) {
    sa.insert(sa.begin(), p.batch);
    sc.insert(sc.begin(), p.batch);
    if (!p.b_shared) sb.insert(sb.begin(), p.batch);
  }
  const Tensor a = randn(sa, rng), b = randn(sb, rng), c0 = randn(sc, rng);
  const double alpha = 0.75, beta = -0.5;
  // Reference: alpha op(a) op(b) + beta c0, batch by batch.
  const auto av = as_f64(a), bv = as_f64(b), cv = as_f64(c0);
  std::vector<double> want;
  for (int64_t i = 0; i < nb; ++i) {
    std::vector<double> ai(av.begin() + i * m * k, av.begin() + (i + 1) * m * k);
    const int64_t bo = p.b_shared ? 0 : i * k * n;
    std::vector<double> bi(bv.begin() + bo, bv.begin() + bo + k * n);
    const auto ci = naive_matmul(ai, p.ta, bi, p.tb, m, n, k);
    for (int64_t j = 0; j < m * n; ++j)
      want.push_back(alpha * ci[size_t(j)] + beta * cv[size_t(i * m * n + j)]);
  }
  Tensor c = c0.clone();
  matmul(a, p.ta, b, p.tb, c, alpha, beta);
  EXPECT_LT(rel_error(as_f64(c), want), 1e-13);
  for (CpuSgemm library : sgemm_libraries()) {
    const SgemmScope scope(library);
    Tensor c32 = c0.to(DType::f32);
    matmul(a.to(DType::f32), p.ta, b.to(DType::f32), p.tb, c32, alpha, beta);
    EXPECT_LT(rel_error(as_f64(c32), want), 1e-5) << sgemm_name(library);
  }
}

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> cs;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      cs.push_back({ta, tb, 0, false});
      cs.push_back({ta, tb, 3, false});
      cs.push_back({ta, tb, 3, true});
    }
  return cs;
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, MatmulTest, ::testing::ValuesIn(matmul_cases()),
                         [](const auto& param_info) {
                           const auto& p = param_info.param;
                           return std::string(p.ta ? "T" : "N") + (p.tb ? "T" : "N") +
                                  (p.batch == 0 ? "_2d"
                                   : p.b_shared ? "_batched_shared_b"
                                                : "_batched");
                         });

TEST(Matmul, ManySmallBatchesTakeTheParallelPath) {
  // 16 small products: the batched path runs one single-threaded GEMM per thread.
  std::mt19937_64 rng(test_seed(12));
  const Tensor a = randn({16, 8, 5}, rng), b = randn({16, 5, 7}, rng);
  Tensor c = Tensor::zeros({16, 8, 7}, DType::f64);
  set_num_threads(2);
  matmul(a, false, b, false, c);
  const auto av = as_f64(a), bv = as_f64(b), cv = as_f64(c);
  for (int64_t i = 0; i < 16; ++i) {
    const auto want =
        naive_matmul({av.begin() + i * 40, av.begin() + (i + 1) * 40}, false,
                     {bv.begin() + i * 35, bv.begin() + (i + 1) * 35}, false, 8, 7, 5);
    EXPECT_LT(rel_error({cv.begin() + i * 56, cv.begin() + (i + 1) * 56}, want), 1e-13)
        << "batch " << i;
  }
}

TEST(Matmul, F32OnEveryLibraryBatchedInParallelAndStrided) {
  // Both libraries in the matmul's parallel path (single-threaded inside a parallel
  // region), and on strided operands.
  std::mt19937_64 rng(test_seed(13));
  const Tensor a = randn({16, 8, 5}, rng), b = randn({16, 5, 7}, rng);
  const auto av = as_f64(a), bv = as_f64(b);
  set_num_threads(2);
  for (CpuSgemm library : sgemm_libraries()) {
    const SgemmScope scope(library);
    EXPECT_EQ(cpu_sgemm(), library);
    Tensor c = Tensor::zeros({16, 8, 7}, DType::f32);
    matmul(a.to(DType::f32), false, b.to(DType::f32), false, c);
    const auto cv = as_f64(c);
    for (int64_t i = 0; i < 16; ++i) {
      const auto want =
          naive_matmul({av.begin() + i * 40, av.begin() + (i + 1) * 40}, false,
                       {bv.begin() + i * 35, bv.begin() + (i + 1) * 35}, false, 8, 7, 5);
      EXPECT_LT(rel_error({cv.begin() + i * 56, cv.begin() + (i + 1) * 56}, want), 1e-5)
          << sgemm_name(library) << ", batch " << i;
    }
    // The raw kernel on operands inside wider rows (leading dimensions past the columns
    // used, an offset start), alpha and beta, every transpose; 300 rows, so that on two
    // threads the rows of a product with b transposed are split between them.
    for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}}) {
      const int64_t m = 300, n = 3, k = 4, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2,
                    ldc = n + 2;
      std::vector<float> x(size_t((ta ? k : m) * lda)), w(size_t((tb ? n : k) * ldb));
      std::vector<float> y(size_t(m * ldc), -1.0f);
      for (auto& v : x) v = float(std::normal_distribution<double>()(rng));
      for (auto& v : w) v = float(std::normal_distribution<double>()(rng));
      cpu::gemm<float>(ta, tb, m, n, k, 0.75f, x.data() + 2, lda, w.data() + 1, ldb, 0.5f, y.data(),
                       ldc);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0.5 * -1.0;
          for (int64_t p = 0; p < k; ++p)
            want += 0.75 * double(x[size_t(2 + (ta ? p * lda + i : i * lda + p))]) *
                    w[size_t(1 + (tb ? j * ldb + p : p * ldb + j))];
          EXPECT_NEAR(y[size_t(i * ldc + j)], want, 1e-5)
              << sgemm_name(library) << " " << ta << tb << " row " << i;
        }
        for (int64_t j = n; j < ldc; ++j)  // untouched beyond n
          EXPECT_EQ(y[size_t(i * ldc + j)], -1.0f) << sgemm_name(library);
      }
    }
  }
}

// Every kernel's bits are independent of the thread count (docs/kernels.md, "Threads"):
// GEMMs included, on each library, at shapes of the linear layers' three products.
TEST(Matmul, F32BitsDoNotDependOnTheThreadCount) {
  std::mt19937_64 rng(test_seed(14));
  const int before = num_threads();
  for (CpuSgemm library : sgemm_libraries()) {
    const SgemmScope scope(library);
    // The second shape's long k is where a library might split the sum between threads.
    for (const auto& [ta, tb, m, n, k] : {std::tuple{false, false, 512, 384, 256},
                                          {false, true, 512, 384, 256},
                                          {true, false, 512, 384, 256},
                                          {false, false, 128, 64, 4096},
                                          {false, true, 128, 64, 4096},
                                          {true, false, 128, 64, 4096}}) {
      const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, rng, 1.0, DType::f32),
                   b = randn(tb ? Shape{n, k} : Shape{k, n}, rng, 1.0, DType::f32);
      std::vector<std::vector<float>> got;
      for (int t : {1, 2}) {
        set_num_threads(t);
        Tensor c = Tensor::zeros({m, n}, DType::f32);
        matmul(a, ta, b, tb, c);
        got.push_back(c.to_vector<float>());
      }
      EXPECT_EQ(got[0], got[1]) << sgemm_name(library) << " " << ta << tb << " " << m << "x" << n
                                << "x" << k;
    }
  }
  set_num_threads(before);
}

TEST(Matmul, TheLibraryCanBeChosenAndOneDnnIsTheDefaultWhereBuilt) {
  const auto libs = sgemm_libraries();
  // A build with oneDNN defaults to it unless BATON_SGEMM chose (the suite leaves it unset).
  if (std::getenv("BATON_SGEMM") == nullptr) {
    EXPECT_EQ(cpu_sgemm(), libs.size() == 2 ? CpuSgemm::kOneDnn : CpuSgemm::kOpenBlas);
  }
  if (libs.size() == 1) {
    EXPECT_THROW(set_cpu_sgemm(CpuSgemm::kOneDnn), InputError);
  }
}

TEST(Matmul, RejectsMismatchedShapes) {
  Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({4, 5}), c = Tensor::zeros({4, 5});
  EXPECT_THROW(matmul(a, false, b, false, c), std::invalid_argument);
  Tensor b2 = Tensor::zeros({3, 5}), c2 = Tensor::zeros({4, 6});
  EXPECT_THROW(matmul(a, false, b2, false, c2), std::invalid_argument);
  Tensor b64 = Tensor::zeros({3, 5}, DType::f64);
  EXPECT_THROW(matmul(a, false, b64, false, c), std::invalid_argument);
}

// ---- linear ----

struct LinearCase {
  WeightLayout layout;
  bool bias;
};

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, ForwardMatchesMatmulAndBackwardMatchesFiniteDifferences) {
  const auto p = GetParam();
  std::mt19937_64 rng(test_seed(21));
  const int64_t rows = 6, in = 5, out = 4;
  const bool io = p.layout == WeightLayout::in_out;
  Tensor x = randn({2, 3, in}, rng);  // leading dims flatten to rows
  Tensor w = randn(io ? Shape{in, out} : Shape{out, in}, rng);
  Tensor bias = p.bias ? randn({out}, rng) : Tensor();
  Tensor y = Tensor::empty({2, 3, out}, DType::f64);
  linear_forward(x, w, bias, p.layout, y);
  // Forward against the naive product.
  auto want = naive_matmul(as_f64(x), false, as_f64(w), !io, rows, out, in);
  if (p.bias)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) want[size_t(r * out + j)] += as_f64(bias)[size_t(j)];
  EXPECT_LT(rel_error(as_f64(y), want), 1e-14);

  // Backward of L = sum(g * y).
  const Tensor g = randn(y.shape(), rng);
  auto loss = [&] {
    Tensor yy = Tensor::empty(y.shape(), DType::f64);
    linear_forward(x, w, bias, p.layout, yy);
    return dot(g, yy);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64), dw = Tensor::empty(w.shape(), DType::f64);
  Tensor db = p.bias ? Tensor::empty({out}, DType::f64) : Tensor();
  linear_backward_input(g, w, p.layout, dx, false);
  linear_backward_weight(g, x, p.layout, dw, db, false);
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  EXPECT_LT(fd_check(w, dw, loss, rng), 1e-6);
  if (p.bias) {
    EXPECT_LT(fd_check(bias, db, loss, rng), 1e-6);
  }

  // accumulate = true adds onto what is there.
  Tensor dx2 = Tensor::full(x.shape(), 1.5, DType::f64),
         dw2 = Tensor::full(w.shape(), -2, DType::f64);
  Tensor db2 = p.bias ? Tensor::full({out}, 3, DType::f64) : Tensor();
  linear_backward_input(g, w, p.layout, dx2, true);
  linear_backward_weight(g, x, p.layout, dw2, db2, true);
  auto shifted = [](const Tensor& t, double s) {
    auto v = as_f64(t);
    for (double& e : v) e += s;
    return v;
  };
  EXPECT_LT(rel_error(as_f64(dx2), shifted(dx, 1.5)), 1e-14);
  EXPECT_LT(rel_error(as_f64(dw2), shifted(dw, -2)), 1e-14);
  if (p.bias) {
    EXPECT_LT(rel_error(as_f64(db2), shifted(db, 3)), 1e-14);
  }

  // float32 against float64.
  Tensor y32 = Tensor::empty(y.shape(), DType::f32);
  linear_forward(x.to(DType::f32), w.to(DType::f32), p.bias ? bias.to(DType::f32) : Tensor(),
                 p.layout, y32);
  EXPECT_LT(rel_error(y32, y), 1e-4);
  Tensor dx32 = Tensor::empty(x.shape(), DType::f32), dw32 = Tensor::empty(w.shape(), DType::f32);
  Tensor db32 = p.bias ? Tensor::empty({out}, DType::f32) : Tensor();
  linear_backward_input(g.to(DType::f32), w.to(DType::f32), p.layout, dx32, false);
  linear_backward_weight(g.to(DType::f32), x.to(DType::f32), p.layout, dw32, db32, false);
  EXPECT_LT(rel_error(dx32, dx), 1e-4);
  EXPECT_LT(rel_error(dw32, dw), 1e-4);
  if (p.bias) {
    EXPECT_LT(rel_error(db32, db), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LinearTest,
                         ::testing::Values(LinearCase{WeightLayout::out_in, true},
                                           LinearCase{WeightLayout::out_in, false},
                                           LinearCase{WeightLayout::in_out, true},
                                           LinearCase{WeightLayout::in_out, false}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.layout == WeightLayout::in_out
                                                  ? "in_out"
                                                  : "out_in") +
                                  (param_info.param.bias ? "_bias" : "_no_bias");
                         });

}  // namespace
}  // namespace baton::kernels::test
