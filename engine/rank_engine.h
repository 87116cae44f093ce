// One rank of a plan, assembled and ready to train: its physical graph, a Stage per
// schedule stage it holds (with the tensor-parallel communicator injected), the
// sub-communicators of its groups (tensor-parallel, and one per set of ranks that sum a
// gradient: data-parallel replicas, tied parameters, DualPipe's replicas), the routes of
// its pipeline boundaries (partitioner/routing.h), and the executor that runs its
// lowered action list (engine/executor.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "partitioner/groups.h"
#include "partitioner/resolved_plan.h"
#include "stages/stage.h"
#include "transport/communicator.h"

namespace baton::engine {

struct RankEngineOptions {
  uint64_t seed = 1;  // parameter init and dropout
  stages::OptimizerConfig optimizer;
  double grad_clip = 1.0;
  size_t bucket_bytes = size_t(4) << 20;
  int recv_ahead = 2;
  int input_ahead = 4;
  bool profile = false;  // time every op (Stage::op_times)
  // Where the stages live, their master dtype under mixed precision (StageOptions), and
  // the loss scaler (ExecutorConfig; null: none).
  memory::Device device = memory::Device::cpu();
  std::optional<memory::DType> master_dtype;
  kernels::LossScaler* loss_scaler = nullptr;
  // The communicator of device tensors (NCCL on GPUs: pipeline sends and receives, the
  // tensor-parallel and gradient groups split from it); null: the world carries them.
  // The world then carries only the host's values (the step's loss and norm pieces).
  transport::CommPtr device_world;
  // Given, the pipeline's sends and receives go over a communicator per direction of each
  // pair of ranks, each made by this from the device world (or the world) for the two
  // ranks (transport/pair_routes.h): NCCL's nccl_split_p2p, whose operations on one
  // communicator run in order, so that a receive posted ahead holds up nothing else.
  std::function<transport::CommPtr(transport::Communicator&, const std::vector<int>&)>
      split_p2p_pair;
  // The model inputs of a micro-batch (schedule/executor.h's InputFn); required when a
  // stage of the rank reads model inputs.
  InputFn inputs;
  // Set when `inputs` fills the tiled inputs with the rows input_tile() names (the image
  // loader reads them directly); otherwise a tile narrows the whole images it is given.
  bool inputs_tiled = false;
  // What the inputs are staged to the device through (ExecutorConfig::input_staging);
  // empty: the GPU's pinned buffers and copy stream on a GPU, nothing on the CPU. Tests
  // stage through a CPU stand-in.
  std::function<std::unique_ptr<memory::StagingBackend>()> input_staging;
  // The held-out data's inputs (MicroBatch::step: the evaluation batch); given, the
  // engine also builds an evaluation executor (evaluate()).
  InputFn eval_inputs;
};

// The rows of the image height that a rank's spatial tile keeps of the model inputs in
// `names`: [index H / of, (index + 1) H / of) of dimension 2 of [B, C, H, W] (of 1: none
// tiled, every input whole).
struct InputTile {
  std::set<std::string> names;
  int index = 0, of = 1;
};
InputTile input_tile(const partitioner::ResolvedPlan& r, int rank);

// InputError naming the plan's devices unless the job has the plan's ranks (the replicas'
// and any extra parameter-server ranks).
void check_world_size(const partitioner::ResolvedPlan& r, int size);

class HaloTimelineComm;  // rank_engine.cpp: the spatial group's, recording halo receives

class RankEngine {
 public:
  // Builds the rank `world->rank()` of the plan. Every rank of the world must construct
  // its engine at the same time: the sub-communicators are made here (collectively over
  // their members, in one global order).
  RankEngine(std::shared_ptr<const partitioner::ResolvedPlan> plan, transport::CommPtr world,
             RankEngineOptions options);
  ~RankEngine();
  RankEngine(const RankEngine&) = delete;
  RankEngine& operator=(const RankEngine&) = delete;

  // One training step (engine/executor.h); `next_step` lets the loader start early.
  StepStats step(int64_t step, int64_t next_step = -1) {
    return executor_->run_step(step, next_step);
  }
  // The held-out loss: the mean over evaluation batches 0..batches-1 of each batch's loss,
  // each batch (the training's global batch) a forward-only pass of the plan's schedule
  // (schedule::forward_only_like) through the same Stages; the same on every rank. Every
  // rank calls it together, between steps. Needs RankEngineOptions::eval_inputs. Under
  // local SGD and gossip it is the first replica's model's loss (the checkpointed one):
  // the other replicas evaluate with its parameters, then take their own back.
  double evaluate(int64_t batches);

  const partitioner::ResolvedPlan& plan() const { return *plan_; }
  const partitioner::RankView& view() const { return view_; }
  int rank() const { return view_.rank; }
  const stages::Graph& graph() const { return *graph_; }
  // The rank's stages by schedule stage.
  const std::map<int, std::unique_ptr<stages::Stage>>& stages() const { return stages_; }
  Executor& executor() { return *executor_; }
  transport::Communicator& world() { return *world_; }
  // The parameters this rank writes to a checkpoint for stage `stage`: one copy of every
  // block (first data-parallel replica, first tensor-parallel rank for replicated
  // parameters, the stage holding the first layer that uses a tied parameter).
  bool writes(int stage, int param) const;
  // The parameters whose optimizer state this rank writes although another replica writes
  // the parameter: its part of a sharded optimizer (ZeRO), on every data-parallel rank
  // (and every tile, for a parameter used on tiles).
  bool writes_state_part(int stage, int param) const;

 private:
  // One replica's copy of a block: first tensor-parallel rank for replicated
  // parameters, the stage holding the first layer using a tied one (any dp), the first
  // tile unless `every_tile` (a part of the state sharded over the tiles).
  bool writes_block(int stage, int param, bool every_tile = false) const;
  // Physical parameter ids whose optimizer state is sharded over the spatial tiles too.
  std::set<int> tile_shards_;

  std::shared_ptr<const partitioner::ResolvedPlan> plan_;
  transport::CommPtr world_;
  transport::CommPtr device_world_;  // RankEngineOptions::device_world (kept alive)
  transport::CommPtr p2p_routes_;    // RankEngineOptions::split_p2p_pair's routes, if given
  partitioner::RankView view_;
  std::shared_ptr<const stages::Graph> graph_;
  // `inputs` narrowed to this rank's tile (as given without tiles), unless
  // `tiled_already` (RankEngineOptions::inputs_tiled).
  InputFn tile_inputs(InputFn inputs, bool tiled_already) const;

  std::map<std::vector<int>, transport::CommPtr> groups_;  // by member list
  transport::CommPtr spatial_comm_, batchnorm_comm_;       // null: none (or the spatial one)
  std::shared_ptr<HaloTimelineComm> halo_timeline_;        // wraps spatial_comm_
  std::map<int, std::unique_ptr<stages::Stage>> stages_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Executor> eval_executor_;  // with eval_inputs
};

}  // namespace baton::engine
