// The partition plan: how a model is laid out on N devices (pipeline stages and their
// layers, tensor-parallel degree per pipeline rank, data-parallel replicas), the
// schedule and batch that run it, recompute choices, split overrides per op and the
// device memory capacity. Its JSON form (docs/formats/plan.md) is read and written here;
// reading checks the form of every field (file, JSON path, expected vs found; unknown
// fields are errors). What needs the model (layers, splits, degrees that must divide
// dimensions) is checked by resolve_plan() in partitioner/evaluate.h.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace baton::partitioner {

// How a node is split over its tensor-parallel group (plan overrides and decisions).
//   none    replicated: every rank computes the whole op
//   column  linear: output features split (Megatron's ColumnParallelLinear)
//   row     linear: input features split, partial outputs summed (RowParallelLinear)
//   vocab   embedding rows / cross-entropy over vocabulary-split logits
//   heads   attention: heads split
enum class SplitKind { none, column, row, vocab, heads };
std::string_view split_name(SplitKind k);
// Throws InputError naming `where` unless `name` is one of the names above.
SplitKind parse_split(std::string_view name, const std::string& where);

// How data-parallel replicas hold the optimizer state (docs/formats/plan.md):
//   none   every replica holds all of it (and every gradient, all-reduced)
//   zero1  optimizer state sharded over the replicas: gradient buckets reduce-scattered,
//          each replica updates its shard of the parameters, which are then all-gathered
//   zero2  zero1, and a replica keeps only its shard of the reduced gradients
enum class OptimizerSharding { none, zero1, zero2 };
std::string_view sharding_name(OptimizerSharding s);

// How data-parallel replicas agree on the parameters (plan field dp_sync,
// docs/formats/plan.md):
//   allreduce  gradients summed over the replicas every step (the default)
//   local-sgd  each replica trains sync_every steps on its own gradients, then the
//              replicas average their parameter deltas since the last sync and apply the
//              outer optimizer: `average` (the mean of the replicas' parameters) or
//              `nesterov` (Nesterov momentum on the averaged delta: DiLoCo)
//   gossip     each replica steps on its own gradients, then averages its parameters with
//              a partner in each of `peers` rounds of random pairings drawn from
//              (seed, step), so runs are reproducible
//   parameter-server
//              the parameters sharded over servers (ps_ranks 0: the replicas' own ranks,
//              zero1's parts); each replica pushes its gradient parts to their servers
//              (a reduce-scatter), each server updates its part, the replicas pull the
//              parameters (an all-gather) that may complete up to max_staleness steps
//              later: step t runs on the parameters of exactly the updates before
//              t - max_staleness (0: synchronous, allreduce's numbers)
struct DpSync {
  enum class Mode { allreduce, local_sgd, gossip, parameter_server };
  enum class Outer { average, nesterov };
  Mode mode = Mode::allreduce;
  int sync_every = 1;  // H (local-sgd)
  Outer outer = Outer::average;
  double outer_lr = 0.7;        // nesterov (DiLoCo's values)
  double outer_momentum = 0.9;  // nesterov
  int peers = 1;                // gossip: pairing rounds per step
  uint64_t seed = 1;            // gossip: the pairings' seed
  int max_staleness = 0;        // parameter-server: s
  int ps_ranks = 0;             // parameter-server: extra serving ranks (0: the replicas')
  std::string json_path;        // "plan.json: $.dp_sync" (messages; "" when not written)
  bool local() const { return mode == Mode::local_sgd; }
  bool parameter_server() const { return mode == Mode::parameter_server; }
  // Replicas step on their own gradients (no data-parallel gradient reduction).
  bool independent() const { return mode == Mode::local_sgd || mode == Mode::gossip; }
};
std::string_view dp_sync_name(DpSync::Mode m);
std::string_view outer_optimizer_name(DpSync::Outer o);
nlohmann::json dp_sync_to_json(const DpSync& s);
// Reads a dp_sync value (the plan field's form; `source` names it in errors, such as
// "--dp-sync"); InputError naming the path, what was expected and what was found.
DpSync parse_dp_sync(const nlohmann::json& j, const std::string& source);

// One model chunk (a schedule stage of direction 0): a contiguous range of layers.
struct PlanStage {
  // Either a half-open range of layer indices ...
  int first_layer = -1, last_layer = -1;
  // ... or the layer names as written (resolved against the model by resolve_plan).
  std::vector<std::string> layer_names;
  // ... or, for a plan that leaves "stages" out, every layer (resolve_plan fills the range).
  bool every_layer = false;
  // Recomputed layers: all, none, or by name (resolved against the model).
  bool recompute_all = false;
  std::vector<std::string> recompute_names;
  std::vector<int> recompute;  // resolved layer indices, ascending
  // The pipeline ranks holding the chunk as written (empty: not written); resolve_plan
  // checks them against the schedule's placement and fills them in.
  std::vector<int> pipeline_ranks;
  // The spatial split (partitioner/spatial.h): the images' rows tiled over this many
  // ranks per tensor-parallel rank of the chunk's pipeline ranks (1: none).
  int spatial = 1;
  std::string json_path;  // "plan.json: $.stages[2]", for messages
};

// The most a plan's counts may be (micro-batches, samples a micro-batch, degrees): what
// read_plan accepts, and so what the search may propose.
inline constexpr int64_t kMaxPlanCount = int64_t(1) << 24;

struct Plan {
  static constexpr int kVersion = 1;

  std::string source;  // the file it was read from ("" when built in memory)
  // The model: a path (resolved against the plan file's folder) or an embedded model JSON.
  std::string model_path;           // as written
  std::string model_path_resolved;  // what to open
  nlohmann::json model_json;        // embedded model (null when a path is given)

  int devices = 0;
  int64_t device_memory = 0;  // bytes per device; 0: unlimited
  // What the ranks run on: "cpu" (default) or "cuda" (each rank the GPU of its local
  // rank), and how they talk: "ucx" (the default on the CPU) or "nccl" (the default on
  // GPUs; needs "cuda"). docs/formats/plan.md.
  std::string device = "cpu";
  std::string transport;  // "" as written absent: the device's default (transport_of())
  std::string transport_of() const {
    return transport.empty() ? (device == "cuda" ? "nccl" : "ucx") : transport;
  }
  int dp = 1, pp = 1;
  std::vector<int> tp;  // tensor-parallel degree per pipeline rank (size pp)
  // Spatial degree per pipeline rank, from the stages' `spatial` and the schedule's
  // placement (empty: 1 everywhere).
  std::vector<int> spatial;
  // Batch-norm statistics reduced over the data-parallel replicas too (plan field
  // sync_batchnorm), so every replica normalises with the whole global micro-batch's.
  bool sync_batchnorm = false;

  std::string schedule = "1f1b";    // a generator name (schedule/generators.h)
  int micro_batches = 1;            // per step and data-parallel replica
  int chunks = 0;                   // stages per pipeline rank (v); 0: the schedule's own
  int64_t micro_batch_size = 1;     // samples per micro-batch
  int64_t global_batch = 0;         // dp * micro_batches * micro_batch_size
  std::string optimizer = "adamw";  // adamw, sgd, sgd-momentum (state: 2, 0, 1 tensors)
  bool optimizer_stated = false;    // the file names it: baton train --plan trains with it
  OptimizerSharding optimizer_sharding = OptimizerSharding::none;
  // How STEP meets the global gradient norm (docs/engine.md): "synchronous" waits for it
  // before updating; "post-validated" updates at once and rolls back when it must.
  bool post_validated_step = false;
  DpSync dp_sync;
  // The sharding the engine and the models use: optimizer_sharding, or zero1's parts for
  // a parameter server (its servers hold the state of their parts only).
  OptimizerSharding sharding() const {
    return dp_sync.parameter_server() ? OptimizerSharding::zero1 : optimizer_sharding;
  }

  std::vector<PlanStage> stages;                   // model chunks in model order
  std::map<std::string, SplitKind> splits;         // node name -> override
  std::map<std::string, std::string> split_paths;  // node name -> JSON path (messages)
  nlohmann::json predicted;  // what `baton plan` predicted (informational; may be null)
  // How activations cross each pipeline boundary, as written (null when absent); derived
  // from the degrees and the placement, checked by resolve_plan when present.
  nlohmann::json boundaries;
  std::string boundaries_path;

  bool uniform_tp() const;
  int spatial_of(int p) const { return spatial.empty() ? 1 : spatial[size_t(p)]; }
  bool has_spatial() const;
  int64_t replica_size() const;  // ranks per data-parallel replica: the sum of tp x spatial
  std::string where(const std::string& json_path) const;  // "plan.json: $.x"
};

// How replicated activations cross a boundary from t sender ranks to u receivers
// (partitioner/routing.h): "one-to-one", "broadcast" (t < u) or "gather" (t > u).
std::string_view boundary_pattern(int t, int u);
// The boundaries of a plan whose stages have their pipeline ranks filled in: one entry
// per pair of consecutive model chunks (direction 0 of a bidirectional schedule).
nlohmann::json derive_boundaries(const Plan& p);

// The plan's rank layout (dp, tp and spatial degrees per pipeline rank).
class Layout;
Layout plan_layout(const Plan& p);

// Optimizer state tensors per parameter.
// The plan's data-parallel synchronisation against the rest of it (gossip's peers within
// the replicas, what a parameter server, local SGD, gossip and a post-validated step do
// not combine with); InputError naming the JSON path. parse_plan checks it; the search
// skips the candidates it refuses.
void check_dp_sync(const Plan& p);

int optimizer_states(const std::string& optimizer);

// InputError at $.stages unless the plan has as many stages as `chunks`, the model chunks
// its schedule `schedule_name` holds on its pipeline ranks. parse_plan checks it before the
// device count a spatial degree sets (counted over the stages); resolve_plan for all plans.
void check_stage_count(const Plan& p, int chunks, const std::string& schedule_name);

// Reads a plan file; InputError naming the file and JSON path on any bad field.
Plan read_plan(const std::string& path);
// Parses a plan document; relative model paths are resolved against `base_dir`.
Plan parse_plan(const nlohmann::json& j, const std::string& source, const std::string& base_dir);
// The JSON form (stages written as index ranges). `base_dir`: model paths are written
// relative to it when they lie below it.
nlohmann::json plan_to_json(const Plan& p, const std::string& base_dir = "");
// Writes atomically (a temporary file renamed over the target).
void write_plan(const Plan& p, const std::string& path);

}  // namespace baton::partitioner
