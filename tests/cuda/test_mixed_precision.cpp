// The loss scaler's schedule and the mixed-precision ops on the CPU (the CUDA versions
// are in test_cuda_ops).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/mixed_precision.h"

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
