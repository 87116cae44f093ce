// The scratch memory a collective takes from the CPU allocator while it runs, by the
// algorithm transport/detail/collectives.cpp picks for the message (recursive doubling
// and direct exchanges hold one message or one part per peer; rings hold their window
// of chunks, each no larger than the largest part). Small scratch (1 KiB at most) comes
// from the thread's own blocks and counts nothing. partitioner/'s memory model adds these bytes at
// each collective a rank runs, so that `baton plan --check` matches the allocator's measured peak.
#pragma once

#include <cstddef>
#include <cstdint>

namespace baton::transport {

enum class Collective { all_reduce, reduce_scatter, all_gather };

// Bytes the allocator counts (rounded to its alignment) while one `c` over a group of
// `group_size` ranks runs: `count` elements of `esize` bytes in all (reduce-scatter and
// all-gather: the whole buffer; `part` the largest rank's part, in elements, for a
// reduce-scatter: 0 bounds it by the whole buffer). A
// reduce-scatter `in_place` (its output the rank's own part of its input, as the gradient
// reducer's) keeps its ring's partial sums in the input: no accumulator slots. `own`: this
// rank's part, where it differs from `part` (a replica's 0 beside extra parameter-server
// ranks' parts): the direct exchange of a small message receives only its own part from
// each peer.
size_t collective_scratch_bytes(Collective c, size_t count, size_t esize, int group_size,
                                size_t part = 0, bool in_place = false, size_t own = SIZE_MAX);

// The most scratch any all-reduce of at most `count` elements of `esize` bytes takes, over
// any group size: the bound the plan search adds for collectives it does not enumerate.
size_t all_reduce_scratch_bound(size_t count, size_t esize);
// The most scratch an in-place reduce-scatter of at most `count` elements takes on a rank
// owning the largest part, over `group_size` ranks whose last `owners` hold the parts
// (extra parameter-server ranks; all of them: `owners` = `group_size`).
size_t reduce_scatter_scratch_bound(size_t count, size_t esize, int group_size, int owners);

// Point-to-point messages of at least this many bytes go by rendezvous over UCX (the CPU
// transport between processes): the receiver fetches the data once its receive is posted,
// and the send is done when it has. Shorter ones are copied out eagerly, the send done at
// once. UCX_RNDV_THRESH as a plain byte count, else the 65536 the UCX fabric sets; 0 (every
// message by rendezvous) when it is set otherwise ("auto", a unit).
size_t p2p_rendezvous_bytes();

}  // namespace baton::transport
