#include "kernels/cuda/host_log.h"

#include <spdlog/spdlog.h>

namespace baton::kernels::cuda {

void log_warning(const std::string& line) {
  spdlog::warn("{}", line);
}

}  // namespace baton::kernels::cuda
