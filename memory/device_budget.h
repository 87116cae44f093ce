// A device's memory as a budget: what it has free now, a check of what a run asks for
// against it (the plan's device_memory, --device-memory) with an error that says both,
// and the cap that makes the device's allocator hold the run to it (so "beyond one
// device's memory" shows on one large GPU as on the CPU). For the engine to call at start.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "memory/device.h"

namespace baton::memory {

struct DeviceMemoryInfo {
  size_t total = 0;
  size_t free = 0;
  std::string name;  // "NVIDIA H200", "host"
};

// CUDA: cudaMemGetInfo and the device's name; CPU: MemTotal and MemAvailable of
// /proc/meminfo. Throws RuntimeError for a CUDA device that is not there.
DeviceMemoryInfo device_memory_info(Device device);

// MemTotal and MemAvailable (bytes) from /proc/meminfo's text; zeros when absent.
DeviceMemoryInfo parse_meminfo(std::string_view text);

// Throws RuntimeError when `wanted` is more than `info.free`, naming the device, `what`
// asked for it ("plan.json's device_memory", "--device-memory") and both sizes.
void check_memory_budget(Device device, size_t wanted, const DeviceMemoryInfo& info,
                         const std::string& what);

// Checks `wanted` against the device's free memory now, then caps the device's
// allocator at it (allocator_for(device).set_capacity). wanted 0: no cap, no check.
void reserve_device_memory(Device device, size_t wanted, const std::string& what);

}  // namespace baton::memory
