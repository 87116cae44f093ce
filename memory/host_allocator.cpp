#include "memory/host_allocator.h"

#include <sys/mman.h>

#include <cstdlib>

namespace baton::memory {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// nullptr when the system has no memory for it.
void* system_alloc(size_t bytes) {
  size_t align = bytes >= kHugePage ? kHugePage : Allocator::alignment();
  size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p != nullptr && bytes >= kHugePage) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

}  // namespace

HostAllocator::~HostAllocator() {
  release_cached();
}

void* HostAllocator::allocate(size_t bytes) {
  size_t need = rounded(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu_);
  account_allocate(need);
  auto it = free_.lower_bound(need);
  if (it != free_.end() && it->first <= need + need / 8) {
    void* p = it->second;
    stats_.cached -= it->first;
    free_.erase(it);
    return p;
  }
  void* p = system_alloc(need);
  if (p == nullptr && !free_.empty()) {
    // The pool's free blocks, given back and the request tried again: blocks of other
    // sizes had held the memory while a request failed with nothing in use.
    release_cached_locked();
    p = system_alloc(need);
  }
  if (p == nullptr) {
    // Said as the capped allocator says it (a bare std::bad_alloc had named nothing).
    account_free(need);
    throw OutOfMemoryError(device(), need, stats_.capacity, stats_.in_use);
  }
  stats_.fresh++;
  block_size_.emplace(p, need);
  return p;
}

void HostAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  account_free(rounded(bytes == 0 ? 1 : bytes));
  size_t size = block_size_.at(ptr);
  free_.emplace(size, ptr);
  stats_.cached += size;
}

void HostAllocator::release_cached() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

void HostAllocator::release_cached_locked() {
  for (auto& [size, p] : free_) {
    block_size_.erase(p);
    std::free(p);
  }
  free_.clear();
  stats_.cached = 0;
}

}  // namespace baton::memory
