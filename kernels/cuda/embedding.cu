// Embedding lookup over a slice of table rows (the vocabulary-parallel form) and its
// backward: f32 (or bf16/f16) atomic adds into the table, since ids repeat.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace baton::kernels::cuda {

namespace {

template <class I, class W, class T>
__global__ void embed_fwd(const I* ids, const W* table, int64_t rows, int64_t offset, T* out,
                          int64_t n, int64_t cols, bool accumulate) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = int64_t(ids[i]) - offset;
    T* o = out + i * cols;
    const bool in = r >= 0 && r < rows;
    if (!in && accumulate) continue;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = in ? to_f(table[r * cols + c]) : 0.f;
      o[c] = from_f<T>(accumulate ? to_f(o[c]) + v : v);
    }
  }
}

__device__ __forceinline__ void atomic_add(float* p, float v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(bf16* p, float v) {
  atomicAdd(p, __float2bfloat16_rn(v));
}
__device__ __forceinline__ void atomic_add(f16* p, float v) {
  atomicAdd(p, __float2half_rn(v));
}

template <class I, class T, class W>
__global__ void embed_bwd(const I* ids, const T* dout, int64_t rows, int64_t offset, W* dtable,
                          int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = int64_t(ids[i]) - offset;
    if (r < 0 || r >= rows) continue;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      atomic_add(dtable + r * cols + c, to_f(dout[i * cols + c]));
  }
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, int64_t row_offset, Tensor& out,
                       bool accumulate) {
  const char* op = "embedding_forward";
  require_cuda(op, "ids", ids);
  require_cuda(op, "table", table);
  require_cuda(op, "out", out);
  require(table.dim() == 2 && out.numel() == ids.numel() * table.size(1), op,
          "ids [N], table [rows, C], out [N, C]");
  const int64_t n = ids.numel(), cols = table.size(1);
  if (n == 0 || cols == 0) return;
  Launch l(out);
  BATON_CUDA_DISPATCH_ID(
      op, ids.dtype(), I,
      BATON_CUDA_DISPATCH(op, table.dtype(), W, BATON_CUDA_DISPATCH(op, out.dtype(), T, {
                            embed_fwd<I, W, T><<<grid_for(n, 1), 256, 0, l.stream>>>(
                                static_cast<const I*>(ids.raw_data()),
                                static_cast<const W*>(table.raw_data()), table.size(0), row_offset,
                                static_cast<T*>(out.raw_data()), n, cols, accumulate);
                            BATON_CUDA_CHECK_LAUNCH();
                          })));
}

void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t row_offset, Tensor& dtable) {
  const char* op = "embedding_backward";
  require_cuda(op, "ids", ids);
  require_cuda(op, "dout", dout);
  require_cuda(op, "dtable", dtable);
  require(dtable.dim() == 2 && dout.numel() == ids.numel() * dtable.size(1), op,
          "ids [N], dout [N, C], dtable [rows, C]");
  const int64_t n = ids.numel(), cols = dtable.size(1);
  if (n == 0 || cols == 0) return;
  Launch l(dtable);
  BATON_CUDA_DISPATCH_ID(
      op, ids.dtype(), I, BATON_CUDA_DISPATCH2(op, dout.dtype(), dtable.dtype(), T, W, {
        embed_bwd<I, T, W><<<grid_for(n, 1), 256, 0, l.stream>>>(
            static_cast<const I*>(ids.raw_data()), static_cast<const T*>(dout.raw_data()),
            dtable.size(0), row_offset, static_cast<W*>(dtable.raw_data()), n, cols);
        BATON_CUDA_CHECK_LAUNCH();
      }));
}

}  // namespace baton::kernels::cuda
