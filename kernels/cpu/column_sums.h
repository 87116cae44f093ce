// Column sums over rows (bias, LayerNorm and RMSNorm weight gradients), the same bits on
// any number of threads.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {

// Rows per block of column_sums.
inline constexpr int64_t kColumnSumRows = 128;

// out[k][c] (+)= the sum over rows r of row r's contribution to column c of output k.
// add_row(r, acc) adds row r's contributions to all `cols` columns into acc[0..K).
// The rows go in fixed blocks of kColumnSumRows, each summed in row order into a partial
// of its own; the partials are then added in block order. Blocks run on the threads, so
// each thread streams whole rows: split by columns instead (each thread reading half of
// every row), two threads ran LayerNorm's weight gradient 2x slower than one inside a
// training step.
template <class T, size_t K, class AddRow>
void column_sums(int64_t rows, int64_t cols, const std::array<T*, K>& out, bool accumulate,
                 AddRow&& add_row) {
  if (cols <= 0) return;
  const int64_t blocks = std::max<int64_t>(1, (rows + kColumnSumRows - 1) / kColumnSumRows);
  const int64_t stride = int64_t(K) * cols;
  // Per calling thread, reused across calls (the workers only write into it).
  thread_local std::vector<T> partials;
  if (partials.size() < size_t(blocks * stride)) partials.resize(size_t(blocks * stride));
  T* base = partials.data();
  // Contiguous runs of blocks per thread: each streams one part of the rows.
  parallel_for(blocks, row_grain(kColumnSumRows * cols), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      std::array<T*, K> acc;
      for (size_t k = 0; k < K; ++k) acc[k] = base + b * stride + int64_t(k) * cols;
      std::fill(acc[0], acc[0] + stride, T(0));
      const int64_t r1 = std::min(rows, (b + 1) * kColumnSumRows);
      for (int64_t r = b * kColumnSumRows; r < r1; ++r) add_row(r, acc);
    }
  });
  // A few blocks' partials, on the calling thread: no fork is worth it.
  for (size_t k = 0; k < K; ++k) {
    T* o = out[k];
    if (o == nullptr) continue;
    T* sum = base + int64_t(k) * cols;
    for (int64_t b = 1; b < blocks; ++b) {
      const T* p = base + b * stride + int64_t(k) * cols;
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) sum[c] += p[c];
    }
    if (accumulate) {
#pragma GCC ivdep
      for (int64_t c = 0; c < cols; ++c) o[c] += sum[c];
    } else {
      std::copy(sum, sum + cols, o);
    }
  }
}

}  // namespace baton::kernels::cpu
