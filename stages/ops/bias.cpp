// bias_add: y = x + bias over the last dimension. The partitioner puts it after the
// all-reduce of a row-split linear, so the bias is added once to the reduced sum (as
// Megatron-LM's RowParallelLinear does) and its gradient is the same on every rank.
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& bias_add_schema() {
  static const OpSchema s{"bias_add",
                          {"x"},
                          {"y"},
                          {{"bias", false}},
                          {},
                          "y = x + bias over the last dimension (the bias of a row-split "
                          "linear, added once after the tensor-parallel reduction)"};
  return s;
}

class BiasAdd final : public OpBase {
 public:
  explicit BiasAdd(const OpSpec& spec) : OpBase(bias_add_schema(), spec) {
    expect_float_input(spec, 0);
    c_ = spec.inputs[0].shape.back();
    expect_param_shape(spec, schema_, 0, {c_});
    out_.push_back(spec.inputs[0]);
    elems_ = numel_of(spec.inputs[0].shape);
  }

  bool weight_needs_grad_outputs() const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.may_overwrite(0) ? c.inputs[0] : c.inputs[0].clone();
    Tensor rows = as_rows(y);
    kernels::bias_add_inplace(rows, c.params[0]);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (c.grad_inputs[0].needed() && c.grad_outputs[0].defined())
      c.grad_inputs[0].give(c.grad_outputs[0]);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& g = c.grad_params[0];
    kernels::bias_backward(as_rows(c.grad_outputs[0]), g.tensor, g.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    k.forward_flops = double(batch * elems_);
    k.backward_weight_flops = k.forward_flops;
    return k;
  }

 private:
  int64_t c_ = 0, elems_ = 0;
};

}  // namespace

void add_bias_ops(std::vector<OpType>& table) {
  table.push_back(
      {bias_add_schema(), [](const OpSpec& s) { return std::make_unique<BiasAdd>(s); }});
}

}  // namespace baton::stages::ops
