// GEMM through oneDNN's sgemm or OpenBLAS (transpose flags, never a copy to transpose),
// batched matmul, and linear layers forward and backward.
#include <cblas.h>
#ifdef BATON_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "memory/error.h"

namespace baton::kernels {

namespace {

constexpr int kUnset = -1;
#ifdef BATON_HAVE_DNNL
constexpr bool kHaveOneDnn = true;
#else
constexpr bool kHaveOneDnn = false;
#endif

std::atomic<int> g_sgemm{kUnset};  // a CpuSgemm once chosen

void need_onednn(const std::string& what) {
  if (!kHaveOneDnn) throw InputError(what + ": this build of baton has no oneDNN; use openblas");
}

CpuSgemm sgemm_from_environment() {
  const char* env = std::getenv("BATON_SGEMM");
  if (env == nullptr || *env == '\0') return kHaveOneDnn ? CpuSgemm::kOneDnn : CpuSgemm::kOpenBlas;
  const std::string_view v = env;
  if (v == "openblas") return CpuSgemm::kOpenBlas;
  if (v == "onednn") {
    need_onednn("BATON_SGEMM=onednn");
    return CpuSgemm::kOneDnn;
  }
  throw InputError("BATON_SGEMM: expected \"openblas\" or \"onednn\", found \"" + std::string(v) +
                   "\"");
}

}  // namespace

CpuSgemm cpu_sgemm() {
  const int library = g_sgemm.load(std::memory_order_relaxed);
  if (library != kUnset) return CpuSgemm(library);
  int expected = kUnset;
  g_sgemm.compare_exchange_strong(expected, int(sgemm_from_environment()));
  return CpuSgemm(g_sgemm.load());
}

void set_cpu_sgemm(CpuSgemm library) {
  if (library == CpuSgemm::kOneDnn) need_onednn("set_cpu_sgemm(oneDNN)");
  g_sgemm.store(int(library));
}

namespace cpu {

namespace {

// OpenBLAS's AVX2 kernels (its Haswell and Zen cores, which it runs on AVX2 machines and
// where OPENBLAS_CORETYPE names them) give bits that depend on the call: on two threads a
// third to two thirds of a product's rows differed from one thread's, and rows computed
// in two calls differed from the same rows computed in one. Its AVX-512 kernels do
// neither (docs/kernels.md, "Threads"). So a product runs as single-threaded calls on
// parts fixed by its shape alone: the longer side of the output (each call packs the
// other operand again, the smaller one) cut into at most kBlasParts parts of at least
// kBlasMinPart, spread over the threads.
constexpr int64_t kBlasParts = 8, kBlasMinPart = 128;

template <class T>
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha,
               const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const bool by_rows = m >= n;
  const int64_t len = by_rows ? m : n;
  const int64_t parts = std::clamp<int64_t>(len / kBlasMinPart, 1, kBlasParts);
  auto part = [&](int64_t i) {
    const int64_t p0 = len * i / parts, p1 = len * (i + 1) / parts;
    const T* ap = by_rows ? a + (ta == CblasTrans ? p0 : p0 * lda) : a;
    const T* bp = by_rows ? b : b + (tb == CblasTrans ? p0 * ldb : p0);
    T* cp = c + (by_rows ? p0 * ldc : p0);
    const blasint mm(by_rows ? p1 - p0 : m), nn(by_rows ? n : p1 - p0);
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, mm, nn, blasint(k), alpha, ap, blasint(lda), bp,
                  blasint(ldb), beta, cp, blasint(ldc));
    else
      cblas_dgemm(CblasRowMajor, ta, tb, mm, nn, blasint(k), alpha, ap, blasint(lda), bp,
                  blasint(ldb), beta, cp, blasint(ldc));
  };
  if (parts > 1 && thread_count() > 1 && !omp_in_parallel()) {
    parallel_tasks(parts, part);  // OpenBLAS runs single-threaded inside the region
    return;
  }
  // OpenBLAS's OpenMP build takes its thread count from the caller's OpenMP count.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int64_t i = 0; i < parts; ++i) part(i);
  omp_set_num_threads(threads);
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: c = beta c (BLAS rejects k = 0 leading dimensions)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  sync_blas_threads();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
#ifdef BATON_HAVE_DNNL
    if (cpu_sgemm() == CpuSgemm::kOneDnn) {
      // Reads omp_get_max_threads() like OpenBLAS, and runs on one thread when nested.
      auto rows = [&](int64_t r0, int64_t r1) {
        const dnnl_status_t status =
            dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', r1 - r0, n, k, alpha,
                       a + (trans_a ? r0 : r0 * lda), lda, b, ldb, beta, c + r0 * ldc, ldc);
        BATON_CHECK(status == dnnl_success, "dnnl_sgemm returned " + std::to_string(int(status)));
      };
      // oneDNN's own split of a product with b transposed ran 15-29% below its other
      // products on two threads (docs/kernels.md, "Threads"): split the rows here, each
      // part on one thread.
      if (trans_b && !trans_a)
        parallel_for(m, 64, rows);
      else
        rows(0, m);
      return;
    }
#endif
  }
  blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void matmul(const T* a, bool trans_a, const T* b, bool trans_b, T* c, int64_t batch, int64_t m,
            int64_t n, int64_t k, bool b_shared, T alpha, T beta) {
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  if (batch == 1 || (b_shared && !trans_a)) {
    // One product: a shared b lets the batches of a stack into one tall matrix.
    gemm(trans_a, trans_b, m * batch, n, k, alpha, a, lda, b, ldb, beta, c, n);
    return;
  }
  const int64_t sa = m * k, sb = b_shared ? 0 : k * n, sc = m * n;
  auto one = [&](int64_t i) {
    gemm(trans_a, trans_b, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, n);
  };
  // Small products: one single-threaded GEMM per thread beats splitting each product
  // (either library runs single-threaded inside a parallel region).
  const int threads = thread_count();
  if (threads > 1 && batch >= threads && 2.0 * double(m) * double(n) * double(k) <= 16e6)
    parallel_tasks(batch, one);
  else
    for (int64_t i = 0; i < batch; ++i) one(i);
}

template <class T>
void linear_forward(const T* x, const T* w, const T* bias, bool in_out, T* y, int64_t rows,
                    int64_t in, int64_t out) {
  // With a bias, y starts as the bias and the GEMM adds into it (beta = 1): a BLAS
  // would otherwise make a pass to zero y first, then we would make one to add the bias.
  if (bias != nullptr)
    parallel_for(rows, row_grain(out), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(bias, bias + out, y + r * out);
    });
  const T beta = bias != nullptr ? T(1) : T(0);
  if (in_out)  // w: [in, out]
    gemm(false, false, rows, out, in, T(1), x, in, w, out, beta, y, out);
  else  // w: [out, in]
    gemm(false, true, rows, out, in, T(1), x, in, w, in, beta, y, out);
}

template <class T>
void linear_backward_input(const T* dy, const T* w, bool in_out, T* dx, int64_t rows, int64_t in,
                           int64_t out, bool accumulate) {
  const T beta = accumulate ? T(1) : T(0);
  if (in_out)  // dx = dy w^T, w: [in, out]
    gemm(false, true, rows, in, out, T(1), dy, out, w, out, beta, dx, in);
  else  // dx = dy w, w: [out, in]
    gemm(false, false, rows, in, out, T(1), dy, out, w, in, beta, dx, in);
}

template <class T>
void linear_backward_weight(const T* dy, const T* x, bool in_out, T* dw, T* dbias, int64_t rows,
                            int64_t in, int64_t out, bool accumulate) {
  const T beta = accumulate ? T(1) : T(0);
  if (in_out)  // dw[in, out] = x^T dy
    gemm(true, false, in, out, rows, T(1), x, in, dy, out, beta, dw, out);
  else  // dw[out, in] = dy^T x
    gemm(true, false, out, in, rows, T(1), dy, out, x, in, beta, dw, in);
  if (dbias != nullptr) bias_backward(dy, dbias, rows, out, accumulate);
}

#define BATON_INSTANTIATE(T)                                                                      \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,    \
                        int64_t, T, T*, int64_t);                                                 \
  template void matmul<T>(const T*, bool, const T*, bool, T*, int64_t, int64_t, int64_t, int64_t, \
                          bool, T, T);                                                            \
  template void linear_forward<T>(const T*, const T*, const T*, bool, T*, int64_t, int64_t,       \
                                  int64_t);                                                       \
  template void linear_backward_input<T>(const T*, const T*, bool, T*, int64_t, int64_t, int64_t, \
                                         bool);                                                   \
  template void linear_backward_weight<T>(const T*, const T*, bool, T*, T*, int64_t, int64_t,     \
                                          int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace cpu
}  // namespace baton::kernels
