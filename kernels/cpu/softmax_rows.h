// The row loop shared by softmax_forward and the single-device cross-entropy: each row is
// read from memory once and each element's exp computed once (docs/kernels.md, "Row-wise
// kernels in one pass").
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

// Rows up to this many elements run three at a time (a few KB each stay in L1).
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
  vec<T> amax = splat(-std::numeric_limits<T>::infinity()), asum{};
  int64_t c = 0;
  for (; c + L <= cols; c += L) {
    if constexpr (kMax) amax = vmax(amax, load(xa + c));
    if constexpr (kExp) {
      const vec<T> e = vexp(load(xb + c) - mb);
      if constexpr (kStore) store(yb + c, e);
      asum += e;
    }
    if constexpr (kScale) store(yc + c, load(yc + c) * fc);
  }
  T m = hmax(amax), s = hsum(asum);
  for (; c < cols; ++c) {
    if constexpr (kMax) m = m > xa[c] ? m : xa[c];
    if constexpr (kExp) {
      const T e = vexp(xb[c] - mb);
      if constexpr (kStore) yb[c] = e;
      s += e;
    }
    if constexpr (kScale) yc[c] *= fc;
  }
  if constexpr (kMax) ma = m;
  if constexpr (kExp) sb = s;
}

// Short rows in a software pipeline: step i takes the max of row i + 1, the exponentials
// of row i and scales row i - 1, so the max's and the sum's latencies overlap the exps of
// a neighbouring row instead of stalling between the passes of one row.
template <bool kStore, class T, class Done>
inline void softmax_rows_pipelined(const T* x, T* y, T scale, int64_t rows, int64_t cols,
                                   Done& done) {
  T m_next = 0, m_cur = 0, s = 0, f_prev = 0;
  T* y_prev = nullptr;
  detail::softmax_step<true, false, false, false>(x, m_next, x, T(0), y, s, y, T(0), cols);
  for (int64_t r = 0; r < rows; ++r) {
    m_cur = m_next;
    const T* xr = x + r * cols;
    T* yr = kStore ? y + r * cols : nullptr;
    const bool next = r + 1 < rows;
    if (next && y_prev != nullptr)
      softmax_step<true, true, kStore, true>(xr + cols, m_next, xr, m_cur, yr, s, y_prev, f_prev,
                                             cols);
    else if (next)
      softmax_step<true, true, kStore, false>(xr + cols, m_next, xr, m_cur, yr, s, yr, T(0), cols);
    else if (y_prev != nullptr)
      softmax_step<false, true, kStore, true>(xr, m_next, xr, m_cur, yr, s, y_prev, f_prev, cols);
    else
      softmax_step<false, true, kStore, false>(xr, m_next, xr, m_cur, yr, s, yr, T(0), cols);
    done(r, m_cur, s);
    if constexpr (kStore) {
      y_prev = yr;
      f_prev = scale / s;
    }
  }
  if constexpr (kStore) {
    if (y_prev != nullptr)
      softmax_step<false, false, false, true>(x, m_next, x, T(0), y, s, y_prev, f_prev, cols);
  }
}

// A long row in chunks that stay in L1: the chunk's max (the running sum rescaled when it
// raises the running max), then its exponentials against the running max; the stored
// chunks are scaled at the end by their own factor.
template <class T, class Done>
inline void softmax_row_chunked(const T* x, T* y, T scale, int64_t row, int64_t cols, Done& done) {
  constexpr int64_t L = kLanes<T>;
  const int64_t by_count = (cols + kSoftmaxMaxChunks - 1) / kSoftmaxMaxChunks;
  const int64_t chunk = std::max(kSoftmaxChunk, (by_count + L - 1) / L * L);
  T chunk_max[kSoftmaxMaxChunks];
  T m = -std::numeric_limits<T>::infinity(), s = 0;
  int64_t k = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += chunk, ++k) {
    const int64_t n = std::min(chunk, cols - c0);
    const T mk = std::max(m, reduce_max(x + c0, n));
    if (k > 0 && mk > m) s *= vexp(m - mk);
    m = mk;
    s += y != nullptr ? exp_shifted_sum(x + c0, m, y + c0, n) : exp_shifted_sum(x + c0, m, n);
    chunk_max[k] = m;
  }
  done(row, m, s);
  if (y == nullptr) return;
  const T f = scale / s;
  k = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += chunk, ++k) {
    const int64_t n = std::min(chunk, cols - c0);
    const T fk = chunk_max[k] == m ? f : f * vexp(chunk_max[k] - m);
    T* yk = y + c0;
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
