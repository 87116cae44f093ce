// The row loop shared by softmax_forward and the single-device cross-entropy: each row is
// read from memory once and each element's exp computed once (docs/kernels.md, "Row-wise
// kernels in one pass").
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

// Rows up to this many elements run five at a time (a few KB each stay in L1).
constexpr int64_t kSoftmaxPipelineCols = 1024;
// Longer rows go in chunks of at least kSoftmaxChunk elements, at most kSoftmaxMaxChunks.
constexpr int64_t kSoftmaxChunk = 2048;
constexpr int64_t kSoftmaxMaxChunks = 64;

namespace detail {

// One step of the pipeline over the columns: the max of row a, the exponentials of row b
// against its max mb (stored into yb when kStore, summed into sb), and row c scaled by fc
// (the finished softmax of the row before). Each stage is the same arithmetic in every
// instantiation, so a row's bits do not depend on its place in the pipeline.
template <bool kMax, bool kExp, bool kStore, bool kScale, class T>
inline void softmax_step(const T* xa, T& ma, const T* xb, T mb, T* yb, T& sb, T* yc, T fc,
                         int64_t cols) {
  constexpr int64_t L = kLanes<T>;
  if constexpr (kExp) mb = exp_shift(mb);  // a row or chunk all -inf: exps of 0, not NaN
  vec<T> amax = splat(-std::numeric_limits<T>::infinity()), asum{};
  int64_t c = 0;
  for (; c + L <= cols; c += L) {
    if constexpr (kMax) amax = vmax(amax, load(xa + c));
    if constexpr (kExp) {
      const vec<T> e = vexp_nonpositive(load(xb + c) - mb);
      if constexpr (kStore) store(yb + c, e);
      asum += e;
    }
    if constexpr (kScale) store(yc + c, load(yc + c) * fc);
  }
  T m = hmax(amax), s = hsum(asum);
  for (; c < cols; ++c) {
    if constexpr (kMax) m = m > xa[c] ? m : xa[c];
    if constexpr (kExp) {
      const T e = vexp_nonpositive(xb[c] - mb);
      if constexpr (kStore) yb[c] = e;
      s += e;
    }
    if constexpr (kScale) yc[c] *= fc;
  }
  if constexpr (kMax) ma = m;
  if constexpr (kExp) sb = s;
}

// Short rows in a software pipeline: step i takes the max of row i + 2, the exponentials
// of row i and scales row i - 2. A row's max is ready a whole step before its exps need
// it and its sum's reciprocal a whole step before its scaling does, so the reductions'
// latencies (the lane trees, the division) overlap a neighbouring row's exps instead of
// stalling the next step; five rows in flight stay in L1.
template <bool kStore, class T, class Done>
inline void softmax_rows_pipelined(const T* x, T* y, T scale, int64_t rows, int64_t cols,
                                   Done& done) {
  // m0, m1: the maxima of rows r and r + 1 at step r; y1, f1 and y2, f2: rows r - 1 and
  // r - 2, stored and not yet scaled, with their factors.
  T m0 = 0, m1 = 0, s = 0, f1 = 0, f2 = 0, unused = 0;
  T *y1 = nullptr, *y2 = nullptr;
  softmax_step<true, false, false, false>(x, m0, x, T(0), y, s, y, T(0), cols);
  if (rows > 1) softmax_step<true, false, false, false>(x + cols, m1, x, T(0), y, s, y, T(0), cols);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = kStore ? y + r * cols : nullptr;
    T m2 = 0;
    const bool ahead = r + 2 < rows;
    if (ahead && y2 != nullptr)
      softmax_step<true, true, kStore, true>(xr + 2 * cols, m2, xr, m0, yr, s, y2, f2, cols);
    else if (ahead)
      softmax_step<true, true, kStore, false>(xr + 2 * cols, m2, xr, m0, yr, s, yr, T(0), cols);
    else if (y2 != nullptr)
      softmax_step<false, true, kStore, true>(xr, unused, xr, m0, yr, s, y2, f2, cols);
    else
      softmax_step<false, true, kStore, false>(xr, unused, xr, m0, yr, s, yr, T(0), cols);
    done(r, m0, s);
    m0 = m1;
    m1 = m2;
    if constexpr (kStore) {
      y2 = y1;
      f2 = f1;
      y1 = yr;
      f1 = scale / s;
    }
  }
  if constexpr (kStore) {
    if (y2 != nullptr)
      softmax_step<false, false, false, true>(x, unused, x, T(0), y, s, y2, f2, cols);
    if (y1 != nullptr)
      softmax_step<false, false, false, true>(x, unused, x, T(0), y, s, y1, f1, cols);
  }
}

// A long row in chunks that stay in L1, pipelined as the short rows are: step k takes the
// max of chunk k + 1 (its reads from memory overlap chunk k's exps, which find chunk k in
// L1) and the exponentials of chunk k against the running max, which already includes
// chunk k's (the running sum is rescaled when a chunk raises it). The stored chunks are
// scaled at the end by their own factor.
template <class T, class Done>
inline void softmax_row_chunked(const T* x, T* y, T scale, int64_t row, int64_t cols, Done& done) {
  constexpr int64_t L = kLanes<T>;
  const int64_t by_count = (cols + kSoftmaxMaxChunks - 1) / kSoftmaxMaxChunks;
  const int64_t chunk = std::max(kSoftmaxChunk, (by_count + L - 1) / L * L);
  const int64_t chunks = (cols + chunk - 1) / chunk;
  T chunk_max[kSoftmaxMaxChunks];
  T m = -std::numeric_limits<T>::infinity(), s = 0, mk = 0, sk = 0;
  auto width = [&](int64_t k) { return std::min(chunk, cols - k * chunk); };
  softmax_step<true, false, false, false>(x, mk, x, T(0), y, sk, y, T(0), width(0));
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t n = width(k);
    const T m_new = std::max(m, mk);
    if (k > 0 && m_new > m) s *= vexp_nonpositive(m - m_new);
    m = m_new;
    const T* xk = x + k * chunk;
    T* yk = y != nullptr ? y + k * chunk : nullptr;
    const bool last = k + 1 == chunks;
    const T* xn = last ? xk : xk + chunk;  // never past the row's end
    const int64_t nn = last ? 0 : width(k + 1);
    // The shared loop runs over the whole vectors both chunks have; the longer chunk's rest
    // (only ever beside the last, shorter chunk) runs alone.
    const int64_t both = std::min(n, nn) / L * L;
    T mn = -std::numeric_limits<T>::infinity(), sum = 0;
    if (yk != nullptr)
      softmax_step<true, true, true, false>(xn, mn, xk, m, yk, sum, yk, T(0), both);
    else
      softmax_step<true, true, false, false>(xn, mn, xk, m, yk, sum, yk, T(0), both);
    if (nn > both) {
      T rest = 0;
      softmax_step<true, false, false, false>(xn + both, rest, xn, T(0), yk, sk, yk, T(0),
                                              nn - both);
      mn = std::max(mn, rest);
    }
    if (n > both) {
      T rest = 0;
      if (yk != nullptr)
        softmax_step<false, true, true, false>(xk, mk, xk + both, m, yk + both, rest, yk, T(0),
                                               n - both);
      else
        softmax_step<false, true, false, false>(xk, mk, xk + both, m, yk, rest, yk, T(0), n - both);
      sum += rest;
    }
    s += sum;
    mk = mn;
    chunk_max[k] = m;
  }
  done(row, m, s);
  if (y == nullptr) return;
  const T f = scale / s;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t n = width(k);
    const T fk = chunk_max[k] == m ? f : f * vexp_nonpositive(chunk_max[k] - m);
    T* yk = y + k * chunk;
#pragma GCC ivdep
    for (int64_t c = 0; c < n; ++c) yk[c] *= fk;
  }
}

}  // namespace detail

// For rows [0, rows) of x (row-major, cols wide): y = scale * softmax(x) when y is not
// null (y may be x), and done(row, max, sum of exp(x - max)) once per row, in row order,
// before the row's y is final. One read of x from memory, one exp per element.
template <class T, class Done>
void softmax_rows(const T* x, T* y, T scale, int64_t rows, int64_t cols, Done&& done) {
  if (rows <= 0) return;
  if (cols <= kSoftmaxPipelineCols) {
    if (y != nullptr)
      detail::softmax_rows_pipelined<true>(x, y, scale, rows, cols, done);
    else
      detail::softmax_rows_pipelined<false>(x, y, scale, rows, cols, done);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    detail::softmax_row_chunked(x + r * cols, y != nullptr ? y + r * cols : nullptr, scale, r, cols,
                                done);
}

}  // namespace baton::kernels::cpu
