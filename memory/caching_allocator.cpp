#include "memory/caching_allocator.h"

#include <bit>

namespace baton::memory {

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawMemory> raw)
    : device_(device), raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks belong to tensors that may outlive the allocator only at process exit;
  // cached ones go back now.
  std::lock_guard lock(mu_);
  release_cached_locked();
}

size_t CachingAllocator::size_class(size_t bytes) {
  constexpr size_t kMin = 512;
  if (bytes <= kMin) return kMin;
  size_t top = std::bit_floor(bytes);
  size_t step = top / 8 < kMin ? kMin : top / 8;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes) {
  size_t need = rounded(bytes == 0 ? 1 : bytes);
  size_t cls = size_class(need);
  std::lock_guard lock(mu_);
  account_allocate(need);
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cached -= cls;
    return p;
  }
  void* p = nullptr;
  try {
    p = raw_->allocate(cls);
    if (p == nullptr && stats_.cached != 0) {
      release_cached_locked();
      p = raw_->allocate(cls);
    }
  } catch (...) {
    account_free(need);
    throw;
  }
  if (p == nullptr) {
    account_free(need);
    auto [total, free] = raw_->total_and_free();
    throw OutOfMemoryError(device_, need, total, total - free);
  }
  stats_.fresh++;
  block_size_.emplace(p, cls);
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  account_free(rounded(bytes == 0 ? 1 : bytes));
  size_t cls = block_size_.at(ptr);
  free_[cls].push_back(ptr);
  stats_.cached += cls;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  if (stats_.cached == 0) return;
  raw_->synchronize();
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      block_size_.erase(p);
      raw_->free(p);
    }
  }
  free_.clear();
  stats_.cached = 0;
}

}  // namespace baton::memory
