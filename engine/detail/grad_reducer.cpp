#include "engine/detail/grad_reducer.h"

#include <algorithm>

#include "kernels/ops.h"
#include "memory/error.h"

namespace baton::engine::detail {

using memory::Tensor;

GradReducer::GradReducer(const std::vector<GradGroup>& groups,
                         const std::map<int, stages::Stage*>& stages, size_t bucket_bytes) {
  for (const GradGroup& gg : groups) {
    Group g;
    g.comm = gg.comm && gg.comm->size() > 1 ? gg.comm : nullptr;
    std::vector<int> ids = gg.params;
    std::sort(ids.rbegin(), ids.rend());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int id : ids) {
      Param p;
      p.id = id;
      for (const auto& [s, st] : stages) {
        const auto& held = st->param_ids();
        if (std::binary_search(held.begin(), held.end(), id)) {
          p.holders.push_back(st);
          p.holder_stages.push_back(s);
        }
      }
      BATON_CHECK(!p.holders.empty(), "gradient group names parameter " + std::to_string(id) +
                                          " that no stage of this rank holds");
      // Nothing to do for a parameter held once and reduced with nobody.
      if (!g.comm && p.holders.size() == 1) continue;
      g.params.push_back(std::move(p));
    }
    if (g.params.empty()) continue;
    // Buckets: consecutive parameters of one dtype up to bucket_bytes.
    Bucket cur;
    size_t bytes = 0;
    memory::DType dtype = memory::DType::f32;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const Tensor& t = g.params[i].holders[0]->grad(g.params[i].id);
      if (!cur.params.empty() && (bytes + t.nbytes() > bucket_bytes || t.dtype() != dtype)) {
        g.buckets.push_back(std::move(cur));
        cur = Bucket{};
        bytes = 0;
      }
      dtype = t.dtype();
      cur.params.push_back(i);
      cur.elements += t.numel();
      bytes += t.nbytes();
    }
    g.buckets.push_back(std::move(cur));
    size_t gi = groups_.size();
    for (size_t i = 0; i < g.params.size(); ++i)
      for (int s : g.params[i].holder_stages) where_[{s, g.params[i].id}] = {gi, i};
    groups_.push_back(std::move(g));
  }
}

void GradReducer::begin_step() {
  for (Group& g : groups_) {
    g.next = 0;
    for (Param& p : g.params) p.waiting = int(p.holders.size());
    for (Bucket& b : g.buckets) {
      BATON_CHECK(!b.work, "a gradient reduction of the previous step is still pending");
      b.started = false;
    }
  }
}

void GradReducer::ready(int stage, int param) {
  auto it = where_.find({stage, param});
  if (it == where_.end()) return;
  Group& g = groups_[it->second.first];
  Param& p = g.params[it->second.second];
  BATON_CHECK(p.waiting > 0, "gradient of parameter " + std::to_string(param) + " finished twice");
  if (--p.waiting == 0) try_start(g);
}

void GradReducer::try_start(Group& g) {
  while (g.next < g.buckets.size()) {
    Bucket& b = g.buckets[g.next];
    for (size_t i : b.params)
      if (g.params[i].waiting > 0) return;
    start(g, b);
    ++g.next;
  }
}

void GradReducer::start_ready() {
  for (Group& g : groups_) try_start(g);
}

void GradReducer::start(Group& g, Bucket& b) {
  // A parameter held by several local stages: their gradients first, in stage order.
  for (size_t i : b.params) {
    Param& p = g.params[i];
    Tensor& total = p.holders[0]->grad(p.id);
    for (size_t k = 1; k < p.holders.size(); ++k) kernels::add_inplace(total, p.holders[k]->grad(p.id));
  }
  b.started = true;
  if (!g.comm) return;
  if (b.params.size() == 1) {
    b.work = g.comm->all_reduce(g.params[b.params[0]].holders[0]->grad(g.params[b.params[0]].id),
                                transport::ReduceOp::sum);
    return;
  }
  const Tensor& first = g.params[b.params[0]].holders[0]->grad(g.params[b.params[0]].id);
  b.flat = Tensor::empty({b.elements}, first.dtype(), first.device());
  int64_t off = 0;
  for (size_t i : b.params) {
    const Tensor& t = g.params[i].holders[0]->grad(g.params[i].id);
    b.flat.narrow(0, off, t.numel()).copy_from(t.view({t.numel()}));
    off += t.numel();
  }
  b.work = g.comm->all_reduce(b.flat, transport::ReduceOp::sum);
}

void GradReducer::finish() {
  start_ready();
  for (Group& g : groups_) {
    BATON_CHECK(g.next == g.buckets.size(), "STEP before every gradient of the rank was final");
    for (Bucket& b : g.buckets) {
      if (b.work) {
        b.work->wait();
        b.work.reset();
      }
      if (b.flat.defined()) {
        int64_t off = 0;
        for (size_t i : b.params) {
          Tensor& t = g.params[i].holders[0]->grad(g.params[i].id);
          t.view({t.numel()}).copy_from(b.flat.narrow(0, off, t.numel()));
          off += t.numel();
        }
        b.flat = Tensor();  // back to the pool: it is reused next step
      }
      for (size_t i : b.params) {
        Param& p = g.params[i];
        for (size_t k = 1; k < p.holders.size(); ++k) p.holders[k]->grad(p.id).copy_from(p.holders[0]->grad(p.id));
      }
    }
  }
}

}  // namespace baton::engine::detail
