// The caching allocator's stream bookkeeping on CPU, with stand-in streams and events: a
// block used on another stream while live is reused only once an event recorded there
// at its free has completed; the home stream needs no event; pinned-style pools (no
// home stream) wait for every recorded DMA; a full source synchronizes and takes the
// waiting blocks back. Also the device-memory budget check (memory/device_budget.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>

#include "memory/caching_allocator.h"
#include "memory/cuda_device.h"
#include "memory/device_budget.h"
#include "memory/units.h"

using namespace baton::memory;

namespace {

// Streams are numbered; work "queued" on a stream completes when the test says so. An
// event is done once its stream has completed everything queued before the record.
struct StreamMemory final : RawMemory {
  void* home = nullptr;
  size_t limit = SIZE_MAX, live = 0, fresh = 0, events_made = 0, events_destroyed = 0, syncs = 0;
  std::map<void*, size_t> sizes;
  std::map<uintptr_t, uint64_t> queued, completed;
  struct Ev {
    uintptr_t stream;
    uint64_t target;
  };

  // Blocks a test leaves allocated go with the stand-in (the allocator owns it).
  ~StreamMemory() override {
    for (auto& [p, n] : sizes) std::free(p);
  }
  // Stand-in stream handles: small numbers, never dereferenced.
  static void* stream(uintptr_t n) {
    return reinterpret_cast<void*>(n);  // NOLINT(performance-no-int-to-ptr)
  }
  void queue(uintptr_t s) { queued[s]++; }
  void complete(uintptr_t s) { completed[s] = queued[s]; }

  void* allocate(size_t bytes) override {
    if (live + bytes > limit) return nullptr;
    void* p = std::malloc(bytes);
    sizes[p] = bytes;
    live += bytes;
    fresh++;
    return p;
  }
  void free(void* p) override {
    live -= sizes.at(p);
    sizes.erase(p);
    std::free(p);
  }
  void synchronize() override {
    syncs++;
    for (auto& [s, q] : queued) completed[s] = q;
  }
  void* home_stream() override { return home; }
  bool failing = false;  // a device in an error state: recording throws
  void* record_event(void* s) override {
    if (failing) throw std::runtime_error("cuda: an illegal memory access was encountered");
    events_made++;
    const auto n = reinterpret_cast<uintptr_t>(s);
    return new Ev{n, queued[n]};
  }
  bool event_done(void* e) override {
    auto* ev = static_cast<Ev*>(e);
    return completed[ev->stream] >= ev->target;
  }
  void destroy_event(void* e) override {
    events_destroyed++;
    delete static_cast<Ev*>(e);
  }
};

struct Pool {
  explicit Pool(void* home = StreamMemory::stream(1)) {
    raw->home = home;
    alloc = std::make_unique<CachingAllocator>(Device::cuda(0), std::unique_ptr<RawMemory>(raw));
  }
  StreamMemory* raw = new StreamMemory();
  std::unique_ptr<CachingAllocator> alloc;
};

constexpr uintptr_t kComm = 2, kCopy = 3;

}  // namespace

TEST(AllocatorStreams, ABlockUsedOnAnotherStreamWaitsForItsEvent) {
  Pool p;
  void* a = p.alloc->allocate(4096);
  EXPECT_TRUE(p.alloc->record_stream(a, StreamMemory::stream(kComm)));
  p.raw->queue(kComm);  // an all-reduce reading a, still running
  p.alloc->deallocate(a, 4096);
  EXPECT_EQ(p.alloc->pending_blocks(), 1u);
  EXPECT_EQ(p.alloc->stats().in_use, 0u);
  void* b = p.alloc->allocate(4096);
  EXPECT_NE(b, a) << "handed out a block the communication stream still reads";
  p.alloc->deallocate(b, 4096);
  p.raw->complete(kComm);
  void* c = p.alloc->allocate(4096);
  void* d = p.alloc->allocate(4096);
  EXPECT_TRUE((c == a || d == a)) << "the block never came back after its event completed";
  EXPECT_EQ(p.alloc->pending_blocks(), 0u);
  EXPECT_EQ(p.raw->fresh, 2u);
  EXPECT_EQ(p.raw->events_made, p.raw->events_destroyed);
}

// A tensor freed while a kernel fault unwinds (its event cannot be recorded) does not
// throw from the destructor's path, and its block is never handed out again.
TEST(AllocatorStreams, AFreeOnAFaultedDeviceDoesNotThrowAndAbandonsTheBlock) {
  Pool p;
  void* a = p.alloc->allocate(4096);
  void* b = p.alloc->allocate(4096);
  p.alloc->record_stream(a, StreamMemory::stream(kComm));
  p.alloc->record_stream(a, StreamMemory::stream(kCopy));
  p.raw->queue(kComm);
  p.raw->failing = true;
  EXPECT_NO_THROW(p.alloc->deallocate(a, 4096));
  EXPECT_NO_THROW(p.alloc->deallocate(b, 4096));  // used on the home stream only: pooled
  p.raw->failing = false;
  EXPECT_EQ(p.alloc->stats().in_use, 0u);
  EXPECT_EQ(p.alloc->stats().abandoned, 1u);
  EXPECT_EQ(p.alloc->pending_blocks(), 0u);
  p.raw->synchronize();
  void* c = p.alloc->allocate(4096);
  void* d = p.alloc->allocate(4096);
  EXPECT_NE(c, a);
  EXPECT_NE(d, a);
  EXPECT_TRUE(c == b || d == b);
  EXPECT_EQ(p.raw->events_made, p.raw->events_destroyed);
}

TEST(AllocatorStreams, WorkQueuedAfterTheFreeDoesNotHoldTheBlock) {
  Pool p;
  void* a = p.alloc->allocate(1000);
  p.alloc->record_stream(a, StreamMemory::stream(kComm));
  p.raw->queue(kComm);
  p.alloc->deallocate(a, 1000);
  p.raw->complete(kComm);
  p.raw->queue(kComm);  // later work on that stream: not about a
  EXPECT_EQ(p.alloc->allocate(1000), a);
}

TEST(AllocatorStreams, EveryRecordedStreamMustPass) {
  Pool p;
  void* a = p.alloc->allocate(1 << 20);
  p.alloc->record_stream(a, StreamMemory::stream(kComm));
  p.alloc->record_stream(a, StreamMemory::stream(kCopy));
  p.alloc->record_stream(a, StreamMemory::stream(kCopy));  // once is enough
  p.raw->queue(kComm);
  p.raw->queue(kCopy);
  p.alloc->deallocate(a, 1 << 20);
  EXPECT_EQ(p.raw->events_made, 2u);
  p.raw->complete(kComm);
  void* b = p.alloc->allocate(1 << 20);
  EXPECT_NE(b, a);
  p.alloc->deallocate(b, 1 << 20);
  p.raw->complete(kCopy);
  void* c = p.alloc->allocate(1 << 20);
  void* d = p.alloc->allocate(1 << 20);
  EXPECT_TRUE(c == a || d == a);
}

TEST(AllocatorStreams, TheHomeStreamNeedsNoEvent) {
  Pool p;
  void* a = p.alloc->allocate(512);
  EXPECT_TRUE(p.alloc->record_stream(a, StreamMemory::stream(1)));
  p.raw->queue(1);
  p.alloc->deallocate(a, 512);
  EXPECT_EQ(p.alloc->pending_blocks(), 0u);
  EXPECT_EQ(p.raw->events_made, 0u);
  EXPECT_EQ(p.alloc->allocate(512), a);  // stream order on the home stream suffices
}

TEST(AllocatorStreams, APinnedPoolWaitsForEveryDma) {
  Pool p(nullptr);  // pinned host memory: the host reuses at once, no stream is home
  void* a = p.alloc->allocate(8192);
  p.alloc->record_stream(a, StreamMemory::stream(1));  // the H2D copy reading it
  p.raw->queue(1);
  p.alloc->deallocate(a, 8192);
  EXPECT_NE(p.alloc->allocate(8192), a) << "handed out a buffer a DMA still reads";
  p.raw->complete(1);
  void* c = p.alloc->allocate(8192);
  EXPECT_EQ(c, a);
}

TEST(AllocatorStreams, UnknownPointersAreLeftAlone) {
  Pool p;
  int x = 0;
  EXPECT_FALSE(p.alloc->record_stream(&x, StreamMemory::stream(kComm)));
}

TEST(AllocatorStreams, AFullSourceSynchronizesAndTakesWaitingBlocksBack) {
  Pool p;
  p.raw->limit = 8192;
  void* a = p.alloc->allocate(8192);
  p.alloc->record_stream(a, StreamMemory::stream(kComm));
  p.raw->queue(kComm);
  p.alloc->deallocate(a, 8192);
  // Another size class: the waiting block cannot serve it, the source is full; the
  // allocator synchronizes, frees every cached and waiting block, and retries.
  void* b = p.alloc->allocate(4096);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(p.raw->syncs, 1u);
  EXPECT_EQ(p.alloc->pending_blocks(), 0u);
  EXPECT_EQ(p.raw->events_made, p.raw->events_destroyed);
  p.alloc->deallocate(b, 4096);
  p.alloc->release_cached();
  EXPECT_EQ(p.raw->live, 0u);
}

TEST(DeviceBudget, ThePlansMemoryIsCheckedAgainstWhatIsFree) {
  DeviceMemoryInfo info{size_t(80) << 30, size_t(70) << 30, "NVIDIA H200"};
  EXPECT_NO_THROW(
      check_memory_budget(Device::cuda(0), size_t(64) << 30, info, "plan.json's device_memory"));
  try {
    check_memory_budget(Device::cuda(1), size_t(75) << 30, info, "plan.json's device_memory");
    FAIL() << "75 GiB fit in 70 GiB free";
  } catch (const baton::RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("plan.json's device_memory asks for 75.00 GiB on cuda:1 (NVIDIA H200)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("70.00 GiB free of 80.00 GiB"), std::string::npos) << m;
  }
}

TEST(DeviceBudget, HostMemoryFromProcMeminfo) {
  const DeviceMemoryInfo parsed =
      parse_meminfo("MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:    8000000 kB\n");
  EXPECT_EQ(parsed.total, size_t(16000000) * 1024);
  EXPECT_EQ(parsed.free, size_t(8000000) * 1024);
  const DeviceMemoryInfo host = device_memory_info(Device::cpu());
  EXPECT_GT(host.total, 0u);
  EXPECT_GT(host.free, 0u);
  EXPECT_LE(host.free, host.total);
  // The cap is set only when the check passes.
  EXPECT_THROW(reserve_device_memory(Device::cpu(), host.total * 2, "--device-memory"),
               baton::RuntimeError);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().capacity, 0u);
  reserve_device_memory(Device::cpu(), size_t(1) << 20, "--device-memory");
  EXPECT_EQ(allocator_for(Device::cpu()).stats().capacity, size_t(1) << 20);
  allocator_for(Device::cpu()).set_capacity(0);
}

TEST(DeviceBudget, AMissingGpuSaysSoWithTheDriversReason) {
  EXPECT_NO_THROW(baton::memory::cuda::require_device(Device::cpu()));
  if (baton::memory::cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    baton::memory::cuda::require_device(parse_device("cuda"));
    FAIL() << "cuda:0 was accepted without a device";
  } catch (const baton::RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no CUDA device for cuda:0: "), std::string::npos) << m;
    EXPECT_NE(m.find(baton::memory::cuda::unavailable_reason()), std::string::npos) << m;
  }
}
