// cuBLAS and cuBLASLt inside the CUDA backend: checked calls, a handle per thread and
// device, and the strided-batched GEMM every matrix product goes through.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "kernels/cuda/common.cuh"

namespace baton::kernels::cuda {

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line);

#define BATON_CUBLAS_CHECK(call)                                                               \
  do {                                                                                         \
    cublasStatus_t baton_cublas_st_ = (call);                                                  \
    if (baton_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::baton::kernels::cuda::throw_cublas_error(baton_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

cudaDataType_t cuda_type(DType t, const char* op);

// Row-major C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for b < batch, with leading
// dimensions and batch strides in elements (stride 0: one matrix shared by every batch).
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  DType ab_type = DType::f32, c_type = DType::f32;
  float alpha = 1.f, beta = 0.f;
};
void gemm(const Gemm& g, const Launch& l, const char* op);

}  // namespace baton::kernels::cuda
