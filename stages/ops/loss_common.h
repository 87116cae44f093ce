// Pieces shared by cross_entropy and its vocabulary-parallel form.
#pragma once

#include "stages/op.h"

namespace baton::stages::ops {

// Checks a cross-entropy's inputs (float logits [..., V], integer targets of the logits'
// leading shape); returns the logits' last dimension V and sets `rows` to the rows.
int64_t check_cross_entropy_inputs(const OpSpec& spec, int64_t& rows);
// Cross-entropy's last step, once row_max, sum_exp and target_logit cover the whole
// vocabulary: each row's loss into `losses`, the output (their sum over the denominator,
// MicroBatch::loss_tokens) and, while training, the gradient of `logits` (the rows of
// input 0, whose first column is vocabulary index `vocab_offset`) saved for backward,
// into input 0 when forward may overwrite it.
void finish_cross_entropy(ForwardCall& c, DType dtype, const Tensor& logits, const Tensor& targets,
                          int64_t vocab_offset, const Tensor& row_max, const Tensor& sum_exp,
                          const Tensor& target_logit, Tensor& losses);

}  // namespace baton::stages::ops
