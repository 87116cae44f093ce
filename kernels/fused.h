// Fused kernels: two neighbouring ops of a GPT block, or the loss's three steps, in one
// pass (docs/kernels.md, "Fused kernels"). Same conventions and checks as ops.h; the
// add + LayerNorm and bias + GELU on the CPU and on CUDA, the one-call cross-entropy in
// one pass on the CPU (on CUDA it runs the three steps for now).
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
// by round-off).
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, double grad_scale,
                           Tensor& losses, Tensor& dlogits);

}  // namespace baton::kernels
