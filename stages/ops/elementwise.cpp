// Element-wise ops: gelu (GPT-2's tanh form), relu, add (the residual), dropout
// (counter-based: the mask of a sample depends on its GLOBAL index, not on the
// micro-batch split) and reshape (a view per sample).
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& gelu_schema() {
  static const OpSchema s{"gelu", {"x"}, {"y"},
                          {},     {},    "GELU, tanh approximation (Hugging Face's gelu_new)"};
  return s;
}
const OpSchema& relu_schema() {
  static const OpSchema s{"relu", {"x"}, {"y"}, {}, {}, "max(x, 0)"};
  return s;
}

// gelu and relu: y = f(x), backward from x.
template <bool kGelu>
class Activation final : public ElementwiseOp {
 public:
  explicit Activation(const OpSpec& spec)
      : ElementwiseOp(kGelu ? gelu_schema() : relu_schema(), spec, kGelu ? 8 : 1, kGelu ? 12 : 1) {}
  bool saves_input(size_t) const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    if (kGelu)
      kernels::gelu_forward(c.inputs[0], y);
    else
      kernels::relu_forward(c.inputs[0], y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    if (kGelu)
      kernels::gelu_backward(c.inputs[0], c.grad_outputs[0], t.tensor, t.accumulate);
    else
      kernels::relu_backward(c.inputs[0], c.grad_outputs[0], t.tensor, t.accumulate);
  }
};

const OpSchema& add_schema() {
  static const OpSchema s{"add", {"a", "b"}, {"y"}, {}, {}, "y = a + b (same shapes)"};
  return s;
}

class Add final : public ElementwiseOp {
 public:
  explicit Add(const OpSpec& spec) : ElementwiseOp(add_schema(), spec, 1, 0) {}

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::add(c.inputs[0], c.inputs[1], y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    // Both inputs receive dy itself; GradSlot copies only if one must then add into it.
    for (size_t i = 0; i < 2; ++i)
      if (c.grad_inputs[i].needed()) c.grad_inputs[i].give(c.grad_outputs[0]);
  }
};

const OpSchema& dropout_schema() {
  static const OpSchema s{"dropout",
                          {"x"},
                          {"y"},
                          {},
                          {"p"},
                          "inverted dropout with probability p while training; the mask of "
                          "an element depends on (seed, step, node name, its global index)"};
  return s;
}

class Dropout final : public OpBase {
 public:
  explicit Dropout(const OpSpec& spec) : OpBase(dropout_schema(), spec) {
    p_ = spec.attrs.get_double("p", 0.0, 0.0, 0.999);
    expect_float_input(spec, 0, 0);
    out_.push_back(spec.inputs[0]);
    shape_ = spec.inputs[0].shape;
  }

  kernels::Block where(const OpContext& ctx) const {
    kernels::Block b;
    b.global_shape.push_back(ctx.mb.global_batch > 0 ? ctx.mb.global_batch : ctx.batch());
    b.global_shape.insert(b.global_shape.end(), shape_.begin(), shape_.end());
    b.offsets.assign(b.global_shape.size(), 0);
    b.offsets[0] = ctx.mb.sample_offset;
    return b;
  }
  bool active(const OpContext& ctx) const { return ctx.training && p_ > 0; }
  int output_alias(size_t) const override { return p_ > 0 ? -1 : 0; }

  void forward(ForwardCall& c) const override {
    if (!active(c.ctx)) {
      c.outputs[0] = c.inputs[0];  // identity: no copy
      return;
    }
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::dropout_forward(c.inputs[0], y, p_, step_seed(c.ctx.seed, c.ctx.mb.step),
                             kernels::stream_of(name_), where(c.ctx));
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    if (!active(c.ctx)) {
      c.grad_inputs[0].give(c.grad_outputs[0]);
      return;
    }
    auto t = c.grad_inputs[0].target();
    kernels::dropout_backward(c.grad_outputs[0], t.tensor, p_, step_seed(c.ctx.seed, c.ctx.mb.step),
                              kernels::stream_of(name_), where(c.ctx), t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    if (p_ > 0) {
      k.forward_flops = 2.0 * double(batch * numel_of(shape_));
      k.backward_input_flops = k.forward_flops;
    }
    return k;
  }

 private:
  double p_ = 0;
  Shape shape_;
};

const OpSchema& reshape_schema() {
  static const OpSchema s{
      "reshape", {"x"},     {"y"},
      {},        {"shape"}, "a view with another per-sample shape (one dimension may be -1)"};
  return s;
}

class Reshape final : public OpBase {
 public:
  explicit Reshape(const OpSpec& spec) : OpBase(reshape_schema(), spec) {
    JsonReader js = spec.attrs.at("shape");
    Shape s = js.as_int_list();
    int64_t infer = -1;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == -1 && infer < 0)
        infer = int64_t(i);
      else if (s[i] <= 0)
        js.fail("positive dimensions and at most one -1");
    }
    const ValueType& in = spec.inputs[0];
    if (!in.batched) input_json(spec, 0).fail("a batched value", type_str(in));
    const int64_t n = numel_of(in.shape);
    const std::string want =
        "a shape of " + std::to_string(n) + " elements (the input is " + type_str(in) + ")";
    int64_t known = 1;  // never beyond n, so the product cannot overflow
    for (size_t i = 0; i < s.size(); ++i) {
      if (int64_t(i) == infer) continue;
      if (s[i] > n / known) js.fail(want, memory::shape_str(s));
      known *= s[i];
    }
    if (infer >= 0) {
      if (n % known != 0) js.fail("a shape of " + std::to_string(n) + " elements");
      s[size_t(infer)] = n / known;
    }
    if (numel_of(s) != n) js.fail(want, memory::shape_str(s));
    out_.push_back({s, in.dtype, true});
    in_shape_ = in.shape;
  }

  int output_alias(size_t) const override { return 0; }

  void forward(ForwardCall& c) const override {
    c.outputs[0] = c.inputs[0].view(batched(c.ctx, out_[0].shape));
  }
  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    c.grad_inputs[0].give(c.grad_outputs[0].view(batched(c.ctx, in_shape_)));
  }
  OpCost cost(int64_t) const override { return {}; }

 private:
  Shape in_shape_;
};

}  // namespace

void add_elementwise_ops(std::vector<OpType>& table) {
  table.push_back(
      {gelu_schema(), [](const OpSpec& s) { return std::make_unique<Activation<true>>(s); }});
  table.push_back(
      {relu_schema(), [](const OpSpec& s) { return std::make_unique<Activation<false>>(s); }});
  table.push_back({add_schema(), [](const OpSpec& s) { return std::make_unique<Add>(s); }});
  table.push_back({dropout_schema(), [](const OpSpec& s) { return std::make_unique<Dropout>(s); }});
  table.push_back({reshape_schema(), [](const OpSpec& s) { return std::make_unique<Reshape>(s); }});
}

}  // namespace baton::stages::ops
