// Profiling: times every op of a model on this machine (F, B and W of one micro-batch,
// warm-up then the median of repeats) and returns the cost file the cost model uses
// instead of FLOPs at a nominal rate. Ops with the same type, attributes and shapes (the
// blocks of a transformer) are timed once.
#pragma once

#include <cstdint>

#include "memory/device.h"
#include "partitioner/cost_model.h"
#include "stages/graph.h"

namespace baton::transport {
class Communicator;
}

namespace baton::partitioner {

struct ProfileOptions {
  int64_t batch = 1;  // samples per micro-batch
  int threads = 1;    // kernel threads while timing
  int warmup = 2;     // untimed runs per op
  int repeats = 5;    // timed runs per op; the median is kept
  // The mean instead: what a long run sees, the other processes' time slices included
  // (`--colocated` with more ranks than cores), where the median keeps an op's own time.
  bool mean = false;
  // Where the ops run: on a GPU each timed call is bracketed by a device synchronize, so
  // a time is the kernels' and not only their launch (the graph's float dtype decides
  // the precision: a bf16 graph times the bf16 kernels).
  memory::Device device = memory::Device::cpu();
  // Also time whole training passes and store how much longer the ops take in them
  // (MeasuredCosts::in_step). Only with warmup >= 1: an op's first call pays one-time
  // costs (oneDNN's JIT, first touches), which made the ops' sum 30-200x a pass.
  bool in_step = true;
  // time_passes of a tensor-parallel shard's graph: the group its collectives run in.
  transport::Communicator* tp = nullptr;
  // time_passes of a spatial tile's graph: the group its halos and statistics go through.
  transport::Communicator* spatial = nullptr;
  // time_passes: more than 0, the timed passes also stop once they have run this many
  // seconds, after two at least (a large model's pass takes seconds, and `repeats` of
  // them, alone and beside copies, twice, made GPT-2 124M's profile 11 minutes).
  double pass_seconds = 0;
  // Ranks that must run as many passes (their passes run collectives together, or each
  // is the others' load): they stop on the clock of this group's rank 0, which it
  // broadcasts before each pass.
  transport::Communicator* pass_group = nullptr;
};

// The budget `baton profile` gives each set of timed whole passes (pass_seconds).
constexpr double kPassSeconds = 20;

// Micro-batches per pass when timing whole passes (in_step, `--colocated`).
constexpr int kPassMicroBatches = 4;

struct ProfileSummary {
  int distinct_ops = 0;  // ops actually timed
  double seconds = 0;    // time profiling took
};

// InputError, naming the flag, for a batch, repeat or warm-up count profile_model refuses.
void check_profile_options(const ProfileOptions& options);

MeasuredCosts profile_model(const stages::Graph& g, const ProfileOptions& options,
                            ProfileSummary* summary = nullptr);

// The ops of one tensor-parallel rank's shard at degree t (every layer split as a plan
// with "tp": t splits it), into costs.tp_ops[t]: split GEMMs run below the whole op's
// rate by its FLOP share. Ops that communicate (the collectives, the vocabulary-parallel
// cross-entropy) are left out: the cost model keeps them analytic or from the whole op.
// Throws InputError when t does not divide what it must split.
// One tile's graph of a spatial split at degree s (partitioner/spatial.h); InputError when
// the model cannot be tiled so.
std::shared_ptr<stages::Graph> spatial_tile(const stages::Graph& g, int s);

// The per-exchange extra (MeasuredCosts::spatial_exchange) from whole passes that ranks
// sharing the host ran together in spatial groups of s: `tile` of a tile's graph with its
// exchanges, `whole` of the whole model. As tp_collective_from_pass: `whole` over the
// cost model's pass says how much the sharing slowed the ops; what it leaves of `tile`
// beyond the cost model's tile pass (a 1/s share of every op and the halos at the default
// link), over the tile's exchanges (spatial_exchanges). At least 0.
double spatial_exchange_from_pass(const stages::Graph& g, const MeasuredCosts& costs, int s,
                                  double tile, double whole);

void profile_tensor_parallel(const stages::Graph& g, const ProfileOptions& options, int t,
                             MeasuredCosts& costs);

// Whole passes over the model as one rank runs them: `micro_batches` micro-batches of
// options.batch samples, each through its forward, backward and weight gradients, the
// activations stashed between, then an AdamW step. The ops see the caches and the memory
// as in training, which timing each op alone on fresh inputs does not: what `--colocated`
// compares, alone and beside copies, and what `in_step` calibrates the op times by.
struct PassTimes {
  double pass = 0;          // seconds of a whole pass, the optimizer step included
  double compute = 0;       // of it, the micro-batches' F, B and W (the step excluded)
  double forward = 0;       // of that, their forwards
  double step = 0;          // of the pass, the AdamW step
  int64_t param_bytes = 0;  // the parameters' bytes the step updates (f32 masters)
  int passes = 0;           // how many were timed (options.pass_seconds may stop them early)
};
// The median of options.repeats after options.warmup (the mean with options.mean), of each.
PassTimes time_passes(const stages::Graph& g, const ProfileOptions& options, int micro_batches);

// One tensor-parallel rank's graph at degree t: every layer split as a plan with "tp": t
// splits it, the shard of rank `index` of its group.
std::shared_ptr<stages::Graph> tensor_parallel_shard(const stages::Graph& g, int t, int index);

// The per-collective extra (MeasuredCosts::tp_collective) from whole passes (their
// compute, time_passes) that ranks sharing the host ran together, in groups of t: `shard`
// of a degree-t shard with its collectives, `whole` of the whole model without any.
// `whole` over the cost model's pass (the ops of `costs`, their in_step) says how much
// the sharing slowed the ops; what it leaves of `shard` beyond the cost model's shard
// pass (tp_ops, the analytic collectives of the default links), over the shard's
// collectives. At least 0.
double tp_collective_from_pass(const stages::Graph& g, const MeasuredCosts& costs, int t,
                               double shard, double whole);

}  // namespace baton::partitioner
