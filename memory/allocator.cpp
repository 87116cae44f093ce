#include "memory/allocator.h"

#include <array>
#include <map>
#include <memory>

#include "memory/cuda_device.h"
#include "memory/host_allocator.h"
#include "memory/units.h"

namespace baton::memory {

// capacity 0: no cap was set, and the system itself refused the memory.
OutOfMemoryError::OutOfMemoryError(Device device, size_t requested, size_t capacity, size_t in_use)
    : RuntimeError("out of memory on " + device.str() + ": tried to allocate " +
                   format_bytes(double(requested)) + " with " + format_bytes(double(in_use)) +
                   (capacity == 0
                        ? " in use, no cap set: the system refused it"
                        : " in use of a capacity of " + format_bytes(double(capacity)) + " (" +
                              format_bytes(double(capacity > in_use ? capacity - in_use : 0)) +
                              " free)")),
      device_(device),
      requested_(requested) {}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Allocator::set_capacity(size_t bytes) {
  std::lock_guard lock(mu_);
  stats_.capacity = bytes;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.in_use;
}

void Allocator::account_allocate(size_t rounded_bytes) {
  if (stats_.capacity != 0 && stats_.in_use + rounded_bytes > stats_.capacity)
    throw OutOfMemoryError(device(), rounded_bytes, stats_.capacity, stats_.in_use);
  stats_.in_use += rounded_bytes;
  stats_.allocations++;
  if (stats_.in_use > stats_.peak) stats_.peak = stats_.in_use;
}

void Allocator::account_free(size_t rounded_bytes) {
  stats_.in_use -= rounded_bytes;
}

namespace {

struct Registry {
  std::mutex mu;
  std::array<AllocatorFactory, 2> factories{};
  std::map<Device, std::unique_ptr<Allocator>> allocators;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tensors may outlive main()
  return *r;
}

}  // namespace

void register_allocator_factory(DeviceType type, AllocatorFactory factory) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[size_t(type)] = factory;
}

Allocator& allocator_for(Device device) {
  // The CUDA backend installs its factory on first use (before the lock: it registers).
  if (device.is_cuda()) cuda::ensure_registered();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.allocators.find(device);
  if (it != r.allocators.end()) return *it->second;
  Allocator* a = nullptr;
  if (device.is_cpu()) {
    a = new HostAllocator();
  } else if (AllocatorFactory f = r.factories[size_t(device.type)]) {
    a = f(device.index);
  }
  if (a == nullptr)
    throw RuntimeError(
        "no allocator for device " + device.str() +
        (device.is_cuda() ? ": baton was built without CUDA or the device is absent" : ""));
  r.allocators.emplace(device, std::unique_ptr<Allocator>(a));
  return *a;
}

}  // namespace baton::memory
