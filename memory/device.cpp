#include "memory/device.h"

#include <charconv>

#include "memory/error.h"

namespace baton::memory {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view text, std::string_view what) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int idx = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), idx);
    if (ec == std::errc() && p == num.data() + num.size() && idx >= 0) return Device::cuda(idx);
  }
  throw InputError(std::string(what) + ": expected cpu, cuda or cuda:N, found '" +
                   std::string(text) + "'");
}

}  // namespace baton::memory
