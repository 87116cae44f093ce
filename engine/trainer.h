// Training on one process: one Stage with every layer, byte-level data, K micro-batches
// per step, gradient clipping, AdamW or SGD, checkpoints and exact resume. `baton train`
// is a thin front to run_training(). It is the reference every plan is checked against,
// so its step stays the plain sequence of Stage calls; the loop around it (loss log,
// progress, checkpoints, summary) is engine/loop.h's, shared with train_plan().
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/loop.h"
#include "stages/stage.h"

namespace baton::engine {

// The one-process loop's options: the shared ones (engine/loop.h) and the model, batch
// and micro-batches that a plan would otherwise give.
struct TrainOptions : LoopOptions {
  std::string model_path;     // model JSON (or empty with init_from: its config.json, or on
                              // --resume the checkpoint's)
  int64_t batch = 8;          // samples per step (global batch)
  int64_t micro_batches = 1;  // K; batch must be a multiple of K
  std::string init_from;      // Hugging Face directory (GPT-2, the LLaMA family) to start from
  std::set<int> recompute_layers;
  memory::DType float_dtype = memory::DType::f32;
};

// Runs training; progress goes to spdlog (info) and `on_step` when given. Throws
// InputError for bad input (files, model JSON, flags that do not fit the model).
TrainSummary run_training(const TrainOptions& options,
                          const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace baton::engine
