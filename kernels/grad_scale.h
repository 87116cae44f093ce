// What an optimizer step multiplies the gradients by: clipped to a global norm and
// unscaled by the loss scale they carry, or nothing at all when the norm is not finite.
// One definition for the host (engine's decide_update) and for a GPU's optimizer kernels,
// which derive it from the squared norm on the device so the host need not wait for the
// norm before queueing the update (GradScale in kernels/ops.h).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define BATON_GRAD_SCALE_HD __host__ __device__ __forceinline__
#else
#define BATON_GRAD_SCALE_HD inline
#endif

namespace baton::kernels {

struct ClipDecision {
  double grad_norm = 0;   // of the unscaled gradients (as carried when not finite)
  double grad_scale = 1;  // what the update multiplies the gradients by
  bool apply = true;      // false: inf or NaN somewhere; no update
};

// sum_squares: of the gradients as they are, carrying loss_scale (0: none); grad_clip:
// the largest norm kept (0: no clipping).
BATON_GRAD_SCALE_HD ClipDecision clip_decision(double sum_squares, double grad_clip,
                                               double loss_scale) {
#if !defined(__CUDA_ARCH__)
  using std::isfinite;
  using std::sqrt;
#endif
  ClipDecision d;
  d.grad_norm = sqrt(sum_squares);
  // inf or NaN anywhere in a gradient makes the sum of squares inf or NaN (with or
  // without a scaler: without one it would poison the parameters).
  if (!isfinite(d.grad_norm)) {
    d.apply = false;
    d.grad_scale = 0;
    return d;
  }
  if (loss_scale > 0) d.grad_norm /= loss_scale;
  const double clip = (grad_clip > 0 && d.grad_norm > grad_clip) ? grad_clip / d.grad_norm : 1.0;
  d.grad_scale = loss_scale > 0 ? clip / loss_scale : clip;
  return d;
}

}  // namespace baton::kernels
