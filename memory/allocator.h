// Allocators: one per device, with byte accounting (in use, peak) and an optional
// capacity. The capacity is how baton tests "a model beyond one device's memory" without
// a GPU: an allocation past it throws OutOfMemoryError, as a full device would.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>

#include "memory/device.h"
#include "memory/error.h"

namespace baton::memory {

class OutOfMemoryError : public RuntimeError {
 public:
  OutOfMemoryError(Device device, size_t requested, size_t capacity, size_t in_use);
  Device device() const { return device_; }
  size_t requested() const { return requested_; }

 private:
  Device device_;
  size_t requested_;
};

struct MemoryStats {
  size_t in_use = 0;       // bytes handed out and not yet returned (rounded to the alignment)
  size_t peak = 0;         // the most in_use has been since the last reset_peak()
  size_t capacity = 0;     // 0: unlimited
  size_t cached = 0;       // bytes held by the pool for reuse, not counted in in_use
  size_t allocations = 0;  // number of allocate() calls
  size_t fresh = 0;        // of those, how many needed new memory from the system
  size_t abandoned = 0;    // blocks never reused: a device error kept their streams unordered
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns memory aligned to alignment(); throws OutOfMemoryError past the capacity.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  // Returns every cached block to the system.
  virtual void release_cached() = 0;

  MemoryStats stats() const;
  void set_capacity(size_t bytes);  // 0 lifts the cap
  void reset_peak();
  static constexpr size_t alignment() { return 64; }
  static size_t rounded(size_t bytes) {
    return (bytes + alignment() - 1) / alignment() * alignment();
  }

 protected:
  // Accounting shared by every allocator; both throw or update under mu_.
  void account_allocate(size_t rounded_bytes);
  void account_free(size_t rounded_bytes);
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// The process-wide allocator of a device. CPU exists always; a CUDA device exists when
// the CUDA backend is built and the device is present.
Allocator& allocator_for(Device device);
// Installs the allocator for a device type (called once by the CUDA backend at start-up).
using AllocatorFactory = Allocator* (*)(int index);
void register_allocator_factory(DeviceType type, AllocatorFactory factory);

}  // namespace baton::memory
