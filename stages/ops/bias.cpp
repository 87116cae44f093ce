// bias_add: y = x + bias over the last dimension (or over the per-sample dimension `dim`:
// 0 for the channels of an image). The partitioner puts it after the all-reduce of a
// row-split linear or convolution, so the bias is added once to the reduced sum (as
// Megatron-LM's RowParallelLinear does) and its gradient is the same on every rank.
#include "kernels/vision.h"
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& bias_add_schema() {
  static const OpSchema s{"bias_add",
                          {"x"},
                          {"y"},
                          {{"bias", false}},
                          {"dim"},
                          "y = x + bias over the last dimension, or over the per-sample "
                          "dimension dim (the bias of a row-split linear or convolution, added "
                          "once after the tensor-parallel reduction)"};
  return s;
}

class BiasAdd final : public AddParamOp {
 public:
  explicit BiasAdd(const OpSpec& spec) : AddParamOp(bias_add_schema(), spec) {
    expect_float_input(spec, 0);
    const Shape& x = spec.inputs[0].shape;
    if (x.empty())
      input_json(spec, 0).fail("a value with at least one dimension", type_str(spec.inputs[0]));
    const int64_t d = spec.attrs.get_int("dim", int64_t(x.size()) - 1, 0, int64_t(x.size()) - 1);
    c_ = x[size_t(d)];
    for (size_t i = size_t(d) + 1; i < x.size(); ++i) inner_ *= x[i];
    expect_param_shape(spec, schema_, 0, {c_});
    out_.push_back(spec.inputs[0]);
    elems_ = numel_of(spec.inputs[0].shape);
  }

  void forward(ForwardCall& c) const override {
    Tensor y = c.may_overwrite(0) ? c.inputs[0] : c.inputs[0].clone();
    if (inner_ == 1) {
      Tensor rows = as_rows(y);
      kernels::bias_add_inplace(rows, c.params[0]);
    } else {
      // Per channel of [n, c, inner]: the bias times `inner` on a [n, c] plane, spread
      // over each channel's elements by global_avgpool's backward (which divides by it).
      const int64_t n = y.numel() / (c_ * inner_);
      Tensor plane = Tensor::zeros({n, c_}, dtype_, c.ctx.device);
      kernels::bias_add_inplace(plane, c.params[0]);
      kernels::scale_inplace(plane, double(inner_));
      Tensor y4 = y.view({n, c_, inner_, 1});
      kernels::global_avgpool_backward(plane, y4, true);
    }
    c.outputs[0] = y;
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& g = c.grad_params[0];
    if (inner_ == 1) {
      kernels::bias_backward(as_rows(c.grad_outputs[0]), g.tensor, g.accumulate);
      return;
    }
    // The sum of dy over each channel's elements (the mean times their count), then over n.
    const int64_t n = c.grad_outputs[0].numel() / (c_ * inner_);
    Tensor sums = Tensor::empty({n, c_}, dtype_, c.ctx.device);
    kernels::global_avgpool_forward(c.grad_outputs[0].view({n, c_, inner_, 1}), sums);
    kernels::scale_inplace(sums, double(inner_));
    kernels::bias_backward(sums, g.tensor, g.accumulate);
  }

 private:
  int64_t c_ = 0, inner_ = 1;
};

}  // namespace

void add_bias_ops(std::vector<OpType>& table) {
  table.push_back(
      {bias_add_schema(), [](const OpSpec& s) { return std::make_unique<BiasAdd>(s); }});
}

}  // namespace baton::stages::ops
