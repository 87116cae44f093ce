// `baton launch`: starts the ranks of a job on this host, with the rendezvous, each
// process's output prefixed with its rank, and the job stopped as a whole when one rank
// fails. Multi-host jobs use mpirun or srun instead (see world.h).
#pragma once

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace baton::transport {

struct LaunchOptions {
  int nprocs = 1;
  std::vector<std::string> command;  // the program and its arguments
  std::string host = "127.0.0.1";    // the rendezvous listens here (loopback by default)
  uint16_t port = 0;                 // 0: any free port
  // After a rank fails, how long the others may take to notice and exit on their own
  // (their messages name the rank that failed) before they are stopped. A stopped
  // (suspended) rank, which cannot, is killed at once.
  std::chrono::milliseconds grace{5000};
  // After SIGTERM, how long before SIGKILL.
  std::chrono::milliseconds kill_after{3000};
  // The same when the user stopped the job (SIGTERM or SIGINT to the launcher): the ranks
  // of `baton train` finish their step and write a checkpoint first. A second signal
  // kills at once.
  std::chrono::milliseconds stop_timeout{30000};
  // A rank stopped (SIGSTOP, SIGTSTP) this long without being continued has failed: the
  // launcher kills it and stops the job, as for a crash. Its peers time out on it as
  // soon, but with none left (they had finished) nothing else would. Unset: the peer
  // timeout as the ranks read it (BATON_PEER_TIMEOUT).
  std::optional<std::chrono::milliseconds> stopped_limit;
  // The same while every rank is stopped (the job paused whole, which the ranks ride out);
  // 0: forever. Unset: the stall timeout (BATON_STALL_TIMEOUT).
  std::optional<std::chrono::milliseconds> paused_limit;
  // Bind each rank to its own share of the cores this launcher may use (rank r gets
  // cores [r*C/N, (r+1)*C/N)), as mpirun does: ranks never share a core, and a rank's
  // progress thread stays next to its data. With more ranks than cores the launcher
  // binds none and says so (BATON_BIND=self): a rank that knows its place binds
  // itself (world.h's bind_dealt).
  bool bind = true;
  // After a failure (a rank that died, or exited non-zero because another hung or died),
  // the job is stopped as a whole and then started again, up to max_restarts times; the
  // restarted ranks get BATON_RESUME=1 (`baton train` then resumes from its newest
  // complete checkpoint, as with --resume). A rank's exit code 2 (bad input) is not
  // restarted: it would fail again the same way.
  int max_restarts = 0;
  std::chrono::milliseconds restart_backoff{1000};  // wait before each restart
};

// The store key a job's rank 0 sets to the number of steps done (what the launcher
// reports with a failure).
inline constexpr const char* kProgressKey = "baton/step";

// Whether this process is a restarted rank that should resume (BATON_RESUME=1).
bool resume_requested();

// The failure report: `baton launch` gives each rank a file to leave it in
// (BATON_FAILURE_REPORT), and reads it when the rank has failed, so that its summary names
// the cause a rank saw, which an exit code cannot carry: which peer it lost and where that
// peer ran. A JSON object: {"rank": 0, "host": "...", "error": "...", and for a PeerError
// "peer": 1, "peer_host": "..."} (docs/transport.md, "Failure reports").
struct FailureReport {
  int rank = -1;
  std::string host;
  std::string error;
  int peer = -1;  // the world rank it lost, -1 when its error was not a peer's failure
  std::string peer_host;
};
inline constexpr const char* kFailureReportVariable = "BATON_FAILURE_REPORT";

// init_world notes this process's world rank and every rank's host label (as the ranks
// announced them) for report_failure.
void note_world_hosts(int rank, std::vector<std::string> hosts);
// This process's host label as init_world noted it ("node0 (10.0.0.1)": hosts of one name,
// as network namespaces, told apart), else the host name.
std::string own_host_label();
// Writes the report of `error` to BATON_FAILURE_REPORT, if the launcher set it; the
// command line calls it for every failure (bad input too). Never throws (a report that cannot
// be written is only logged).
void report_failure(const std::exception& error) noexcept;
// Reads a report; nullopt when the file is missing or is not a report.
std::optional<FailureReport> read_failure_report(const std::string& path);

// Runs the job and returns the launcher's exit code: 0 when every rank exits 0;
// otherwise the first failing rank's exit code (128 + signal when it was killed),
// after a message on stderr that names that rank (and, after restarts, every failure).
int launch(const LaunchOptions& options);

}  // namespace baton::transport
