// Fused ops (kernels/fused.h): add_layernorm (a residual add and the LayerNorm that reads
// its sum, as in a GPT block's add_1 and ln_2) and bias_gelu (a linear's bias and the GELU
// after it, the linear then bias-free). partitioner/fusion.h rewrites a graph's matching pairs
// into them (docs/kernels.md, "Fused kernels in the model graph"); a model file may name them
// too, with both outputs, and other nodes may read either. The fused kernels run on the CPU and
// on CUDA alike.
#include "kernels/fused.h"

#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& add_layernorm_schema() {
  static const OpSchema s{"add_layernorm",
                          {"a", "b"},
                          {"s", "y"},
                          {{"weight", false}, {"bias", false}},
                          {"eps"},
                          "s = a + b and y = layernorm(s) in one pass (a residual add and the "
                          "LayerNorm reading it, fused); eps (default 1e-5)"};
  return s;
}

// Keeps s itself (with the row statistics) in its saved tensors rather than as a saved
// output: W needs s too, and an op's W reads inputs and saved tensors only.
class AddLayerNorm final : public OpBase {
 public:
  explicit AddLayerNorm(const OpSpec& spec) : OpBase(add_layernorm_schema(), spec) {
    expect_float_input(spec, 0);
    expect_type_of_first_input(spec, 1, "a");
    c_ = spec.inputs[0].shape.back();
    rows_ = rows_per_sample(spec.inputs[0].shape);
    for (size_t k = 0; k < 2; ++k) expect_param_shape(spec, schema_, k, {c_});
    eps_ = spec.attrs.get_double("eps", 1e-5, 0.0, 1.0);
    out_ = {spec.inputs[0], spec.inputs[0]};
  }

  bool weight_needs_grad_outputs() const override { return true; }
  bool weight_needs_saved() const override { return true; }

  void forward(ForwardCall& c) const override {
    const Shape shape = batched(c.ctx, out_[0].shape);
    Tensor s = c.alloc(shape, dtype_), y = c.alloc(shape, dtype_);
    const int64_t n = c.ctx.batch() * rows_;
    Tensor mean = c.alloc({n}, dtype_), rstd = c.alloc({n}, dtype_);
    Tensor s2 = as_rows(s), y2 = as_rows(y);
    kernels::add_layernorm_forward(as_rows(c.inputs[0]), as_rows(c.inputs[1]), c.params[0],
                                   c.params[1], eps_, s2, y2, mean, rstd);
    c.outputs[0] = s;
    c.outputs[1] = y;
    c.saved.push_back(s);
    c.saved.push_back(mean);
    c.saved.push_back(rstd);
  }

  void backward_input(BackwardCall& c) const override {
    const Tensor& ds = c.grad_outputs[0];
    const Tensor& dy = c.grad_outputs[1];
    const bool need = c.grad_inputs[0].needed() || c.grad_inputs[1].needed();
    if (!need || (!ds.defined() && !dy.defined())) return;
    Tensor dx;
    if (!dy.defined()) {
      dx = ds;  // nothing reached y: s's gradient passes through the add
    } else {
      dx = c.alloc(ds.defined() ? ds.shape() : dy.shape(), dtype_);
      Tensor dx2 = as_rows(dx);
      const Tensor& s = c.saved[0];
      kernels::add_layernorm_backward_input(as_rows(dy), ds.defined() ? as_rows(ds) : Tensor(),
                                            as_rows(s), c.params[0], c.saved[1], c.saved[2], dx2,
                                            false);
    }
    // Both inputs of the add receive dx itself (GradSlot copies only to add into it).
    for (size_t i = 0; i < 2; ++i)
      if (c.grad_inputs[i].needed()) c.grad_inputs[i].give(dx);
  }

  void backward_weight(WeightCall& c) const override {
    const Tensor& dy = c.grad_outputs[1];
    if (!dy.defined()) return;
    layernorm_weight_grads(as_rows(dy), as_rows(c.saved[0]), c.saved[1], c.saved[2],
                           c.grad_params[0], c.grad_params[1]);
  }

  OpCost cost(int64_t batch) const override {
    // The add's element (1) and layernorm's 7 forward; layernorm's backward plus the add
    // of s's other gradient.
    const double e = double(batch * rows_ * c_);
    OpCost k;
    k.forward_flops = 8 * e;
    k.backward_input_flops = 10 * e;
    k.backward_weight_flops = 4 * e;
    k.extra_saved_bytes =
        alloc_bytes(batch * rows_ * c_, dtype_) + 2 * alloc_bytes(batch * rows_, dtype_);
    return k;
  }

 private:
  double eps_ = 1e-5;
  int64_t c_ = 0, rows_ = 0;
};

const OpSchema& bias_gelu_schema() {
  static const OpSchema s{"bias_gelu",
                          {"x"},
                          {"y", "h"},
                          {{"bias", false}},
                          {},
                          "h = x + bias, y = gelu(h) over the last dimension in one pass (a "
                          "linear's bias and the GELU after it, fused; GPT-2's tanh GELU)"};
  return s;
}

// h (in x's memory when nothing else reads x) is an output kept for B, as the unfused
// GELU keeps its input; B, which computes dh = gelu'(h) dy anyway, also sums it over rows
// into a [C] buffer W adds to the bias gradient, so nothing larger waits for W.
class BiasGelu final : public OpBase {
 public:
  explicit BiasGelu(const OpSpec& spec) : OpBase(bias_gelu_schema(), spec) {
    expect_float_input(spec, 0);
    c_ = spec.inputs[0].shape.back();
    expect_param_shape(spec, schema_, 0, {c_});
    out_ = {spec.inputs[0], spec.inputs[0]};
    elems_ = numel_of(spec.inputs[0].shape);
  }

  bool saves_output(size_t j) const override { return j == 1; }
  bool weight_needs_saved() const override { return true; }
  int output_alias(size_t j) const override { return j == 1 ? 0 : -1; }

  void forward(ForwardCall& c) const override {
    const bool in_place = c.may_overwrite(0);
    Tensor h = in_place ? c.inputs[0] : c.alloc(c.inputs[0].shape(), dtype_);
    Tensor y = c.alloc(c.inputs[0].shape(), dtype_);
    Tensor h2 = as_rows(h), y2 = as_rows(y);
    kernels::bias_gelu_forward(as_rows(c.inputs[0]), c.params[0], h2, y2);
    c.outputs[0] = y;
    c.outputs[1] = h;
    if (c.ctx.training) c.saved.push_back(c.alloc({c_}, dtype_));  // the bias gradient, from B
  }

  void backward_input(BackwardCall& c) const override {
    Tensor dbias = c.saved[0];
    const Tensor& dy = c.grad_outputs[0];
    const Tensor& dh_read = c.grad_outputs[1];  // h's own gradient, where a node reads h
    if (!dy.defined() && !dh_read.defined()) {
      dbias.zero_();
      return;
    }
    // dh = gelu'(h) dy + dh_read into x's gradient (the fusion's x has no other reader: the
    // slot starts empty), then summed over rows for the bias.
    auto t =
        c.grad_inputs[0].needed() ? c.grad_inputs[0].target() : GradSlot::Target{Tensor(), false};
    Tensor dh =
        t.tensor.defined() && !t.accumulate ? t.tensor : c.alloc(c.outputs[1].shape(), dtype_);
    Tensor dh2 = as_rows(dh);
    if (dh_read.defined()) dh.copy_from(dh_read);
    if (dy.defined())
      kernels::gelu_backward(as_rows(c.outputs[1]), as_rows(dy), dh2, dh_read.defined());
    kernels::bias_backward(dh2, dbias, false);
    if (t.tensor.defined() && t.accumulate) kernels::add_inplace(t.tensor, dh);
  }

  void backward_weight(WeightCall& c) const override {
    ParamGrad& g = c.grad_params[0];
    if (g.accumulate)
      kernels::add_inplace(g.tensor, c.saved[0]);
    else
      g.tensor.copy_from(c.saved[0]);
  }

  OpCost cost(int64_t batch) const override {
    const double e = double(batch * elems_);
    OpCost k;
    k.forward_flops = 9 * e;          // the bias (1) and the tanh GELU's arithmetic (about 8)
    k.backward_input_flops = 13 * e;  // gelu' (12) and the bias gradient's row sum
    k.backward_weight_flops = double(c_);
    k.extra_saved_bytes = alloc_bytes(c_, dtype_);
    return k;
  }

 private:
  int64_t c_ = 0, elems_ = 0;
};

}  // namespace

void add_fused_ops(std::vector<OpType>& table) {
  table.push_back(
      {add_layernorm_schema(), [](const OpSpec& s) { return std::make_unique<AddLayerNorm>(s); }});
  table.push_back(
      {bias_gelu_schema(), [](const OpSpec& s) { return std::make_unique<BiasGelu>(s); }});
}

}  // namespace baton::stages::ops
