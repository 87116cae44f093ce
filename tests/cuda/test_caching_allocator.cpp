// The caching allocator's bookkeeping over a host-memory source (runs without a GPU), and
// what a build with CUDA says when no device is present.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "memory/caching_allocator.h"
#include "memory/cuda_device.h"
#include "memory/tensor.h"

using namespace baton::memory;

namespace {

// A raw source over malloc that counts its calls and can be made to run out.
struct CountingMemory final : RawMemory {
  size_t limit = SIZE_MAX;  // bytes the source may hand out in all
  size_t live = 0, allocs = 0, frees = 0, syncs = 0;
  std::set<void*> blocks;
  std::map<void*, size_t> sizes;
  void* allocate(size_t bytes) override {
    if (live + bytes > limit) return nullptr;
    void* p = std::malloc(bytes);
    live += bytes;
    allocs++;
    blocks.insert(p);
    sizes[p] = bytes;
    return p;
  }
  void free(void* p) override {
    live -= sizes.at(p);
    sizes.erase(p);
    blocks.erase(p);
    frees++;
    std::free(p);
  }
  void synchronize() override { syncs++; }
  std::pair<size_t, size_t> total_and_free() const override { return {limit, limit - live}; }
};

struct Fixture {
  CountingMemory* raw = new CountingMemory();
  CachingAllocator alloc{Device::cuda(0), std::unique_ptr<RawMemory>(raw)};
};

}  // namespace

TEST(CachingAllocator, SizeClassesWasteAtMostAnEighth) {
  EXPECT_EQ(CachingAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingAllocator::size_class(512), 512u);
  EXPECT_EQ(CachingAllocator::size_class(513), 1024u);
  EXPECT_EQ(CachingAllocator::size_class(4096), 4096u);
  EXPECT_EQ(CachingAllocator::size_class(4097), 4608u);
  EXPECT_EQ(CachingAllocator::size_class(size_t(1) << 20), size_t(1) << 20);
  EXPECT_EQ(CachingAllocator::size_class((size_t(1) << 20) + 1),
            (size_t(1) << 20) + (size_t(1) << 17));
  for (size_t b = 1; b < (size_t(1) << 24); b = b * 3 / 2 + 7) {
    size_t c = CachingAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LT(c - b, std::max<size_t>(512, b / 8 + 1)) << b;  // 512-byte steps up to 4 KiB
  }
}

TEST(CachingAllocator, SteadyStateNeedsNoNewMemory) {
  Fixture f;
  for (int step = 0; step < 5; ++step) {
    void* a = f.alloc.allocate(1000);
    void* b = f.alloc.allocate(300000);
    void* c = f.alloc.allocate(1000);
    f.alloc.deallocate(b, 300000);
    f.alloc.deallocate(a, 1000);
    f.alloc.deallocate(c, 1000);
  }
  EXPECT_EQ(f.raw->allocs, 3u);  // the first step's three blocks, reused ever after
  EXPECT_EQ(f.alloc.stats().fresh, 3u);
  EXPECT_EQ(f.alloc.stats().allocations, 15u);
  EXPECT_EQ(f.alloc.stats().in_use, 0u);
  EXPECT_EQ(f.alloc.stats().cached, 2 * 1024u + CachingAllocator::size_class(300032));
}

TEST(CachingAllocator, CountsInUseAndPeakAsTheHostAllocatorDoes) {
  Fixture f;
  void* a = f.alloc.allocate(1000);  // rounded to 1024 for the accounting
  void* b = f.alloc.allocate(100);   // 128
  EXPECT_EQ(f.alloc.stats().in_use, 1024u + 128u);
  f.alloc.deallocate(a, 1000);
  EXPECT_EQ(f.alloc.stats().in_use, 128u);
  EXPECT_EQ(f.alloc.stats().peak, 1152u);
  f.alloc.reset_peak();
  EXPECT_EQ(f.alloc.stats().peak, 128u);
  f.alloc.deallocate(b, 100);
}

TEST(CachingAllocator, CapacityThrowsBeforeTouchingTheSource) {
  Fixture f;
  f.alloc.set_capacity(1 << 20);
  void* a = f.alloc.allocate(1 << 19);
  try {
    f.alloc.allocate(1 << 20);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:0"), std::string::npos) << e.what();
    EXPECT_EQ(e.requested(), size_t(1) << 20);
  }
  EXPECT_EQ(f.raw->allocs, 1u);
  EXPECT_EQ(f.alloc.stats().in_use, size_t(1) << 19);
  f.alloc.deallocate(a, 1 << 19);
}

TEST(CachingAllocator, SourceExhaustedReleasesTheCacheAndRetries) {
  Fixture f;
  f.raw->limit = 3 << 20;
  void* a = f.alloc.allocate(2 << 20);
  f.alloc.deallocate(a, 2 << 20);       // cached, 2 MiB of the 3 the source has
  void* b = f.alloc.allocate(3 << 19);  // another class: the cache is released, then it fits
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(f.raw->frees, 1u);
  EXPECT_GE(f.raw->syncs, 1u);  // queued work was waited for before the free
  EXPECT_EQ(f.alloc.stats().cached, 0u);
  f.alloc.deallocate(b, 3 << 19);
}

TEST(CachingAllocator, SourceExhaustedWithNothingCachedThrows) {
  Fixture f;
  f.raw->limit = 1 << 20;
  void* a = f.alloc.allocate(1 << 19);
  EXPECT_THROW(f.alloc.allocate(1 << 20), OutOfMemoryError);
  EXPECT_EQ(f.alloc.stats().in_use, size_t(1) << 19);  // the failed request left no trace
  f.alloc.deallocate(a, 1 << 19);
}

TEST(CachingAllocator, ReleaseCachedReturnsEveryFreeBlock) {
  Fixture f;
  void* a = f.alloc.allocate(10000);
  void* b = f.alloc.allocate(20000);
  f.alloc.deallocate(a, 10000);
  f.alloc.release_cached();
  EXPECT_EQ(f.raw->frees, 1u);
  EXPECT_EQ(f.alloc.stats().cached, 0u);
  f.alloc.deallocate(b, 20000);
  EXPECT_EQ(f.raw->blocks.size(), 1u);  // b is cached, not freed
}

TEST(CudaDevice, WithoutADeviceSaysWhy) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  try {
    Tensor t = Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL() << "expected an error";
  } catch (const baton::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}
