// Pieces shared by the two attention implementations (attention.cu on cuBLAS, and
// flash_attention.cu): the geometry of the packed qkv tensor and attention dropout.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"
#include "kernels/random.h"

namespace baton::kernels::cuda {

struct AttnGeometry {
  int64_t B, T, H, D;
  int64_t ld() const { return 3 * H * D; }  // row stride of qkv
  int64_t ldo() const { return H * D; }     // row stride of out
};

// Dropout on the attention probabilities: the element (b, h, i, j) of the logical
// [B_global, H_global, T, T] tensor, as the CPU backend numbers it.
struct AttnDropout {
  bool on = false;
  uint32_t threshold = 0;
  float scale = 1.f;
  uint64_t seed = 0, stream = 0;
  int64_t global_heads = 0, batch_offset = 0, head_offset = 0;
  __device__ uint64_t row_base(int64_t b, int64_t h, int64_t i, int64_t T) const {
    return uint64_t((((b + batch_offset) * global_heads + (h + head_offset)) * T + i) * T);
  }
  __device__ bool keep(uint64_t idx) const {
    return random::dropout_keep(random::random_bits(seed, stream, idx), threshold);
  }
};

inline AttnDropout attn_dropout(const AttentionOptions& opt, int64_t heads) {
  AttnDropout d;
  d.on = opt.dropout > 0;
  if (!d.on) return d;
  d.threshold = random::dropout_threshold(opt.dropout);
  d.scale = opt.dropout < 1 ? float(1.0 / (1.0 - opt.dropout)) : 0.f;
  d.seed = opt.seed;
  d.stream = opt.stream;
  d.global_heads = opt.global_heads > 0 ? opt.global_heads : heads;
  d.batch_offset = opt.batch_offset;
  d.head_offset = opt.head_offset;
  return d;
}

// The fused (flash) kernels take 16-bit qkv, f32 lse, D in {32, 64, 128} and 16-byte
// aligned rows; they return false (nothing done) otherwise.
bool flash_attention_forward(const Tensor& qkv, const AttnGeometry& g, float scale,
                             const AttnDropout& dr, Tensor& out, Tensor& lse, const Launch& l);
bool flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttnGeometry& g, float scale,
                              const AttnDropout& dr, Tensor& dqkv, bool accumulate,
                              const Launch& l);

// cuDNN's fused attention forward (cudnn_attention.cu, its graph API): 16-bit qkv, f32
// lse, causal, no dropout; returns false (nothing done) for a case it does not take,
// when cuDNN finds no engine for it or cannot be opened (said once in a warning), or when
// baton was built without cuDNN. Its lse is
// the one our kernels write, so either backward may follow.
bool cudnn_attention_forward(const Tensor& qkv, const AttnGeometry& g, float scale,
                             const AttnDropout& dr, Tensor& out, Tensor& lse, const Launch& l);
// Its fused backward from that lse into dqkv (written, not accumulated: false when
// `accumulate`), under the same conditions.
bool cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttnGeometry& g, float scale,
                              const AttnDropout& dr, Tensor& dqkv, bool accumulate,
                              const Launch& l);

}  // namespace baton::kernels::cuda
