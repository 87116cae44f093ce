// Causal multi-head self-attention, flash style: queries in blocks of kBlockQ rows, keys
// in chunks of up to kChunkK, an online softmax across chunks, and only the output and
// each row's log-sum-exp saved. Backward recomputes the probabilities chunk by chunk.
// The products run as register-blocked tiles (or GEMM calls) straight on the strided
// q/k/v columns of qkv (no copies); chunks beyond the diagonal are never computed. Scratch
// is per thread, O(kBlockQ * kChunkK), reused across calls: memory does not grow with T^2.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"
#include "kernels/random.h"

namespace baton::kernels::cpu {

namespace {

constexpr int64_t kBlockQ = 64;   // query rows per block
constexpr int64_t kChunkK = 512;  // keys per chunk: T <= 512 needs no online rescaling
// Backward with fewer (batch, key/value head) pairs than this splits each pair's query
// blocks into about this many tasks in all.
constexpr int64_t kSplitTasks = 8;

template <class T>
T* scratch(size_t n, int which) {
  thread_local std::vector<T> bufs[6];
  auto& b = bufs[which];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// The attention geometry of one (batch, head) pair, pointers into qkv-shaped buffers.
// qkv holds H query heads, then KV key heads, then KV value heads (KV < H: grouped-query
// attention); query head h reads key/value head kv_of(h).
struct Geometry {
  int64_t T, H, KV, D, ld, ldo;  // ld: row stride of qkv, ldo: of out
  int64_t group, head_offset, kv_offset;
  int64_t kv_of(int64_t h) const { return (head_offset + h) / group - kv_offset; }
  int64_t q_col(int64_t h) const { return h * D; }
  int64_t k_col(int64_t h) const { return (H + kv_of(h)) * D; }
  int64_t v_col(int64_t h) const { return (H + KV + kv_of(h)) * D; }
  int64_t kv_k_col(int64_t kv) const { return (H + kv) * D; }
  int64_t kv_v_col(int64_t kv) const { return (H + KV + kv) * D; }
};

Geometry geometry_of(const AttentionShape& s, const AttentionOptions& opt) {
  const int64_t kv = s.kv_heads;
  const int64_t group = opt.group > 0 ? opt.group : s.heads / kv;
  const int64_t kv_offset = opt.kv_offset >= 0 ? opt.kv_offset : opt.head_offset / group;
  return Geometry{s.seq,
                  s.heads,
                  kv,
                  s.head_dim,
                  (s.heads + 2 * kv) * s.head_dim,
                  s.heads * s.head_dim,
                  group,
                  opt.head_offset,
                  kv_offset};
}

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
  // dst[j] = src[j] * scale where score (i, c0 + j) of head h in batch b is kept, else 0,
  // for j < n <= kChunkK (dst may be src): the mask of a logical score, whatever the
  // partition, the block or the kernel variant that asks.
  template <class V>
  void apply(int64_t b, int64_t h, int64_t i, int64_t T, int64_t c0, const V* src, V* dst,
             int64_t n) const {
    uint32_t bits[kChunkK];
    random_bits_fill(seed, stream, row_base(b, h, i, T) + uint64_t(c0), n, bits);
    const V ds = V(scale);
    for (int64_t j = 0; j < n; ++j) dst[j] = (bits[j] >> 8) >= threshold ? src[j] * ds : V(0);
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
        const T alpha = vexp_nonpositive(T(m[r] - mx));
        l[r] *= alpha;
        T* orow = o + r * g.ldo;
        for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
      }
      m[r] = mx;
      l[r] += sum;
      if (dr.on && n > 0) dr.apply(b, h, i0 + r, g.T, c0, sr, sr, n);
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

// acc_q: add into dq (else overwrite); acc_kv: the same for this head's dk and dv, which
// the query heads of one group share.
template <class T>
void backward_head(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                   const Geometry& g, const Dropout& dr, T scale, int64_t b, int64_t h, bool acc_q,
                   bool acc_kv) {
  const int64_t D = g.D, ld = g.ld;
  for (int64_t i = 0; i < g.T; ++i) {
    T* row = dqkv + (b * g.T + i) * ld;
    if (!acc_q) std::fill(row + g.q_col(h), row + g.q_col(h) + D, T(0));
    if (!acc_kv) {
      std::fill(row + g.k_col(h), row + g.k_col(h) + D, T(0));
      std::fill(row + g.v_col(h), row + g.v_col(h) + D, T(0));
    }
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
      di[r] = sum_of<T>(D, [&]<class V>(V, int64_t d) {
        return load_as<V>(dO + r * g.ldo + d) * load_as<V>(o + r * g.ldo + d);
      });
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
          dr.apply(b, h, i0 + r, g.T, c0, pr, pdr, n);
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
        // The first query sees one key: its dS is exactly 0, but P dP and P di are summed
        // in different orders, and AdamW turns that rounding into whole steps at T = 1.
        if (i0 + r == 0) std::fill(dpr, dpr + kc, T(0));
      }
      // dQ += scale dS K;  dK += scale dS^T Q.
      gemm<T>(false, false, rows, D, kc, scale, dp, kc, k, ld, T(1), dq, ld);
      gemm<T>(true, false, kc, D, rows, scale, dp, kc, q, ld, T(1), dk, ld);
    }
  }
}

// ---- float with head size a multiple of 16: the register-blocked tiles of
// attention_tiles.h, W vectors of kLanes<float> per head row ----

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Row stride of a block of scores with kcp columns: one vector more, so that a column
// (read by the products over keys, P'^T dO and dS^T Q) does not fall into a few cache
// sets as a stride of a multiple of 1 KB does (64 rows in 4 of L1's 64 sets).
inline int64_t score_stride(int64_t kcp) {
  return kcp + kLanes<float>;
}

// Zeros a probability row from `from` (a whole number of vectors at or past its visible
// keys) as far as a tile of the products may read: a tile's rows (at most 8) share one
// key range, up to 7 keys past a row's own, so one vector more suffices (8 or 16 floats)
// and the rest is never read.
inline void zero_row_tail(float* s, int64_t from, int64_t kc) {
  if (from < kc) std::fill(s + from, s + std::min(kc, from + kLanes<float>), 0.0f);
}

// The scores tile at (r0, c) of rows [0, rows) and columns [0, cols_padded), for the tiles
// that hold at least one visible score (key <= query): row r is query q0 + r, column c key
// k0 + c; tile(r0, c) gives the epilogue (tiles::scores_tile) that stores tile (r0, c).
// Skipped tiles are left as they are.
template <class MakeEpilogue>
inline void causal_scores(int64_t rows, int64_t q0, int64_t k0, int64_t cols_padded, const float* A,
                          int64_t lda, const float* Bt, int64_t ldb, int64_t D,
                          MakeEpilogue&& tile) {
  for (int64_t r0 = 0; r0 < rows; r0 += tiles::kScoreRows) {
    const int n = int(std::min<int64_t>(tiles::kScoreRows, rows - r0));
    const int64_t last_visible = q0 + r0 + n - 1 - k0;  // of the tile's last row
    for (int64_t c = 0; c < cols_padded && c <= last_visible; c += tiles::kScoreCols) {
      // Only the first vector of a tile when no row of it sees past it: its second
      // vector is never read (zero_row_tail stops a vector after a row's keys).
      const bool one = last_visible < c + kLanes<float>;
      tiles::scores_tile_n(n, one, A + r0 * lda, lda, Bt + c, ldb, D, tile(r0, c));
    }
  }
}

// The lanes of a scores tile's vector n of row r that the row sees (key <= query), when
// the tile's row 0 sees `seen` of its columns (any integer).
inline vint32 visible_lanes(int64_t seen, int r, int n) {
  vint32 lane;
  for (int i = 0; i < int(kLanes<float>); ++i) lane[i] = i;
  return lane < int32_t(seen + r - kLanes<float> * n);
}

// Forward's epilogue for S = alpha Q K^T: -inf past the keys a row sees (so max and exp
// need no padding pass), and each row's running maximum kept as a vector (mx, kLanes
// floats a row from the tile's row 0), so no pass over the row looks for it.
struct ScoresAndMax {
  float alpha;
  float* C;
  int64_t ldc;
  int64_t seen;
  float* mx;
  void operator()(int r, int n, vfloat acc) const {
    vfloat v = acc * alpha;
    if (seen + r - kLanes<float> * n < kLanes<float>)  // the causal edge
      v = visible_lanes(seen, r, n) ? v : splat(-std::numeric_limits<float>::infinity());
    store(C + r * ldc + kLanes<float> * n, v);
    float* m = mx + r * kLanes<float>;
    store(m, vmax(load(m), v));
  }
};

// Backward's epilogue for S = alpha Q K^T: the probabilities P = exp(S - lse) from the
// forward's log-sum-exp while the tile is in registers (no pass over the rows), 0 past
// the keys a row sees. lse from the tile's row 0; `seen` as in visible_lanes.
struct ExpVisible {
  float alpha;
  float* C;
  int64_t ldc;
  const float* lse;
  int64_t seen;
  void operator()(int r, int n, vfloat acc) const {
    const vint32 keep = visible_lanes(seen, r, n);
    // Visible scores are at most lse (the forward's tiles, the same bits); the lanes past
    // the diagonal may exceed it, and their exps (inf or NaN then) are masked off below.
    const vfloat e = vexp_nonpositive(acc * alpha - lse[r]);
    store(C + r * ldc + kLanes<float> * n, std::bit_cast<vfloat>(std::bit_cast<vint32>(e) & keep));
  }
};

// Backward's epilogue for dP = dO V^T without dropout: dS = P dP - P di straight from the
// tile (P at the same place of its own rows, di per row).
struct SoftmaxGrad {
  float* C;
  const float* P;
  int64_t ld;  // of C and P
  const float* di;
  void operator()(int r, int n, vfloat acc) const {
    const vfloat p = load(P + r * ld + kLanes<float> * n);
    store(C + r * ld + kLanes<float> * n, p * acc - p * di[r]);
  }
};

// kt: the head's keys transposed, [D][ldkt], for keys [0, i1) at least.
template <int W>
void forward_block_fast(const float* qkv, const float* kt, int64_t ldkt, float* out, float* lse,
                        const Geometry& g, const Dropout& dr, float scale, int64_t b, int64_t h,
                        int64_t i0, int64_t i1) {
  const int64_t rows = i1 - i0, D = g.D, ld = g.ld;
  const float* q = qkv + (b * g.T + i0) * ld + g.q_col(h);
  float* o = out + (b * g.T + i0) * g.ldo + h * D;
  float* s = scratch<float>(size_t(kBlockQ * score_stride(kChunkK)), 0);
  float* m = scratch<float>(size_t(kBlockQ), 1);
  float* l = scratch<float>(size_t(kBlockQ), 2);
  float* inv = scratch<float>(size_t(kBlockQ), 3);
  float* mv = scratch<float>(size_t(kBlockQ * kLanes<float>), 5);  // ScoresAndMax's
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.0f);
  // One chunk (T <= kChunkK): P V is scaled by 1 / l as it is stored, not in another pass.
  const bool one_chunk = i1 <= kChunkK;
  for (int64_t c0 = 0; c0 < i1; c0 += kChunkK) {
    const int64_t kc = std::min(kChunkK, i1 - c0), kcp = round_up(kc, tiles::kScoreCols),
                  lds = score_stride(kcp);
    const float* v = qkv + (b * g.T + c0) * ld + g.v_col(h);
    std::fill(mv, mv + rows * kLanes<float>, -std::numeric_limits<float>::infinity());
    causal_scores(rows, i0, c0, kcp, q, ld, kt + c0, ldkt, D, [&](int64_t r0, int64_t c) {
      return ScoresAndMax{scale, s + r0 * lds + c, lds, i0 + r0 - (c0 + c) + 1,
                          mv + r0 * kLanes<float>};
    });
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * lds;
      const int64_t n = visible(i0 + r, c0, kc), padded = round_up(n, kLanes<float>);
      const float mx = std::max(m[r], hmax(load(mv + r * kLanes<float>)));
      const float sum = exp_shifted_sum(sr, mx, sr, padded);
      zero_row_tail(sr, padded, kc);
      if (c0 > 0 && mx != m[r]) {  // the running maximum moved: rescale what we have
        const float alpha = vexp_nonpositive(m[r] - mx);
        l[r] *= alpha;
        float* orow = o + r * g.ldo;
        for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
      }
      m[r] = mx;
      l[r] += sum;
      inv[r] = 1.0f / l[r];
      if (dr.on && n > 0) dr.apply(b, h, i0 + r, g.T, c0, sr, sr, n);
    }
    // O (+)= P V; each row only needs the keys it sees.
    tiles::rows_product<W>(
        rows, s, lds, 1,
        [&](int64_t r0, int64_t n) {
          return std::pair<int64_t, int64_t>{0, std::clamp<int64_t>(i0 + r0 + n - c0, 0, kc)};
        },
        v, ld, 1.0f, o, g.ldo, c0 > 0, one_chunk ? inv : nullptr);
  }
  float* lrow = lse + (b * g.H + h) * g.T + i0;
  for (int64_t r = 0; r < rows; ++r) {
    if (!one_chunk) {
      float* orow = o + r * g.ldo;
      for (int64_t d = 0; d < D; ++d) orow[d] *= inv[r];
    }
    lrow[r] = m[r] + std::log(l[r]);
  }
}

// kt, vt: the keys and values of h's key/value head transposed,
// [D][round_up(T, tiles::kScoreCols)].
// acc_q, acc_kv as in backward_head. The query rows [q_begin, q_end) (q_begin a multiple of
// kBlockQ); dK and dV go to the rows of dk0 and dv0 (key 0's) at stride ldkv: dqkv's columns,
// or a task's own buffer when the query rows are split among tasks.
template <int W>
void backward_head_fast(const float* qkv, const float* out, const float* lse, const float* dout,
                        float* dqkv, const Geometry& g, const Dropout& dr, float scale, int64_t b,
                        int64_t h, bool acc_q, bool acc_kv, const float* kt, const float* vt,
                        int64_t q_begin, int64_t q_end, float* dk0, float* dv0, int64_t ldkv) {
  const int64_t D = g.D, ld = g.ld, Tp = round_up(g.T, tiles::kScoreCols);
  float* p = scratch<float>(size_t(kBlockQ * score_stride(kChunkK)), 0);
  float* dp = scratch<float>(size_t(kBlockQ * score_stride(kChunkK)), 1);
  float* pd = dr.on ? scratch<float>(size_t(kBlockQ * score_stride(kChunkK)), 2) : p;
  float* di = scratch<float>(size_t(kBlockQ), 3);
  const bool accumulate = acc_kv;
  const float* lrow = lse + (b * g.H + h) * g.T;
  for (int64_t i0 = q_begin; i0 < q_end; i0 += kBlockQ) {
    const int64_t i1 = std::min(q_end, i0 + kBlockQ), rows = i1 - i0;
    const float* q = qkv + (b * g.T + i0) * ld + g.q_col(h);
    float* dq = dqkv + (b * g.T + i0) * ld + g.q_col(h);
    const float* o = out + (b * g.T + i0) * g.ldo + h * D;
    const float* dO = dout + (b * g.T + i0) * g.ldo + h * D;
    for (int64_t r = 0; r < rows; ++r)
      di[r] = sum_of<float>(D, [&]<class V>(V, int64_t d) {
        return load_as<V>(dO + r * g.ldo + d) * load_as<V>(o + r * g.ldo + d);
      });
    for (int64_t c0 = 0; c0 < i1; c0 += kChunkK) {
      const int64_t kc = std::min(kChunkK, i1 - c0), kcp = round_up(kc, tiles::kScoreCols),
                    lds = score_stride(kcp);
      const float* k = qkv + (b * g.T + c0) * ld + g.k_col(h);
      float* dk = dk0 + c0 * ldkv;
      float* dv = dv0 + c0 * ldkv;
      // Queries a tile of keys [j0, j0 + n) needs: those at or after its first key.
      auto key_rows = [&](int64_t j0, int64_t) {
        return std::pair<int64_t, int64_t>{std::clamp<int64_t>(c0 + j0 - i0, 0, rows), rows};
      };
      // Keys a tile of queries [r0, r0 + n) needs: those up to its last query.
      auto query_keys = [&](int64_t r0, int64_t n) {
        return std::pair<int64_t, int64_t>{0, std::clamp<int64_t>(i0 + r0 + n - c0, 0, kc)};
      };
      // P = exp(scale q k^T - lse), zero above the diagonal; P' with dropout applied.
      causal_scores(rows, i0, c0, kcp, q, ld, kt + c0, Tp, D, [&](int64_t r0, int64_t c) {
        return ExpVisible{scale, p + r0 * lds + c, lds, lrow + i0 + r0, i0 + r0 - (c0 + c) + 1};
      });
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = p + r * lds;
        const int64_t n = visible(i0 + r, c0, kc), padded = round_up(n, kLanes<float>);
        zero_row_tail(pr, padded, kc);
        if (dr.on) {
          float* pdr = pd + r * lds;
          dr.apply(b, h, i0 + r, g.T, c0, pr, pdr, n);
          std::fill(pdr + n, pdr + padded, 0.0f);
          zero_row_tail(pdr, padded, kc);
        }
      }
      // dV += P'^T dO. Keys from i0 on are first reached by this query block: without
      // accumulate they are written, not added to (so dqkv is never zeroed first).
      const int64_t fresh = std::clamp<int64_t>(i0 - c0, 0, kc);
      auto by_keys = [&](const float* a, const float* b_rows, int64_t ldb_rows, float alpha,
                         float* c) {
        tiles::rows_product<W>(fresh, a, 1, lds, key_rows, b_rows, ldb_rows, alpha, c, ldkv, true);
        tiles::rows_product<W>(
            kc - fresh, a + fresh, 1, lds,
            [&](int64_t j0, int64_t n) { return key_rows(j0 + fresh, n); }, b_rows, ldb_rows, alpha,
            c + fresh * ldkv, ldkv, accumulate);
      };
      by_keys(pd, dO, g.ldo, 1.0f, dv);
      // dP' = dO V^T, then dS = P' dP' - P di (zero where P is): without dropout
      // (P' = P) as each tile is computed, with it in a pass over the rows.
      if (dr.on)
        causal_scores(rows, i0, c0, kcp, dO, g.ldo, vt + c0, Tp, D, [&](int64_t r0, int64_t c) {
          return tiles::StoreScaled{1.0f, dp + r0 * lds + c, lds};
        });
      else
        causal_scores(rows, i0, c0, kcp, dO, g.ldo, vt + c0, Tp, D, [&](int64_t r0, int64_t c) {
          return SoftmaxGrad{dp + r0 * lds + c, p + r0 * lds + c, lds, di + r0};
        });
      for (int64_t r = 0; r < rows; ++r) {
        float* dpr = dp + r * lds;
        const float* pr = p + r * lds;
        const float* pdr = pd + r * lds;
        const float dd = di[r];
        const int64_t padded = round_up(visible(i0 + r, c0, kc), kLanes<float>);
        if (dr.on) {
#pragma GCC ivdep
          for (int64_t j = 0; j < padded; ++j) dpr[j] = pdr[j] * dpr[j] - pr[j] * dd;
        }
        if (i0 + r == 0) std::fill(dpr, dpr + padded, 0.0f);  // one key: dS is 0 (above)
        zero_row_tail(dpr, padded, kc);
      }
      // dQ += scale dS K (its rows are first written at the first chunk);
      // dK += scale dS^T Q.
      tiles::rows_product<W>(rows, dp, lds, 1, query_keys, k, ld, scale, dq, ld, acc_q || c0 > 0);
      by_keys(dp, q, ld, scale, dk);
    }
  }
}

// Calls f(std::integral_constant<int, W>) for head_dim = kLanes<float> W, when head_dim is
// 16 m for m in 1..8 (the same head sizes on every instruction set); false if the head
// size has no tile kernels (then the GEMM path runs).
template <class F>
bool with_tile_width(int64_t head_dim, F&& f) {
  if (head_dim % 16 != 0 || head_dim < 16 || head_dim > 128) return false;
  constexpr int per16 = int(16 / kLanes<float>);  // vectors per 16 floats
  return tiles::with_count_1_to_8(
      head_dim / 16, [&](auto m) { f(std::integral_constant<int, decltype(m)::value * per16>{}); });
}

}  // namespace

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s,
                       const AttentionOptions& opt) {
  const Geometry g = geometry_of(s, opt);
  const Dropout dr = make_dropout(opt, s.heads);
  const T scale = T(opt.scale.value_or(1.0 / std::sqrt(double(s.head_dim))));
  const int64_t pairs = s.batch * s.heads, blocks = (s.seq + kBlockQ - 1) / kBlockQ;
  // Costliest (last) query blocks first, so dynamic scheduling balances the causal work.
  auto run = [&](auto block) {
    parallel_tasks(pairs * blocks, [&](int64_t t) {
      const int64_t qb = blocks - 1 - t / pairs, bh = t % pairs;
      const int64_t i0 = qb * kBlockQ, i1 = std::min(s.seq, i0 + kBlockQ);
      block(bh / s.heads, bh % s.heads, i0, i1);
    });
  };
  if constexpr (std::is_same_v<T, float>) {
    const int64_t D = s.head_dim, Tp = round_up(s.seq, tiles::kScoreCols);
    auto keys_of = [&](int64_t b, int64_t h, int64_t n, float* kt, int64_t ldkt) {
      tiles::transpose_rows(qkv + b * s.seq * g.ld + g.k_col(h), g.ld, n, D, kt, ldkt);
    };
    if (with_tile_width(D, [&](auto w) {
          constexpr int W = decltype(w)::value;
          if (pairs >= 2 * thread_count()) {
            // Enough (batch, head) pairs to keep every thread busy: one task per pair,
            // whose keys are transposed once for all its query blocks.
            parallel_tasks(pairs, [&](int64_t bh) {
              const int64_t b = bh / s.heads, h = bh % s.heads;
              float* kt = scratch<float>(size_t(D * Tp), 4);
              keys_of(b, h, s.seq, kt, Tp);
              for (int64_t i0 = 0; i0 < s.seq; i0 += kBlockQ)
                forward_block_fast<W>(qkv, kt, Tp, out, lse, g, dr, scale, b, h, i0,
                                      std::min(s.seq, i0 + kBlockQ));
            });
          } else {  // few pairs: one task per query block, each transposing what it needs
            run([&](int64_t b, int64_t h, int64_t i0, int64_t i1) {
              const int64_t n = round_up(i1, tiles::kScoreCols);
              float* kt = scratch<float>(size_t(D * n), 4);
              keys_of(b, h, i1, kt, n);
              forward_block_fast<W>(qkv, kt, n, out, lse, g, dr, scale, b, h, i0, i1);
            });
          }
        }))
      return;
  }
  run([&](int64_t b, int64_t h, int64_t i0, int64_t i1) {
    forward_block<T>(qkv, out, lse, g, dr, scale, b, h, i0, i1);
  });
}

template <class T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                        const AttentionShape& s, const AttentionOptions& opt, bool accumulate) {
  const Geometry g = geometry_of(s, opt);
  const Dropout dr = make_dropout(opt, s.heads);
  const T scale = T(opt.scale.value_or(1.0 / std::sqrt(double(s.head_dim))));
  // One (batch, key/value head) pair per task: its dK and dV sum over all query blocks of
  // every query head of its group, which run one after the other.
  auto per_kv = [&](auto head) {
    parallel_tasks(s.batch * g.KV, [&](int64_t t) {
      const int64_t b = t / g.KV, kv = t % g.KV;
      bool first = true;
      for (int64_t h = 0; h < g.H; ++h) {
        if (g.kv_of(h) != kv) continue;
        head(b, h, accumulate, accumulate || !first, first);
        first = false;
      }
      if (first && !accumulate)  // no local query head reads it: its gradient is zero
        for (int64_t i = 0; i < g.T; ++i) {
          T* row = dqkv + (b * g.T + i) * g.ld;
          std::fill(row + g.kv_k_col(kv), row + g.kv_k_col(kv) + g.D, T(0));
          std::fill(row + g.kv_v_col(kv), row + g.kv_v_col(kv) + g.D, T(0));
        }
    });
  };
  if constexpr (std::is_same_v<T, float>) {
    if (with_tile_width(s.head_dim, [&](auto w) {
          constexpr int W = decltype(w)::value;
          const int64_t D = g.D, Tp = round_up(g.T, tiles::kScoreCols);
          const int64_t pairs = s.batch * g.KV, blocks = (g.T + kBlockQ - 1) / kBlockQ;
          // Fixed by the shape, never by the thread count, so the sums' order (and every bit
          // of the result) is the same on any number of threads.
          const int64_t splits = pairs >= kSplitTasks
                                     ? 1
                                     : std::min<int64_t>(blocks, (kSplitTasks + pairs - 1) / pairs);
          if (splits <= 1) {
            per_kv([&](int64_t b, int64_t h, bool acc_q, bool acc_kv, bool first) {
              // The group's keys and values are transposed once, for its first head.
              float* kt = scratch<float>(size_t(D * Tp), 4);
              float* vt = scratch<float>(size_t(D * Tp), 5);
              if (first) {
                tiles::transpose_rows(qkv + b * g.T * g.ld + g.k_col(h), g.ld, g.T, D, kt, Tp);
                tiles::transpose_rows(qkv + b * g.T * g.ld + g.v_col(h), g.ld, g.T, D, vt, Tp);
              }
              float* row0 = dqkv + b * g.T * g.ld;
              backward_head_fast<W>(qkv, out, lse, dout, dqkv, g, dr, scale, b, h, acc_q, acc_kv,
                                    kt, vt, 0, g.T, row0 + g.k_col(h), row0 + g.v_col(h), g.ld);
            });
            return;
          }
          // Few (batch, key/value head) pairs (micro-batch 1, multi-query attention, a long
          // context): each pair's query blocks are split among tasks of equal causal work
          // (block k reads k + 1 key blocks). A task owns its queries' dQ; the first writes
          // dK and dV in place, the others into buffers of their own, added after in order
          // (one task per pair had left threads idle: 75/25 of the work at 2 threads).
          std::array<int64_t, kSplitTasks + 1> bound;
          bound.fill(blocks);
          bound[0] = 0;
          {
            const double total = double(blocks) * double(blocks + 1) / 2;
            double done = 0;
            int64_t s_at = 1;
            for (int64_t k = 0; k < blocks && s_at < splits; ++k) {
              done += double(k + 1);
              if (done >= total * double(s_at) / double(splits)) bound[size_t(s_at++)] = k + 1;
            }
          }
          // The later parts' buffers, the caller thread's: kept from call to call, so a
          // step in steady state allocates nothing (tests/kernels/test_allocation.cpp).
          const size_t part_floats = size_t(g.T * 2 * D);
          thread_local std::vector<float> own;
          if (own.size() < size_t(pairs * (splits - 1)) * part_floats)
            own.resize(size_t(pairs * (splits - 1)) * part_floats);
          float* const own_base = own.data();
          parallel_tasks(pairs * splits, [&](int64_t t) {
            const int64_t pair = t / splits, part = t % splits, b = pair / g.KV, kv = pair % g.KV;
            const int64_t q_begin = std::min(g.T, bound[size_t(part)] * kBlockQ),
                          q_end = std::min(g.T, bound[size_t(part + 1)] * kBlockQ);
            float* row0 = dqkv + b * g.T * g.ld;
            float *dk0 = row0 + g.kv_k_col(kv), *dv0 = row0 + g.kv_v_col(kv);
            int64_t ldkv = g.ld;
            if (part > 0) {  // keys up to its last query, zeros where it adds nothing
              float* mine = own_base + size_t(pair * (splits - 1) + part - 1) * part_floats;
              std::fill(mine, mine + q_end * 2 * D, 0.0f);
              dk0 = mine;
              dv0 = mine + D;
              ldkv = 2 * D;
            } else if (!accumulate) {
              // Keys after its last query get nothing from it: the later parts' sums are
              // added onto zeros.
              for (int64_t j = q_end; j < g.T; ++j) {
                std::fill(dk0 + j * g.ld, dk0 + j * g.ld + D, 0.0f);
                std::fill(dv0 + j * g.ld, dv0 + j * g.ld + D, 0.0f);
              }
            }
            float* kt = scratch<float>(size_t(D * Tp), 4);
            float* vt = scratch<float>(size_t(D * Tp), 5);
            bool first = true;
            for (int64_t h = 0; h < g.H; ++h) {
              if (g.kv_of(h) != kv) continue;
              if (first) {
                tiles::transpose_rows(qkv + b * g.T * g.ld + g.k_col(h), g.ld, q_end, D, kt, Tp);
                tiles::transpose_rows(qkv + b * g.T * g.ld + g.v_col(h), g.ld, q_end, D, vt, Tp);
              }
              if (q_begin < q_end)
                backward_head_fast<W>(qkv, out, lse, dout, dqkv, g, dr, scale, b, h, accumulate,
                                      part > 0 || accumulate || !first, kt, vt, q_begin, q_end, dk0,
                                      dv0, ldkv);
              first = false;
            }
            if (first && part == 0 && !accumulate)  // no local query head reads it
              for (int64_t i = 0; i < g.T; ++i) {
                std::fill(row0 + i * g.ld + g.kv_k_col(kv), row0 + i * g.ld + g.kv_k_col(kv) + D,
                          0.0f);
                std::fill(row0 + i * g.ld + g.kv_v_col(kv), row0 + i * g.ld + g.kv_v_col(kv) + D,
                          0.0f);
              }
          });
          parallel_tasks(pairs, [&](int64_t pair) {
            const int64_t b = pair / g.KV, kv = pair % g.KV;
            float* row0 = dqkv + b * g.T * g.ld;
            for (int64_t part = 1; part < splits; ++part) {
              const float* mine = own_base + size_t(pair * (splits - 1) + part - 1) * part_floats;
              const int64_t keys = std::min(g.T, bound[size_t(part + 1)] * kBlockQ);
              for (int64_t j = 0; j < keys; ++j) {
                float* dk = row0 + j * g.ld + g.kv_k_col(kv);
                float* dv = row0 + j * g.ld + g.kv_v_col(kv);
                const float* src = mine + j * 2 * D;
                for (int64_t d = 0; d < D; ++d) {
                  dk[d] += src[d];
                  dv[d] += src[D + d];
                }
              }
            }
          });
        }))
      return;
  }
  per_kv([&](int64_t b, int64_t h, bool acc_q, bool acc_kv, bool) {
    backward_head<T>(qkv, out, lse, dout, dqkv, g, dr, scale, b, h, acc_q, acc_kv);
  });
}

#define BATON_INSTANTIATE(T)                                                      \
  template void attention_forward<T>(const T*, T*, T*, const AttentionShape&,     \
                                     const AttentionOptions&);                    \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*, \
                                      const AttentionShape&, const AttentionOptions&, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
