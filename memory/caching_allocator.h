// CachingAllocator: an Allocator over any raw memory source (CUDA device memory, pinned
// host memory) that keeps freed blocks for reuse, so a steady training step asks the
// system for no memory at all (cudaMalloc and cudaFree synchronise the whole device).
// The raw source is an interface so that the bookkeeping is tested on CPU as well.
//
// Streams: a block is safe to reuse in the order of its home stream (the device's compute
// stream, where every kernel runs) as soon as it is freed. A block also used on another
// stream (a communication or copy stream; for pinned host memory, any DMA) is marked with
// record_stream(); when it is freed, the allocator records an event on each such stream
// and hands the block out again only once every event has completed.
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

  // Streams and events (CUDA's; a stand-in in the tests). The stream whose order makes
  // reuse safe without an event (nullptr: none, every use is recorded: pinned memory).
  virtual void* home_stream() { return nullptr; }
  // An event recorded now on `stream`: done once the work queued there so far is.
  virtual void* record_event(void* /*stream*/) { return nullptr; }
  virtual bool event_done(void* /*event*/) { return true; }
  virtual void destroy_event(void* /*event*/) {}
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
  // Marks the live block at `ptr` (a pointer allocate() returned) as used on `stream`,
  // so that after it is freed it is not handed out until the work queued on `stream`
  // by then has finished. False (nothing done) for a pointer not from this allocator;
  // the home stream needs no mark.
  bool record_stream(void* ptr, void* stream);
  // Freed blocks still waiting for their events.
  size_t pending_blocks() const;

  // Blocks come in size classes, eight per power of two (at most 12.5% waste) in steps
  // of at least 512 bytes, so that a freed block serves every later request of its class.
  static size_t size_class(size_t bytes);

 private:
  struct Block {
    size_t cls = 0;
    std::vector<void*> streams;  // streams other than home it was used on while live
  };
  struct Pending {
    void* ptr;
    size_t cls;
    std::vector<void*> events;
  };
  void release_cached_locked();
  // Moves the pending blocks whose events have all completed to the free lists
  // (`all`: every one, after a synchronize).
  void collect_pending_locked(bool all);

  Device device_;
  std::unique_ptr<RawMemory> raw_;
  void* home_ = nullptr;
  std::unordered_map<size_t, std::vector<void*>> free_;  // cached blocks by size class
  std::unordered_map<void*, Block> blocks_;              // every live, pending or cached block
  std::vector<Pending> pending_;                         // freed, waiting for their events
};

}  // namespace baton::memory
