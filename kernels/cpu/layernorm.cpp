// LayerNorm over the last dimension: forward saves mean and 1/std per row; backward
// splits into the input gradient (per row) and the weight/bias gradients (column sums).
// The residual-fused form (add_layernorm_*) adds first and runs the same row code.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

namespace {

// One row: mean, 1/std and y; shared by the plain and the residual-fused forward, so
// both give the same bits.
template <class T>
inline void layernorm_row(const T* xr, const T* w, const T* b, double eps, T* yr, T* mean, T* rstd,
                          int64_t cols) {
  const T mu = sum_of<T>(cols, [&]<class V>(V, int64_t c) { return load_as<V>(xr + c); }) / T(cols);
  // Two passes over a row in cache: no cancellation as in E[x^2] - E[x]^2.
  const T v = sum_of<T>(cols, [&]<class V>(V, int64_t c) {
    const V d = load_as<V>(xr + c) - mu;
    return d * d;
  });
  const T rs = T(1) / std::sqrt(v / T(cols) + T(eps));
#pragma GCC ivdep
  for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * w[c] + b[c];
  *mean = mu;
  *rstd = rs;
}

// One row of the input gradient: dx = base + rstd (g - mean(g) - xhat mean(g xhat)),
// base = dx itself (accumulate), another gradient (the residual's) or nothing.
template <class T>
inline void layernorm_backward_row(const T* dyr, const T* xr, const T* w, T mu, T rs, const T* base,
                                   T* dxr, int64_t cols) {
  const auto [sg, sgx] = sum2_of<T>(cols, [&]<class V>(V, int64_t c) {
    const V g = load_as<V>(dyr + c) * load_as<V>(w + c);
    return std::pair<V, V>{g, g * (load_as<V>(xr + c) - mu) * rs};
  });
  const T mg = sg / T(cols), mgx = sgx / T(cols);
  if (base != nullptr) {
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c)
      dxr[c] = base[c] + rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
  } else {
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) dxr[c] = rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
  }
}

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, double eps, T* y, T* mean, T* rstd,
                       int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      layernorm_row(x + r * cols, w, b, eps, y + r * cols, mean + r, rstd + r, cols);
  });
}

// s = a + b, then LayerNorm of s: the residual add and the norm in one pass per row (the
// row is still in L1 when the norm reads it).
template <class T>
void add_layernorm_forward(const T* a, const T* b, const T* w, const T* bias, double eps, T* s,
                           T* y, T* mean, T* rstd, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(2 * cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* ar = a + r * cols;
      const T* br = b + r * cols;
      T* sr = s + r * cols;
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) sr[c] = ar[c] + br[c];
      layernorm_row(sr, w, bias, eps, y + r * cols, mean + r, rstd + r, cols);
    }
  });
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                              T* dx, int64_t rows, int64_t cols, bool accumulate) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* dxr = dx + r * cols;
      layernorm_backward_row(dy + r * cols, x + r * cols, w, mean[r], rstd[r],
                             accumulate ? dxr : nullptr, dxr, cols);
    }
  });
}

// The gradient of s = a + b (both inputs get it): ds (the residual's gradient, or null)
// plus LayerNorm's, in one pass.
template <class T>
void add_layernorm_backward_input(const T* dy, const T* ds, const T* s, const T* w, const T* mean,
                                  const T* rstd, T* dx, int64_t rows, int64_t cols,
                                  bool accumulate) {
  parallel_for(rows, row_grain(2 * cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* dxr = dx + r * cols;
      const T* dsr = ds != nullptr ? ds + r * cols : nullptr;
      if (accumulate && dsr != nullptr) {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c) dxr[c] += dsr[c];
      }
      layernorm_backward_row(dy + r * cols, s + r * cols, w, mean[r], rstd[r],
                             accumulate ? dxr : dsr, dxr, cols);
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
                                             int64_t, int64_t, bool);                             \
  template void add_layernorm_forward<T>(const T*, const T*, const T*, const T*, double, T*, T*,  \
                                         T*, T*, int64_t, int64_t);                               \
  template void add_layernorm_backward_input<T>(const T*, const T*, const T*, const T*, const T*, \
                                                const T*, T*, int64_t, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
