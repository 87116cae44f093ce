// An extra parameter-server rank (plan field dp_sync "parameter-server" with ps_ranks > 0;
// docs/formats/plan.md): it holds no stage, only its part of every bucket of the
// parameters the replicas' data-parallel groups shard, with their optimizer state. It
// joins each served group's communicator as one of its last members and issues the
// collectives the replicas' GradReducer issues on it (engine/detail/grad_reducer.h), in
// the same order, with the same buckets and parts (cut_buckets, bucket_parts), so the
// replicas' code is unchanged but for the parts:
//   first step  the initial parts, scattered by replica 0;
//   each step   the push (a reduce-scatter per bucket: the replicas' gradients summed
//               into its parts), the step's norm pieces and losses summed over the world
//               with the replicas' (it contributes the norm of its parts), the optimizer
//               step on its parts (clipped by the global norm, as every rank decides),
//               and the pull (the replicas' all-gathers of the updated parts, one per
//               bucket; with several servers each sends its part of a bucket to every
//               replica instead, grad_reducer.h's pull_bucket). With staleness s > 0 the
//               replicas wait for a pull s steps later; the server waits for none beyond
//               its own step.
// Beyond its parts a server holds two buckets' whole buffers (the collectives' input and
// output are whole buckets on every member): the next is posted before the oldest is
// waited for. With s > 0 it also keeps its part of each of the last s pulls (the
// replicas receive them s steps later), which a checkpoint writes with the parts'
// optimizer state (engine/plan_trainer.cpp; docs/formats/checkpoint.md).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/executor.h"
#include "kernels/mixed_precision.h"
#include "partitioner/resolved_plan.h"
#include "schedule/timeline.h"
#include "stages/checkpoint.h"
#include "stages/stage.h"
#include "transport/communicator.h"

namespace baton::engine::detail {

class ParamServer {
 public:
  struct Options {
    stages::OptimizerConfig optimizer;
    double grad_clip = 1.0;
    size_t bucket_bytes = size_t(4) << 20;
    // Dynamic loss scaling (fp16): the replicas' decision, taken from the same norms.
    kernels::LossScaler* scaler = nullptr;
    // The replicas' Stage::param() dtype: the masters' under mixed precision (f32), the
    // parameters' otherwise (f32). The parts, their state and the pulls are in it.
    memory::DType master_dtype = memory::DType::f32;
  };
  // Every rank of the world constructs at once (the groups' communicators are split here,
  // in the replicas' order).
  ParamServer(const partitioner::ResolvedPlan& r, transport::CommPtr world, Options options);
  // One step: the push, the world's norm and losses, the update, the pull.
  StepStats step(int64_t step);
  void set_lr(double lr) { opt_.set_lr(lr); }
  // One evaluation batch: the replicas' loss sum over the world (this rank adds none).
  double evaluate_batch();
  // Bytes of the parts and their optimizer state this rank holds.
  int64_t state_bytes() const;

  // Checkpoints (engine/plan_trainer.cpp, docs/formats/checkpoint.md). The parts'
  // optimizer state as parts of the logical tensors ("<name>:exp_avg", ...): with
  // `writer`, one copy of each logical block (the segments that count in the norm), as a
  // checkpoint stores them; else every segment, for a resume to fill.
  std::vector<stages::ParamPart> state_parts(bool writer);
  // With staleness s > 0, the pulls in flight, oldest first (the newest holds the
  // masters): per pull, this server's part of every bucket, groups in order. The server
  // keeps them (s parts, the replicas' own ranks serving keep as much in their pulls).
  const std::deque<std::vector<memory::Tensor>>& pulls() const { return history_; }
  // A resume: the checkpoint's optimizer and step count (the state is reallocated,
  // zeroed, for state_parts(false) to fill).
  void set_optimizer(const stages::OptimizerConfig& config, int64_t steps);
  // A resume under the same layout: posts the checkpoint's pulls again, as the replicas'
  // GradReducer::restore_stale does; the newest replaces the masters replica 0 seeds.
  void restore_pulls(const std::vector<std::vector<memory::Tensor>>& pulls);
  // The buckets' part sizes, groups in order (what restore_pulls expects per pull).
  std::vector<int64_t> part_sizes() const;

  // --trace: while recording, each step's events on the steady clock (seconds): per
  // served group its push ("PUSH", lane 1) and pull ("PULL", lane 1), and the norm's
  // all-reduce with the update as a STEP on lane 0 (schedule/timeline.h).
  void set_recording(bool on) { recording_ = on; }
  const std::vector<schedule::TimelineEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  static double now();

 private:
  struct Segment {            // one parameter's elements in this server's part of a bucket
    int64_t at = 0, len = 0;  // in the part
    bool decay = true;        // weight decay applies
    bool norm = true;         // counts in the norm (a replicated parameter: tp 0, tile 0)
    int layer = 0;            // its owner layer (the norm pieces' index)
    const stages::Param* param = nullptr;  // the parameter (replica 0's physical graph)
    int64_t lo = 0;                        // its first element here, in the parameter
  };
  struct Bucket {
    int64_t elements = 0;
    std::vector<int64_t> counts;                    // every member's part
    std::vector<int64_t> param_first, param_numel;  // per parameter, in the bucket
    int64_t begin = 0;  // this server's part: [begin, begin + master.numel())
    // The gradients' dtype (the graph's: 16-bit under mixed precision); the masters,
    // their state and the pulls are in Options::master_dtype.
    memory::DType dtype = memory::DType::f32;
    memory::Tensor master, grad, m, v;  // part-sized
    std::vector<Segment> segments;
  };
  struct Group {
    transport::CommPtr comm;
    int servers = 0;  // the comm's last members (pull_bucket: point to point with several)
    std::vector<Bucket> buckets;
  };
  void seed();
  void push();
  void pull();
  void post_pull(const std::vector<memory::Tensor>& parts);  // one part per bucket
  memory::DType master_dtype() const { return master_dtype_; }
  void allocate_state();

  std::vector<std::shared_ptr<const stages::Graph>> graphs_;  // the segments' parameters
  std::deque<std::vector<memory::Tensor>> history_;           // pulls(): s > 0
  bool restored_masters_ = false;  // restore_pulls(): the masters replace the seeded ones
  bool recording_ = false;
  std::vector<schedule::TimelineEvent> events_;
  void record(const char* label, schedule::ActionKind kind, int lane, int group, double start);

  transport::CommPtr world_;
  stages::OptimizerConfig opt_;
  double grad_clip_ = 1.0;
  kernels::LossScaler* scaler_ = nullptr;
  memory::DType master_dtype_ = memory::DType::f32;
  int staleness_ = 0;
  int layers_ = 0, loss_slots_ = 0;
  std::vector<Group> groups_;
  bool seeded_ = false;
  int64_t steps_ = 0;  // optimizer steps applied (AdamW's bias correction)
};

}  // namespace baton::engine::detail
