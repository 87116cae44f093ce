#include "memory/device_budget.h"

#include <fstream>
#include <sstream>

#include "memory/allocator.h"
#include "memory/cuda_device.h"
#include "memory/error.h"
#include "memory/units.h"

namespace baton::memory {

DeviceMemoryInfo parse_meminfo(std::string_view text) {
  DeviceMemoryInfo info;
  info.name = "host";
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key, unit;
    size_t value = 0;
    if (!(l >> key >> value)) continue;
    l >> unit;
    const size_t scale = unit == "kB" ? 1024 : 1;
    if (key == "MemTotal:") info.total = value * scale;
    if (key == "MemAvailable:") info.free = value * scale;
  }
  return info;
}

DeviceMemoryInfo device_memory_info(Device device) {
  if (device.is_cuda()) {
    auto [total, free] = cuda::memory_info(device.index);
    return {total, free, cuda::device_name(device.index)};
  }
  std::ifstream f("/proc/meminfo");
  std::stringstream text;
  text << f.rdbuf();
  return parse_meminfo(text.str());
}

void check_memory_budget(Device device, size_t wanted, const DeviceMemoryInfo& info,
                         const std::string& what) {
  if (wanted <= info.free) return;
  throw RuntimeError(what + " asks for " + format_bytes(double(wanted)) + " on " + device.str() +
                     " (" + info.name + "), which has " + format_bytes(double(info.free)) +
                     " free of " + format_bytes(double(info.total)) +
                     ": lower it, or free the device (another process may be using it)");
}

void reserve_device_memory(Device device, size_t wanted, const std::string& what) {
  if (wanted == 0) return;
  check_memory_budget(device, wanted, device_memory_info(device), what);
  allocator_for(device).set_capacity(wanted);
}

}  // namespace baton::memory
