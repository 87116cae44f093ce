// Tensor-parallel communication ops, inserted by the partitioner into physical graphs.
// They talk through OpContext::tp, the communicator of the node's tensor-parallel group:
//   tp_copy    identity forward, all-reduce (sum) of the gradient backward
//   tp_reduce  all-reduce (sum) forward, identity backward
//   tp_gather  all-gather of the last dimension (or of `dim`: the channels of an image)
//              forward, this rank's slice backward
//   vocab_parallel_cross_entropy  cross-entropy over logits split by vocabulary columns:
//              on the CPU ce_local_forward (one read of the logits) -> all-reduce max ->
//              ce_local_share -> all-reduce sum -> ce_local_finish; on CUDA ce_row_max ->
//              all-reduce max -> ce_sum_exp -> all-reduce sum -> ce_finish
#include <limits>

#include "kernels/fused.h"
#include "stages/ops/common.h"
#include "stages/ops/loss_common.h"
#include "stages/ops/registry.h"
#include "transport/communicator.h"

namespace baton::stages::ops {
namespace {

transport::Communicator& tp_of(const OpContext& ctx, const std::string& node) {
  if (ctx.tp == nullptr)
    throw RuntimeError("node '" + node +
                       "' is a tensor-parallel communication op but the stage has no "
                       "tensor-parallel communicator");
  return *ctx.tp;
}

const OpSchema& copy_schema() {
  static const OpSchema s{"tp_copy",
                          {"x"},
                          {"y"},
                          {},
                          {},
                          "identity forward; all-reduce (sum) of the gradient over the "
                          "tensor-parallel group backward (before a column-split layer)"};
  return s;
}
const OpSchema& reduce_schema() {
  static const OpSchema s{"tp_reduce",
                          {"x"},
                          {"y"},
                          {},
                          {},
                          "all-reduce (sum) over the tensor-parallel group forward; identity "
                          "backward (after a row-split layer)"};
  return s;
}

template <bool kReduceForward>
class TpAllReduce final : public OpBase {
 public:
  explicit TpAllReduce(const OpSpec& spec)
      : OpBase(kReduceForward ? reduce_schema() : copy_schema(), spec) {
    expect_float_input(spec, 0, 0);
    out_.push_back(spec.inputs[0]);
    elems_ = numel_of(spec.inputs[0].shape);
  }

  int output_alias(size_t) const override { return kReduceForward ? -1 : 0; }

  void forward(ForwardCall& c) const override {
    if (!kReduceForward) {
      c.outputs[0] = c.inputs[0];
      return;
    }
    Tensor y = c.may_overwrite(0) ? c.inputs[0] : c.inputs[0].clone();
    tp_of(c.ctx, name_).all_reduce(y, transport::ReduceOp::sum)->wait();
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    if (kReduceForward) {
      c.grad_inputs[0].give(c.grad_outputs[0]);
      return;
    }
    Tensor g = c.grad_outputs[0].clone();
    tp_of(c.ctx, name_).all_reduce(g, transport::ReduceOp::sum)->wait();
    c.grad_inputs[0].give(g);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    int64_t bytes = batch * elems_ * dsize(dtype_);
    (kReduceForward ? k.forward_comm_bytes : k.backward_comm_bytes) = bytes;
    return k;
  }

 private:
  int64_t elems_ = 0;
};

const OpSchema& gather_schema() {
  static const OpSchema s{"tp_gather",
                          {"x"},
                          {"y"},
                          {},
                          {"parts", "dim"},
                          "all-gather of the last dimension (or of the per-sample dimension "
                          "dim) over the tensor-parallel group (parts ranks, in rank order); "
                          "backward keeps this rank's slice"};
  return s;
}

class TpGather final : public OpBase {
 public:
  explicit TpGather(const OpSpec& spec) : OpBase(gather_schema(), spec) {
    parts_ = spec.attrs.at("parts").as_int(1, 1 << 16);
    expect_float_input(spec, 0, 1);
    Shape y = spec.inputs[0].shape;
    const int64_t d = spec.attrs.get_int("dim", int64_t(y.size()) - 1, 0, int64_t(y.size()) - 1);
    c_ = y[size_t(d)];
    y[size_t(d)] *= parts_;
    // Per sample: [outer, c, inner] around the gathered dimension.
    for (size_t i = size_t(d) + 1; i < y.size(); ++i) inner_ *= y[i];
    for (size_t i = 0; i < size_t(d); ++i) outer_ *= y[i];
    out_.push_back({y, dtype_, true});
    elems_ = numel_of(spec.inputs[0].shape);
  }

  void forward(ForwardCall& c) const override {
    transport::Communicator& comm = tp_of(c.ctx, name_);
    BATON_CHECK(comm.size() == parts_, "tp_gather over a group of another size");
    const int64_t n = c.inputs[0].numel() / (c_ * inner_);
    Tensor x = c.inputs[0].view({n, c_, inner_});
    // The gather concatenates whole per-rank blocks [parts, n, c, inner]; the output
    // interleaves them: y[n, r * c + j, i] = part r [n, j, i].
    Tensor parts = c.alloc({parts_, n, c_, inner_}, dtype_);
    comm.all_gather(x, parts)->wait();
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    y.view({n, parts_, c_, inner_}).copy_from(parts.permute({1, 0, 2, 3}));
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    int r = tp_of(c.ctx, name_).rank();
    const int64_t n = c.grad_outputs[0].numel() / (parts_ * c_ * inner_);
    Tensor dy = c.grad_outputs[0].view({n, parts_ * c_, inner_});
    Tensor slice = dy.narrow(1, int64_t(r) * c_, c_).contiguous();
    c.grad_inputs[0].give(slice.view(c.grad_inputs[0].shape()));
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    k.forward_comm_bytes = batch * elems_ * parts_ * dsize(dtype_);
    return k;
  }

 private:
  int64_t parts_ = 1, c_ = 0, inner_ = 1, outer_ = 1, elems_ = 0;
};

const OpSchema& vpce_schema() {
  static const OpSchema s{
      "vocab_parallel_cross_entropy",
      {"logits", "targets"},
      {"loss"},
      {},
      {"vocab_offset", "vocab_size"},
      "cross_entropy over logits holding vocabulary columns [vocab_offset, vocab_offset + "
      "V_local) of vocab_size; every rank of the group gets the same loss"};
  return s;
}

class VocabParallelCrossEntropy final : public OpBase {
 public:
  explicit VocabParallelCrossEntropy(const OpSpec& spec) : OpBase(vpce_schema(), spec) {
    v_ = check_cross_entropy_inputs(spec, rows_);
    vocab_size_ = spec.attrs.at("vocab_size").as_int(v_, INT64_MAX);
    // The last ranks of a vocabulary the degree does not divide hold padded columns past
    // vocab_size (docs/partitioner.md), but at least one real one.
    offset_ = spec.attrs.get_int("vocab_offset", 0, 0, vocab_size_ - 1);
    real_ = std::min(v_, vocab_size_ - offset_);
    out_.push_back({{}, DType::f64, false});
  }

  void forward(ForwardCall& c) const override {
    transport::Communicator& comm = tp_of(c.ctx, name_);
    Tensor logits = as_rows(c.inputs[0]);
    Tensor buffer;  // the gradient's, holding the masked copy (training)
    if (real_ < v_) {
      // Padding: -inf adds nothing to the maxima and sums and gets a zero gradient (the
      // exp of -inf is 0 in every kernel), so the loss is the unpadded vocabulary's. Logits
      // with another reader (recomputed, kept) are copied into the gradient's buffer, which
      // the kernels overwrite in place as they do the logits otherwise: no more memory than
      // an unpadded shard (a separate copy had put the padded rank over its estimate).
      if (!c.may_overwrite(0)) {
        buffer = c.alloc(c.inputs[0].shape(), dtype_);
        buffer.copy_from(c.inputs[0]);
        logits = as_rows(buffer);
        if (!c.ctx.training) buffer = Tensor();
      }
      logits.narrow(1, real_, v_ - real_).fill_(-std::numeric_limits<double>::infinity());
    }
    Tensor targets = c.inputs[1].view({-1});
    int64_t n = logits.size(0);
    Tensor row_max = c.alloc({n}, dtype_), losses = c.alloc({n}, dtype_);
    Tensor sums = c.alloc({2, n}, dtype_);  // sum_exp and target_logit: one all-reduce
    Tensor sum_exp = sums.select(0, 0), target_logit = sums.select(0, 1);
    if (logits.device().is_cpu()) {
      // One read of the local logits: their max, sum of exponentials against it and the
      // target logit, the gradient's exponentials stored; the all-reduces as below, with
      // each rank's sum rescaled to the global max in between (kernels/fused.h).
      Tensor local = c.alloc({2, n}, dtype_);
      Tensor local_max = local.select(0, 0), local_sum = local.select(0, 1);
      finish_cross_entropy(
          c, dtype_, losses,
          [&](double grad_scale, Tensor& dlogits) {
            kernels::ce_local_forward(logits, targets, offset_, grad_scale, local_max, local_sum,
                                      target_logit, dlogits);
            row_max.copy_from(local_max);
            comm.all_reduce(row_max, transport::ReduceOp::max)->wait();
            kernels::ce_local_share(local_max, local_sum, row_max, sum_exp);
            comm.all_reduce(sums, transport::ReduceOp::sum)->wait();
            kernels::ce_local_finish(targets, offset_, local_max, local_sum, row_max, sum_exp,
                                     target_logit, grad_scale, losses, dlogits);
          },
          buffer);
      return;
    }
    // CUDA: the three steps, each a pass over the logits.
    kernels::ce_row_max(logits, row_max);
    comm.all_reduce(row_max, transport::ReduceOp::max)->wait();
    kernels::ce_sum_exp(logits, targets, offset_, row_max, sum_exp, target_logit);
    comm.all_reduce(sums, transport::ReduceOp::sum)->wait();
    finish_cross_entropy(
        c, dtype_, losses,
        [&](double grad_scale, Tensor& dlogits) {
          kernels::ce_finish(logits, targets, offset_, row_max, sum_exp, target_logit, grad_scale,
                             losses, dlogits);
        },
        buffer);
  }

  void backward_input(BackwardCall& c) const override {
    if (c.grad_inputs[0].needed() && !c.saved.empty()) c.grad_inputs[0].give(c.saved[0]);
  }

  OpCost cost(int64_t batch) const override {
    double e = double(batch * rows_ * v_);
    OpCost k;
    k.forward_flops = 5 * e;
    k.extra_saved_bytes = alloc_bytes(batch * rows_ * v_, dtype_);
    k.forward_comm_bytes = 3 * batch * rows_ * dsize(dtype_);
    return k;
  }

 private:
  int64_t v_ = 0, vocab_size_ = 0, offset_ = 0, rows_ = 0, real_ = 0;
};

}  // namespace

void add_comm_ops(std::vector<OpType>& table) {
  table.push_back(
      {copy_schema(), [](const OpSpec& s) { return std::make_unique<TpAllReduce<false>>(s); }});
  table.push_back(
      {reduce_schema(), [](const OpSpec& s) { return std::make_unique<TpAllReduce<true>>(s); }});
  table.push_back({gather_schema(), [](const OpSpec& s) { return std::make_unique<TpGather>(s); }});
  table.push_back({vpce_schema(),
                   [](const OpSpec& s) { return std::make_unique<VocabParallelCrossEntropy>(s); }});
}

}  // namespace baton::stages::ops
