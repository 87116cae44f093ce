// Row-wise softmax over the last dimension, forward and backward.
#include <algorithm>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

// Rows cost about four element-steps per column (the exp and the passes around it).
template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(4 * cols), [&](int64_t r0, int64_t r1) {
    softmax_rows(x + r0 * cols, y + r0 * cols, T(1), r1 - r0, cols, [](int64_t, T, T) {});
  });
}

// dx = y (dy - sum(dy y)).
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool accumulate) {
  parallel_for(rows, row_grain(4 * cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* yr = y + r * cols;
      const T* dyr = dy + r * cols;
      T* dxr = dx + r * cols;
      const T s = sum_of<T>(
          cols, [&]<class V>(V, int64_t c) { return load_as<V>(dyr + c) * load_as<V>(yr + c); });
      if (accumulate) {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c) dxr[c] += yr[c] * (dyr[c] - s);
      } else {
#pragma GCC ivdep
        for (int64_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - s);
      }
    }
  });
}

#define BATON_INSTANTIATE(T)                                        \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t); \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
