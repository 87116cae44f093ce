// Embedding lookup over a slice of table rows (the vocabulary-parallel form) and its
// backward, a scatter-add into the table.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {

template <class T, class I>
void embedding_forward(const I* ids, const T* table, int64_t table_rows, int64_t row_offset, T* out,
                       int64_t n, int64_t cols, bool accumulate) {
  parallel_for(n, row_grain(cols), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = int64_t(ids[i]) - row_offset;
      T* o = out + i * cols;
      if (r >= 0 && r < table_rows) {
        const T* src = table + r * cols;
        if (accumulate) {
#pragma GCC ivdep
          for (int64_t c = 0; c < cols; ++c) o[c] += src[c];
        } else {
          std::copy(src, src + cols, o);
        }
      } else if (!accumulate) {
        std::fill(o, o + cols, T(0));
      }
    }
  });
}

// Rows repeat among the ids, so threads split the columns instead of the ids: no races,
// and every table element sums its contributions in id order whatever the thread count.
template <class T, class I>
void embedding_backward(const I* ids, const T* dout, int64_t table_rows, int64_t row_offset,
                        T* dtable, int64_t n, int64_t cols, int64_t padding_idx) {
  const int64_t grain = row_grain(n, 16);
  parallel_for(cols, grain, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t i = 0; i < n; ++i) {
      if (int64_t(ids[i]) == padding_idx) continue;
      const int64_t r = int64_t(ids[i]) - row_offset;
      if (r < 0 || r >= table_rows) continue;
      T* dst = dtable + r * cols + c0;
      const T* src = dout + i * cols + c0;
#pragma GCC ivdep
      for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
    }
  });
}

#define BATON_INSTANTIATE(T, I)                                                             \
  template void embedding_forward<T, I>(const I*, const T*, int64_t, int64_t, T*, int64_t,  \
                                        int64_t, bool);                                     \
  template void embedding_backward<T, I>(const I*, const T*, int64_t, int64_t, T*, int64_t, \
                                         int64_t, int64_t);
BATON_INSTANTIATE(float, int32_t)
BATON_INSTANTIATE(float, int64_t)
BATON_INSTANTIATE(double, int32_t)
BATON_INSTANTIATE(double, int64_t)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
