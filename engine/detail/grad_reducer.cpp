#include "engine/detail/grad_reducer.h"

#include <algorithm>
#include <exception>
#include <tuple>

#include "kernels/ops.h"
#include "memory/error.h"

namespace baton::engine::detail {

using memory::Tensor;

GradReducer::GradReducer(const std::vector<GradGroup>& groups,
                         const std::map<int, stages::Stage*>& stages, size_t bucket_bytes) {
  for (const GradGroup& gg : groups) {
    Group g;
    g.comm = gg.comm && gg.comm->size() > 1 ? gg.comm : nullptr;
    g.shard = gg.shard && g.comm;
    g.servers = g.shard ? gg.servers : 0;
    std::vector<int> ids = gg.params;
    std::sort(ids.rbegin(), ids.rend());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    Group whole = g;  // ZeRO-2: the parameters held by several local stages stay zero1
    if (g.shard && gg.shard_grads) g.shard_grads = true;
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
      if (g.shard_grads && p.holders.size() > 1)
        whole.params.push_back(std::move(p));
      else
        g.params.push_back(std::move(p));
    }
    add_group(std::move(whole), bucket_bytes);
    add_group(std::move(g), bucket_bytes);
  }
}

std::vector<std::vector<size_t>> cut_buckets(const std::vector<BucketItem>& items,
                                             size_t bucket_bytes) {
  std::vector<std::vector<size_t>> out;
  size_t bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BucketItem& t = items[i];
    if (!out.empty() && !out.back().empty()) {
      const BucketItem& first = items[out.back().front()];
      if (bytes + t.nbytes > bucket_bytes || t.dtype != items[out.back().back()].dtype ||
          t.stage != first.stage) {
        out.emplace_back();
        bytes = 0;
      }
    }
    if (out.empty()) out.emplace_back();
    out.back().push_back(i);
    bytes += t.nbytes;
  }
  return out;
}

std::vector<int64_t> bucket_parts(int64_t elements, int members, int servers) {
  // The all-reduce's partition (transport/detail/collectives.cpp: equal_parts), over the
  // servers only when there are extra ones.
  const int over = servers > 0 ? servers : members;
  std::vector<int64_t> counts(size_t(members - over), 0);
  for (int k = 0; k < over; ++k) counts.push_back(elements / over + (k < elements % over ? 1 : 0));
  return counts;
}

std::vector<int64_t> param_parts(const std::vector<int64_t>& bucket_counts, int64_t first,
                                 int64_t numel) {
  std::vector<int64_t> out;
  int64_t begin = 0;  // member q's part of the bucket: [begin, begin + counts[q])
  for (int64_t c : bucket_counts) {
    const int64_t lo = std::clamp(begin - first, int64_t(0), numel);
    out.push_back(std::clamp(begin + c - first, lo, numel) - lo);
    begin += c;
  }
  return out;
}

namespace {

// A pull's point-to-point messages as one Work (and the views they write, kept alive).
class ServerPullWorks final : public transport::Work {
 public:
  ServerPullWorks(std::vector<transport::WorkPtr> works, std::vector<Tensor> views)
      : works_(std::move(works)), views_(std::move(views)) {}
  bool test() override {
    bool done = true;
    for (transport::WorkPtr& w : works_) done = w->test() && done;
    return done;
  }
  void wait() override {
    for (transport::WorkPtr& w : works_) w->wait();
  }

 private:
  std::vector<transport::WorkPtr> works_;
  std::vector<Tensor> views_;
};

}  // namespace

transport::WorkPtr pull_bucket(transport::Communicator& comm, const Tensor& in, Tensor& out,
                               std::span<const int64_t> counts, int servers, uint64_t tag) {
  if (servers <= 1) return comm.all_gather(in, out, counts);
  const int n = comm.size(), me = comm.rank(), replicas = n - servers;
  BATON_CHECK(replicas >= 1 && int(counts.size()) == n, "a server pull over the wrong group");
  std::vector<transport::WorkPtr> works;
  std::vector<Tensor> views;
  if (me >= replicas) {
    BATON_CHECK(in.numel() == counts[size_t(me)], "a server's pull part of the wrong size");
    if (in.numel() > 0)
      for (int q = 0; q < replicas; ++q) works.push_back(comm.isend(in, q, tag));
  } else {
    views.reserve(size_t(servers));  // irecv holds its tensor: no reallocation
    int64_t at = 0;
    for (int k = 0; k < n; ++k) {
      if (k >= replicas && counts[size_t(k)] > 0) {
        views.push_back(out.narrow(0, at, counts[size_t(k)]));
        works.push_back(comm.irecv(views.back(), k, tag));
      }
      at += counts[size_t(k)];
    }
  }
  return std::make_shared<ServerPullWorks>(std::move(works), std::move(views));
}

void GradReducer::add_group(Group g, size_t bucket_bytes) {
  if (g.params.empty()) return;
  // Buckets: consecutive parameters of one dtype up to bucket_bytes (under ZeRO-2, of
  // one stage too: a bucket is reduced within that stage's W).
  std::vector<BucketItem> items;
  for (const Param& p : g.params) {
    const Tensor& t = p.holders[0]->grad(p.id);
    items.push_back({t.numel(), t.nbytes(), t.dtype(), g.shard_grads ? p.holder_stages[0] : 0});
  }
  for (const std::vector<size_t>& cut : cut_buckets(items, bucket_bytes)) {
    Bucket b;
    for (size_t i : cut) {
      g.params[i].bucket = g.buckets.size();
      g.params[i].slot = b.params.size();
      b.params.push_back(i);
      b.offsets.push_back(b.elements);
      b.elements += items[i].numel;
    }
    g.buckets.push_back(std::move(b));
  }
  if (g.shard) {
    const int n = g.comm->size(), me = g.comm->rank();
    for (Bucket& b : g.buckets) {
      b.counts = bucket_parts(b.elements, n, g.servers);
      for (int k = 0; k < me; ++k) b.part_begin += b.counts[size_t(k)];
      b.part_end = b.part_begin + b.counts[size_t(me)];
      for (size_t j = 0; j < b.params.size(); ++j) {
        const Param& p = g.params[b.params[j]];
        const int64_t first = b.offsets[j], n_el = p.holders[0]->grad(p.id).numel();
        const int64_t lo = std::clamp(b.part_begin - first, int64_t(0), n_el);
        const int64_t hi = std::clamp(b.part_end - first, lo, n_el);
        for (stages::Stage* st : p.holders) {
          st->set_optimizer_shard(p.id, lo, hi);
          if (g.shard_grads) st->set_grad_shard(p.id);
        }
      }
      b.micro.assign(b.params.size(), Tensor());
      b.micro_waiting = b.params.size();
    }
  }
  size_t gi = groups_.size();
  for (size_t i = 0; i < g.params.size(); ++i)
    for (int s : g.params[i].holder_stages) where_[{s, g.params[i].id}] = {gi, i};
  if (g.shard_grads)
    for (const Param& p : g.params) {
      stages::Stage* st = p.holders[0];
      const int s = p.holder_stages[0];
      st->set_micro_grad_fn([this, s](int id, Tensor t) { micro(s, id, std::move(t)); });
    }
  groups_.push_back(std::move(g));
}

void GradReducer::micro(int stage, int param, Tensor grad) {
  auto it = where_.find({stage, param});
  BATON_CHECK(
      it != where_.end() && groups_[it->second.first].shard_grads,
      "a micro-batch gradient of parameter " + std::to_string(param) + " that is not sharded");
  Group& g = groups_[it->second.first];
  Param& p = g.params[it->second.second];
  Bucket& b = g.buckets[p.bucket];
  BATON_CHECK(b.micro_waiting > 0 && !b.micro[p.slot].defined(),
              "micro-batch gradient of parameter " + std::to_string(param) + " given twice");
  // Moved in: the bucket's reduction below drops it, so nothing else may hold it.
  b.micro[p.slot] = grad.defined() ? std::move(grad)
                                   : Tensor::zeros(p.holders[0]->param(p.id).shape(),
                                                   p.holders[0]->working_param(p.id).dtype(),
                                                   p.holders[0]->param(p.id).device());
  if (--b.micro_waiting == 0) reduce_micro(g, b);
}

void GradReducer::reduce_micro(Group& g, Bucket& b) {
  const int64_t len = b.part_end - b.part_begin;
  Tensor in;
  if (b.params.size() == 1) {
    in = b.micro[0].view({b.micro[0].numel()});
  } else {
    in = Tensor::empty({b.elements}, b.micro[0].dtype(), b.micro[0].device());
    for (size_t j = 0; j < b.params.size(); ++j)
      in.narrow(0, b.offsets[j], b.micro[j].numel())
          .copy_from(b.micro[j].view({b.micro[j].numel()}));
    for (Tensor& t : b.micro) t = Tensor();  // only the flat copy from here on
  }
  Tensor part = in.narrow(0, b.part_begin, len);
  g.comm->reduce_scatter(in, part, transport::ReduceOp::sum, b.counts)->wait();
  for_part(g, b, [&](size_t j, int64_t lo, int64_t hi, int64_t at) {
    const Param& p = g.params[b.params[j]];
    kernels::add_inplace(p.holders[0]->grad(p.id), part.narrow(0, at, hi - lo));
  });
  for (Tensor& t : b.micro) t = Tensor();
  b.micro_waiting = b.params.size();
}

// Extra server ranks start from the replicas' initial parameters (or those loaded before
// the first step): replica 0, the group's rank 0, scatters each bucket's parts to them.
void GradReducer::seed_servers() {
  for (Group& g : groups_) {
    if (g.servers == 0) continue;
    for (Bucket& b : g.buckets) {
      const Tensor& first = g.params[b.params[0]].holders[0]->param(g.params[b.params[0]].id);
      Tensor in;
      if (g.comm->rank() == 0) {
        in = Tensor::empty({b.elements}, first.dtype(), first.device());
        for (size_t j = 0; j < b.params.size(); ++j) {
          const Tensor& v = g.params[b.params[j]].holders[0]->param(g.params[b.params[j]].id);
          in.narrow(0, b.offsets[j], v.numel()).copy_from(v.view({v.numel()}));
        }
      }
      Tensor none = Tensor::empty({0}, first.dtype(), first.device());
      g.comm->scatter(in, none, 0, b.counts)->wait();
    }
  }
}

void GradReducer::begin_step() {
  if (!seeded_) {
    seeded_ = true;
    seed_servers();
  }
  for (Group& g : groups_) {
    g.next = 0;
    for (Param& p : g.params) {
      p.waiting = int(p.holders.size());
      if (g.shard_grads) p.holders[0]->grad(p.id).zero_();  // the step's accumulators
    }
    for (Bucket& b : g.buckets) {
      BATON_CHECK(!b.work, "a gradient reduction of the previous step is still pending");
      BATON_CHECK(!g.shard_grads || b.micro_waiting == b.params.size(),
                  "a micro-batch's gradients of the previous step were not all reduced");
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

void GradReducer::hold(bool on) {
  held_ = on;
  if (!on) start_ready();
}

void GradReducer::try_start(Group& g) {
  // A host transport's collective runs on its communicator's thread whenever that picks
  // it up (or a waiter runs it), holding its scratch in the rank's memory until its
  // peers' parts are in: started inside a W, the scratch overlapped the rest of the W or
  // not by a timing-dependent margin (one bucket's size on a ResNet stage whose tp_copy
  // all-reduce waits after its bucket is final: measured peaks 14% apart). Started at
  // the W's end, the peak is the same on every run. A device transport's collectives
  // run on their stream, and zero2 reduces its own buckets inside W anyway.
  if (held_ && !g.shard_grads && g.comm && g.comm->backend() != "nccl") return;
  while (g.next < g.buckets.size()) {
    Bucket& b = g.buckets[g.next];
    for (size_t i : b.params)
      if (g.params[i].waiting > 0) return;
    if (g.shard_grads)
      b.started = true;  // ZeRO-2: reduced micro-batch by micro-batch already
    else
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
    for (size_t k = 1; k < p.holders.size(); ++k)
      kernels::add_inplace(total, p.holders[k]->grad(p.id));
  }
  b.started = true;
  if (!g.comm) return;
  if (g.shard) {
    // Reduce-scattered in place: the output is the rank's own part of the input (the
    // transport reads each element of that part before writing its sum there), so the
    // sharded reduction needs no buffer beyond the all-reduce's.
    const int64_t len = b.part_end - b.part_begin;
    if (b.params.size() == 1) {
      Tensor& t = first_grad(g, b);
      Tensor whole = t.view({t.numel()});
      b.part = whole.narrow(0, b.part_begin, len);
      b.work = g.comm->reduce_scatter(whole, b.part, transport::ReduceOp::sum, b.counts);
      return;
    }
    pack(g, b);
    b.part = b.flat.narrow(0, b.part_begin, len);
    b.work = g.comm->reduce_scatter(b.flat, b.part, transport::ReduceOp::sum, b.counts);
    return;
  }
  if (b.params.size() == 1) {
    b.work = g.comm->all_reduce(g.params[b.params[0]].holders[0]->grad(g.params[b.params[0]].id),
                                transport::ReduceOp::sum);
    return;
  }
  pack(g, b);
  b.work = g.comm->all_reduce(b.flat, transport::ReduceOp::sum);
}

Tensor& GradReducer::first_grad(Group& g, Bucket& b) {
  return g.params[b.params[0]].holders[0]->grad(g.params[b.params[0]].id);
}

void GradReducer::pack(Group& g, Bucket& b) {
  const Tensor& first = first_grad(g, b);
  b.flat = Tensor::empty({b.elements}, first.dtype(), first.device());
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& t = g.params[b.params[j]].holders[0]->grad(g.params[b.params[j]].id);
    b.flat.narrow(0, b.offsets[j], t.numel()).copy_from(t.view({t.numel()}));
  }
}

// Calls fn(param index j of the bucket, element range [lo, hi) of the parameter, the
// same range's start in the rank's part) for each parameter overlapping the rank's part.
template <class Fn>
void GradReducer::for_part(const Group& g, const Bucket& b, Fn&& fn) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Param& p = g.params[b.params[j]];
    auto [lo, hi] = p.holders[0]->optimizer_shard(p.id);
    if (hi > lo) fn(j, lo, hi, b.offsets[j] + lo - b.part_begin);
  }
}

std::optional<std::pair<int64_t, int64_t>> GradReducer::shard_of(int stage, int param) const {
  auto it = where_.find({stage, param});
  if (it == where_.end() || !groups_[it->second.first].shard) return std::nullopt;
  const Param& p = groups_[it->second.first].params[it->second.second];
  return p.holders[0]->optimizer_shard(p.id);
}

std::pair<int64_t, int64_t> GradReducer::sharded_elements() const {
  int64_t mine = 0, all = 0;
  for (const Group& g : groups_) {
    if (!g.shard) continue;
    for (const Param& p : g.params) {
      auto [lo, hi] = p.holders[0]->optimizer_shard(p.id);
      mine += (hi - lo) * int64_t(p.holders.size());
      all += p.holders[0]->param(p.id).numel() * int64_t(p.holders.size());
    }
  }
  return {mine, all};
}

std::vector<GradReducer::GatherSpec> GradReducer::gather_specs() {
  std::vector<GatherSpec> out;
  for (Group& g : groups_) {
    if (!g.shard) continue;
    for (Bucket& b : g.buckets) {
      for (size_t j = 0; j < b.params.size(); ++j) {
        Param& p = g.params[b.params[j]];
        GatherSpec x{&g, &p, param_parts(b.counts, b.offsets[j], p.holders[0]->param(p.id).numel()),
                     0, 0};
        std::tie(x.lo, x.hi) = p.holders[0]->optimizer_shard(p.id);
        out.push_back(std::move(x));
      }
    }
  }
  return out;
}

void GradReducer::gather_params() {
  if (staleness_ > 0) {
    // The parameter server's pull of this update, left in flight; the working parts back.
    std::vector<GatherSpec> specs = gather_specs();
    BATON_CHECK(working_.size() == specs.size(), "a parameter-server update without its masters");
    std::vector<Tensor> parts;
    for (size_t k = 0; k < specs.size(); ++k) {
      const GatherSpec& x = specs[k];
      Tensor& v = x.p->holders[0]->param(x.p->id);
      parts.push_back(v.view({v.numel()}).narrow(0, x.lo, x.hi - x.lo).clone());
      for (stages::Stage* st : x.p->holders) {
        Tensor& h = st->param(x.p->id);
        h.view({h.numel()}).narrow(0, x.lo, x.hi - x.lo).copy_from(working_[k]);
      }
    }
    working_.clear();
    post_pull(parts);
    while (pulls_.size() > size_t(staleness_)) {
      complete_pull(pulls_.front());
      pulls_.pop_front();
    }
    return;
  }
  // A bucket of several parameters: one all-gather of the bucket, in place in a flat
  // copy (under zero1 the size the reduction held until the step's end), so a step
  // costs a gather per bucket rather than per parameter (latency-bound on a slow link).
  struct Gather {
    Group* g = nullptr;
    Bucket* b = nullptr;  // set: a whole bucket into b->flat; else one parameter
    Param* p = nullptr;
    Tensor in, out;
    transport::WorkPtr work;
  };
  std::vector<Gather> gathers;
  for (Group& g : groups_) {
    if (!g.shard) continue;
    for (Bucket& b : g.buckets) {
      if (b.params.size() < 2) continue;
      const Tensor& first = g.params[b.params[0]].holders[0]->param(g.params[b.params[0]].id);
      b.flat = Tensor::empty({b.elements}, first.dtype(), first.device());
      Gather y{&g,     &b, nullptr, b.flat.narrow(0, b.part_begin, b.part_end - b.part_begin),
               b.flat, {}};
      for_part(g, b, [&](size_t j, int64_t lo, int64_t hi, int64_t at) {
        const Param& p = g.params[b.params[j]];
        Tensor& v = p.holders[0]->param(p.id);
        y.in.narrow(0, at, hi - lo).copy_from(v.view({v.numel()}).narrow(0, lo, hi - lo));
      });
      y.work =
          pull_bucket(*g.comm, y.in, y.out, b.counts, g.servers, uint64_t(&b - g.buckets.data()));
      gathers.push_back(std::move(y));
    }
  }
  // Otherwise one all-gather per parameter, straight into the parameter: each rank
  // contributes the elements of it in its part, staged in the same elements of the
  // gradient (no longer needed after the step), so the gather needs no buffer.
  for (GatherSpec& x : gather_specs()) {
    if (x.g->buckets[x.p->bucket].params.size() > 1) continue;
    Param& p = *x.p;
    Tensor& v = p.holders[0]->param(p.id);
    const int64_t numel = v.numel();
    Tensor& grad = p.holders[0]->grad(p.id);
    Gather y{x.g, nullptr, &p, {}, {}, {}};
    y.in = x.g->shard_grads ? grad.view({grad.numel()})  // the spent accumulator
                            : grad.view({grad.numel()}).narrow(0, x.lo, x.hi - x.lo);
    y.in.copy_from(v.view({numel}).narrow(0, x.lo, x.hi - x.lo));
    y.out = v.view({numel});
    y.work = pull_bucket(*x.g->comm, y.in, y.out, x.counts, x.g->servers, uint64_t(x.p->bucket));
    gathers.push_back(std::move(y));
  }
  for (Gather& x : gathers) {
    x.work->wait();
    if (x.b) {
      for (size_t j = 0; j < x.b->params.size(); ++j) {
        Param& p = x.g->params[x.b->params[j]];
        for (stages::Stage* st : p.holders) {
          Tensor& v = st->param(p.id);
          v.view({v.numel()}).copy_from(x.b->flat.narrow(0, x.b->offsets[j], v.numel()));
        }
      }
      x.b->flat = Tensor();  // back to the pool
      continue;
    }
    Param& p = *x.p;
    for (size_t k = 1; k < p.holders.size(); ++k)
      p.holders[k]->param(p.id).copy_from(p.holders[0]->param(p.id));
  }
}

void GradReducer::post_pull(const std::vector<Tensor>& parts) {
  // One all-gather per bucket, as gather_params' (a bucket of several parameters into a
  // flat buffer): the rank's parts of its parameters are consecutive in the bucket, so
  // their concatenation is its part of the bucket; in[k] stay views of it.
  std::vector<GatherSpec> specs = gather_specs();
  BATON_CHECK(parts.size() == specs.size(), "a parameter-server pull of the wrong parameters");
  Pull pull;
  size_t k = 0;
  for (Group& g : groups_) {
    if (!g.shard) continue;
    for (Bucket& b : g.buckets) {
      const Tensor& first = g.params[b.params[0]].holders[0]->param(g.params[b.params[0]].id);
      Tensor in = Tensor::empty({b.part_end - b.part_begin}, first.dtype(), first.device());
      int64_t at = 0;
      for (size_t j = 0; j < b.params.size(); ++j, ++k) {
        const int64_t len = specs[k].hi - specs[k].lo;
        BATON_CHECK(parts[k].numel() == len, "a parameter-server part of the wrong size");
        Tensor mine = in.narrow(0, at, len);
        mine.copy_from(parts[k]);
        pull.in.push_back(mine);
        at += len;
      }
      pull.out.push_back(Tensor::empty({b.elements}, first.dtype(), first.device()));
      pull.works.push_back(pull_bucket(*g.comm, in, pull.out.back(), b.counts, g.servers,
                                       uint64_t(&b - g.buckets.data())));
      pull.buckets.push_back(&b);
      pull.groups.push_back(&g);
    }
  }
  pulls_.push_back(std::move(pull));
}

void GradReducer::complete_pull(Pull& pull) {
  for (size_t i = 0; i < pull.works.size(); ++i) {
    pull.works[i]->wait();
    const Bucket& b = *pull.buckets[i];
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Param& p = pull.groups[i]->params[b.params[j]];
      for (stages::Stage* st : p.holders) {
        Tensor& v = st->param(p.id);
        v.view({v.numel()}).copy_from(pull.out[i].narrow(0, b.offsets[j], v.numel()));
      }
    }
  }
}

void GradReducer::install_masters() {
  if (staleness_ <= 0) return;
  BATON_CHECK(working_.empty(), "parameter-server masters installed twice");
  std::vector<GatherSpec> specs = gather_specs();
  for (size_t k = 0; k < specs.size(); ++k) {
    const GatherSpec& x = specs[k];
    Tensor& v = x.p->holders[0]->param(x.p->id);
    working_.push_back(v.view({v.numel()}).narrow(0, x.lo, x.hi - x.lo).clone());
    if (pulls_.empty()) continue;  // none in flight: the part is the master
    for (stages::Stage* st : x.p->holders) {
      Tensor& h = st->param(x.p->id);
      h.view({h.numel()}).narrow(0, x.lo, x.hi - x.lo).copy_from(pulls_.back().in[k]);
    }
  }
}

std::vector<std::vector<Tensor>> GradReducer::stale_parts() const {
  std::vector<std::vector<Tensor>> out;
  for (const Pull& p : pulls_) out.push_back(p.in);
  return out;
}

std::vector<std::pair<int, int>> GradReducer::stale_params() const {
  std::vector<std::pair<int, int>> out;
  for (const GatherSpec& x : const_cast<GradReducer*>(this)->gather_specs())
    out.emplace_back(x.p->holder_stages[0], x.p->id);
  return out;
}

void GradReducer::restore_stale(const std::vector<std::vector<Tensor>>& parts) {
  BATON_CHECK(pulls_.empty(), "parameter-server pulls restored while others are in flight");
  BATON_CHECK(parts.size() <= size_t(staleness_), "more parameter-server pulls than the staleness");
  for (const std::vector<Tensor>& p : parts) post_pull(p);
}

void GradReducer::drain() noexcept {
  for (Pull& p : pulls_)
    for (auto& w : p.works) {
      try {
        w->wait();
      } catch (...) {  // a peer gone: nothing left to wait for
      }
    }
  pulls_.clear();
}

GradReducer::~GradReducer() {
  // After a failure the pulls may never complete: only a normal end waits for them.
  if (std::uncaught_exceptions() == 0) drain();
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
      if (g.shard_grads) continue;  // the accumulators hold the part already
      if (g.shard) {
        // The rank's reduced part into the gradients it covers (every holder; in place
        // already for a bucket of one parameter).
        for_part(g, b, [&](size_t j, int64_t lo, int64_t hi, int64_t at) {
          Param& p = g.params[b.params[j]];
          for (size_t k = 0; k < p.holders.size(); ++k) {
            if (k == 0 && !b.flat.defined()) continue;
            Tensor& t = p.holders[k]->grad(p.id);
            t.view({t.numel()}).narrow(0, lo, hi - lo).copy_from(b.part.narrow(0, at, hi - lo));
          }
        });
        b.part = Tensor();
        b.flat = Tensor();
        continue;
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
        for (size_t k = 1; k < p.holders.size(); ++k)
          p.holders[k]->grad(p.id).copy_from(p.holders[0]->grad(p.id));
      }
    }
  }
}

}  // namespace baton::engine::detail
