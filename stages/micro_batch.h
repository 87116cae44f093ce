// MicroBatch: where one micro-batch sits in its training step. Everything that must not
// depend on how a step's global batch is split (dropout masks, loss scaling, data) is a
// function of these GLOBAL positions, never of the micro-batch's local index.
#pragma once

#include <cstdint>

namespace baton::stages {

struct MicroBatch {
  int64_t index = 0;          // the micro-batch's number within the step on this stage (stash key)
  int64_t sample_offset = 0;  // global index of its first sample in the step's global batch
  int64_t samples = 0;        // its number of samples (the leading dimension of its tensors)
  int64_t global_batch = 0;   // samples in the step's global batch (0: = samples)
  // The targets of the step's WHOLE global batch (samples x targets a sample; no data
  // path holds an ignored, negative one: tokens and labels are checked against the
  // model). The loss of a micro-batch is sum(CE) / loss_tokens, so the K micro-batches of
  // a step (on any number of data-parallel ranks) add up to the mean over the global
  // batch and so do their gradients. 0: count this micro-batch's own non-ignored targets.
  double loss_tokens = 0;
  int64_t step = 0;  // the training step: dropout masks differ from step to step
  // Dynamic loss scaling (fp16; kernels/mixed_precision.h's LossScaler): the loss's
  // gradient is multiplied by this, so every gradient of the step is; the loss value
  // itself is not. The optimizer step divides it out again.
  double loss_scale = 1.0;
};

}  // namespace baton::stages
