// Where the elements of a contiguous local block sit in its logical tensor, as runs of
// consecutive logical indices; used by the counter-based random ops (dropout, normals),
// whose values depend on the logical index only.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {

// At most this many dimensions in a block of a logical tensor (kernels::Block).
constexpr int kMaxBlockRank = 8;

struct BlockRuns {
  int64_t runs = 1, run_length = 0;
  int outer_rank = 0;  // the local dims above the run, outermost first:
  std::array<int64_t, kMaxBlockRank> outer_shape{};    // their sizes
  std::array<int64_t, kMaxBlockRank> outer_strides{};  // and strides in the logical tensor
  int64_t base = 0;                                    // logical index of the block's first element

  int64_t numel() const { return runs * run_length; }
  int64_t run_start(int64_t r) const {  // logical index of run r's first element
    int64_t idx = base;
    for (int d = outer_rank; d-- > 0;) {
      idx += (r % outer_shape[size_t(d)]) * outer_strides[size_t(d)];
      r /= outer_shape[size_t(d)];
    }
    return idx;
  }
};

// global_shape empty: the block is the whole tensor. Shapes are checked by the caller
// (rank at most kMaxBlockRank when global_shape is given). Allocates nothing.
BlockRuns block_runs(const std::vector<int64_t>& local_shape,
                     const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets);

// Calls f(local_first, logical_first, length) over pieces that cover the block once,
// in parallel (pieces of at least `grain` elements per thread).
template <class F>
void for_each_piece(const BlockRuns& br, int64_t grain, F&& f) {
  const int64_t len = br.run_length;
  if (len == 0) return;
  parallel_for(br.numel(), grain, [&](int64_t b, int64_t e) {
    int64_t r = b / len, o = b % len;
    while (b < e) {
      const int64_t n = std::min(len - o, e - b);
      f(b, br.run_start(r) + o, n);
      b += n;
      ++r;
      o = 0;
    }
  });
}

}  // namespace baton::kernels::cpu
