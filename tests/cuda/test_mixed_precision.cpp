// The loss scaler's schedule and the mixed-precision ops on the CPU (the CUDA versions
// are in test_cuda_ops).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/mixed_precision.h"
#include "kernels/precision.h"

using namespace baton;
using memory::DType;
using memory::Tensor;

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  kernels::LossScaler s({1024.0, 2.0, 0.5, 3});
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  s.update(true);  // an overflow restarts the count of clean steps
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
}

TEST(LossScaler, UnscalesGradientsAndSkipsOverflowingSteps) {
  kernels::LossScaler s({8.0, 2.0, 0.5, 100});
  std::vector<Tensor> grads{Tensor::from_vector(std::vector<float>{8.f, -16.f}, {2}),
                            Tensor::from_vector(std::vector<float>{4.f}, {1})};
  EXPECT_TRUE(s.unscale(grads));
  EXPECT_EQ(grads[0].to_vector<float>(), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(grads[1].to_vector<float>(), (std::vector<float>{0.5f}));
  grads[1].data<float>()[0] = INFINITY;
  EXPECT_FALSE(s.unscale(grads));
  EXPECT_EQ(s.scale(), 4.0);
}

TEST(MixedPrecision, CastAndUnscaleCheckOnTheCpu) {
  Tensor a = Tensor::from_vector(std::vector<double>{1.5, -2.25}, {2});
  Tensor b = Tensor::empty({2}, DType::f32);
  kernels::cast(a, b);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1.5f, -2.25f}));
  Tensor flag = Tensor::zeros({1});
  kernels::unscale_check(b, 2.0, flag);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3.f, -4.5f}));
  EXPECT_EQ(flag.to_vector<float>()[0], 0.f);
  Tensor nan = Tensor::from_vector(std::vector<float>{NAN}, {1});
  kernels::unscale_check(nan, 1.0, flag);
  EXPECT_EQ(flag.to_vector<float>()[0], 1.f);
  Tensor wrong = Tensor::zeros({3});
  EXPECT_THROW(kernels::cast(a, wrong), std::invalid_argument);
}

// fp16 on the CPU: the cast rounds to nearest even and saturates to inf past 65504 (what
// the GPU's __float2half_rn does), and an overflowing fp16 gradient raises the flag, which
// is what the loss scaler's skipped step relies on.
TEST(MixedPrecision, Fp16CastRoundsAndOverflowsAsTheGpuDoes) {
  Tensor a = Tensor::from_vector(
      std::vector<float>{1.0f, 1.0f + 1.0f / 4096, 65504.f, 70000.f, -1.0e-8f}, {5});
  Tensor h = Tensor::empty({5}, DType::f16);
  kernels::cast(a, h);
  Tensor back = Tensor::empty({5}, DType::f32);
  kernels::cast(h, back);
  const std::vector<float> v = back.to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 1.0f);  // 2^-12 is a quarter of fp16's step at 1 (2^-10): rounds to 1
  EXPECT_EQ(v[2], 65504.f);
  EXPECT_TRUE(std::isinf(v[3]));
  EXPECT_EQ(v[4], 0.f);  // below the smallest subnormal's half
  Tensor flag = Tensor::zeros({1});
  kernels::unscale_check(back, 0.5, flag);
  EXPECT_EQ(flag.to_vector<float>()[0], 1.f);
}

TEST(Precision, NamesAsTheFlagTakesThem) {
  using kernels::Precision;
  for (Precision p : {Precision::f32, Precision::tf32, Precision::bf16, Precision::fp16})
    EXPECT_EQ(kernels::parse_precision(kernels::precision_name(p)), p);
  EXPECT_EQ(kernels::compute_dtype(Precision::bf16), DType::bf16);
  EXPECT_EQ(kernels::compute_dtype(Precision::fp16), DType::f16);
  EXPECT_EQ(kernels::compute_dtype(Precision::tf32), DType::f32);
  EXPECT_TRUE(kernels::needs_loss_scaling(Precision::fp16));
  EXPECT_FALSE(kernels::needs_loss_scaling(Precision::bf16));
  try {
    kernels::parse_precision("half", "plan.json: $.precision");
    FAIL() << "'half' was accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "plan.json: $.precision: expected f32, tf32, bf16 or fp16, found 'half'");
  }
}
