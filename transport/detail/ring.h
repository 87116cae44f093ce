// The pipelined ring: the bandwidth-optimal reduce-scatter and all-gather (and their
// composition, all-reduce) for large messages. Each block travels in chunks, so the
// reduction of one chunk overlaps the transfer of the next.
#pragma once

#include <cstddef>
#include <vector>

#include "memory/dtype.h"
#include "transport/communicator.h"
#include "transport/detail/group_view.h"

namespace baton::transport::detail {

struct RingJob {
  std::vector<size_t> off, len;  // elements of each block, in group rank order
  size_t esize = 0;
  memory::DType dtype = memory::DType::f32;
  ReduceOp op = ReduceOp::sum;
  bool reduce = false;  // reduce-scatter phase: afterwards rank r holds the sum of block r
  bool gather = false;  // all-gather phase: afterwards every rank holds every block
  // Reduce: the inputs of every block (equal to buf for an in-place all-reduce).
  const char* in = nullptr;
  // The buffer that holds every block at the end (all-reduce, all-gather).
  char* buf = nullptr;
  // Reduce-scatter without gather: where this rank's reduced block goes. With buf set
  // as well (in place: buf == in and out == buf + off[rank]), the partial sums are kept
  // in buf and the result lands in out there.
  char* out = nullptr;
  // All-gather alone: this rank's block, sent from here before it is copied into buf.
  const char* own = nullptr;
};

void run_ring(const GroupView& g, const RingJob& job);

}  // namespace baton::transport::detail
