#include "memory/caching_allocator.h"

#include <algorithm>
#include <bit>

namespace baton::memory {

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawMemory> raw)
    : device_(device), raw_(std::move(raw)) {
  home_ = raw_->home_stream();
}

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
  if (!pending_.empty()) collect_pending_locked(false);
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
  blocks_.emplace(p, Block{cls, {}});
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  account_free(rounded(bytes == 0 ? 1 : bytes));
  Block& b = blocks_.at(ptr);
  stats_.cached += b.cls;
  if (b.streams.empty()) {
    free_[b.cls].push_back(ptr);
    return;
  }
  // Used on other streams: reusable once their work queued until now has finished.
  Pending p{ptr, b.cls, {}};
  bool recorded = true;
  for (void* s : b.streams) {
    // A device in an error state (a kernel fault) cannot record the event that orders the
    // reuse; this runs from Storage's destructor, often while that fault unwinds, so it
    // must not throw: the block is then never handed out again.
    try {
      if (void* e = raw_->record_event(s)) p.events.push_back(e);
    } catch (const std::exception&) {
      recorded = false;
    }
  }
  b.streams.clear();
  if (!recorded) {
    for (void* e : p.events) raw_->destroy_event(e);
    stats_.cached -= b.cls;
    ++stats_.abandoned;
    return;
  }
  if (p.events.empty())
    free_[p.cls].push_back(ptr);
  else
    pending_.push_back(std::move(p));
}

bool CachingAllocator::record_stream(void* ptr, void* stream) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) return false;
  if (stream == home_ && home_ != nullptr) return true;
  auto& streams = it->second.streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  return true;
}

size_t CachingAllocator::pending_blocks() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

void CachingAllocator::collect_pending_locked(bool all) {
  auto done = [&](const Pending& p) {
    if (all) return true;
    for (void* e : p.events)
      if (!raw_->event_done(e)) return false;
    return true;
  };
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    if (!done(p)) {
      still.push_back(std::move(p));
      continue;
    }
    for (void* e : p.events) raw_->destroy_event(e);
    free_[p.cls].push_back(p.ptr);
  }
  pending_ = std::move(still);
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  if (stats_.cached == 0) return;
  raw_->synchronize();  // every stream's work is done: pending blocks are free too
  collect_pending_locked(true);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      blocks_.erase(p);
      raw_->free(p);
    }
  }
  free_.clear();
  stats_.cached = 0;
}

}  // namespace baton::memory
