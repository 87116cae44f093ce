// embedding (token ids -> rows of a table; under vocabulary parallelism a node holds the
// rows [vocab_offset, vocab_offset + rows) and gives zeros for other ids; padding_idx, a
// token whose row gets no gradient from the lookup, as torch's nn.Embedding) and
// position_embedding (adds the first T rows of a position table to x [T, C]).
#include "stages/ops/common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

const OpSchema& embedding_schema() {
  static const OpSchema s{"embedding",
                          {"ids"},
                          {"y"},
                          {{"weight", false}},
                          {"vocab_offset", "padding_idx"},
                          "y[..., :] = weight[ids[...] - vocab_offset, :] (zeros for ids "
                          "outside the rows held); positions whose id is padding_idx add no "
                          "gradient to the table"};
  return s;
}

class Embedding final : public OpBase {
 public:
  explicit Embedding(const OpSpec& spec) : OpBase(embedding_schema(), spec) {
    offset_ = spec.attrs.get_int("vocab_offset", 0, 0);
    expect_int_input(spec, 0);
    const Shape& w = *spec.params[0];
    if (w.size() != 2)
      param_json(spec, "weight").fail("a 2-D table [rows, C]", memory::shape_str(w));
    // A global token id: a vocabulary shard (vocab_offset given) holds the row or not, a
    // whole table must hold it.
    if (auto pad = spec.attrs.get("padding_idx"); pad && !pad->raw().is_null())
      padding_idx_ =
          spec.attrs.has("vocab_offset") ? pad->as_int(0, INT64_MAX) : pad->as_int(0, w[0] - 1);
    c_ = w[1];
    Shape y = spec.inputs[0].shape;
    y.push_back(c_);
    out_.push_back({y, dtype_, true});
    ids_ = numel_of(spec.inputs[0].shape);
  }

  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor y2 = y.view({-1, c_});
    kernels::embedding_forward(c.inputs[0].view({-1}), c.params[0], offset_, y2, false);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall&) const override {}  // ids have no gradient

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& g = c.grad_params[0];
    if (!g.accumulate) g.tensor.zero_();
    kernels::embedding_backward(c.inputs[0].view({-1}), c.grad_outputs[0].view({-1, c_}), offset_,
                                g.tensor, padding_idx_);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    k.backward_weight_flops = double(batch * ids_ * c_);
    return k;
  }

 private:
  int64_t offset_ = 0, c_ = 0, ids_ = 0;
  int64_t padding_idx_ = -1;  // none
};

const OpSchema& position_schema() {
  static const OpSchema s{"position_embedding",
                          {"x"},
                          {"y"},
                          {{"weight", false}},
                          {},
                          "y[t, :] = x[t, :] + weight[t, :] for x [T, C], weight [P, C], "
                          "T <= P"};
  return s;
}

class PositionEmbedding final : public AddParamOp {
 public:
  explicit PositionEmbedding(const OpSpec& spec) : AddParamOp(position_schema(), spec) {
    expect_float_input(spec, 0, 2);
    const Shape& x = spec.inputs[0].shape;
    if (x.size() != 2) input_json(spec, 0).fail("a value [T, C]", type_str(spec.inputs[0]));
    t_ = x[0];
    c_ = x[1];
    elems_ = t_ * c_;
    const Shape& w = *spec.params[0];
    if (w.size() != 2 || w[1] != c_ || w[0] < t_)
      param_json(spec, "weight")
          .fail("a table [P, " + std::to_string(c_) + "] with P >= T = " + std::to_string(t_),
                "one of shape " + memory::shape_str(w));
    out_.push_back(spec.inputs[0]);
  }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor pos = c.params[0].narrow(0, 0, t_);
    for (int64_t b = 0; b < c.ctx.batch(); ++b) {
      Tensor yb = y.select(0, b);
      kernels::add(c.inputs[0].select(0, b), pos, yb);
    }
    c.outputs[0] = y;
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& g = c.grad_params[0];
    if (!g.accumulate) g.tensor.zero_();
    Tensor rows = g.tensor.narrow(0, 0, t_);
    for (int64_t b = 0; b < c.ctx.batch(); ++b)
      kernels::add_inplace(rows, c.grad_outputs[0].select(0, b));
  }

 private:
  int64_t t_ = 0, c_ = 0;
};

}  // namespace

void add_embedding_ops(std::vector<OpType>& table) {
  table.push_back(
      {embedding_schema(), [](const OpSpec& s) { return std::make_unique<Embedding>(s); }});
  table.push_back(
      {position_schema(), [](const OpSpec& s) { return std::make_unique<PositionEmbedding>(s); }});
}

}  // namespace baton::stages::ops
