#include "engine/detail/local_sgd.h"

#include "kernels/ops.h"
#include "memory/error.h"

namespace baton::engine::detail {

using memory::Tensor;

LocalSgd::LocalSgd(const DpSyncConfig& config, const std::map<int, stages::Stage*>& stages)
    : cfg_(config), stages_(stages) {
  BATON_CHECK(cfg_.sync_every >= 1, "local SGD: sync_every must be at least 1");
  BATON_CHECK(cfg_.replicas >= 1, "local SGD: replicas");
  for (const auto& [s, st] : stages_)
    for (int id : st->param_ids())
      if (st->graph().params[size_t(id)].trainable) entries_.push_back({s, id, {}, {}});
}

void LocalSgd::begin_step() {
  if (anchored_) return;
  for (Entry& e : entries_) {
    const Tensor& p = stages_.at(e.stage)->param(e.param);
    if (!e.anchor.defined()) e.anchor = p.clone();
    if (cfg_.nesterov && !e.momentum.defined())
      e.momentum = Tensor::zeros(p.shape(), p.dtype(), p.device());
  }
  anchored_ = true;
}

void LocalSgd::mark_anchored() {
  for (Entry& e : entries_) {
    BATON_CHECK(e.anchor.defined(), "local SGD: a resumed entry without its anchor");
    if (cfg_.nesterov && !e.momentum.defined())
      e.momentum = Tensor::zeros(e.anchor.shape(), e.anchor.dtype(), e.anchor.device());
  }
  anchored_ = true;
}

bool LocalSgd::after_step(int64_t step) {
  if ((step + 1) % cfg_.sync_every != 0) return false;
  BATON_CHECK(anchored_, "local SGD: a sync before the first step");
  transport::Communicator* comm =
      cfg_.replica_comm && cfg_.replica_comm->size() > 1 ? cfg_.replica_comm : nullptr;
  // Each parameter becomes its delta in place (no buffer), every all-reduce posted before
  // any is waited for.
  std::vector<transport::WorkPtr> works;
  for (Entry& e : entries_) {
    Tensor& p = stages_.at(e.stage)->param(e.param);
    kernels::scale_inplace(p, -1.0);
    kernels::add_inplace(p, e.anchor);
    kernels::scale_inplace(p, -1.0);  // -(anchor - param): param - anchor, exactly
    if (comm) works.push_back(comm->all_reduce(p, transport::ReduceOp::sum));
  }
  for (auto& w : works) w->wait();
  for (Entry& e : entries_) {
    Tensor& d = stages_.at(e.stage)->param(e.param);  // the summed deltas
    if (cfg_.replicas > 1) kernels::scale_inplace(d, 1.0 / double(cfg_.replicas));  // mean delta
    if (cfg_.nesterov) {
      // g = -mean delta; m = mu m + g; param = anchor - lr (g + mu m).
      kernels::scale_inplace(d, -1.0);
      kernels::scale_inplace(e.momentum, cfg_.outer_momentum);
      kernels::add_inplace(e.momentum, d);
      Tensor u = e.momentum.clone();  // one parameter's size at a time
      kernels::scale_inplace(u, cfg_.outer_momentum);
      kernels::add_inplace(u, d);
      kernels::scale_inplace(u, -cfg_.outer_lr);
      d.copy_from(e.anchor);
      kernels::add_inplace(d, u);
    } else {
      kernels::add_inplace(d, e.anchor);  // anchor + mean delta: the replicas' mean
    }
    e.anchor.copy_from(d);
  }
  return true;
}

}  // namespace baton::engine::detail
