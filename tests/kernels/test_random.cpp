// Counter-based randomness: Philox known answers, stream names, dropout (rate, scaling,
// backward mask, partition and thread-count invariance) and random_normal.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

namespace rnd = baton::kernels::random;

TEST(Philox, MatchesRandom123KnownAnswers) {
  auto eq = [](rnd::Philox4 got, std::array<uint32_t, 4> want) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want[size_t(i)]) << "word " << i;
  };
  eq(rnd::philox4x32_10(0, 0, 0, 0, 0, 0), {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  eq(rnd::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u),
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  eq(rnd::philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0),
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST(Philox, VectorisedFillMatchesTheScalarDefinition) {
  // Every head alignment, lengths around the vector batch sizes, and a start where the
  // counter's low word wraps.
  std::vector<uint32_t> bits(700);
  for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(1021),
                         (uint64_t(1) << 34) - 130})
    for (int64_t n : {0, 1, 3, 4, 5, 31, 32, 33, 127, 128, 129, 160, 511, 700}) {
      cpu::random_bits_fill(11, 12, first, n, bits.data());
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(bits[size_t(j)], rnd::random_bits(11, 12, first + uint64_t(j)))
            << "first " << first << " n " << n << " j " << j;
    }
}

TEST(Philox, DropoutThresholdIsExactlyUniformAtLeastP) {
  for (double p : {0.0, 0.1, 0.25, 0.5, 1.0 / 3.0, 0.9, 1.0}) {
    const uint32_t t = rnd::dropout_threshold(p);
    for (uint32_t k : {t == 0 ? 0u : t - 1, t, t + 1}) {
      if (k >= (1u << 24)) continue;
      const uint32_t bits = k << 8;
      EXPECT_EQ(rnd::dropout_keep(bits, t), double(rnd::uniform_from_bits(bits)) >= p)
          << "p " << p << " k " << k;
    }
  }
}

TEST(StreamOf, IsFnv1aThenSplitmixAndStable) {
  EXPECT_EQ(rnd::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(rnd::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(stream_of("h.0.attn.dropout"), rnd::splitmix64_mix(rnd::fnv1a64("h.0.attn.dropout")));
  EXPECT_NE(stream_of("h.0.attn"), stream_of("h.1.attn"));
  // Pinned (checked independently in Python): changing stream_of changes every initialisation and
  // dropout mask.
  EXPECT_EQ(stream_of("wte"), 0x71c7087570da1494ull);
}

Tensor arange(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f64);
  auto s = t.span<double>();
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 + double(i);  // never zero
  return t;
}

TEST(Dropout, KeepsExactlyTheSpecifiedElementsAndScales) {
  const int64_t n = 200003;
  const double p = 0.1;
  const uint64_t seed = 1234, stream = stream_of("drop");
  const Tensor x = arange({n});
  Tensor y = Tensor::empty({n}, DType::f64);
  dropout_forward(x, y, p, seed, stream, {});
  const auto xv = as_f64(x), yv = as_f64(y);
  const uint32_t thr = rnd::dropout_threshold(p);
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rnd::dropout_keep(rnd::random_bits(seed, stream, uint64_t(i)), thr);
    ASSERT_EQ(yv[size_t(i)], keep ? xv[size_t(i)] * (1.0 / (1.0 - p)) : 0.0) << "element " << i;
    dropped += !keep;
  }
  // Binomial(n, p): 5 standard deviations.
  EXPECT_NEAR(double(dropped), p * n, 5 * std::sqrt(n * p * (1 - p)));
}

TEST(Dropout, MaskIsRightWhereTheLowCounterWordWraps) {
  // Logical indices around 4 * 2^32, where the Philox counter's low word wraps, in a
  // block of a (never allocated) huge logical tensor; unaligned start.
  const int64_t n = 1001, start = (int64_t(1) << 34) - 503;
  const Tensor x = arange({n});
  Tensor y = Tensor::empty({n}, DType::f64);
  dropout_forward(x, y, 0.5, 3, 4, Block{{int64_t(1) << 36}, {start}});
  const auto xv = as_f64(x), yv = as_f64(y);
  const uint32_t thr = rnd::dropout_threshold(0.5);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rnd::dropout_keep(rnd::random_bits(3, 4, uint64_t(start + i)), thr);
    ASSERT_EQ(yv[size_t(i)], keep ? 2 * xv[size_t(i)] : 0.0) << "element " << i;
  }
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  std::mt19937_64 rng(test_seed(41));
  Tensor x = randn({3, 40}, rng);
  const Tensor g = randn(x.shape(), rng);
  const double p = 0.3;
  const Block whole;
  Tensor y = Tensor::empty(x.shape(), DType::f64), dx = Tensor::empty(x.shape(), DType::f64);
  dropout_forward(x, y, p, 7, 8, whole);
  dropout_backward(g, dx, p, 7, 8, whole, false);
  const auto xv = as_f64(x), yv = as_f64(y), gv = as_f64(g), dv = as_f64(dx);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(dv[i] == 0, yv[i] == 0) << i;
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::f64);
    dropout_forward(x, yy, p, 7, 8, whole);
    return dot(g, yy);
  };
  EXPECT_LT(fd_check(x, dx, loss, rng), 1e-6);
  Tensor acc = Tensor::full(x.shape(), 1.0, DType::f64);
  dropout_backward(g, acc, p, 7, 8, whole, true);
  const auto av = as_f64(acc);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(av[i], dv[i] + 1.0, 1e-15);
  Tensor y32 = Tensor::empty(x.shape(), DType::f32);
  dropout_forward(x.to(DType::f32), y32, p, 7, 8, whole);
  EXPECT_LT(rel_error(y32, y), 1e-6);
}

TEST(Dropout, ZeroAndOneRates) {
  const Tensor x = arange({100});
  Tensor y = Tensor::empty({100}, DType::f64);
  dropout_forward(x, y, 0.0, 1, 2, {});
  EXPECT_EQ(as_f64(y), as_f64(x));
  dropout_forward(x, y, 1.0, 1, 2, {});
  for (double v : as_f64(y)) EXPECT_EQ(v, 0.0);
}

// Copies the block [offsets, offsets + shape) out of a contiguous f64 tensor.
Tensor block_of(const Tensor& full, const Shape& offsets, const Shape& shape) {
  Tensor t = full;
  for (size_t d = 0; d < shape.size(); ++d) t = t.narrow(int64_t(d), offsets[d], shape[d]);
  return t.contiguous();
}

TEST(Dropout, ABlockEqualsTheSameBlockOfTheWhole) {
  const Shape global{6, 10, 13};
  const Tensor x = arange(global);
  Tensor full = Tensor::empty(global, DType::f64);
  dropout_forward(x, full, 0.5, 99, 3, {});
  for (auto [off, shape] : {std::pair{Shape{2, 3, 4}, Shape{3, 5, 6}},  // inner block
                            {Shape{2, 0, 0}, Shape{3, 10, 13}},         // rows only: one run
                            {Shape{0, 4, 0}, Shape{6, 2, 13}},
                            {Shape{5, 9, 12}, Shape{1, 1, 1}}}) {
    const Tensor xb = block_of(x, off, shape);
    Tensor yb = Tensor::empty(shape, DType::f64);
    dropout_forward(xb, yb, 0.5, 99, 3, Block{global, off});
    EXPECT_EQ(as_f64(yb), as_f64(block_of(full, off, shape))) << memory::shape_str(off);
    Tensor db = Tensor::empty(shape, DType::f64);
    dropout_backward(xb, db, 0.5, 99, 3, Block{global, off}, false);
    EXPECT_EQ(as_f64(db), as_f64(yb));
  }
}

TEST(Dropout, ResultsDoNotDependOnTheThreadCount) {
  const int64_t n = 300001;  // several threading grains, not a multiple of anything
  std::mt19937_64 rng(test_seed(42));
  const Tensor x = randn({n}, rng, 1.0, DType::f32);
  Tensor y1 = Tensor::empty({n}, DType::f32), y2 = Tensor::empty({n}, DType::f32);
  const int before = num_threads();
  set_num_threads(1);
  dropout_forward(x, y1, 0.2, 5, 6, {});
  set_num_threads(2);
  dropout_forward(x, y2, 0.2, 5, 6, {});
  set_num_threads(before);
  EXPECT_EQ(std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes()), 0);
}

TEST(RandomNormal, HasTheRequestedMeanAndStd) {
  const int64_t n = 200000;
  Tensor t = Tensor::empty({n}, DType::f64);
  random_normal(t, 0.5, 2.0, 17, stream_of("w"), {});
  const auto v = as_f64(t);
  double s = 0, s2 = 0;
  int64_t within = 0;
  for (double x : v) {
    s += x;
    s2 += x * x;
    within += std::abs(x - 0.5) < 2.0;
  }
  const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.5, 5 * 2.0 / std::sqrt(double(n)));
  EXPECT_NEAR(sd, 2.0, 5 * 2.0 / std::sqrt(2.0 * n));
  EXPECT_NEAR(double(within) / n, 0.682689, 5 * std::sqrt(0.6827 * 0.3173 / n));
  // float32 receives the same numbers, rounded.
  Tensor t32 = Tensor::empty({n}, DType::f32);
  random_normal(t32, 0.5, 2.0, 17, stream_of("w"), {});
  const auto v32 = as_f64(t32);
  for (size_t i = 0; i < v.size(); i += 997) EXPECT_EQ(v32[i], double(float(v[i])));
}

TEST(RandomNormal, BlocksAndStreams) {
  const Shape global{8, 12};
  Tensor full = Tensor::empty(global, DType::f64);
  random_normal(full, 0, 1, 3, 4, {});
  for (auto [off, shape] : {std::pair{Shape{0, 5}, Shape{8, 7}}, {Shape{3, 0}, Shape{2, 12}}}) {
    Tensor b = Tensor::empty(shape, DType::f64);
    random_normal(b, 0, 1, 3, 4, Block{global, off});
    EXPECT_EQ(as_f64(b), as_f64(block_of(full, off, shape)));
  }
  Tensor other = Tensor::empty(global, DType::f64);
  random_normal(other, 0, 1, 3, 5, {});
  EXPECT_NE(as_f64(other), as_f64(full));
}

// Each element is normal_from_group's value for its logical index, to the bit: whole
// pairs are drawn together (one log, one sincos) and a pair cut by a block's or a
// piece's edge one element at a time. Columns 1-39998 of 3 rows of 40,000 start every
// row and every piece of 16,384 at a different word of a group.
TEST(RandomNormal, EveryElementIsItsGroupsNormal) {
  const Shape global{3, 40000}, offset{0, 1}, shape{3, 39998};
  Tensor b = Tensor::empty(shape, DType::f64);
  // Mean 0 and std 1: mean + std * x is x however a compiler contracts it.
  random_normal(b, 0.0, 1.0, 11, 12, Block{global, offset});
  const auto v = as_f64(b);
  int64_t differ = 0;
  for (int64_t r = 0; r < shape[0]; ++r)
    for (int64_t c = 0; c < shape[1]; ++c) {
      const uint64_t i = uint64_t(r * global[1] + c + offset[1]);
      const double want =
          rnd::normal_from_group(rnd::philox_group(11, 12, i >> 2), unsigned(i & 3));
      differ += std::memcmp(&want, &v[size_t(r * shape[1] + c)], sizeof want) != 0;
    }
  EXPECT_EQ(differ, 0);
}

TEST(Block, RejectsABlockOutsideItsTensor) {
  Tensor x = Tensor::zeros({4, 4}), y = Tensor::zeros({4, 4});
  EXPECT_THROW(dropout_forward(x, y, 0.5, 1, 1, Block{{4, 6}, {0, 3}}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, 0.5, 1, 1, Block{{16}, {0}}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, 1.5, 1, 1, {}), std::invalid_argument);
}

}  // namespace
}  // namespace baton::kernels::test
