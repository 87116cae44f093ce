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
// waited for.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/executor.h"
#include "partitioner/resolved_plan.h"
#include "stages/stage.h"
#include "transport/communicator.h"

namespace baton::engine::detail {

class ParamServer {
 public:
  struct Options {
    stages::OptimizerConfig optimizer;
    double grad_clip = 1.0;
    size_t bucket_bytes = size_t(4) << 20;
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

 private:
  struct Segment {            // one parameter's elements in this server's part of a bucket
    int64_t at = 0, len = 0;  // in the part
    bool decay = true;        // weight decay applies
    bool norm = true;         // counts in the norm (a replicated parameter: tp 0, tile 0)
    int layer = 0;            // its owner layer (the norm pieces' index)
  };
  struct Bucket {
    int64_t elements = 0;
    std::vector<int64_t> counts;                    // every member's part
    std::vector<int64_t> param_first, param_numel;  // per parameter, in the bucket
    int64_t begin = 0;  // this server's part: [begin, begin + master.numel())
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

  transport::CommPtr world_;
  stages::OptimizerConfig opt_;
  double grad_clip_ = 1.0;
  int staleness_ = 0;
  int layers_ = 0, loss_slots_ = 0;
  std::vector<Group> groups_;
  bool seeded_ = false;
  int64_t steps_ = 0;  // optimizer steps applied (AdamW's bias correction)
};

}  // namespace baton::engine::detail
