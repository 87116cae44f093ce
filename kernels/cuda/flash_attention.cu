// Fused causal attention for 16-bit inputs (the FlashAttention-2 scheme): tiles of 64
// queries x 64 keys, products on tensor cores through WMMA (16x16x16, f32 accumulation),
// an online softmax in f32, and nothing T x T in memory. Block = 4 warps; each warp owns
// 16 rows of the tile. Forward keeps its output rows in shared memory (they are rescaled
// as the running maximum moves); backward runs two kernels, one per key block (dK, dV)
// and one per query block (dQ), so no atomics and a deterministic result, at the price of
// recomputing the scores twice. Dropout regenerates its mask from the counter-based
// numbers, as the CPU backend does.
#include <mma.h>

#include "kernels/cuda/attention.cuh"

namespace baton::kernels::cuda {

namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // queries and keys per tile
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kTile + 4;  // f32 score rows in shared memory
constexpr int kLdP = kTile + 8;  // 16-bit probability rows

template <int D>
constexpr int ld_t() {
  return D + 8;
}  // 16-bit rows of Q, K, V, dO tiles
template <int D>
constexpr int ld_o() {
  return D + 4;
}  // f32 output rows

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Copies rows [row0, row0 + 64) of a strided 16-bit matrix (D columns from `src`) into a
// shared tile, zeros past `rows`; 16-byte loads.
template <class T, int D>
__device__ void load_tile(T* dst, const T* src, int64_t row0, int64_t rows, int64_t stride) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride + c * 8);
    *reinterpret_cast<uint4*>(dst + r * ld_t<D>() + c * 8) = v;
  }
}

// out[16 x 64] (f32, ld kLdS) = A[16 x D] B^T where A's rows are at `a` and B's 64 rows
// at `b`, both 16-bit tiles with ld_t<D>().
template <class T, int D>
__device__ void rows_times_rows_t(const T* a, const T* b, float* out) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragA<T> fa;
      FragBt<T> fb;
      wmma::load_matrix_sync(fa, a + k * 16, ld_t<D>());
      wmma::load_matrix_sync(fb, b + n * 16 * ld_t<D>() + k * 16, ld_t<D>());
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[D/16] += P[16 x 64] (16-bit, ld kLdP) V[64 x D] (16-bit tile).
template <class T, int D>
__device__ void accumulate_pv(FragC (&acc)[D / 16], const T* p, const T* v) {
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, p + k * 16, kLdP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragB<T> fb;
      wmma::load_matrix_sync(fb, v + k * 16 * ld_t<D>() + n * 16, ld_t<D>());
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

template <class T, class L, int D>
struct FlashArgs {
  const T* qkv;
  const T* out;
  const T* dout;
  T* dst;              // forward: out; backward: dqkv
  L* lse;              // forward writes, backward reads
  const float* delta;  // backward: rowsum(dO * O), [B, H, T]
  int64_t T_, H;
  float scale;
  AttnDropout dr;
  bool accumulate;
};

// ---- forward: one block per (64 queries, head, batch) ----
template <class T, class L, int D>
__global__ void __launch_bounds__(kThreads) flash_forward(FlashArgs<T, L, D> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kTile * ld_t<D>();
  T* vs = ks + kTile * ld_t<D>();
  float* ss = reinterpret_cast<float*>(vs + kTile * ld_t<D>());
  T* ps = reinterpret_cast<T*>(ss + kWarps * 16 * kLdS);
  float* os = reinterpret_cast<float*>(ps + kWarps * 16 * kLdP);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The last query tiles have the most keys to visit: they start first.
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t T_ = a.T_, H = a.H, ld = 3 * H * D;
  const T* base = a.qkv + b * T_ * ld;
  float* sw = ss + warp * 16 * kLdS;
  T* pw = ps + warp * 16 * kLdP;
  float* ow = os + warp * 16 * ld_o<D>();
  load_tile<T, D>(qs, base + h * D, q0, T_, ld);
  for (int i = lane; i < 16 * D; i += 32) ow[(i / D) * ld_o<D>() + i % D] = 0.f;
  const int r = lane >> 1, half = lane & 1;
  const int64_t qi = q0 + warp * 16 + r;
  float m = -INFINITY, l = 0.f;
  const int64_t kend = min(T_, q0 + kTile);  // causal: no key past the tile's last query
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<T, D>(ks, base + H * D + h * D, k0, T_, ld);
    load_tile<T, D>(vs, base + 2 * H * D + h * D, k0, T_, ld);
    __syncthreads();
    rows_times_rows_t<T, D>(qs + warp * 16 * ld_t<D>(), ks, sw);
    __syncwarp();
    // Online softmax over this row's 32 columns; the two lanes of a row combine by shuffle.
    float s[32];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int64_t kj = k0 + half * 32 + j;
      s[j] = (kj <= qi && qi < T_) ? sw[r * kLdS + half * 32 + j] * a.scale : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float alpha = m_new == -INFINITY ? 1.f : __expf(m - m_new);
    const uint64_t drow = a.dr.on ? a.dr.row_base(b, h, qi, T_) + uint64_t(k0 + half * 32) : 0;
    float rs = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float p = s[j] == -INFINITY ? 0.f : __expf(s[j] - m_new);
      rs += p;
      float pd = p;
      if (a.dr.on && p != 0.f) pd = a.dr.keep(drow + uint64_t(j)) ? p * a.dr.scale : 0.f;
      pw[r * kLdP + half * 32 + j] = from_f<T>(pd);
    }
    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
    l = l * alpha + rs;
    m = m_new;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) ow[r * ld_o<D>() + d] *= alpha;
    __syncwarp();
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::load_matrix_sync(acc[n], ow + n * 16, ld_o<D>(), wmma::mem_row_major);
    accumulate_pv<T, D>(acc, pw, vs);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(ow + n * 16, acc[n], ld_o<D>(), wmma::mem_row_major);
    __syncwarp();
  }
  if (qi < T_) {
    const float inv = 1.f / l;  // l > 0: key 0 is visible to every query
    T* orow = a.dst + (b * T_ + qi) * H * D + h * D;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d)
      orow[d] = from_f<T>(ow[r * ld_o<D>() + d] * inv);
    if (half == 0) a.lse[(b * H + h) * T_ + qi] = from_f<L>(m + __logf(l));
  }
}

// delta[b, h, i] = sum_d dO[b, i, h, d] O[b, i, h, d]: one warp per (b, i, h).
template <class T>
__global__ void attention_delta(const T* out, const T* dout, float* delta, int64_t B, int64_t T_,
                                int64_t H, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < B * T_ * H;
       w += warps) {
    const int64_t h = w % H, i = (w / H) % T_, b = w / (H * T_);
    const T* o = out + (b * T_ + i) * H * D + h * D;
    const T* g = dout + (b * T_ + i) * H * D + h * D;
    float s = 0.f;
    for (int64_t d = lane; d < D; d += 32) s += to_f(o[d]) * to_f(g[d]);
    s = warp_sum(s);
    if (lane == 0) delta[(b * H + h) * T_ + i] = s;
  }
}

// The shared part of both backward kernels: for one warp's 16 rows (queries or keys) and
// 64 columns (keys or queries), from scores s (f32) and dP' = dO V^T (f32), writes
// P' (dropped-out probabilities) and dS = scale P (dP - delta) as 16-bit tiles.
// `rows_are_keys` says which index the rows carry.
template <class T, class L>
__device__ void backward_tile(const float* sw, const float* dpw, T* pw, T* dsw, bool rows_are_keys,
                              int64_t row0, int64_t col0, int64_t b, int64_t h, int64_t T_,
                              int64_t H, const L* lse, const float* delta, float scale,
                              const AttnDropout& dr) {
  const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
#pragma unroll 4
  for (int j = 0; j < 32; ++j) {
    const int c = half * 32 + j;
    const int64_t qi = rows_are_keys ? col0 + c : row0 + r;
    const int64_t kj = rows_are_keys ? row0 + r : col0 + c;
    float p = 0.f, ds = 0.f, pd = 0.f;
    if (kj <= qi && qi < T_) {
      const int64_t si = (b * H + h) * T_ + qi;
      p = __expf(sw[r * kLdS + c] * scale - to_f(lse[si]));
      float dp = dpw[r * kLdS + c];
      pd = p;
      if (dr.on) {
        const bool keep = dr.keep(dr.row_base(b, h, qi, T_) + uint64_t(kj));
        pd = keep ? p * dr.scale : 0.f;
        dp = keep ? dp * dr.scale : 0.f;
      }
      // The first query sees one key: its dS is exactly 0, which dP - delta (delta from the
      // 16-bit O) only approximates, and AdamW would turn the rounding into whole steps.
      ds = qi == 0 ? 0.f : scale * p * (dp - delta[si]);
    }
    if (pw != nullptr) pw[r * kLdP + c] = from_f<T>(pd);
    dsw[r * kLdP + c] = from_f<T>(ds);
  }
}

// Writes a warp's 16 rows of f32 results (through shared scratch) into a 16-bit
// destination with row stride `stride`, adding to it when accumulating.
template <class T, int D>
__device__ void store_rows(FragC (&acc)[D / 16], float* scratch, T* dst, int64_t row0, int64_t rows,
                           int64_t stride, bool accumulate) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, acc[n], ld_o<D>(), wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, d = i % D;
    if (row0 + r >= rows) continue;
    T* p = dst + (row0 + r) * stride + d;
    const float v = scratch[r * ld_o<D>() + d];
    *p = from_f<T>(accumulate ? to_f(*p) + v : v);
  }
}

// Shared memory of the backward kernels: four 64-row 16-bit tiles, then per warp the f32
// scores and dP' (reused as the output scratch) and the 16-bit P' and dS.
template <class T, int D>
constexpr size_t backward_smem() {
  return size_t(4) * kTile * ld_t<D>() * sizeof(T) +
         size_t(kWarps) * (2 * 16 * kLdS * sizeof(float) + 2 * 16 * kLdP * sizeof(T));
}

// ---- backward, dK and dV: one block per (64 keys, head, batch) ----
template <class T, class L, int D>
__global__ void __launch_bounds__(kThreads) flash_backward_kv(FlashArgs<T, L, D> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kTile * ld_t<D>();
  T* qs = vs + kTile * ld_t<D>();
  T* dos = qs + kTile * ld_t<D>();
  float* f32 = reinterpret_cast<float*>(dos + kTile * ld_t<D>());
  const int warp = threadIdx.x >> 5;
  float* sw = f32 + warp * 2 * 16 * kLdS;
  float* dpw = sw + 16 * kLdS;
  T* pw = reinterpret_cast<T*>(f32 + kWarps * 2 * 16 * kLdS) + warp * 2 * 16 * kLdP;
  T* dsw = pw + 16 * kLdP;
  const int64_t k0 = int64_t(blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t T_ = a.T_, H = a.H, ld = 3 * H * D;
  const T* base = a.qkv + b * T_ * ld;
  const T* dob = a.dout + b * T_ * H * D + h * D;
  load_tile<T, D>(ks, base + H * D + h * D, k0, T_, ld);
  load_tile<T, D>(vs, base + 2 * H * D + h * D, k0, T_, ld);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dk[n], 0.f), wmma::fill_fragment(dv[n], 0.f);
  const int64_t kw = k0 + warp * 16;             // this warp's first key
  for (int64_t q0 = k0; q0 < T_; q0 += kTile) {  // causal: queries from the first key on
    __syncthreads();
    load_tile<T, D>(qs, base + h * D, q0, T_, ld);
    load_tile<T, D>(dos, dob, q0, T_, H * D);
    __syncthreads();
    rows_times_rows_t<T, D>(ks + warp * 16 * ld_t<D>(), qs, sw);    // S^T = K Q^T
    rows_times_rows_t<T, D>(vs + warp * 16 * ld_t<D>(), dos, dpw);  // dP'^T = V dO^T
    __syncwarp();
    backward_tile<T, L>(sw, dpw, pw, dsw, true, kw, q0, b, h, T_, H, a.lse, a.delta, a.scale, a.dr);
    __syncwarp();
    accumulate_pv<T, D>(dv, pw, dos);  // dV += P'^T dO
    accumulate_pv<T, D>(dk, dsw, qs);  // dK += dS^T Q
    __syncwarp();
  }
  T* dst = a.dst + b * T_ * ld;
  store_rows<T, D>(dk, sw, dst + H * D + h * D, kw, T_, ld, a.accumulate);
  __syncwarp();
  store_rows<T, D>(dv, sw, dst + 2 * H * D + h * D, kw, T_, ld, a.accumulate);
}

// ---- backward, dQ: one block per (64 queries, head, batch) ----
template <class T, class L, int D>
__global__ void __launch_bounds__(kThreads) flash_backward_q(FlashArgs<T, L, D> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + kTile * ld_t<D>();
  T* ks = dos + kTile * ld_t<D>();
  T* vs = ks + kTile * ld_t<D>();
  float* f32 = reinterpret_cast<float*>(vs + kTile * ld_t<D>());
  const int warp = threadIdx.x >> 5;
  float* sw = f32 + warp * 2 * 16 * kLdS;
  float* dpw = sw + 16 * kLdS;
  T* dsw = reinterpret_cast<T*>(f32 + kWarps * 2 * 16 * kLdS) + warp * 2 * 16 * kLdP;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t T_ = a.T_, H = a.H, ld = 3 * H * D;
  const T* base = a.qkv + b * T_ * ld;
  load_tile<T, D>(qs, base + h * D, q0, T_, ld);
  load_tile<T, D>(dos, a.dout + b * T_ * H * D + h * D, q0, T_, H * D);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.f);
  const int64_t qw = q0 + warp * 16;
  const int64_t kend = min(T_, q0 + kTile);
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_tile<T, D>(ks, base + H * D + h * D, k0, T_, ld);
    load_tile<T, D>(vs, base + 2 * H * D + h * D, k0, T_, ld);
    __syncthreads();
    rows_times_rows_t<T, D>(qs + warp * 16 * ld_t<D>(), ks, sw);    // S = Q K^T
    rows_times_rows_t<T, D>(dos + warp * 16 * ld_t<D>(), vs, dpw);  // dP' = dO V^T
    __syncwarp();
    backward_tile<T, L>(sw, dpw, nullptr, dsw, false, qw, k0, b, h, T_, H, a.lse, a.delta, a.scale,
                        a.dr);
    __syncwarp();
    accumulate_pv<T, D>(dq, dsw, ks);  // dQ += dS K
    __syncwarp();
  }
  store_rows<T, D>(dq, sw, a.dst + b * T_ * ld + h * D, qw, T_, ld, a.accumulate);
}

template <class T, int D>
constexpr size_t forward_smem() {
  return size_t(3) * kTile * ld_t<D>() * sizeof(T) + size_t(kWarps) * 16 * kLdS * sizeof(float) +
         size_t(kWarps) * 16 * kLdP * sizeof(T) + size_t(kWarps) * 16 * ld_o<D>() * sizeof(float);
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  BATON_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
}

// 16-bit qkv, f32 log-sum-exps, a head size of 32, 64 or 128, 16-byte aligned rows.
bool covered(const Tensor& qkv, const Tensor& lse, const AttnGeometry& g) {
  if (!is_float16ish(qkv.dtype()) || lse.dtype() != DType::f32) return false;
  if (g.D != 32 && g.D != 64 && g.D != 128) return false;
  return aligned16(qkv);
}

template <class F>
bool with_head_size(int64_t D, F&& f) {
  switch (D) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    default:
      return false;
  }
}

}  // namespace

bool flash_attention_forward(const Tensor& qkv, const AttnGeometry& g, float scale,
                             const AttnDropout& dr, Tensor& out, Tensor& lse, const Launch& l) {
  if (!covered(qkv, lse, g) || !aligned16(out)) return false;
  const char* op = "attention_forward";
  const dim3 grid(unsigned((g.T + kTile - 1) / kTile), unsigned(g.H), unsigned(g.B));
  return with_head_size(g.D, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    BATON_CUDA_DISPATCH(op, qkv.dtype(), T, {
      using L = float;
      if constexpr (!std::is_same_v<T, float>) {
        FlashArgs<T, L, D> a{static_cast<const T*>(qkv.raw_data()),
                             nullptr,
                             nullptr,
                             static_cast<T*>(out.raw_data()),
                             static_cast<L*>(lse.raw_data()),
                             nullptr,
                             g.T,
                             g.H,
                             scale,
                             dr,
                             false};
        constexpr size_t bytes = forward_smem<T, D>();
        allow_smem(flash_forward<T, L, D>, bytes);
        flash_forward<T, L, D><<<grid, kThreads, bytes, l.stream>>>(a);
        BATON_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

bool flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttnGeometry& g, float scale,
                              const AttnDropout& dr, Tensor& dqkv, bool accumulate,
                              const Launch& l) {
  if (!covered(qkv, lse, g) || !aligned16(out) || !aligned16(dout) || !aligned16(dqkv))
    return false;
  const char* op = "attention_backward";
  Tensor delta = scratch({g.B, g.H, g.T}, DType::f32, l.device);
  const dim3 grid(unsigned((g.T + kTile - 1) / kTile), unsigned(g.H), unsigned(g.B));
  return with_head_size(g.D, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    BATON_CUDA_DISPATCH(op, qkv.dtype(), T, {
      using L = float;
      if constexpr (!std::is_same_v<T, float>) {
        const int64_t warps = g.B * g.T * g.H;
        attention_delta<T><<<grid_for(warps * 32, 256), 256, 0, l.stream>>>(
            static_cast<const T*>(out.raw_data()), static_cast<const T*>(dout.raw_data()),
            delta.data<float>(), g.B, g.T, g.H, g.D);
        BATON_CUDA_CHECK_LAUNCH();
        FlashArgs<T, L, D> a{static_cast<const T*>(qkv.raw_data()),
                             static_cast<const T*>(out.raw_data()),
                             static_cast<const T*>(dout.raw_data()),
                             static_cast<T*>(dqkv.raw_data()),
                             static_cast<L*>(lse.raw_data()),
                             delta.data<float>(),
                             g.T,
                             g.H,
                             scale,
                             dr,
                             accumulate};
        constexpr size_t bytes = backward_smem<T, D>();
        allow_smem(flash_backward_kv<T, L, D>, bytes);
        allow_smem(flash_backward_q<T, L, D>, bytes);
        flash_backward_kv<T, L, D><<<grid, kThreads, bytes, l.stream>>>(a);
        BATON_CUDA_CHECK_LAUNCH();
        flash_backward_q<T, L, D><<<grid, kThreads, bytes, l.stream>>>(a);
        BATON_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace baton::kernels::cuda
