// The Communicator on NCCL: one process per GPU, CUDA tensors only. Point-to-point goes
// through grouped ncclSend/ncclRecv, collectives through NCCL's own (unequal parts as
// grouped broadcasts, reduces or send/recv pairs). All of it runs on the device's
// communication stream (memory/cuda_device.h), ordered after the work already queued on
// the caller's current stream by an event.
//
// Differences from the other backends, all inherent to NCCL:
// - Sends and receives are queued and launched as one NCCL group when the caller next
//   waits on or tests any Work of this communicator, or posts a collective; so a rank
//   that posts its sends and receives first and waits afterwards never deadlocks with
//   its peer. A send nobody waits on is not launched until then. A pipeline's traffic,
//   whose receives are posted long ahead, goes instead over a communicator per direction
//   of each pair (nccl_split_p2p, transport/pair_routes.h), each operation launched when
//   posted.
// - NCCL matches point-to-point messages by order, not by tag: between one pair, both
//   sides post their operations in the same order (the schedule validator guarantees it).
// - wait() orders the caller's current stream after the operation (the host goes on, as
//   with torch.distributed's NCCL backend); test() asks whether it has finished; barrier's
//   wait() blocks the host.
// - Failures: NCCL's asynchronous errors surface at the next test() or wait(). A peer that
//   dies or hangs makes NCCL wait forever, so a watchdog thread aborts the communicator
//   when an operation has not finished `peer_timeout` after its launch began; every later
//   test() and wait() then throws PeerError (naming the peer for point-to-point with one
//   peer, -1 for collectives). The time counts from the launch, so it must exceed the
//   longest legitimate wait (a receive posted long before its send): 10 minutes by default,
//   as torch.distributed's NCCL timeout.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "transport/communicator.h"
#include "transport/store.h"
#include "transport/world.h"

namespace baton::transport {

// True when baton was built with NCCL.
bool nccl_available();

using NcclId = std::array<char, 128>;  // an ncclUniqueId's bytes
// A fresh id, made by one rank (rank 0) and handed to the others before they all call
// make_nccl_communicator with it.
NcclId nccl_unique_id();

// The communicator of `size` ranks on this process's CUDA `device`; every rank calls it
// with the same id. Blocks until all ranks have joined, at most `peer_timeout` (then
// PeerError: the other rank of a pair, -1 for larger groups).
CommPtr make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                               std::chrono::milliseconds peer_timeout = std::chrono::minutes(10));

// The communicator of a job's ranks, the id exchanged through the rendezvous store
// (World::store of transport/world.h): rank 0 makes the id and sets `key`, the others
// wait for it up to `timeout`. Every initialisation gets a key of its own under `key`
// (`key`/<n> for the n-th, counted in the store), so `key` may be used again. The
// initialisation is watched with `peer_timeout`: a rank that never joins makes the
// others throw PeerError naming it (the store knows who arrived).
CommPtr make_nccl_communicator(
    Store& store, const std::string& key, int rank, int size, int device,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000),
    std::chrono::milliseconds peer_timeout = std::chrono::minutes(10));

// split(ranks) of an NCCL communicator whose sends and receives launch when posted, each
// alone, rather than grouped at the next wait: for one direction of one pair of ranks
// (route_pairs_apart's split), where both sides post in the same order. logic_error for a
// communicator of another backend.
CommPtr nccl_split_p2p(Communicator& nccl, const std::vector<int>& ranks);

// The NCCL world of a job that init_world() set up, called as
// make_nccl_world(world.env, world.store.get()): one process per GPU, the device being the
// process's local rank, the id exchanged through the store under "<prefix>/nccl/world"
// (no store is needed for a world of one; each call a key of its own). Throws RuntimeError when
// this host has too few GPUs.
CommPtr make_nccl_world(const LaunchEnv& env, Store* store, const std::string& prefix = "baton",
                        std::chrono::milliseconds peer_timeout = std::chrono::minutes(10));

}  // namespace baton::transport
