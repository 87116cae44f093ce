// Fused kernels: two neighbouring ops of a GPT block, or the loss's three steps, in one
// pass (docs/kernels.md, "Fused kernels"). Same conventions and checks as ops.h; the
// add + LayerNorm and bias + GELU on the CPU and on CUDA, the one-call cross-entropy in
// one pass on the CPU (on CUDA it runs the three steps for now), the vocabulary-parallel
// cross-entropy's local part in one pass on the CPU.
#pragma once

#include "kernels/ops.h"

namespace baton::kernels {

// The residual add fused with the LayerNorm that reads its sum (a GPT block's add_1 and
// ln_2): s = a + b, y = LayerNorm(s), one pass per row; the same bits as add then
// layernorm_forward. Backward: dx = ds + LayerNorm's input gradient (ds, the gradient s
// gets from its other readers, may be undefined), the gradient of both a and b; the
// weight gradients are layernorm_backward_weight's over s.
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight,
                           const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                           Tensor& rstd);
void add_layernorm_backward_input(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                  Tensor& dx, bool accumulate);

// Bias with GELU fused (the MLP's c_fc after a bias-free GEMM): h = x + bias (x: [N, C],
// bias: [C]; h may be x itself), y = gelu(h), one pass. Backward needs no fused kernel:
// gelu_backward(h, dy, dx) then bias_backward(dx, dbias).
void bias_gelu_forward(const Tensor& x, const Tensor& bias, Tensor& h, Tensor& y);

// Single-device softmax cross-entropy in one call: ce_row_max, ce_sum_exp and ce_finish
// (vocab_offset 0) in one read of the logits and one exp per logit, the same arguments and
// results (bit for bit for rows up to 1024 logits; longer rows, summed in chunks, differ
// by round-off). On CUDA one kernel reading the logits twice (an online max and sum,
// then the gradient) where the three steps read them three times.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, double grad_scale,
                           Tensor& losses, Tensor& dlogits);

// The vocabulary-parallel cross-entropy with one read of the local logits (columns
// [vocab_offset, vocab_offset + V_local), as ce_row_max and friends). Per rank:
//   ce_local_forward: local_max, local_sum = sum exp(l - local_max) over the local columns
//     and target_logit (0 when the target is not local or negative), all [N]; with
//     dlogits defined (it may be the logits) also grad_scale * exp(l - local_max) /
//     local_sum, one exp per logit;
//   row_max = all-reduce max of local_max;
//   ce_local_share: share = local_sum * exp(local_max - row_max);
//   sum_exp, target_logit = all-reduce sum of share, target_logit;
//   ce_local_finish: losses as ce_finish; dlogits (the tensor ce_local_forward filled)
//     scaled by share / sum_exp into grad_scale * softmax, less grad_scale at the target.
// The same losses and gradients as the three steps to round-off (the sum is rescaled
// per rank); on one rank those of cross_entropy_forward bit for bit. CPU only for now.
void ce_local_forward(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                      double grad_scale, Tensor& local_max, Tensor& local_sum, Tensor& target_logit,
                      Tensor& dlogits);
void ce_local_share(const Tensor& local_max, const Tensor& local_sum, const Tensor& row_max,
                    Tensor& share);
void ce_local_finish(const Tensor& targets, int64_t vocab_offset, const Tensor& local_max,
                     const Tensor& local_sum, const Tensor& row_max, const Tensor& sum_exp,
                     const Tensor& target_logit, double grad_scale, Tensor& losses,
                     Tensor& dlogits);

}  // namespace baton::kernels
