#include "engine/rank_engine.h"

#include <algorithm>
#include <set>

#include "memory/error.h"
#include "partitioner/evaluate.h"
#include "partitioner/routing.h"
#include "schedule/forward_only.h"
#include "schedule/lower.h"
#include "schedule/validate.h"
#include "stages/ops/halo.h"
#include "stages/param_owner.h"
#include "transport/pair_routes.h"

namespace baton::engine {

using partitioner::GradientGroup;
using partitioner::RankStage;
using partitioner::ResolvedPlan;

// The spatial group's communicator, recording each halo receive (from posting it to the
// op finding its data there) on the executor's timeline as HALO_F / HALO_B of its
// micro-batch, so the time the convolutions and poolings wait for halos is visible beside
// the compute.
// It reads the micro-batch (mod 32) and the direction from the tag the halo messages use
// (stages/ops/spatial.cpp: bits 2..6 and 0..1). Everything else passes through. It is
// also the ops' SpatialTracer (stages/ops/halo.h): the rows a convolution or pooling
// computes while its halo is in flight, INTERIOR_F / INTERIOR_B on the compute lane.
class HaloTimelineComm final : public transport::Communicator, public stages::ops::SpatialTracer {
 public:
  double now() const override { return exec_ != nullptr ? exec_->now() : 0.0; }
  void record(const std::string& label, int micro_batch, double start, double end) override {
    if (exec_ == nullptr) return;
    schedule::TimelineEvent e;
    e.lane = 0;
    e.label = label;
    e.micro_batch = micro_batch;
    e.start = start;
    e.end = end;
    exec_->add_event(std::move(e));
  }

  HaloTimelineComm(transport::CommPtr inner, std::vector<int> world)
      : in_(std::move(inner)), world_(std::move(world)) {}
  void set_executor(Executor* e) { exec_ = e; }

  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  int global_rank(int r) const override { return in_->global_rank(r); }
  std::string backend() const override { return in_->backend(); }
  transport::WorkPtr isend(const memory::Tensor& t, int dst, uint64_t tag) override {
    return in_->isend(t, dst, tag);
  }
  transport::WorkPtr irecv(memory::Tensor& t, int src, uint64_t tag) override {
    transport::WorkPtr w = in_->irecv(t, src, tag);
    if (exec_ == nullptr) return w;
    return std::make_shared<Timed>(std::move(w), exec_, exec_->now(), world_[size_t(src)], tag);
  }
  transport::WorkPtr broadcast(memory::Tensor& t, int root) override {
    return in_->broadcast(t, root);
  }
  transport::WorkPtr all_reduce(memory::Tensor& t, transport::ReduceOp op) override {
    return in_->all_reduce(t, op);
  }
  transport::WorkPtr all_gather(const memory::Tensor& i, memory::Tensor& o,
                                std::span<const int64_t> counts) override {
    return in_->all_gather(i, o, counts);
  }
  transport::WorkPtr reduce_scatter(const memory::Tensor& i, memory::Tensor& o,
                                    transport::ReduceOp op,
                                    std::span<const int64_t> counts) override {
    return in_->reduce_scatter(i, o, op, counts);
  }
  transport::WorkPtr scatter(const memory::Tensor& i, memory::Tensor& o, int root,
                             std::span<const int64_t> counts) override {
    return in_->scatter(i, o, root, counts);
  }
  transport::WorkPtr gather(const memory::Tensor& i, memory::Tensor& o, int root,
                            std::span<const int64_t> counts) override {
    return in_->gather(i, o, root, counts);
  }
  transport::WorkPtr barrier() override { return in_->barrier(); }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    return in_->split(ranks);
  }
  std::optional<std::pair<int, std::string>> first_failure() const override {
    return in_->first_failure();
  }

 private:
  class Timed final : public transport::Work {
   public:
    Timed(transport::WorkPtr w, Executor* e, double start, int peer, uint64_t tag)
        : w_(std::move(w)), exec_(e), start_(start), peer_(peer), tag_(tag) {}
    bool test() override {
      const bool done = w_->test();
      if (done) finish();
      return done;
    }
    void wait() override {
      w_->wait();
      finish();
    }

   private:
    void finish() {
      if (recorded_) return;
      recorded_ = true;
      schedule::TimelineEvent e;
      e.lane = 1;
      e.kind = (tag_ & 3) < 2 ? schedule::ActionKind::recv_activation
                              : schedule::ActionKind::recv_gradient;
      e.label = (tag_ & 3) < 2 ? "HALO_F" : "HALO_B";
      e.micro_batch = int((tag_ >> 2) & 0x1f);
      e.peer = peer_;
      e.start = start_;
      e.end = exec_->now();
      exec_->add_event(std::move(e));
    }
    transport::WorkPtr w_;
    Executor* exec_;
    double start_;
    int peer_;
    uint64_t tag_;
    bool recorded_ = false;
  };

  transport::CommPtr in_;
  std::vector<int> world_;  // group rank -> world rank
  Executor* exec_ = nullptr;
};

void check_world_size(const ResolvedPlan& r, int size) {
  if (size == r.world()) return;
  const int servers = r.plan.dp_sync.ps_ranks;
  throw InputError(r.plan.where("$.devices") + ": the plan has " + std::to_string(r.world()) +
                   " ranks" +
                   (servers > 0 ? " (" + std::to_string(r.layout.world()) + " training and " +
                                      std::to_string(servers) + " parameter-server)"
                                : std::string()) +
                   ", the job " + std::to_string(size) +
                   // One process: started without the launcher.
                   (size == 1 ? " (start its ranks with `baton launch -n " +
                                    std::to_string(r.world()) + " -- baton train --plan ...`)"
                              : std::string()));
}

RankEngine::RankEngine(std::shared_ptr<const ResolvedPlan> plan, transport::CommPtr world,
                       RankEngineOptions options)
    : plan_(std::move(plan)), world_(std::move(world)) {
  const ResolvedPlan& r = *plan_;
  check_world_size(r, world_->size());
  const int rank = world_->rank();
  view_ = rank_view(r, rank);
  graph_ = physical_graph(r, rank);
  const stages::Graph& g = *graph_;

  // ---- groups: the tensor-parallel group and every gradient group, made in one global
  // order (sorted member lists) so that no two ranks wait for each other's split.
  // (Under local SGD and gossip, only inside the replica: gradient_groups says so.)
  std::vector<GradientGroup> ggroups = gradient_groups(r, rank);
  const partitioner::DpSync& sync = r.plan.dp_sync;
  std::set<std::vector<int>> sets;
  if (view_.tp_group.size() > 1) sets.insert(view_.tp_group);
  // The replicas' own group: local SGD's syncs, and evaluating the first replica's
  // buffers (batch norm's running statistics) under any sync (evaluate()).
  const bool buffers = std::any_of(g.params.begin(), g.params.end(),
                                   [](const stages::Param& p) { return !p.trainable; });
  if ((sync.independent() || buffers) && view_.dp_group.size() > 1) sets.insert(view_.dp_group);
  for (const GradientGroup& gg : ggroups)
    if (gg.ranks.size() > 1) sets.insert(partitioner::reduction_members(r, rank, gg));
  device_world_ = options.device_world;
  transport::Communicator& data_comm = device_world_ ? *device_world_ : *world_;
  if (device_world_ && (device_world_->size() != world_->size() || device_world_->rank() != rank))
    throw RuntimeError("the device communicator's rank " + std::to_string(device_world_->rank()) +
                       " of " + std::to_string(device_world_->size()) +
                       " is not the world's rank " + std::to_string(rank) + " of " +
                       std::to_string(world_->size()));
  for (const std::vector<int>& members : sets) groups_[members] = data_comm.split(members);
  transport::Communicator* tp =
      view_.tp_group.size() > 1 ? groups_.at(view_.tp_group).get() : nullptr;
  // The spatial group (halos, spatial_mean) and the batch-norm group get communicators of
  // their own, never shared with a gradient group whose buckets are reduced meanwhile:
  // made after every rank's gradient groups, the spatial ones before the batch-norm ones,
  // each in one global order (every member's list is the same).
  if (view_.spatial_group.size() > 1) {
    halo_timeline_ = std::make_shared<HaloTimelineComm>(data_comm.split(view_.spatial_group),
                                                        view_.spatial_group);
    spatial_comm_ = halo_timeline_;
  }
  if (view_.batchnorm_group.size() > 1 && view_.batchnorm_group != view_.spatial_group)
    batchnorm_comm_ = data_comm.split(view_.batchnorm_group);

  // ---- stages
  for (const RankStage& rs : view_.stages) {
    stages::StageOptions so;
    so.seed = options.seed;
    so.device = options.device;
    so.master_dtype = options.master_dtype;
    so.recompute_layers = rs.recompute;
    so.tp = tp;
    so.spatial = spatial_comm_.get();
    so.batchnorm = batchnorm_comm_.get();
    so.profile = options.profile;
    auto st = std::make_unique<stages::Stage>(graph_, rs.first_layer, rs.last_layer, so);
    stages_[rs.stage] = std::move(st);
  }

  // ---- the executor
  ExecutorConfig c;
  schedule::LowerOptions lo;
  c.schedule = schedule::lower(r.schedule, lo);
  c.rank = view_.coord.pp;
  for (auto& [s, st] : stages_) c.stages[s] = st.get();
  c.p2p = &data_comm;
  std::set<std::pair<int, int>> pairs;  // (source, destination): both directions of each peer
  for (int b = 0; b < r.schedule.num_stages(); ++b) {
    std::vector<schedule::Transfer> routes = boundary_transfers(r, rank, b);
    for (const schedule::Transfer& t : routes) {
      pairs.insert({rank, t.peer});
      pairs.insert({t.peer, rank});
    }
    if (!routes.empty()) c.routes[b] = std::move(routes);
  }
  // Made by every rank after all its groups (route_pairs_apart orders the pairs itself).
  if (options.split_p2p_pair) {
    transport::CommPtr base = device_world_ ? device_world_ : world_;
    p2p_routes_ = transport::route_pairs_apart(
        base, pairs, [&](const std::vector<int>& m) { return options.split_p2p_pair(*base, m); });
    c.p2p = p2p_routes_.get();
  }
  // ZeRO: which parameters have their optimizer state sharded (partitioner/groups.h).
  std::map<std::pair<std::vector<int>, bool>, GradGroup> by_members;
  for (const GradientGroup& gg : ggroups) {
    if (gg.ranks.size() <= 1 && gg.local_stages.size() <= 1) continue;
    int id = g.find_param(gg.name);
    BATON_CHECK(id >= 0, "physical graph lacks parameter " + gg.name);
    const bool shard = partitioner::optimizer_sharded(r, rank, gg);
    // Sharded over the tiles too: every tile holds a part of the state and of the norm.
    if (shard && r.partial_grad(view_.coord.pp, gg.param)) tile_shards_.insert(id);
    const std::vector<int> members = partitioner::reduction_members(r, rank, gg);
    GradGroup& out = by_members[{members, shard}];
    if (gg.ranks.size() > 1) out.comm = groups_.at(members).get();
    out.shard = shard;
    out.servers = int(members.size() - gg.ranks.size());  // extra parameter-server ranks
    out.shard_grads = shard && r.plan.optimizer_sharding == partitioner::OptimizerSharding::zero2;
    out.params.push_back(id);
  }
  for (auto& [members, gg] : by_members) c.grad_groups.push_back(gg);
  c.bucket_bytes = options.bucket_bytes;
  c.micro_batch_size = r.plan.micro_batch_size;
  c.first_micro_batch = int64_t(view_.coord.dp) * r.plan.micro_batches;
  c.global_batch = r.plan.global_batch > 0
                       ? r.plan.global_batch
                       : int64_t(r.plan.dp) * r.plan.micro_batches * r.plan.micro_batch_size;
  // The loss counts every target of the global batch (cross-entropy's targets per sample).
  const stages::Graph& lg = *r.graph;
  const stages::Node& ce = lg.nodes[size_t(lg.values[size_t(lg.loss)].producer)];
  const stages::Value& targets = lg.values[size_t(ce.inputs[1])];
  c.loss_tokens = double(c.global_batch * memory::shape_numel(targets.type.shape));
  c.inputs = tile_inputs(options.inputs, options.inputs_tiled);
  c.input_ahead = options.input_ahead;
  c.input_staging = options.input_staging;
  if (!c.input_staging && options.device.is_cuda()) {
    const int device = options.device.index;
    c.input_staging = [device] { return memory::cuda_staging_backend(device); };
  }
  c.recv_ahead = options.recv_ahead;
  c.step_comm = world_.get();
  c.num_layers = g.num_layers();
  c.loss_slots = int64_t(r.plan.dp) * r.plan.micro_batches;
  c.contribute_norm = view_.coord.dp == 0;
  // A tile's loss and (summed) gradients are its group's: the first tile counts them.
  const bool first_tp = view_.coord.tp == 0, first_tile = view_.coord.sp == 0;
  c.norm_counts = [graph = graph_, first_tp, first_tile, tiles = tile_shards_](int id) {
    return (first_tile || tiles.count(id)) && (first_tp || graph->params[size_t(id)].is_shard());
  };
  c.contribute_loss = first_tp && first_tile;
  c.grad_clip = options.grad_clip;
  c.post_validated = r.plan.post_validated_step;
  c.loss_scaler = options.loss_scaler;
  if (sync.independent()) {
    c.dp_sync.local = true;
    c.dp_sync.gossip = sync.mode == partitioner::DpSync::Mode::gossip;
    c.dp_sync.peers = sync.peers;
    c.dp_sync.seed = sync.seed;
    c.dp_sync.sync_every = sync.sync_every;
    c.dp_sync.nesterov = sync.outer == partitioner::DpSync::Outer::nesterov;
    c.dp_sync.outer_lr = sync.outer_lr;
    c.dp_sync.outer_momentum = sync.outer_momentum;
    c.dp_sync.replica_comm = view_.dp_group.size() > 1 ? groups_.at(view_.dp_group).get() : nullptr;
    c.dp_sync.replicas = r.plan.dp;
    c.dp_sync.replica = view_.coord.dp;
  }
  if (sync.parameter_server()) c.dp_sync.max_staleness = sync.max_staleness;
  c.timeline_rank = rank;
  if (options.eval_inputs) {
    // Evaluation: the same routes, micro-batches and loss slots, a forward-only list.
    ExecutorConfig e = c;
    e.schedule = schedule::lower(schedule::forward_only_like(r.schedule), lo);
    e.evaluation = true;
    e.grad_groups.clear();
    e.inputs = tile_inputs(options.eval_inputs, false);
    e.grad_clip = 0;
    e.loss_scaler = nullptr;
    e.dp_sync = DpSyncConfig{};
    eval_executor_ = std::make_unique<Executor>(std::move(e));
  }
  executor_ = std::make_unique<Executor>(std::move(c));
  if (halo_timeline_) halo_timeline_->set_executor(executor_.get());
  // The optimizer state after the executor: its reducer has set the shards (ZeRO), so
  // only they are allocated.
  for (auto& [s, st] : stages_) st->set_optimizer(options.optimizer);
}

InputTile input_tile(const partitioner::ResolvedPlan& r, int rank) {
  InputTile t;
  const partitioner::RankCoord c = r.layout.coord(rank);
  t.of = r.spatial_of(c.pp);
  if (t.of <= 1) return t;
  t.index = c.sp;
  for (int v : r.graph->inputs)
    if (r.tiled(c.pp, v)) t.names.insert(r.graph->values[size_t(v)].name);
  return t;
}

InputFn RankEngine::tile_inputs(InputFn inputs, bool tiled_already) const {
  if (!inputs || tiled_already) return inputs;
  const InputTile tile = input_tile(*plan_, view_.rank);
  if (tile.of <= 1) return inputs;
  // Whole images given: the tile keeps its rows (a copy, next to the whole image).
  return [inputs, tile](const stages::MicroBatch& mb, const std::vector<std::string>& names,
                        stages::TensorMap& out) {
    inputs(mb, names, out);
    for (auto& [name, t] : out)
      if (tile.names.count(name)) {
        const int64_t h = t.size(2) / tile.of;
        t = t.narrow(2, int64_t(tile.index) * h, h).contiguous();
      }
  };
}

RankEngine::~RankEngine() {
  // The executors (their loader threads, pending work) go before the stages they run.
  eval_executor_.reset();
  executor_.reset();
}

double RankEngine::evaluate(int64_t batches) {
  BATON_CHECK(eval_executor_ != nullptr, "evaluate() needs RankEngineOptions::eval_inputs");
  BATON_CHECK(batches > 0, "evaluation batches");
  // Under local SGD and gossip each replica holds its own parameters between syncs, and
  // under any sync its own buffers (batch norm's running statistics, without
  // sync_batchnorm): the mean of each one's loss on its share of the batch had been the
  // loss of no model. Every replica evaluates the first replica's (those checkpoints write
  // and export reads), so the loss is that model's on the whole batch; the others keep a
  // copy of their own, in host memory (the device's holds what the plan's estimate counts).
  const bool every_param = executor_->config().dp_sync.local;
  const auto group = groups_.find(view_.dp_group);
  transport::Communicator* replicas =
      view_.dp_group.size() > 1 && group != groups_.end() ? group->second.get() : nullptr;
  std::vector<std::pair<memory::Tensor*, memory::Tensor>> own;  // (a parameter, its own value)
  bool swapped = false;
  if (replicas) {
    std::vector<transport::WorkPtr> works;
    for (auto& [s, st] : stages_)
      for (int id : st->param_ids()) {
        if (!every_param && st->graph().params[size_t(id)].trainable) continue;
        memory::Tensor& p = st->param(id);
        if (replicas->rank() != 0)
          own.emplace_back(&p, p.device().is_cpu() ? p.clone() : p.to(memory::Device::cpu()));
        works.push_back(replicas->broadcast(p, 0));
      }
    for (auto& w : works) w->wait();
    swapped = !works.empty();
  }
  auto restore = [&] {
    for (auto& [p, mine] : own) p->copy_from(mine);
    for (auto& [s, st] : stages_) st->mark_working_stale();
  };
  double sum = 0;
  try {
    for (int64_t k = 0; k < batches; ++k)
      sum += eval_executor_->run_step(k, k + 1 < batches ? k + 1 : -1).loss;
  } catch (...) {
    if (swapped) restore();
    throw;
  }
  if (swapped) restore();
  return sum / double(batches);
}

bool RankEngine::writes(int stage, int param) const {
  if (view_.coord.dp != 0) return false;
  return writes_block(stage, param);
}

bool RankEngine::writes_state_part(int stage, int param) const {
  return executor_->optimizer_sharded(stage, param) &&
         writes_block(stage, param, tile_shards_.count(param) > 0);
}

bool RankEngine::writes_block(int stage, int param, bool every_tile) const {
  const ResolvedPlan& r = *plan_;
  if (schedule::stage_direction(r.schedule, stage) != 0) return false;
  const stages::Param& p = graph_->params[size_t(param)];
  if (!p.is_shard() && view_.coord.tp != 0) return false;
  if (view_.coord.sp != 0 && !every_tile) return false;  // tiles hold equal copies
  return stages::owns_param(*stages_.at(stage), param);
}

}  // namespace baton::engine
