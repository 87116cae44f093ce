// Device memory, copies, pinned buffers, streams and events on a real GPU (skipped
// without one).
#include <gtest/gtest.h>

#include <numeric>

#include "memory/cuda_device.h"
#include "memory/tensor.h"

using namespace baton::memory;

#define REQUIRE_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason()

TEST(CudaMemory, CopiesRoundTripBetweenHostAndDevice) {
  REQUIRE_GPU();
  std::vector<float> v(10007);
  std::iota(v.begin(), v.end(), 0.5f);
  Tensor h = Tensor::from_vector(v, {10007});
  Tensor d = h.to(Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  Tensor d2 = d.clone();  // device to device
  EXPECT_EQ(d2.to(Device::cpu()).to_vector<float>(), v);
  Tensor z = Tensor::zeros({3, 5}, DType::bf16, Device::cuda(0));
  for (float x : z.to(Device::cpu()).to(DType::f32).to_vector<float>()) EXPECT_EQ(x, 0.f);
}

// Views on the device: a column range written from the host and from the device (one 2-D
// copy each), a permuted view made contiguous, and zero_ of a view leaving the rest.
TEST(CudaMemory, StridedViewsCopyAndZeroOnTheDevice) {
  REQUIRE_GPU();
  const Device g = Device::cuda(0);
  std::vector<float> big(4 * 5 * 12), part(4 * 5 * 3);
  std::iota(big.begin(), big.end(), 1.f);
  std::iota(part.begin(), part.end(), 1000.f);
  Tensor want = Tensor::from_vector(big, {4, 5, 12});
  Tensor d = want.to(g);
  Tensor p = Tensor::from_vector(part, {4, 5, 3});
  d.narrow(2, 6, 3).copy_from(p);        // host to device, strided
  d.narrow(2, 0, 3).copy_from(p.to(g));  // device to device, strided
  want.narrow(2, 6, 3).copy_from(p);
  want.narrow(2, 0, 3).copy_from(p);
  EXPECT_EQ(d.to(Device::cpu()).to_vector<float>(), want.to_vector<float>());
  Tensor t = d.permute({2, 0, 1}).contiguous();  // device, any layout
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(),
            want.permute({2, 0, 1}).contiguous().to_vector<float>());
  Tensor host = Tensor::empty({4, 5, 3});
  host.copy_from(d.narrow(2, 9, 3));  // device to host, strided
  EXPECT_EQ(host.to_vector<float>(), want.narrow(2, 9, 3).contiguous().to_vector<float>());
  d.narrow(1, 1, 2).zero_();
  want.narrow(1, 1, 2).zero_();
  EXPECT_EQ(d.to(Device::cpu()).to_vector<float>(), want.to_vector<float>());
  Tensor b = Tensor::full({1000}, 3.0, DType::bf16, g);
  b.narrow(0, 10, 500).zero_();
  const auto back = b.to(Device::cpu()).to(DType::f32).to_vector<float>();
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i >= 10 && i < 510 ? 0.f : 3.f) << i;
}

TEST(CudaMemory, SteadyStateAllocatesNothingNew) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(Device::cuda(0));
  for (int warm = 0; warm < 2; ++warm) {
    Tensor x = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
    Tensor y = Tensor::empty({777}, DType::bf16, Device::cuda(0));
  }
  const size_t fresh = a.stats().fresh;
  for (int step = 0; step < 20; ++step) {
    Tensor x = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
    Tensor y = Tensor::empty({777}, DType::bf16, Device::cuda(0));
  }
  EXPECT_EQ(a.stats().fresh, fresh);
}

TEST(CudaMemory, CapacityMakesASmallDevice) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(Device::cuda(0));
  const size_t base = a.stats().in_use;
  a.set_capacity(base + (1 << 20));
  EXPECT_NO_THROW(Tensor::empty({1 << 17}, DType::f32, Device::cuda(0)));
  EXPECT_THROW(Tensor::empty({1 << 19}, DType::f32, Device::cuda(0)), OutOfMemoryError);
  a.set_capacity(0);
  EXPECT_EQ(a.stats().in_use, base);
}

TEST(CudaMemory, PinnedBuffersCopyAsynchronouslyInStreamOrder) {
  REQUIRE_GPU();
  Tensor src = cuda::pinned_empty({4096}, DType::f32);
  float* p = src.data<float>();
  for (int i = 0; i < 4096; ++i) p[i] = float(i);
  Tensor dev = Tensor::empty({4096}, DType::f32, Device::cuda(0));
  Tensor back = cuda::pinned_empty({4096}, DType::f32);
  auto s = cuda::compute_stream(0);
  cuda::copy_async(dev, src, s);
  cuda::copy_async(back, dev, s);
  cuda::synchronize(0);
  EXPECT_EQ(back.to_vector<float>(), src.to_vector<float>());
  EXPECT_GT(cuda::pinned_allocator().stats().in_use, 0u);
}

TEST(CudaMemory, EventsOrderTheCommunicationStreamAfterCompute) {
  REQUIRE_GPU();
  Tensor a = Tensor::full({1 << 16}, 3.0, DType::f32, Device::cuda(0));
  Tensor b = Tensor::empty({1 << 16}, DType::f32, Device::cuda(0));
  cuda::Event ready(0);
  ready.record(cuda::compute_stream(0));
  ready.block(cuda::comm_stream(0));
  cuda::copy_async(b, a, cuda::comm_stream(0));
  cuda::Event done(0, true);
  done.record(cuda::comm_stream(0));
  done.synchronize();
  EXPECT_TRUE(done.query());
  for (float x : b.to(Device::cpu()).to_vector<float>()) ASSERT_EQ(x, 3.f);
  cuda::Event t0(0, true), t1(0, true);
  t0.record(cuda::compute_stream(0));
  t1.record(cuda::compute_stream(0));
  t1.synchronize();
  EXPECT_GE(cuda::Event::elapsed_ms(t0, t1), 0.f);
}

TEST(CudaMemory, StreamGuardSwitchesTheCurrentStream) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda::current_stream(0), cuda::compute_stream(0));
  {
    cuda::StreamGuard g(0, cuda::comm_stream(0));
    EXPECT_EQ(cuda::current_stream(0), cuda::comm_stream(0));
  }
  EXPECT_EQ(cuda::current_stream(0), cuda::compute_stream(0));
}
