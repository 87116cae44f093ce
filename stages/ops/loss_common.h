// Pieces shared by cross_entropy and its vocabulary-parallel form.
#pragma once

#include "stages/op.h"

namespace baton::stages::ops {

// The loss's denominator: MicroBatch::loss_tokens, or the micro-batch's own non-ignored
// targets when that is 0.
double loss_denominator(const OpContext& ctx, const Tensor& targets);
// Checks a cross-entropy's inputs (float logits [..., V], integer targets of the logits'
// leading shape); returns the logits' last dimension V and sets `rows` to the rows.
int64_t check_cross_entropy_inputs(const OpSpec& spec, int64_t& rows);
// sum(losses) / denom as an f64 scalar, summed in double in row order.
Tensor sum_losses(const Tensor& losses, double denom, memory::Device device);

}  // namespace baton::stages::ops
