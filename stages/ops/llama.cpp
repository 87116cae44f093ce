// The LLaMA family's ops: rmsnorm, silu, swiglu (silu(gate) * up, the gated MLP) and
// rotary (rotates queries and keys by their positions, Hugging Face's rotate-half
// convention, and packs q, k, v into the fused qkv that attention reads).
#include <cmath>

#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& rmsnorm_schema() {
  static const OpSchema s{"rmsnorm",
                          {"x"},
                          {"y"},
                          {{"weight", false}},
                          {"eps"},
                          "RMS normalisation over the last dimension with a scale: y = weight "
                          "* x / sqrt(mean(x^2) + eps), eps default 1e-6"};
  return s;
}

class RmsNorm final : public RowNormOp {
 public:
  explicit RmsNorm(const OpSpec& spec) : RowNormOp(rmsnorm_schema(), spec, 1e-6) {}

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor rstd = c.alloc({c.ctx.batch() * rows_}, dtype_);
    Tensor y2 = as_rows(y);
    kernels::rmsnorm_forward(as_rows(c.inputs[0]), c.params[0], eps_, y2, rstd);
    c.outputs[0] = y;
    c.saved.push_back(rstd);
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    Tensor dx = as_rows(t.tensor);
    kernels::rmsnorm_backward_input(as_rows(c.grad_outputs[0]), as_rows(c.inputs[0]), c.params[0],
                                    c.saved[0], dx, t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& gw = c.grad_params[0];
    kernels::rmsnorm_backward_weight(as_rows(c.grad_outputs[0]), as_rows(c.inputs[0]), c.saved[0],
                                     gw.tensor, gw.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    // Squares and their sum (2), normalise and scale (2) per element forward; backward
    // input about 5, weight 3.
    double e = double(batch * rows_ * c_);
    OpCost k;
    k.forward_flops = 4 * e;
    k.backward_input_flops = 5 * e;
    k.backward_weight_flops = 3 * e;
    k.extra_saved_bytes = alloc_bytes(batch * rows_, dtype_);
    return k;
  }
};

const OpSchema& silu_schema() {
  static const OpSchema s{"silu", {"x"}, {"y"}, {}, {}, "x * sigmoid(x)"};
  return s;
}

class Silu final : public ElementwiseOp {
 public:
  // Forward: exp, add, reciprocal, multiply.
  explicit Silu(const OpSpec& spec) : ElementwiseOp(silu_schema(), spec, 4, 7) {}
  bool saves_input(size_t) const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::silu_forward(c.inputs[0], y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    kernels::silu_backward(c.inputs[0], c.grad_outputs[0], t.tensor, t.accumulate);
  }
};

const OpSchema& swiglu_schema() {
  static const OpSchema s{
      "swiglu", {"gate", "up"}, {"y"}, {}, {}, "y = silu(gate) * up (LLaMA's gated MLP), fused"};
  return s;
}

class SwiGlu final : public ElementwiseOp {
 public:
  explicit SwiGlu(const OpSpec& spec) : ElementwiseOp(swiglu_schema(), spec, 5, 10) {}
  bool saves_input(size_t) const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::swiglu_forward(c.inputs[0], c.inputs[1], y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    Tensor dg, du;
    bool ag = false, au = false;
    if (c.grad_inputs[0].needed()) {
      auto t = c.grad_inputs[0].target();
      dg = t.tensor;
      ag = t.accumulate;
    }
    if (c.grad_inputs[1].needed()) {
      auto t = c.grad_inputs[1].target();
      du = t.tensor;
      au = t.accumulate;
    }
    if (!dg.defined() && !du.defined()) return;
    kernels::swiglu_backward(c.inputs[0], c.inputs[1], c.grad_outputs[0], dg, du, ag, au);
  }
};

const OpSchema& rotary_schema() {
  static const OpSchema s{
      "rotary",
      {"q", "k", "v"},
      {"qkv"},
      {},
      {"n_head", "n_kv_head", "rope_theta", "rope_scaling"},
      "rotary position embeddings (Hugging Face's rotate-half convention) on q [T, n_head * "
      "D] and k [T, n_kv_head * D], packed with v into qkv [T, (n_head + 2 n_kv_head) * D] "
      "for attention"};
  return s;
}

class Rotary final : public OpBase {
 public:
  explicit Rotary(const OpSpec& spec) : OpBase(rotary_schema(), spec) {
    heads_ = spec.attrs.at("n_head").as_int(1, 1 << 20);
    kv_ = spec.attrs.get_int("n_kv_head", heads_, 1, 1 << 20);
    const double theta = spec.attrs.get_double("rope_theta", 10000.0, 1e-6, 1e300);
    kernels::RopeScaling sc;
    if (auto r = spec.attrs.get("rope_scaling"); r && !r->raw().is_null())
      sc = parse_rope_scaling(*r);
    for (size_t i = 0; i < 3; ++i) expect_float_input(spec, i, 2);
    const Shape& q = spec.inputs[0].shape;
    if (q.size() != 2 || q[1] % heads_ != 0 || (q[1] / heads_) % 2 != 0)
      input_json(spec, 0).fail("a value [T, n_head * D] with n_head = " + std::to_string(heads_) +
                                   " and an even head size D",
                               type_str(spec.inputs[0]));
    t_ = q[0];
    d_ = q[1] / heads_;
    const Shape kv_shape{t_, kv_ * d_};
    for (size_t i = 1; i < 3; ++i)
      if (spec.inputs[i].shape != kv_shape)
        input_json(spec, i).fail("a value [T, n_kv_head * D] = " + memory::shape_str(kv_shape),
                                 type_str(spec.inputs[i]));
    inv_freq_ = kernels::rope_inv_freq(d_, theta, sc);
    out_.push_back({{t_, (heads_ + 2 * kv_) * d_}, dtype_, true});
  }

  // Hugging Face's rope_scaling object (types linear and llama3).
  static kernels::RopeScaling parse_rope_scaling(const JsonReader& r) {
    r.expect_object();
    kernels::RopeScaling sc;
    std::string type =
        r.has("rope_type") ? r.at("rope_type").as_string() : r.get_string("type", "default");
    if (type == "default") {
      r.expect_only({"rope_type", "type"});
      return sc;
    }
    if (type == "linear") {
      r.expect_only({"rope_type", "type", "factor"});
      sc.kind = kernels::RopeScaling::Kind::linear;
      sc.factor = r.at("factor").as_double(1e-6, 1e6);
      return sc;
    }
    if (type == "llama3") {
      r.expect_only({"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings"});
      sc.kind = kernels::RopeScaling::Kind::llama3;
      sc.factor = r.at("factor").as_double(1e-6, 1e6);
      sc.low_freq_factor = r.at("low_freq_factor").as_double(1e-6, 1e6);
      sc.high_freq_factor = r.at("high_freq_factor").as_double(1e-6, 1e6);
      if (sc.high_freq_factor <= sc.low_freq_factor)
        r.at("high_freq_factor")
            .fail("a value above low_freq_factor = " + std::to_string(sc.low_freq_factor));
      sc.original_max_position_embeddings =
          r.at("original_max_position_embeddings").as_double(1, 1e12);
      return sc;
    }
    (r.has("rope_type") ? r.at("rope_type") : r.at("type"))
        .fail("\"default\", \"linear\" or \"llama3\" (the rope scalings baton implements)",
              "\"" + type + "\"");
  }

  void forward(ForwardCall& c) const override {
    Tensor qkv = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::RotaryOptions o{heads_, &inv_freq_, 0};
    kernels::rotary_forward(c.inputs[0], o, qkv, 0);
    o.heads = kv_;
    kernels::rotary_forward(c.inputs[1], o, qkv, heads_ * d_);
    qkv.narrow(2, (heads_ + kv_) * d_, kv_ * d_).copy_from(c.inputs[2]);
    c.outputs[0] = qkv;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    const Tensor& g = c.grad_outputs[0];
    kernels::RotaryOptions o{heads_, &inv_freq_, 0};
    if (c.grad_inputs[0].needed()) {
      auto t = c.grad_inputs[0].target();
      kernels::rotary_backward(g, 0, o, t.tensor, t.accumulate);
    }
    o.heads = kv_;
    if (c.grad_inputs[1].needed()) {
      auto t = c.grad_inputs[1].target();
      kernels::rotary_backward(g, heads_ * d_, o, t.tensor, t.accumulate);
    }
    if (c.grad_inputs[2].needed())
      c.grad_inputs[2].give(g.narrow(2, (heads_ + kv_) * d_, kv_ * d_).contiguous());
  }

  OpCost cost(int64_t batch) const override {
    // 6 per rotated pair (4 products, 2 sums), i.e. 3 per q and k element; v is copied.
    OpCost k;
    k.forward_flops = 3.0 * double(batch * t_ * (heads_ + kv_) * d_);
    k.backward_input_flops = k.forward_flops;
    return k;
  }

 private:
  int64_t heads_ = 1, kv_ = 1, t_ = 0, d_ = 0;
  std::vector<double> inv_freq_;
};

}  // namespace

void add_llama_ops(std::vector<OpType>& table) {
  table.push_back({rmsnorm_schema(), [](const OpSpec& s) { return std::make_unique<RmsNorm>(s); }});
  table.push_back({silu_schema(), [](const OpSpec& s) { return std::make_unique<Silu>(s); }});
  table.push_back({swiglu_schema(), [](const OpSpec& s) { return std::make_unique<SwiGlu>(s); }});
  table.push_back({rotary_schema(), [](const OpSpec& s) { return std::make_unique<Rotary>(s); }});
}

}  // namespace baton::stages::ops
