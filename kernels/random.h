// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11) and the exact way
// baton turns its output into uniforms, dropout masks and normals. Every backend must
// produce the same bits, so the definitions here are the specification; the functions
// are plain inline code that compiles for host and (under nvcc) device.
//
// An element with logical index i of a tensor drawn from (seed, stream) takes word
// i % 4 of philox4x32_10(counter, key) with
//   key     = {lo32(seed), hi32(seed)}
//   counter = {lo32(i / 4), hi32(i / 4), lo32(stream), hi32(stream)}.
// So the value depends only on (seed, stream, i): not on partitioning, threads or
// micro-batch splits, and different streams never share a counter.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define BATON_HD __host__ __device__ __forceinline__
#else
#define BATON_HD inline
#endif

namespace baton::kernels::random {

struct Philox4 {
  uint32_t v[4];
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// Philox4x32 with 10 rounds on counter c and key (k0, k1).
BATON_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t(kPhiloxM0) * c0;
    const uint64_t p1 = uint64_t(kPhiloxM1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
  }
  return {{c0, c1, c2, c3}};
}

// The four words of the group that holds element i (elements 4g .. 4g+3).
BATON_HD Philox4 philox_group(uint64_t seed, uint64_t stream, uint64_t group) {
  return philox4x32_10(uint32_t(group), uint32_t(group >> 32), uint32_t(stream),
                       uint32_t(stream >> 32), uint32_t(seed), uint32_t(seed >> 32));
}

// The 32 random bits of element i.
BATON_HD uint32_t random_bits(uint64_t seed, uint64_t stream, uint64_t i) {
  return philox_group(seed, stream, i >> 2).v[i & 3];
}

// uniform(bits) = (bits >> 8) * 2^-24, exactly representable in float: [0, 1).
BATON_HD float uniform_from_bits(uint32_t bits) {
  return float(bits >> 8) * (1.0f / 16777216.0f);
}

// Dropout keeps element i when uniform(i) >= p. As an integer test on the top 24 bits:
// keep when (bits >> 8) >= dropout_threshold(p) = ceil(p * 2^24) (exactly equivalent).
BATON_HD uint32_t dropout_threshold(double p) {
  if (p <= 0) return 0;
  if (p >= 1) return 1u << 24;  // nothing passes
  const double t = p * 16777216.0;
  const uint32_t f = uint32_t(t);
  return double(f) == t ? f : f + 1;
}
BATON_HD bool dropout_keep(uint32_t bits, uint32_t threshold) {
  return (bits >> 8) >= threshold;
}

// Normals by Box-Muller, in double: the words (0, 1) of a group make one pair, (2, 3)
// the other. u1 = (w_even + 0.5) * 2^-32 lies in (0, 1), so log never sees 0;
// u2 = w_odd * 2^-32. Element with word 2j gets r cos(2 pi u2), word 2j+1 r sin(2 pi u2),
// r = sqrt(-2 log u1). f32 tensors get these doubles rounded to float. (Backends agree
// to the round-off of their log/cos/sin, not bit for bit.)
// box_muller gives a pair's r and angle (pair = 0 or 2), which both its elements share.
BATON_HD void box_muller(const Philox4& g, unsigned pair, double& r, double& theta) {
  const double u1 = (double(g.v[pair]) + 0.5) * (1.0 / 4294967296.0);
  const double u2 = double(g.v[pair + 1]) * (1.0 / 4294967296.0);
  r = ::sqrt(-2.0 * ::log(u1));
  theta = 6.283185307179586476925286766559 * u2;
}
BATON_HD double normal_from_group(const Philox4& g, unsigned word) {
  double r = 0, theta = 0;
  box_muller(g, word & ~1u, r, theta);
  return (word & 1u) ? r * ::sin(theta) : r * ::cos(theta);
}
}  // namespace baton::kernels::random

// stream_of (ops.h) is FNV-1a 64 over the name's bytes followed by the splitmix64
// finaliser (so similar names give unrelated streams). Host only.
namespace baton::kernels::random {

inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

inline uint64_t stream_hash(std::string_view name) {
  return splitmix64_mix(fnv1a64(name));
}

}  // namespace baton::kernels::random
