// Mixed precision: the ops it needs beyond kernels/ops.h (a cast for the 16-bit working
// copy of f32 master weights, the unscale-and-check of fp16 loss scaling) and the
// dynamic loss scaler. bf16 needs no loss scaling (its exponent range is f32's); fp16
// does, since small gradients underflow its 5-bit exponent.
//
// A bf16 training step: cast f32 master weights to bf16 copies; forward and backward in
// bf16 with f32 statistics; weight gradients accumulated in f32 (the GEMMs write f32
// directly); the optimizer updates the f32 masters. kernels/cuda/ops_cuda.h lists which
// tensors may be f32 beside 16-bit ones.
#pragma once

#include <cstdint>
#include <span>

#include "memory/tensor.h"

namespace baton::kernels {

using memory::Tensor;

// dst = src converted between float types (f32, f64 on CPU; f32, bf16, f16 on CUDA), one
// device, one size.
void cast(const Tensor& src, Tensor& dst);

// t *= inv_scale; found_inf (f32 [1], t's device) becomes 1 when any result is inf or NaN
// and keeps its value otherwise, so one flag serves every gradient of a step.
void unscale_check(Tensor& t, double inv_scale, Tensor& found_inf);

// Dynamic loss scaling as torch.cuda.amp.GradScaler does it: multiply the loss by
// scale(); before the optimizer, unscale() the gradients; a step whose gradients overflow
// is skipped and halves the scale; growth_interval clean steps in a row double it.
class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };
  LossScaler() : LossScaler(Options{}) {}
  explicit LossScaler(Options opt) : opt_(opt), scale_(opt.init_scale) {}

  double scale() const { return scale_; }
  // Unscales every gradient in place (one device) and returns true when all are finite,
  // i.e. when the optimizer step may run. Reads one flag from the device.
  bool unscale(std::span<Tensor> grads);
  // Adjusts the scale after a step; unscale() calls it.
  void update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }
  // Clean steps since the scale last changed (growth after growth_interval of them).
  int64_t good_steps() const { return good_steps_; }
  // Continues from a checkpoint: the scale and the clean steps it had reached.
  void restore(double scale, int64_t good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  Options opt_;
  double scale_;
  int64_t good_steps_ = 0, skipped_ = 0;
};

}  // namespace baton::kernels
