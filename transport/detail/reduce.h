// Element-wise reduction of two buffers, the arithmetic inside every reducing
// collective. Floats of 16 bits are widened to float, combined and rounded back, so
// every rank that combines the same two inputs gets the same bits.
#pragma once

#include <cstddef>

#include "memory/dtype.h"
#include "transport/communicator.h"

namespace baton::transport::detail {

// dst[i] = a[i] (op) b[i] for n elements; dst may be a or b. avg adds here (the
// division is a separate pass over the final result).
void reduce(void* dst, const void* a, const void* b, size_t n, memory::DType dtype, ReduceOp op);

// p[i] /= count: the second half of avg. Integers divide with truncation.
void divide(void* p, size_t n, memory::DType dtype, int count);

}  // namespace baton::transport::detail
