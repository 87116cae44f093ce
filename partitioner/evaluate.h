// What a plan (resolved against its model: partitioner/resolved_plan.h) is predicted to
// cost (evaluate_plan: per rank its layers, parameters, memory and time; the step time
// from schedule/'s simulator; what does not fit and by how much), and its physical graphs.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "partitioner/cost_model.h"
#include "partitioner/layout.h"
#include "partitioner/plan.h"
#include "partitioner/resolved_plan.h"
#include "partitioner/tensor_parallel.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "stages/graph.h"

namespace baton::partitioner {

struct RankEstimate {
  int rank = 0;
  RankCoord coord;
  std::vector<int> stages;  // schedule stages it runs
  std::string layers;       // "h.0 .. h.3" (and further chunks)
  int64_t parameters = 0;   // elements of its parameter shards
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  int64_t activation_peak = 0;  // stashes in flight + the running action at the peak
  int64_t peak = 0;             // persistent + activation_peak
  double compute_time = 0;      // its F + B + W per step, seconds
  // Bytes it sends per step to its data-parallel peers (cost_model.h's dp_bytes_per_step
  // of its gradients under the plan's dp_sync; local-sgd's sync averaged over H steps).
  double dp_bytes = 0;
  double busy_fraction = 0;  // compute_time / step time
};

// What a step's rate counts per sample, as `baton train` counts it: the tokens of a token
// model's sample, one image of a model that reads images (its input "images").
int64_t rate_units_per_sample(const stages::Graph& g);
// Its unit: "tokens/s" or "img/s".
const char* rate_unit(const stages::Graph& g);

struct PlanEstimate {
  std::vector<RankEstimate> ranks;  // every rank (replicas repeat the first replica's figures)
  double step_time = 0;             // simulated, seconds
  double bubble = 0;                // mean idle share of the pipeline ranks
  double tokens_per_second = 0;
  int64_t tokens_per_step = 0;
  std::vector<std::string> problems;  // ranks over their capacity: which, by how much
  double dp_bytes_per_step = 0;       // the most any rank sends to its data-parallel peers
  // The host's cores when the plan's ranks outnumber them and the step was simulated
  // time-sliced (Machine::cores_per_host); 0 otherwise.
  int time_sliced_cores = 0;
  int time_sliced_per_host = 0;  // ranks sharing one host's cores
  // Its tensor-parallel collectives' and spatial exchanges' cost beyond the link model
  // (Machine::tp_collective, spatial_exchange) at the plan's ranks per host:
  // collective_extras_line's text, empty when none.
  std::string collective_extras_note;
  // Extra parameter-server ranks (dp_sync ps_ranks > 0): the step's push, the servers'
  // update, the pull and what staleness leaves exposed of them (cost_model.h's
  // ps_server_times), for the replica rank the servers keep waiting longest.
  ServerTimes servers;
  bool fits() const { return problems.empty(); }
  int64_t max_peak() const;
};

struct EvaluateOptions {
  // Exact memory from walking each stage of the physical graph (true), or composed from
  // per-layer figures (false: what the search uses; an upper bound of the exact one).
  bool exact_memory = true;
  // The executor's settings that size its buffers (engine/executor.h's defaults; `baton
  // train --plan` passes its own).
  size_t bucket_bytes = size_t(4) << 20;  // gradient bucket size
  int recv_ahead = 2;                     // receives posted ahead
  int input_ahead = 4;                    // micro-batches the input loader makes ahead
  // false: no input loader, the inputs made at each forward (the one-process loop on a
  // CPU, engine/trainer.cpp), held by the stage alone.
  bool input_loader = true;
};

PlanEstimate evaluate_plan(const ResolvedPlan& r, CostModel& model,
                           const EvaluateOptions& options = {});

// The physical graph of a rank: its pipeline rank's layers built for its tensor-parallel
// index (and other layers for that index modulo their degree, so tied parameters and cut
// values have their local types).
std::shared_ptr<stages::Graph> physical_graph(const ResolvedPlan& r, int rank);

// What rank `rank`'s executor holds besides its stages (memory_model.h's RankBuffers):
// the loader's staged inputs, the receives posted ahead, the gradient buckets' flat
// copies and the collectives' scratch, as engine/ allocates them. `physical`: the rank's
// physical graph (or one of its pipeline rank's: shards have equal sizes).
RankBuffers rank_buffers(const ResolvedPlan& r, int rank, const stages::Graph& physical,
                         const EvaluateOptions& options = {});

// Extra parameter-server ranks (dp_sync ps_ranks > 0): a bound of each server's peak from
// the cost table alone, without physical graphs (the search's; evaluate_plan counts the
// engine's buckets exactly): its part of every served byte as parameter, summed gradient
// and optimizer state (each bucket's part rounded up), two whole buckets in flight (at
// most bucket_bytes or the largest parameter) and STEP's vector. 0 without servers.
int64_t ps_server_peak_bound(const ResolvedPlan& r, const CostTable& table, int optimizer_states,
                             size_t bucket_bytes);

// The text table `baton plan --check` prints.
std::string format_estimate(const ResolvedPlan& r, const PlanEstimate& e);
// Where the model's times come from, for the commands' output ("times from ..."): the
// cost file it was given (`costs_path`), or the FLOP rate they assume, said to be nominal
// (a user reading a step time should know it was not measured on any machine).
std::string cost_source(const CostModel& model, const std::string& costs_path);
// The line saying a step was simulated time-sliced: `ranks`, `per_host` of them on each
// host's `cores`.
std::string time_sliced_line(int ranks, int per_host, int cores);
// The lines saying what each tensor-parallel collective and spatial exchange of the plan
// costs beyond the link model among its ranks per host (Machine::tp_collective,
// spatial_exchange); empty when nothing.
std::string collective_extras_line(const ResolvedPlan& r, const Machine& m);

// The factor the plan's compute is slowed by on a shared host (schedule_costs' ops):
// Machine::colocated at the ranks per host, or with more ranks than the host's cores
// (time-sliced by the simulator) what it measured beyond their fair share, at least 1;
// beyond the largest count measured, that count's.
double compute_slowdown(const ResolvedPlan& r, const Machine& m);

// What a spatial tile adds to layer `layer`'s F and B beyond 1/s of its ops: the halos'
// bytes at the tensor-parallel bandwidth, and its exchanges with the group at what the
// profile measured among `host_ranks` (Machine::spatial_exchange); before the slowdown.
// One model for schedule_costs and the search's tile tables.
struct SpatialLayerExtra {
  double forward = 0, backward = 0;
};
SpatialLayerExtra spatial_layer_extra(const stages::Graph& g, const SpatialSplit& split, int layer,
                                      int64_t batch, const Sharding* sharding, const Machine& m,
                                      int host_ranks);

// The schedule costs of a plan (what the simulator runs on), from a cost table; the
// activation bytes from `stage_memory` (per schedule stage) when given.
schedule::Costs schedule_costs(const ResolvedPlan& r, const CostTable& table, const Machine& m,
                               const std::vector<StageMemory>& stage_mem = {});

}  // namespace baton::partitioner
