// The ops baton computes, forward and backward, on tensors of any backend: each call
// dispatches on the device of its tensors (kernels/cpu now, kernels/cuda when built).
//
// Conventions, for every function here:
// - Tensors are contiguous and on one device. CPU kernels take f32 and f64 (f64 is the
//   reference the finite-difference tests use); token ids are i32 or i64. Where a shape
//   says [N, C], any leading dimensions are accepted and flattened into N.
// - Bad arguments (shapes, dtypes, mixed devices) throw std::invalid_argument naming the
//   op and the argument; a CUDA tensor in a build without the CUDA kernels is a
//   RuntimeError.
// - Outputs are allocated by the caller and passed in; nothing here allocates a tensor
//   that outlives the call, so the caller's memory accounting is the truth.
// - `accumulate` = true adds into the output (gradients summed over micro-batches or
//   over several consumers of one tensor); false overwrites it.
// - Backward is split as the schedules need it: *_backward_input computes the gradients
//   of activations (B, on the critical path); *_backward_weight those of parameters (W,
//   deferrable). Ops without parameters only have *_backward.
// - Randomness is counter based: an element's random number depends on (seed, stream,
//   its index in the LOGICAL tensor), never on how the tensor is partitioned, on the
//   thread count or on the micro-batch split. A tensor that is a block of a larger
//   logical tensor says where it sits with a Block.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "memory/tensor.h"

namespace baton::kernels {

using memory::Tensor;

// ---- threads ----
// One pool per process for every parallel loop and for OpenBLAS; never more busy
// threads than this.
void set_num_threads(int n);
int num_threads();  // until set: OMP_NUM_THREADS, else the number of cores
// The CPU libraries read some settings from the environment once, when they load, so
// programs call this first thing in main(); it re-executes the program once with what is
// missing, and otherwise returns and changes nothing:
// - OPENBLAS_CORETYPE, when the user set none and OpenBLAS 0.3.21's own detection, which
//   misses recent CPUs, fell back to SSE3 kernels (sgemm 4x slower): SkylakeX on AVX-512,
//   Haswell on AVX2;
// - GOMP_SPINCOUNT=3000, when neither it nor OMP_WAIT_POLICY is set: libgomp's default
//   of spinning 300,000 rounds between parallel regions made a two-thread run on a loaded
//   host several times slower than one thread (docs/kernels.md, "Threads").
// `computes` false (a launcher, --help): the variables are set for the programs it starts,
// and it does not execute itself again.
void configure_cpu_runtime(char** argv, bool computes = true);
// The library behind the CPU's f32 GEMMs (f64 always runs on OpenBLAS). oneDNN's sgemm is
// the default in builds that have oneDNN: measured faster at the models' shapes
// (docs/kernels.md, "Which BLAS"). BATON_SGEMM=openblas|onednn in the environment
// chooses at the first call (anything else is an InputError naming it); set_cpu_sgemm
// changes it for the whole process, and throws InputError for oneDNN in a build without it.
enum class CpuSgemm { kOpenBlas, kOneDnn };
CpuSgemm cpu_sgemm();
void set_cpu_sgemm(CpuSgemm library);

// True when this build has the CUDA kernels (CUDA tensors can be computed on).
bool built_with_cuda();

// ---- where a local tensor sits in its logical tensor ----
struct Block {
  std::vector<int64_t> global_shape;  // empty: the tensor is the whole logical tensor
  std::vector<int64_t> offsets;       // the local tensor's first index in each dimension
};

// ---- GEMM ----
// c = alpha * op(a) * op(b) + beta * c (c must not overlap a or b). a: [M, K] ([K, M]
// when trans_a), b: [K, N] ([N, K] when trans_b), c: [M, N]. With leading batch
// dimensions on a, b and c the product is batched; b may also be 2-D and then is shared
// by every batch of a.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            double alpha = 1.0, double beta = 0.0);

// ---- linear: y = x W (+ bias) ----
// out_in: W is [out, in] (torch.nn.Linear); in_out: W is [in, out] (Hugging Face GPT-2's
// Conv1D). x: [N, in], y: [N, out], bias: [out] or undefined.
enum class WeightLayout { out_in, in_out };
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout,
                    Tensor& y);
void linear_backward_input(const Tensor& dy, const Tensor& w, WeightLayout layout, Tensor& dx,
                           bool accumulate);
// dbias may be undefined (no bias).
void linear_backward_weight(const Tensor& dy, const Tensor& x, WeightLayout layout, Tensor& dw,
                            Tensor& dbias, bool accumulate);

// ---- elementwise ----
void add(const Tensor& a, const Tensor& b, Tensor& out);               // out = a + b (residual)
void add_inplace(Tensor& acc, const Tensor& x);                        // acc += x
void scale_inplace(Tensor& t, double s);                               // t *= s
void bias_add_inplace(Tensor& y, const Tensor& bias);                  // y[n, :] += bias
void bias_backward(const Tensor& dy, Tensor& dbias, bool accumulate);  // sum over rows

// GELU in GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);

// SiLU: x sigmoid(x). SwiGLU (LLaMA's gated MLP): y = silu(gate) * up, fused; in
// swiglu_backward dgate or dup may be undefined (not needed), each with its own flag.
void silu_forward(const Tensor& x, Tensor& y);
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate);
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                     Tensor& dup, bool acc_gate, bool acc_up);

// Inverted dropout: y = x * mask / (1 - p), mask[i] = uniform(seed, stream, i) >= p with i
// the element's index in the logical tensor that `where` describes.
void dropout_forward(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t stream,
                     const Block& where);
void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t stream,
                      const Block& where, bool accumulate);

// ---- normalisation ----
// x: [N, C]; weight, bias: [C]; mean, rstd: [N] saved for backward (any shape with N
// elements). In layernorm_backward_weight one of dweight and dbias may be undefined.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate);
void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias, bool accumulate);

// RMSNorm (LLaMA's): y = weight * x / sqrt(mean(x^2) + eps) over the last dimension of
// x: [N, C]; weight: [C]; rstd: [N] (any shape with N elements) saved for backward.
void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, Tensor& dx, bool accumulate);
void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dweight,
                             bool accumulate);

// Row-wise softmax over the last dimension of x: [N, C].
void softmax_forward(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool accumulate);

// ---- attention ----
// Causal multi-head self-attention. qkv: [B, T, (H + 2 * KV) * D]: all query heads, then
// the KV key heads, then the KV value heads (head h at columns h*D.. of its part); with
// KV = H this is Hugging Face GPT-2's c_attn output. KV < H is grouped-query attention
// (KV = 1: multi-query): query head h reads key/value head (head_offset + h) / group -
// kv_offset. out: [B, T, H * D]; lse: [B, H, T] (log-sum-exp of each row's scores, saved
// so backward recomputes the probabilities instead of storing a T x T matrix).
struct AttentionOptions {
  int64_t heads = 1;  // H: query heads held locally
  // KV: key/value heads held locally (0: H). group: query heads per key/value head in the
  // logical model (0: H / KV). kv_offset: the logical index of the first local key/value
  // head (-1: head_offset / group, those of the local query heads; 0 when a tensor-parallel
  // rank holds all of them, replicated).
  int64_t kv_heads = 0, group = 0, kv_offset = -1;
  std::optional<double> scale;  // unset: 1/sqrt(D); 0 is a real scale (uniform weights)
  // Dropout on the attention probabilities; the logical tensor is [B_global, H_global, T, T]
  // and the local one starts at (batch_offset, head_offset, 0, 0).
  double dropout = 0;
  uint64_t seed = 0, stream = 0;
  int64_t batch_offset = 0, head_offset = 0, global_batch = 0, global_heads = 0;
};
void attention_forward(const Tensor& qkv, const AttentionOptions& opt, Tensor& out, Tensor& lse);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& opt, Tensor& dqkv, bool accumulate);

// ---- rotary position embeddings ----
// Hugging Face's rope_scaling: none (the default rope), linear (positions divided by
// factor) or llama3 (low frequencies divided by factor, high ones kept, a smooth blend
// between, by the wavelengths relative to original_max_position_embeddings).
struct RopeScaling {
  enum class Kind { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
};
// inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2, scaled as `scaling` says (the
// formulas of transformers' rope initialisation functions, in double).
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

// Rotate-half convention: in each head of D columns, column i pairs with i + D/2 and the
// pair turns by (t + position_offset) * inv_freq[i] at position t. x: [B, T, heads * D];
// dst: [B, T, C] receives the rotated heads in columns [dst_col, dst_col + heads * D)
// (the query or key part of a fused qkv); its other columns are untouched.
struct RotaryOptions {
  int64_t heads = 1;
  const std::vector<double>* inv_freq = nullptr;  // D / 2 values
  int64_t position_offset = 0;
};
void rotary_forward(const Tensor& x, const RotaryOptions& opt, Tensor& dst, int64_t dst_col);
// dx = the inverse rotation of columns [dst_col, dst_col + heads * D) of ddst.
void rotary_backward(const Tensor& ddst, int64_t dst_col, const RotaryOptions& opt, Tensor& dx,
                     bool accumulate);

// ---- embedding ----
// out[n, :] = table[ids[n] - row_offset, :] for ids in [row_offset, row_offset + rows);
// rows outside give zeros (accumulate = false) or nothing (accumulate = true). That is the
// vocabulary-parallel lookup: each rank holds a slice of rows and the partial results are
// summed. ids: [N] i32/i64 (any shape); table: [rows, C]; out: ids' shape + [C].
void embedding_forward(const Tensor& ids, const Tensor& table, int64_t row_offset, Tensor& out,
                       bool accumulate);
// dtable[ids[n] - row_offset, :] += dout[n, :] for ids in range (always accumulates).
// padding_idx >= 0: positions whose id equals it (a global id, as ids are) add nothing, as
// torch's nn.Embedding(padding_idx) does; -1: none.
void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t row_offset, Tensor& dtable,
                        int64_t padding_idx = -1);

// ---- softmax cross-entropy over a (possibly vocabulary-split) logits matrix ----
// logits: [N, Vlocal] holding vocabulary columns [vocab_offset, vocab_offset + Vlocal);
// targets: [N] i32/i64; a negative target (-100, as Hugging Face writes it) marks a row to
// ignore: zero loss, zero gradient.
// On one device: ce_row_max, ce_sum_exp, ce_finish. Split over ranks, the caller
// all-reduces row_max (max) between the first two and sum_exp and target_logit (sum)
// before the last: the standard vocabulary-parallel cross-entropy.
void ce_row_max(const Tensor& logits, Tensor& row_max);  // [N]
void ce_sum_exp(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);  // [N], [N]
// losses[n] = log(sum_exp) + row_max - target_logit (0 for ignored rows). When dlogits is
// defined it receives grad_scale * (softmax - onehot) for the local columns (undefined:
// losses only); dlogits may be the logits tensor itself (overwritten in place to save
// memory).
void ce_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
               const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
               double grad_scale, Tensor& losses, Tensor& dlogits);
// out (one f64 on the losses' device) = sum(losses) / denom, summed in double in a fixed
// order (row order on the CPU, a fixed tree on CUDA): the same losses give the same bits
// whatever the thread count or the plan; on a GPU the loss stays there, no host wait.
void loss_sum(const Tensor& losses, double denom, Tensor& out);

// ---- random initialisation ----
// Fills out with normal(mean, std) numbers from (seed, stream) and the element's index in
// the logical tensor `where` describes, so every shard of a parameter gets exactly the
// values the unsplit parameter would have.
void random_normal(Tensor& out, double mean, double std, uint64_t seed, uint64_t stream,
                   const Block& where);
// A stable 64-bit stream id for a name (a parameter's name, an op's name).
uint64_t stream_of(std::string_view name);

// ---- optimizers and gradient clipping ----
double sum_squares(const Tensor& t);  // for the global gradient norm (in double)
// sum_squares of each tensor, the same values; tensors on one GPU cost one wait for the
// host in all (a step's norm asks for every gradient's).
std::vector<double> sum_squares_each(const std::vector<Tensor>& ts);
// The squares of the tensors added into groups (group[k]: tensor k's, from 0 to groups - 1),
// each group's in the tensors' order, then the groups in order: one f64 element on the
// tensors' device (a CPU tensor for none), queued without a wait. A step's squared
// gradient norm in one order every backend follows.
Tensor sum_squares_grouped(const std::vector<Tensor>& ts, const std::vector<int>& group,
                           int groups);

struct AdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
// One step on param with gradient grad * grad_scale (grad_scale folds in clipping and
// loss averaging); m, v: the moments; step counts from 1.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamW& cfg,
                int64_t step, double grad_scale);
// adamw_step on each of many tensors (cfg.weight_decay replaced by each one's), the same
// bits; on a GPU one launch for up to a few hundred of them (a step's every parameter)
// where one each cost a launch of its own.
struct AdamWTensors {
  Tensor param, grad, m, v;
  double weight_decay = 0.0;
  // Optional: a 16-bit copy of param (mixed precision's working copy) that receives the
  // updated value, cast as kernels::cast would; on a GPU in the update's own pass.
  Tensor working;
};
// What adamw_step_each multiplies the gradients by: a number, or the clip_decision
// (kernels/grad_scale.h) of a squared norm held on the tensors' device. A GPU derives it
// in the update's own kernel, so the host queues the update without waiting for the
// norm; a norm that is not finite leaves every tensor as it was.
struct GradScale {
  GradScale(double v = 1.0) : value(v) {}  // NOLINT(google-explicit-constructor): a number
  GradScale(Tensor norm2, double clip, double carried)
      : sum_squares(std::move(norm2)), grad_clip(clip), loss_scale(carried) {}
  double value = 1.0;
  Tensor sum_squares;  // one f64 element; defined: the scale derives from it
  double grad_clip = 0, loss_scale = 0;
};
void adamw_step_each(std::vector<AdamWTensors>& ts, const AdamW& cfg, int64_t step,
                     const GradScale& grad_scale);

struct Sgd {
  double lr = 1e-2, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};
// momentum_buf may be undefined when momentum == 0; start it at zero (the first step then
// sets it to the gradient, as torch's does).
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Sgd& cfg,
              double grad_scale);

}  // namespace baton::kernels
