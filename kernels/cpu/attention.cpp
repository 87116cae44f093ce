// Causal multi-head self-attention, flash style: queries in blocks of kBlockQ rows, keys
// in chunks of up to kChunkK, an online softmax across chunks, and only the output and
// each row's log-sum-exp saved. Backward recomputes the probabilities chunk by chunk.
// The products run as OpenBLAS GEMMs straight on the strided q/k/v columns of qkv (no
// copies); chunks beyond the diagonal are never computed. Scratch is per thread,
// O(kBlockQ * kChunkK), reused across calls: memory does not grow with T^2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"
#include "kernels/random.h"

namespace baton::kernels::cpu {

namespace {

constexpr int64_t kBlockQ = 64;   // query rows per block
constexpr int64_t kChunkK = 512;  // keys per chunk: T <= 512 needs no online rescaling

template <class T>
T* scratch(size_t n, int which) {
  thread_local std::vector<T> bufs[4];
  auto& b = bufs[which];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// The attention geometry of one (batch, head) pair, pointers into qkv-shaped buffers.
struct Geometry {
  int64_t T, H, D, ld, ldo;  // ld: row stride of qkv, ldo: of out
  int64_t q_col(int64_t h) const { return h * D; }
  int64_t k_col(int64_t h) const { return (H + h) * D; }
  int64_t v_col(int64_t h) const { return (2 * H + h) * D; }
};

struct Dropout {
  bool on = false;
  uint32_t threshold = 0;
  double scale = 1;
  uint64_t seed = 0, stream = 0;
  int64_t global_heads = 0, batch_offset = 0, head_offset = 0;
  // Logical index of score (i, 0) of head h in batch b: [B_global, H_global, T, T].
  uint64_t row_base(int64_t b, int64_t h, int64_t i, int64_t T) const {
    return uint64_t((((b + batch_offset) * global_heads + (h + head_offset)) * T + i) * T);
  }
};

Dropout make_dropout(const AttentionOptions& opt, int64_t heads) {
  Dropout d;
  d.on = opt.dropout > 0;
  if (!d.on) return d;
  d.threshold = random::dropout_threshold(opt.dropout);
  d.scale = opt.dropout < 1 ? 1.0 / (1.0 - opt.dropout) : 0.0;
  d.seed = opt.seed;
  d.stream = opt.stream;
  d.global_heads = opt.global_heads > 0 ? opt.global_heads : heads;
  d.batch_offset = opt.batch_offset;
  d.head_offset = opt.head_offset;
  return d;
}

// Keys of chunk [c0, c0 + kc) visible to query i (causal): the first `valid` of them.
inline int64_t visible(int64_t i, int64_t c0, int64_t kc) {
  return std::clamp<int64_t>(i - c0 + 1, 0, kc);
}

template <class T>
void forward_block(const T* qkv, T* out, T* lse, const Geometry& g, const Dropout& dr, T scale,
                   int64_t b, int64_t h, int64_t i0, int64_t i1) {
  const int64_t rows = i1 - i0, D = g.D, ld = g.ld;
  const T* q = qkv + (b * g.T + i0) * ld + g.q_col(h);
  T* o = out + (b * g.T + i0) * g.ldo + h * D;
  T* s = scratch<T>(size_t(kBlockQ * kChunkK), 0);
  T* m = scratch<T>(size_t(kBlockQ), 1);
  T* l = scratch<T>(size_t(kBlockQ), 2);
  uint32_t* bits = scratch<uint32_t>(size_t(kChunkK), 3);
  std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
  std::fill(l, l + rows, T(0));
  for (int64_t c0 = 0; c0 < i1; c0 += kChunkK) {
    const int64_t kc = std::min(kChunkK, i1 - c0);
    const T* k = qkv + (b * g.T + c0) * ld + g.k_col(h);
    const T* v = qkv + (b * g.T + c0) * ld + g.v_col(h);
    gemm<T>(false, true, rows, kc, D, scale, q, ld, k, ld, T(0), s, kc);
    for (int64_t r = 0; r < rows; ++r) {
      T* sr = s + r * kc;
      const int64_t n = visible(i0 + r, c0, kc);
      const T mx = std::max(m[r], reduce_max(sr, n));
      const T sum = exp_shifted_sum(sr, mx, sr, n);
      std::fill(sr + n, sr + kc, T(0));
      if (c0 > 0 && mx != m[r]) {  // the running maximum moved: rescale what we have
        const T alpha = vexp(T(m[r] - mx));
        l[r] *= alpha;
        T* orow = o + r * g.ldo;
        for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
      }
      m[r] = mx;
      l[r] += sum;
      if (dr.on && n > 0) {
        random_bits_fill(dr.seed, dr.stream, dr.row_base(b, h, i0 + r, g.T) + uint64_t(c0), n,
                         bits);
        const T ds = T(dr.scale);
        for (int64_t j = 0; j < n; ++j) sr[j] = (bits[j] >> 8) >= dr.threshold ? sr[j] * ds : T(0);
      }
    }
    // The first chunk overwrites the output block (beta 0), later ones add to it.
    gemm<T>(false, false, rows, D, kc, T(1), s, kc, v, ld, c0 == 0 ? T(0) : T(1), o, g.ldo);
  }
  T* lrow = lse + (b * g.H + h) * g.T + i0;
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = T(1) / l[r];
    T* orow = o + r * g.ldo;
    for (int64_t d = 0; d < D; ++d) orow[d] *= inv;
    lrow[r] = m[r] + std::log(l[r]);
  }
}

template <class T>
void backward_head(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                   const Geometry& g, const Dropout& dr, T scale, int64_t b, int64_t h,
                   bool accumulate) {
  const int64_t D = g.D, ld = g.ld;
  if (!accumulate)
    for (int64_t i = 0; i < g.T; ++i) {
      T* row = dqkv + (b * g.T + i) * ld;
      std::fill(row + g.q_col(h), row + g.q_col(h) + D, T(0));
      std::fill(row + g.k_col(h), row + g.k_col(h) + D, T(0));
      std::fill(row + g.v_col(h), row + g.v_col(h) + D, T(0));
    }
  T* p = scratch<T>(size_t(kBlockQ * kChunkK), 0);
  T* dp = scratch<T>(size_t(kBlockQ * kChunkK), 1);
  T* pd = dr.on ? scratch<T>(size_t(kBlockQ * kChunkK), 2) : p;  // dropped probabilities
  T* di = scratch<T>(size_t(kBlockQ), 3);
  const T* lrow = lse + (b * g.H + h) * g.T;
  for (int64_t i0 = 0; i0 < g.T; i0 += kBlockQ) {
    const int64_t i1 = std::min(g.T, i0 + kBlockQ), rows = i1 - i0;
    const T* q = qkv + (b * g.T + i0) * ld + g.q_col(h);
    T* dq = dqkv + (b * g.T + i0) * ld + g.q_col(h);
    const T* o = out + (b * g.T + i0) * g.ldo + h * D;
    const T* dO = dout + (b * g.T + i0) * g.ldo + h * D;
    // di = rowsum(dO * O) = rowsum(P' * dP') for the dropped P' that made O.
    for (int64_t r = 0; r < rows; ++r) {
      di[r] = sum_of<T>(D, [&](int64_t d) { return dO[r * g.ldo + d] * o[r * g.ldo + d]; });
    }
    for (int64_t c0 = 0; c0 < i1; c0 += kChunkK) {
      const int64_t kc = std::min(kChunkK, i1 - c0);
      const T* k = qkv + (b * g.T + c0) * ld + g.k_col(h);
      const T* v = qkv + (b * g.T + c0) * ld + g.v_col(h);
      T* dk = dqkv + (b * g.T + c0) * ld + g.k_col(h);
      T* dv = dqkv + (b * g.T + c0) * ld + g.v_col(h);
      // P = exp(scale q k^T - lse), zero above the diagonal.
      gemm<T>(false, true, rows, kc, D, scale, q, ld, k, ld, T(0), p, kc);
      for (int64_t r = 0; r < rows; ++r) {
        T* pr = p + r * kc;
        const int64_t n = visible(i0 + r, c0, kc);
        const T lr = lrow[i0 + r];
        exp_shifted_scaled(pr, lr, T(1), pr, n);
        std::fill(pr + n, pr + kc, T(0));
        if (dr.on) {
          T* pdr = pd + r * kc;
          uint32_t bits[kChunkK];
          random_bits_fill(dr.seed, dr.stream, dr.row_base(b, h, i0 + r, g.T) + uint64_t(c0), n,
                           bits);
          const T ds = T(dr.scale);
          for (int64_t j = 0; j < n; ++j) pdr[j] = (bits[j] >> 8) >= dr.threshold ? pr[j] * ds : T(0);
          std::fill(pdr + n, pdr + kc, T(0));
        }
      }
      // dV += P'^T dO;  dP' = dO V^T.
      gemm<T>(true, false, kc, D, rows, T(1), pd, kc, dO, g.ldo, T(1), dv, ld);
      gemm<T>(false, true, rows, kc, D, T(1), dO, g.ldo, v, ld, T(0), dp, kc);
      // dS = P' * dP' - P * di (with dropout P' = P * mask * scale; without, P' = P).
      for (int64_t r = 0; r < rows; ++r) {
        T* dpr = dp + r * kc;
        const T* pr = p + r * kc;
        const T* pdr = pd + r * kc;
        const T dd = di[r];
#pragma GCC ivdep
        for (int64_t j = 0; j < kc; ++j) dpr[j] = pdr[j] * dpr[j] - pr[j] * dd;
      }
      // dQ += scale dS K;  dK += scale dS^T Q.
      gemm<T>(false, false, rows, D, kc, scale, dp, kc, k, ld, T(1), dq, ld);
      gemm<T>(true, false, kc, D, rows, scale, dp, kc, q, ld, T(1), dk, ld);
    }
  }
}

}  // namespace

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s,
                       const AttentionOptions& opt) {
  const Geometry g{s.seq, s.heads, s.head_dim, 3 * s.heads * s.head_dim, s.heads * s.head_dim};
  const Dropout dr = make_dropout(opt, s.heads);
  const T scale = T(opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(double(s.head_dim)));
  const int64_t pairs = s.batch * s.heads, blocks = (s.seq + kBlockQ - 1) / kBlockQ;
  // Costliest (last) query blocks first, so dynamic scheduling balances the causal work.
  parallel_tasks(pairs * blocks, [&](int64_t t) {
    const int64_t qb = blocks - 1 - t / pairs, bh = t % pairs;
    const int64_t i0 = qb * kBlockQ, i1 = std::min(s.seq, i0 + kBlockQ);
    forward_block<T>(qkv, out, lse, g, dr, scale, bh / s.heads, bh % s.heads, i0, i1);
  });
}

template <class T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                        const AttentionShape& s, const AttentionOptions& opt, bool accumulate) {
  const Geometry g{s.seq, s.heads, s.head_dim, 3 * s.heads * s.head_dim, s.heads * s.head_dim};
  const Dropout dr = make_dropout(opt, s.heads);
  const T scale = T(opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(double(s.head_dim)));
  // One (batch, head) pair per task: its dK and dV sum over all query blocks.
  parallel_tasks(s.batch * s.heads, [&](int64_t bh) {
    backward_head<T>(qkv, out, lse, dout, dqkv, g, dr, scale, bh / s.heads, bh % s.heads,
                     accumulate);
  });
}

#define BATON_INSTANTIATE(T)                                                                 \
  template void attention_forward<T>(const T*, T*, T*, const AttentionShape&,                \
                                     const AttentionOptions&);                               \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*,            \
                                      const AttentionShape&, const AttentionOptions&, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
