// How NCCL communicators meet through the rendezvous store, without NCCL (tested on CPU):
// a key of its own for every initialisation of a job, and the ranks that have not
// joined when the initialisation times out.
#pragma once

#include <string>
#include <vector>

#include "transport/store.h"

namespace baton::transport::detail {

// `key` + "/<generation>": every rank of a group of `size` calls it once per
// initialisation, in the same order; the n-th initialisation under `key` gets generation
// n, counted in the store, so a second communicator (or a restarted job whose store
// lives on) never reads a stale NCCL id. Consistent because no rank finishes
// initialisation n (and so begins n + 1) before every rank has counted itself for n.
std::string nccl_init_key(Store& store, const std::string& key, int size);

// Says in the store that `rank` is joining the communicator of `init_key`.
void mark_joined(Store& store, const std::string& init_key, int rank);

// The ranks of 0..size-1 that have not marked themselves joined under `init_key`.
std::vector<int> missing_ranks(Store& store, const std::string& init_key, int size);

// "ranks 2, 3 (global 6, 7) never joined" or "every rank joined: ..." for the init
// time-out's message; `global` maps group ranks to global ranks.
std::string describe_missing(const std::vector<int>& missing, const std::vector<int>& global);

}  // namespace baton::transport::detail
