// `baton launch`: starts the ranks of a job on this host, with the rendezvous, each
// process's output prefixed with its rank, and the job stopped as a whole when one rank
// fails. Multi-host jobs use mpirun or srun instead (see world.h).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace baton::transport {

struct LaunchOptions {
  int nprocs = 1;
  std::vector<std::string> command;  // the program and its arguments
  std::string host = "127.0.0.1";    // the rendezvous listens here (loopback by default)
  uint16_t port = 0;                 // 0: any free port
  // After a rank fails, how long the others may take to notice and exit on their own
  // (their messages name the rank that failed) before they are stopped.
  std::chrono::milliseconds grace{5000};
  // After SIGTERM, how long before SIGKILL.
  std::chrono::milliseconds kill_after{3000};
  // Bind each rank to its own share of the cores this launcher may use (rank r gets
  // cores [r*C/N, (r+1)*C/N)), as mpirun does: ranks never share a core, and a rank's
  // progress thread stays next to its data. Ignored when there are more ranks than
  // cores.
  bool bind = true;
};

// Runs the job and returns the launcher's exit code: 0 when every rank exits 0;
// otherwise the first failing rank's exit code (128 + signal when it was killed),
// after a message on stderr that names that rank.
int launch(const LaunchOptions& options);

}  // namespace baton::transport
