// Log lines from the CUDA backend's host code: nvcc cannot compile spdlog's compile-time
// format checks, so the .cu files log through these, compiled by the host compiler.
#pragma once
#include <string>

namespace baton::kernels::cuda {

void log_warning(const std::string& line);

}  // namespace baton::kernels::cuda
