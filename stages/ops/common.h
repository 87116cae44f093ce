// Helpers shared by the op implementations in stages/ops/ (private to stages/).
#pragma once

#include <string>

#include "stages/op.h"

namespace baton::stages::ops {

// A base that stores the schema, the inferred output types and the float dtype.
class OpBase : public Op {
 public:
  OpBase(const OpSchema& schema, const OpSpec& spec)
      : schema_(schema), dtype_(spec.float_dtype), name_(spec.node_name) {}
  const OpSchema& schema() const override { return schema_; }
  const std::vector<ValueType>& output_types() const override { return out_; }

 protected:
  const OpSchema& schema_;
  DType dtype_;
  std::string name_;
  std::vector<ValueType> out_;
};

// A normalisation over the last dimension of one float input (layernorm, rmsnorm): the
// output has the input's type, every parameter slot is per channel ([C]), and both
// backward passes read the input, the output gradient and the row statistics forward
// saved. The ops add their kernels and costs.
class RowNormOp : public OpBase {
 public:
  RowNormOp(const OpSchema& schema, const OpSpec& spec, double default_eps);
  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }
  bool weight_needs_saved() const override { return true; }

 protected:
  double eps_;
  int64_t c_ = 0, rows_ = 0;  // channels (the last dimension); rows per sample
};

// An elementwise op (relu, gelu, silu, add, swiglu): float inputs of one type (the
// second's checked against the first's, which the schema names), an output of that type,
// and a fixed number of flops per element forward and in the input's backward.
class ElementwiseOp : public OpBase {
 public:
  ElementwiseOp(const OpSchema& schema, const OpSpec& spec, double forward_flops,
                double backward_input_flops);
  OpCost cost(int64_t batch) const override;

 private:
  int64_t elems_ = 0;
  double forward_flops_, backward_input_flops_;  // per element
};

// An op that adds a parameter to its one input (bias_add, position_embedding): the input's
// gradient is the output's itself, the parameter's reads the output gradient, and each pass
// costs a flop per element (`elems_`, the per-sample elements of the input).
class AddParamOp : public OpBase {
 public:
  using OpBase::OpBase;
  bool weight_needs_grad_outputs() const override { return true; }
  void backward_input(BackwardCall& c) const override;
  OpCost cost(int64_t batch) const override;

 protected:
  int64_t elems_ = 0;
};

// A LayerNorm's weight and bias gradients (kernels::layernorm_backward_weight) into gw and
// gb, each overwritten or added to as it says: one parameter in both slots, or one shared
// with another node in only one slot, has them apart.
void layernorm_weight_grads(const Tensor& dy, const Tensor& x, const Tensor& mean,
                            const Tensor& rstd, ParamGrad& gw, ParamGrad& gb);

// The JSON of input i of a node (for errors): $.layers[..].nodes[..].inputs[i].
JsonReader input_json(const OpSpec& spec, size_t i);
// The JSON of a parameter slot (for errors): $.layers[..].nodes[..].params.<slot>.
JsonReader param_json(const OpSpec& spec, const std::string& slot);

// Checks input i: batched, floating (the model's float dtype) and at least `min_rank`
// dimensions per sample.
void expect_float_input(const OpSpec& spec, size_t i, size_t min_rank = 1);
void expect_int_input(const OpSpec& spec, size_t i);
// Checks that input i has input 0's type (per-sample shape and dtype), as the operands of an
// elementwise pair need; `first` names input 0 in the error.
void expect_type_of_first_input(const OpSpec& spec, size_t i, const std::string& first);
// Checks that parameter slot `slot` (index k) has shape `expected`.
void expect_param_shape(const OpSpec& spec, const OpSchema& schema, size_t k,
                        const Shape& expected);

// Views a contiguous tensor as rows: [..., C] -> [numel / C, C].
Tensor as_rows(const Tensor& t);
// Elements of a per-sample shape, and the leading (all but last) part.
int64_t numel_of(const Shape& s);
int64_t rows_per_sample(const Shape& s);  // product of all but the last dimension

// Run-time shape of a value for this micro-batch.
Shape batched(const OpContext& ctx, const Shape& per_sample);
int64_t dsize(DType t);
// Bytes of a tensor of `elems` elements as the allocator counts them (rounded up).
int64_t alloc_bytes(int64_t elems, DType t);

}  // namespace baton::stages::ops
