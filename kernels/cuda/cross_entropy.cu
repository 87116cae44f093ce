// Softmax cross-entropy: on one device one fused kernel (two reads of the logits), split
// by vocabulary the three steps of the vocabulary-parallel form (ops.h); one block per
// row, statistics in f32 whatever the logits' type. And the loss's sum in f64.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <class T, class S>
__global__ void row_max_k(const T* logits, S* row_max, int64_t vocab) {
  const T* l = logits + int64_t(blockIdx.x) * vocab;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, to_f(l[j]));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = from_f<S>(m);
}

template <class T, class I, class S>
__global__ void sum_exp_k(const T* logits, const I* targets, int64_t offset, const S* row_max,
                          S* sum_exp, S* target_logit, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const T* l = logits + r * vocab;
  const float m = to_f(row_max[r]);
  float s = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += __expf(to_f(l[j]) - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sum_exp[r] = from_f<S>(s);
    const int64_t t = int64_t(targets[r]) - offset;
    target_logit[r] = from_f<S>(targets[r] >= 0 && t >= 0 && t < vocab ? to_f(l[t]) : 0.f);
  }
}

template <class T, class I, class S>
__global__ void finish_k(const T* logits, const I* targets, int64_t offset, const S* row_max,
                         const S* sum_exp, const S* target_logit, float grad_scale, S* losses,
                         T* dlogits, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const bool ignored = targets[r] < 0;
  const float m = to_f(row_max[r]), se = to_f(sum_exp[r]);
  if (threadIdx.x == 0)
    losses[r] = from_f<S>(ignored ? 0.f : logf(se) + (m - to_f(target_logit[r])));
  if (dlogits == nullptr) return;
  const T* l = logits + r * vocab;
  T* d = dlogits + r * vocab;
  const int64_t t = int64_t(targets[r]) - offset;
  const float scale = grad_scale / se;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float v = 0.f;
    if (!ignored) v = __expf(to_f(l[j]) - m) * scale - (j == t ? grad_scale : 0.f);
    d[j] = from_f<T>(v);  // in place over the logits is safe: each element read first
  }
}

// V elements from p into x (V * sizeof(T) == 16: one vector load; p then 16-byte aligned).
template <int V, class T>
__device__ __forceinline__ void load(const T* p, float (&x)[V]) {
  if constexpr (V == 1) {
    x[0] = to_f(p[0]);
  } else {
    static_assert(V * sizeof(T) == 16);
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = to_f(e[k]);
  }
}
template <int V, class T>
__device__ __forceinline__ void store(T* p, const float (&x)[V]) {
  if constexpr (V == 1) {
    p[0] = from_f<T>(x[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_f<T>(x[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// The whole row's loss (and gradient) in one block: each thread keeps a running max and
// its sum of exponentials over the columns it reads (rescaled when the max rises, once
// per vector rather than per element), the pairs merge across the block, and a second
// read writes the gradient. The three-step form reads the logits three times and
// launches three kernels; this one reads them twice.
template <int V, class T, class I, class S>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_k(const T* logits, const I* targets, float grad_scale, S* losses, T* dlogits,
                    int64_t vocab) {
  const int64_t r = blockIdx.x;
  const T* l = logits + r * vocab;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = int64_t(threadIdx.x) * V; j < vocab; j += int64_t(blockDim.x) * V) {
    float x[V];
    load<V>(l + j, x);
    float vm = x[0];
#pragma unroll
    for (int k = 1; k < V; ++k) vm = fmaxf(vm, x[k]);
    if (vm > m) {
      s *= __expf(m - vm);  // m = -inf: s is still 0
      m = vm;
    }
    if (m != -INFINITY) {  // a row of -inf so far adds nothing (and no NaN)
#pragma unroll
      for (int k = 0; k < V; ++k) s += __expf(x[k] - m);
    }
  }
  const int64_t t = int64_t(targets[r]);
  const bool ignored = t < 0;
  // Read before the reductions' barriers: written in place (d == l), the gradient loop
  // below may store over l[t] before thread 0 would otherwise get to it.
  const float target_logit = threadIdx.x == 0 && !ignored && t < vocab ? to_f(l[t]) : 0.f;
  const float row_max = block_max(m);
  const float sum_exp = block_sum(m == -INFINITY ? 0.f : s * __expf(m - row_max));
  // A target past the vocabulary is a caller's bug the CPU refuses; here (the targets are
  // on the device) its loss is NaN, never the -1e4 of a logit taken as 0.
  if (threadIdx.x == 0)
    losses[r] = from_f<S>(ignored      ? 0.f
                          : t >= vocab ? __int_as_float(0x7fc00000)
                                       : logf(sum_exp) + (row_max - target_logit));
  if (dlogits == nullptr) return;
  T* d = dlogits + r * vocab;
  const float scale = grad_scale / sum_exp;
  for (int64_t j = int64_t(threadIdx.x) * V; j < vocab; j += int64_t(blockDim.x) * V) {
    float x[V];
    load<V>(l + j, x);  // in place over the logits is safe: each vector read before written
#pragma unroll
    for (int k = 0; k < V; ++k)
      x[k] = ignored ? 0.f : __expf(x[k] - row_max) * scale - (j + k == t ? grad_scale : 0.f);
    store<V>(d + j, x);
  }
}

// out = sum(x) / denom in f64, in one block: thread i sums elements i, i + 256, ... in
// order, then a fixed tree; so the same x always gives the same bits (the CPU sums in row
// order: its bits may differ in the last place).
template <class S>
__global__ void __launch_bounds__(kThreads)
    loss_sum_k(const S* x, int64_t n, double denom, double* out) {
  __shared__ double part[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += double(to_f(x[i]));
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0] / denom;
}

void check_logits(const char* op, const Tensor& logits) {
  require_cuda(op, "logits", logits);
  require(logits.dim() == 2, op, "logits must be [N, V]");
}
void check_row(const char* op, const Tensor& logits, const Tensor& t, const char* name) {
  require_cuda(op, name, t);
  require(t.numel() == logits.size(0), op, std::string(name) + " must be [N]");
}

}  // namespace

void ce_row_max(const Tensor& logits, Tensor& row_max) {
  const char* op = "ce_row_max";
  check_logits(op, logits);
  check_row(op, logits, row_max, "row_max");
  if (logits.size(0) == 0) return;
  Launch l(row_max);
  BATON_CUDA_DISPATCH2(op, logits.dtype(), row_max.dtype(), T, S, {
    row_max_k<T, S><<<unsigned(logits.size(0)), kThreads, 0, l.stream>>>(
        static_cast<const T*>(logits.raw_data()), static_cast<S*>(row_max.raw_data()),
        logits.size(1));
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void ce_sum_exp(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_sum_exp";
  check_logits(op, logits);
  check_row(op, logits, targets, "targets");
  check_row(op, logits, row_max, "row_max");
  check_row(op, logits, sum_exp, "sum_exp");
  check_row(op, logits, target_logit, "target_logit");
  require(row_max.dtype() == sum_exp.dtype() && row_max.dtype() == target_logit.dtype(), op,
          "row_max, sum_exp, target_logit of one dtype");
  if (logits.size(0) == 0) return;
  Launch l(sum_exp);
  BATON_CUDA_DISPATCH_ID(
      op, targets.dtype(), I, BATON_CUDA_DISPATCH2(op, logits.dtype(), row_max.dtype(), T, S, {
        sum_exp_k<T, I, S><<<unsigned(logits.size(0)), kThreads, 0, l.stream>>>(
            static_cast<const T*>(logits.raw_data()), static_cast<const I*>(targets.raw_data()),
            vocab_offset, static_cast<const S*>(row_max.raw_data()),
            static_cast<S*>(sum_exp.raw_data()), static_cast<S*>(target_logit.raw_data()),
            logits.size(1));
        BATON_CUDA_CHECK_LAUNCH();
      }));
}

void ce_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
               const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
               double grad_scale, Tensor& losses, Tensor& dlogits) {
  const char* op = "ce_finish";
  check_logits(op, logits);
  check_row(op, logits, targets, "targets");
  check_row(op, logits, row_max, "row_max");
  check_row(op, logits, sum_exp, "sum_exp");
  check_row(op, logits, target_logit, "target_logit");
  check_row(op, logits, losses, "losses");
  require(row_max.dtype() == sum_exp.dtype() && row_max.dtype() == target_logit.dtype() &&
              row_max.dtype() == losses.dtype(),
          op, "row_max, sum_exp, target_logit, losses of one dtype");
  if (dlogits.defined()) {
    require_cuda(op, "dlogits", dlogits);
    require(dlogits.numel() == logits.numel() && dlogits.dtype() == logits.dtype(), op,
            "dlogits must match logits");
  }
  if (logits.size(0) == 0) return;
  Launch l(losses);
  BATON_CUDA_DISPATCH_ID(
      op, targets.dtype(), I, BATON_CUDA_DISPATCH2(op, logits.dtype(), row_max.dtype(), T, S, {
        finish_k<T, I, S><<<unsigned(logits.size(0)), kThreads, 0, l.stream>>>(
            static_cast<const T*>(logits.raw_data()), static_cast<const I*>(targets.raw_data()),
            vocab_offset, static_cast<const S*>(row_max.raw_data()),
            static_cast<const S*>(sum_exp.raw_data()),
            static_cast<const S*>(target_logit.raw_data()), float(grad_scale),
            static_cast<S*>(losses.raw_data()),
            dlogits.defined() ? static_cast<T*>(dlogits.raw_data()) : nullptr, logits.size(1));
        BATON_CUDA_CHECK_LAUNCH();
      }));
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, double grad_scale,
                           Tensor& losses, Tensor& dlogits) {
  const char* op = "cross_entropy_forward";
  check_logits(op, logits);
  check_row(op, logits, targets, "targets");
  check_row(op, logits, losses, "losses");
  if (dlogits.defined()) {
    require_cuda(op, "dlogits", dlogits);
    require(dlogits.numel() == logits.numel() && dlogits.dtype() == logits.dtype(), op,
            "dlogits must match logits");
  }
  if (logits.size(0) == 0) return;
  const int64_t vocab = logits.size(1);
  auto aligned = [](const Tensor& t) {
    return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
  };
  Launch l(losses);
  BATON_CUDA_DISPATCH_ID(
      op, targets.dtype(), I, BATON_CUDA_DISPATCH2(op, logits.dtype(), losses.dtype(), T, S, {
        constexpr int kV = int(16 / sizeof(T));
        const bool vec = vocab % kV == 0 && aligned(logits) && aligned(dlogits);
        auto launch = [&]<int V>() {
          cross_entropy_k<V, T, I, S><<<unsigned(logits.size(0)), kThreads, 0, l.stream>>>(
              static_cast<const T*>(logits.raw_data()), static_cast<const I*>(targets.raw_data()),
              float(grad_scale), static_cast<S*>(losses.raw_data()),
              dlogits.defined() ? static_cast<T*>(dlogits.raw_data()) : nullptr, vocab);
        };
        if (vec)
          launch.template operator()<kV>();
        else
          launch.template operator()<1>();
        BATON_CUDA_CHECK_LAUNCH();
      }));
}

void loss_sum(const Tensor& losses, double denom, Tensor& out) {
  const char* op = "loss_sum";
  require_cuda(op, "losses", losses);
  require_cuda(op, "out", out);
  require(out.numel() == 1 && out.dtype() == DType::f64, op, "out must be one f64");
  Launch l(out);
  BATON_CUDA_DISPATCH(op, losses.dtype(), S, {
    loss_sum_k<S><<<1, kThreads, 0, l.stream>>>(static_cast<const S*>(losses.raw_data()),
                                                losses.numel(), denom, out.data<double>());
    BATON_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace baton::kernels::cuda
