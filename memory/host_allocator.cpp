#include "memory/host_allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace baton::memory {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

void* system_alloc(size_t bytes) {
  size_t align = bytes >= kHugePage ? kHugePage : Allocator::alignment();
  size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) throw std::bad_alloc();
  if (bytes >= kHugePage) madvise(p, size, MADV_HUGEPAGE);
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
  void* p;
  try {
    p = system_alloc(need);
  } catch (...) {
    account_free(need);
    throw;
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
  for (auto& [size, p] : free_) {
    block_size_.erase(p);
    std::free(p);
  }
  free_.clear();
  stats_.cached = 0;
}

}  // namespace baton::memory
