#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "memory/tensor.h"

using namespace baton::memory;

// An element count beyond int64 is no count: signed overflow had wrapped silently.
TEST(Tensor, ShapeNumelRefusesOverflow) {
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(checked_shape_numel({2, 3, 4}), 24);
  const Shape huge{int64_t(1) << 61, 8};
  EXPECT_THROW(shape_numel(huge), std::logic_error);
  EXPECT_FALSE(checked_shape_numel(huge).has_value());
  EXPECT_FALSE(checked_shape_numel({4, -1}).has_value());
  // The count fits but its bytes do not: 2^62 floats had made a tensor of 0 bytes.
  EXPECT_THROW(Tensor::empty({int64_t(1) << 62}, DType::f32), std::logic_error);
}

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
  // Negative sizes other than -1 (their product had passed as 12), a narrow whose end
  // overflows, and a view of no elements (contiguous, as in torch: its view() had thrown).
  EXPECT_THROW(t.view({-2, -6}), std::logic_error);
  EXPECT_THROW(t.narrow(1, 1, INT64_MAX), std::logic_error);
  Tensor none = t.narrow(1, 0, 0);
  EXPECT_TRUE(none.is_contiguous());
  EXPECT_EQ(none.view({0}).numel(), 0);
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

// copy_from's row copies (for_each_row_block + copy_rows, as on a device) against an
// element-by-element copy over random narrowed and permuted views on either side; and a
// fused qkv's column range is one 2-D copy.
TEST(Tensor, RowBlocksCopyLikeElementByElement) {
  const unsigned seed = 20261204;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto random_view = [&](const Tensor& t) {
    Tensor v = t;
    for (int64_t d = 0; d < v.dim(); ++d)
      if (pick(0, 1)) {
        int64_t n = v.size(d), len = pick(1, n);
        v = v.narrow(d, pick(0, n - len), len);
      }
    if (pick(0, 2) == 0) {
      std::vector<int64_t> order(size_t(v.dim()));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      v = v.permute(order);
    }
    return v;
  };
  for (int trial = 0; trial < 200; ++trial) {
    Shape shape;
    for (int64_t d = 0, n = pick(1, 4); d < n; ++d) shape.push_back(pick(1, 6));
    std::vector<double> values(
        size_t(std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>())));
    std::iota(values.begin(), values.end(), 1.0);
    Tensor src = random_view(Tensor::from_vector(values, shape));
    // The destination: the same shape, itself a narrowed view of a larger zeroed tensor.
    Shape big = src.shape();
    std::vector<int64_t> offset(big.size());
    for (size_t d = 0; d < big.size(); ++d)
      offset[d] = pick(0, 2), big[d] += offset[d] + pick(0, 2);
    Tensor host = Tensor::zeros(big, DType::f64), rows = Tensor::zeros(big, DType::f64);
    Tensor want = host, got = rows;
    for (size_t d = 0; d < big.size(); ++d) {
      want = want.narrow(int64_t(d), offset[d], src.size(int64_t(d)));
      got = got.narrow(int64_t(d), offset[d], src.size(int64_t(d)));
    }
    // The reference: each element by its multi-index.
    const int64_t rank = src.dim();
    std::vector<int64_t> at(size_t(rank), 0);
    for (int64_t e = 0; e < src.numel(); ++e) {
      int64_t od = 0, os = 0;
      for (int64_t d = 0; d < rank; ++d)
        od += at[size_t(d)] * want.strides()[size_t(d)],
            os += at[size_t(d)] * src.strides()[size_t(d)];
      static_cast<double*>(want.raw_data())[od] = static_cast<const double*>(src.raw_data())[os];
      for (int64_t d = rank - 1; d >= 0 && ++at[size_t(d)] == src.size(d); --d) at[size_t(d)] = 0;
    }
    got.copy_from(src);
    ASSERT_EQ(rows.to_vector<double>(), host.to_vector<double>()) << "trial " << trial;
  }
  Tensor qkv = Tensor::zeros({8, 64, 256}), v = Tensor::zeros({8, 64, 64});
  std::vector<RowCopy> calls;
  Tensor cols = qkv.narrow(2, 192, 64);
  for_each_row_block(cols.shape(), cols.strides(), v.strides(), sizeof(float),
                     static_cast<char*>(cols.raw_data()), static_cast<const char*>(v.raw_data()),
                     [&](const RowCopy& c) { calls.push_back(c); });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].rows, 8u * 64u);
  EXPECT_EQ(calls[0].width, 64 * sizeof(float));
  EXPECT_EQ(calls[0].dst_pitch, 256 * sizeof(float));
  EXPECT_EQ(calls[0].src_pitch, 64 * sizeof(float));
}
