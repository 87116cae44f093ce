// The CPU allocator: 64-byte aligned blocks kept in a pool for reuse, because on these
// machines the first touch of a fresh page costs far more than the work done on it.
// Large blocks are backed by transparent huge pages where the kernel offers them.
#pragma once

#include <map>

#include "memory/allocator.h"

namespace baton::memory {

class HostAllocator final : public Allocator {
 public:
  HostAllocator() = default;
  ~HostAllocator() override;
  Device device() const override { return Device::cpu(); }
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void release_cached() override;

 private:
  // Cached blocks by their size; a request takes the smallest block at least as large
  // and at most an eighth larger, so a steady training step reuses its own blocks.
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> block_size_;  // every live or cached block and its real size
  void release_cached_locked();         // release_cached with mu_ held
};

}  // namespace baton::memory
