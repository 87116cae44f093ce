// The numeric precision of a training run, as `baton train --precision` names it:
// f32 (exact f32 GEMMs), tf32 (f32 with TF32 tensor-core GEMMs), bf16 (bf16 activations
// and working weights, f32 master weights and optimizer state), fp16 (the same in f16,
// with dynamic loss scaling: kernels/mixed_precision.h's LossScaler).
#pragma once

#include <string>
#include <string_view>

#include "memory/device.h"
#include "memory/dtype.h"
#include "memory/error.h"

namespace baton::kernels {

enum class Precision { f32, tf32, bf16, fp16 };

// "f32", "tf32", "bf16", "fp16"; InputError naming `what` (the flag or JSON path) otherwise.
inline Precision parse_precision(std::string_view text, std::string_view what = "--precision") {
  if (text == "f32") return Precision::f32;
  if (text == "tf32") return Precision::tf32;
  if (text == "bf16") return Precision::bf16;
  if (text == "fp16") return Precision::fp16;
  throw InputError(std::string(what) + ": expected f32, tf32, bf16 or fp16, found '" +
                   std::string(text) + "'");
}

inline std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

// The dtype of activations and working weights (master weights stay f32).
inline memory::DType compute_dtype(Precision p) {
  return p == Precision::bf16   ? memory::DType::bf16
         : p == Precision::fp16 ? memory::DType::f16
                                : memory::DType::f32;
}

// Whether the run needs a loss scaler (fp16's five exponent bits underflow small gradients).
inline bool needs_loss_scaling(Precision p) {
  return p == Precision::fp16;
}

// InputError naming the precision and the device when `device` cannot run it: the CPU
// backend computes in f32 (its ops take one dtype per op, so no f32 master beside a
// 16-bit working copy, and no tensor cores for tf32), so tf32, bf16 and fp16 need a
// CUDA device. `what` names where the precision came from (the flag or the JSON path).
inline void check_precision(Precision p, memory::Device device,
                            std::string_view what = "--precision") {
  if (p == Precision::f32 || device.is_cuda()) return;
  throw InputError(std::string(what) + " " + std::string(precision_name(p)) +
                   ": needs a CUDA device (" + device.str() +
                   " computes in f32 only; use --precision f32 or --device cuda)");
}

}  // namespace baton::kernels
