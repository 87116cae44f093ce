// The memory model: what a Stage allocates, in the bytes the device allocator counts
// (every tensor rounded up to 64 bytes). Persistent: parameters, their gradients (one
// accumulator per layer of the stage that uses a parameter, plus a total when there are
// several) and the optimizer state. Per micro-batch: the activation stash from F to B,
// what W still needs from B to W, and the transient peaks inside F, B, W and BW (B and
// W as one pass, each node's W right after its B).
//
// The per-micro-batch figures come from walking the stage's nodes the way Stage runs
// them (stages/stage.cpp): which values forward keeps, when it frees each input after
// its last reader, which outputs alias their input (views, in-place reductions, the
// cross-entropy gradient written over the logits), what each op's backward allocates
// and what the gradient slots share. It is a model of the code, so a change there that
// changes memory must change it too; tests compare it with the allocator's measured
// peak (tests/partitioner/test_memory.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "schedule/schedule.h"
#include "stages/graph.h"

namespace baton::partitioner {

// One micro-batch through one stage, in bytes.
struct MicroBatchMemory {
  int64_t stash = 0;          // held from the end of its F until its B starts
  int64_t w_stash = 0;        // held from the end of its B until its W ends
  int64_t forward_peak = 0;   // its own live bytes at their most during F (inputs included)
  int64_t backward_peak = 0;  // during B (its stash, incoming and outgoing gradients included)
  int64_t weight_peak = 0;    // during W
  // Part of the stash that B does not release as it goes but only when it ends (values
  // kept that no backward reads, such as token ids kept for a recomputed layer).
  int64_t held_through_backward = 0;
  // During B and W run as one action (BW, Stage::backward): each node's W right after its
  // B, so no W stash builds up; its stash, incoming and outgoing gradients included.
  int64_t fused_peak = 0;
  // zero2: during the stage's last W of the step, which also starts the reductions of
  // its whole gradients (WalkSpec::started_in_w); 0: weight_peak. The same for the
  // step's last BW; 0: fused_peak.
  int64_t last_weight_peak = 0, last_fused_peak = 0;
};

struct StageMemory {
  int64_t params = 0, grads = 0, optimizer = 0;
  // The sharded optimizer (plan field optimizer_sharding, ZeRO): the part of `optimizer`
  // this rank does not hold because its data-parallel peers hold it (zero_optimizer_saving).
  int64_t optimizer_sharding_saved = 0;
  // zero2: the part of `grads` it does not hold (ZeroGradMemory::saved).
  int64_t grad_sharding_saved = 0;
  MicroBatchMemory mb;
  int64_t persistent() const {
    return params + grads + optimizer - optimizer_sharding_saved - grad_sharding_saved;
  }
};

// One of the engine's gradient buckets (engine/detail/grad_reducer.h), as the walk's W
// reduces it (WalkSpec::sharded_grads, started_in_w).
struct GradBucket {
  std::vector<int> params;  // parameter ids of the walk's graph
  int64_t scratch = 0;      // its collective's scratch bytes
};

// What a walk needs: a graph, a layer range and what crosses its ends.
struct WalkSpec {
  const stages::Graph* graph = nullptr;
  int first = 0, last = 0;
  std::vector<int> boundary_in;   // floating values that enter (they get gradients)
  std::vector<int> boundary_out;  // values handed on (and the loss)
  std::vector<int> model_in;      // other inputs read (token ids): given, no gradients
  std::set<int> recompute;        // recomputed layers
  int64_t batch = 1;              // samples per micro-batch
  int tp = 1;                     // the tensor-parallel group its comm ops run over
  // zero2: the buckets of the stage's sharded gradients, made and reduced inside W.
  std::vector<GradBucket> sharded_grads;
  // The step's last W also starts the reduction of each bucket of whole gradients once
  // its last parameter is final (Executor's ParamReadyFn): its flat copy (several
  // parameters) and `scratch` are held from then on, the collective waiting for peers
  // that reach theirs later (the other pipeline rank of a tied parameter).
  std::vector<GradBucket> started_in_w;
  // A spatial split's tile: whether a tile lies above and below it (an edge tile
  // exchanges halos on one side only).
  bool tile_above = true, tile_below = true;
};
// The spec of a Stage over layers [first, last) of g.
WalkSpec stage_walk_spec(const stages::Graph& g, int first, int last,
                         const std::set<int>& recompute, int64_t batch, int tp = 1);

MicroBatchMemory walk_micro_batch(const WalkSpec& spec);
// Parameters, gradients and optimizer state (`optimizer_states` tensors per trainable
// parameter: a buffer its op updates has none) of a Stage over [first, last).
void persistent_memory(const stages::Graph& g, int first, int last, int optimizer_states,
                       StageMemory& out);
// `tiles`: the spatial degree of a tile graph's stage; its figures are the most any tile
// position (top edge, bottom edge, between) reaches.
StageMemory stage_memory(const stages::Graph& g, int first, int last,
                         const std::set<int>& recompute, int64_t batch, int optimizer_states,
                         int tp = 1, int tiles = 1);

// The estimate counts bytes in int64. What it cannot count: 2^62 bytes, half the range,
// so that the sums of what the bound below leaves out (parameters, buffers) cannot wrap.
inline constexpr double kCountableBytes = 4611686018427387904.0;
// An upper bound, in double (it may not fit an int64), of the bytes one micro-batch of
// `batch` samples takes anywhere in g: every value of the model at once and a gradient of
// each. A plan holding up to m micro-batches on a rank is countable while m + 1 of them
// stay within kCountableBytes (micro_batches_countable); `baton plan --check` and the
// search refuse it otherwise, rather than let a sum wrap.
double micro_batch_bytes_bound(const stages::Graph& g, int64_t batch);
bool micro_batches_countable(const stages::Graph& g, int64_t batch, int64_t micro_batches);

// ---- the sharded optimizer (ZeRO) ----

// Optimizer-state bytes a data-parallel rank holds for a parameter of `numel` elements of
// `dtype_size` bytes when the state is sharded over `dp` replicas: `optimizer_states`
// tensors of about numel / dp elements, each rounded as the allocator does. An
// approximation: the engine cuts each gradient bucket rather than each parameter into
// equal parts (engine/detail/grad_reducer.h), which shard_parts follows exactly.
int64_t sharded_optimizer_bytes(int64_t numel, int dtype_size, int dp, int optimizer_states);
// What sharding saves on one parameter: its whole state less sharded_optimizer_bytes.
int64_t zero_optimizer_saving(int64_t numel, int dtype_size, int dp, int optimizer_states);

// The engine's gradient buckets (engine/detail/grad_reducer.cpp, cut_buckets) of the
// parameters `ids` of g: in descending id order, consecutive ones of one dtype up to
// bucket_bytes (a larger one alone) and, given `stage_of` (ZeRO-2), of one stage.
std::vector<std::vector<int>> gradient_buckets(const stages::Graph& g, std::vector<int> ids,
                                               size_t bucket_bytes,
                                               const std::map<int, int>* stage_of = nullptr);

// The elements of each parameter of `ids` that member `me` of `members` holds (its part of
// the optimizer state, and under zero2 of the gradient) as the engine shards them
// (engine/detail/grad_reducer.cpp, add_group): the parameters cut into buckets as
// gradient_buckets cuts them, each bucket's flattened elements into `members` equal parts
// (the first elements % members one more), member q holding part q. So a rank holds some
// parameters whole, parts of those a boundary crosses and none of the others (0 elements:
// no optimizer state, but zero2's gradient accumulator still takes an allocation): its
// total is its parts of the buckets, not ceil(numel / members) of each parameter, and it
// differs between the members.
std::map<int, int64_t> shard_parts(const stages::Graph& g, std::vector<int> ids,
                                   size_t bucket_bytes, int members, int me,
                                   const std::map<int, int>* stage_of = nullptr);

// zero2 (gradients sharded too) for the parameters `ids` of a stage of layers
// [first, last) sharded over `dp` parts: `saved`, the persistent gradient bytes it does
// not hold (the whole gradients and per-layer accumulators less a part-sized accumulator
// of about numel / dp elements each), and `buckets`, the engine's buckets of them (`ids`
// in descending order cut at bucket_bytes and where the dtype changes) with their
// in-place reduce-scatter's scratch, for the walk's W (WalkSpec::sharded_grads): a
// micro-batch's W holds the gradients it has made until their bucket is reduced, so
// its peak depends on where in W each bucket fills, which only the walk knows;
// `held_bound` bounds it without a walk (every gradient buffer and sum at once, and the
// largest bucket's flat copy and scratch).
struct ZeroGradMemory {
  int64_t saved = 0, held_bound = 0;
  std::vector<GradBucket> buckets;
};
// `parts`: the elements of each parameter the rank holds (shard_parts); absent, about
// numel / dp.
ZeroGradMemory zero2_grad_memory(const stages::Graph& g, int first, int last, std::vector<int> ids,
                                 int dp, size_t bucket_bytes,
                                 const std::map<int, int64_t>* parts = nullptr);

// ---- a rank over a schedule ----

// The peak of a rank that runs the compute actions of `s` (F, B, W, BW) for its stages:
// the persistent bytes of its stages plus, at every action, the held stashes of the
// micro-batches in flight and the running action's own peak. `stages[k]` is the memory of
// schedule stage k (only the rank's stages are read).
int64_t rank_peak(const schedule::Schedule& s, int rank, const std::vector<StageMemory>& stages);

// Micro-batches of model inputs the input loader (engine/detail/input_loader.cpp) holds
// beside those the rank's stages hold, for rank `rank` of `s` whose stages k with
// reads[k] read model inputs, during each action of s.ranks[rank] and (the last element)
// at the step's end: those made and not yet taken, at most `input_ahead` and at most what
// is queued then (the step's micro-batches the rank reads and the next step's, less those
// taken by that action or before), or on a GPU (`staged`) the staging ring's input_ahead
// + 1 slots; and those taken but kept for a later stage of the rank that reads them too.
std::vector<int> loader_micro_batches_at(const schedule::Schedule& s, int rank,
                                         const std::vector<bool>& reads, int input_ahead,
                                         bool staged);
// The most of them, at any point of the step.
int loader_micro_batches(const schedule::Schedule& s, int rank, const std::vector<bool>& reads,
                         int input_ahead, bool staged);

// What a rank's executor holds besides its stages' tensors (engine/executor.cpp and
// engine/detail/), in allocator bytes.
struct RankBuffers {
  int64_t loader = 0;  // the input loader's micro-batches made ahead held all the time
  // At the step's end (each with the sends made after the last compute action, still
  // held, and the loader's micro-batches beyond `loader`):
  int64_t reduction = 0;  // the gradient buckets' flat copies and the all-reduces' scratch
  int64_t step = 0;       // STEP's norm and loss vector (and its all-reduce's scratch)
  // After the optimizer step (GradReducer::gather_params): the sharded buckets of several
  // parameters, each all-gathered in place in a flat copy, all at once, and the scratch;
  // with a parameter server's staleness, the pull posted before the oldest completes.
  int64_t gather = 0;
  // Once, at the first step's start (GradReducer::seed_servers): replica 0 seeding extra
  // parameter-server ranks builds each bucket of its parameters whole, one at a time, and
  // scatters it; 0 on every other rank.
  int64_t start = 0;
  // Per action of the rank's compute-only list (s.ranks[rank]): the receive buffers
  // posted ahead of it and not yet waited for, the sends made since the previous
  // compute action (still held by the transport), the values handed between two of the
  // rank's stages not yet taken, and the loader's micro-batches beyond those it holds
  // all the time.
  std::vector<int64_t> posted;
  // Per action of the same list: at the sends right after it that send a value in blocks
  // of rows (Executor::do_send copies each block while the whole value is still held),
  // what the rank holds besides its stages' stashes: the whole values and their copies,
  // the other sends held, the receives posted, the loader's and handed values; 0: none.
  std::vector<int64_t> sending;
};
// rank_peak with the executor's buffers: the walk's peak plus the loader's and the
// posted receives' bytes at each action, or the step's end (the reduction, STEP, the
// all-gather after it) or the first step's start if that is higher.
int64_t rank_peak(const schedule::Schedule& s, int rank, const std::vector<StageMemory>& stages,
                  const RankBuffers& buffers);

// The same peak as a function of the memory figures of a rank holding ONE stage: the
// maximum over terms a*stash + b*w_stash + (forward|backward|weight|fused peak of the
// running micro-batch). Built once per schedule and rank, evaluated in O(terms) by the cut.
struct PeakTerm {
  int a = 0, b = 0;
  int kind = 0;  // 0: forward, 1: backward, 2: weight, 3: B and W as one action (BW)
};
std::vector<PeakTerm> peak_terms(const schedule::Schedule& s, int rank);
// The terms of one of a rank's stages alone: only its micro-batches and its own actions
// count. The sum over a rank's stages of their peaks bounds the rank's peak from above.
std::vector<PeakTerm> peak_terms_of_stage(const schedule::Schedule& s, int rank, int stage);
int64_t eval_peak(const std::vector<PeakTerm>& terms, const MicroBatchMemory& m);

}  // namespace baton::partitioner
