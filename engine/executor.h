// The executor: runs one rank's lowered action list (F, B, W, BW, SEND/RECV, REDUCE, STEP)
// on the Stages the rank holds (one per schedule stage), over its communicators, one
// training step at a time. Receives are posted ahead of the actions that need them,
// sends are asynchronous, the model inputs of the next micro-batches are prepared by a
// background thread, and data-parallel (and tied-parameter) gradient reductions start
// bucket by bucket while the backward pass still runs. Every action's start and end can
// be recorded as a timeline in the simulator's form (schedule/timeline.h).
//
// The executor knows nothing of plans: what crosses each pipeline boundary (routes),
// which gradients are summed over which group, and how the loss and the gradient norm
// are combined across ranks come in as plain data (engine/rank_engine.h fills them
// from a plan).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/mixed_precision.h"
#include "memory/input_staging.h"
#include "schedule/schedule.h"
#include "schedule/timeline.h"
#include "schedule/transfer.h"
#include "stages/stage.h"
#include "transport/communicator.h"

namespace baton::engine {

namespace detail {
class InputLoader;
class GradReducer;
class LocalSgd;
class Gossip;
}  // namespace detail

// Parameters whose gradients are summed over a group of ranks (data-parallel replicas;
// the pipeline ranks that hold a tied parameter such as GPT-2's wte; DualPipe's two
// replicas of a chunk). A parameter held by several of this rank's stages is summed over
// them first (in ascending stage order), then over the group.
//
// A sharded group (ZeRO, `shard`): the data-parallel replicas of the parameters. Each
// bucket is reduce-scattered instead of all-reduced (equal parts of the flattened bucket,
// the all-reduce's own partition, in rank order); each member then updates only its part
// (Stage::set_optimizer_shard) and the parameters are all-gathered after the step.
struct GradGroup {
  transport::Communicator* comm = nullptr;  // null or size 1: the local sum only
  std::vector<int> params;                  // parameter ids of the rank's graph
  bool shard = false;
  // ZeRO-2 (with `shard`): each micro-batch's gradients reduce-scattered bucket by bucket
  // during its W into accumulators of the member's part (Stage::set_grad_shard); no
  // whole gradient is kept between micro-batches.
  bool shard_grads = false;
  // A parameter server's extra ranks (with `shard`): the last `servers` members of comm,
  // which hold every part (the replicas none: they update nothing of these parameters).
  int servers = 0;
};

// How the data-parallel replicas agree (plan field dp_sync; engine/detail/local_sgd.h).
// `local`: local SGD. The gradient groups then hold no data-parallel peer: each replica
// steps on its own gradients (their mean over its own samples: the executor scales them
// by `replicas`, the loss counting the whole job's targets), clips by its own norm, and
// after every sync_every-th step the replicas average their parameter deltas since the
// last sync over `replica_comm` and apply the outer optimizer (plain average, or
// Nesterov momentum with outer_lr and outer_momentum: DiLoCo).
//
// `gossip` (with `local`): instead of local SGD's periodic sync, after every step `peers`
// rounds of pairwise averaging with partners drawn from (seed, step)
// (engine/detail/gossip.h).
//
// `max_staleness` (a parameter server, not `local`: the sharded gradient groups' parts are
// its servers' parts): the all-gather of each update's parameters completes that many
// steps later (engine/detail/grad_reducer.h); 0: synchronous (zero1).
struct DpSyncConfig {
  bool local = false;
  int sync_every = 1;
  bool nesterov = false;
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool gossip = false;
  int peers = 1;
  uint64_t seed = 1;
  int max_staleness = 0;
  transport::Communicator* replica_comm = nullptr;  // the rank's data-parallel group
  int replicas = 1;                                 // its size (dp)
  int replica = 0;                                  // the rank's index in it
};

// Makes the model inputs (token ids, targets) of one micro-batch: fills `out` with the
// tensors named in `names`. Runs on the executor's loader thread.
using InputFn = std::function<void(const stages::MicroBatch& mb,
                                   const std::vector<std::string>& names, stages::TensorMap& out)>;

struct ExecutorConfig {
  schedule::Schedule schedule;  // lowered: transfers, REDUCE and STEP included (lower() it first)
  int rank = 0;                 // which of the schedule's ranks this is
  std::map<int, stages::Stage*> stages;    // schedule stage -> the Stage that runs it
  transport::Communicator* p2p = nullptr;  // carries the routes (the world)
  // What crosses each boundary b (between stages b and b + 1) to or from this rank.
  std::map<int, std::vector<schedule::Transfer>> routes;
  std::vector<GradGroup> grad_groups;
  size_t bucket_bytes = size_t(4) << 20;  // gradient bucket size (one all-reduce each)

  // Micro-batches: schedule micro-batch i of this rank is global micro-batch
  // first_micro_batch + i of the step (its samples follow from micro_batch_size).
  int64_t micro_batch_size = 1;
  int64_t first_micro_batch = 0;
  int64_t global_batch = 0;  // samples per step over every replica
  double loss_tokens = 0;    // targets the loss counts per step (MicroBatch::loss_tokens)
  InputFn inputs;
  int input_ahead = 4;  // micro-batches the loader prepares ahead
  // Where set (stages on a GPU: memory::cuda_staging_backend), the loader also stages the
  // inputs to the device ahead, through pinned buffers on a copy stream.
  std::function<std::unique_ptr<memory::StagingBackend>()> input_staging;
  int recv_ahead = 2;  // receives posted ahead of the current action (at least 1)

  // The loss and the gradient norm of the step, combined over `step_comm` (every rank of
  // the job, so every rank reports the same numbers): a vector of the per-layer sums of
  // squares (graph layers) and the per-micro-batch losses (global micro-batches) is
  // summed, each entry having exactly one contributor (or, for the norm, the blocks of a
  // tensor-parallel group), then added up in order.
  transport::Communicator* step_comm = nullptr;  // null: this rank alone
  int num_layers = 0;                            // of the graph: norm pieces
  int64_t loss_slots = 0;                        // micro-batches per step over every replica
  bool contribute_norm = true;  // false on data-parallel replicas other than the first
  std::function<bool(int param)> norm_counts;  // empty: every parameter counts
  bool contribute_loss = true;  // false on tensor-parallel ranks other than the first
  double grad_clip = 0;         // max global norm; 0: no clipping
  // The optimizer step (plan field `optimizer_step`; docs/engine.md, "Post-validated
  // optimizer steps"). Synchronous (false): STEP waits for the global norm, then clips
  // and updates. Post-validated (true): STEP updates as soon as this rank's own gradients
  // are reduced (unclipped), keeping a copy of what the update overwrites, while the
  // loss and norm all-reduce is in flight; when it arrives the step is validated: kept
  // (the synchronous step's bits), or rolled back and redone clipped when the clip
  // triggers, or rolled back (skipped) when the norm is not finite. Either way a step
  // whose global norm is not finite is skipped.
  bool post_validated = false;
  // Dynamic loss scaling (fp16; engine/loop.h's decide_update): the micro-batches' loss
  // scale, the step skipped on overflow. Every rank's scaler sees the same norms, so all
  // skip together. Null: none.
  kernels::LossScaler* loss_scaler = nullptr;
  DpSyncConfig dp_sync;

  int timeline_rank = 0;  // the rank events are recorded under (the global rank)

  // An evaluation executor: the schedule is forward-only (schedule/forward_only.h, lowered:
  // transfers and nothing else), its forwards keep nothing for backward and use no
  // dropout, and run_step() combines the loss over step_comm as a training step does but
  // touches no gradient and no optimizer (grad_groups must be empty). Another executor
  // over the same Stages, run between training steps.
  bool evaluation = false;
};

struct StepStats {
  int64_t step = 0;
  double loss = 0;        // summed over the step's micro-batches (the mean over its tokens)
  double grad_norm = 0;   // before clipping
  double loss_scale = 0;  // the step's loss scale (0: no loss scaling)
  bool skipped = false;   // the norm was not finite (an overflow): no parameter changed
  double seconds = 0;
  bool rolled_back = false;  // post-validated: the update was undone (redone clipped, or skipped)
  // Each global micro-batch's loss (loss_slots of them, summed into `loss`).
  std::vector<double> micro_batch_losses;
};

class Executor {
 public:
  // Validates the schedule (it must be lowered) and the config against the stages.
  explicit Executor(ExecutorConfig config);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs one training step: zero_grad, the rank's action list, the reductions, clipping
  // and the optimizer step. `next_step` (>= 0) lets the loader start on the next step's
  // inputs while this one runs. An evaluation executor runs its forwards and returns the
  // loss (grad_norm 0).
  StepStats run_step(int64_t step, int64_t next_step = -1);

  // Timeline recording (off by default): every action's start and end, in seconds since
  // the executor was made, compute on lane 0 and communication on lane 1; the input
  // loader's work on lane 2 ("LOAD" events), and a forward's wait for inputs the loader
  // had not made yet on lane 0 ("INPUT_WAIT", the forward then starts when they came).
  void set_recording(bool on);
  const std::vector<schedule::TimelineEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  // Adds an event of no action (a halo exchange's receive) when recording; from the
  // thread that runs the actions.
  void add_event(schedule::TimelineEvent e) {
    if (!recording_) return;
    e.rank = cfg_.timeline_rank;
    events_.push_back(std::move(e));
  }
  // Seconds since the executor was made (the events' clock).
  double now() const;

  const ExecutorConfig& config() const { return cfg_; }
  // Runs at every STEP after the gradient reductions, before the norm is taken (tests
  // inject a non-finite gradient with it). Empty: nothing runs.
  void set_before_optimizer(std::function<void(int64_t step)> fn) {
    before_optimizer_ = std::move(fn);
  }
  // Is the optimizer state of `param` of stage `stage` sharded over its data-parallel
  // group (GradGroup::shard)?
  bool optimizer_sharded(int stage, int param) const;
  // Local SGD (DpSyncConfig::local): the outer optimizer's state, null otherwise.
  detail::LocalSgd* local_sgd() { return local_sgd_.get(); }
  // The gradient reduction (a parameter server's in-flight pulls, for checkpoints).
  detail::GradReducer& reducer() { return *reducer_; }

 private:
  struct Pending;
  void post_recv(size_t index, int64_t step);
  void wait_recv(size_t index);
  void do_send(const schedule::Action& a, double t0);
  void compute(const schedule::Action& a, size_t index, int64_t step);
  void finish_step(StepStats& stats, double t0);
  void finish_evaluation(StepStats& stats);
  struct Backup;
  std::vector<Backup> save_update_point();
  void restore_update_point(std::vector<Backup>& saved);
  void update(double scale, double start, bool post_validated);
  stages::MicroBatch micro_batch(int mb, int64_t step) const;
  void poll_sends();
  void record(const schedule::Action& a, int lane, double start, double end, int peer = -1);

  ExecutorConfig cfg_;
  std::vector<schedule::Action> actions_;
  std::vector<size_t> recv_positions_;    // indices of RECV actions in actions_
  std::map<int, size_t> last_weight_;     // stage -> index of its last W or BW
  std::vector<std::string> input_names_;  // model inputs any of the stages reads
  std::unique_ptr<detail::InputLoader> loader_;
  std::unique_ptr<detail::GradReducer> reducer_;
  std::unique_ptr<detail::LocalSgd> local_sgd_;
  std::unique_ptr<detail::Gossip> gossip_;
  std::unique_ptr<Pending> pending_;
  int64_t queued_step_ = -1;            // the last step whose inputs were queued
  std::vector<memory::Tensor> losses_;  // per local micro-batch, this step (undefined: none here)
  bool recording_ = false;
  double compute_began_ = 0;  // the running compute action's start, after any input wait
  std::vector<schedule::TimelineEvent> events_;
  int64_t t_origin_ = 0;  // steady clock at construction, ns
  std::function<void(int64_t)> before_optimizer_;
};

}  // namespace baton::engine
