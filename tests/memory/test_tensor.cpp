#include <gtest/gtest.h>

#include "memory/tensor.h"

using namespace baton::memory;

TEST(Tensor, EmptyHasShapeStridesAndBytes) {
  Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.str(), "f32[2, 3, 4] on cpu");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % Allocator::alignment(), 0u);
}

TEST(Tensor, ViewsShareStorageAndCopiesDoNot) {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[size_t(i)] = float(i);
  Tensor t = Tensor::from_vector(v, {3, 4});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.shape(), (Shape{4, 3}));
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor row = t.narrow(0, 1, 1);
  row.fill_(-1);
  EXPECT_EQ(t.to_vector<float>()[4], -1.f);
  EXPECT_EQ(t.to_vector<float>()[8], 8.f);
  Tensor col = t.select(1, 2);
  EXPECT_EQ(col.to_vector<float>(), (std::vector<float>{2, -1, 10}));
  Tensor copy = t.clone();
  copy.zero_();
  EXPECT_EQ(t.to_vector<float>()[0], 0.f);
  EXPECT_EQ(t.to_vector<float>()[1], 1.f);
}

TEST(Tensor, ViewInfersOneDimensionAndRejectsMismatch) {
  Tensor t = Tensor::zeros({2, 6});
  EXPECT_EQ(t.view({3, -1}).shape(), (Shape{3, 4}));
  EXPECT_THROW(t.view({5, -1}), std::logic_error);
  EXPECT_THROW(t.transpose(0, 1).view({12}), std::logic_error);
  EXPECT_EQ(t.transpose(0, 1).reshape({12}).shape(), (Shape{12}));
}

TEST(Tensor, PermuteAndStridedCopyRoundTrip) {
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = i * 0.5;
  Tensor t = Tensor::from_vector(v, {2, 3, 4});
  Tensor p = t.permute({2, 0, 1}).contiguous();
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  Tensor back = p.permute({1, 2, 0}).contiguous();
  EXPECT_EQ(back.to_vector<double>(), v);
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.5f, -2.25f, 1024.f, 0.f}, {4});
  EXPECT_EQ(t.to(DType::bf16).to(DType::f32).to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(t.to(DType::f16).to(DType::f32).to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(t.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 1024, 0}));
}

TEST(Tensor, WrongDtypeAccessThrows) {
  Tensor t = Tensor::zeros({2}, DType::i32);
  EXPECT_THROW(t.data<float>(), std::logic_error);
  EXPECT_NO_THROW(t.data<int32_t>());
}

TEST(Tensor, FromBlobRunsDeleterOnce) {
  int calls = 0;
  float buf[4] = {1, 2, 3, 4};
  {
    Tensor t = Tensor::from_blob(buf, {4}, DType::f32, Device::cpu(), [&](void*) { ++calls; });
    Tensor v = t.narrow(0, 1, 2);
    EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{2, 3}));
  }
  EXPECT_EQ(calls, 1);
}
