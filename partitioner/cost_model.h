// The cost model: per layer of a model at a tensor-parallel degree and micro-batch size,
// the FLOPs and times of F, B and W (compute and the layer's tensor-parallel
// collectives), the bytes of its parameters, gradients and optimizer state, and its
// activation memory per micro-batch with and without recompute; per cut, the bytes a
// pipeline boundary carries.
//
// Times come from FLOPs at the machine's rate (`Machine`) or, when a cost file from
// `baton profile` is given, from the times measured on this machine for each op
// (scaled by the micro-batch size, and by the FLOP ratio for split ops). Collectives
// are costed with the ring model: an all-reduce of n bytes over t ranks moves
// 2 (t - 1) / t * n bytes per rank in 2 (t - 1) steps; an all-gather half of that.
//
// Layers with the same structure (the blocks of a transformer) are costed once: the
// table is built per distinct layer, so a 10,000-block model costs a handful of walks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "partitioner/layout.h"
#include "partitioner/memory_model.h"
#include "partitioner/plan.h"
#include "partitioner/tensor_parallel.h"
#include "stages/graph.h"

namespace baton::partitioner {

// A device and its links. Defaults: one core of this project's CPU machines and shared
// memory between processes (docs/partitioner.md says where each figure comes from).
struct Machine {
  double flops = 5e10;               // FLOP/s one device sustains on baton's kernels
  double memory_bandwidth = 1.6e10;  // bytes/s (the optimizer step streams its state)
  double tp_bandwidth = 8e9;         // bytes/s per rank inside a tensor-parallel group
  double tp_latency = 2e-6;          // s per collective step
  double p2p_bandwidth = 8e9;        // bytes/s between pipeline ranks
  double p2p_latency = 2e-6;         // s per message
  double dp_bandwidth = 4e9;         // bytes/s per rank for data-parallel all-reduces
  double dp_latency = 2e-6;
  // How much slower a rank computes when k ranks share its host (shared cores and memory
  // bandwidth): k -> factor, measured by `baton profile --colocated k` (the cost model
  // takes it from the cost file); empty: no slowdown.
  std::map<int, double> colocated;
  // Ranks per host; 0: every rank of the plan on one host, as `baton launch` runs them.
  int ranks_per_host = 0;
  // The cores a host's ranks share; 0: the cost file's (`cores`), else unknown. With
  // more ranks than cores on one host, each bound to a core (transport::bind_dealt),
  // the simulator shares every core among the ranks computing on it, and the ops are
  // slowed only by what `colocated` measured beyond the cores' fair share.
  int cores_per_host = 0;
  // What a tensor-parallel collective costs beyond tp_latency and tp_bandwidth's time
  // among co-located ranks that compute between collectives (the wait for a partner
  // that shares its core, the hand-offs): degree t -> ranks per host k -> seconds per
  // collective, as core time (slowed like the ops). Measured by `baton profile
  // --colocated k --tp t` (the cost model takes it from the cost file); empty: none.
  std::map<int, std::map<int, double>> tp_collective;
  // The same for a spatial split's exchanges (halos, tiled batch norms' statistics, the
  // pooled mean: partitioner/spatial.h, spatial_exchanges), with the tile's ops' own rate
  // beside the whole op's share folded in: degree s -> ranks per host k -> seconds per
  // exchange, as core time. Measured by `baton profile --colocated k --spatial s`.
  std::map<int, std::map<int, double>> spatial_exchange;
};

// The figures in range: rates (flops, the bandwidths) positive and finite, latencies 0 or
// more and finite, the per-host counts 0 or more; InputError naming the figure as
// `name` gives it ("--tp-bandwidth" for the command's flags, "machine.tp_bandwidth" for
// Python's dict) from its field name ("tp_bandwidth").
void check_machine(const Machine& m, const std::function<std::string(const char*)>& name);

// The compute slowdown of `ranks` ranks on one host: linear between the measured points
// (1 rank: 1.0), the largest measured one's beyond them.
double colocation_slowdown(const Machine& m, int ranks);

// The extra seconds of one collective at degree t with `ranks` ranks on the host
// (Machine::tp_collective): linear between the measured counts, the nearest one's
// beyond them; 0 for a degree not measured.
double tp_collective_extra(const Machine& m, int t, int ranks);
// The same for one spatial exchange at degree s (Machine::spatial_exchange).
double spatial_exchange_extra(const Machine& m, int s, int ranks);

// Time-slicing (Machine::cores_per_host): per core, the ranks of each pipeline rank it
// runs (schedule::Costs::core_ranks) when a host's ranks (Machine::ranks_per_host, or
// all) outnumber its cores, a row per core of each host; empty otherwise.
std::vector<std::vector<double>> core_ranks(const Layout& layout, const Machine& m);

double all_reduce_time(double bytes, int ranks, double bandwidth, double latency);
double all_gather_time(double bytes_out, int ranks, double bandwidth, double latency);

// Data-parallel traffic of one step per rank (what it sends, the ring model) for `bytes`
// of gradients over `replicas` ranks under a dp_sync mode: `allreduce` all-reduces the
// gradients every step, 2 (n - 1) / n * bytes (zero1's reduce-scatter and all-gather
// together move the same); `local-sgd` all-reduces the parameter deltas (the same size)
// once every sync_every steps, so 1/H of it per step on average; `gossip` sends the
// parameters (the same size) to one partner in each of its `peers` rounds;
// `parameter-server` pushes the gradient parts to their servers (a reduce-scatter,
// (n - 1) / n * bytes) and pulls the parameters (an all-gather, the same): allreduce's
// bytes, whatever the staleness; with extra server ranks (ps_ranks) a replica pushes its
// gradients once (bytes) and each server sends its part to every replica (evaluate.h's
// server ranks: replicas x bytes / ps_ranks).
double dp_bytes_per_step(const DpSync& s, double bytes, int replicas);
// The same traffic's time per step on the machine's data-parallel link (local-sgd's sync
// amortised over its H steps). parameter-server: the push, and the part of the pull that
// max_staleness steps of `compute` (seconds of compute per step on the rank) do not hide
// (the pull of an update completes up to s steps later, overlapped with them); with extra
// server ranks ps_server_times' push and exposed pull for one replica position (`bytes`
// all that is served), without the servers' update (schedule_costs adds it).
double dp_time_per_step(const DpSync& s, double bytes, int replicas, double bandwidth,
                        double latency, double compute = 0);
// parameter-server: the pull's time left exposed after s steps of `compute` hide it.
double ps_pull_exposed(const DpSync& s, double pull, double compute);

// A step's times with extra server ranks (dp_sync parameter-server, ps_ranks N > 0) for a
// replica rank whose served gradients are `bytes`, `served` the bytes the servers hold in
// all (one replica's served gradients, every replica position's), over `replicas`
// replicas on the data-parallel link (point to point, one link per rank):
//   push    every replica rank sends its gradients to the N servers (a 1/N part to
//           each), and each server receives replicas x served / N over its own link,
//           shared by all replicas: latency + max(bytes, replicas x served / N) / bandwidth;
//   update  the servers' optimizer step on their parts (served / N each, streaming master,
//           gradient and state: (3 + 2 x optimizer_states) x served / N / memory bandwidth),
//           which the replicas do not run;
//   pull    each server sends its part to every replica: the push's time again;
//   exposed what s = max_staleness steps of `compute` (the rank's compute per step) leave
//           of the update and the pull (ps_pull_exposed): the pull of an update completes
//           up to s steps later.
struct ServerTimes {
  double push = 0, update = 0, pull = 0, exposed = 0;
};
ServerTimes ps_server_times(const DpSync& s, double bytes, double served, int replicas,
                            const Machine& m, int optimizer_states, double compute);

// Measured op times (the cost file `baton profile` writes; docs/formats/costs.md).
struct MeasuredCosts {
  struct Op {
    std::string op;
    double forward = 0, backward_input = 0, backward_weight = 0;  // seconds
    double flops = 0;   // F + B + W FLOPs of the logical op at `batch` (for split ops' ratio)
    std::string where;  // "<cost file>: $.ops.<name>" for messages (read_measured_costs)
  };
  std::string model;  // the model's name, for a consistency check
  int64_t batch = 1;  // the micro-batch size the ops were timed at
  int threads = 1;
  std::map<std::string, Op> ops;  // by logical node name
  // The ops' time with k ranks on the host over their time alone (`--colocated k`).
  std::map<int, double> colocated;
  int cores = 0;  // the cores those ranks shared (0: not measured)
  // The ops' time within whole training passes over the sum of their times one by one:
  // every measured op's time is multiplied by it. A cost file holds it within
  // [kInStepMin, kInStepMax].
  double in_step = 1;
  static constexpr double kInStepMin = 0.01, kInStepMax = 100;
  // Bytes/s the optimizer step streams at (Machine::memory_bandwidth), from the AdamW
  // step of the whole passes that measure in_step: (3 + 2 x 2) x the parameters' bytes
  // over its time, the bytes the cost model counts; 0: not measured (the Machine's).
  double memory_bandwidth = 0;
  static constexpr double kBandwidthMin = 1e6, kBandwidthMax = 1e15;
  // By tensor-parallel degree t: the ops of one rank's shard (split at t), by node name,
  // those that do not communicate (`baton profile --tp t`). A split op found here is
  // taken as measured at its own shape instead of the whole op's time by its FLOP share.
  std::map<int, std::map<std::string, Op>> tp_ops;
  // By degree t, by ranks per host k: Machine::tp_collective (`--colocated k --tp t`).
  std::map<int, std::map<int, double>> tp_collective;
  // By spatial degree s, by ranks per host k: Machine::spatial_exchange (`--colocated k
  // --spatial s`).
  std::map<int, std::map<int, double>> spatial_exchange;
  // The same ops timed at further micro-batch sizes (`baton profile --batch b1 b2 ...`),
  // ascending, none equal to `batch`: an op's time at a size between two measured ones is
  // interpolated between them, since a GEMM of 8 samples need not take 8 times one's.
  // The co-located factors, tp_collective and spatial_exchange are measured at `batch` alone.
  struct AtBatch {
    int64_t batch = 1;
    double in_step = 1;
    std::map<std::string, Op> ops;
    std::map<int, std::map<std::string, Op>> tp_ops;
  };
  std::vector<AtBatch> more_batches;
  // Every micro-batch size the ops were timed at, ascending.
  std::vector<int64_t> batches() const;
};
MeasuredCosts read_measured_costs(const std::string& path);
void write_measured_costs(const MeasuredCosts& c, const std::string& path);

// One layer at one degree and micro-batch size.
struct LayerCost {
  double f = 0, b = 0, w = 0;  // seconds
  double f_flops = 0, b_flops = 0, w_flops = 0;
  double tp_forward_bytes = 0, tp_backward_bytes = 0;           // payload of its collectives
  int tp = 1;                                                   // its tensor-parallel degree
  int tp_forward_collectives = 0, tp_backward_collectives = 0;  // nodes that communicate
  MicroBatchMemory mem, mem_recompute;
};

// Persistent bytes of a parameter (local shard) and the layers that use it.
struct ParamUse {
  int param = -1;
  int64_t bytes = 0;
  std::vector<int> layers;
};

// Everything the cut and the plan evaluation need at one degree and micro-batch size.
struct CostTable {
  int tp = 1;
  int64_t batch = 1;
  std::vector<LayerCost> layers;
  // Parameter bytes (one copy) per layer of the parameters only that layer uses, and the
  // parameters several layers use (tied embeddings): stage sums in O(1 + shared).
  std::vector<int64_t> own_param_bytes;
  std::vector<ParamUse> shared_params;
  std::vector<double> cut_bytes;  // per cut position 0..L: activation bytes crossing it
  // Per layer: bytes of the model inputs (token ids) it is the first to read. The data
  // loader's tensors are held through a stage's whole F, so a stage's forward peak
  // counts those of all its layers (composition below).
  std::vector<int64_t> input_bytes;
  std::vector<bool> replicated_cut;  // from the sharding
  // Prefix sums over layers (size L + 1) of f, b, w and of own_param_bytes.
  std::vector<double> pf, pb, pw;
  std::vector<int64_t> pparams;
  double total_time(bool recompute) const;  // F + B + W of every layer
  // Parameter bytes (one copy each) of the parameters layers [first, last) use.
  int64_t param_bytes(int first, int last) const;
};

// The memory of a stage over layers [first, last) composed from the table's per-layer
// figures (an upper bound of the exact walk: each layer is walked with its input and
// incoming gradient held by a caller; tests/partitioner/test_memory.cpp compares them).
StageMemory compose_stage_memory(const CostTable& t, int first, int last,
                                 const std::set<int>& recompute, int optimizer_states);

class CostModel {
 public:
  CostModel(std::shared_ptr<const stages::Graph> logical, Machine machine,
            const MeasuredCosts* measured = nullptr);

  const stages::Graph& graph() const { return *g_; }
  const Machine& machine() const { return machine_; }
  bool measured() const { return measured_ != nullptr; }
  const MeasuredCosts* measured_costs() const { return measured_; }

  // The table at a uniform degree (cached). `overrides` as the plan gives them.
  const CostTable& table(int tp, int64_t batch, const SplitOverrides& overrides = {},
                         const std::string& where = "--tp");
  // The sharding behind table(tp, ...) (cached with it).
  const Sharding& sharding(int tp, int64_t batch, const SplitOverrides& overrides = {},
                           const std::string& where = "--tp");
  // The table for given per-layer degrees and a sharding already made (per-stage TP).
  CostTable table_for(const Sharding& s, int64_t batch);
  // Warns once when the cost file timed the ops at another thread count than each of a
  // plan's `world` ranks computes with by default on this host (baton train --threads 0:
  // the cores divided among the ranks of a host, machine().ranks_per_host or all of them);
  // not for a plan on `device` "cuda", whose ops do not run on the threads.
  void warn_threads(int world, const std::string& device);

 private:
  // Layers with one signature share one LayerCost per batch: class per layer and a
  // representative layer per class.
  struct Classes {
    std::vector<int> of_layer;
    std::vector<int> representative;
    std::vector<std::string> key;
    // What does not depend on the batch: parameter bytes, per-sample cut bytes and the
    // model inputs each layer reads first (per-sample bytes).
    std::vector<int64_t> own_param_bytes;
    std::vector<ParamUse> shared_params;
    std::vector<double> cut_bytes_per_sample;
    std::vector<std::vector<int64_t>> inputs_per_sample;
  };
  Classes classify(const Sharding& s) const;
  CostTable build_table(const Sharding& s, const Classes& classes, int64_t batch);
  LayerCost layer_cost(const Sharding& s, int layer, const std::string& sig, int64_t batch);
  // A node's measured F, B and W (in_step applied) at degree t and this micro-batch size,
  // whose F + B + W FLOPs on a rank are `flops`; nothing when the profile lacks it.
  struct OpTimes {
    double f = 0, b = 0, w = 0;
  };
  void warn_foreign_costs() const;
  std::optional<OpTimes> measured_op(const stages::Node& node, int t, int64_t batch,
                                     double flops) const;
  void signature(const Sharding& s, int layer, std::vector<int64_t>& key) const;
  std::string static_signature(int layer) const;

  std::shared_ptr<const stages::Graph> g_;
  Machine machine_;
  const MeasuredCosts* measured_;
  std::string key(int tp, int64_t batch, const SplitOverrides& overrides) const;
  std::map<std::string, std::unique_ptr<CostTable>> tables_;
  std::map<std::string, std::unique_ptr<Sharding>> shardings_;
  std::map<std::string, Classes> classes_;
  std::vector<int> static_id_;  // per layer: its structure's id
  std::map<std::string, LayerCost> layer_cache_;
  bool threads_warned_ = false;
};

}  // namespace baton::partitioner
