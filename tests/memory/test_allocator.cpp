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

// With no cap, the system's refusal is said as the cap's is (a bare std::bad_alloc had
// named nothing: "baton train: failed: std::bad_alloc"): the device, the request, what is
// in use; the accounting is left unchanged. Staging memory, outside the accounting, too.
TEST(HostAllocator, SystemRefusalThrowsOutOfMemoryNamingTheRequest) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators abort on a request this large";
#elif defined(__has_feature)  // clang says it this way
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizers' allocators abort on a request this large";
#endif
#endif
  Allocator& a = allocator_for(Device::cpu());
  const size_t base = a.stats().in_use;
  a.deallocate(a.allocate(size_t(1) << 20), size_t(1) << 20);  // a block in the pool
  ASSERT_GT(a.stats().cached, 0u);
  try {
    a.allocate(size_t(1) << 62);  // 4 EiB: beyond any address space
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cpu: tried to allocate 4194304.00 TiB with "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(" in use, no cap set: the system refused it"), std::string::npos) << msg;
    EXPECT_EQ(e.requested(), size_t(1) << 62);
  }
  EXPECT_EQ(a.stats().in_use, base);
  // The pool was given back and the request tried again before the refusal: blocks of
  // other sizes had held the memory of a request that failed with nothing in use.
  EXPECT_EQ(a.stats().cached, 0u);
  EXPECT_THROW(Tensor::staging({int64_t(1) << 60}, DType::f32), OutOfMemoryError);
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

// Integers are exact (strtod had rounded 2^63 - 1 up to 2^63 and refused it); K, M, G and T
// are all binary (T had been refused); strtod's hex, signs and leading spaces are refused;
// only a literal 0 is 0 (1e-400 had underflowed to 0 and -0 had been 0: both unlimited).
TEST(Units, ExactIntegersShortUnitsAndStrictNumbers) {
  EXPECT_EQ(parse_bytes("9223372036854775807"), size_t(INT64_MAX));
  EXPECT_THROW(parse_bytes("9223372036854775808"), baton::InputError);
  EXPECT_THROW(parse_bytes("99999999999999999999999"), baton::InputError);
  EXPECT_EQ(parse_bytes("6K"), size_t(6) << 10);
  EXPECT_EQ(parse_bytes("6M"), size_t(6) << 20);
  EXPECT_EQ(parse_bytes("6G"), size_t(6) << 30);
  EXPECT_EQ(parse_bytes("6T"), size_t(6) << 40);
  EXPECT_EQ(parse_bytes("64.00 MiB"), size_t(64) << 20);  // as written plans give it
  EXPECT_EQ(parse_bytes("1.5e3"), 1500u);
  EXPECT_EQ(parse_bytes("0e5"), 0u);
  for (const char* bad : {"0x600000", "0x1p23", " 6MiB", "-0", "+5", "-1", "1e-400", "1e-400GiB",
                          "inf", "nan", ".", "5 MiB "})
    EXPECT_THROW(parse_bytes(bad), baton::InputError) << bad;
  try {
    parse_bytes("6P");
    ADD_FAILURE() << "6P accepted";
  } catch (const baton::InputError& e) {
    EXPECT_STREQ(e.what(),
                 "invalid size '6P': unknown unit 'P' (expected B; KiB, MiB, GiB, TiB or K, M, G, "
                 "T: powers of 1024; KB, MB, GB, TB: powers of 1000)");
  }
  try {
    parse_bytes("1e-400");
    ADD_FAILURE() << "1e-400 accepted";
  } catch (const baton::InputError& e) {
    EXPECT_STREQ(e.what(), "invalid size '1e-400': expected 0 or at least 1 byte");
  }
}
