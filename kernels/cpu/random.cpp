// Counter-based random numbers on the CPU: Philox words for a range of logical indices
// (vectorised across 16 counters), blocks of logical tensors, and random_normal.
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
  const size_t rank = local_shape.size();
  std::vector<int64_t> gstride(rank, 1);
  for (size_t d = rank - 1; d-- > 0;) gstride[d] = gstride[d + 1] * global_shape[d + 1];
  for (size_t d = 0; d < rank; ++d) br.base += offsets[d] * gstride[d];
  // The run: the last dim, extended upwards while the dims inside it are whole.
  size_t k = rank - 1;
  br.run_length = local_shape[k];
  while (k > 0 && local_shape[k] == global_shape[k]) {
    --k;
    br.run_length *= local_shape[k];
  }
  br.outer_shape.assign(local_shape.begin(), local_shape.begin() + k);
  br.outer_strides.assign(gstride.begin(), gstride.begin() + k);
  br.runs = 1;
  for (int64_t d : br.outer_shape) br.runs *= d;
  return br;
}

namespace {

constexpr int kLanes = 16;  // counters per vectorised batch (64 words)

// out[4 l + w] = word w of the group g0 + l, for l < kLanes. Written lane-wise so the
// compiler vectorises the rounds (32x32->64 multiplies become vpmuludq).
void philox_batch(uint64_t g0, uint32_t s0, uint32_t s1, uint32_t key0, uint32_t key1,
                  uint32_t* __restrict out) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t g = g0 + uint64_t(l);
    c0[l] = uint32_t(g);
    c1[l] = uint32_t(g >> 32);
    c2[l] = s0;
    c3[l] = s1;
  }
  uint32_t k0 = key0, k1 = key1;
  for (int r = 0; r < 10; ++r) {
    for (int l = 0; l < kLanes; ++l) {
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
  for (int l = 0; l < kLanes; ++l) {
    out[4 * l + 0] = c0[l];
    out[4 * l + 1] = c1[l];
    out[4 * l + 2] = c2[l];
    out[4 * l + 3] = c3[l];
  }
}

}  // namespace

void random_bits_fill(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* bits) {
  int64_t k = 0;
  // Unaligned head, one word at a time, up to a group boundary.
  while (k < n && ((first + uint64_t(k)) & 3u) != 0) {
    bits[k] = random_bits(seed, stream, first + uint64_t(k));
    ++k;
  }
  const uint32_t s0 = uint32_t(stream), s1 = uint32_t(stream >> 32);
  const uint32_t key0 = uint32_t(seed), key1 = uint32_t(seed >> 32);
  for (; k + 4 * kLanes <= n; k += 4 * kLanes)
    philox_batch((first + uint64_t(k)) >> 2, s0, s1, key0, key1, bits + k);
  // Tail: whole groups, then the last partial one.
  for (; k < n; ++k) bits[k] = random_bits(seed, stream, first + uint64_t(k));
}

template <class T>
void random_normal(T* out, double mean, double std, uint64_t seed, uint64_t stream,
                   const BlockRuns& where) {
  for_each_piece(where, 1 << 14, [&](int64_t local, int64_t logical, int64_t n) {
    int64_t k = 0;
    while (k < n) {
      const uint64_t i = uint64_t(logical + k);
      const Philox4 g = philox_group(seed, stream, i >> 2);
      for (unsigned w = unsigned(i & 3); w < 4 && k < n; ++w, ++k)
        out[local + k] = T(mean + std * normal_from_group(g, w));
    }
  });
}

template void random_normal<float>(float*, double, double, uint64_t, uint64_t, const BlockRuns&);
template void random_normal<double>(double*, double, double, uint64_t, uint64_t,
                                    const BlockRuns&);

}  // namespace baton::kernels::cpu
