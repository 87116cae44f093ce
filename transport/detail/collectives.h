// The collective algorithms, over a GroupView (any backend). Buffers are raw bytes of
// one dtype; counts are in elements. The choice between latency-bound algorithms
// (recursive doubling, binomial tree, direct exchange) and bandwidth-bound ones
// (pipelined ring, pipelined chain) is made here by message size; docs/transport.md
// lists the thresholds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memory/dtype.h"
#include "transport/communicator.h"
#include "transport/detail/group_view.h"

namespace baton::transport::detail {

// Tunables, read once from the environment (BATON_RING_CHUNK, BATON_RING_WINDOW,
// BATON_SMALL_BYTES) so that benchmarks can sweep them.
struct AlgoTuning {
  size_t small_bytes = 32 << 10;   // at most this: latency-bound algorithms (eager messages)
  size_t chunk_bytes = 512 << 10;  // pipelining unit of rings and chains
  int window = 2;                  // ring chunks received ahead (more only thrashes caches)
  // Reads the environment; InputError for a value that is not a whole number in range.
  static AlgoTuning from_env();
  // from_env() the first time. Worlds call it when they are made, so that a bad value is
  // the caller's InputError there, not a failure of the first collective.
  static const AlgoTuning& get();
};

void all_reduce(const GroupView& g, void* buf, size_t count, memory::DType dtype, ReduceOp op);
// counts[r]: elements of rank r's part; `out` holds this rank's part.
void reduce_scatter(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
                    memory::DType dtype, ReduceOp op);
void all_gather(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
                size_t esize);
void broadcast(const GroupView& g, void* buf, size_t bytes, int root);
void scatter(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
             size_t esize, int root);
void gather(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
            size_t esize, int root);
void barrier(const GroupView& g);

// Element offsets of consecutive parts: offsets[r] = counts[0] + ... + counts[r-1].
std::vector<size_t> offsets_of(std::span<const int64_t> counts);
// n nearly equal parts of `count` elements: the first count % n parts one larger.
std::vector<int64_t> equal_parts(size_t count, int n);

}  // namespace baton::transport::detail
