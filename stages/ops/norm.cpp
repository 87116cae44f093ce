// layernorm over the last dimension and softmax over the last dimension.
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& layernorm_schema() {
  static const OpSchema s{"layernorm",
                          {"x"},
                          {"y"},
                          {{"weight", false}, {"bias", false}},
                          {"eps"},
                          "layer normalisation over the last dimension with a scale and a "
                          "shift; eps (default 1e-5) is added to the variance"};
  return s;
}

class LayerNorm final : public RowNormOp {
 public:
  explicit LayerNorm(const OpSpec& spec) : RowNormOp(layernorm_schema(), spec, 1e-5) {}

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    int64_t n = c.ctx.batch() * rows_;
    Tensor mean = c.alloc({n}, dtype_), rstd = c.alloc({n}, dtype_);
    Tensor y2 = as_rows(y);
    kernels::layernorm_forward(as_rows(c.inputs[0]), c.params[0], c.params[1], eps_, y2, mean,
                               rstd);
    c.outputs[0] = y;
    c.saved.push_back(mean);
    c.saved.push_back(rstd);
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    Tensor dx = as_rows(t.tensor);
    kernels::layernorm_backward_input(as_rows(c.grad_outputs[0]), as_rows(c.inputs[0]), c.params[0],
                                      c.saved[0], c.saved[1], dx, t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    layernorm_weight_grads(as_rows(c.grad_outputs[0]), as_rows(c.inputs[0]), c.saved[0], c.saved[1],
                           c.grad_params[0], c.grad_params[1]);
  }

  OpCost cost(int64_t batch) const override {
    // Counted as the reference formula's arithmetic: mean (1), variance (2), normalise
    // (2), scale and shift (2) per element forward; about twice that backward.
    double e = double(batch * rows_ * c_);
    OpCost k;
    k.forward_flops = 7 * e;
    k.backward_input_flops = 9 * e;
    k.backward_weight_flops = 4 * e;
    k.extra_saved_bytes = 2 * alloc_bytes(batch * rows_, dtype_);
    return k;
  }
};

const OpSchema& softmax_schema() {
  static const OpSchema s{"softmax", {"x"}, {"y"}, {}, {}, "softmax over the last dimension"};
  return s;
}

class Softmax final : public OpBase {
 public:
  explicit Softmax(const OpSpec& spec) : OpBase(softmax_schema(), spec) {
    expect_float_input(spec, 0);
    out_.push_back(spec.inputs[0]);
    elems_ = numel_of(spec.inputs[0].shape);
  }
  bool saves_output(size_t) const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor y2 = as_rows(y);
    kernels::softmax_forward(as_rows(c.inputs[0]), y2);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    Tensor dx = as_rows(t.tensor);
    kernels::softmax_backward(as_rows(c.outputs[0]), as_rows(c.grad_outputs[0]), dx, t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    double e = double(batch * elems_);
    OpCost k;
    k.forward_flops = 4 * e;  // max, subtract, exp, divide
    k.backward_input_flops = 4 * e;
    return k;
  }

 private:
  int64_t elems_ = 0;
};

}  // namespace

void add_norm_ops(std::vector<OpType>& table) {
  table.push_back(
      {layernorm_schema(), [](const OpSpec& s) { return std::make_unique<LayerNorm>(s); }});
  table.push_back({softmax_schema(), [](const OpSpec& s) { return std::make_unique<Softmax>(s); }});
}

}  // namespace baton::stages::ops
