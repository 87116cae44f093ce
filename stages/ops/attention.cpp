// attention: causal multi-head self-attention over a fused qkv value (GPT-2's c_attn
// output, or rotary's for the LLaMA family), grouped-query when n_kv_head < n_head. Under
// tensor parallelism a node holds `n_head` of `global_heads` query heads starting at
// `head_offset` (the offsets place its dropout mask in the logical tensor) and `n_kv_head`
// key/value heads starting at `kv_offset`, each serving `kv_group` query heads.
#include <algorithm>
#include <cmath>

#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& attention_schema() {
  static const OpSchema s{
      "attention",
      {"qkv"},
      {"y"},
      {},
      {"n_head", "n_kv_head", "scale", "dropout", "head_offset", "global_heads", "kv_offset",
       "kv_group"},
      "causal multi-head self-attention; qkv [T, (n_head + 2 * n_kv_head) * D] holds all "
      "queries, then all keys, then all values; y [T, n_head * D]; n_kv_head (default "
      "n_head) < n_head is grouped-query attention"};
  return s;
}

class Attention final : public OpBase {
 public:
  explicit Attention(const OpSpec& spec) : OpBase(attention_schema(), spec) {
    heads_ = spec.attrs.at("n_head").as_int(1, 1 << 20);
    global_heads_ = spec.attrs.get_int("global_heads", heads_, heads_, 1 << 20);
    head_offset_ = spec.attrs.get_int("head_offset", 0, 0, global_heads_ - heads_);
    dropout_ = spec.attrs.get_double("dropout", 0.0, 0.0, 0.999);
    kv_ = spec.attrs.get_int("n_kv_head", heads_, 1, 1 << 20);
    const bool local_kv = spec.attrs.has("kv_group");  // a tensor-parallel slice
    if (!local_kv && heads_ % kv_ != 0)
      spec.attrs.at("n_kv_head")
          .fail("a divisor of n_head = " + std::to_string(heads_), std::to_string(kv_));
    group_ = spec.attrs.get_int("kv_group", heads_ / kv_, 1, 1 << 20);
    // By default the key/value heads are those of the local query heads.
    kv_offset_ = spec.attrs.get_int("kv_offset", head_offset_ / group_, 0, 1 << 20);
    {
      const int64_t first = head_offset_ / group_ - kv_offset_;
      const int64_t last = (head_offset_ + heads_ - 1) / group_ - kv_offset_;
      if (first < 0 || last >= kv_)
        spec.attrs.fail_message(
            "query heads " + std::to_string(head_offset_) + ".." +
            std::to_string(head_offset_ + heads_ - 1) + " read key/value heads outside the local " +
            std::to_string(kv_offset_) + ".." + std::to_string(kv_offset_ + kv_ - 1));
    }
    expect_float_input(spec, 0, 2);
    const Shape& s = spec.inputs[0].shape;
    if (s.size() != 2 || s[1] % (heads_ + 2 * kv_) != 0)
      input_json(spec, 0).fail("a value [T, (n_head + 2 * n_kv_head) * D] with n_head = " +
                                   std::to_string(heads_) + ", n_kv_head = " + std::to_string(kv_),
                               type_str(spec.inputs[0]));
    t_ = s[0];
    d_ = s[1] / (heads_ + 2 * kv_);
    scale_ = spec.attrs.get_double("scale", 1.0 / std::sqrt(double(d_)), 0.0, 1e6);
    out_.push_back({{t_, heads_ * d_}, dtype_, true});
  }

  bool saves_input(size_t) const override { return true; }
  bool saves_output(size_t) const override { return true; }

  kernels::AttentionOptions options(const OpContext& ctx) const {
    kernels::AttentionOptions o;
    o.heads = heads_;
    o.kv_heads = kv_;
    o.group = group_;
    o.kv_offset = kv_offset_;
    o.scale = scale_;
    o.dropout = ctx.training ? dropout_ : 0.0;
    o.seed = step_seed(ctx.seed, ctx.mb.step);
    o.stream = kernels::stream_of(name_);
    o.batch_offset = ctx.mb.sample_offset;
    o.global_batch = ctx.mb.global_batch > 0 ? ctx.mb.global_batch : ctx.batch();
    o.head_offset = head_offset_;
    o.global_heads = global_heads_;
    return o;
  }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor lse = c.alloc({c.ctx.batch(), heads_, t_}, lse_dtype());
    kernels::attention_forward(c.inputs[0], options(c.ctx), y, lse);
    c.outputs[0] = y;
    c.saved.push_back(lse);
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    kernels::attention_backward(c.inputs[0], c.outputs[0], c.saved[0], c.grad_outputs[0],
                                options(c.ctx), t.tensor, t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    // The CPU kernel takes queries in blocks of 64 rows and, for a block ending at row
    // i1, scores it against keys [0, i1): sum over blocks of rows * i1 score entries, each
    // a dot product of length D, for Q K^T and again for P V. Backward recomputes the
    // scores and computes dV, dP, dQ and dK: five products of that size.
    constexpr int64_t kBlockQ = 64;
    double pairs = 0;
    for (int64_t i0 = 0; i0 < t_; i0 += kBlockQ) {
      int64_t i1 = std::min(t_, i0 + kBlockQ);
      pairs += double(i1 - i0) * double(i1);
    }
    double unit = 2.0 * pairs * double(d_) * double(batch * heads_);
    OpCost k;
    k.forward_flops = 2 * unit;
    k.backward_input_flops = 5 * unit;
    k.extra_saved_bytes = alloc_bytes(batch * heads_ * t_, lse_dtype());
    return k;
  }

 private:
  // The log-sum-exps in f32 beside 16-bit activations (CUDA only): the backward's
  // recomputed probabilities keep f32's accuracy, and cuDNN's fused forward, which
  // writes f32 statistics, applies.
  memory::DType lse_dtype() const {
    return memory::dtype_size(dtype_) == 2 ? memory::DType::f32 : dtype_;
  }

  int64_t heads_ = 1, global_heads_ = 1, head_offset_ = 0, t_ = 0, d_ = 0;
  int64_t kv_ = 1, group_ = 1, kv_offset_ = 0;
  double scale_ = 1, dropout_ = 0;
};

}  // namespace

void add_attention_ops(std::vector<OpType>& table) {
  table.push_back(
      {attention_schema(), [](const OpSpec& s) { return std::make_unique<Attention>(s); }});
}

}  // namespace baton::stages::ops
