// Pieces shared by cross_entropy and its vocabulary-parallel form.
#pragma once

#include <functional>

#include "stages/op.h"

namespace baton::stages::ops {

// Checks a cross-entropy's inputs (float logits [..., V], integer targets of the logits'
// leading shape); returns the logits' last dimension V and sets `rows` to the rows.
int64_t check_cross_entropy_inputs(const OpSpec& spec, int64_t& rows);
// Cross-entropy's last step: `compute(grad_scale, dlogits)` writes each row's loss into
// `losses` and, while training, the gradient of the logits (the rows of input 0) into
// dlogits (undefined otherwise), scaled by grad_scale (the loss scale over the
// denominator, MicroBatch::loss_tokens); then the output (the losses' sum over the
// denominator) and the gradient saved for backward, in input 0 when forward may
// overwrite it, else in `buffer` when given (a copy of the logits the op computes on).
void finish_cross_entropy(ForwardCall& c, DType dtype, const Tensor& losses,
                          const std::function<void(double grad_scale, Tensor& dlogits)>& compute,
                          const Tensor& buffer = {});

}  // namespace baton::stages::ops
