#include "engine/detail/param_server.h"

#include <algorithm>
#include <chrono>
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
      scaler_(options.scaler),
      master_dtype_(options.master_dtype),
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
    graphs_.push_back(graph);
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
            {first + lo - b.begin, hi - lo, p.weight_decay, norm, stages::owner_layer(p), &p, lo});
      }
      b.master = Tensor::empty({len}, master_dtype_);
      g.buckets.push_back(std::move(b));
    }
    groups_.push_back(std::move(g));
  }
  allocate_state();
}

void ParamServer::allocate_state() {
  const bool adamw = opt_.kind == stages::OptimizerConfig::Kind::adamw;
  for (Group& g : groups_)
    for (Bucket& b : g.buckets) {
      const int64_t len = b.master.numel();
      const memory::DType dt = master_dtype_;
      b.m = len > 0 && (adamw || opt_.sgd.momentum != 0) ? Tensor::zeros({len}, dt) : Tensor();
      b.v = len > 0 && adamw ? Tensor::zeros({len}, dt) : Tensor();
    }
}

void ParamServer::set_optimizer(const stages::OptimizerConfig& config, int64_t steps) {
  opt_ = config;
  steps_ = steps;
  allocate_state();
}

std::vector<stages::ParamPart> ParamServer::state_parts(bool writer) {
  // The stages' state names (Stage::optimizer_state): torch's.
  const bool adamw = opt_.kind == stages::OptimizerConfig::Kind::adamw;
  std::vector<stages::ParamPart> out;
  for (Group& g : groups_)
    for (Bucket& b : g.buckets)
      for (const Segment& sg : b.segments) {
        if (writer && !sg.norm) continue;
        auto add = [&](const char* state, const Tensor& t) {
          if (t.defined())
            out.push_back({sg.param, sg.param->name + ":" + state, t.narrow(0, sg.at, sg.len),
                           sg.lo, sg.lo + sg.len});
        };
        add(adamw ? "exp_avg" : "momentum_buffer", b.m);
        if (adamw) add("exp_avg_sq", b.v);
      }
  return out;
}

std::vector<int64_t> ParamServer::part_sizes() const {
  std::vector<int64_t> out;
  for (const Group& g : groups_)
    for (const Bucket& b : g.buckets) out.push_back(b.master.numel());
  return out;
}

void ParamServer::restore_pulls(const std::vector<std::vector<Tensor>>& pulls) {
  BATON_CHECK(history_.empty() && !seeded_, "parameter-server pulls restored after a step");
  BATON_CHECK(pulls.size() <= size_t(staleness_), "more parameter-server pulls than the staleness");
  const std::vector<int64_t> sizes = part_sizes();
  for (const std::vector<Tensor>& p : pulls) {
    BATON_CHECK(p.size() == sizes.size(), "a parameter-server pull of the wrong buckets");
    std::vector<Tensor> parts;
    for (size_t i = 0; i < p.size(); ++i) parts.push_back(p[i].to(master_dtype()));
    post_pull(parts);
    history_.push_back(parts);
  }
  restored_masters_ = !pulls.empty();
}

double ParamServer::now() {
  return double(std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count()) *
         1e-9;
}

void ParamServer::record(const char* label, schedule::ActionKind kind, int lane, int group,
                         double start) {
  if (!recording_) return;
  schedule::TimelineEvent e;
  e.rank = world_->rank();
  e.lane = lane;
  e.kind = kind;
  e.micro_batch = group;
  e.label = label;
  e.start = start;
  e.end = now();
  events_.push_back(e);
}

void ParamServer::seed() {
  for (Group& g : groups_)
    for (Bucket& b : g.buckets) g.comm->scatter(Tensor(), b.master, 0, b.counts)->wait();
}

void ParamServer::push() {
  // The replicas' reduce-scatter of each bucket; this rank adds zeros (exact: a sum of two
  // replicas has allreduce's bits) and keeps its part.
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    const double t0 = recording_ ? now() : 0;
    ServerWindow w;
    for (Bucket& b : g.buckets) {
      Tensor in = Tensor::zeros({b.elements}, b.dtype);
      Tensor part = in.narrow(0, b.begin, b.master.numel());
      Bucket* bp = &b;
      w.post(g.comm->reduce_scatter(in, part, transport::ReduceOp::sum, b.counts), in,
             [bp, part] { bp->grad = part.clone(); });
    }
    w.drain();
    record("PUSH", schedule::ActionKind::reduce_gradients, 1, int(gi), t0);
  }
}

void ParamServer::pull() {
  std::vector<Tensor> parts;
  for (Group& g : groups_)
    for (Bucket& b : g.buckets) parts.push_back(b.master);
  if (staleness_ > 0) {
    // The replicas receive this pull s steps later: kept until then (a checkpoint's). The
    // oldest goes first, so that no more than s copies are ever held.
    while (history_.size() >= size_t(staleness_)) history_.pop_front();
    for (Tensor& t : parts) t = t.clone();
    history_.push_back(parts);
  }
  post_pull(parts);
}

void ParamServer::post_pull(const std::vector<Tensor>& parts) {
  BATON_CHECK(parts.size() == part_sizes().size(), "a parameter-server pull of the wrong buckets");
  size_t k = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    const double t0 = recording_ ? now() : 0;
    ServerWindow w;
    // GradReducer::gather_params (s = 0: the buckets of several parameters first, then
    // those of one) and post_pull (s > 0: in order): one all-gather per bucket.
    const size_t first = k;
    for (int pass = 0; pass < 2; ++pass) {
      k = first;
      for (Bucket& b : g.buckets) {
        const Tensor& part = parts[k++];
        if (staleness_ == 0 && (b.param_first.size() > 1) != (pass == 0)) continue;
        if (staleness_ > 0 && pass == 1) continue;
        BATON_CHECK(part.numel() == b.master.numel(), "a parameter-server part of the wrong size");
        const uint64_t tag = uint64_t(&b - g.buckets.data());
        if (g.servers > 1) {  // the part straight to every replica (the update waits for it)
          Tensor empty;
          w.post(pull_bucket(*g.comm, part, empty, b.counts, g.servers, tag), part, nullptr);
          continue;
        }
        Tensor out = Tensor::empty({b.elements}, b.master.dtype());
        Tensor in = out.narrow(0, b.begin, b.master.numel());
        in.copy_from(part);
        w.post(g.comm->all_gather(in, out, b.counts), out, nullptr);
      }
    }
    w.drain();
    record("PULL", schedule::ActionKind::reduce_gradients, 1, int(gi), t0);
  }
}

StepStats ParamServer::step(int64_t step) {
  StepStats st;
  st.step = step;
  if (!seeded_) {
    seeded_ = true;
    seed();
    if (restored_masters_) {  // a resume's newest pull in flight: the masters
      size_t k = 0;
      for (Group& g : groups_)
        for (Bucket& b : g.buckets) b.master.copy_from(history_.back()[k++]);
    }
  }
  push();
  const double update_start = recording_ ? now() : 0;
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
  const UpdateDecision d = decide_update(norm2, grad_clip_, scaler_);
  st.grad_norm = d.grad_norm;
  st.loss_scale = d.loss_scale;
  st.skipped = !d.apply;
  if (d.apply) {
    ++steps_;
    for (Group& g : groups_)
      for (Bucket& b : g.buckets)
        for (const Segment& sg : b.segments) {
          Tensor value = b.master.narrow(0, sg.at, sg.len);
          Tensor grad = b.grad.narrow(0, sg.at, sg.len);
          if (grad.dtype() != value.dtype()) {  // mixed precision: as Stage::step
            Tensor wide = Tensor::empty(grad.shape(), value.dtype());
            kernels::cast(grad, wide);
            grad = wide;
          }
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
  record("", schedule::ActionKind::optimizer_step, 0, -1, update_start);
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
