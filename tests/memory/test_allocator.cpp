#include <gtest/gtest.h>

#include "memory/allocator.h"
#include "memory/tensor.h"
#include "memory/units.h"

using namespace baton::memory;

namespace {
// The CPU allocator is process-wide: each test leaves its capacity unlimited.
struct CapacityGuard {
  ~CapacityGuard() { allocator_for(Device::cpu()).set_capacity(0); }
};
}  // namespace

TEST(HostAllocator, CountsInUseAndPeak) {
  Allocator& a = allocator_for(Device::cpu());
  size_t base = a.stats().in_use;
  a.reset_peak();
  {
    Tensor x = Tensor::empty({1000});  // 4000 bytes, rounded to 4032
    EXPECT_EQ(a.stats().in_use, base + 4032);
    {
      Tensor y = Tensor::empty({250});
      EXPECT_EQ(a.stats().in_use, base + 4032 + 1024);
    }
    EXPECT_EQ(a.stats().in_use, base + 4032);
  }
  EXPECT_EQ(a.stats().in_use, base);
  EXPECT_EQ(a.stats().peak, base + 4032 + 1024);
}

TEST(HostAllocator, ReusesFreedBlocks) {
  Allocator& a = allocator_for(Device::cpu());
  { Tensor warm = Tensor::empty({1 << 20}); }
  size_t fresh = a.stats().fresh;
  for (int i = 0; i < 10; ++i) Tensor t = Tensor::empty({1 << 20});
  EXPECT_EQ(a.stats().fresh, fresh);
}

TEST(HostAllocator, CapacityThrowsNamingDeviceRequestAndUse) {
  CapacityGuard guard;
  Allocator& a = allocator_for(Device::cpu());
  size_t base = a.stats().in_use;
  a.set_capacity(base + (1 << 20));
  Tensor ok = Tensor::empty({1 << 17});  // 512 KiB fits
  try {
    Tensor too_big = Tensor::empty({1 << 18});  // 1 MiB more does not
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1.00 MiB"), std::string::npos) << msg;
    EXPECT_EQ(e.requested(), size_t(1) << 20);
  }
  // The failed request left the accounting unchanged.
  EXPECT_EQ(a.stats().in_use, base + (size_t(1) << 19));
}

TEST(Units, ParsesAndFormatsSizes) {
  EXPECT_EQ(parse_bytes("512MiB"), size_t(512) << 20);
  EXPECT_EQ(parse_bytes("4GiB"), size_t(4) << 30);
  EXPECT_EQ(parse_bytes("1.5KB"), 1500u);
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_THROW(parse_bytes("12 parsecs"), baton::InputError);
  EXPECT_THROW(parse_bytes("MiB"), baton::InputError);
  // Beyond int64 (llround had wrapped 1e30GiB to INT64_MIN) and under one byte (0.4 had
  // rounded to 0, which callers read as unlimited).
  EXPECT_THROW(parse_bytes("1e30GiB"), baton::InputError);
  EXPECT_THROW(parse_bytes("8388608TiB"), baton::InputError);  // 2^63
  EXPECT_THROW(parse_bytes("9223372036854775808"), baton::InputError);
  EXPECT_EQ(parse_bytes("8388607TiB"), size_t(8388607) << 40);
  EXPECT_THROW(parse_bytes("0.4"), baton::InputError);
  EXPECT_THROW(parse_bytes("0.0001KiB"), baton::InputError);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("0.0GiB"), 0u);
  EXPECT_EQ(parse_bytes("1.4"), 1u);
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}
