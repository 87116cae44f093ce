// The CUDA backend's entry points: one function per op of kernels/ops.h, same name and
// signature, in namespace baton::kernels::cuda. kernels/ops.cpp checks every argument
// (shapes, dtypes, one device) and then calls these for tensors on a CUDA device, so an
// implementation may assume valid, contiguous tensors on one CUDA device.
//
// To plug the backend in, add kernels/cuda/CMakeLists.txt (it adds the .cu sources to
// baton_kernels or links a library into it); kernels/CMakeLists.txt then defines
// BATON_KERNELS_CUDA and ops.cpp starts calling these. Random numbers must follow
// kernels/random.h bit for bit (its functions compile for the device too).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace baton::kernels::cuda {

using memory::Tensor;

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
            double beta);

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout,
                    Tensor& y);
void linear_backward_input(const Tensor& dy, const Tensor& w, WeightLayout layout, Tensor& dx,
                           bool accumulate);
void linear_backward_weight(const Tensor& dy, const Tensor& x, WeightLayout layout, Tensor& dw,
                            Tensor& dbias, bool accumulate);

void add(const Tensor& a, const Tensor& b, Tensor& out);
void add_inplace(Tensor& acc, const Tensor& x);
void scale_inplace(Tensor& t, double s);
void bias_add_inplace(Tensor& y, const Tensor& bias);
void bias_backward(const Tensor& dy, Tensor& dbias, bool accumulate);

void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);

void dropout_forward(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t stream,
                     const Block& where);
void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t stream,
                      const Block& where, bool accumulate);

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate);
void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias, bool accumulate);

void softmax_forward(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool accumulate);

void attention_forward(const Tensor& qkv, const AttentionOptions& opt, Tensor& out, Tensor& lse);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& opt, Tensor& dqkv, bool accumulate);

void embedding_forward(const Tensor& ids, const Tensor& table, int64_t row_offset, Tensor& out,
                       bool accumulate);
void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t row_offset, Tensor& dtable);

void ce_row_max(const Tensor& logits, Tensor& row_max);
void ce_sum_exp(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
void ce_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
               const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
               double grad_scale, Tensor& losses, Tensor& dlogits);

void random_normal(Tensor& out, double mean, double std, uint64_t seed, uint64_t stream,
                   const Block& where);

double sum_squares(const Tensor& t);
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamW& cfg,
                int64_t step, double grad_scale);
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Sgd& cfg,
              double grad_scale);

}  // namespace baton::kernels::cuda
