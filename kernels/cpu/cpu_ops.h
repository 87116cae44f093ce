// The CPU backend: plain functions over contiguous buffers, templated on the element
// type (float, double) and, where ids appear, on the id type (int32_t, int64_t).
// kernels/ops.cpp checks shapes and dtypes and calls these; each op family lives in one
// file with its forward and backward side by side.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/block_runs.h"

namespace baton::kernels {
struct AttentionOptions;
struct AdamW;
struct Sgd;
}  // namespace baton::kernels

namespace baton::kernels::cpu {

// ---- gemm.cpp ----
// C[M, N] = alpha op(A) op(B) + beta C, row major, leading dimensions in elements.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// `batch` products of contiguous [M, N] matrices; b_shared: b is one matrix for all.
template <class T>
void matmul(const T* a, bool trans_a, const T* b, bool trans_b, T* c, int64_t batch, int64_t m,
            int64_t n, int64_t k, bool b_shared, T alpha, T beta);
// in_out: w is [in, out]; otherwise [out, in]. bias / dbias may be null.
template <class T>
void linear_forward(const T* x, const T* w, const T* bias, bool in_out, T* y, int64_t rows,
                    int64_t in, int64_t out);
template <class T>
void linear_backward_input(const T* dy, const T* w, bool in_out, T* dx, int64_t rows, int64_t in,
                           int64_t out, bool accumulate);
template <class T>
void linear_backward_weight(const T* dy, const T* x, bool in_out, T* dw, T* dbias, int64_t rows,
                            int64_t in, int64_t out, bool accumulate);

// ---- elementwise.cpp ----
template <class T>
void add(const T* a, const T* b, T* out, int64_t n);
template <class T>
void add_inplace(T* acc, const T* x, int64_t n);
template <class T>
void scale_inplace(T* t, T s, int64_t n);
template <class T>
void bias_add_inplace(T* y, const T* bias, int64_t rows, int64_t cols);
template <class T>
void bias_backward(const T* dy, T* dbias, int64_t rows, int64_t cols, bool accumulate);

// ---- activation.cpp ----
template <class T>
void gelu_forward(const T* x, T* y, int64_t n);
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate);
// h = x + bias (rows x cols; h may be x), y = gelu(h).
template <class T>
void bias_gelu_forward(const T* x, const T* bias, T* h, T* y, int64_t rows, int64_t cols);
template <class T>
void relu_forward(const T* x, T* y, int64_t n);
template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate);

template <class T>
void silu_forward(const T* x, T* y, int64_t n);
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate);
template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n);
// dgate or dup may be null.
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n,
                     bool acc_gate, bool acc_up);

// ---- dropout.cpp ----
template <class T>
void dropout_forward(const T* x, T* y, double p, uint64_t seed, uint64_t stream,
                     const BlockRuns& where);
template <class T>
void dropout_backward(const T* dy, T* dx, double p, uint64_t seed, uint64_t stream,
                      const BlockRuns& where, bool accumulate);
// bits[k] = random_bits(seed, stream, first + k) for k < n, vectorised.
void random_bits_fill(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* bits);

// ---- random.cpp ----
template <class T>
void random_normal(T* out, double mean, double std, uint64_t seed, uint64_t stream,
                   const BlockRuns& where);

// ---- layernorm.cpp ----
template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, double eps, T* y, T* mean, T* rstd,
                       int64_t rows, int64_t cols);
template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                              T* dx, int64_t rows, int64_t cols, bool accumulate);
// dw or db may be null.
template <class T>
void layernorm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                               int64_t rows, int64_t cols, bool accumulate);
// s = a + b, y = LayerNorm(s); backward: dx = ds (may be null) + LayerNorm's input gradient.
template <class T>
void add_layernorm_forward(const T* a, const T* b, const T* w, const T* bias, double eps, T* s,
                           T* y, T* mean, T* rstd, int64_t rows, int64_t cols);
template <class T>
void add_layernorm_backward_input(const T* dy, const T* ds, const T* s, const T* w, const T* mean,
                                  const T* rstd, T* dx, int64_t rows, int64_t cols,
                                  bool accumulate);

// ---- rmsnorm.cpp ----
template <class T>
void rmsnorm_forward(const T* x, const T* w, double eps, T* y, T* rstd, int64_t rows, int64_t cols);
template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, const T* rstd, T* dx, int64_t rows,
                            int64_t cols, bool accumulate);
template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, const T* rstd, T* dw, int64_t rows,
                             int64_t cols, bool accumulate);

// ---- rotary.cpp ----
// x: [batch, seq, heads * head_dim]; dst rows of dst_ld elements, the heads at dst_col.
struct RotaryShape {
  int64_t batch, seq, heads, head_dim, dst_ld, dst_col;
};
template <class T>
void rotary_forward(const T* x, T* dst, const RotaryShape& s, const double* inv_freq,
                    int64_t offset);
template <class T>
void rotary_backward(const T* ddst, T* dx, const RotaryShape& s, const double* inv_freq,
                     int64_t offset, bool accumulate);

// ---- softmax.cpp ----
template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols);
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool accumulate);

// ---- attention.cpp ----
struct AttentionShape {
  int64_t batch, seq, heads, head_dim, kv_heads;
};
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s,
                       const AttentionOptions& opt);
template <class T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                        const AttentionShape& s, const AttentionOptions& opt, bool accumulate);

// ---- embedding.cpp ----
template <class T, class I>
void embedding_forward(const I* ids, const T* table, int64_t table_rows, int64_t row_offset, T* out,
                       int64_t n, int64_t cols, bool accumulate);
template <class T, class I>
void embedding_backward(const I* ids, const T* dout, int64_t table_rows, int64_t row_offset,
                        T* dtable, int64_t n, int64_t cols, int64_t padding_idx);

// ---- cross_entropy.cpp ----
template <class T>
void ce_row_max(const T* logits, T* row_max, int64_t rows, int64_t vocab);
template <class T, class I>
void ce_sum_exp(const T* logits, const I* targets, int64_t vocab_offset, const T* row_max,
                T* sum_exp, T* target_logit, int64_t rows, int64_t vocab);
// dlogits may be null (no gradient) or equal logits.
template <class T, class I>
void ce_finish(const T* logits, const I* targets, int64_t vocab_offset, const T* row_max,
               const T* sum_exp, const T* target_logit, double grad_scale, T* losses, T* dlogits,
               int64_t rows, int64_t vocab);
// The three steps on one device in one call (vocab_offset 0); dlogits as for ce_finish.
template <class T, class I>
void cross_entropy_forward(const T* logits, const I* targets, double grad_scale, T* losses,
                           T* dlogits, int64_t rows, int64_t vocab);
// The vocabulary-parallel form in one read of the local logits (fused.h).
template <class T, class I>
void ce_local_forward(const T* logits, const I* targets, int64_t vocab_offset, double grad_scale,
                      T* local_max, T* local_sum, T* target_logit, T* dlogits, int64_t rows,
                      int64_t vocab);
template <class T>
void ce_local_share(const T* local_max, const T* local_sum, const T* row_max, T* share,
                    int64_t rows);
template <class T, class I>
void ce_local_finish(const I* targets, int64_t vocab_offset, const T* local_max, const T* local_sum,
                     const T* row_max, const T* sum_exp, const T* target_logit, double grad_scale,
                     T* losses, T* dlogits, int64_t rows, int64_t vocab);

// ---- optimizer.cpp ----
template <class T>
double sum_squares(const T* x, int64_t n);
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, int64_t n, const AdamW& cfg, int64_t step,
                double grad_scale);
// buf may be null when cfg.momentum == 0.
template <class T>
void sgd_step(T* param, const T* grad, T* buf, int64_t n, const Sgd& cfg, double grad_scale);

}  // namespace baton::kernels::cpu
