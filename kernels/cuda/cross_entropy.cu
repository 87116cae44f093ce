// Softmax cross-entropy in the three steps of the vocabulary-parallel form (ops.h): one
// block per row, statistics in f32 whatever the logits' type.
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
  if (threadIdx.x == 0) losses[r] = from_f<S>(ignored ? 0.f : logf(se) + m - to_f(target_logit[r]));
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

}  // namespace baton::kernels::cuda
