// cross_entropy: softmax cross-entropy of logits against integer targets, summed over the
// micro-batch and divided by the targets of the step's GLOBAL batch (MicroBatch::
// loss_tokens), so micro-batches add up to the mean over the global batch. While
// training, forward also computes the logits' gradient (into the logits' own buffer when
// nothing else reads them), which backward hands on.
#include "kernels/fused.h"
#include "stages/ops/common.h"
#include "stages/ops/loss_common.h"
#include "stages/ops/registry.h"

namespace baton::stages::ops {
namespace {

// The loss's denominator: MicroBatch::loss_tokens, or the micro-batch's own non-ignored
// targets when that is 0.
double loss_denominator(const OpContext& ctx, const Tensor& targets) {
  if (ctx.mb.loss_tokens > 0) return ctx.mb.loss_tokens;
  // Evaluation without a global count: this micro-batch's own non-ignored targets.
  Tensor t = targets.to(memory::Device::cpu()).to(DType::i64);
  double n = 0;
  for (int64_t v : t.span<int64_t>()) n += v >= 0 ? 1 : 0;
  return n > 0 ? n : 1;
}

// sum(losses) / denom as an f64 scalar on the losses' device, in a fixed order: the same
// bits whatever the thread count or the plan, and no host wait on a GPU.
Tensor sum_losses(const Tensor& losses, double denom) {
  Tensor out = Tensor::empty({}, DType::f64, losses.device());
  kernels::loss_sum(losses, denom, out);
  return out;
}

}  // namespace

int64_t check_cross_entropy_inputs(const OpSpec& spec, int64_t& rows) {
  expect_float_input(spec, 0, 1);
  expect_int_input(spec, 1);
  const Shape& l = spec.inputs[0].shape;
  Shape lead(l.begin(), l.end() - 1);
  if (spec.inputs[1].shape != lead)
    input_json(spec, 1).fail("targets of shape " + type_str({lead, spec.inputs[1].dtype}),
                             type_str(spec.inputs[1]));
  rows = numel_of(lead);
  return l.back();
}

void finish_cross_entropy(ForwardCall& c, DType dtype, const Tensor& losses,
                          const std::function<void(double grad_scale, Tensor& dlogits)>& compute,
                          const Tensor& buffer) {
  const double denom = loss_denominator(c.ctx, c.inputs[1]);
  Tensor dlogits;
  if (c.ctx.training)
    dlogits = c.may_overwrite(0) ? c.inputs[0]
              : buffer.defined() ? buffer
                                 : c.alloc(c.inputs[0].shape(), dtype);
  Tensor dl2 = dlogits.defined() ? as_rows(dlogits) : Tensor();
  compute(c.ctx.mb.loss_scale / denom, dl2);
  c.outputs[0] = sum_losses(losses, denom);
  if (c.ctx.training) c.saved.push_back(dlogits);
}

namespace {

const OpSchema& ce_schema() {
  static const OpSchema s{"cross_entropy",
                          {"logits", "targets"},
                          {"loss"},
                          {},
                          {},
                          "softmax cross-entropy of logits [..., V] against targets [...] "
                          "(negative targets ignored); the loss is a scalar"};
  return s;
}

class CrossEntropy final : public OpBase {
 public:
  explicit CrossEntropy(const OpSpec& spec) : OpBase(ce_schema(), spec) {
    v_ = check_cross_entropy_inputs(spec, rows_);
    out_.push_back({{}, DType::f64, false});
  }

  bool saves_input(size_t) const override { return false; }

  void forward(ForwardCall& c) const override {
    Tensor logits = as_rows(c.inputs[0]);
    Tensor targets = c.inputs[1].view({-1});
    int64_t n = logits.size(0);
    Tensor losses = c.alloc({n}, dtype_);
    finish_cross_entropy(c, dtype_, losses, [&](double grad_scale, Tensor& dlogits) {
      kernels::cross_entropy_forward(logits, targets, grad_scale, losses, dlogits);
    });
  }

  void backward_input(BackwardCall& c) const override {
    // The loss is the graph's last value: its gradient is 1 by definition.
    if (c.grad_inputs[0].needed() && !c.saved.empty()) c.grad_inputs[0].give(c.saved[0]);
  }

  OpCost cost(int64_t batch) const override {
    double e = double(batch * rows_ * v_);
    OpCost k;
    k.forward_flops = 5 * e;  // max, subtract, exp, sum, and the gradient's scale
    k.extra_saved_bytes = alloc_bytes(batch * rows_ * v_, dtype_);
    return k;
  }

 private:
  int64_t v_ = 0, rows_ = 0;
};

}  // namespace

void add_loss_ops(std::vector<OpType>& table) {
  table.push_back({ce_schema(), [](const OpSpec& s) { return std::make_unique<CrossEntropy>(s); }});
}

}  // namespace baton::stages::ops
