// Rotary position embeddings in Hugging Face's rotate-half convention: in each head of D
// columns, pair column i with column i + D/2 (i < D/2) and rotate the pair by the angle
// (t + position_offset) * inv_freq[i]. The result is written into (or, backward, read
// from) a column range of a wider tensor: the fused qkv that attention reads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace baton::kernels::cpu {

namespace {

// cos and sin of every (position, frequency), [T][D/2] each. Float follows Hugging Face's
// float32 arithmetic (frequency and position rounded to float, their product in float),
// so logits agree to float round-off; double is exact.
template <class T>
void rotary_tables(const RotaryShape& s, const double* inv_freq, int64_t offset, std::vector<T>& cs,
                   std::vector<T>& sn) {
  const int64_t half = s.head_dim / 2;
  cs.resize(size_t(s.seq * half));
  sn.resize(size_t(s.seq * half));
  for (int64_t t = 0; t < s.seq; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double pos = double(t + offset);
      const double angle =
          std::is_same_v<T, float> ? double(float(inv_freq[i]) * float(pos)) : inv_freq[i] * pos;
      cs[size_t(t * half + i)] = T(std::cos(angle));
      sn[size_t(t * half + i)] = T(std::sin(angle));
    }
}

// Runs body(r, h, c, sv) for every row r (batch * seq of them, in parallel) and head h,
// with c and sv the cos and sin of row r's position (D/2 each).
template <class T, class Body>
void for_each_rotary_head(const RotaryShape& s, const double* inv_freq, int64_t offset,
                          Body&& body) {
  const int64_t half = s.head_dim / 2;
  // The tables of the last call, kept: every layer's q and k, forward and backward, use
  // the same positions and frequencies, and the 2 T D/2 cos and sin in double cost more
  // than the rotation itself (0.4 ms against 0.05 at T = 512, D = 64).
  struct Tables {
    int64_t seq = -1, offset = 0;
    std::vector<double> freq;
    std::vector<T> cs, sn;
  };
  thread_local Tables tab;
  if (tab.seq != s.seq || tab.offset != offset || int64_t(tab.freq.size()) != half ||
      !std::equal(tab.freq.begin(), tab.freq.end(), inv_freq)) {
    rotary_tables<T>(s, inv_freq, offset, tab.cs, tab.sn);
    tab.seq = s.seq;
    tab.offset = offset;
    tab.freq.assign(inv_freq, inv_freq + half);
  }
  // The tables by pointer: inside parallel_for another thread's tab would be its own
  // (empty) thread_local.
  const T* cos_tab = tab.cs.data();
  const T* sin_tab = tab.sn.data();
  parallel_for(s.batch * s.seq, row_grain(s.heads * s.head_dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* c = cos_tab + (r % s.seq) * half;
      const T* sv = sin_tab + (r % s.seq) * half;
      for (int64_t h = 0; h < s.heads; ++h) body(r, h, c, sv);
    }
  });
}

}  // namespace

template <class T>
void rotary_forward(const T* x, T* dst, const RotaryShape& s, const double* inv_freq,
                    int64_t offset) {
  const int64_t D = s.head_dim, half = D / 2, w = s.heads * D;
  for_each_rotary_head<T>(s, inv_freq, offset, [&](int64_t r, int64_t h, const T* c, const T* sv) {
    const T* a = x + r * w + h * D;
    T* o = dst + r * s.dst_ld + s.dst_col + h * D;
#pragma GCC ivdep
    for (int64_t i = 0; i < half; ++i) {
      const T x1 = a[i], x2 = a[i + half];
      o[i] = x1 * c[i] - x2 * sv[i];
      o[i + half] = x2 * c[i] + x1 * sv[i];
    }
  });
}

// The transpose of the rotation: rotate back by the same angle.
template <class T>
void rotary_backward(const T* ddst, T* dx, const RotaryShape& s, const double* inv_freq,
                     int64_t offset, bool accumulate) {
  const int64_t D = s.head_dim, half = D / 2, w = s.heads * D;
  for_each_rotary_head<T>(s, inv_freq, offset, [&](int64_t r, int64_t h, const T* c, const T* sv) {
    const T* g = ddst + r * s.dst_ld + s.dst_col + h * D;
    T* o = dx + r * w + h * D;
    if (accumulate) {
#pragma GCC ivdep
      for (int64_t i = 0; i < half; ++i) {
        const T g1 = g[i], g2 = g[i + half];
        o[i] += g1 * c[i] + g2 * sv[i];
        o[i + half] += g2 * c[i] - g1 * sv[i];
      }
    } else {
#pragma GCC ivdep
      for (int64_t i = 0; i < half; ++i) {
        const T g1 = g[i], g2 = g[i + half];
        o[i] = g1 * c[i] + g2 * sv[i];
        o[i + half] = g2 * c[i] - g1 * sv[i];
      }
    }
  });
}

#define BATON_INSTANTIATE(T)                                                                 \
  template void rotary_forward<T>(const T*, T*, const RotaryShape&, const double*, int64_t); \
  template void rotary_backward<T>(const T*, T*, const RotaryShape&, const double*, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
