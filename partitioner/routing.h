// Boundary routing: how the values crossing a pipeline boundary move between the ranks
// of the two stages, given per-stage tensor-parallel degrees, so the executor only
// executes the list. For the boundary after schedule stage s (to s + 1 in the same
// direction), with t senders and u receivers in the same replica:
//
//   replicated value (every rank of a group holds all of it; the residual stream):
//     t == u   one to one: rank i of s sends it whole to rank i of s + 1
//     t <  u   broadcast: receiver j gets it whole from sender j mod t
//     t >  u   gather: receiver j gets it in parts from the senders i with i mod u == j,
//              part k from the k-th of them
//   split value (tensor-parallel shards; only where t == u): rank i sends its shard to rank i
//   image tiles (the spatial split): one to one between equal spatial and
//              tensor-parallel degrees; otherwise re-tiled: each receiving rank gets the
//              rows its tile shares with each sending tile, a block (Transfer::rows) each
//              from that tile's rank tp mod the sender's tensor-parallel degree
//
// Gradients flow back over the same boundary by the same rule with the roles swapped
// (the gradient of a replicated value is the same on every rank of the receiving group:
// its tp_copy all-reduced it).
#pragma once

#include <vector>

#include "partitioner/evaluate.h"
#include "schedule/transfer.h"

namespace baton::partitioner {

// The transfers `rank` takes part in across the boundary after schedule stage `stage`,
// for one micro-batch: activations in the forward phase, gradients in the backward one;
// a value's index among the cut's values names it in the message tags.
// Empty when the rank holds neither side, when both stages sit on the same rank (they
// hand values over in memory), or when `stage` ends its direction.
std::vector<schedule::Transfer> boundary_transfers(const ResolvedPlan& r, int rank, int stage);

}  // namespace baton::partitioner
