// Devices: where a tensor's bytes live. CPU now; CUDA devices are named here so that
// every interface can already carry them.
#pragma once

#include <compare>
#include <string>
#include <string_view>

namespace baton::memory {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu" or "cuda:N"
  auto operator<=>(const Device&) const = default;
};

// "cpu", "cuda", "cuda:3"; throws InputError otherwise, naming `what` (the flag).
Device parse_device(std::string_view text, std::string_view what = "device");

}  // namespace baton::memory
