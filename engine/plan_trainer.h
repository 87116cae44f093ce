// Training under a plan: every rank of the job runs train_plan() with its world
// communicator (UCX processes under `baton launch`, or threads of one process over the
// local backend in tests). Byte-level data as in the one-process trainer, the same loss
// log, sharded checkpoints that any other plan (or one process) resumes, and a measured
// timeline of chosen steps in the simulator's trace format.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/trainer.h"
#include "partitioner/resolved_plan.h"
#include "transport/communicator.h"

namespace baton::engine {

struct PlanTrainOptions {
  std::string plan_path;      // the plan (read by every rank)
  std::string schedule_path;  // optional: a schedule file replacing the plan's generator
  std::string data_path;
  int64_t steps = 100;
  stages::OptimizerConfig optimizer;
  double grad_clip = 1.0;
  uint64_t seed = 1;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end
  int keep_checkpoints = 0;
  bool resume = false;
  int64_t log_every = 1;
  std::string loss_log;          // written by rank 0: JSON lines as the one-process trainer
  std::string trace_path;        // Chrome trace of the last trace_steps steps (rank 0 writes it)
  int64_t trace_steps = 1;
  size_t bucket_bytes = size_t(4) << 20;
  int recv_ahead = 2;
  bool profile = false;
};

// Runs the plan's training on this rank; every rank returns the same records. Throws
// InputError for bad input (plan, files, a world that does not match the plan).
TrainSummary train_plan(const PlanTrainOptions& options, transport::CommPtr world,
                                const std::function<void(const StepRecord&)>& on_step = {});

// The same with a plan already resolved (tests build plans in memory).
TrainSummary train_plan(std::shared_ptr<const partitioner::ResolvedPlan> plan, const PlanTrainOptions& options,
                                transport::CommPtr world,
                                const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace baton::engine
