// Shared pieces of the CUDA kernels: element types and their float conversions, dtype
// dispatch, the launch context of an op (device, stream), warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "memory/cuda_check.h"
#include "memory/cuda_device.h"
#include "memory/tensor.h"

namespace baton::kernels::cuda {

using memory::DType;
using memory::Tensor;
using bf16 = __nv_bfloat16;
using f16 = __half;

// ---- element conversions: every kernel computes in float ----
template <class T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f<bf16>(bf16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f<f16>(f16 v) {
  return __half2float(v);
}

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ f16 from_f<f16>(float v) {
  return __float2half_rn(v);
}

// ---- checks ----
[[noreturn]] void fail(const std::string& op, const std::string& what);
inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) fail(op, what);
}
// The tensor is defined, contiguous and on a CUDA device.
void require_cuda(const char* op, const char* name, const Tensor& t);
bool is_float16ish(DType t);  // bf16 or f16
bool is_cuda_float(DType t);  // f32, bf16 or f16

// ---- dtype dispatch: runs the body with T bound to the element type ----
#define BATON_CUDA_DISPATCH(OP, DTYPE, T, ...)                                               \
  switch (DTYPE) {                                                                           \
    case ::baton::memory::DType::f32: {                                                      \
      using T = float;                                                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::baton::memory::DType::bf16: {                                                     \
      using T = ::baton::kernels::cuda::bf16;                                                \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::baton::memory::DType::f16: {                                                      \
      using T = ::baton::kernels::cuda::f16;                                                 \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    default:                                                                                 \
      ::baton::kernels::cuda::fail(OP, std::string("unsupported dtype ") +                   \
                                           std::string(::baton::memory::dtype_name(DTYPE)) + \
                                           " (CUDA kernels take f32, bf16, f16)");           \
  }

// A second element type, f32 or the same as T (already bound): statistics, accumulators
// and master copies kept in f32 beside bf16/f16 activations.
#define BATON_CUDA_SECOND(OP, DT1, DT2, T, S, ...)                                        \
  if ((DT2) == ::baton::memory::DType::f32) {                                             \
    using S = float;                                                                      \
    __VA_ARGS__;                                                                          \
  } else if ((DT2) == (DT1)) {                                                            \
    using S = T;                                                                          \
    __VA_ARGS__;                                                                          \
  } else {                                                                                \
    ::baton::kernels::cuda::fail(                                                         \
        OP, "dtype " + std::string(::baton::memory::dtype_name(DT2)) + " where f32 or " + \
                std::string(::baton::memory::dtype_name(DT1)) + " was expected");         \
  }

#define BATON_CUDA_DISPATCH2(OP, DT1, DT2, T, S, ...) \
  BATON_CUDA_DISPATCH(OP, DT1, T, BATON_CUDA_SECOND(OP, DT1, DT2, T, S, __VA_ARGS__))

// Ids: i32 or i64.
#define BATON_CUDA_DISPATCH_ID(OP, DTYPE, I, ...)                 \
  switch (DTYPE) {                                                \
    case ::baton::memory::DType::i32: {                           \
      using I = int32_t;                                          \
      __VA_ARGS__;                                                \
      break;                                                      \
    }                                                             \
    case ::baton::memory::DType::i64: {                           \
      using I = int64_t;                                          \
      __VA_ARGS__;                                                \
      break;                                                      \
    }                                                             \
    default:                                                      \
      ::baton::kernels::cuda::fail(OP, "ids must be i32 or i64"); \
  }

// ---- launch context ----
// Sets the tensor's device for the op and gives the calling thread's current stream.
struct Launch {
  explicit Launch(const Tensor& t);
  memory::cuda::DeviceGuard guard;
  int device;
  cudaStream_t stream;
};

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(b, 1, 65536));
}

// A device scratch tensor from the caching allocator (freed back in stream order).
Tensor scratch(const memory::Shape& shape, DType dtype, int device);

// ---- kPack elements per thread where the memory allows ----
// A thread moves kPack consecutive elements with 16-byte loads and stores when every
// tensor's pointer is 16-byte aligned and the count is a multiple of kPack (a bias's or
// a row's columns too); views at other offsets and other sizes take one element per
// thread. With one 2-byte element per thread GPT-2's bf16 GELU moved 1.3 TB/s on the H200,
// whose copy rate is 4.3, and a LayerNorm backward waited on 24 loads per lane and row.
constexpr int kPack = 8;

inline bool packable(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % kPack != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <class T>
__device__ __forceinline__ void load_pack(const T* p, float (&v)[kPack]) {
  constexpr int per = 16 / int(sizeof(T));
#pragma unroll
  for (int w = 0; w < kPack / per; ++w) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[w];
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int k = 0; k < per; ++k) v[w * per + k] = to_f(e[k]);
  }
}

template <class T>
__device__ __forceinline__ void store_pack(T* p, const float (&v)[kPack]) {
  constexpr int per = 16 / int(sizeof(T));
#pragma unroll
  for (int w = 0; w < kPack / per; ++w) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int k = 0; k < per; ++k) e[k] = from_f<T>(v[w * per + k]);
    reinterpret_cast<uint4*>(p)[w] = u;
  }
}

// ---- reductions ----
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread of the block gets the result; blockDim.x a multiple of 32, at most 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < int(blockDim.x >> 5) ? part[lane] : 0.f;
    x = warp_sum(x);
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < int(blockDim.x >> 5) ? part[lane] : -INFINITY;
    x = warp_max(x);
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}

// ---- where a local block sits in its logical tensor (dropout, random init) ----
// The logical index of local element l: its coordinates in the local shape, shifted by
// the offsets, in the row-major order of the global shape.
struct BlockMap {
  static constexpr int kMaxDims = 8;
  int dims = 0;  // 0: the local tensor is the whole logical tensor
  int64_t local[kMaxDims];
  int64_t gstride[kMaxDims];
  int64_t base = 0;
  __device__ __forceinline__ uint64_t logical(int64_t l) const {
    if (dims == 0) return uint64_t(l);
    int64_t idx = base;
    for (int d = dims - 1; d >= 0; --d) {
      idx += (l % local[d]) * gstride[d];
      l /= local[d];
    }
    return uint64_t(idx);
  }
};
BlockMap block_map(const memory::Shape& local_shape, const std::vector<int64_t>& global_shape,
                   const std::vector<int64_t>& offsets, const char* op);

}  // namespace baton::kernels::cuda
