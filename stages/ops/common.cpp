#include "stages/ops/common.h"

namespace baton::stages::ops {

JsonReader input_json(const OpSpec& spec, size_t i) {
  if (spec.node.has("inputs") && spec.node.at("inputs").is_array() &&
      i < spec.node.at("inputs").size())
    return spec.node.at("inputs").at(i);
  return spec.node;
}

JsonReader param_json(const OpSpec& spec, const std::string& slot) {
  if (spec.node.has("params") && spec.node.at("params").is_object() &&
      spec.node.at("params").has(slot))
    return spec.node.at("params").at(slot);
  return spec.node;
}

void layernorm_weight_grads(const Tensor& dy, const Tensor& x, const Tensor& mean,
                            const Tensor& rstd, ParamGrad& gw, ParamGrad& gb) {
  const bool both = gw.tensor.defined() && gb.tensor.defined();
  if (both && gw.accumulate == gb.accumulate && gw.tensor.raw_data() != gb.tensor.raw_data()) {
    kernels::layernorm_backward_weight(dy, x, mean, rstd, gw.tensor, gb.tensor, gw.accumulate);
    return;
  }
  // Apart, in slot order: with one parameter in both, the bias's part adds to the weight's.
  Tensor none;
  if (gw.tensor.defined())
    kernels::layernorm_backward_weight(dy, x, mean, rstd, gw.tensor, none, gw.accumulate);
  if (gb.tensor.defined())
    kernels::layernorm_backward_weight(dy, x, mean, rstd, none, gb.tensor, gb.accumulate);
}

void expect_float_input(const OpSpec& spec, size_t i, size_t min_rank) {
  const ValueType& t = spec.inputs[i];
  if (!t.batched || t.dtype != spec.float_dtype || t.shape.size() < min_rank) {
    std::string expected = "a batched " + std::string(memory::dtype_name(spec.float_dtype)) +
                           " value with at least " + std::to_string(min_rank) +
                           " dimension(s) per sample";
    input_json(spec, i).fail(expected, type_str(t));
  }
}

void expect_type_of_first_input(const OpSpec& spec, size_t i, const std::string& first) {
  if (spec.inputs[i] != spec.inputs[0])
    input_json(spec, i).fail("a value of " + first + "'s type " + type_str(spec.inputs[0]),
                             type_str(spec.inputs[i]));
}

void expect_int_input(const OpSpec& spec, size_t i) {
  const ValueType& t = spec.inputs[i];
  if (!t.batched || (t.dtype != DType::i32 && t.dtype != DType::i64))
    input_json(spec, i).fail("a batched i32 or i64 value (token ids)", type_str(t));
}

void expect_param_shape(const OpSpec& spec, const OpSchema& schema, size_t k,
                        const Shape& expected) {
  const auto& got = spec.params[k];
  if (!got || *got == expected) return;
  param_json(spec, schema.params[k].name)
      .fail("a parameter of shape " + memory::shape_str(expected),
            "one of shape " + memory::shape_str(*got));
}

Tensor as_rows(const Tensor& t) {
  int64_t c = t.dim() == 0 ? 1 : t.size(-1);
  return t.view({c == 0 ? 0 : t.numel() / c, c});
}

int64_t numel_of(const Shape& s) {
  return memory::shape_numel(s);
}

RowNormOp::RowNormOp(const OpSchema& schema, const OpSpec& spec, double default_eps)
    : OpBase(schema, spec), eps_(spec.attrs.get_double("eps", default_eps, 0.0, 1.0)) {
  expect_float_input(spec, 0);
  c_ = spec.inputs[0].shape.back();
  rows_ = rows_per_sample(spec.inputs[0].shape);
  for (size_t k = 0; k < schema_.params.size(); ++k) expect_param_shape(spec, schema_, k, {c_});
  out_.push_back(spec.inputs[0]);
}

ElementwiseOp::ElementwiseOp(const OpSchema& schema, const OpSpec& spec, double forward_flops,
                             double backward_input_flops)
    : OpBase(schema, spec),
      forward_flops_(forward_flops),
      backward_input_flops_(backward_input_flops) {
  expect_float_input(spec, 0, 0);
  for (size_t i = 1; i < schema_.inputs.size(); ++i)
    expect_type_of_first_input(spec, i, schema_.inputs[0]);
  out_.push_back(spec.inputs[0]);
  elems_ = numel_of(spec.inputs[0].shape);
}

OpCost ElementwiseOp::cost(int64_t batch) const {
  double e = double(batch * elems_);
  OpCost k;
  k.forward_flops = forward_flops_ * e;
  k.backward_input_flops = backward_input_flops_ * e;
  return k;
}

void AddParamOp::backward_input(BackwardCall& c) const {
  if (c.grad_inputs[0].needed() && c.grad_outputs[0].defined())
    c.grad_inputs[0].give(c.grad_outputs[0]);
}

OpCost AddParamOp::cost(int64_t batch) const {
  OpCost k;
  k.forward_flops = double(batch * elems_);
  k.backward_weight_flops = k.forward_flops;
  return k;
}

int64_t rows_per_sample(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}

Shape batched(const OpContext& ctx, const Shape& per_sample) {
  Shape s{ctx.batch()};
  s.insert(s.end(), per_sample.begin(), per_sample.end());
  return s;
}

int64_t dsize(DType t) {
  return int64_t(memory::dtype_size(t));
}

int64_t alloc_bytes(int64_t elems, DType t) {
  return int64_t(memory::Allocator::rounded(size_t(elems) * memory::dtype_size(t)));
}

}  // namespace baton::stages::ops
