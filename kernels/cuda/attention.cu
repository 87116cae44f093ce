// Causal multi-head attention. 16-bit inputs take the fused kernels of
// flash_attention.cu (tensor cores, nothing T x T in memory); f32 inputs, and any case
// those kernels do not cover, take the path here on cuBLAS: per batch, the heads' score
// matrices S = scale Q K^T come from one strided-batched GEMM (f32 results), a row kernel
// turns them into probabilities (and saves the log-sum-exp), and a second GEMM applies
// them to V. Backward recomputes the probabilities from the saved log-sum-exp, so nothing
// T x T is kept between forward and backward; the T x T buffers are scratch from the
// caching allocator. set_attention_impl() picks a path for tests and comparisons.
// Grouped-query attention (fewer key/value heads than query heads) runs on the same paths:
// the key/value heads are copied out to one per query head, and backward sums each
// group's gradients back into its head.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/ops_cuda.h"
#include "memory/error.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kRowThreads = 128;

using Geometry = AttnGeometry;
using DropoutSpec = AttnDropout;

// BATON_CUDA_ATTENTION (automatic, flash, cublas, cudnn) sets the starting choice, so a
// whole engine run (baton train, baton profile) can be timed on one path. Read at the
// first use, where a bad value is an InputError naming it: read as the library loaded,
// it had aborted every process (a CPU run, `import baton`) before main.
AttentionImpl impl_from_environment() {
  const char* v = std::getenv("BATON_CUDA_ATTENTION");
  if (v == nullptr || *v == '\0') return AttentionImpl::automatic;
  try {
    return attention_impl_from_name(v);
  } catch (const std::invalid_argument& e) {
    throw InputError(std::string("BATON_CUDA_ATTENTION: ") + e.what());
  }
}

constexpr int kUnread = -1;
std::atomic<int> g_impl{kUnread};

AttentionImpl current_impl() {
  int v = g_impl.load();
  if (v == kUnread) {
    int unread = kUnread;
    g_impl.compare_exchange_strong(unread, int(impl_from_environment()));
    v = g_impl.load();
  }
  return AttentionImpl(v);
}

// Forward rows: one block per (head, query i) of batch b. P = softmax of the visible
// scores (j <= i), dropped out for the product with V; lse saved.
template <class T, class L>
__global__ void causal_softmax(const float* s, T* p, L* lse, int64_t b, int64_t H, int64_t T_,
                               DropoutSpec dr) {
  const int64_t row = blockIdx.x;  // h * T + i
  const int64_t h = row / T_, i = row % T_;
  const float* sr = s + row * T_;
  T* pr = p + row * T_;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, sr[j]);
  m = block_max(m);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) sum += __expf(sr[j] - m);
  sum = block_sum(sum);
  const float l = m + __logf(sum);
  const uint64_t base = dr.on ? dr.row_base(b, h, i, T_) : 0;
  for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
    float v = j <= i ? __expf(sr[j] - l) : 0.f;
    if (dr.on && j <= i) v = dr.keep(base + uint64_t(j)) ? v * dr.scale : 0.f;
    pr[j] = from_f<T>(v);
  }
  if (threadIdx.x == 0) lse[(b * H + h) * T_ + i] = from_f<L>(l);
}

// Backward, step one: the dropped-out probabilities P' (for dV = P'^T dO).
template <class T, class L>
__global__ void causal_probs(const float* s, const L* lse, T* p, int64_t b, int64_t H, int64_t T_,
                             DropoutSpec dr) {
  const int64_t row = blockIdx.x;
  const int64_t h = row / T_, i = row % T_;
  const float* sr = s + row * T_;
  T* pr = p + row * T_;
  const float l = to_f(lse[(b * H + h) * T_ + i]);
  const uint64_t base = dr.on ? dr.row_base(b, h, i, T_) : 0;
  for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
    float v = j <= i ? __expf(sr[j] - l) : 0.f;
    if (dr.on && j <= i) v = dr.keep(base + uint64_t(j)) ? v * dr.scale : 0.f;
    pr[j] = from_f<T>(v);
  }
}

// Backward, step two: dS = scale * P * (dP - sum_j P dP) with dP = dP' * mask * 1/(1-p),
// written over the P' buffer.
template <class T, class L>
__global__ void causal_dscores(const float* s, const L* lse, const float* dpd, T* ds, int64_t b,
                               int64_t H, int64_t T_, DropoutSpec dr, float scale) {
  const int64_t row = blockIdx.x;
  const int64_t h = row / T_, i = row % T_;
  const float* sr = s + row * T_;
  const float* gr = dpd + row * T_;
  T* out = ds + row * T_;
  const float l = to_f(lse[(b * H + h) * T_ + i]);
  const uint64_t base = dr.on ? dr.row_base(b, h, i, T_) : 0;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    float g = gr[j];
    if (dr.on) g = dr.keep(base + uint64_t(j)) ? g * dr.scale : 0.f;
    dot += __expf(sr[j] - l) * g;
  }
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
    float v = 0.f;
    if (j <= i) {
      float g = gr[j];
      if (dr.on) g = dr.keep(base + uint64_t(j)) ? g * dr.scale : 0.f;
      v = scale * __expf(sr[j] - l) * (g - dot);
    }
    out[j] = from_f<T>(v);
  }
}

// Which local key/value head each local query head reads (ops.h, AttentionOptions).
struct KvMap {
  int64_t H, KV, group, kv0, head_offset;
  __host__ __device__ int64_t of(int64_t h) const { return (head_offset + h) / group - kv0; }
  bool identity() const { return KV == H && group == 1 && kv0 == head_offset; }
};

KvMap kv_map(const AttentionOptions& opt) {
  KvMap m;
  m.H = opt.heads;
  m.KV = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  m.group = opt.group > 0 ? opt.group : m.H / m.KV;
  m.kv0 = opt.kv_offset >= 0 ? opt.kv_offset : opt.head_offset / m.group;
  m.head_offset = opt.head_offset;
  return m;
}

// [B, T, (H + 2 KV) D] -> [B, T, 3 H D]: query heads as they are, key and value head of
// each query head copied beside it.
template <class T>
__global__ void expand_kv(const T* src, T* dst, int64_t rows, int64_t D, KvMap m) {
  const int64_t wide = 3 * m.H * D, narrow = (m.H + 2 * m.KV) * D, n = rows * wide;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / wide, col = k % wide, part = col / (m.H * D);
    const int64_t h = (col % (m.H * D)) / D, d = col % D;
    const int64_t from = part == 0   ? col
                         : part == 1 ? m.H * D + m.of(h) * D + d
                                     : (m.H + m.KV) * D + m.of(h) * D + d;
    dst[k] = src[row * narrow + from];
  }
}

// The transpose: dqkv (+)= the query gradients, and per key/value head the sum of its
// query heads' key (value) gradients in head order; a head no local query reads gets 0.
template <class T>
__global__ void reduce_kv(const T* wide_grad, T* dst, int64_t rows, int64_t D, KvMap m,
                          bool accumulate) {
  const int64_t wide = 3 * m.H * D, narrow = (m.H + 2 * m.KV) * D, n = rows * narrow;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / narrow, col = k % narrow;
    const T* g = wide_grad + row * wide;
    float v = 0;
    if (col < m.H * D) {
      v = to_f(g[col]);
    } else {
      const bool key = col < (m.H + m.KV) * D;
      const int64_t rel = col - (key ? m.H * D : (m.H + m.KV) * D);
      const int64_t j = rel / D, d = rel % D, base = (key ? 1 : 2) * m.H * D;
      for (int64_t h = 0; h < m.H; ++h)
        if (m.of(h) == j) v += to_f(g[base + h * D + d]);
    }
    dst[k] = from_f<T>(accumulate ? to_f(dst[k]) + v : v);
  }
}

Tensor expanded_qkv(const char* op, const Tensor& qkv, const KvMap& m, const Launch& l) {
  const int64_t rows = qkv.size(0) * qkv.size(1), D = qkv.size(2) / (m.H + 2 * m.KV);
  Tensor wide = scratch({qkv.size(0), qkv.size(1), 3 * m.H * D}, qkv.dtype(), l.device);
  BATON_CUDA_DISPATCH(op, qkv.dtype(), T, {
    expand_kv<T><<<grid_for(rows * 3 * m.H * D, 256), 256, 0, l.stream>>>(
        static_cast<const T*>(qkv.raw_data()), static_cast<T*>(wide.raw_data()), rows, D, m);
    BATON_CUDA_CHECK_LAUNCH();
  });
  return wide;
}

AttentionOptions one_kv_per_query(AttentionOptions opt) {
  opt.kv_heads = 0, opt.group = 0, opt.kv_offset = -1;
  return opt;
}

Geometry check(const char* op, const Tensor& qkv, const AttentionOptions& opt, const Tensor& out,
               const Tensor& lse) {
  require_cuda(op, "qkv", qkv);
  require_cuda(op, "out", out);
  require_cuda(op, "lse", lse);
  require(qkv.dim() == 3 && out.dim() == 3 && opt.heads > 0, op, "qkv [B, T, 3HD], out [B, T, HD]");
  Geometry g{qkv.size(0), qkv.size(1), opt.heads, 0};
  require(qkv.size(2) % (3 * g.H) == 0, op, "qkv's last dimension must be 3 * heads * D");
  g.D = qkv.size(2) / (3 * g.H);
  require(out.size(0) == g.B && out.size(1) == g.T && out.size(2) == g.H * g.D &&
              out.dtype() == qkv.dtype(),
          op, "out must be [B, T, H*D] of qkv's dtype, got " + out.str());
  require(lse.numel() == g.B * g.H * g.T, op, "lse must be [B, H, T]");
  return g;
}

// S[h] = scale Q_h K_h^T for every head of batch b (f32 results).
void scores(const void* qkv, DType dt, const Geometry& g, int64_t b, float scale, float* s,
            const Launch& l) {
  const size_t es = memory::dtype_size(dt);
  const char* base = static_cast<const char*>(qkv) + size_t(b * g.T * g.ld()) * es;
  Gemm m;
  m.trans_b = true;
  m.m = g.T, m.n = g.T, m.k = g.D, m.batch = g.H;
  m.a = base, m.lda = g.ld(), m.stride_a = g.D;
  m.b = base + size_t(g.H * g.D) * es, m.ldb = g.ld(), m.stride_b = g.D;
  m.c = s, m.ldc = g.T, m.stride_c = g.T * g.T;
  m.ab_type = dt, m.c_type = DType::f32;
  m.alpha = scale;
  gemm(m, l, "attention");
}

}  // namespace

void set_attention_impl(AttentionImpl impl) {
  g_impl.store(int(impl));
}
AttentionImpl attention_impl() {
  return current_impl();
}

AttentionImpl attention_impl_from_name(std::string_view name) {
  if (name == "automatic") return AttentionImpl::automatic;
  if (name == "flash") return AttentionImpl::flash;
  if (name == "cublas") return AttentionImpl::cublas;
  if (name == "cudnn") return AttentionImpl::cudnn;
  throw std::invalid_argument("attention implementation '" + std::string(name) +
                              "': expected automatic, flash, cublas or cudnn");
}

void attention_forward(const Tensor& qkv, const AttentionOptions& opt, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  if (const KvMap m = kv_map(opt); !m.identity()) {
    require_cuda(op, "qkv", qkv);
    require(qkv.dim() == 3 && qkv.size(2) % (m.H + 2 * m.KV) == 0, op,
            "qkv must be [B, T, (H + 2 KV) D], got " + qkv.str());
    const Launch l(out);
    cuda::attention_forward(expanded_qkv(op, qkv, m, l), one_kv_per_query(opt), out, lse);
    return;
  }
  const Geometry g = check(op, qkv, opt, out, lse);
  if (g.B == 0 || g.T == 0) return;
  Launch l(out);
  const float scale = float(opt.scale.value_or(1.0 / std::sqrt(double(g.D))));
  const DropoutSpec dr = attn_dropout(opt, g.H);
  const AttentionImpl impl = current_impl();
  if (impl == AttentionImpl::cudnn) {
    require(cudnn_attention_forward(qkv, g, scale, dr, out, lse, l), op,
            cudnn_built() ? "cuDNN's fused attention does not cover " + qkv.str() +
                                (dr.on ? " with dropout" : "") +
                                " (or cuDNN is unavailable: a warning says why)"
                          : std::string("baton was built without cuDNN"));
    return;
  }
  // automatic: cuDNN's fused forward first where it applies (16-bit, no dropout), since on
  // the H200 it beat our flash forward (GPT-2 124M bf16 step 35.5 against 40.2 ms,
  // docs/cuda.md); its backward likewise (below).
  if (impl == AttentionImpl::automatic && cudnn_attention_forward(qkv, g, scale, dr, out, lse, l))
    return;
  if (impl != AttentionImpl::cublas && flash_attention_forward(qkv, g, scale, dr, out, lse, l))
    return;
  require(impl != AttentionImpl::flash, op, "the fused kernel does not cover " + qkv.str());
  const DType dt = qkv.dtype();
  const size_t es = memory::dtype_size(dt);
  Tensor s = scratch({g.H, g.T, g.T}, DType::f32, l.device);
  Tensor p = scratch({g.H, g.T, g.T}, dt, l.device);
  BATON_CUDA_DISPATCH(op, dt, T, BATON_CUDA_SECOND(op, dt, lse.dtype(), T, L, {
                        for (int64_t b = 0; b < g.B; ++b) {
                          scores(qkv.raw_data(), dt, g, b, scale, s.data<float>(), l);
                          causal_softmax<T, L><<<unsigned(g.H * g.T), kRowThreads, 0, l.stream>>>(
                              s.data<float>(), static_cast<T*>(p.raw_data()),
                              static_cast<L*>(lse.raw_data()), b, g.H, g.T, dr);
                          BATON_CUDA_CHECK_LAUNCH();
                          // O_h = P_h V_h, written into out's columns of head h.
                          Gemm m;
                          m.m = g.T, m.n = g.D, m.k = g.T, m.batch = g.H;
                          m.a = p.raw_data(), m.lda = g.T, m.stride_a = g.T * g.T;
                          m.b = static_cast<const char*>(qkv.raw_data()) +
                                size_t(b * g.T * g.ld() + 2 * g.H * g.D) * es;
                          m.ldb = g.ld(), m.stride_b = g.D;
                          m.c = static_cast<char*>(out.raw_data()) + size_t(b * g.T * g.ldo()) * es;
                          m.ldc = g.ldo(), m.stride_c = g.D;
                          m.ab_type = dt, m.c_type = dt;
                          gemm(m, l, op);
                        }
                      }));
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& opt, Tensor& dqkv, bool accumulate) {
  const char* op = "attention_backward";
  if (const KvMap m = kv_map(opt); !m.identity()) {
    require_cuda(op, "qkv", qkv);
    require_cuda(op, "dqkv", dqkv);
    require(qkv.dim() == 3 && qkv.size(2) % (m.H + 2 * m.KV) == 0 && dqkv.numel() == qkv.numel() &&
                dqkv.dtype() == qkv.dtype(),
            op, "qkv and dqkv must be [B, T, (H + 2 KV) D], got " + qkv.str());
    const Launch l(dqkv);
    const Tensor wide = expanded_qkv(op, qkv, m, l);
    Tensor dwide = scratch(wide.shape(), wide.dtype(), l.device);
    cuda::attention_backward(wide, out, lse, dout, one_kv_per_query(opt), dwide, false);
    const int64_t rows = qkv.size(0) * qkv.size(1), D = qkv.size(2) / (m.H + 2 * m.KV);
    BATON_CUDA_DISPATCH(op, qkv.dtype(), T, {
      reduce_kv<T><<<grid_for(dqkv.numel(), 256), 256, 0, l.stream>>>(
          static_cast<const T*>(dwide.raw_data()), static_cast<T*>(dqkv.raw_data()), rows, D, m,
          accumulate);
      BATON_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const Geometry g = check(op, qkv, opt, out, lse);
  require_cuda(op, "dout", dout);
  require_cuda(op, "dqkv", dqkv);
  require(dout.numel() == out.numel() && dout.dtype() == out.dtype() &&
              dqkv.numel() == qkv.numel() && dqkv.dtype() == qkv.dtype(),
          op, "dout must match out and dqkv qkv");
  if (g.B == 0 || g.T == 0) return;
  Launch l(dqkv);
  const float scale = float(opt.scale.value_or(1.0 / std::sqrt(double(g.D))));
  const DropoutSpec dr = attn_dropout(opt, g.H);
  const DType dt = qkv.dtype();
  const size_t es = memory::dtype_size(dt);
  // cudnn: its fused backward, as its forward, or the reason it does not run; when
  // accumulating (it writes dqkv) our kernels, from the same lse. automatic takes it too
  // where it applies: on the H200 it made GPT-2 124M's bf16 step 36.0 -> 25.6 ms
  // (gpt_step) and 41.4 -> 30.9 ms (baton train) against our flash backward (docs/cuda.md).
  const AttentionImpl impl = current_impl();
  if (impl == AttentionImpl::cudnn && !accumulate) {
    require(cudnn_attention_backward(qkv, out, lse, dout, g, scale, dr, dqkv, false, l), op,
            cudnn_built() ? "cuDNN's fused attention backward does not cover " + qkv.str() +
                                (dr.on ? " with dropout" : "") +
                                " (or cuDNN is unavailable: a warning says why)"
                          : std::string("baton was built without cuDNN"));
    return;
  }
  // At T = 1 every query is a first query, whose gradient the CPU and our kernels make
  // exactly 0 and cuDNN's graph leaves as rounding (dO.V0 - rowsum(dO o O)), which AdamW
  // would turn into whole steps (docs/kernels.md): automatic keeps ours there.
  if (impl == AttentionImpl::automatic && !accumulate && g.T > 1 &&
      cudnn_attention_backward(qkv, out, lse, dout, g, scale, dr, dqkv, false, l))
    return;
  if (impl != AttentionImpl::cublas &&
      flash_attention_backward(qkv, out, lse, dout, g, scale, dr, dqkv, accumulate, l))
    return;
  require(impl != AttentionImpl::flash, op, "the fused kernel does not cover " + qkv.str());
  const float beta = accumulate ? 1.f : 0.f;
  Tensor s = scratch({g.H, g.T, g.T}, DType::f32, l.device);
  Tensor dpd = scratch({g.H, g.T, g.T}, DType::f32, l.device);
  Tensor p = scratch({g.H, g.T, g.T}, dt, l.device);
  BATON_CUDA_DISPATCH(
      op, dt, T, BATON_CUDA_SECOND(op, dt, lse.dtype(), T, L, {
        for (int64_t b = 0; b < g.B; ++b) {
          const char* base =
              static_cast<const char*>(qkv.raw_data()) + size_t(b * g.T * g.ld()) * es;
          char* dbase = static_cast<char*>(dqkv.raw_data()) + size_t(b * g.T * g.ld()) * es;
          const char* dob =
              static_cast<const char*>(dout.raw_data()) + size_t(b * g.T * g.ldo()) * es;
          const char *q = base, *k = base + size_t(g.H * g.D) * es,
                     *v = base + size_t(2 * g.H * g.D) * es;
          char *dq = dbase, *dk = dbase + size_t(g.H * g.D) * es,
               *dv = dbase + size_t(2 * g.H * g.D) * es;
          const L* lse_p = static_cast<const L*>(lse.raw_data());
          scores(qkv.raw_data(), dt, g, b, scale, s.data<float>(), l);
          causal_probs<T, L><<<unsigned(g.H * g.T), kRowThreads, 0, l.stream>>>(
              s.data<float>(), lse_p, static_cast<T*>(p.raw_data()), b, g.H, g.T, dr);
          BATON_CUDA_CHECK_LAUNCH();
          Gemm m;  // dV_h = P'_h^T dO_h
          m.trans_a = true;
          m.m = g.T, m.n = g.D, m.k = g.T, m.batch = g.H;
          m.a = p.raw_data(), m.lda = g.T, m.stride_a = g.T * g.T;
          m.b = dob, m.ldb = g.ldo(), m.stride_b = g.D;
          m.c = dv, m.ldc = g.ld(), m.stride_c = g.D;
          m.ab_type = dt, m.c_type = dt, m.beta = beta;
          gemm(m, l, op);
          Gemm n;  // dP'_h = dO_h V_h^T (f32)
          n.trans_b = true;
          n.m = g.T, n.n = g.T, n.k = g.D, n.batch = g.H;
          n.a = dob, n.lda = g.ldo(), n.stride_a = g.D;
          n.b = v, n.ldb = g.ld(), n.stride_b = g.D;
          n.c = dpd.raw_data(), n.ldc = g.T, n.stride_c = g.T * g.T;
          n.ab_type = dt, n.c_type = DType::f32;
          gemm(n, l, op);
          causal_dscores<T, L><<<unsigned(g.H * g.T), kRowThreads, 0, l.stream>>>(
              s.data<float>(), lse_p, dpd.data<float>(), static_cast<T*>(p.raw_data()), b, g.H, g.T,
              dr, scale);
          BATON_CUDA_CHECK_LAUNCH();
          Gemm dqm;  // dQ_h = dS_h K_h
          dqm.m = g.T, dqm.n = g.D, dqm.k = g.T, dqm.batch = g.H;
          dqm.a = p.raw_data(), dqm.lda = g.T, dqm.stride_a = g.T * g.T;
          dqm.b = k, dqm.ldb = g.ld(), dqm.stride_b = g.D;
          dqm.c = dq, dqm.ldc = g.ld(), dqm.stride_c = g.D;
          dqm.ab_type = dt, dqm.c_type = dt, dqm.beta = beta;
          gemm(dqm, l, op);
          Gemm dkm = dqm;  // dK_h = dS_h^T Q_h
          dkm.trans_a = true;
          dkm.b = q;
          dkm.c = dk;
          gemm(dkm, l, op);
        }
      }));
}

}  // namespace baton::kernels::cuda
