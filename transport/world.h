// Start-up of a process in a job: who am I (rank, world size, ranks on this host), where
// do the ranks meet, and the world communicator. The environment comes from
// `baton launch`, or from mpirun / srun (their own variables) plus a rendezvous
// address the user gives; docs/transport.md lists every variable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/communicator.h"
#include "transport/options.h"
#include "transport/store.h"

namespace baton::transport {

// The identity of this host: its name, this boot of its kernel and the network
// namespace. Ranks with the same id are on one machine (the UCX transport lets them use
// shared memory, a --trace gives them one clock); processes in other network namespaces
// (containers, the tests' simulated hosts) count as other hosts, and two machines of one
// name are two hosts.
std::string host_id();

// What the environment says about this process.
struct LaunchEnv {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this host
  int local_size = 1;
  std::string rendezvous;     // "host:port"; empty for a world of one
  std::string token;          // the job token the rendezvous checks
  bool store_hosted = false;  // the launcher already runs the store (else rank 0 does)
  // BATON_BIND=self: the launcher asked for binding but could not bind this rank (more
  // ranks than cores), so the rank binds itself (bind_dealt). ("cores": the launcher
  // bound it; "none": no binding.)
  bool bind_self = false;
  std::string source = "none";  // "baton launch", "Open MPI", "PMI", "Slurm", "none"
  // The variables rank and size came from (for messages): "SLURM_PROCID", ...
  std::string rank_from, size_from;
};

// Reads BATON_RANK / BATON_WORLD_SIZE (set by baton launch), else OMPI_COMM_WORLD_RANK /
// _SIZE, PMI_RANK / PMI_SIZE, SLURM_PROCID / SLURM_NTASKS; the local rank and size from
// the matching variables; BATON_RENDEZVOUS, BATON_JOB_TOKEN, BATON_STORE_HOSTED, BATON_BIND.
// Throws InputError naming the variable for a bad or inconsistent value.
LaunchEnv read_launch_env();

// The cores this process may run on (its affinity mask), in increasing order.
std::vector<int> allowed_cores();

// With more ranks on this host than cores to run on, which `baton launch` leaves
// unbound, binds this process and every thread it has to one core: place i (where the
// rank stands among the host's ranks, partitioner::Layout::core_deal_order) to the
// (i mod C)-th core it may run on. Only when the launcher asked for binding (--bind
// cores) and every rank of the world runs on this host. Returns the core, or -1 when it
// does not bind. Time-slicing ranks bound so ran 10-15% faster than left to the
// scheduler's migrations (docs/transport.md).
int bind_dealt(int place, const LaunchEnv& env);

struct WorldOptions {
  CommOptions comm = CommOptions::from_env();
  std::string prefix = "baton";  // store keys of this world
};

struct World {
  LaunchEnv env;
  std::unique_ptr<StoreServer> server;  // when this rank hosts the rendezvous
  std::shared_ptr<Store> store;         // for later exchanges (NCCL ids); null alone
  CommPtr comm;                         // the world: UCX across processes
  // Members go in reverse: the communicator first (it says goodbye to its peers), then
  // the store, then the server.
};

// Sets up this process's world from the environment: a world of one needs nothing;
// otherwise rank 0 hosts the rendezvous (unless the launcher does), everyone connects,
// and the UCX world communicator is built.
World init_world(const WorldOptions& options = {});

// "host:port" or "[v6 address]:port" -> host (unbracketed) and port; throws InputError
// naming `what` otherwise. Port 0 ("any free port") only where `any_port`.
std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what,
                                                 bool any_port = false);

}  // namespace baton::transport
