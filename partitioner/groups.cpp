#include "partitioner/groups.h"

#include <algorithm>

#include "partitioner/routing.h"

namespace baton::partitioner {

RankView rank_view(const ResolvedPlan& r, int rank) {
  RankView v;
  v.rank = rank;
  v.coord = r.layout.coord(rank);
  v.tp_degree = r.plan.tp[size_t(v.coord.pp)];
  v.spatial_degree = r.spatial_of(v.coord.pp);
  for (int s : r.stages_of(v.coord.pp)) {
    RankStage st;
    st.stage = s;
    st.chunk = r.chunk_of_stage[size_t(s)];
    st.first_layer = r.chunk_first[size_t(st.chunk)];
    st.last_layer = r.chunk_last[size_t(st.chunk)];
    st.recompute = r.recompute[size_t(st.chunk)];
    v.stages.push_back(st);
  }
  v.tp_group = r.layout.tp_group(rank);
  v.dp_group = r.layout.dp_group(rank);
  v.spatial_group = r.layout.spatial_group(rank);
  if (r.plan.sync_batchnorm && r.plan.dp > 1) {
    for (int d = 0; d < r.plan.dp; ++d)
      for (int q : v.spatial_group) {
        RankCoord c = r.layout.coord(q);
        v.batchnorm_group.push_back(r.layout.rank(d, c.pp, c.tp, c.sp));
      }
  } else {
    v.batchnorm_group = v.spatial_group;
  }
  std::set<int> peers;
  for (int s = 0; s < r.schedule.num_stages(); ++s)
    for (const schedule::Transfer& t : boundary_transfers(r, rank, s)) peers.insert(t.peer);
  v.pipeline_peers.assign(peers.begin(), peers.end());
  return v;
}

std::vector<GradientGroup> gradient_groups(const ResolvedPlan& r, int rank) {
  const stages::Graph& g = *r.graph;
  const RankCoord me = r.layout.coord(rank);
  const std::vector<int> mine = r.stages_of(me.pp);
  std::set<int> held;
  for (int s : mine) {
    int k = r.chunk_of_stage[size_t(s)];
    for (int p : g.params_used(r.chunk_first[size_t(k)], r.chunk_last[size_t(k)])) held.insert(p);
  }
  std::vector<GradientGroup> out;
  for (int p : held) {
    const stages::Param& prm = g.params[size_t(p)];
    auto uses = [&](int stage) {
      int k = r.chunk_of_stage[size_t(stage)];
      for (int l : prm.layers)
        if (l >= r.chunk_first[size_t(k)] && l < r.chunk_last[size_t(k)]) return true;
      return false;
    };
    GradientGroup gg;
    gg.param = p;
    gg.name = prm.name;
    std::set<int> pps;
    for (int s = 0; s < r.schedule.num_stages(); ++s)
      if (uses(s)) pps.insert(r.schedule.placement[size_t(s)]);
    // Replica-major, pipeline ranks and tiles ascending: the layout's rank order, so
    // already sorted (a vector: a set's nodes cost most of a large plan's evaluation).
    for (int d = 0; d < r.plan.dp; ++d)
      for (int pp : pps) {
        if (r.partial_grad(pp, p))
          for (int sp = 0; sp < r.spatial_of(pp); ++sp)
            gg.ranks.push_back(r.layout.rank(d, pp, me.tp, sp));
        else
          gg.ranks.push_back(r.layout.rank(d, pp, me.tp, me.sp));
      }
    // Local SGD, gossip: gradients are summed only inside the replica (tied parameters);
    // the replicas meet in the parameter sync instead (the data-parallel group).
    if (r.plan.dp_sync.independent())
      std::erase_if(gg.ranks, [&](int q) { return r.layout.coord(q).dp != me.dp; });
    if (!std::is_sorted(gg.ranks.begin(), gg.ranks.end()))
      std::sort(gg.ranks.begin(), gg.ranks.end());
    gg.ranks.erase(std::unique(gg.ranks.begin(), gg.ranks.end()), gg.ranks.end());
    for (int s : mine)
      if (uses(s)) gg.local_stages.push_back(s);
    out.push_back(std::move(gg));
  }
  return out;
}

bool optimizer_sharded(const ResolvedPlan& r, int rank, const GradientGroup& gg) {
  if (r.plan.sharding() == OptimizerSharding::none || r.plan.dp <= 1) return false;
  if (!r.graph->params[size_t(gg.param)].trainable) return false;
  std::vector<int> dp = r.layout.dp_group(rank);
  std::sort(dp.begin(), dp.end());
  if (gg.ranks == dp) return true;
  // A parameter used on tiles: its gradient group is its pipeline rank's tiles times the
  // replicas (gradient_groups above), each member with the same summed gradient. Not with
  // extra parameter-server ranks, which serve the replicas' parts.
  const RankCoord me = r.layout.coord(rank);
  if (r.plan.dp_sync.ps_ranks > 0 || !r.partial_grad(me.pp, gg.param)) return false;
  std::vector<int> tiles;
  for (int d = 0; d < r.plan.dp; ++d)
    for (int sp = 0; sp < r.spatial_of(me.pp); ++sp)
      tiles.push_back(r.layout.rank(d, me.pp, me.tp, sp));
  std::sort(tiles.begin(), tiles.end());
  return gg.ranks == tiles;
}

std::vector<int> reduction_members(const ResolvedPlan& r, int rank, const GradientGroup& gg) {
  std::vector<int> out = gg.ranks;
  if (r.plan.dp_sync.ps_ranks > 0 && optimizer_sharded(r, rank, gg))
    for (int s : r.server_ranks()) out.push_back(s);
  return out;
}

}  // namespace baton::partitioner
