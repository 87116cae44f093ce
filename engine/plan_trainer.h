// Training under a plan: every rank of the job runs train_plan() with its world
// communicator (UCX processes under `baton launch`, or threads of one process over the
// local backend in tests). Byte-level data as in the one-process trainer, the same loop
// (engine/loop.h: loss log, progress, checkpoint cadence, summary), sharded checkpoints
// that any other plan (or one process) resumes, and a measured timeline of chosen steps
// in the simulator's trace format.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/loop.h"
#include "memory/input_staging.h"
#include "partitioner/resolved_plan.h"
#include "transport/communicator.h"

namespace baton::engine {

// A rank's options: the shared ones (engine/loop.h; the plan gives the model and batch)
// and the plan's.
struct PlanTrainOptions : LoopOptions {
  std::string plan_path;      // the plan (read by every rank)
  std::string schedule_path;  // optional: a schedule file replacing the plan's generator
  std::string trace_path;     // Chrome trace of the last trace_steps steps (rank 0 writes it)
  int64_t trace_steps = 1;
  size_t bucket_bytes = size_t(4) << 20;
  int recv_ahead = 2;
  bool profile = false;
  // A Hugging Face directory (config.json + safetensors) to start from: every rank reads
  // its own stages' parameters from it (its layers, its tensor-parallel blocks: only the
  // files and bytes that hold them); a resumed run's checkpoint replaces them.
  std::string init_from;
  // The communicator of device tensors (the NCCL world of a "device": "cuda" plan;
  // RankEngineOptions::device_world); null: the world carries everything.
  transport::CommPtr device_world;
  // RankEngineOptions::split_p2p_pair (NCCL's pipeline traffic per pair and direction).
  std::function<transport::CommPtr(transport::Communicator&, const std::vector<int>&)>
      split_p2p_pair;
  // RankEngineOptions::input_staging (empty: the device's own).
  std::function<std::unique_ptr<memory::StagingBackend>()> input_staging;
};

// Runs the plan's training on this rank; every rank returns the same records. Throws
// InputError for bad input (plan, files, a world that does not match the plan).
TrainSummary train_plan(const PlanTrainOptions& options, transport::CommPtr world,
                        const std::function<void(const StepRecord&)>& on_step = {});

// The same with a plan already resolved (tests build plans in memory).
TrainSummary train_plan(std::shared_ptr<const partitioner::ResolvedPlan> plan,
                        const PlanTrainOptions& options, transport::CommPtr world,
                        const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace baton::engine
