// Elementwise arithmetic: residual adds, scaling, bias add and its backward (column sums).
// Memory-bound loops, vectorised by the compiler, threaded only for large tensors.
#include <algorithm>

#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {

template <class T>
void add(const T* a, const T* b, T* out, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

template <class T>
void add_inplace(T* acc, const T* x, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) acc[i] += x[i];
  });
}

template <class T>
void scale_inplace(T* t, T s, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) t[i] *= s;
  });
}

template <class T>
void bias_add_inplace(T* y, const T* bias, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* row = y + r * cols;
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    }
  });
}

// Column sums (column_sums.h: the same bits on any number of threads).
template <class T>
void bias_backward(const T* dy, T* dbias, int64_t rows, int64_t cols, bool accumulate) {
  column_sums<T, 1>(rows, cols, {dbias}, accumulate, [&](int64_t r, const std::array<T*, 1>& acc) {
    const T* row = dy + r * cols;
    T* a = acc[0];
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) a[c] += row[c];
  });
}

#define BATON_INSTANTIATE(T)                                         \
  template void add<T>(const T*, const T*, T*, int64_t);             \
  template void add_inplace<T>(T*, const T*, int64_t);               \
  template void scale_inplace<T>(T*, T, int64_t);                    \
  template void bias_add_inplace<T>(T*, const T*, int64_t, int64_t); \
  template void bias_backward<T>(const T*, T*, int64_t, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
