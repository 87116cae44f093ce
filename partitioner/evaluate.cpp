#include "partitioner/evaluate.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "memory/allocator.h"
#include "memory/error.h"
#include "memory/units.h"
#include "partitioner/fusion.h"
#include "partitioner/groups.h"
#include "partitioner/routing.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/transfer.h"
#include "stages/model.h"
#include "stages/stash_plan.h"
#include "transport/collective_memory.h"

namespace baton::partitioner {

using stages::Graph;

int64_t PlanEstimate::max_peak() const {
  int64_t m = 0;
  for (const RankEstimate& r : ranks) m = std::max(m, r.peak);
  return m;
}

std::shared_ptr<stages::Graph> physical_graph(const ResolvedPlan& r, int rank) {
  RankCoord c = r.layout.coord(rank);
  std::shared_ptr<stages::Graph> g;
  if (r.spatial_of(c.pp) <= 1)
    g = shard_graph(r, c.tp);
  else if (r.plan.tp[size_t(c.pp)] > 1)
    g = build_spatial(*shard_graph(r, c.tp), r.shard_spatial[size_t(c.pp)], c.sp);
  else
    g = build_spatial(*r.graph, r.spatial[size_t(c.pp)], c.sp);
  // Batch-norm statistics over the replicas too: every batchnorm2d reduces over the
  // rank's batch-norm group (RankView::batchnorm_group).
  if (r.plan.sync_batchnorm && r.plan.dp > 1) sync_batchnorm(*g);
  // The fused kernels where the rank's split leaves their pairs intact (partitioner/fusion.h).
  return fuse_kernels(*g);
}

namespace {

int64_t rounded(int64_t bytes) {
  return int64_t(memory::Allocator::rounded(size_t(bytes == 0 ? 1 : bytes)));
}

// Extra server ranks (dp_sync ps_ranks > 0): the served gradient bytes of each pipeline
// rank of a replica (its stages' parameters; each of its tensor-parallel ranks and tiles
// holds as many) and their total over one replica, what the servers hold in all.
struct PsServedBytes {
  std::map<int, double> rank;
  double total = 0;
};
PsServedBytes ps_served_bytes(const ResolvedPlan& r, const CostTable& t) {
  PsServedBytes out;
  if (!r.plan.dp_sync.parameter_server() || r.plan.dp_sync.ps_ranks <= 0 || r.plan.dp <= 1)
    return out;
  for (int s = 0; s < r.schedule.num_stages(); ++s) {
    const int k = r.chunk_of_stage[size_t(s)], q = r.schedule.placement[size_t(s)];
    const double grads = double(t.param_bytes(r.chunk_first[size_t(k)], r.chunk_last[size_t(k)]));
    out.rank[q] += grads;
    out.total += grads * r.layout.width(q);
  }
  return out;
}

// STEP's norm pieces per layer and loss slots (Executor::finish_step, ParamServer::step),
// all-reduced over the world: the vector and the all-reduce's scratch.
int64_t step_vector_bytes(const ResolvedPlan& r, int layers) {
  const int64_t slots = int64_t(layers) + int64_t(r.plan.dp) * r.plan.micro_batches;
  return rounded(slots * 8) + int64_t(transport::collective_scratch_bytes(
                                  transport::Collective::all_reduce, size_t(slots), 8, r.world()));
}

}  // namespace

int64_t ps_server_peak_bound(const ResolvedPlan& r, const CostTable& t, int optimizer_states,
                             size_t bucket_bytes) {
  const PsServedBytes served = ps_served_bytes(r, t);
  if (served.total <= 0) return 0;
  const int64_t n = r.plan.dp_sync.ps_ranks, cap = int64_t(bucket_bytes);
  // Each rank's served parameters are cut into buckets at bucket_bytes (two in a row hold
  // more), each bucket's part rounded up by at most 128 bytes; a bucket is at most
  // bucket_bytes or one parameter, and at most a rank's served bytes.
  int64_t buckets = 0, rank_bytes = 0, largest = cap;
  for (const auto& [q, bytes] : served.rank) {
    buckets += r.layout.width(q) * (2 * int64_t(bytes) / cap + 1);
    rank_bytes = std::max(rank_bytes, int64_t(bytes));
  }
  for (int64_t b : t.own_param_bytes) largest = std::max(largest, b);
  for (const ParamUse& u : t.shared_params) largest = std::max(largest, u.bytes);
  const int64_t part = (int64_t(served.total) + n - 1) / n + 128 * buckets;
  const int64_t bucket = rounded(std::min(largest, rank_bytes));
  // As evaluate_plan's server walk, each term at its largest: `part` bytes each as
  // parameter, summed gradient, optimizer state and each of the s pulls it keeps, two
  // whole buckets in flight and a push's reduce-scatter scratch (bytes as 4-byte
  // elements: its size in bytes does not depend on the element size), STEP's vector.
  const int64_t scratch = int64_t(transport::reduce_scatter_scratch_bound(
      size_t(bucket + 3) / 4, 4, r.plan.dp + int(n), int(n)));
  return part * (2 + optimizer_states + r.plan.dp_sync.max_staleness) + 2 * bucket + scratch +
         step_vector_bytes(r, r.graph->num_layers());
}

namespace {
// The plan's ranks on one host: all of them unless Machine::ranks_per_host says fewer.
int ranks_per_host(const ResolvedPlan& r, const Machine& m) {
  return m.ranks_per_host > 0 ? std::min(m.ranks_per_host, r.world()) : r.world();
}
}  // namespace

double compute_slowdown(const ResolvedPlan& r, const Machine& m) {
  const int host_ranks = ranks_per_host(r, m);
  if (core_ranks(r.layout, m).empty()) return colocation_slowdown(m, host_ranks);
  // A measured count above the cores holds their time-slicing, which the simulator models:
  // divided out. Beyond the largest count measured, that count's contention: one at most
  // the cores holds no time-slicing to divide out (1.5 measured at 2 ranks on 2 cores had
  // been divided by 6 / 2 at 6 ranks, to 1, and plans of more ranks than cores were
  // predicted faster than the 2-rank ones they ran slower than).
  const int measured = m.colocated.empty() ? 1 : m.colocated.rbegin()->first;
  const int at = std::min(host_ranks, measured);
  return std::max(1.0, colocation_slowdown(m, at) * std::min(1.0, double(m.cores_per_host) / at));
}

SpatialLayerExtra spatial_layer_extra(const Graph& g, const SpatialSplit& split, int layer,
                                      int64_t batch, const Sharding* sharding, const Machine& m,
                                      int host_ranks) {
  const double halo = spatial_halo_bytes(g, split, layer, layer + 1, batch, sharding) /
                      std::max(m.tp_bandwidth, 1.0);
  const SpatialExchanges ex = spatial_exchanges(g, split, layer, layer + 1);
  const double each = spatial_exchange_extra(m, split.degree, host_ranks);
  return {halo + ex.forward * each, halo + ex.backward * each};
}

schedule::Costs schedule_costs(const ResolvedPlan& r, const CostTable& t, const Machine& m,
                               const std::vector<StageMemory>& stage_mem) {
  const int n = r.schedule.num_stages();
  schedule::Costs c;
  c.forward.assign(size_t(n), 0);
  c.backward_input = c.backward_weight = c.activation_bytes = c.activation_bytes_after_b =
      c.message_bytes = c.reduce = c.forward;
  const int opt = optimizer_states(r.plan.optimizer);
  std::map<int, double> rank_state, rank_gather, rank_copy, rank_pull, rank_compute;
  const bool local = r.plan.dp_sync.independent();
  const PsServedBytes served = ps_served_bytes(r, t);
  // The ranks sharing a host slow each other's compute (cores, memory bandwidth). With
  // more ranks than cores the simulator shares the cores among the ranks computing, so
  // the ops carry only what the copies measured beyond their fair share of the cores.
  const int host_ranks = ranks_per_host(r, m);
  c.core_ranks = core_ranks(r.layout, m);
  const double slow = compute_slowdown(r, m);
  // Stages holding one tied parameter reduce it together: one group (its first holder's
  // id) for every stage it joins.
  c.reduce_group.assign(size_t(n), -1);
  for (const ParamUse& u : t.shared_params) {
    std::vector<int> holders;
    for (int s = 0; s < n; ++s) {
      const int k = r.chunk_of_stage[size_t(s)];
      const int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
      if (std::any_of(u.layers.begin(), u.layers.end(), [&](int l) { return l >= a && l < b; }))
        holders.push_back(s);
    }
    if (holders.size() < 2) continue;
    const int first = c.reduce_group[size_t(holders[0])];
    const int g = first >= 0 ? first : holders[0];
    for (int h : holders) {
      const int old = c.reduce_group[size_t(h)];
      if (old >= 0 && old != g)
        for (int& x : c.reduce_group)
          if (x == old) x = g;
      c.reduce_group[size_t(h)] = g;
    }
  }
  // The pipeline ranks holding each chunk: two for DualPipe (one per direction), whose
  // copies sum their gradients, as replicas do, every step.
  std::map<int, std::set<int>> chunk_ranks;
  for (int s = 0; s < n; ++s)
    chunk_ranks[r.chunk_of_stage[size_t(s)]].insert(r.schedule.placement[size_t(s)]);
  for (int s = 0; s < n; ++s) {
    int k = r.chunk_of_stage[size_t(s)];
    int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
    const int copies = int(chunk_ranks[k].size());
    const std::set<int>& rc = r.recompute[size_t(k)];
    // What each tensor-parallel collective costs among the host's ranks beyond its
    // analytic time (Machine::tp_collective), on F and B of the layers holding them.
    auto extra = [&](int l, bool forward) {
      const LayerCost& lc = t.layers[size_t(l)];
      const int count = forward ? lc.tp_forward_collectives : lc.tp_backward_collectives;
      return count > 0 ? count * tp_collective_extra(m, lc.tp, host_ranks) : 0.0;
    };
    double extra_f = 0, extra_b = 0;
    for (int l = a; l < b; ++l) {
      extra_f += extra(l, true);
      extra_b += extra(l, false);
    }
    c.forward[size_t(s)] = slow * (t.pf[size_t(b)] - t.pf[size_t(a)] + extra_f);
    c.backward_input[size_t(s)] = slow * (t.pb[size_t(b)] - t.pb[size_t(a)] + extra_b);
    c.backward_weight[size_t(s)] = slow * (t.pw[size_t(b)] - t.pw[size_t(a)]);
    for (int l : rc)  // recompute runs F again
      c.backward_input[size_t(s)] += slow * (t.layers[size_t(l)].f + extra(l, true));
    // A tile computes 1/s of the convolutions (the head after the pooling, replicated, is
    // small beside them), plus its halos and exchanges (spatial_layer_extra), a recomputed
    // layer's F again in B; slowed like the ops, as the search's tile tables are.
    if (const int d = r.spatial_of(r.schedule.placement[size_t(s)]); d > 1) {
      const SpatialSplit& split = r.spatial[size_t(r.schedule.placement[size_t(s)])];
      double fx = 0, bx = 0;
      for (int l = a; l < b; ++l) {
        const SpatialLayerExtra e = spatial_layer_extra(*r.graph, split, l, r.plan.micro_batch_size,
                                                        &r.sharding, m, host_ranks);
        fx += e.forward;
        bx += e.backward + (rc.count(l) ? e.forward : 0.0);
      }
      c.forward[size_t(s)] = c.forward[size_t(s)] / d + slow * fx;
      c.backward_input[size_t(s)] = c.backward_input[size_t(s)] / d + slow * bx;
      c.backward_weight[size_t(s)] /= d;
    }
    if (!stage_mem.empty()) {
      c.activation_bytes[size_t(s)] = double(stage_mem[size_t(s)].mb.stash);
      c.activation_bytes_after_b[size_t(s)] = double(stage_mem[size_t(s)].mb.w_stash);
    }
    // A tile sends its rows of the boundary: 1/s of it on each of the group's links.
    c.message_bytes[size_t(s)] =
        t.cut_bytes[size_t(b)] / r.spatial_of(r.schedule.placement[size_t(s)]);
    rank_compute[r.schedule.placement[size_t(s)]] +=
        double(r.plan.micro_batches) / r.schedule.num_directions *
        (c.forward[size_t(s)] + c.backward_input[size_t(s)] + c.backward_weight[size_t(s)]);
    // Gradient reduction: over the data-parallel replicas, and over the other pipeline
    // ranks holding a tied parameter.
    double grads = double(t.param_bytes(a, b)), reduce = 0;
    for (const ParamUse& u : t.shared_params) {
      bool here = false, elsewhere = false;
      for (int l : u.layers) (l >= a && l < b ? here : elsewhere) = true;
      // (Local SGD sums a tied parameter inside the replica only.)
      if (here && elsewhere)
        reduce += all_reduce_time(double(u.bytes), local ? 2 : 2 * r.plan.dp, m.dp_bandwidth,
                                  m.dp_latency);
    }
    // The sharded optimizer (ZeRO): a reduce-scatter (half an all-reduce's traffic)
    // while the backward runs, each replica updates 1/dp of the state, and the parameters
    // are all-gathered (the other half) after the step, not overlapped. (DualPipe's
    // chunks live on two pipeline ranks: not sharded.)
    const bool zero = r.plan.sharding() != OptimizerSharding::none && r.plan.dp > 1 &&
                      r.chunk_on_one_rank(r.chunk_of_stage[size_t(s)]);
    const int rank_of = r.schedule.placement[size_t(s)];
    if (zero && served.total > 0) {
      // Extra server ranks: the push (the stage's share of the rank's) overlaps the
      // backward as zero1's reduce-scatter; the servers' update and the pull follow the
      // step (below); the replica copies the pulled parameters in and updates nothing.
      const double mine = served.rank.at(rank_of);
      const ServerTimes st =
          ps_server_times(r.plan.dp_sync, mine, served.total, r.plan.dp, m, opt, 0);
      reduce += mine > 0 ? st.push * grads / mine : 0;
      rank_state[rank_of] += grads * 2;
    } else if (zero) {
      // zero2: the reduce-scatter runs inside every micro-batch's W instead, waited for there.
      if (r.plan.sharding() == OptimizerSharding::zero2)
        c.backward_weight[size_t(s)] +=
            all_gather_time(grads, r.plan.dp, m.dp_bandwidth, m.dp_latency);
      else
        reduce += all_gather_time(grads, r.plan.dp, m.dp_bandwidth, m.dp_latency);
      // A parameter server's pull: what its staleness leaves exposed, below.
      rank_pull[rank_of] += all_gather_time(grads, r.plan.dp, m.dp_bandwidth, m.dp_latency);
      rank_state[rank_of] += grads * (2 + 1) + grads * 2 * opt / r.plan.dp;
      rank_copy[rank_of] += grads * (1 + opt) / r.plan.dp;
    } else if (local) {
      // Local SGD: no gradient all-reduce; every H steps the parameter deltas are
      // all-reduced after the optimizer step (not overlapped), amortised here per step,
      // and the outer step streams the anchor (and the momentum) with the parameters.
      // Gossip: its exchanges after every step, the averaging streaming the parameters.
      rank_gather[rank_of] +=
          dp_time_per_step(r.plan.dp_sync, grads, r.plan.dp, m.dp_bandwidth, m.dp_latency);
      if (copies > 1) reduce += all_reduce_time(grads, copies, m.dp_bandwidth, m.dp_latency);
      const bool nesterov =
          r.plan.dp_sync.local() && r.plan.dp_sync.outer == DpSync::Outer::nesterov;
      const int every = r.plan.dp_sync.local() ? r.plan.dp_sync.sync_every : 1;
      rank_state[rank_of] += grads * (2 + 2 * opt + 1) + grads * (nesterov ? 7 : 4) / every;
      rank_copy[rank_of] += grads * (1 + opt);
    } else {
      reduce += all_reduce_time(grads, r.plan.dp * copies, m.dp_bandwidth, m.dp_latency);
      rank_state[rank_of] += grads * (2 + 2 * opt + 1);
      rank_copy[rank_of] += grads * (1 + opt);
    }
    c.reduce[size_t(s)] = reduce;
  }
  // The all-gather after the step (zero1, zero2, a parameter server): waited for at once,
  // or, with a parameter server's staleness s, behind up to s steps of the rank's compute.
  for (const auto& [rank, pull] : rank_pull)
    rank_gather[rank] += ps_pull_exposed(r.plan.dp_sync, pull, rank_compute[rank]);
  // Extra server ranks: the servers' update and their pull, behind s steps of compute.
  for (const auto& [rank, bytes] : served.rank)
    rank_gather[rank] +=
        ps_server_times(r.plan.dp_sync, bytes, served.total, r.plan.dp, m, opt, rank_compute[rank])
            .exposed;
  // Each rank steps its own stages: a post-validated STEP ends by its own rank's time.
  // Post-validated: the update first copies what it overwrites (parameters and state).
  c.post_validated_step = r.plan.post_validated_step;
  c.optimizer_step_rank.assign(size_t(r.schedule.num_ranks), 0.0);
  for (const auto& [rank, bytes] : rank_state) {
    double& step = c.optimizer_step_rank[size_t(rank)];
    step = bytes / m.memory_bandwidth + rank_gather[rank];
    if (c.post_validated_step) step += 2 * rank_copy[rank] / m.memory_bandwidth;  // read, write
    c.optimizer_step = std::max(c.optimizer_step, step);
  }
  c.latency = m.p2p_latency;
  c.bandwidth = m.p2p_bandwidth;
  return c;
}

namespace {

// The allocator bytes of values `vs` of a micro-batch, each its own tensor.
int64_t values_bytes(const Graph& g, const std::vector<int>& vs, int64_t batch, int skip = -1) {
  int64_t b = 0;
  for (int v : vs)
    if (v != skip) b += rounded(g.values[size_t(v)].type.bytes(batch));
  return b;
}

// Calls close(parameters, elements, dtype) for each bucket the engine cuts `ids` into
// (gradient_buckets; `stage_of` given under ZeRO-2).
template <class Close>
void for_each_bucket(const Graph& pg, std::vector<int> ids, size_t bucket_bytes,
                     const std::map<int, int>* stage_of, Close close) {
  for (const std::vector<int>& b : gradient_buckets(pg, std::move(ids), bucket_bytes, stage_of)) {
    int64_t elements = 0;
    for (int id : b) elements += memory::shape_numel(pg.params[size_t(id)].shape);
    close(int(b.size()), elements, pg.params[size_t(b.front())].dtype);
  }
}

// The elements of each sharded parameter (ids of mg) that `rank` holds of its optimizer
// state (and under zero2 of its gradient), as the engine's GradReducer lays them out
// (shard_parts): the parameters one communicator shards form a group (under zero2 those
// held by several local stages one, the others another whose buckets are cut by stage).
// Empty with extra parameter-server ranks (the replicas hold none).
std::map<int, int64_t> sharded_parts(const ResolvedPlan& r, int rank, const Graph& mg,
                                     size_t bucket_bytes) {
  std::map<int, int64_t> out;
  const Plan& p = r.plan;
  if (p.sharding() == OptimizerSharding::none || p.dp <= 1 || p.dp_sync.ps_ranks > 0) return out;
  std::map<int, std::vector<int>> holders;  // parameter -> the stages of this rank holding it
  for (int s : r.stages_of(r.layout.coord(rank).pp)) {
    const int k = r.chunk_of_stage[size_t(s)];
    for (int id : mg.params_used(r.chunk_first[size_t(k)], r.chunk_last[size_t(k)]))
      holders[id].push_back(s);
  }
  std::map<std::vector<int>, std::vector<int>> groups;  // members -> parameters
  for (const GradientGroup& gg : gradient_groups(r, rank))
    if (gg.ranks.size() > 1 && optimizer_sharded(r, rank, gg))
      groups[gg.ranks].push_back(mg.find_param(gg.name));
  const bool zero2 = p.sharding() == OptimizerSharding::zero2;
  for (const auto& [members, ids] : groups) {
    const int n = int(members.size());
    const int me = int(std::find(members.begin(), members.end(), rank) - members.begin());
    std::vector<int> several, one;
    std::map<int, int> stage_of;
    for (int id : ids) {
      if (zero2 && holders[id].size() > 1) {
        several.push_back(id);
      } else {
        one.push_back(id);
        stage_of[id] = zero2 ? holders[id].front() : 0;
      }
    }
    out.merge(shard_parts(mg, several, bucket_bytes, n, me));
    out.merge(shard_parts(mg, one, bucket_bytes, n, me, &stage_of));
  }
  return out;
}

// A post-validated step copies what its update overwrites first: the elements of each
// trainable parameter it updates and their optimizer state (Executor::save_update_point),
// one tensor each, on every stage of the rank holding it. Under ZeRO, of a sharded
// parameter the rank's own part as the engine lays it out (sharded_parts; none of an empty
// part); one that zero1 leaves whole (tied over pipeline ranks, a DualPipe chunk's) whole
// (counted as 1/dp, GPT-2's tied wte of 4096 x 64 had been 1.5 MiB under). 0 for a
// synchronous step.
int64_t update_point_bytes(const ResolvedPlan& r, int rank, const Graph& pg, size_t bucket_bytes) {
  const Plan& p = r.plan;
  if (!p.post_validated_step) return 0;
  const int states = optimizer_states(p.optimizer);
  const std::map<int, int64_t> parts = sharded_parts(r, rank, pg, bucket_bytes);
  int64_t bytes = 0;
  for (int s : r.stages_of(r.layout.coord(rank).pp)) {
    const int k = r.chunk_of_stage[size_t(s)];
    for (int id : pg.params_used(r.chunk_first[size_t(k)], r.chunk_last[size_t(k)])) {
      const stages::Param& prm = pg.params[size_t(id)];
      if (!prm.trainable) continue;
      const auto part = parts.find(id);
      const int64_t n = part == parts.end() ? memory::shape_numel(prm.shape) : part->second;
      if (n > 0) bytes += int64_t(1 + states) * rounded(n * int64_t(memory::dtype_size(prm.dtype)));
    }
  }
  return bytes;
}

}  // namespace

RankBuffers rank_buffers(const ResolvedPlan& r, int rank, const Graph& pg,
                         const EvaluateOptions& o) {
  using schedule::ActionKind;
  RankBuffers out;
  const Plan& p = r.plan;
  const int64_t batch = p.micro_batch_size;
  const RankCoord coord = r.layout.coord(rank);
  const int pp = coord.pp;
  auto chunk = [&](int stage) {
    int k = r.chunk_of_stage[size_t(stage)];
    return std::pair{r.chunk_first[size_t(k)], r.chunk_last[size_t(k)]};
  };

  // The input loader (engine/detail/input_loader.cpp): its micro-batches at each action
  // (loader_micro_batches_at), each with the model inputs this rank's stages read; the
  // fewest of them held all the time, the rest at their actions. It had counted
  // min(input_ahead, m) + 1: one more than it holds at m = 1 and beyond input_ahead,
  // which hid a ResNet's uncounted argmax and statistics; then the most of the step
  // throughout, one micro-batch over where fewer than input_ahead are queued after the
  // first take (two micro-batches: three at the first F, two from the second on).
  std::set<int> inputs;
  std::vector<bool> reads(size_t(r.schedule.num_stages()), false);
  for (int s : r.stages_of(pp)) {
    auto [a, b] = chunk(s);
    for (int v : pg.inputs_used(a, b)) inputs.insert(v);
    reads[size_t(s)] = !pg.inputs_used(a, b).empty();
  }
  const std::vector<int> loaded =
      o.input_loader
          ? loader_micro_batches_at(r.schedule, pp, reads, o.input_ahead, p.device == "cuda")
          : std::vector<int>(r.schedule.ranks[size_t(pp)].size() + 1, 0);
  const int always = *std::min_element(loaded.begin(), loaded.end());
  const int64_t loaded_bytes =
      values_bytes(pg, std::vector<int>(inputs.begin(), inputs.end()), batch);
  // Of the c-th compute action of the rank's list (c past them all: the step's end).
  std::vector<size_t> computes;
  for (size_t i = 0; i < r.schedule.ranks[size_t(pp)].size(); ++i)
    if (schedule::is_compute(r.schedule.ranks[size_t(pp)][i].kind)) computes.push_back(i);
  // The executor keeps each micro-batch's loss from the F that makes it to the next step's
  // start (Executor::losses_), on the rank that computes it: at each action those of the
  // Fs before it (the F's walk counts its own). Counted as all of the step's throughout, a
  // ResNet's first pipeline rank under zb-v, whose peak is its fifth B, was 128 bytes over.
  std::vector<int64_t> losses(r.schedule.ranks[size_t(pp)].size() + 1, 0);
  if (pg.loss >= 0 && pg.values[size_t(pg.loss)].producer >= 0) {
    const int layer = pg.nodes[size_t(pg.values[size_t(pg.loss)].producer)].layer;
    const int64_t bytes = rounded(pg.values[size_t(pg.loss)].type.bytes(1));
    for (size_t i = 0; i < r.schedule.ranks[size_t(pp)].size(); ++i) {
      const schedule::Action& a = r.schedule.ranks[size_t(pp)][i];
      auto [first, last] = chunk(a.stage);
      const bool makes = a.kind == ActionKind::forward && layer >= first && layer < last;
      losses[i + 1] = losses[i] + (makes ? bytes : 0);
    }
  }

  // A micro-batch taken by one stage and kept for a later stage of the rank (a V's first
  // and last) is one TensorMap shared with the stage that took it, which stashes what it
  // reads (a stem's images, an embedding's token ids) until its B: those tensors are
  // counted there from the take on, so the loader's copy is only what that stage does not
  // keep (a ResNet's first pipeline rank under zb-v had been 12.8% over, two micro-batches
  // of images). Only while the stage still holds them: its B after the last take.
  const auto& rank_acts = r.schedule.ranks[size_t(pp)];
  std::vector<int64_t> shared(loaded.size(), 0);
  std::map<int, int64_t> stashed;  // reading stage -> the inputs its stash keeps
  {
    for (int s : r.stages_of(pp)) {
      if (!reads[size_t(s)]) continue;
      auto [a, b] = chunk(s);
      const stages::StashPlan plan =
          stages::plan_stash(pg, a, b, r.recompute[size_t(r.chunk_of_stage[size_t(s)])]);
      std::vector<int> kept;
      for (int v : pg.inputs_used(a, b))
        if (plan.kept[size_t(v)]) kept.push_back(v);
      stashed[s] = values_bytes(pg, kept, batch);
    }
    struct Span {
      size_t first = 0, last = 0, released = 0;
      int stage = -1;
    };
    std::map<int, Span> spans;  // micro-batch -> its takes and its first stage's B
    for (size_t i = 0; i < rank_acts.size(); ++i) {
      const schedule::Action& a = rank_acts[i];
      if (a.kind == ActionKind::forward && reads[size_t(a.stage)]) {
        auto [it, fresh] = spans.try_emplace(a.micro_batch, Span{i, i, 0, a.stage});
        if (!fresh) it->second.last = i;
      } else if (a.kind == ActionKind::backward_input || a.kind == ActionKind::full_backward) {
        auto it = spans.find(a.micro_batch);
        if (it != spans.end() && it->second.stage == a.stage && it->second.released == 0)
          it->second.released = i;
      }
    }
    std::vector<int64_t> diff(loaded.size() + 1, 0);
    for (const auto& [mb, sp] : spans)
      if (sp.first < sp.last && sp.released > sp.last) {
        diff[sp.first] += stashed[sp.stage];
        diff[sp.last] -= stashed[sp.stage];
      }
    int64_t open = 0;
    for (size_t i = 0; i < shared.size(); ++i) shared[i] = open += diff[i];
  }
  auto loaded_beyond = [&](size_t c) {
    const size_t at = c < computes.size() ? computes[c] : loaded.size() - 1;
    return int64_t(loaded[at] - always) * loaded_bytes - shared[at] + losses[at];
  };
  out.loader = int64_t(always) * loaded_bytes;
  // Without a loader (one process on a CPU) the running micro-batch's inputs live from its
  // F to the end of its backward: beside its stage's stash, what that does not keep (the
  // labels, the targets; a bound through the optimizer step, where none is held).
  if (!o.input_loader)
    for (const auto& [stage, kept] : stashed)
      out.loader = std::max(out.loader, loaded_bytes - kept);
  // A text loader makes a micro-batch's tokens and targets together and keeps what the rank
  // reads (engine/plan_trainer.cpp, inputs_of): the other one lives while a micro-batch is
  // made, whenever the loader's thread runs (a 64-byte block over the measured peak of a
  // first stage in about 1 run of 5). Images are made as read.
  if (!inputs.empty()) {
    std::vector<int> unread;
    bool images = false;
    for (int v : pg.inputs_used(0, pg.num_layers())) {
      images = images || pg.values[size_t(v)].name == "images";
      if (!inputs.count(v)) unread.push_back(v);
    }
    if (!images) out.loader += values_bytes(pg, unread, batch);
  }
  // Receives posted ahead (Executor::run_step): at each action, the next recv_ahead
  // receives of the lowered list, each the full tensors of its boundary.
  schedule::Schedule lowered = schedule::lower(r.schedule);
  const auto& acts = lowered.ranks[size_t(pp)];
  std::vector<size_t> recvs;
  for (size_t i = 0; i < acts.size(); ++i)
    if (acts[i].kind == ActionKind::recv_activation || acts[i].kind == ActionKind::recv_gradient)
      recvs.push_back(i);
  // Re-tiled boundaries (stages of different spatial degrees, partitioner/routing.h):
  // the executor receives each block of rows apart and copies it into its rows after the
  // wait, and sends each block as a copy of its rows (Executor::post_recv, do_send).
  std::map<int, std::vector<schedule::Transfer>> routes;
  for (int b = 0; b < r.schedule.num_stages(); ++b) routes[b] = boundary_transfers(r, rank, b);
  // For transfer action `a` of kind `kind`: the bytes of its row blocks that are copies
  // (fewer rows than the tile) and the values it also moves whole (or in parts of the
  // whole tensor).
  auto blocks_of = [&](const schedule::Action& a, schedule::Transfer::Kind kind) {
    const schedule::Crossing c = schedule::transfer_crossing(lowered, a);
    int64_t copies = 0;
    std::set<std::string> whole;
    if (c.boundary < 0) return std::pair{copies, whole};
    for (const schedule::Transfer& t : routes[c.boundary]) {
      if (t.kind != kind || t.phase != c.phase) continue;
      const int v = pg.find_value(t.value);
      BATON_CHECK(v >= 0, "physical graph lacks value " + t.value);
      const stages::Value& val = pg.values[size_t(v)];
      const int64_t height = val.type.shape.size() == 3 ? val.type.shape[1] : 0;
      if (t.rows > 0 && t.rows < height)
        copies += rounded(val.type.bytes(batch) / height * t.rows);
      else
        whole.insert(t.value);
    }
    return std::pair{copies, whole};
  };
  // Each cut's values, found once: Graph::cut_values scans every value of the graph, and
  // a step transfers at the same few cuts hundreds of times.
  std::map<int, std::vector<int>> cuts;
  auto cut_values = [&](int cut) -> const std::vector<int>& {
    auto it = cuts.find(cut);
    return it != cuts.end() ? it->second : cuts.emplace(cut, pg.cut_values(cut)).first->second;
  };
  auto recv_bytes = [&](const schedule::Action& a) {
    auto [first, last] = chunk(a.stage);
    return (a.kind == ActionKind::recv_activation
                ? values_bytes(pg, cut_values(first), batch)
                : values_bytes(pg, cut_values(last), batch, pg.loss)) +
           blocks_of(a, schedule::Transfer::Kind::recv).first;
  };
  // A send's tensors (Executor::do_send) stay allocated until the transport reports it
  // done, which for a message of any size needs the receiver to have taken it: it
  // outlives the F or B that made it and overlaps the rank's next compute action. A
  // value sent only in row blocks is held as their copies.
  auto send_bytes = [&](const schedule::Action& a) {
    auto [first, last] = chunk(a.stage);
    std::vector<int> vs =
        a.kind == ActionKind::send_activation ? cut_values(last) : cut_values(first);
    const auto blocks = blocks_of(a, schedule::Transfer::Kind::send);
    const std::set<std::string>& whole = blocks.second;
    if (blocks.first > 0)
      std::erase_if(vs, [&](int v) { return !whole.count(pg.values[size_t(v)].name); });
    return blocks.first +
           values_bytes(pg, vs, batch, a.kind == ActionKind::send_activation ? pg.loss : -1);
  };
  // The world ranks a transfer action's messages go to or come from.
  auto world_peers = [&](const schedule::Action& a, schedule::Transfer::Kind kind) {
    const schedule::Crossing c = schedule::transfer_crossing(lowered, a);
    std::set<int> peers;
    if (c.boundary >= 0)
      for (const schedule::Transfer& t : routes[c.boundary])
        if (t.kind == kind && t.phase == c.phase) peers.insert(t.peer);
    return peers;
  };
  // Where pipeline rank q's lowered list has the send (or the receive) of tag `tag`,
  // indexed once per rank.
  std::map<int, std::map<std::pair<int64_t, bool>, std::ptrdiff_t>> positions;
  auto position = [&](int q, int64_t tag, bool send) {
    auto [it, fresh] = positions.try_emplace(q);
    if (fresh) {
      const auto& list = lowered.ranks[size_t(q)];
      for (size_t j = 0; j < list.size(); ++j)
        if (schedule::is_transfer(list[j].kind))
          it->second[{schedule::transfer_tag(lowered, list[j]), schedule::is_send(list[j].kind)}] =
              std::ptrdiff_t(j);
    }
    auto found = it->second.find({tag, send});
    return found == it->second.end() ? std::ptrdiff_t(-1) : found->second;
  };
  // Whether send `s` is done once receive `rv` (later in this rank's list) has arrived:
  // every rank `s` went to sent part of `rv` after waiting for `s` there (a later action
  // of the peer's list), and a rendezvous send is done when the receiver has taken it and
  // acknowledged it, which comes ahead of the receiver's later messages between the same
  // two ranks (UCX and the local transport keep their order; the local transport is done
  // even sooner, when the receive is posted). Then Executor::poll_sends, after the
  // receive, has released it before the next compute action: with few micro-batches the
  // first stage's B waits for the gradient of the activation it has just sent, which had
  // counted that activation as held through the B (262,144 bytes over, 6% at one
  // micro-batch of 2048 tokens). A send no later message answers stays counted into the
  // step's end, though the receiver has usually taken it long before: when depends on
  // the progress threads of both ranks, and the estimate must not.
  auto done_by = [&](const schedule::Action& s, const schedule::Action& rv) {
    const int q = schedule::transfer_peer(lowered, s);
    if (q < 0 || schedule::transfer_peer(lowered, rv) != q) return false;
    const std::ptrdiff_t taken = position(q, schedule::transfer_tag(lowered, s), false),
                         answered = position(q, schedule::transfer_tag(lowered, rv), true);
    if (taken < 0 || answered <= taken) return false;
    const std::set<int> to = world_peers(s, schedule::Transfer::Kind::send),
                        from = world_peers(rv, schedule::Transfer::Kind::recv);
    return !to.empty() && std::includes(from.begin(), from.end(), to.begin(), to.end());
  };
  // Values handed between two stages of this rank (Executor::Pending's act_in and
  // grad_in, no transfer): an F's outputs from its end to the next stage's F of that
  // micro-batch, a B's (or BW's) input gradients to the previous stage's B. The stages'
  // walks count them during those two actions only, and a V's turn may run others
  // between (v-zb's 1F2 2B1 1B1 1W0 2F2: one residual activation short through them).
  std::vector<size_t> order;  // the compute actions of the lowered list
  for (size_t i = 0; i < acts.size(); ++i)
    if (schedule::is_compute(acts[i].kind)) order.push_back(i);
  std::vector<int64_t> handed(order.size(), 0);
  std::map<std::tuple<bool, int, int>, size_t> taken_at;  // (B, stage, micro-batch) -> order
  for (size_t c = 0; c < order.size(); ++c)
    if (const schedule::Action& a = acts[order[c]]; a.kind != ActionKind::backward_weight)
      taken_at[{a.kind != ActionKind::forward, a.stage, a.micro_batch}] = c;
  for (size_t c = 0; c < order.size(); ++c) {
    const schedule::Action& a = acts[order[c]];
    if (a.kind == ActionKind::backward_weight) continue;
    const bool forward = a.kind == ActionKind::forward;
    const int to =
        forward ? schedule::next_stage(lowered, a.stage) : schedule::prev_stage(lowered, a.stage);
    if (to < 0 || lowered.placement[size_t(to)] != pp) continue;
    const auto it = taken_at.find({!forward, to, a.micro_batch});
    if (it == taken_at.end()) continue;
    int64_t bytes = 0;
    auto [first, last] = chunk(a.stage);
    if (forward) {
      bytes = values_bytes(pg, cut_values(last), batch, pg.loss);
    } else {
      for (int v : cut_values(first))  // the entering values B makes gradients of
        if (const stages::Value& val = pg.values[size_t(v)];
            memory::is_floating(val.type.dtype) && val.type.batched)
          bytes += rounded(val.type.bytes(batch));
    }
    for (size_t d = c + 1; d < it->second; ++d) handed[d] += bytes;
  }
  const size_t ahead = size_t(std::max(1, o.recv_ahead));
  // Over UCX (a CPU job) a message under the rendezvous size is copied out and its send is
  // done at once: nothing of it outlives the send (the embedding's output of a recomputed
  // first stage had been counted through the B after it, one activation over).
  const size_t rendezvous = p.device == "cpu" ? transport::p2p_rendezvous_bytes() : 0;
  auto eager = [&](const schedule::Action& a) {
    auto [first, last] = chunk(a.stage);
    for (int v : a.kind == ActionKind::send_activation ? cut_values(last) : cut_values(first))
      if (v != pg.loss && size_t(pg.values[size_t(v)].type.bytes(batch)) >= rendezvous)
        return false;
    return true;
  };
  // A rendezvous send is done when its receiver has taken it and the acknowledgement has
  // come back, which depends on both ranks' progress threads, not on the schedule: a
  // posted receive is no bound (ZB-H2's last stage, 64 KiB gradients, held its first two
  // sends through its third B, two actions past the one the estimate had released them
  // after once their receives were known posted: 64-128 KiB under its measured peak). So
  // a send is held until a later receive shows it taken (done_by), else into the step's
  // end, where the engine waits for it.
  size_t first_open = 0;
  std::vector<size_t> sent;  // positions of the sends not known done
  auto sent_bytes = [&] {
    int64_t bytes = 0;
    for (size_t h : sent) bytes += send_bytes(acts[h]);
    return bytes;
  };
  // Of a send in blocks of rows: the values it sends only so, which Executor::do_send
  // holds whole while it copies their blocks, until it returns (a ResNet stem's output
  // sent to spatial 2 had been one activation under, 15%; a head's input gradient sent
  // back to spatial 2, 32%).
  auto whole_of_blocks = [&](const schedule::Action& a) -> int64_t {
    auto [first, last] = chunk(a.stage);
    const bool act = a.kind == ActionKind::send_activation;
    std::vector<int> vs = act ? cut_values(last) : cut_values(first);
    const auto blocks = blocks_of(a, schedule::Transfer::Kind::send);
    if (blocks.first == 0) return 0;
    std::erase_if(vs, [&](int v) { return blocks.second.count(pg.values[size_t(v)].name); });
    return values_bytes(pg, vs, batch, act ? pg.loss : -1);
  };
  for (size_t i = 0; i < acts.size(); ++i) {
    const ActionKind k = acts[i].kind;
    if (schedule::is_send(k) && !eager(acts[i])) sent.push_back(i);
    if (const int64_t whole =
            schedule::is_send(k) && !out.posted.empty() ? whole_of_blocks(acts[i]) : 0;
        whole > 0) {
      const size_t c = out.posted.size();  // the next compute action
      int64_t at = whole + (eager(acts[i]) ? send_bytes(acts[i]) : 0) + loaded_beyond(c) +
                   (c < handed.size() ? handed[c] : 0);
      at += sent_bytes();
      size_t open = first_open;
      while (open < recvs.size() && recvs[open] < i) ++open;
      for (size_t j = open; j < recvs.size() && j < open + ahead; ++j)
        at += recv_bytes(acts[recvs[j]]);
      out.sending.resize(c, 0);
      out.sending[c - 1] = std::max(out.sending[c - 1], at);
    }
    if (schedule::is_recv(k))
      std::erase_if(sent, [&](size_t h) { return done_by(acts[h], acts[i]); });
    if (k != ActionKind::forward && k != ActionKind::backward_input &&
        k != ActionKind::backward_weight && k != ActionKind::full_backward)
      continue;
    while (first_open < recvs.size() && recvs[first_open] < i) ++first_open;
    int64_t posted = sent_bytes() + loaded_beyond(out.posted.size()) + handed[out.posted.size()];
    for (size_t j = first_open; j < recvs.size() && j < first_open + ahead; ++j)
      posted += recv_bytes(acts[recvs[j]]);
    out.posted.push_back(posted);  // compute actions keep their order in the lowered list
  }
  // Held into the step's end (the reduction, STEP).
  const int64_t at_end = sent_bytes() + loaded_beyond(computes.size());

  // Gradient reduction (engine/detail/grad_reducer.cpp): per group of ranks, its
  // parameters in descending id order cut into buckets of up to bucket_bytes; a bucket
  // of several parameters all-reduces a flat copy, held until the step's end; one
  // all-reduce at a time per group, each with its scratch. The groups' scratch is summed:
  // whether a tied parameter's all-reduce (over both pipeline ranks) still holds its
  // scratch while the replicas' bucket holds its own depends on when the other pipeline
  // rank and the replica arrive, and the worst case occurs (GPT-2 at PP 2 x DP 2: each
  // rank at the sum in some runs, the tied wte's 32,832 bytes lower in others).
  // zero2: a sharded parameter held by one of the rank's stages is reduced inside each
  // W (zero2_grad_memory counts that), so nothing of it is held at the step's end.
  std::map<int, int> holders, stage_of;
  if (p.sharding() == OptimizerSharding::zero2)
    for (int s : r.stages_of(pp)) {
      auto [a, b] = chunk(s);
      for (int id : pg.params_used(a, b)) {
        ++holders[id];
        stage_of[id] = s;
      }
    }
  // The all-gather after the step: the sharded groups' buckets again (zero2's own ones
  // cut per stage), each of several parameters in a flat copy, all in flight at once.
  struct Sharded {
    std::vector<int> whole, zero2;
  };
  std::map<std::vector<int>, std::vector<int>> groups;
  std::map<std::vector<int>, Sharded> sharded;
  for (const GradientGroup& gg : gradient_groups(r, rank)) {
    if (gg.ranks.size() <= 1) continue;  // a sum of local stages only: in place
    int id = pg.find_param(gg.name);
    BATON_CHECK(id >= 0, "physical graph lacks parameter " + gg.name);
    if (!optimizer_sharded(r, rank, gg)) {
      groups[gg.ranks].push_back(id);
      continue;
    }
    if (p.sharding() == OptimizerSharding::zero2 && holders[id] == 1) {
      sharded[gg.ranks].zero2.push_back(id);
      continue;
    }
    groups[gg.ranks].push_back(id);
    sharded[gg.ranks].whole.push_back(id);
  }
  // Extra server ranks join a sharded group's reduce-scatter and own every part of it
  // (bucket_parts), so its ring's window is sized by a server's part, and a small one's
  // direct exchange receives nothing on a replica (its own part is empty).
  const int servers = p.dp_sync.parameter_server() ? p.dp_sync.ps_ranks : 0;
  auto bucket_scratch = [&](int n, bool to_servers, int64_t elements, size_t es) {
    return int64_t(to_servers ? transport::collective_scratch_bytes(
                                    transport::Collective::reduce_scatter, size_t(elements), es,
                                    n + servers, size_t(elements + servers - 1) / servers, true, 0)
                              : transport::collective_scratch_bytes(
                                    transport::Collective::all_reduce, size_t(elements), es, n));
  };
  int64_t flats = 0, scratch = 0;
  for (auto& [members, ids] : groups) {
    const int n = int(members.size());
    const bool to_servers = servers > 0 && sharded.count(members);
    int64_t group_scratch = 0;
    for_each_bucket(
        pg, ids, o.bucket_bytes, nullptr, [&](int params, int64_t elements, memory::DType dt) {
          const size_t es = memory::dtype_size(dt);
          if (params > 1) flats += rounded(elements * int64_t(es));
          group_scratch = std::max(group_scratch, bucket_scratch(n, to_servers, elements, es));
        });
    scratch += group_scratch;  // the groups' communicators run at once (docs/partitioner.md)
  }
  // Buckets started before the step's end (GradReducer::try_start, held through each
  // compute action and started at its end): in the group's order, each once the last W
  // (or BW) of every stage holding one of its parameters has run. On a rank of two chunks
  // the later chunk's are started before the earlier chunk's B and W (and its recompute):
  // their flat copies, held until the step's end, and the all-reduce's scratch, one at a
  // time per group, count through those (a ResNet at DP 2 with --bucket-mib 0.01 had been
  // 11% under on a V).
  if (!p.dp_sync.parameter_server() && !groups.empty()) {
    std::map<int, size_t> last_w;  // stage -> its last W (or BW) in the compute order
    for (size_t c = 0; c < order.size(); ++c)
      if (acts[order[c]].kind == ActionKind::backward_weight ||
          acts[order[c]].kind == ActionKind::full_backward)
        last_w[acts[order[c]].stage] = c;
    std::map<int, size_t> ready_at;  // parameter -> the action after whose end it is final
    for (int s : r.stages_of(pp)) {
      auto [a, b] = chunk(s);
      const auto w = last_w.find(s);
      for (int id : pg.params_used(a, b)) {
        size_t& at = ready_at.try_emplace(id, 0).first->second;
        at = std::max(at, w == last_w.end() ? order.size() : w->second);
      }
    }
    std::vector<int64_t> early(out.posted.size(), 0);
    for (auto& [members, ids] : groups) {
      const bool to_servers = servers > 0 && sharded.count(members);
      std::vector<int64_t> group_scratch(out.posted.size(), 0);
      size_t started = 0;
      for (const std::vector<int>& b : gradient_buckets(pg, ids, o.bucket_bytes, nullptr)) {
        int64_t elements = 0;
        for (int id : b) {
          const auto at = ready_at.find(id);
          started = std::max(started, at == ready_at.end() ? order.size() : at->second);
          elements += memory::shape_numel(pg.params[size_t(id)].shape);
        }
        if (started + 1 >= out.posted.size()) break;
        const size_t es = memory::dtype_size(pg.params[size_t(b.front())].dtype);
        const int64_t sc = bucket_scratch(int(members.size()), to_servers, elements, es);
        for (size_t d = started + 1; d < out.posted.size(); ++d) {
          if (b.size() > 1) early[d] += rounded(elements * int64_t(es));
          group_scratch[d] = std::max(group_scratch[d], sc);
        }
      }
      for (size_t d = 0; d < early.size(); ++d) early[d] += group_scratch[d];
    }
    for (size_t d = 0; d < early.size(); ++d) {
      out.posted[d] += early[d];
      if (d < out.sending.size() && out.sending[d] > 0) out.sending[d] += early[d];
    }
  }
  // A parameter server with staleness s posts this step's pull before it completes the
  // oldest (GradReducer::gather_params): besides the s pulls counted throughout, one more,
  // each bucket's whole output and the rank's part of it, and the rank's parts cloned, one
  // tensor per parameter (an empty one still a block). No flat copy or all-gather scratch:
  // the pull gathers into its own output. Left out, small buckets had been 15-24% under.
  const bool stale = p.dp_sync.parameter_server() && p.dp_sync.max_staleness > 0;
  for (auto& [members, sh] : sharded) {
    if (!stale) break;
    const int me = int(std::find(members.begin(), members.end(), rank) - members.begin());
    const std::map<int, int64_t> parts =  // the replicas' (none beside extra server ranks)
        servers > 0 ? std::map<int, int64_t>{}
                    : shard_parts(pg, sh.whole, o.bucket_bytes, int(members.size()), me);
    for (const std::vector<int>& b : gradient_buckets(pg, sh.whole, o.bucket_bytes, nullptr)) {
      const int64_t es = int64_t(memory::dtype_size(pg.params[size_t(b.front())].dtype));
      int64_t elements = 0, mine = 0;
      for (int id : b) {
        elements += memory::shape_numel(pg.params[size_t(id)].shape);
        const auto part_it = parts.find(id);
        const int64_t part = part_it == parts.end() ? 0 : part_it->second;
        mine += part;
        out.gather += rounded(part * es);
      }
      out.gather += rounded(elements * es) + rounded(mine * es);
    }
  }
  for (auto& [members, sh] : sharded) {
    if (stale) break;
    const int n = int(members.size());
    int64_t group_scratch = 0;
    auto close = [&](int params, int64_t elements, memory::DType dt) {
      const size_t es = memory::dtype_size(dt);
      if (params > 1) out.gather += rounded(elements * int64_t(es));
      group_scratch =
          std::max(group_scratch, int64_t(transport::collective_scratch_bytes(
                                      transport::Collective::all_gather, size_t(elements), es, n)));
    };
    for_each_bucket(pg, sh.whole, o.bucket_bytes, nullptr, close);
    for_each_bucket(pg, sh.zero2, o.bucket_bytes, &stage_of, close);
    out.gather += group_scratch;
  }
  // STEP's norm and loss vector, all-reduced over the world (Executor::finish_step); it
  // stays allocated until the step returns, through the replicas' sync below.
  const int64_t slots = int64_t(pg.num_layers()) + int64_t(p.dp) * p.micro_batches;
  // After the step, the replicas' parameter sync (their gradients are not reduced over
  // replicas: gradient_groups): gossip receives its partner's copy of every parameter the
  // rank holds, all at once (engine/detail/gossip.cpp); local SGD's sync all-reduces every
  // parameter's delta in place, all posted at once (engine/detail/local_sgd.cpp), but the
  // communicator runs its collectives one at a time, so only the largest scratch is held
  // (summed, a local SGD MLP had been 3.3% over). Left out, both had been 7-13% under.
  if (p.dp_sync.independent() && p.dp > 1) {
    std::set<int> held;
    for (int s : r.stages_of(pp)) {
      auto [a, b] = chunk(s);
      for (int id : pg.params_used(a, b))
        if (pg.params[size_t(id)].trainable) held.insert(id);
    }
    int64_t sync = 0;
    for (int id : held) {
      const int64_t n = memory::shape_numel(pg.params[size_t(id)].shape);
      const size_t es = memory::dtype_size(pg.params[size_t(id)].dtype);
      if (p.dp_sync.mode == DpSync::Mode::gossip)
        sync += rounded(n * int64_t(es));
      else
        sync = std::max(sync, int64_t(transport::collective_scratch_bytes(
                                  transport::Collective::all_reduce, size_t(n), es, p.dp)));
    }
    if (r.world() > 1) sync += rounded(slots * 8);  // gossip had been 64 bytes under
    out.gather = std::max(out.gather, sync);
  }
  // Extra server ranks are seeded by the group's first member, replica 0, at the first
  // step's start: each bucket in turn built whole and scattered, with an empty receive
  // buffer (a block). Left out, its estimate had been 24% under at --bucket-mib 0.001.
  for (auto& [members, sh] : sharded) {
    if (servers == 0 || members.front() != rank) continue;
    for_each_bucket(
        pg, sh.whole, o.bucket_bytes, nullptr, [&](int, int64_t elements, memory::DType dt) {
          out.start =
              std::max(out.start, rounded(elements * int64_t(memory::dtype_size(dt))) + rounded(0));
        });
  }
  if (out.gather > 0) out.gather += loaded_beyond(computes.size());
  out.reduction = flats + scratch + at_end;

  // STEP (Executor::finish_step): the per-layer norm pieces and the losses, all-reduced
  // over the world.
  out.step = at_end + rounded(slots * 8) +
             int64_t(transport::collective_scratch_bytes(transport::Collective::all_reduce,
                                                         size_t(slots), 8, r.world()));
  out.step += update_point_bytes(r, rank, pg, o.bucket_bytes);
  return out;
}

PlanEstimate evaluate_plan(const ResolvedPlan& r, CostModel& model,
                           const EvaluateOptions& options) {
  const Graph& g = *r.graph;
  const Plan& p = r.plan;
  model.warn_threads(r.world(), p.device);
  // The estimate sums bytes in int64: a plan beyond what it counts is refused here, before
  // a sum wraps (to a negative size, or one that "fits").
  if (!micro_batches_countable(g, p.micro_batch_size, p.micro_batches))
    throw InputError(
        p.where("$.batch.micro_batch_size") + ": micro-batches of " +
        std::to_string(p.micro_batch_size) + " samples of model " + g.name + " need up to " +
        memory::format_bytes(micro_batch_bytes_bound(g, p.micro_batch_size)) +
        " each (every value and its gradient), times the " + std::to_string(p.micro_batches) +
        " a rank may hold ($.schedule.micro_batches) and one more: more than the 2^62 bytes "
        "the memory estimate counts, and than any device holds; expected fewer samples a "
        "micro-batch");
  CostTable table = model.table_for(r.sharding, p.micro_batch_size);
  const int opt = optimizer_states(p.optimizer);
  const int K = r.num_chunks();

  // Memory per model chunk (the same on every rank holding it, whatever its TP index).
  std::vector<StageMemory> chunk_mem(static_cast<size_t>(K));
  std::shared_ptr<Graph> pg;
  // A spatial split's tile graph per pipeline rank (partitioner/spatial.h): its values are
  // tiles of H / s rows, and its convolutions and poolings carry their halos, so the walk
  // counts the tiles and the halos as the engine allocates them.
  // Both with the fused kernels the ranks run (physical_graph), whose buffers differ from
  // the pairs' (bias_gelu keeps its bias gradient from B to W).
  std::map<int, std::shared_ptr<Graph>> tile_graphs;
  std::shared_ptr<Graph> shard;
  auto graph_of = [&](int pp) -> const Graph& {
    if (r.spatial_of(pp) <= 1) return *pg;
    auto& t = tile_graphs[pp];
    if (!t)
      t = fuse_kernels(*(r.plan.tp[size_t(pp)] > 1
                             ? build_spatial(*shard, r.shard_spatial[size_t(pp)], 0)
                             : build_spatial(g, r.spatial[size_t(pp)], 0)));
    return *t;
  };
  std::vector<int> chunk_pp(static_cast<size_t>(K), 0);
  for (int s = 0; s < r.schedule.num_stages(); ++s)
    chunk_pp[size_t(r.chunk_of_stage[size_t(s)])] = r.schedule.placement[size_t(s)];
  if (options.exact_memory) {
    shard = shard_graph(r, 0);
    pg = fuse_kernels(*shard);
  }
  for (int k = 0; k < K; ++k) {
    int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
    chunk_mem[size_t(k)] =
        options.exact_memory
            ? stage_memory(graph_of(chunk_pp[size_t(k)]), a, b, r.recompute[size_t(k)],
                           p.micro_batch_size, opt, r.layer_tp[size_t(a)],
                           r.spatial_of(chunk_pp[size_t(k)]))
            : compose_stage_memory(table, a, b, r.recompute[size_t(k)], opt);
    // Composed from the unsplit layers' figures: a tile stashes 1/s of their activations
    // (the halos, a few rows per convolution, are left out of this upper-bound estimate).
    if (!options.exact_memory && r.spatial_of(chunk_pp[size_t(k)]) > 1) {
      const int64_t d = r.spatial_of(chunk_pp[size_t(k)]);
      StageMemory& m = chunk_mem[size_t(k)];
      for (int64_t* x : {&m.mb.stash, &m.mb.w_stash, &m.mb.forward_peak, &m.mb.backward_peak,
                         &m.mb.weight_peak, &m.mb.held_through_backward, &m.mb.fused_peak})
        *x /= d;
    }
  }
  // Each tile's own figures (exact): an edge tile exchanges halos on one side only and
  // holds less than one between two (a ResNet's second stage at spatial 4: its edge tiles
  // had been given the middle one's figures, 4.2% over). chunk_mem keeps the most of any
  // position, the chunk's figures. By chunk: the top tile's, the bottom's, a middle one's.
  std::map<int, std::array<MicroBatchMemory, 3>> tile_mb;
  if (options.exact_memory)
    for (int k = 0; k < K; ++k) {
      const int tiles = r.spatial_of(chunk_pp[size_t(k)]);
      if (tiles <= 1) continue;
      const int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
      WalkSpec spec = stage_walk_spec(graph_of(chunk_pp[size_t(k)]), a, b, r.recompute[size_t(k)],
                                      p.micro_batch_size, r.layer_tp[size_t(a)]);
      for (int pos = 0; pos < (tiles > 2 ? 3 : 2); ++pos) {
        spec.tile_above = pos != 0;
        spec.tile_below = pos != 1;
        tile_mb[k][size_t(pos)] = walk_micro_batch(spec);
      }
    }
  const Graph& mg = pg ? *pg : g;
  // Chunk k's first stage, and the parameters its data-parallel group shards (ZeRO's, or a
  // parameter server's served ones; not one tied over pipeline ranks) with their group:
  // its replicas (and tiles, for one used on tiles).
  auto first_stage_of = [&](int k) {
    int stage = 0;
    while (r.chunk_of_stage[size_t(stage)] != k) ++stage;
    return stage;
  };
  auto sharded_by = [&](int rank) {
    std::map<std::string, std::vector<int>> sharded;
    for (const GradientGroup& gg : gradient_groups(r, rank))
      if (optimizer_sharded(r, rank, gg)) sharded[gg.name] = gg.ranks;
    return sharded;
  };
  auto sharded_of = [&](int k) {
    const int rank = r.layout.rank(0, r.schedule.placement[size_t(first_stage_of(k))], 0);
    return std::make_pair(rank, sharded_by(rank));
  };
  // The sharded optimizer (ZeRO): each chunk's sharded parameters hold a part of their
  // state (and under zero2 of their gradient) on each rank, as the engine lays the parts
  // out (sharded_parts), so ranks of one chunk may hold different bytes: the chunk's
  // figures are its first rank's, and each rank's own are in its estimate below.
  const bool sharding = p.sharding() != OptimizerSharding::none && p.dp > 1 &&
                        (opt > 0 || p.sharding() == OptimizerSharding::zero2);
  struct ZeroSaved {
    int64_t optimizer = 0, grads = 0, bound = 0;
    std::map<std::vector<int>, std::vector<int>> zero2;  // by group (each its own buckets)
    std::vector<GradBucket> buckets;                     // ids of mg
  };
  // The parameters of pipeline rank pp's chunks other than k.
  auto elsewhere_of = [&](int k, int pp) {
    std::set<int> out;
    for (int s2 : r.stages_of(pp)) {
      const int k2 = r.chunk_of_stage[size_t(s2)];
      if (k2 == k) continue;
      for (int id : mg.params_used(r.chunk_first[size_t(k2)], r.chunk_last[size_t(k2)]))
        out.insert(id);
    }
    return out;
  };
  // What `rank` does not hold of chunk k's state and gradients.
  // `sharded`: sharded_by(rank); `parts`: sharded_parts of rank.
  auto zero_saved = [&](int k, int rank, const std::map<std::string, std::vector<int>>& sharded,
                        const std::map<int, int64_t>& parts) {
    ZeroSaved z;
    // zero2: parameters held by another stage of the same rank stay as under zero1.
    const std::set<int> elsewhere = elsewhere_of(k, r.layout.coord(rank).pp);
    const int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
    for (int id : mg.params_used(a, b)) {
      const stages::Param& prm = mg.params[size_t(id)];
      auto found = sharded.find(prm.name);
      if (found == sharded.end()) continue;
      const int64_t numel = memory::shape_numel(prm.shape);
      const int es = int(memory::dtype_size(prm.dtype));
      const auto part = parts.find(id);
      if (p.dp_sync.ps_ranks > 0)  // extra server ranks hold all of it: the replicas none
        z.optimizer += rounded(numel * es) * opt;
      else if (part == parts.end())
        z.optimizer += zero_optimizer_saving(numel, es, int(found->second.size()), opt);
      else  // a part of 0 elements holds no state (Stage::set_optimizer)
        z.optimizer +=
            (rounded(numel * es) - (part->second > 0 ? rounded(part->second * es) : 0)) * opt;
      if (p.sharding() == OptimizerSharding::zero2 && !elsewhere.count(id))
        z.zero2[found->second].push_back(id);
    }
    for (const auto& [group, ids] : z.zero2) {
      ZeroGradMemory zg =
          zero2_grad_memory(mg, a, b, ids, int(group.size()), options.bucket_bytes, &parts);
      z.grads += zg.saved;
      z.bound += zg.held_bound;
      for (GradBucket& bk : zg.buckets) z.buckets.push_back(std::move(bk));
    }
    return z;
  };
  if (sharding) {
    for (int k = 0; k < K; ++k) {
      const int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
      const auto [rank, sharded] = sharded_of(k);
      ZeroSaved z = zero_saved(k, rank, sharded, sharded_parts(r, rank, mg, options.bucket_bytes));
      chunk_mem[size_t(k)].optimizer_sharding_saved += z.optimizer;
      chunk_mem[size_t(k)].grad_sharding_saved += z.grads;
      if (z.zero2.empty()) continue;
      tile_mb.erase(k);  // its W walked again below at one position: the most of any
      const std::set<int> elsewhere = elsewhere_of(k, r.layout.coord(rank).pp);
      // The gradients a micro-batch's W makes and reduces bucket by bucket: walked again
      // with them (where in W a bucket fills decides what else is still held), or in the
      // composed estimate bounded by all of them at once.
      const Graph& walked = options.exact_memory ? graph_of(chunk_pp[size_t(k)]) : mg;
      std::vector<GradBucket> buckets = std::move(z.buckets);
      for (GradBucket& bk : buckets)
        for (int& id : bk.params) {
          const std::string& name = mg.params[size_t(id)].name;
          id = walked.find_param(name);
          BATON_CHECK(id >= 0, "stage graph lacks parameter " + name);
        }
      MicroBatchMemory& mb = chunk_mem[size_t(k)].mb;
      if (!options.exact_memory) {
        mb.weight_peak += z.bound;
        mb.fused_peak += z.bound;
        continue;
      }
      WalkSpec spec = stage_walk_spec(walked, a, b, r.recompute[size_t(k)], p.micro_batch_size,
                                      r.layer_tp[size_t(a)]);
      spec.sharded_grads = std::move(buckets);
      const MicroBatchMemory walked_mb = walk_micro_batch(spec);
      mb.weight_peak = walked_mb.weight_peak;
      mb.fused_peak = walked_mb.fused_peak;
      // The step's last W also starts the all-reduces of the whole gradients (not sharded:
      // a parameter tied over pipeline ranks) whose buckets lie in this chunk alone, and
      // they wait there for the other pipeline rank, over the W's reduce-scatters.
      std::map<std::vector<int>, std::vector<int>> whole;  // by group, as the engine cuts
      for (const GradientGroup& gg : gradient_groups(r, rank))
        if (gg.ranks.size() > 1 && !sharded.count(gg.name))
          whole[gg.ranks].push_back(mg.find_param(gg.name));
      const std::vector<int> used = mg.params_used(a, b);
      const std::set<int> here(used.begin(), used.end());
      for (const auto& [group, ids] : whole)
        for (std::vector<int>& bk : gradient_buckets(mg, ids, options.bucket_bytes)) {
          int64_t elements = 0;
          bool alone = true;
          for (int& id : bk) {
            alone = alone && here.count(id) && !elsewhere.count(id);
            elements += memory::shape_numel(mg.params[size_t(id)].shape);
            id = walked.find_param(mg.params[size_t(id)].name);
          }
          if (!alone) continue;
          const size_t es = memory::dtype_size(walked.params[size_t(bk.front())].dtype);
          spec.started_in_w.push_back({bk, int64_t(transport::collective_scratch_bytes(
                                               transport::Collective::all_reduce, size_t(elements),
                                               es, int(group.size())))});
        }
      if (!spec.started_in_w.empty()) {
        const MicroBatchMemory last = walk_micro_batch(spec);
        mb.last_weight_peak = last.weight_peak;
        mb.last_fused_peak = last.fused_peak;
      }
    }
  }
  // Local SGD: the outer optimizer's anchor (a copy of the parameters at the last sync)
  // and, for nesterov, its momentum, counted with the optimizer state: parameter-sized,
  // one per parameter (a tied one's per-layer gradients are not copied).
  if (p.dp_sync.local()) {
    const int copies = p.dp_sync.outer == DpSync::Outer::nesterov ? 2 : 1;
    for (StageMemory& m : chunk_mem) m.optimizer += copies * m.params;
  }
  // A parameter server with staleness s: up to s pulls in flight between steps, each a
  // parameter-sized buffer and the rank's part (its input), counted with the optimizer
  // state (engine/detail/grad_reducer.h). With extra server ranks a replica's part of each
  // bucket is empty, still a 64-byte block (GradReducer::post_pull; left out, a replica
  // was 64 bytes under at staleness 1).
  // Only served parameters are pulled: one tied over pipeline ranks is all-reduced.
  if (p.dp_sync.parameter_server() && p.dp > 1 && p.dp_sync.max_staleness > 0)
    for (int k = 0; k < K; ++k) {
      const auto sharded = sharded_of(k).second;
      int64_t served = 0;
      std::vector<int> ids;
      for (int id : mg.params_used(r.chunk_first[size_t(k)], r.chunk_last[size_t(k)])) {
        const stages::Param& prm = mg.params[size_t(id)];
        if (!sharded.count(prm.name)) continue;
        served += rounded(memory::shape_numel(prm.shape) * int64_t(memory::dtype_size(prm.dtype)));
        ids.push_back(id);
      }
      int64_t in = (served + p.dp - 1) / p.dp;
      if (p.dp_sync.ps_ranks > 0) {
        in = 0;
        for_each_bucket(mg, ids, options.bucket_bytes, nullptr,
                        [&](int, int64_t, memory::DType) { in += rounded(0); });
      }
      chunk_mem[size_t(k)].optimizer += int64_t(p.dp_sync.max_staleness) * (served + in);
    }
  std::vector<StageMemory> stage_mem;
  for (int s = 0; s < r.schedule.num_stages(); ++s)
    stage_mem.push_back(chunk_mem[size_t(r.chunk_of_stage[size_t(s)])]);
  // The stages' figures as the rank at `c` holds them: a tile's its position's (tile_mb).
  std::vector<StageMemory> tiled_mem;
  auto stage_mem_of = [&](const RankCoord& c) -> const std::vector<StageMemory>& {
    const int tiles = r.spatial_of(c.pp);
    if (tiles <= 1 || tile_mb.empty()) return stage_mem;
    const size_t pos = c.sp == 0 ? 0 : c.sp == tiles - 1 ? 1 : 2;
    tiled_mem = stage_mem;
    for (int s : r.stages_of(c.pp))
      if (auto it = tile_mb.find(r.chunk_of_stage[size_t(s)]); it != tile_mb.end())
        tiled_mem[size_t(s)].mb = it->second[pos];
    return tiled_mem;
  };

  // The step: the schedule with its gradient reductions and optimizer step.
  schedule::Costs costs = schedule_costs(r, table, model.machine(), stage_mem);
  schedule::LowerOptions lo;
  lo.transfers = false;
  schedule::Schedule lowered = schedule::lower(r.schedule, lo);
  schedule::SimResult sim = schedule::simulate(lowered, costs);

  PlanEstimate e;
  e.step_time = sim.makespan;
  e.bubble = sim.bubble;
  if (!costs.core_ranks.empty()) {
    const Machine& m = model.machine();
    e.time_sliced_cores = m.cores_per_host;
    e.time_sliced_per_host =
        m.ranks_per_host > 0 ? std::min(m.ranks_per_host, r.world()) : r.world();
  }
  e.collective_extras_note = collective_extras_line(r, model.machine());
  e.tokens_per_step = p.global_batch * rate_units_per_sample(g);
  e.tokens_per_second = e.step_time > 0 ? double(e.tokens_per_step) / e.step_time : 0;

  // What a rank holds of its chunks' sharded state and gradients against the chunks'
  // figures (their first ranks'): the engine cuts each bucket into parts, so the
  // replicas of one position may differ by a few parameters' bytes.
  struct OwnSharding {
    int64_t grads = 0, optimizer = 0;
  };
  auto own_sharding_of = [&](int rank, const std::vector<int>& stages) {
    OwnSharding o;
    if (!sharding) return o;
    const auto sharded = sharded_by(rank);
    const auto parts = sharded_parts(r, rank, mg, options.bucket_bytes);
    for (int s : stages) {
      const int k = r.chunk_of_stage[size_t(s)];
      const StageMemory& m = chunk_mem[size_t(k)];
      const ZeroSaved z = zero_saved(k, rank, sharded, parts);
      o.grads += m.grad_sharding_saved - z.grads;
      o.optimizer += m.optimizer_sharding_saved - z.optimizer;
    }
    return o;
  };
  std::map<int, OwnSharding> own_of_position;  // by replica 0's rank
  // Replica 0's buffers where a replica's differ: a post-validated step's copy of the
  // rank's own parts under ZeRO (update_point_bytes). By replica 0's rank.
  std::map<int, RankBuffers> buffers_of_position;
  // Replica 0's peak without seeding extra server ranks, which its peers do not: by its rank.
  std::map<int, int64_t> unseeded_peak;
  for (int rank = 0; rank < r.layout.world(); ++rank) {
    // The replicas of one position (pipeline rank, tensor-parallel index, tile) hold the
    // same stages and buffers, their groups the same sizes: replica 0's estimate (ranks
    // are replica-major, so it comes first) is theirs, but for their own parts of a
    // sharded state. Evaluating each whole had cost O(world) per rank in its gradient
    // groups, O(world^2) in all.
    if (const RankCoord c = r.layout.coord(rank); c.dp > 0) {
      const int first = r.layout.rank(0, c.pp, c.tp, c.sp);
      RankEstimate re = e.ranks[size_t(first)];
      re.rank = rank;
      re.coord = c;
      if (auto it = unseeded_peak.find(first); it != unseeded_peak.end()) {
        re.peak = it->second;
        re.activation_peak = re.peak - re.param_bytes - re.grad_bytes - re.optimizer_bytes;
      }
      if (sharding) {
        const OwnSharding mine = own_sharding_of(rank, re.stages), theirs = own_of_position[first];
        re.grad_bytes += mine.grads - theirs.grads;
        re.optimizer_bytes += mine.optimizer - theirs.optimizer;
        re.peak += mine.grads + mine.optimizer - theirs.grads - theirs.optimizer;
        // Its own parts also size the step's copy, so the step's end may be its peak where
        // it was not replica 0's (DualPipeV at PP 2 x DP 2 under zero1, both outer chunks
        // recomputed: replica 1 copies the whole tied wte twice, replica 0 none of it, and
        // had been 29,056 bytes under its measured peak).
        if (auto it = buffers_of_position.find(first); it != buffers_of_position.end()) {
          RankBuffers b = it->second;
          b.start = 0;
          const Graph& pgc = graph_of(c.pp);
          b.step += update_point_bytes(r, rank, pgc, options.bucket_bytes) -
                    update_point_bytes(r, first, pgc, options.bucket_bytes);
          re.peak = mine.grads + mine.optimizer + rank_peak(r.schedule, c.pp, stage_mem_of(c), b);
          re.activation_peak = re.peak - re.param_bytes - re.grad_bytes - re.optimizer_bytes;
        }
      }
      e.ranks.push_back(std::move(re));
      continue;
    }
    RankEstimate re;
    re.rank = rank;
    re.coord = r.layout.coord(rank);
    re.stages = r.stages_of(re.coord.pp);
    std::set<int> params;
    const OwnSharding own = own_sharding_of(rank, re.stages);
    own_of_position[rank] = own;
    for (int s : re.stages) {
      int k = r.chunk_of_stage[size_t(s)];
      int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
      if (!re.layers.empty()) re.layers += ", ";
      re.layers +=
          g.layers[size_t(a)].name + (b - a > 1 ? " .. " + g.layers[size_t(b - 1)].name : "");
      for (int id : g.params_used(a, b)) params.insert(id);
      const StageMemory& m = chunk_mem[size_t(k)];
      const int64_t grad_saved = m.grad_sharding_saved,
                    optimizer_saved = m.optimizer_sharding_saved;
      re.param_bytes += m.params;
      re.grad_bytes += m.grads - grad_saved;
      re.optimizer_bytes += m.optimizer - optimizer_saved;
      // zero2 reduce-scatters every micro-batch (half an all-reduce each) and all-gathers once.
      const bool zero2 =
          p.sharding() == OptimizerSharding::zero2 && p.dp > 1 && r.chunk_on_one_rank(k);
      // Each parameter's gradient is reduced once, a tied one too (m.grads counts a
      // parameter used by n layers as n + 1 buffers: the memory, not the traffic).
      re.dp_bytes += dp_bytes_per_step(p.dp_sync, double(m.params), p.dp) *
                     (zero2 ? double(p.micro_batches + 1) / 2 : 1.0);
      const int per_direction = p.micro_batches / r.schedule.num_directions;  // whole
      re.compute_time +=
          double(per_direction) * (costs.forward[size_t(s)] + costs.backward_input[size_t(s)] +
                                   costs.backward_weight[size_t(s)]);
    }
    for (int id : params) {
      const stages::Param& prm = g.params[size_t(id)];
      if (!prm.trainable) continue;  // running statistics: state, not parameters
      int64_t n = memory::shape_numel(prm.logical_shape);
      const ParamShard& sh = r.sharding.params[size_t(id)];
      if (sh.dim >= 0 && sh.t > 1)
        n = n / prm.logical_shape[size_t(sh.dim)] * sh.pattern.local_size(sh.t);
      re.parameters += n;
    }
    re.grad_bytes += own.grads;
    re.optimizer_bytes += own.optimizer;
    if (options.exact_memory) {
      RankBuffers b = rank_buffers(r, rank, graph_of(re.coord.pp), options);
      if (sharding && p.post_validated_step) buffers_of_position[rank] = b;
      const std::vector<StageMemory>& mem = stage_mem_of(re.coord);
      re.peak = own.grads + own.optimizer + rank_peak(r.schedule, re.coord.pp, mem, b);
      if (b.start > 0) {
        b.start = 0;
        unseeded_peak[rank] =
            own.grads + own.optimizer + rank_peak(r.schedule, re.coord.pp, mem, b);
      }
    } else {
      re.peak = own.grads + own.optimizer + rank_peak(r.schedule, re.coord.pp, stage_mem);
    }
    re.activation_peak = re.peak - re.param_bytes - re.grad_bytes - re.optimizer_bytes;
    re.busy_fraction = e.step_time > 0 ? re.compute_time / e.step_time : 0;
    e.dp_bytes_per_step = std::max(e.dp_bytes_per_step, re.dp_bytes);
    e.ranks.push_back(re);
  }
  // Over the capacity: per pipeline rank, the rank of the highest peak (its tensor- and
  // data-parallel peers differ by their parts of a sharded state at most).
  for (int pp = 0; pp < p.pp && p.device_memory > 0; ++pp) {
    const RankEstimate* top = nullptr;
    for (const RankEstimate& re : e.ranks)
      if (re.coord.pp == pp && (!top || re.peak > top->peak)) top = &re;
    int peers = 0, peers_over = 0;
    for (const RankEstimate& re : e.ranks)
      if (re.coord.pp == pp && &re != top) {
        ++peers;
        peers_over += re.peak > p.device_memory ? 1 : 0;
      }
    if (!top || top->peak <= p.device_memory) continue;
    e.problems.push_back("rank " + std::to_string(top->rank) + " (pp " + std::to_string(pp) + ", " +
                         top->layers + ") needs " + memory::format_bytes(double(top->peak)) +
                         ", over its capacity of " + memory::format_bytes(double(p.device_memory)) +
                         " by " + memory::format_bytes(double(top->peak - p.device_memory)) +
                         (peers_over == 0 ? ""
                          : peers_over == peers
                              ? " (as do its tensor- and data-parallel peers)"
                              : " (as do " + std::to_string(peers_over) + " of its " +
                                    std::to_string(peers) + " tensor- and data-parallel peers)"));
  }
  // Extra parameter-server ranks (engine/detail/param_server.h): each holds its part of
  // every served bucket (1/ps_ranks of each replica position's sharded parameters), the
  // summed gradient of that part until the update and its optimizer state, and beyond
  // them the push's buffers (two whole buckets in flight and a reduce-scatter's scratch)
  // or the pull's; each step it sends its part to every replica (the pull).
  if (p.dp_sync.ps_ranks > 0) {
    // The step's times (schedule_costs' terms): the replica rank whose push and exposed
    // update and pull take longest.
    const PsServedBytes served = ps_served_bytes(r, table);
    for (const auto& [q, bytes] : served.rank) {
      const ServerTimes st =
          ps_server_times(p.dp_sync, bytes, served.total, p.dp, model.machine(), opt,
                          e.ranks[size_t(r.layout.rank(0, q, 0))].compute_time);
      if (st.push + st.exposed > e.servers.push + e.servers.exposed) e.servers = st;
    }
    const int n = p.dp_sync.ps_ranks;
    // The served groups as ParamServer cuts them: by member list (a replica position's
    // replicas, then the servers), each group's parameters into the replicas' buckets.
    std::map<std::vector<int>, std::pair<std::shared_ptr<Graph>, std::vector<int>>> groups;
    for (int q = 0; q < r.layout.world() && r.layout.coord(q).dp == 0; ++q) {
      std::shared_ptr<Graph> qg = physical_graph(r, q);
      for (const GradientGroup& gg : gradient_groups(r, q))
        if (gg.ranks.size() > 1 && optimizer_sharded(r, q, gg)) {
          auto& [graph, ids] = groups[reduction_members(r, q, gg)];
          graph = qg;
          ids.push_back(qg->find_param(gg.name));
        }
    }
    // Each bucket's whole push input (the gradients' dtype), the server's part of it as
    // gradient and as master (f32: ParamServer::Options::master_dtype, also its optimizer
    // state's, the pulls' and the pull's all-gather output), and the push's reduce-scatter
    // scratch on the server, which owns the largest part.
    struct Bucket {
      int64_t in, grad, out, scratch;
    };
    const int64_t master_es = int64_t(memory::dtype_size(memory::DType::f32));
    int64_t elements = 0, part = 0, grads = 0, push = 0, pull = 0, wide = 0;
    for (const auto& [members, group] : groups) {
      const int group_size = int(members.size());  // a binding: C++20 lambdas cannot capture it
      std::vector<Bucket> bs;
      for_each_bucket(*group.first, group.second, options.bucket_bytes, nullptr,
                      [&](int, int64_t el, memory::DType dt) {
                        const int64_t es = int64_t(memory::dtype_size(dt)), mine = (el + n - 1) / n;
                        elements += mine;
                        part += rounded(mine * master_es);
                        // Mixed precision: the update widens a part's gradient first.
                        if (es != master_es) wide = std::max(wide, rounded(mine * master_es));
                        bs.push_back({rounded(el * es), rounded(mine * es), rounded(el * master_es),
                                      int64_t(transport::collective_scratch_bytes(
                                          transport::Collective::reduce_scatter, size_t(el),
                                          size_t(es), group_size, size_t(mine), true))});
                      });
      // The push, two buckets in flight (ServerWindow): bucket j's input is allocated
      // while j - 1's reduce-scatter runs, and j's runs while j - 1's part is copied out;
      // the parts copied stay until the update.
      for (size_t j = 0; j < bs.size(); ++j) {
        const Bucket& b = bs[j];
        if (j > 0) {
          const Bucket& a = bs[j - 1];
          push = std::max(push, grads + a.in + b.in + std::max(a.scratch, a.grad + b.scratch));
          grads += a.grad;
        }
        if (j + 1 == bs.size()) {
          push = std::max(push, grads + b.in + std::max(b.scratch, b.grad));
          grads += b.grad;
        }
      }
      // The pull, after the update has dropped the gradients: with one server, each
      // bucket's whole all-gather output, two in flight; several servers send their parts
      // from the masters (pull_bucket).
      if (n == 1) {
        std::vector<int64_t> outs;
        for (const Bucket& b : bs) outs.push_back(b.out);
        std::sort(outs.rbegin(), outs.rend());
        pull = std::max(pull, outs.empty() ? 0 : outs[0] + (outs.size() > 1 ? outs[1] : 0));
      }
    }
    // The masters, their optimizer state and the s pulls kept throughout; then the largest
    // of the push, STEP (every part's gradient, the norm and loss vector) and the pull.
    const int64_t held = part * (1 + opt + p.dp_sync.max_staleness);
    const int64_t step = grads + wide + step_vector_bytes(r, g.num_layers());
    for (int k : r.server_ranks()) {
      RankEstimate re;
      re.rank = k;
      re.layers = "(parameter server)";
      re.parameters = elements;
      re.param_bytes = part;
      re.grad_bytes = part;
      re.optimizer_bytes = part * opt;
      re.peak = held + std::max({push, step, pull});
      re.activation_peak = re.peak - re.param_bytes - re.grad_bytes - re.optimizer_bytes;
      // The servers hold equal parts: the first one over its capacity speaks for all.
      if (p.device_memory > 0 && re.peak > p.device_memory && k == r.server_ranks().front())
        e.problems.push_back("rank " + std::to_string(k) + " (parameter server) needs " +
                             memory::format_bytes(double(re.peak)) + ", over its capacity of " +
                             memory::format_bytes(double(p.device_memory)) + " by " +
                             memory::format_bytes(double(re.peak - p.device_memory)) +
                             (n > 1 ? " (as do the other server ranks)" : ""));
      re.dp_bytes = double(p.dp) * double(part);
      re.compute_time = e.servers.update;
      re.busy_fraction = e.step_time > 0 ? re.compute_time / e.step_time : 0;
      e.dp_bytes_per_step = std::max(e.dp_bytes_per_step, re.dp_bytes);
      e.ranks.push_back(re);
    }
  }
  return e;
}

int64_t rate_units_per_sample(const Graph& g) {
  if (g.find_value("images") >= 0) return 1;
  const stages::Value& tokens = g.values[size_t(g.inputs.front())];
  return std::max<int64_t>(1, memory::shape_numel(tokens.type.shape));
}

const char* rate_unit(const Graph& g) {
  return g.find_value("images") >= 0 ? "img/s" : "tokens/s";
}

std::string format_estimate(const ResolvedPlan& r, const PlanEstimate& e) {
  const Plan& p = r.plan;
  const Graph& g = *r.graph;
  std::string out;
  char line[512];
  // A degree per pipeline rank: one number when they agree, else the list.
  auto degrees = [&](const std::vector<int>& d) {
    std::string all;
    for (size_t i = 0; i < d.size(); ++i) all += (i ? "," : "") + std::to_string(d[i]);
    return std::all_of(d.begin(), d.end(), [&](int x) { return x == d.front(); })
               ? std::to_string(d.front())
               : all;
  };
  const std::string tp = degrees(p.tp);
  // 124 M, 1.10 B (%.3g wrote a billion as 1.1e+03 M).
  const double params = double(g.num_parameters());
  char count[32];
  if (params >= 1e9)
    std::snprintf(count, sizeof count, "%.2f B", params / 1e9);
  else
    std::snprintf(count, sizeof count, "%.3g M", params / 1e6);
  std::snprintf(
      line, sizeof line,
      "%s (%d layers, %s parameters) on %d device%s: dp %d x pp %d x tp %s%s; schedule %s, %d "
      "micro-batch%s of %lld sample%s (global batch %lld); optimizer %s\n",
      g.name.c_str(), g.num_layers(), count, p.devices, p.devices == 1 ? "" : "s", p.dp, p.pp,
      tp.c_str(), p.has_spatial() ? (" x spatial " + degrees(p.spatial)).c_str() : "",
      r.schedule.name.c_str(), p.micro_batches, p.micro_batches == 1 ? "" : "es",
      (long long)p.micro_batch_size, p.micro_batch_size == 1 ? "" : "s", (long long)p.global_batch,
      p.optimizer.c_str());
  out += line;
  const bool sp = p.has_spatial();
  if (sp) {
    // The tiles per pipeline rank, and the halo rows each tile receives per micro-batch.
    out += "spatial split (images tiled by rows):";
    for (int q = 0; q < p.pp; ++q) {
      out += std::string(q ? "," : "") + " pipeline rank " + std::to_string(q) + ": " +
             std::to_string(p.spatial_of(q)) + " tile(s)";
      if (p.spatial_of(q) > 1) {
        double halo = 0;
        for (int s : r.stages_of(q)) {
          const int k = r.chunk_of_stage[size_t(s)];
          halo += spatial_halo_bytes(g, r.spatial[size_t(q)], r.chunk_first[size_t(k)],
                                     r.chunk_last[size_t(k)], p.micro_batch_size, &r.sharding);
        }
        out += ", halos " + memory::format_bytes(halo) + " per micro-batch";
      }
    }
    out += "\n";
  }
  if (p.sharding() != OptimizerSharding::none) {
    out.pop_back();
    if (p.dp_sync.ps_ranks > 0)
      out += ", its state sharded over the " + std::to_string(p.dp_sync.ps_ranks) +
             " extra server ranks (none on the replicas)\n";
    else
      out += ", its state sharded over the data-parallel replicas (" +
             std::string(p.dp_sync.parameter_server() ? "each serving its part"
                                                      : sharding_name(p.optimizer_sharding)) +
             ")\n";
  }
  if (p.dp > 1) {
    std::string mode = std::string(dp_sync_name(p.dp_sync.mode));
    if (p.dp_sync.local())
      mode += " every " + std::to_string(p.dp_sync.sync_every) + " steps, outer optimizer " +
              std::string(outer_optimizer_name(p.dp_sync.outer));
    else if (p.dp_sync.mode == DpSync::Mode::gossip)
      mode += " with " + std::to_string(p.dp_sync.peers) + " peer(s) per step";
    else if (p.dp_sync.parameter_server())
      mode += " with staleness " + std::to_string(p.dp_sync.max_staleness) +
              (p.dp_sync.ps_ranks > 0 ? " (" + std::to_string(p.dp_sync.ps_ranks) +
                                            " extra server ranks serve the parts)"
                                      : std::string(" (the replicas' ranks serve their parts)"));
    out += "data-parallel sync " + mode + ": " + memory::format_bytes(e.dp_bytes_per_step) +
           " sent per step by the busiest rank\n";
    if (p.dp_sync.ps_ranks > 0) {
      std::snprintf(line, sizeof line,
                    "parameter servers per step: push %.3f ms (overlapped with the backward), "
                    "servers' update %.3f ms, pull %.3f ms; %.3f ms of update and pull exposed "
                    "after %d step(s) of compute\n",
                    1e3 * e.servers.push, 1e3 * e.servers.update, 1e3 * e.servers.pull,
                    1e3 * e.servers.exposed, p.dp_sync.max_staleness);
      out += line;
    }
  }
  std::snprintf(line, sizeof line,
                "%-5s %-3s %-3s %-3s %s%-24s %12s %12s %12s %12s %12s %10s %6s\n", "rank", "dp",
                "pp", "tp", sp ? "sp  " : "", "layers", "parameters", "weights", "grads+optim",
                "activations", "peak", "compute", "busy");
  out += line;
  for (const RankEstimate& re : e.ranks) {
    if (r.is_server(re.rank)) {
      std::snprintf(
          line, sizeof line,
          "rank %d: parameter server, %lld elements of parts, %s of parts, %s of "
          "gradient parts and optimizer state, peak %s, sends %s per step, updates in %.2fms\n",
          re.rank, (long long)re.parameters, memory::format_bytes(double(re.param_bytes)).c_str(),
          memory::format_bytes(double(re.grad_bytes + re.optimizer_bytes)).c_str(),
          memory::format_bytes(double(re.peak)).c_str(), memory::format_bytes(re.dp_bytes).c_str(),
          1e3 * re.compute_time);
      out += line;
      continue;
    }
    std::string layers = re.layers.size() > 24 ? re.layers.substr(0, 21) + "..." : re.layers;
    bool over = p.device_memory > 0 && re.peak > p.device_memory;
    std::snprintf(line, sizeof line,
                  "%-5d %-3d %-3d %-3d %s%-24s %12lld %12s %12s %12s %12s %8.2fms %5.1f%%%s\n",
                  re.rank, re.coord.dp, re.coord.pp, re.coord.tp,
                  sp ? (std::to_string(re.coord.sp) +
                        std::string(4 - std::to_string(re.coord.sp).size(), ' '))
                           .c_str()
                     : "",
                  layers.c_str(), (long long)re.parameters,
                  memory::format_bytes(double(re.param_bytes)).c_str(),
                  memory::format_bytes(double(re.grad_bytes + re.optimizer_bytes)).c_str(),
                  memory::format_bytes(double(re.activation_peak)).c_str(),
                  memory::format_bytes(double(re.peak)).c_str(), 1e3 * re.compute_time,
                  100 * re.busy_fraction, over ? "  OVER CAPACITY" : "");
    out += line;
  }
  for (const auto& b : derive_boundaries(p)) {
    if (b["pattern"] == "one-to-one" || b["pattern"] == "in-memory") continue;
    std::snprintf(line, sizeof line,
                  "boundary after stage %d: pipeline rank %d (tp %d) -> %d (tp %d): %s\n",
                  b["after_stage"].get<int>(), b["from_pipeline_rank"].get<int>(),
                  b["from_tp"].get<int>(), b["to_pipeline_rank"].get<int>(), b["to_tp"].get<int>(),
                  b["pattern"].get<std::string>().c_str());
    out += line;
  }
  std::snprintf(
      line, sizeof line,
      "predicted step time %.3f ms (bubble %.1f%%), %.0f %s; peak memory %s of %s per "
      "device\n",
      1e3 * e.step_time, 100 * e.bubble, e.tokens_per_second, rate_unit(g),
      memory::format_bytes(double(e.max_peak())).c_str(),
      p.device_memory > 0 ? memory::format_bytes(double(p.device_memory)).c_str() : "unlimited");
  out += line;
  // The estimate is held to within 3% of the measured peak, either way (docs/partitioner.md).
  if (p.device_memory > 0 && e.max_peak() <= p.device_memory &&
      double(e.max_peak()) > 0.97 * double(p.device_memory))
    out +=
        "note: the peak is within 3% of the capacity, the estimate's accuracy: the run may "
        "still run out of memory (a smaller micro-batch, recompute or sharding leaves room)\n";
  if (e.time_sliced_cores > 0)
    out += time_sliced_line(r.world(), e.time_sliced_per_host, e.time_sliced_cores);
  out += e.collective_extras_note;
  return out;
}

std::string collective_extras_line(const ResolvedPlan& r, const Machine& m) {
  const int ranks = ranks_per_host(r, m);
  std::string out;
  auto line = [&](const char* what, int degree, double extra, const char* field) {
    if (extra <= 0) return;
    char text[200];
    std::snprintf(text, sizeof text,
                  "each %s (degree %d) costs %.1f us beyond the link model among %d ranks per "
                  "host (the cost file's %s)\n",
                  what, degree, 1e6 * extra, ranks, field);
    out += text;
  };
  for (int t : std::set<int>(r.sharding.layer_tp.begin(), r.sharding.layer_tp.end()))
    if (t > 1)
      line("tensor-parallel collective", t, tp_collective_extra(m, t, ranks), "tp_collective");
  for (int s : std::set<int>(r.plan.spatial.begin(), r.plan.spatial.end()))
    if (s > 1) line("spatial exchange", s, spatial_exchange_extra(m, s, ranks), "spatial_exchange");
  return out;
}

std::string cost_source(const CostModel& model, const std::string& costs_path) {
  if (const MeasuredCosts* m = model.measured_costs()) {
    // The sizes say how far a plan's micro-batches are from what was timed (a size between
    // two timed ones is interpolated, others scaled by their FLOPs).
    std::string sizes;
    const std::vector<int64_t> b = m->batches();
    for (size_t i = 0; i < b.size(); ++i)
      sizes += (i == 0 ? "" : i + 1 == b.size() ? " and " : ", ") + std::to_string(b[i]);
    return "the measured op costs in " + costs_path + " (timed at micro-batches of " + sizes +
           (b.size() == 1 && b[0] == 1 ? " sample)" : " samples)");
  }
  char text[200];
  std::snprintf(text, sizeof text,
                "FLOPs at a nominal %.3g GFLOP/s per device (--flops); `baton profile` measures "
                "this machine's ops, for --costs",
                model.machine().flops / 1e9);
  return text;
}

std::string time_sliced_line(int ranks, int per_host, int cores) {
  const std::string where =
      per_host < ranks
          ? ", " + std::to_string(per_host) + " on each host's " + std::to_string(cores) + " cores"
          : " on " + std::to_string(cores) + " cores";
  return "its " + std::to_string(ranks) + " ranks time-sliced" + where +
         ", each bound to one (docs/transport.md)\n";
}

}  // namespace baton::partitioner
