// Training on one process: one Stage with every layer, byte-level data, K micro-batches
// per step, gradient clipping, AdamW or SGD, checkpoints and exact resume. `baton train`
// is a thin front to run_training().
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "stages/stage.h"

namespace baton::engine {

struct TrainOptions {
  std::string model_path;        // model JSON (or empty with init_from: its config.json)
  std::string data_path;         // any file: its bytes are the tokens
  int64_t steps = 100;           // total steps; a resumed run continues up to this
  int64_t batch = 8;             // samples per step (global batch)
  int64_t micro_batches = 1;     // K; batch must be a multiple of K
  stages::OptimizerConfig optimizer;
  double grad_clip = 1.0;        // max global gradient norm; 0: no clipping
  uint64_t seed = 1;
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps; 0: only at the end
  int keep_checkpoints = 0;      // keep the newest N complete checkpoints; 0: all
  bool resume = false;           // continue from the newest complete checkpoint
  std::string init_from;         // Hugging Face GPT-2 directory to load weights from
  int64_t log_every = 1;
  std::string loss_log;          // JSON lines {"step", "loss", "grad_norm", "lr"}
  std::set<int> recompute_layers;
  memory::DType float_dtype = memory::DType::f32;
};

struct StepRecord {
  int64_t step = 0;  // 1-based: the step just completed
  double loss = 0;
  double grad_norm = 0;
  double seconds = 0;
};

struct TrainSummary {
  int64_t first_step = 0;  // steps already done when this run started (resume)
  std::vector<StepRecord> records;
  size_t peak_bytes = 0;   // the device allocator's peak during the run
  std::string last_checkpoint;
};

// Runs training; progress goes to spdlog (info) and `on_step` when given. Throws
// InputError for bad input (files, model JSON, flags that do not fit the model).
TrainSummary run_training(const TrainOptions& options,
                          const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace baton::engine
