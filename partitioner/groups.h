// What one rank of a plan runs and whom it talks to: its stages and layer ranges, its
// physical graph, its tensor-parallel and data-parallel groups, its pipeline peers, and
// the gradient groups (ranks holding the same block of a logical parameter, whose
// gradients are summed). Every list holds global ranks, ascending unless said otherwise;
// the engine makes sub-communicators from them (Communicator::split).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "partitioner/evaluate.h"
#include "stages/graph.h"

namespace baton::partitioner {

struct RankStage {
  int stage = 0;  // schedule stage (the executor's stage index)
  int chunk = 0;  // model chunk
  int first_layer = 0, last_layer = 0;
  std::set<int> recompute;  // layers recomputed
};

struct RankView {
  int rank = 0;
  RankCoord coord;
  int tp_degree = 1;
  int spatial_degree = 1;
  std::vector<RankStage> stages;   // ascending schedule stage
  std::vector<int> tp_group;       // in tp order (its index in the group = coord.tp)
  std::vector<int> spatial_group;  // in tile order (its index = coord.sp)
  std::vector<int> dp_group;       // in dp order
  // The ranks whose batch-norm statistics it shares: its spatial group and, with
  // sync_batchnorm, those of every data-parallel replica (dp-major, then tile order).
  std::vector<int> batchnorm_group;
  std::vector<int> pipeline_peers;  // ranks it sends activations to or receives them from
};

RankView rank_view(const ResolvedPlan& r, int rank);

// Ranks that hold the same block of a logical parameter and so must sum its gradient:
// the data-parallel replicas and, for a tied parameter (GPT-2's wte in the embedding and
// the LM head), the ranks of the other pipeline ranks holding it with the same
// tensor-parallel index. A rank that holds the parameter in several of its own stages
// (local_stages) adds those first. Tensor-parallel peers never appear: a replicated
// parameter's gradient is already the same on each of them, a split one is another block.
// The tiles of a spatial group appear for a parameter used on tiles (each holds a partial
// gradient: partial_grad in partitioner/spatial.h); one used after the image is pooled has
// the same complete gradient on every tile, summed over the replicas of its tile only.
struct GradientGroup {
  int param = -1;  // logical parameter id
  std::string name;
  std::vector<int> ranks;         // including the rank itself
  std::vector<int> local_stages;  // schedule stages of this rank that hold it
};
std::vector<GradientGroup> gradient_groups(const ResolvedPlan& r, int rank);

// The sharded optimizer (plan field optimizer_sharding, ZeRO): is the optimizer state of
// gradient group `gg` of rank `rank` sharded? Yes when the plan shards, dp > 1, the
// parameter is trainable and only this rank's data-parallel group sums it, or (a
// parameter used on spatial tiles, partial_grad) only its pipeline rank's tiles times
// the replicas do. A tied parameter summed with other pipeline ranks keeps its whole state.
// The state is then cut over gg.ranks (so in gg.ranks.size() parts).
bool optimizer_sharded(const ResolvedPlan& r, int rank, const GradientGroup& gg);

// The members of gradient group gg's communicator: its ranks and, for a group whose parts
// extra parameter-server ranks serve (sharded, dp_sync ps_ranks > 0), those ranks after
// them (the last ps_ranks members hold the parts, the replicas none).
std::vector<int> reduction_members(const ResolvedPlan& r, int rank, const GradientGroup& gg);

}  // namespace baton::partitioner
