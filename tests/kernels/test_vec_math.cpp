// The CPU kernels' SIMD helpers (kernels/cpu/vec_math.h): the float exp's accuracy, its
// vector and scalar forms agreeing bit for bit, the unclamped form for x <= 0 giving the
// clamped form's bits, and the lane reductions' order.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {
namespace {

// Every stride-th float of the bit patterns [lo, hi], and the ends.
template <class F>
void for_floats(uint32_t lo, uint32_t hi, uint32_t stride, F&& f) {
  for (uint64_t b = lo; b <= hi; b += stride) f(std::bit_cast<float>(uint32_t(b)));
  f(std::bit_cast<float>(hi));
}

uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}

TEST(VecMath, ExpIsWithinTwoTenthsOfAMillionthOfTheTrueValue) {
  double worst = 0;
  float at = 0;
  // [-87, 88]: the normal range of the result (below, it flushes to 0).
  auto check = [&](float x) {
    if (!(x >= -87.0f && x <= 88.0f)) return;
    const double want = std::exp(double(x));
    const double err = std::abs(double(vexp(splat(x))[0]) - want) / want;
    if (err > worst) worst = err, at = x;
  };
  for_floats(0x00000000u, bits(88.0f), 4099, check);
  for_floats(0x80000000u, bits(-87.0f), 4099, check);
  EXPECT_LT(worst, 2e-7) << "at x = " << at;
  EXPECT_EQ(vexp(splat(-std::numeric_limits<float>::infinity()))[0], 0.0f);
  EXPECT_EQ(vexp(splat(-100.0f))[0], 0.0f);
  EXPECT_EQ(vexp(splat(0.0f))[0], 1.0f);
}

TEST(VecMath, VectorAndScalarExpAgreeBitForBit) {
  int64_t differ = 0;
  float first = 0;
  auto check = [&](float x) {
    if (bits(vexp(splat(x))[0]) != bits(vexp(x)) && differ++ == 0) first = x;
  };
  for_floats(0x00000000u, bits(std::numeric_limits<float>::infinity()), 997, check);
  for_floats(0x80000000u, bits(-std::numeric_limits<float>::infinity()), 997, check);
  EXPECT_EQ(differ, 0) << "first at x = " << first;
}

// Softmax and attention call the exp without its clamp from above on values less their
// row's maximum: on every such value it must give the clamped exp's bits.
TEST(VecMath, ExpOfNonPositiveValuesHasTheClampedExpsBits) {
  int64_t differ = 0;
  float first = 0;
  auto check = [&](float x) {
    const vfloat v = splat(x);
    if (bits(vexp_nonpositive(v)[0]) != bits(vexp(v)[0]) && differ++ == 0) first = x;
    if (bits(vexp_nonpositive(x)) != bits(vexp(x)) && differ++ == 0) first = x;
  };
  for_floats(0x80000000u, bits(-std::numeric_limits<float>::infinity()), 509, check);
  check(0.0f);
  EXPECT_EQ(differ, 0) << "first at x = " << first;
  // A NaN stays NaN in every form, as torch's exp keeps it: a NaN logit must reach the loss.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(vexp_nonpositive(splat(nan))[0]));
  EXPECT_TRUE(std::isnan(vexp(splat(nan))[0]));
  EXPECT_TRUE(std::isnan(vexp_nonpositive(nan)));
  EXPECT_TRUE(std::isnan(vexp(nan)));
}

// hsum adds lane j + N/2 into lane j down to one lane: the order is fixed by the width,
// so a row's sum does not depend on where it is computed. hmax is the true maximum.
TEST(VecMath, LaneReductionsArePairwiseTrees) {
  constexpr int64_t L = kLanes<float>;
  vfloat v;
  // Large values of both signs: their float sum depends on the order of addition.
  for (int64_t i = 0; i < L; ++i)
    v[i] = (i % 2 == 0 ? 1e8f : -1e8f) * (1.0f + 0.25f * float(i % 4)) + 3.0f * float(i);
  float lanes[L], in_order = 0;
  for (int64_t i = 0; i < L; ++i) lanes[i] = v[i], in_order += v[i];
  for (int64_t w = L / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) lanes[i] = lanes[i] + lanes[i + w];
  ASSERT_NE(bits(lanes[0]), bits(in_order));  // so the check below sees the order
  EXPECT_EQ(bits(hsum(v)), bits(lanes[0]));
  float m = v[0];
  for (int64_t i = 1; i < L; ++i) m = std::max(m, v[i]);
  EXPECT_EQ(hmax(v), m);
  for (int64_t i = 0; i < L; ++i) {
    vfloat one = splat(-1.0f);
    one[i] = 5.0f;
    EXPECT_EQ(hmax(one), 5.0f) << "lane " << i;
  }
  vdouble d;
  for (int64_t i = 0; i < kLanes<double>; ++i) d[i] = double(i) - 2.5;
  EXPECT_EQ(hmax(d), double(kLanes<double>) - 3.5);
}

}  // namespace
}  // namespace baton::kernels::cpu
