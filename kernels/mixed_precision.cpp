#include "kernels/mixed_precision.h"

#include <cmath>
#include <stdexcept>

#ifdef BATON_KERNELS_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

namespace baton::kernels {

namespace {

void need_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device() || !a.is_contiguous() ||
      !b.is_contiguous())
    throw std::invalid_argument(std::string("kernels::") + op +
                                ": contiguous tensors on one device expected, got " + a.str() +
                                " and " + b.str());
}

[[maybe_unused]] [[noreturn]] void no_cuda(const char* op) {
  throw RuntimeError(std::string("kernels::") + op +
                     ": CUDA tensors but this build has no CUDA kernels");
}

template <class T>
void unscale_host(T* p, int64_t n, double inv_scale, float* flag) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] = T(double(p[i]) * inv_scale);
    if (!std::isfinite(double(p[i]))) *flag = 1.f;
  }
}

}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  need_same_device("cast", src, dst);
  if (src.numel() != dst.numel())
    throw std::invalid_argument("kernels::cast: " + src.str() + " into " + dst.str() +
                                " differ in size");
  if (src.device().is_cuda()) {
#ifdef BATON_KERNELS_CUDA
    return cuda::cast(src, dst);
#else
    no_cuda("cast");
#endif
  }
  dst.copy_from(src.to(dst.dtype()).view(dst.shape()));
}

void unscale_check(Tensor& t, double inv_scale, Tensor& found_inf) {
  need_same_device("unscale_check", t, found_inf);
  if (found_inf.dtype() != memory::DType::f32 || found_inf.numel() != 1)
    throw std::invalid_argument("kernels::unscale_check: found_inf must be f32 [1], got " +
                                found_inf.str());
  if (t.device().is_cuda()) {
#ifdef BATON_KERNELS_CUDA
    return cuda::unscale_check(t, inv_scale, found_inf);
#else
    no_cuda("unscale_check");
#endif
  }
  float* flag = found_inf.data<float>();
  switch (t.dtype()) {
    case memory::DType::f32:
      return unscale_host(t.data<float>(), t.numel(), inv_scale, flag);
    case memory::DType::f64:
      return unscale_host(t.data<double>(), t.numel(), inv_scale, flag);
    default:
      throw std::invalid_argument("kernels::unscale_check: CPU tensors must be f32 or f64, got " +
                                  t.str());
  }
}

bool LossScaler::unscale(std::span<Tensor> grads) {
  if (grads.empty()) return true;
  Tensor found = Tensor::zeros({1}, memory::DType::f32, grads[0].device());
  for (Tensor& g : grads) unscale_check(g, 1.0 / scale_, found);
  const bool inf = found.to(memory::Device::cpu()).to_vector<float>()[0] != 0.f;
  update(inf);
  return !inf;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= opt_.backoff_factor;
    good_steps_ = 0;
    skipped_++;
    return;
  }
  if (++good_steps_ >= opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    good_steps_ = 0;
  }
}

}  // namespace baton::kernels
