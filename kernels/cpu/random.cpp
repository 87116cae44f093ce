// Counter-based random numbers on the CPU: Philox words for a range of logical indices
// (vectorised across 16 counters), blocks of logical tensors, and random_normal.
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/random.h"

namespace baton::kernels::cpu {

using namespace baton::kernels::random;

BlockRuns block_runs(const std::vector<int64_t>& local_shape,
                     const std::vector<int64_t>& global_shape,
                     const std::vector<int64_t>& offsets) {
  BlockRuns br;
  int64_t numel = 1;
  for (int64_t d : local_shape) numel *= d;
  if (global_shape.empty() || local_shape.empty()) {
    br.run_length = numel;
    return br;
  }
  const int rank = int(local_shape.size());
  std::array<int64_t, kMaxBlockRank> gstride{};
  gstride[size_t(rank - 1)] = 1;
  for (int d = rank - 1; d-- > 0;)
    gstride[size_t(d)] = gstride[size_t(d + 1)] * global_shape[size_t(d + 1)];
  for (int d = 0; d < rank; ++d) br.base += offsets[size_t(d)] * gstride[size_t(d)];
  // The run: the last dim, extended upwards while the dims inside it are whole.
  int k = rank - 1;
  br.run_length = local_shape[size_t(k)];
  while (k > 0 && local_shape[size_t(k)] == global_shape[size_t(k)]) {
    --k;
    br.run_length *= local_shape[size_t(k)];
  }
  br.outer_rank = k;
  br.runs = 1;
  for (int d = 0; d < k; ++d) {
    br.outer_shape[size_t(d)] = local_shape[size_t(d)];
    br.outer_strides[size_t(d)] = gstride[size_t(d)];
    br.runs *= local_shape[size_t(d)];
  }
  return br;
}

namespace {

#if defined(__AVX512F__)
// GCC 12 reports its own intrinsics' _mm512_undefined_* as maybe uninitialised at -O3.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// out[4 l + w] = word w of the group g0 + l, for l < 8 * NB. Each counter sits in a
// 64-bit lane, so vpmuludq yields its full product directly; the words only need their
// low 32 bits, so high garbage is left in place until the final shuffle. NB independent
// vectors are interleaved to hide the multiplies' latency. The caller guarantees that
// lo32(g0) + 8 * NB - 1 does not wrap.
constexpr int64_t kGroupsPerVector = 8;
template <int NB>
void philox_batch(uint64_t g0, uint32_t s0, uint32_t s1, uint32_t key0, uint32_t key1,
                  uint32_t* out) {
  const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  __m512i c0[NB], c1[NB], c2[NB], c3[NB];
  for (int b = 0; b < NB; ++b) {
    c0[b] = _mm512_add_epi64(_mm512_set1_epi64(int64_t(uint32_t(g0) + uint32_t(8 * b))), iota);
    c1[b] = _mm512_set1_epi64(int64_t(uint32_t(g0 >> 32)));
    c2[b] = _mm512_set1_epi64(int64_t(s0));
    c3[b] = _mm512_set1_epi64(int64_t(s1));
  }
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0), m1 = _mm512_set1_epi64(kPhiloxM1);
  uint32_t k0 = key0, k1 = key1;
  for (int r = 0; r < 10; ++r) {
    const __m512i kk0 = _mm512_set1_epi64(k0), kk1 = _mm512_set1_epi64(k1);
    for (int b = 0; b < NB; ++b) {
      const __m512i p0 = _mm512_mul_epu32(c0[b], m0);  // uses the low 32 bits of c0
      const __m512i p1 = _mm512_mul_epu32(c2[b], m1);
      // 0x96: a ^ b ^ c. High halves are garbage and never read as such.
      c0[b] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[b], kk0, 0x96);
      c2[b] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[b], kk1, 0x96);
      c1[b] = p1;
      c3[b] = p0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  // Low dwords into element order: (c0 c1) and (c2 c3) pairs, then pairs of pairs.
  const __m512i pair = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
  const __m512i first = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i second = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  for (int b = 0; b < NB; ++b) {
    const __m512i ab = _mm512_permutex2var_epi32(c0[b], pair, c1[b]);
    const __m512i cd = _mm512_permutex2var_epi32(c2[b], pair, c3[b]);
    _mm512_storeu_si512(out + 32 * b, _mm512_permutex2var_epi64(ab, first, cd));
    _mm512_storeu_si512(out + 32 * b + 16, _mm512_permutex2var_epi64(ab, second, cd));
  }
}
#pragma GCC diagnostic pop
#else
constexpr int64_t kGroupsPerVector = 16;
// Portable version, written lane-wise so the compiler vectorises the rounds.
template <int NB>
void philox_batch(uint64_t g0, uint32_t s0, uint32_t s1, uint32_t key0, uint32_t key1,
                  uint32_t* __restrict out) {
  constexpr int L = int(kGroupsPerVector) * NB;
  uint32_t c0[L], c1[L], c2[L], c3[L];
  for (int l = 0; l < L; ++l) {
    const uint64_t g = g0 + uint64_t(l);
    c0[l] = uint32_t(g);
    c1[l] = uint32_t(g >> 32);
    c2[l] = s0;
    c3[l] = s1;
  }
  uint32_t k0 = key0, k1 = key1;
  for (int r = 0; r < 10; ++r) {
    for (int l = 0; l < L; ++l) {
      const uint64_t p0 = uint64_t(kPhiloxM0) * c0[l];
      const uint64_t p1 = uint64_t(kPhiloxM1) * c2[l];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[l] ^ k0;
      const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[l] ^ k1;
      c0[l] = n0;
      c1[l] = uint32_t(p1);
      c2[l] = n2;
      c3[l] = uint32_t(p0);
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int l = 0; l < L; ++l) {
    out[4 * l + 0] = c0[l];
    out[4 * l + 1] = c1[l];
    out[4 * l + 2] = c2[l];
    out[4 * l + 3] = c3[l];
  }
}
#endif

// Words per philox_batch<NB> call.
template <int NB>
constexpr int64_t kWords = 4 * kGroupsPerVector* NB;

// bits[j] = random_bits(first + j) for j < kWords<NB>, first a multiple of 4.
template <int NB>
void words(uint64_t seed, uint64_t stream, uint64_t first, uint32_t* bits) {
  const uint64_t g = first >> 2;
  if (uint32_t(g) > 0xFFFFFFFFu - uint32_t(kWords<NB> / 4)) {  // the counter's low word wraps
    for (int64_t j = 0; j < kWords<NB>; ++j)
      bits[j] = random_bits(seed, stream, first + uint64_t(j));
    return;
  }
  philox_batch<NB>(g, uint32_t(stream), uint32_t(stream >> 32), uint32_t(seed),
                   uint32_t(seed >> 32), bits);
}

}  // namespace

void random_bits_fill(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* bits) {
  int64_t k = 0;
  if ((first & 3u) != 0 && n > 0) {  // unaligned head: the rest of the first group
    const Philox4 g = philox_group(seed, stream, first >> 2);
    for (unsigned w = unsigned(first & 3u); w < 4 && k < n; ++w) bits[k++] = g.v[w];
  }
  for (; k + kWords<4> <= n; k += kWords<4>) words<4>(seed, stream, first + uint64_t(k), bits + k);
  for (; k + kWords<1> <= n; k += kWords<1>) words<1>(seed, stream, first + uint64_t(k), bits + k);
  if (k < n) {  // a partial batch: generate it whole and keep what is wanted
    uint32_t tail[kWords<1>];
    words<1>(seed, stream, first + uint64_t(k), tail);
    std::copy(tail, tail + (n - k), bits + k);
  }
}

template <class T>
void random_normal(T* out, double mean, double std, uint64_t seed, uint64_t stream,
                   const BlockRuns& where) {
  for_each_piece(where, 1 << 14, [&](int64_t local, int64_t logical, int64_t n) {
    int64_t k = 0;
    while (k < n) {
      const uint64_t i = uint64_t(logical + k);
      const Philox4 g = philox_group(seed, stream, i >> 2);
      for (unsigned w = unsigned(i & 3); w < 4 && k < n;) {
        if ((w & 1u) == 0 && k + 1 < n) {
          // Both elements of a pair: normal_from_group's values with one log and square
          // root, and cos and sin from one sincos (glibc's gives their bits: 2e8 angles
          // compared). 18.4 to 15.8 ns a normal; a profile of GPT-2 124M draws billions.
          double r = 0, theta = 0;
          box_muller(g, w, r, theta);
          double sin_t = 0, cos_t = 0;
          ::sincos(theta, &sin_t, &cos_t);
          out[local + k] = T(mean + std * (r * cos_t));
          out[local + k + 1] = T(mean + std * (r * sin_t));
          w += 2;
          k += 2;
        } else {
          out[local + k] = T(mean + std * normal_from_group(g, w));
          ++w;
          ++k;
        }
      }
    }
  });
}

template void random_normal<float>(float*, double, double, uint64_t, uint64_t, const BlockRuns&);
template void random_normal<double>(double*, double, double, uint64_t, uint64_t, const BlockRuns&);

}  // namespace baton::kernels::cpu
