// Random initialisation (the same Philox numbers as the CPU, kernels/random.h), the
// squared-norm reduction for gradient clipping, and the fused AdamW and SGD steps.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/grad_scale.h"
#include "kernels/random.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void normal_k(T* out, int64_t n, double mean, double std, uint64_t seed, uint64_t stream,
                         BlockMap map) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t idx = map.logical(i);
    const random::Philox4 g = random::philox_group(seed, stream, idx >> 2);
    out[i] = from_f<T>(float(mean + std * random::normal_from_group(g, unsigned(idx & 3))));
  }
}

// Many tensors per launch: each block of a multi-tensor kernel works on kChunk elements of
// one piece, found by a binary search over the pieces' first blocks. A launch's pieces
// travel in its parameters (up to 32 KB on Volta and later since CUDA 12.1).
constexpr int kMaxPieces = 224;
constexpr int64_t kChunk = 8192;

template <class Piece>
__device__ __forceinline__ const Piece& piece_of_block(const Piece* piece, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (piece[mid].first_block <= int64_t(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  return piece[lo];
}

struct SumPiece {
  const void* x;
  int64_t n, first_block;
};

template <class T>
struct SumBatch {
  SumPiece piece[kMaxPieces];
  int count;
};

// Squared norms: each block's sum of its chunk (f64, a fixed tree) into partial[block].
template <class T>
__global__ void __launch_bounds__(kThreads)
    sumsq_many_k(const __grid_constant__ SumBatch<T> b, double* partial) {
  __shared__ double part[kThreads];
  const SumPiece& p = piece_of_block(b.piece, b.count);
  const T* x = static_cast<const T*>(p.x);
  const int64_t begin = (int64_t(blockIdx.x) - p.first_block) * kChunk;
  const int64_t end = begin + kChunk < p.n ? begin + kChunk : p.n;
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = double(to_f(x[i]));
    s += v * v;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// One warp per tensor: lane l adds its blocks l, l + 32, ... in order, then a fixed
// butterfly joins the lanes, so the result never changes between runs.
__global__ void sumsq_finish(const double* partial, const int64_t* first, int tensors,
                             double* total) {
  const int t = int(blockIdx.x) * (blockDim.x / 32) + int(threadIdx.x) / 32;
  if (t >= tensors) return;
  const int lane = int(threadIdx.x) % 32;
  double s = 0;
  for (int64_t b = first[t] + lane; b < first[t + 1]; b += 32) s += partial[b];
  for (int w = 16; w > 0; w >>= 1) s += __shfl_down_sync(0xffffffffu, s, w);
  if (lane == 0) total[t] = s;
}

struct AdamCoeffs {
  float decay, step_size, inv_bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps, gs;
};

// One element's update. Every rounding is spelled out (the _rn intrinsics are never
// contracted into fused multiply-adds), so adamw_k and adamw_many_k give the same bits:
// left to the compiler, the two kernels' x * decay - y came out fused in one and not in
// the other (1-ulp differences on the H200).
template <class G, class P>
__device__ __forceinline__ void adamw_update(P& param, G grad, P& m, P& v, float decay,
                                             const AdamCoeffs& c) {
  const float g = __fmul_rn(to_f(grad), c.gs);
  const float m0 = to_f(m);
  const float mi = __fmaf_rn(c.one_minus_b1, __fsub_rn(g, m0), m0);
  const float vi = __fmaf_rn(c.one_minus_b2, __fmul_rn(g, g), __fmul_rn(c.b2, to_f(v)));
  const float denom = __fmaf_rn(__fsqrt_rn(vi), c.inv_bc2_sqrt, c.eps);
  param = from_f<P>(__fmaf_rn(to_f(param), decay, -__fdiv_rn(__fmul_rn(c.step_size, mi), denom)));
  m = from_f<P>(mi);
  v = from_f<P>(vi);
}

template <class G, class P>
__global__ void adamw_k(P* param, const G* grad, P* m, P* v, int64_t n, AdamCoeffs c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    adamw_update(param[i], grad[i], m[i], v[i], c.decay, c);
  }
}

// Many tensors' AdamW steps in one launch (the multi-tensor scheme of sumsq_many_k). The
// arithmetic is adamw_update, as adamw_k's, so each tensor gets the bits its own
// adamw_step would give.

template <class G, class P>
struct AdamPiece {
  P* param;
  const G* grad;
  P* m;
  P* v;
  void* working;  // null, or the 16-bit working copy (the batch's working_bf16 says which)
  int64_t n, first_block;
  float decay;
};

template <class G, class P>
struct AdamBatch {
  AdamPiece<G, P> piece[kMaxPieces];
  int count;
  bool working_bf16;
  AdamCoeffs c;
  // Non-null: c.gs is clip_decision's scale of this squared norm, and nothing is written
  // when the norm is not finite (GradScale).
  const double* sum_squares;
  double grad_clip, loss_scale;
};

template <class G, class P>
__global__ void __launch_bounds__(kThreads)
    adamw_many_k(const __grid_constant__ AdamBatch<G, P> b) {
  const AdamPiece<G, P>& p = piece_of_block(b.piece, b.count);
  AdamCoeffs c = b.c;
  if (b.sum_squares != nullptr) {
    // Each thread derives it (one double sqrt and division), as the host would have.
    const ClipDecision d = clip_decision(*b.sum_squares, b.grad_clip, b.loss_scale);
    if (!d.apply) return;
    c.gs = float(d.grad_scale);
  }
  const int64_t begin = (int64_t(blockIdx.x) - p.first_block) * kChunk;
  const int64_t end = begin + kChunk < p.n ? begin + kChunk : p.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    adamw_update(p.param[i], p.grad[i], p.m[i], p.v[i], p.decay, c);
    // The working copy as cast() writes it: the same rounding of the new value.
    if (p.working != nullptr) {
      if (b.working_bf16)
        static_cast<bf16*>(p.working)[i] = from_f<bf16>(to_f(p.param[i]));
      else
        static_cast<f16*>(p.working)[i] = from_f<f16>(to_f(p.param[i]));
    }
  }
}

template <class G, class P>
__global__ void sgd_k(P* param, const G* grad, P* buf, int64_t n, float lr, float wd, float mom,
                      bool nesterov, float gs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float p = to_f(param[i]);
    const float d = to_f(grad[i]) * gs + wd * p;
    if (buf == nullptr) {
      param[i] = from_f<P>(p - lr * d);
      continue;
    }
    const float b = mom * to_f(buf[i]) + d;
    buf[i] = from_f<P>(b);
    param[i] = from_f<P>(p - lr * (nesterov ? d + mom * b : b));
  }
}

}  // namespace

void random_normal(Tensor& out, double mean, double std, uint64_t seed, uint64_t stream,
                   const Block& where) {
  const char* op = "random_normal";
  require_cuda(op, "out", out);
  const BlockMap map = block_map(out.shape(), where.global_shape, where.offsets, op);
  const int64_t n = out.numel();
  if (n == 0) return;
  Launch l(out);
  BATON_CUDA_DISPATCH(op, out.dtype(), T, {
    normal_k<T><<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(static_cast<T*>(out.raw_data()),
                                                                  n, mean, std, seed, stream, map);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

namespace {

// Every tensor's chunks summed by one multi-tensor launch per dtype (and kMaxPieces
// tensors), then one warp per tensor adds its chunks: launches per tensor cost GPT-2
// 124M's step 296 launches and 0.65 ms on the H200. Queued on l's stream; the totals
// (ts.size() doubles) lie in the returned buffer, followed by `extra` free doubles.
struct Squares {
  Tensor buffer;
  double* total = nullptr;
  double* extra = nullptr;
};

Squares queue_sum_squares(const std::vector<Tensor>& ts, const Launch& l, int64_t extra) {
  const char* op = "sum_squares";
  for (const Tensor& t : ts) {
    require_cuda(op, "t", t);
    require(t.is_contiguous(), op, "t must be contiguous, got " + t.str());
  }
  // first[k]: tensor k's first block over all launches; first[size]: the number of blocks.
  std::vector<int64_t> first(ts.size() + 1, 0);
  for (size_t k = 0; k < ts.size(); ++k)
    first[k + 1] = first[k] + (ts[k].numel() + kChunk - 1) / kChunk;
  const int64_t blocks = first.back();
  // One buffer: the blocks' partials, the totals, the first blocks, then the extra.
  const int64_t n = int64_t(ts.size());
  Squares q;
  q.buffer = scratch({blocks + n + int64_t(first.size()) + extra}, DType::f64, l.device);
  double* partial = q.buffer.data<double>();
  q.total = partial + blocks;
  auto* first_dev = reinterpret_cast<int64_t*>(q.total + n);
  q.extra = q.total + n + int64_t(first.size());
  BATON_CUDA_CHECK(cudaMemcpyAsync(first_dev, first.data(), first.size() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, l.stream));
  size_t i = 0;
  while (i < ts.size()) {
    const DType dt = ts[i].dtype();
    const int64_t base = first[i];
    BATON_CUDA_DISPATCH(op, dt, T, {
      SumBatch<T> b{};
      for (; i < ts.size() && b.count < kMaxPieces && ts[i].dtype() == dt; ++i)
        if (ts[i].numel() > 0)
          b.piece[b.count++] = {ts[i].raw_data(), ts[i].numel(), first[i] - base};
      const int64_t chunks = first[i] - base;
      if (chunks > 0) {
        sumsq_many_k<T><<<unsigned(chunks), kThreads, 0, l.stream>>>(b, partial + base);
        BATON_CUDA_CHECK_LAUNCH();
      }
    });
  }
  const int per_block = kThreads / 32;
  sumsq_finish<<<unsigned((ts.size() + per_block - 1) / per_block), kThreads, 0, l.stream>>>(
      partial, first_dev, int(ts.size()), q.total);
  BATON_CUDA_CHECK_LAUNCH();
  return q;
}

// One thread adds the totals into their groups, then the groups, in the order the CPU
// does (kernels::sum_squares_grouped).
__global__ void sumsq_grouped_k(const double* total, const int64_t* group, int n, int groups,
                                double* by_group, double* out) {
  for (int g = 0; g < groups; ++g) by_group[g] = 0;
  for (int k = 0; k < n; ++k) by_group[group[k]] += total[k];
  double s = 0;
  for (int g = 0; g < groups; ++g) s += by_group[g];
  *out = s;
}

}  // namespace

double sum_squares(const Tensor& t) {
  return sum_squares_each({t})[0];
}

std::vector<double> sum_squares_each(const std::vector<Tensor>& ts) {
  if (ts.empty()) return {};
  Launch l(ts.at(0));
  const Squares q = queue_sum_squares(ts, l, 0);
  // One copy of the totals and one wait for all of them.
  std::vector<double> host(ts.size());
  BATON_CUDA_CHECK(cudaMemcpyAsync(host.data(), q.total, ts.size() * sizeof(double),
                                   cudaMemcpyDeviceToHost, l.stream));
  BATON_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  return host;
}

Tensor sum_squares_grouped(const std::vector<Tensor>& ts, const std::vector<int>& group,
                           int groups) {
  Launch l(ts.at(0));
  const int n = int(ts.size());
  // The extra doubles: the groups (as int64) and the groups' sums.
  const Squares q = queue_sum_squares(ts, l, int64_t(n) + groups);
  auto* group_dev = reinterpret_cast<int64_t*>(q.extra);
  const std::vector<int64_t> g64(group.begin(), group.end());
  BATON_CUDA_CHECK(cudaMemcpyAsync(group_dev, g64.data(), g64.size() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, l.stream));
  Tensor out = Tensor::empty({1}, DType::f64, memory::Device::cuda(l.device));
  sumsq_grouped_k<<<1, 1, 0, l.stream>>>(q.total, group_dev, n, groups, q.extra + n,
                                         out.data<double>());
  BATON_CUDA_CHECK_LAUNCH();
  return out;
}

namespace {

AdamCoeffs adam_coeffs(const AdamW& cfg, int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  return AdamCoeffs{float(1.0 - cfg.lr * cfg.weight_decay),
                    float(cfg.lr / bc1),
                    float(1.0 / std::sqrt(bc2)),
                    float(1.0 - cfg.beta1),
                    float(cfg.beta2),
                    float(1.0 - cfg.beta2),
                    float(cfg.eps),
                    float(grad_scale)};
}

void check_adamw(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, int64_t step) {
  require_cuda(op, "param", param);
  require_cuda(op, "grad", grad);
  require_cuda(op, "m", m);
  require_cuda(op, "v", v);
  require(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel(),
          op, "param, grad, m, v must have one size");
  require(m.dtype() == param.dtype() && v.dtype() == param.dtype(), op,
          "m and v must have param's dtype");
  require(step >= 1, op, "step counts from 1");
}

}  // namespace

void adamw_step_each(std::vector<AdamWTensors>& ts, const AdamW& cfg, int64_t step,
                     const GradScale& grad_scale) {
  const char* op = "adamw_step_each";
  for (const AdamWTensors& t : ts) {
    check_adamw(op, t.param, t.grad, t.m, t.v, step);
    require(t.param.device() == ts[0].param.device(), op, "every tensor on one device");
    if (t.working.defined()) {
      require_cuda(op, "working", t.working);
      require((t.working.dtype() == DType::bf16 || t.working.dtype() == DType::f16) &&
                  t.working.numel() == t.param.numel() && t.working.is_contiguous(),
              op, "working must be a contiguous 16-bit copy of param, got " + t.working.str());
    }
  }
  const AdamCoeffs c = adam_coeffs(cfg, step, grad_scale.value);
  const double* norm2 = nullptr;
  if (grad_scale.sum_squares.defined()) {
    require_cuda(op, "sum_squares", grad_scale.sum_squares);
    norm2 = grad_scale.sum_squares.data<double>();
  }
  // One launch per (gradient type, parameter type, working copy's type) and kMaxPieces
  // pieces, in order.
  const auto working_type = [&](size_t k) {
    return ts[k].working.defined() ? int(ts[k].working.dtype()) : -1;
  };
  size_t i = 0;
  while (i < ts.size()) {
    const DType gt = ts[i].grad.dtype(), pt = ts[i].param.dtype();
    const int wt = working_type(i);
    Launch l(ts[i].param);
    BATON_CUDA_DISPATCH2(op, gt, pt, G, P, {
      AdamBatch<G, P> b{};
      b.c = c;
      b.working_bf16 = wt == int(DType::bf16);
      b.sum_squares = norm2;
      b.grad_clip = grad_scale.grad_clip;
      b.loss_scale = grad_scale.loss_scale;
      int64_t blocks = 0;
      for (; i < ts.size() && b.count < kMaxPieces && ts[i].grad.dtype() == gt &&
             ts[i].param.dtype() == pt && working_type(i) == wt;
           ++i) {
        AdamWTensors& t = ts[i];
        const int64_t n = t.param.numel();
        if (n == 0) continue;
        b.piece[b.count++] = {static_cast<P*>(t.param.raw_data()),
                              static_cast<const G*>(t.grad.raw_data()),
                              static_cast<P*>(t.m.raw_data()),
                              static_cast<P*>(t.v.raw_data()),
                              t.working.defined() ? t.working.raw_data() : nullptr,
                              n,
                              blocks,
                              float(1.0 - cfg.lr * t.weight_decay)};
        blocks += (n + kChunk - 1) / kChunk;
      }
      if (b.count > 0) {
        adamw_many_k<G, P><<<unsigned(blocks), kThreads, 0, l.stream>>>(b);
        BATON_CUDA_CHECK_LAUNCH();
      }
    });
  }
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamW& cfg,
                int64_t step, double grad_scale) {
  const char* op = "adamw_step";
  check_adamw(op, param, grad, m, v, step);
  const AdamCoeffs c = adam_coeffs(cfg, step, grad_scale);
  const int64_t n = param.numel();
  if (n == 0) return;
  Launch l(param);
  BATON_CUDA_DISPATCH2(op, grad.dtype(), param.dtype(), G, P, {
    adamw_k<G, P><<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<P*>(param.raw_data()), static_cast<const G*>(grad.raw_data()),
        static_cast<P*>(m.raw_data()), static_cast<P*>(v.raw_data()), n, c);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Sgd& cfg,
              double grad_scale) {
  const char* op = "sgd_step";
  require_cuda(op, "param", param);
  require_cuda(op, "grad", grad);
  require(grad.numel() == param.numel(), op, "param and grad must have one size");
  const bool use_buf = cfg.momentum != 0;
  if (use_buf) {
    require_cuda(op, "momentum_buf", momentum_buf);
    require(momentum_buf.numel() == param.numel() && momentum_buf.dtype() == param.dtype(), op,
            "momentum_buf must match param");
  }
  const int64_t n = param.numel();
  if (n == 0) return;
  Launch l(param);
  BATON_CUDA_DISPATCH2(op, grad.dtype(), param.dtype(), G, P, {
    sgd_k<G, P><<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<P*>(param.raw_data()), static_cast<const G*>(grad.raw_data()),
        use_buf ? static_cast<P*>(momentum_buf.raw_data()) : nullptr, n, float(cfg.lr),
        float(cfg.weight_decay), float(cfg.momentum), cfg.nesterov, float(grad_scale));
    BATON_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace baton::kernels::cuda
