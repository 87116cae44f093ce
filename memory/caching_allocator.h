// CachingAllocator: an Allocator over any raw memory source (CUDA device memory, pinned
// host memory) that keeps freed blocks for reuse, so a steady training step asks the
// system for no memory at all (cudaMalloc and cudaFree synchronise the whole device).
// The raw source is an interface so that the bookkeeping is tested on CPU as well.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace baton::memory {

// Where a CachingAllocator gets its blocks from.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  // Returns nullptr when the source is out of memory; throws on any other failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // Waits for queued work that may still use cached blocks, before they are freed.
  virtual void synchronize() {}
  // The source's total and free bytes, for out-of-memory messages (0, 0 if unknown).
  virtual std::pair<size_t, size_t> total_and_free() const { return {0, 0}; }
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<RawMemory> raw);
  ~CachingAllocator() override;
  Device device() const override { return device_; }
  // On a raw out-of-memory, releases every cached block and tries once more before
  // throwing OutOfMemoryError.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void release_cached() override;

  // Blocks come in size classes, eight per power of two (at most 12.5% waste) in steps
  // of at least 512 bytes, so that a freed block serves every later request of its class.
  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();

  Device device_;
  std::unique_ptr<RawMemory> raw_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // cached blocks by size class
  std::unordered_map<void*, size_t> block_size_;         // every live or cached block
};

}  // namespace baton::memory
