// Column sums of a [rows, cols] matrix of per-element values (bias and LayerNorm weight
// gradients): blocks of 32 columns x 8 row lanes write per-slice partial sums in f32,
// and a second kernel adds the slices in a fixed order, so results are deterministic.
#pragma once

#include "kernels/cuda/common.cuh"

namespace baton::kernels::cuda {

// F(row, col, float out[kOut]) gives the kOut values of one element.
template <int kOut, class F>
__global__ void colsum_partial(F f, int64_t rows, int64_t cols, float* partial) {
  __shared__ float acc[kOut][8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s[kOut] = {};
  if (c < cols) {
    // kRows of this thread's rows are read before any is added, so their loads are in
    // flight together (one at a time, GPT-2 124M's 48 bias gradients took 1.16 ms of its
    // step on the H200, about 1.2 TB/s); they are added in row order, as before.
    constexpr int kRows = 4;
    const int64_t stride = int64_t(gridDim.y) * 8;
    for (int64_t r0 = int64_t(blockIdx.y) * 8 + threadIdx.y; r0 < rows; r0 += kRows * stride) {
      float v[kRows][kOut];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t r = r0 + u * stride;
        if (r < rows) {
          f(r, c, v[u]);
        } else {
#pragma unroll
          for (int o = 0; o < kOut; ++o) v[u][o] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        if (r0 + u * stride >= rows) break;
#pragma unroll
        for (int o = 0; o < kOut; ++o) s[o] += v[u][o];
      }
    }
  }
#pragma unroll
  for (int o = 0; o < kOut; ++o) acc[o][threadIdx.y][threadIdx.x] = s[o];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      float t = 0;
      for (int y = 0; y < 8; ++y) t += acc[o][y][threadIdx.x];
      partial[(int64_t(o) * gridDim.y + blockIdx.y) * cols + c] = t;
    }
  }
}

template <class S>
__global__ void colsum_finish(const float* partial, int slices, int64_t cols, S* out,
                              bool accumulate) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float t = 0;
  for (int s = 0; s < slices; ++s) t += partial[int64_t(s) * cols + c];
  out[c] = from_f<S>(accumulate ? to_f<S>(out[c]) + t : t);
}

inline int colsum_slices(int64_t rows, int64_t cols) {
  const int64_t col_blocks = (cols + 31) / 32;
  // Enough blocks to fill the GPU (a few hundred), each with at least 64 rows.
  int64_t s = std::min<int64_t>((rows + 63) / 64, std::max<int64_t>(1, 1024 / col_blocks));
  return int(std::clamp<int64_t>(s, 1, 256));
}

// Runs the partial kernel; returns the partial buffer ([kOut, slices, cols] f32).
template <int kOut, class F>
Tensor colsum_run(F f, int64_t rows, int64_t cols, int slices, const Launch& l) {
  Tensor partial = scratch({kOut, slices, cols}, DType::f32, l.device);
  dim3 grid(unsigned((cols + 31) / 32), unsigned(slices)), block(32, 8);
  colsum_partial<kOut><<<grid, block, 0, l.stream>>>(f, rows, cols, partial.data<float>());
  BATON_CUDA_CHECK_LAUNCH();
  return partial;
}

template <class S>
void colsum_store(const Tensor& partial, int index, int slices, int64_t cols, Tensor& out,
                  bool accumulate, const Launch& l) {
  const float* p = partial.data<float>() + int64_t(index) * slices * cols;
  colsum_finish<S><<<grid_for(cols, 256), 256, 0, l.stream>>>(
      p, slices, cols, static_cast<S*>(out.raw_data()), accumulate);
  BATON_CUDA_CHECK_LAUNCH();
}

}  // namespace baton::kernels::cuda
