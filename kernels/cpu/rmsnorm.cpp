// RMSNorm over the last dimension (LLaMA's): y = weight * x / sqrt(mean(x^2) + eps).
// Forward saves 1/rms per row; backward splits into the input gradient (per row) and the
// weight gradient (column sums in row order, so it does not depend on the thread count).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

template <class T>
void rmsnorm_forward(const T* x, const T* w, double eps, T* y, T* rstd, int64_t rows,
                     int64_t cols) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      const T ms = sum_of<T>(cols,
                             [&]<class V>(V, int64_t c) {
                               const V v = load_as<V>(xr + c);
                               return v * v;
                             }) /
                   T(cols);
      const T rs = T(1) / std::sqrt(ms + T(eps));
      // Hugging Face's order: weight * (x * rstd).
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) yr[c] = w[c] * (xr[c] * rs);
      rstd[r] = rs;
    }
  });
}

// dx = rstd (g - x rstd^2 mean(g x)), g = dy w.
template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, const T* rstd, T* dx, int64_t rows,
                            int64_t cols, bool accumulate) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      T* dxr = dx + r * cols;
      const T rs = rstd[r];
      const T mgx = sum_of<T>(cols,
                              [&]<class V>(V, int64_t c) {
                                return load_as<V>(dyr + c) * load_as<V>(w + c) * load_as<V>(xr + c);
                              }) /
                    T(cols);
      const T k = rs * rs * mgx;
      if (accumulate) {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c) dxr[c] += rs * (dyr[c] * w[c] - xr[c] * k);
      } else {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c) dxr[c] = rs * (dyr[c] * w[c] - xr[c] * k);
      }
    }
  });
}

template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, const T* rstd, T* dw, int64_t rows,
                             int64_t cols, bool accumulate) {
  column_sums<T, 1>(rows, cols, {dw}, accumulate, [&](int64_t r, const std::array<T*, 1>& acc) {
    const T* dyr = dy + r * cols;
    const T* xr = x + r * cols;
    const T rs = rstd[r];
    T* a = acc[0];
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) a[c] += dyr[c] * (xr[c] * rs);
  });
}

#define BATON_INSTANTIATE(T)                                                                   \
  template void rmsnorm_forward<T>(const T*, const T*, double, T*, T*, int64_t, int64_t);      \
  template void rmsnorm_backward_input<T>(const T*, const T*, const T*, const T*, T*, int64_t, \
                                          int64_t, bool);                                      \
  template void rmsnorm_backward_weight<T>(const T*, const T*, const T*, T*, int64_t, int64_t, \
                                           bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
