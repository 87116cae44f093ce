// Held-out loss of a whole model on one process: the mean, over `batches` evaluation
// batches, of each batch's mean loss per target. Batch k is "step" k of the held-out data
// under evaluation_seed(seed) (stages/data.h), so every evaluation of a run, and of any
// plan, sees the same samples; forwards keep nothing and use no dropout. The reference a
// plan's evaluation (a forward-only schedule through the pipeline) is tested against.
#pragma once

#include <cstdint>

#include "stages/data.h"
#include "stages/stage.h"

namespace baton::stages {

struct EvalSpec {
  int64_t batches = 1;        // K
  int64_t batch = 1;          // samples per batch (the training's global batch)
  int64_t micro_batches = 1;  // batch must be a multiple
  uint64_t seed = 1;          // the run's seed
};

// `stage` holds every layer of its graph (inputs `tokens` and `targets`).
double evaluate_loss(Stage& stage, const Dataset& data, const EvalSpec& spec);

}  // namespace baton::stages
