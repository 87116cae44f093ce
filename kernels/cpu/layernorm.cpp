// LayerNorm over the last dimension: forward saves mean and 1/std per row; backward
// splits into the input gradient (per row) and the weight/bias gradients (column sums).
// The residual-fused form (add_layernorm_*) adds each row just before its first pass and
// runs the same row code.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

namespace {

// One step of the forward's row pipeline, over the columns: the sum of row a (for its
// mean), the squared deviations of row b from its mean mb (two passes, so no cancellation
// as in E[x^2] - E[x]^2), and row c normalised. Each stage is the arithmetic of the plain
// three-pass row in every instantiation, so the results do not depend on where a row
// falls in the pipeline (nor on the thread count).
template <bool kSum, bool kVar, bool kNorm, class T>
inline std::pair<T, T> layernorm_step(const T* xa, const T* xb, T mb, const T* xc, T mc, T rc,
                                      const T* w, const T* bias, T* yc, int64_t cols) {
  return sum2_of<T>(cols, [&]<class V>(V, int64_t c) {
    V sum{}, sq{};
    if constexpr (kSum) sum = load_as<V>(xa + c);
    if constexpr (kVar) {
      const V d = load_as<V>(xb + c) - mb;
      sq = d * d;
    }
    if constexpr (kNorm)
      store_as<V>(yc + c,
                  (load_as<V>(xc + c) - mc) * rc * load_as<V>(w + c) + load_as<V>(bias + c));
    return std::pair<V, V>{sum, sq};
  });
}

// Rows [0, rows) in a pipeline: step i sums row i, takes the deviations of row i - kLag
// and normalises row i - 2 kLag, so each row is read from memory once (the later passes
// find it in L1) and the reductions' latencies overlap other rows' work instead of
// stalling between one row's passes. A lag of 2 rather than 1 leaves a whole step between
// a row's mean (or rstd) and its use: 1.1-1.25x at 256 columns (docs/kernels.md). With x2 the rows
// are the sums s = x + x2, each written just before its first step (and read back from L1): the
// steps are then the plain form's own code, so fused and unfused give the same bits by construction
// (the add inside the step let the compiler contract the tails differently: 1 ulp of rstd).
template <class T>
void layernorm_rows(const T* x, const T* x2, T* s, const T* w, const T* b, double eps, T* y,
                    T* mean, T* rstd, int64_t rows, int64_t cols) {
  if (rows <= 0) return;
  const T* src = x2 != nullptr ? s : x;
  constexpr int64_t kLag = 2;
  for (int64_t i = 0; i < rows + 2 * kLag; ++i) {
    const bool sum = i < rows, var = i >= kLag && i - kLag < rows, norm = i >= 2 * kLag;
    const int64_t ra = sum ? i : 0, rb = var ? i - kLag : 0, rc = norm ? i - 2 * kLag : 0;
    if (sum && x2 != nullptr) {
      const T* xr = x + ra * cols;
      const T* x2r = x2 + ra * cols;
      T* sr = s + ra * cols;
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) sr[c] = xr[c] + x2r[c];
    }
    const T* xa = src + ra * cols;
    const T* xb = src + rb * cols;
    const T* xc = src + rc * cols;
    T* yc = y + rc * cols;
    const T mb = var ? mean[rb] : T(0), mc = norm ? mean[rc] : T(0), sc = norm ? rstd[rc] : T(0);
    std::pair<T, T> r;
    if (sum && var && norm)
      r = layernorm_step<true, true, true>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    else if (sum && var)
      r = layernorm_step<true, true, false>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    else if (sum)
      r = layernorm_step<true, false, false>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    else if (var && norm)
      r = layernorm_step<false, true, true>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    else if (var)
      r = layernorm_step<false, true, false>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    else
      r = layernorm_step<false, false, true>(xa, xb, mb, xc, mc, sc, w, b, yc, cols);
    if (sum) mean[i] = r.first / T(cols);
    if (var) rstd[rb] = T(1) / std::sqrt(r.second / T(cols) + T(eps));
    if (var && !std::isfinite(r.second) && std::isfinite(mb)) {
      // A finite row whose squared deviations overflow T (f32: deviations beyond about
      // 1.8e19): its variance again in double, so rstd is the small number it is (0 had
      // normalised the row to the bias alone, a fabricated finite loss).
      double s2 = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double d = double(xb[c]) - double(mb);
        s2 += d * d;
      }
      rstd[rb] = T(1.0 / std::sqrt(s2 / double(cols) + eps));
    }
  }
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
    const int64_t o = r0 * cols;
    layernorm_rows<T>(x + o, nullptr, nullptr, w, b, eps, y + o, mean + r0, rstd + r0, r1 - r0,
                      cols);
  });
}

// s = a + b, then LayerNorm of s: each row's add just before the pipeline's first pass
// over it, so s is written once and the norm's passes read it from L1.
template <class T>
void add_layernorm_forward(const T* a, const T* b, const T* w, const T* bias, double eps, T* s,
                           T* y, T* mean, T* rstd, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(2 * cols), [&](int64_t r0, int64_t r1) {
    const int64_t o = r0 * cols;
    layernorm_rows<T>(a + o, b + o, s + o, w, bias, eps, y + o, mean + r0, rstd + r0, r1 - r0,
                      cols);
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

// Column sums over rows (column_sums.h: the same bits on any number of threads).
template <class T>
void layernorm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                               int64_t rows, int64_t cols, bool accumulate) {
  column_sums<T, 2>(rows, cols, {dw, db}, accumulate, [&](int64_t r, const std::array<T*, 2>& acc) {
    const T* dyr = dy + r * cols;
    const T* xr = x + r * cols;
    const T mu = mean[r], rs = rstd[r];
    if (dw != nullptr) {
      T* a = acc[0];
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) a[c] += dyr[c] * (xr[c] - mu) * rs;
    }
    if (db != nullptr) {
      T* a = acc[1];
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) a[c] += dyr[c];
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
