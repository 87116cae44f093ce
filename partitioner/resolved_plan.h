// A plan checked against its model: resolve_plan runs every check that needs the model
// (errors name the plan file and the JSON path) and returns the ResolvedPlan everything
// downstream reads (the cost and memory estimate, the physical graphs, the engine);
// use_schedule replaces its generated schedule by one a user wrote.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "partitioner/layout.h"
#include "partitioner/plan.h"
#include "partitioner/spatial.h"
#include "partitioner/tensor_parallel.h"
#include "schedule/schedule.h"
#include "stages/graph.h"
#include "stages/model.h"

namespace baton::partitioner {

struct ResolvedPlan {
  Plan plan;
  Plan given;  // the plan as read, before resolve_plan filled in its placement and layers
  std::shared_ptr<const stages::Graph> graph;  // logical
  Layout layout;
  schedule::Schedule schedule;               // compute-only, from the generator
  std::vector<int> chunk_first, chunk_last;  // layers [first, last) per model chunk
  std::vector<int> chunk_of_stage;           // schedule stage -> model chunk
  std::vector<int> layer_tp;                 // degree per layer
  // Per pipeline rank: its spatial split (degree 1 and empty: none) of the logical graph,
  // which says which values are tiles and which parameters get partial gradients.
  std::vector<SpatialSplit> spatial;
  // Per pipeline rank with tensor parallelism and a spatial split: the split of its
  // tensor-parallel graph (shard_graph), from which its ranks' tile graphs are built.
  std::vector<SpatialSplit> shard_spatial;
  std::vector<std::set<int>> recompute;  // per chunk, layer indices
  Sharding sharding;

  int num_chunks() const { return int(chunk_first.size()); }
  // Chunk k lives on one pipeline rank (not DualPipe's two copies, whatever the schedule's
  // name: a file's header names it): its state is sharded under ZeRO.
  bool chunk_on_one_rank(int k) const { return plan.stages[size_t(k)].pipeline_ranks.size() <= 1; }
  // Every rank of the job: the replicas' (layout.world()) and after them a parameter
  // server's extra ranks (dp_sync ps_ranks), which hold no stage, only served parts.
  int world() const { return layout.world() + plan.dp_sync.ps_ranks; }
  bool is_server(int rank) const { return rank >= layout.world(); }
  std::vector<int> server_ranks() const {
    std::vector<int> out;
    for (int k = layout.world(); k < world(); ++k) out.push_back(k);
    return out;
  }
  int spatial_of(int pp) const { return plan.spatial_of(pp); }
  // Is logical value v a tile on pipeline rank pp?
  bool tiled(int pp, int v) const {
    return spatial_of(pp) > 1 && spatial[size_t(pp)].tiled[size_t(v)];
  }
  // Is logical parameter p's gradient partial on pipeline rank pp (summed over its tiles)?
  bool partial_grad(int pp, int p) const {
    return spatial_of(pp) > 1 && spatial[size_t(pp)].partial_grad[size_t(p)];
  }
  // Schedule stages held by pipeline rank pp (ascending).
  std::vector<int> stages_of(int pp) const;
  std::set<int> recompute_layers() const;  // every chunk's
};

// The physical graph of tensor-parallel index `tp` (mod each layer's degree) before any
// spatial split: build_physical over the plan's sharding.
std::shared_ptr<stages::Graph> shard_graph(const ResolvedPlan& r, int tp);

// Loads the model a plan names (or embeds); InputError naming the plan's field.
// `options`: the model's floating dtype (mixed precision loads the 16-bit one).
std::shared_ptr<const stages::Graph> load_plan_model(const Plan& plan,
                                                     const stages::LoadOptions& options = {});
// Checks every model-dependent field; InputError "<plan>: <path>: ..." otherwise. `own`:
// a schedule a user wrote (`source`: its file) to run in place of the plan's generated
// one (use_schedule).
ResolvedPlan resolve_plan(const Plan& plan, std::shared_ptr<const stages::Graph> graph,
                          const schedule::Schedule* own = nullptr, const std::string& source = {});

// The first node of `g` that moves running statistics in its forward (a batchnorm2d with
// running_mean and running_var), or "" when none does. DualPipe, whose two copies of a
// chunk each see half the micro-batches and are never merged but for their gradients,
// cannot keep them (resolve_plan refuses it; the search does not propose it).
std::string running_statistics_node(const stages::Graph& g);

// Batch norm's running statistics move at each training forward, in the order a stage
// runs them (a moving average: the order counts). "" when `r`'s model has none or its
// schedule runs the forwards of each stage holding batch norm in ascending micro-batch
// order, as the one-process run does; otherwise what differs, naming the first forward out
// of order and a batch norm of its stage: the run ends each step with other running
// statistics (the same losses).
std::string forward_order_note(const ResolvedPlan& r);

// The batchnorm2d of `g` that normalises the fewest positions (H x W) per sample and
// channel, and that count; {"", 0} when g has none. In training a micro-batch must give
// it at least 2 values per channel (the op refuses one: its variance is 0); resolve_plan
// refuses a plan whose micro-batches (joined over the replicas under sync_batchnorm)
// would not, and the search proposes none.
std::pair<std::string, int64_t> smallest_batchnorm_plane(const stages::Graph& g);

// Replaces a plan's generated schedule by another one over the same model chunks (a file a
// user wrote): the same ranks, micro-batches and chunk count, compute-only or lowered. Its
// placement may differ from the generator's (a V over three chunks where the plan names
// interleaved-1f1b with 3): the chunks' ranks, degrees and splits are then resolved
// again for it, and pipeline_ranks the plan lists must be its. InputError naming
// `source` otherwise.
void use_schedule(ResolvedPlan& r, const schedule::Schedule& s, const std::string& source);

}  // namespace baton::partitioner
