// linear (y = x W + b, torch [out, in] or GPT-2 Conv1D [in, out] layout) and matmul (the
// product of two activations).
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& linear_schema() {
  static const OpSchema s{"linear",
                          {"x"},
                          {"y"},
                          {{"weight", false}, {"bias", true}},
                          {"layout"},
                          "y = x W + b over the last dimension; layout out_in (torch, W "
                          "[out, in], the default) or in_out (GPT-2 Conv1D, W [in, out])"};
  return s;
}

class Linear final : public OpBase {
 public:
  explicit Linear(const OpSpec& spec) : OpBase(linear_schema(), spec) {
    std::string layout = spec.attrs.get_string("layout", "out_in");
    if (layout == "out_in")
      layout_ = kernels::WeightLayout::out_in;
    else if (layout == "in_out")
      layout_ = kernels::WeightLayout::in_out;
    else
      spec.attrs.at("layout").fail("\"out_in\" or \"in_out\"");
    expect_float_input(spec, 0);
    const Shape& x = spec.inputs[0].shape;
    in_ = x.back();
    const Shape& w = *spec.params[0];
    if (w.size() != 2)
      param_json(spec, "weight").fail("a 2-D weight", "one of shape " + memory::shape_str(w));
    out_features_ = layout_ == kernels::WeightLayout::out_in ? w[0] : w[1];
    int64_t w_in = layout_ == kernels::WeightLayout::out_in ? w[1] : w[0];
    if (w_in != in_)
      input_json(spec, 0).fail("a value whose last dimension is the weight's input size " +
                                   std::to_string(w_in) + " (layout " + layout + ")",
                               type_str(spec.inputs[0]));
    has_bias_ = spec.params[1].has_value();
    expect_param_shape(spec, schema_, 1, {out_features_});
    rows_ = rows_per_sample(x);
    Shape y = x;
    y.back() = out_features_;
    out_.push_back({y, dtype_, true});
  }

  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor y2 = as_rows(y);
    kernels::linear_forward(as_rows(c.inputs[0]), c.params[0], c.params[1], layout_, y2);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    Tensor dx = as_rows(t.tensor);
    kernels::linear_backward_input(as_rows(c.grad_outputs[0]), c.params[0], layout_, dx,
                                   t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    Tensor dy = as_rows(c.grad_outputs[0]);
    Tensor x = as_rows(c.inputs[0]);
    ParamGrad& gw = c.grad_params[0];
    ParamGrad& gb = c.grad_params[1];
    if (gw.tensor.defined() && gb.tensor.defined() && gw.accumulate == gb.accumulate) {
      kernels::linear_backward_weight(dy, x, layout_, gw.tensor, gb.tensor, gw.accumulate);
      return;
    }
    Tensor none;
    if (gw.tensor.defined())
      kernels::linear_backward_weight(dy, x, layout_, gw.tensor, none, gw.accumulate);
    if (gb.tensor.defined()) kernels::bias_backward(dy, gb.tensor, gb.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    double n = double(batch * rows_);
    double mm = 2.0 * n * double(in_) * double(out_features_);
    OpCost c;
    c.forward_flops = mm + (has_bias_ ? n * double(out_features_) : 0);
    c.backward_input_flops = mm;
    c.backward_weight_flops = mm + (has_bias_ ? n * double(out_features_) : 0);
    return c;
  }

 private:
  kernels::WeightLayout layout_ = kernels::WeightLayout::out_in;
  int64_t in_ = 0, out_features_ = 0, rows_ = 0;
  bool has_bias_ = false;
};

const OpSchema& matmul_schema() {
  static const OpSchema s{"matmul",
                          {"a", "b"},
                          {"y"},
                          {},
                          {"trans_a", "trans_b"},
                          "y = op(a) op(b) of two activations over their last two "
                          "dimensions (leading dimensions are batch dimensions)"};
  return s;
}

class Matmul final : public OpBase {
 public:
  explicit Matmul(const OpSpec& spec) : OpBase(matmul_schema(), spec) {
    ta_ = spec.attrs.get_bool("trans_a", false);
    tb_ = spec.attrs.get_bool("trans_b", false);
    expect_float_input(spec, 0, 2);
    expect_float_input(spec, 1, 2);
    const Shape& a = spec.inputs[0].shape;
    const Shape& b = spec.inputs[1].shape;
    if (a.size() != b.size() || !std::equal(a.begin(), a.end() - 2, b.begin()))
      input_json(spec, 1).fail(
          "a value with a's leading dimensions " + memory::shape_str(Shape(a.begin(), a.end() - 2)),
          type_str(spec.inputs[1]));
    m_ = ta_ ? a[a.size() - 1] : a[a.size() - 2];
    k_ = ta_ ? a[a.size() - 2] : a[a.size() - 1];
    int64_t kb = tb_ ? b[b.size() - 1] : b[b.size() - 2];
    n_ = tb_ ? b[b.size() - 2] : b[b.size() - 1];
    if (kb != k_)
      input_json(spec, 1).fail("an inner dimension of " + std::to_string(k_),
                               type_str(spec.inputs[1]));
    lead_ = 1;
    for (size_t i = 0; i + 2 < a.size(); ++i) lead_ *= a[i];
    Shape y(a.begin(), a.end() - 2);
    y.push_back(m_);
    y.push_back(n_);
    out_.push_back({y, dtype_, true});
    a_shape_ = a;
    b_shape_ = b;
  }

  bool saves_input(size_t) const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor y3 = y.view({-1, m_, n_});
    kernels::matmul(c.inputs[0].view({-1, a_shape_[a_shape_.size() - 2], a_shape_.back()}), ta_,
                    c.inputs[1].view({-1, b_shape_[b_shape_.size() - 2], b_shape_.back()}), tb_,
                    y3);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    Tensor dy = c.grad_outputs[0].view({-1, m_, n_});
    Tensor a = c.inputs[0].view({-1, a_shape_[a_shape_.size() - 2], a_shape_.back()});
    Tensor b = c.inputs[1].view({-1, b_shape_[b_shape_.size() - 2], b_shape_.back()});
    if (c.grad_inputs[0].needed()) {
      auto t = c.grad_inputs[0].target();
      Tensor da = t.tensor.view(a.shape());
      double beta = t.accumulate ? 1.0 : 0.0;
      // a = op(a): da = dy op(b)^T, or its transpose when a was transposed.
      if (!ta_)
        kernels::matmul(dy, false, b, !tb_, da, 1.0, beta);
      else
        kernels::matmul(b, tb_, dy, true, da, 1.0, beta);
    }
    if (c.grad_inputs[1].needed()) {
      auto t = c.grad_inputs[1].target();
      Tensor db = t.tensor.view(b.shape());
      double beta = t.accumulate ? 1.0 : 0.0;
      if (!tb_)
        kernels::matmul(a, !ta_, dy, false, db, 1.0, beta);
      else
        kernels::matmul(dy, true, a, ta_, db, 1.0, beta);
    }
  }

  OpCost cost(int64_t batch) const override {
    double mm = 2.0 * double(batch * lead_) * double(m_) * double(n_) * double(k_);
    OpCost c;
    c.forward_flops = mm;
    c.backward_input_flops = 2 * mm;
    return c;
  }

 private:
  bool ta_ = false, tb_ = false;
  int64_t m_ = 0, n_ = 0, k_ = 0, lead_ = 1;
  Shape a_shape_, b_shape_;
};

}  // namespace

void add_linear_ops(std::vector<OpType>& table) {
  table.push_back({linear_schema(), [](const OpSpec& s) { return std::make_unique<Linear>(s); }});
  table.push_back({matmul_schema(), [](const OpSpec& s) { return std::make_unique<Matmul>(s); }});
}

}  // namespace baton::stages::ops
