#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/error.h"

using namespace baton::memory;

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_dtype(safetensors_dtype_name(t)), t);
  }
  EXPECT_THROW(parse_dtype("f8"), baton::InputError);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16MatchesIeeeOnEdgeCases) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives the round trip
    ASSERT_EQ(float_to_f16(f16_to_float(uint16_t(h))), h) << h;
}

TEST(Device, ParsesNames) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_THROW(parse_device("tpu"), baton::InputError);
  EXPECT_THROW(parse_device("cuda:x"), baton::InputError);
}
