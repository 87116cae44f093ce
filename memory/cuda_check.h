// BATON_CUDA_CHECK: every CUDA runtime call goes through it, so a failure names the file,
// the line, the call and CUDA's own message. Included only by code built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "memory/error.h"

namespace baton::memory::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                     " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace baton::memory::cuda

#define BATON_CUDA_CHECK(call)                                                             \
  do {                                                                                     \
    cudaError_t baton_cuda_err_ = (call);                                                  \
    if (baton_cuda_err_ != cudaSuccess)                                                    \
      ::baton::memory::cuda::throw_cuda_error(baton_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch errors (bad configuration, no kernel image for the device).
#define BATON_CUDA_CHECK_LAUNCH() BATON_CUDA_CHECK(cudaGetLastError())
