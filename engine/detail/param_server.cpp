#include "engine/detail/param_server.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <utility>

#include "engine/detail/grad_reducer.h"
#include "engine/loop.h"
#include "kernels/ops.h"
#include "memory/error.h"
#include "partitioner/evaluate.h"
#include "partitioner/groups.h"
#include "stages/param_owner.h"

namespace baton::engine::detail {

using memory::Tensor;

namespace {

// Collectives in flight, at most two: the next bucket's is posted before the oldest is
// waited for, so a server holds two buckets' buffers at a time, not the whole model's.
class ServerWindow {
 public:
  void post(transport::WorkPtr w, Tensor buffer, std::function<void()> done) {
    q_.push_back({std::move(w), std::move(buffer), std::move(done)});
    if (q_.size() > 1) pop();
  }
  void drain() {
    while (!q_.empty()) pop();
  }

 private:
  struct Item {
    transport::WorkPtr work;
    Tensor buffer;  // kept alive until the collective completes
    std::function<void()> done;
  };
  void pop() {
    q_.front().work->wait();
    if (q_.front().done) q_.front().done();
    q_.pop_front();
  }
  std::deque<Item> q_;
};

}  // namespace

ParamServer::ParamServer(const partitioner::ResolvedPlan& r, transport::CommPtr world,
                         Options options)
    : world_(std::move(world)),
      opt_(options.optimizer),
      grad_clip_(options.grad_clip),
      staleness_(r.plan.dp_sync.max_staleness) {
  BATON_CHECK(r.is_server(world_->rank()),
              "a parameter server on replica rank " + std::to_string(world_->rank()));
  loss_slots_ = r.plan.dp * r.plan.micro_batches;
  // The served groups, one per replica position (replica 0's ranks), by member list: the
  // order in which every rank splits its groups (engine/rank_engine.cpp).
  struct Served {
    int rank = 0;
    std::shared_ptr<const stages::Graph> graph;
    std::vector<int> ids;
  };
  std::map<std::vector<int>, Served> served;
  for (int q = 0; q < r.layout.world(); ++q) {
    if (r.layout.coord(q).dp != 0) continue;
    std::shared_ptr<const stages::Graph> graph = partitioner::physical_graph(r, q);
    layers_ = graph->num_layers();
    for (const partitioner::GradientGroup& gg : partitioner::gradient_groups(r, q)) {
      if (gg.ranks.size() <= 1 || !partitioner::optimizer_sharded(r, q, gg)) continue;
      Served& s = served[partitioner::reduction_members(r, q, gg)];
      s.rank = q;
      s.graph = graph;
      const int id = graph->find_param(gg.name);
      BATON_CHECK(id >= 0, "physical graph lacks parameter " + gg.name);
      s.ids.push_back(id);
    }
  }
  const int servers = r.plan.dp_sync.ps_ranks;
  for (auto& [members, s] : served) {
    Group g;
    g.comm = world_->split(members);
    g.servers = servers;
    const int me = g.comm->rank();
    const partitioner::RankCoord c = r.layout.coord(s.rank);
    std::vector<int> ids = s.ids;  // the replicas' GradReducer order: descending id
    std::sort(ids.rbegin(), ids.rend());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<BucketItem> items;
    for (int id : ids) {
      const stages::Param& p = s.graph->params[size_t(id)];
      const int64_t n = memory::shape_numel(p.shape);
      items.push_back({n, size_t(n) * memory::dtype_size(p.dtype), p.dtype, 0});
    }
    for (const std::vector<size_t>& cut : cut_buckets(items, options.bucket_bytes)) {
      Bucket b;
      b.dtype = items[cut[0]].dtype;
      for (size_t i : cut) {
        b.param_first.push_back(b.elements);
        b.param_numel.push_back(items[i].numel);
        b.elements += items[i].numel;
      }
      b.counts = bucket_parts(b.elements, g.comm->size(), servers);
      for (int k = 0; k < me; ++k) b.begin += b.counts[size_t(k)];
      const int64_t len = b.counts[size_t(me)];
      for (size_t j = 0; j < cut.size(); ++j) {
        const stages::Param& p = s.graph->params[size_t(ids[cut[j]])];
        const int64_t first = b.param_first[j], numel = b.param_numel[j];
        const int64_t lo = std::clamp(b.begin - first, int64_t(0), numel);
        const int64_t hi = std::clamp(b.begin + len - first, lo, numel);
        if (hi == lo) continue;
        // The executor's norm rule: a replicated parameter counts on tensor-parallel rank
        // 0 and tile 0 only.
        const bool norm = c.sp == 0 && (c.tp == 0 || p.is_shard());
        b.segments.push_back(
            {first + lo - b.begin, hi - lo, p.weight_decay, norm, stages::owner_layer(p)});
      }
      const bool adamw = opt_.kind == stages::OptimizerConfig::Kind::adamw;
      if (len > 0 && (adamw || opt_.sgd.momentum > 0)) b.m = Tensor::zeros({len}, b.dtype);
      if (len > 0 && adamw) b.v = Tensor::zeros({len}, b.dtype);
      b.master = Tensor::empty({len}, b.dtype);
      g.buckets.push_back(std::move(b));
    }
    groups_.push_back(std::move(g));
  }
}

void ParamServer::seed() {
  for (Group& g : groups_)
    for (Bucket& b : g.buckets) g.comm->scatter(Tensor(), b.master, 0, b.counts)->wait();
}

void ParamServer::push() {
  // The replicas' reduce-scatter of each bucket; this rank adds zeros (exact: a sum of two
  // replicas has allreduce's bits) and keeps its part.
  for (Group& g : groups_) {
    ServerWindow w;
    for (Bucket& b : g.buckets) {
      Tensor in = Tensor::zeros({b.elements}, b.dtype);
      Tensor part = in.narrow(0, b.begin, b.master.numel());
      Bucket* bp = &b;
      w.post(g.comm->reduce_scatter(in, part, transport::ReduceOp::sum, b.counts), in,
             [bp, part] { bp->grad = part.clone(); });
    }
    w.drain();
  }
}

void ParamServer::pull() {
  for (Group& g : groups_) {
    ServerWindow w;
    // GradReducer::gather_params (s = 0: the buckets of several parameters first, then
    // those of one) and post_pull (s > 0: in order): one all-gather per bucket.
    for (int pass = 0; pass < 2; ++pass)
      for (Bucket& b : g.buckets) {
        if (staleness_ == 0 && (b.param_first.size() > 1) != (pass == 0)) continue;
        if (staleness_ > 0 && pass == 1) continue;
        const uint64_t tag = uint64_t(&b - g.buckets.data());
        if (g.servers > 1) {  // the part straight to every replica (the update waits for it)
          Tensor empty;
          w.post(pull_bucket(*g.comm, b.master, empty, b.counts, g.servers, tag), b.master,
                 nullptr);
          continue;
        }
        Tensor out = Tensor::empty({b.elements}, b.dtype);
        Tensor in = out.narrow(0, b.begin, b.master.numel());
        in.copy_from(b.master);
        w.post(g.comm->all_gather(in, out, b.counts), out, nullptr);
      }
    w.drain();
  }
}

StepStats ParamServer::step(int64_t step) {
  StepStats st;
  st.step = step;
  if (!seeded_) {
    seeded_ = true;
    seed();
  }
  push();
  // The executor's norm pieces per layer and loss slots (Executor::finish_step): this
  // rank's parts' pieces, no loss.
  std::vector<double> v(size_t(layers_ + loss_slots_), 0.0);
  for (Group& g : groups_)
    for (Bucket& b : g.buckets)
      for (const Segment& sg : b.segments)
        if (sg.norm) v[size_t(sg.layer)] += kernels::sum_squares(b.grad.narrow(0, sg.at, sg.len));
  Tensor combined = Tensor::from_vector(v, {int64_t(v.size())});
  world_->all_reduce(combined, transport::ReduceOp::sum)->wait();
  v = combined.to_vector<double>();
  double norm2 = 0;
  for (int l = 0; l < layers_; ++l) norm2 += v[size_t(l)];
  for (size_t k = size_t(layers_); k < v.size(); ++k) st.loss += v[k];
  st.micro_batch_losses.assign(v.begin() + layers_, v.end());
  const UpdateDecision d = decide_update(norm2, grad_clip_, nullptr);
  st.grad_norm = d.grad_norm;
  st.skipped = !d.apply;
  if (d.apply) {
    ++steps_;
    for (Group& g : groups_)
      for (Bucket& b : g.buckets)
        for (const Segment& sg : b.segments) {
          Tensor value = b.master.narrow(0, sg.at, sg.len);
          const Tensor grad = b.grad.narrow(0, sg.at, sg.len);
          Tensor m = b.m.defined() ? b.m.narrow(0, sg.at, sg.len) : Tensor();
          if (opt_.kind == stages::OptimizerConfig::Kind::adamw) {
            kernels::AdamW cfg = opt_.adamw;
            if (!sg.decay) cfg.weight_decay = 0;
            Tensor vv = b.v.narrow(0, sg.at, sg.len);
            kernels::adamw_step(value, grad, m, vv, cfg, steps_, d.grad_scale);
          } else {
            kernels::Sgd cfg = opt_.sgd;
            if (!sg.decay) cfg.weight_decay = 0;
            kernels::sgd_step(value, grad, m, cfg, d.grad_scale);
          }
        }
  }
  for (Group& g : groups_)
    for (Bucket& b : g.buckets) b.grad = Tensor();
  pull();
  return st;
}

double ParamServer::evaluate_batch() {
  // Executor::finish_evaluation's sum of the loss slots.
  Tensor t = Tensor::from_vector(std::vector<double>(size_t(loss_slots_), 0.0), {loss_slots_});
  world_->all_reduce(t, transport::ReduceOp::sum)->wait();
  double loss = 0;
  for (double x : t.to_vector<double>()) loss += x;
  return loss;
}

int64_t ParamServer::state_bytes() const {
  int64_t n = 0;
  for (const Group& g : groups_)
    for (const Bucket& b : g.buckets)
      for (const Tensor* t : {&b.master, &b.m, &b.v})
        if (t->defined()) n += int64_t(t->nbytes());
  return n;
}

}  // namespace baton::engine::detail
