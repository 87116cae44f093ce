// LayerNorm over the last dimension: forward saves mean and 1/std per row; backward
// splits into the input gradient (per row) and the weight/bias gradients (column sums).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, double eps, T* y, T* mean, T* rstd,
                       int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      const T mu = sum_of<T>(cols, [&](int64_t c) { return xr[c]; }) / T(cols);
      // Two passes over a row in cache: no cancellation as in E[x^2] - E[x]^2.
      const T v = sum_of<T>(cols, [&](int64_t c) { return (xr[c] - mu) * (xr[c] - mu); });
      const T rs = T(1) / std::sqrt(v / T(cols) + T(eps));
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * w[c] + b[c];
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                              T* dx, int64_t rows, int64_t cols, bool accumulate) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      T* dxr = dx + r * cols;
      const T mu = mean[r], rs = rstd[r];
      const auto [sg, sgx] = sum2_of<T>(cols, [&](int64_t c) {
        const T g = dyr[c] * w[c];
        return std::pair<T, T>{g, g * (xr[c] - mu) * rs};
      });
      const T mg = sg / T(cols), mgx = sgx / T(cols);
      if (accumulate) {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c)
          dxr[c] += rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
      } else {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c)
          dxr[c] = rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
      }
    }
  });
}

// Column sums over rows; threads split the columns and each column is summed in row
// order, so the result does not depend on the thread count.
template <class T>
void layernorm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                               int64_t rows, int64_t cols, bool accumulate) {
  const int64_t grain = row_grain(rows, 16);
  parallel_for(cols, grain, [&](int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    if (!accumulate) {
      if (dw != nullptr) std::fill(dw + c0, dw + c1, T(0));
      if (db != nullptr) std::fill(db + c0, db + c1, T(0));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T* dyr = dy + r * cols + c0;
      const T* xr = x + r * cols + c0;
      const T mu = mean[r], rs = rstd[r];
      if (dw != nullptr) {
        T* acc = dw + c0;
#pragma GCC ivdep
        for (int64_t c = 0; c < n; ++c) acc[c] += dyr[c] * (xr[c] - mu) * rs;
      }
      if (db != nullptr) {
        T* acc = db + c0;
#pragma GCC ivdep
        for (int64_t c = 0; c < n; ++c) acc[c] += dyr[c];
      }
    }
  });
}

#define BATON_INSTANTIATE(T)                                                                      \
  template void layernorm_forward<T>(const T*, const T*, const T*, double, T*, T*, T*, int64_t,   \
                                     int64_t);                                                    \
  template void layernorm_backward_input<T>(const T*, const T*, const T*, const T*, const T*, T*, \
                                            int64_t, int64_t, bool);                              \
  template void layernorm_backward_weight<T>(const T*, const T*, const T*, const T*, T*, T*,      \
                                             int64_t, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
