// Random initialisation (the same Philox numbers as the CPU, kernels/random.h), the
// squared-norm reduction for gradient clipping, and the fused AdamW and SGD steps.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
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

constexpr int kSumBlocks = 1024;

template <class T>
__global__ void sumsq_partial(const T* x, int64_t n, double* partial) {
  __shared__ double part[kThreads];
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
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

// One warp: lane l adds partials l, l + 32, ... in order, then a fixed butterfly joins the
// lanes. The order never changes, so the result is deterministic; one thread walking all
// 1024 partials made a step's norm pieces cost milliseconds on the H200.
__global__ void sumsq_finish(double* partial, int blocks) {
  double s = 0;
  for (int b = int(threadIdx.x); b < blocks; b += 32) s += partial[b];
  for (int w = 16; w > 0; w >>= 1) s += __shfl_down_sync(0xffffffffu, s, w);
  if (threadIdx.x == 0) partial[0] = s;
}

struct AdamCoeffs {
  float decay, step_size, inv_bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps, gs;
};

template <class G, class P>
__global__ void adamw_k(P* param, const G* grad, P* m, P* v, int64_t n, AdamCoeffs c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(grad[i]) * c.gs;
    const float mi = to_f(m[i]) + c.one_minus_b1 * (g - to_f(m[i]));
    const float vi = c.b2 * to_f(v[i]) + c.one_minus_b2 * g * g;
    const float denom = sqrtf(vi) * c.inv_bc2_sqrt + c.eps;
    param[i] = from_f<P>(to_f(param[i]) * c.decay - c.step_size * mi / denom);
    m[i] = from_f<P>(mi);
    v[i] = from_f<P>(vi);
  }
}

// Many tensors' AdamW steps in one launch: the pieces travel in the kernel's parameters
// (up to 32 KB on Volta and later since CUDA 12.1), each block updates kChunk elements of
// one piece, found by a binary search over the pieces' first blocks. The arithmetic is
// adamw_k's, so each tensor gets the bits its own adamw_step would give.
constexpr int kMaxPieces = 224;
constexpr int64_t kChunk = 8192;

template <class G, class P>
struct AdamPiece {
  P* param;
  const G* grad;
  P* m;
  P* v;
  int64_t n, first_block;
  float decay;
};

template <class G, class P>
struct AdamBatch {
  AdamPiece<G, P> piece[kMaxPieces];
  int count;
  AdamCoeffs c;
};

template <class G, class P>
__global__ void __launch_bounds__(kThreads)
    adamw_many_k(const __grid_constant__ AdamBatch<G, P> b) {
  int lo = 0, hi = b.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.piece[mid].first_block <= int64_t(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  const AdamPiece<G, P>& p = b.piece[lo];
  const AdamCoeffs& c = b.c;
  const int64_t begin = (int64_t(blockIdx.x) - p.first_block) * kChunk;
  const int64_t end = begin + kChunk < p.n ? begin + kChunk : p.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = to_f(p.grad[i]) * c.gs;
    const float mi = to_f(p.m[i]) + c.one_minus_b1 * (g - to_f(p.m[i]));
    const float vi = c.b2 * to_f(p.v[i]) + c.one_minus_b2 * g * g;
    const float denom = sqrtf(vi) * c.inv_bc2_sqrt + c.eps;
    p.param[i] = from_f<P>(to_f(p.param[i]) * p.decay - c.step_size * mi / denom);
    p.m[i] = from_f<P>(mi);
    p.v[i] = from_f<P>(vi);
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

double sum_squares(const Tensor& t) {
  return sum_squares_each({t})[0];
}

// Each tensor's partial sums and total in its own block of one scratch buffer, then one
// copy of the totals to the host: one wait for all of them.
std::vector<double> sum_squares_each(const std::vector<Tensor>& ts) {
  const char* op = "sum_squares";
  for (const Tensor& t : ts) require_cuda(op, "t", t);
  Launch l(ts.at(0));
  Tensor partial = scratch({int64_t(ts.size()) * kSumBlocks}, DType::f64, l.device);
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    double* block = partial.data<double>() + i * kSumBlocks;
    const int64_t n = t.numel();
    const int blocks = int(std::min<int64_t>(kSumBlocks, (n + kThreads - 1) / kThreads));
    if (blocks > 0) {
      BATON_CUDA_DISPATCH(op, t.dtype(), T, {
        sumsq_partial<T>
            <<<blocks, kThreads, 0, l.stream>>>(static_cast<const T*>(t.raw_data()), n, block);
        BATON_CUDA_CHECK_LAUNCH();
      });
    }
    sumsq_finish<<<1, 32, 0, l.stream>>>(block, blocks);  // no blocks: 0
    BATON_CUDA_CHECK_LAUNCH();
  }
  std::vector<double> host(ts.size());
  BATON_CUDA_CHECK(cudaMemcpy2DAsync(host.data(), sizeof(double), partial.data<double>(),
                                     kSumBlocks * sizeof(double), sizeof(double), ts.size(),
                                     cudaMemcpyDeviceToHost, l.stream));
  BATON_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  return host;
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
                     double grad_scale) {
  const char* op = "adamw_step_each";
  for (const AdamWTensors& t : ts) {
    check_adamw(op, t.param, t.grad, t.m, t.v, step);
    require(t.param.device() == ts[0].param.device(), op, "every tensor on one device");
  }
  const AdamCoeffs c = adam_coeffs(cfg, step, grad_scale);
  // One launch per (gradient type, parameter type) and kMaxPieces pieces, in order.
  size_t i = 0;
  while (i < ts.size()) {
    const DType gt = ts[i].grad.dtype(), pt = ts[i].param.dtype();
    Launch l(ts[i].param);
    BATON_CUDA_DISPATCH2(op, gt, pt, G, P, {
      AdamBatch<G, P> b{};
      b.c = c;
      int64_t blocks = 0;
      for (; i < ts.size() && b.count < kMaxPieces && ts[i].grad.dtype() == gt &&
             ts[i].param.dtype() == pt;
           ++i) {
        AdamWTensors& t = ts[i];
        const int64_t n = t.param.numel();
        if (n == 0) continue;
        b.piece[b.count++] = {static_cast<P*>(t.param.raw_data()),
                              static_cast<const G*>(t.grad.raw_data()),
                              static_cast<P*>(t.m.raw_data()),
                              static_cast<P*>(t.v.raw_data()),
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
