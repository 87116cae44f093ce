// The CUDA backend of kernels/ops.h: the same functions, for tensors on a CUDA device,
// called by the dispatch in kernels/ops.cpp. Plain C++ (no CUDA headers), so the
// dispatch compiles with the host compiler.
//
// Element types: f32, bf16 and f16 (f64 stays on the CPU reference). Mixed precision
// (bf16/f16 compute, f32 master weights) is allowed where it is needed, and nowhere else:
// - GEMMs (matmul, linear_*): a, b (x, w, dy) of one type; c (y, dx, dw) of that type or
//   f32 (weight gradients accumulated in f32). Products accumulate in f32; f32 inputs use
//   TF32 tensor cores only when set_allow_tf32(true). bias/dbias: y's type or f32.
// - add_inplace: acc may be f32 while x is bf16/f16 (gradient accumulation).
// - bias_add_inplace, bias_backward, bias_gelu_forward's bias, layernorm (and the fused
//   add + layernorm) weight/bias/dweight/dbias/mean/rstd, rmsnorm weight/dweight/rstd,
//   ce row_max/sum_exp/target_logit/losses, attention lse: f32 or the activation type.
// - embedding: out may differ from the table's type (f32 table, bf16 activations);
//   dtable f32 or dout's type.
// - adamw/sgd: param, m, v, momentum f32 or the grad's type; grad any float type.
// - Every other op: one element type for all its tensors.
// Kernels run on the calling thread's current stream of the tensors' device
// (memory/cuda_device.h) and return without waiting; sum_squares waits (returns a host
// value).
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/ops.h"

namespace baton::kernels::cuda {

// ---- settings (process-wide) ----
// TF32 tensor cores for f32 GEMMs: about 8x faster on Hopper, 10-bit mantissa products.
// Off by default so that f32 results match the CPU within 1e-4.
void set_allow_tf32(bool allow);
bool allow_tf32();

// How the linear layer's bias has run in this process. linear_forward: through
// cuBLASLt's bias epilogue (one pass; the path for whole, 256-byte aligned tensors) or
// as a GEMM and a bias kernel. linear_backward_weight's bias gradient: summed in the
// weight GEMM's epilogue (BGRADA/BGRADB; aligned tensors, dbias of dw's type, Lt having
// an algorithm; BATON_CUDA_BIAS_GRAD=colsum turns it off) or by the column-sum kernel.
// For tests and the GPU check, which assert the fast path is taken.
struct LinearBiasPaths {
  uint64_t lt_epilogue = 0;
  uint64_t gemm_then_bias = 0;
  uint64_t lt_bias_grad = 0;
  uint64_t colsum_bias_grad = 0;
};
LinearBiasPaths linear_bias_paths();

// ---- GEMM ----
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
            double beta);
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout,
                    Tensor& y);
void linear_backward_input(const Tensor& dy, const Tensor& w, WeightLayout layout, Tensor& dx,
                           bool accumulate);
void linear_backward_weight(const Tensor& dy, const Tensor& x, WeightLayout layout, Tensor& dw,
                            Tensor& dbias, bool accumulate);

// ---- elementwise ----
void add(const Tensor& a, const Tensor& b, Tensor& out);
void add_inplace(Tensor& acc, const Tensor& x);
void scale_inplace(Tensor& t, double s);
void bias_add_inplace(Tensor& y, const Tensor& bias);
void bias_backward(const Tensor& dy, Tensor& dbias, bool accumulate);
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void bias_gelu_forward(const Tensor& x, const Tensor& bias, Tensor& h, Tensor& y);
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void silu_forward(const Tensor& x, Tensor& y);
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                     Tensor& dup, bool acc_gate, bool acc_up);
void dropout_forward(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t stream,
                     const Block& where);
void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t stream,
                      const Block& where, bool accumulate);

// ---- normalisation ----
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate);
void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias, bool accumulate);
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight,
                           const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                           Tensor& rstd);
void add_layernorm_backward_input(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                  Tensor& dx, bool accumulate);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, Tensor& dx, bool accumulate);
void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dweight,
                             bool accumulate);
void softmax_forward(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool accumulate);

// ---- attention ----
// automatic: cuDNN's fused forward where it applies (measured faster on the H200), else
// the fused flash kernels for bf16/f16 (f32 lse) with head size 32, 64 or 128, cuBLAS
// GEMMs with a softmax kernel otherwise; the backward on the flash kernels where they
// apply. flash / cublas / cudnn force one (flash and cudnn's forward throw for a case they
// do not cover). cudnn: cuDNN's fused attention (its graph API: 16-bit, causal, no
// dropout, head size a multiple of 8 up to 256; only when built with cuDNN:
// cudnn_built()) forward and backward (when accumulating, the backward on our kernels:
// the lse is the same); whether `automatic` should take cuDNN's backward
// too is for a measurement on a GPU to say (docs/cuda.md). Process-wide; for tests and
// comparisons.
enum class AttentionImpl { automatic, flash, cublas, cudnn };
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();
// "automatic", "flash", "cublas", "cudnn"; throws std::invalid_argument for another name.
AttentionImpl attention_impl_from_name(std::string_view name);
bool cudnn_built();
void attention_forward(const Tensor& qkv, const AttentionOptions& opt, Tensor& out, Tensor& lse);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& opt, Tensor& dqkv, bool accumulate);

// Grouped-query attention (kv_heads < heads) copies the key/value heads out to one per
// query head (a [B, T, 3 H D] scratch) and runs the paths above; backward sums each group.

// ---- rotary position embeddings (head size up to 512) ----
void rotary_forward(const Tensor& x, const RotaryOptions& opt, Tensor& dst, int64_t dst_col);
void rotary_backward(const Tensor& ddst, int64_t dst_col, const RotaryOptions& opt, Tensor& dx,
                     bool accumulate);

// ---- embedding ----
void embedding_forward(const Tensor& ids, const Tensor& table, int64_t row_offset, Tensor& out,
                       bool accumulate);
void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t row_offset, Tensor& dtable,
                        int64_t padding_idx);

// ---- cross-entropy ----
void ce_row_max(const Tensor& logits, Tensor& row_max);
void ce_sum_exp(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
void ce_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
               const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
               double grad_scale, Tensor& losses, Tensor& dlogits);
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, double grad_scale,
                           Tensor& losses, Tensor& dlogits);
void loss_sum(const Tensor& losses, double denom, Tensor& out);

// ---- random initialisation ----
void random_normal(Tensor& out, double mean, double std, uint64_t seed, uint64_t stream,
                   const Block& where);

// ---- optimizers ----
double sum_squares(const Tensor& t);
std::vector<double> sum_squares_each(const std::vector<Tensor>& ts);
Tensor sum_squares_grouped(const std::vector<Tensor>& ts, const std::vector<int>& group,
                           int groups);
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamW& cfg,
                int64_t step, double grad_scale);
void adamw_step_each(std::vector<AdamWTensors>& ts, const AdamW& cfg, int64_t step,
                     const GradScale& grad_scale);
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Sgd& cfg,
              double grad_scale);

// ---- mixed precision (kernels/mixed_precision.h dispatches to these) ----
// dst = src converted (f32 <-> bf16 <-> f16), e.g. the bf16 working copy of f32 master
// weights each step.
void cast(const Tensor& src, Tensor& dst);
// t *= inv_scale; found_inf (f32 [1]) becomes 1 if any element of t is inf or NaN, and is
// left as it is otherwise (one flag over many tensors, read once per step).
void unscale_check(Tensor& t, double inv_scale, Tensor& found_inf);

}  // namespace baton::kernels::cuda
