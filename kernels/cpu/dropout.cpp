// Inverted dropout with counter-based masks: forward and backward regenerate the same
// mask from (seed, stream, logical index), so nothing is stored between them.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/random.h"

namespace baton::kernels::cpu {

namespace {

constexpr int64_t kChunk = 1024;     // words generated at a time (4 KiB on the stack)
constexpr int64_t kGrain = 1 << 15;  // elements per thread before forking pays

// out[k] = (accumulate ? out[k] : 0) + in[k] * keep(k) * scale over the block.
template <class T>
void apply_mask(const T* in, T* out, double p, uint64_t seed, uint64_t stream,
                const BlockRuns& where, bool accumulate) {
  const int64_t n = where.numel();
  if (p <= 0) {
    if (accumulate)
      for (int64_t i = 0; i < n; ++i) out[i] += in[i];
    else if (out != in)
      std::copy(in, in + n, out);
    return;
  }
  if (p >= 1) {
    if (!accumulate) std::fill(out, out + n, T(0));
    return;
  }
  const uint32_t threshold = random::dropout_threshold(p);
  const T scale = T(1.0 / (1.0 - p));
  for_each_piece(where, kGrain, [&](int64_t local, int64_t logical, int64_t len) {
    // Locals, not captures: stores through dst could alias a captured float, which
    // stops the loops below from vectorising.
    const uint32_t thr = threshold;
    const T sc = scale;
    uint32_t bits[kChunk];
    for (int64_t s = 0; s < len; s += kChunk) {
      const int64_t m = std::min(kChunk, len - s);
      random_bits_fill(seed, stream, uint64_t(logical + s), m, bits);
      const T* src = in + local + s;
      T* dst = out + local + s;
      // ivdep: same-index reads and writes, safe in place (dropout of x into x).
      if (accumulate) {
#pragma GCC ivdep
        for (int64_t k = 0; k < m; ++k) dst[k] += (bits[k] >> 8) >= thr ? src[k] * sc : T(0);
      } else {
#pragma GCC ivdep
        for (int64_t k = 0; k < m; ++k) dst[k] = (bits[k] >> 8) >= thr ? src[k] * sc : T(0);
      }
    }
  });
}

}  // namespace

template <class T>
void dropout_forward(const T* x, T* y, double p, uint64_t seed, uint64_t stream,
                     const BlockRuns& where) {
  apply_mask(x, y, p, seed, stream, where, false);
}

template <class T>
void dropout_backward(const T* dy, T* dx, double p, uint64_t seed, uint64_t stream,
                      const BlockRuns& where, bool accumulate) {
  apply_mask(dy, dx, p, seed, stream, where, accumulate);
}

#define BATON_INSTANTIATE(T)                                                                    \
  template void dropout_forward<T>(const T*, T*, double, uint64_t, uint64_t, const BlockRuns&); \
  template void dropout_backward<T>(const T*, T*, double, uint64_t, uint64_t, const BlockRuns&, \
                                    bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
