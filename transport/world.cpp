#include "transport/world.h"

#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memory/error.h"
#include "transport/detail/asio.h"
#include "transport/launch.h"
#include "transport/local.h"
#include "transport/ucx.h"

namespace baton::transport {

namespace {

// How long a rank hosting a rendezvous that failed as bad input keeps answering ranks that
// are still starting (hand-started or mpirun ranks come seconds apart).
constexpr std::chrono::seconds kFailedRendezvousLinger{5};

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = env(name);
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi)
    throw InputError(std::string(name) + "='" + v + "': expected an integer from " +
                     std::to_string(lo) + " to " + std::to_string(hi));
  return int(x);
}

struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// In order of preference: our launcher, then the schedulers' own launchers.
constexpr Source kSources[] = {
    {"baton launch", "BATON_RANK", "BATON_WORLD_SIZE", "BATON_LOCAL_RANK", "BATON_LOCAL_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    // The local size: slurm_tasks_here() (SLURM_NTASKS_PER_NODE is set only with
    // --ntasks-per-node, and is wrong for nodes given unequal shares).
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// This node's tasks of the step from SLURM_STEP_TASKS_PER_NODE (or the job's
// SLURM_TASKS_PER_NODE), a list such as "2(x3),1" indexed by SLURM_NODEID; nullopt when
// neither says.
std::optional<int> slurm_tasks_here() {
  const char* name =
      env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const char* list = env(name);
  if (list == nullptr) return std::nullopt;
  const int node = env("SLURM_NODEID") ? env_int("SLURM_NODEID", 0, 1 << 20) : 0;
  std::vector<int> per_node;
  const std::string text = list;
  auto bad = [&] {
    return InputError(std::string(name) + "='" + text +
                      "': expected counts such as 2(x3),1 (Slurm's tasks per node)");
  };
  // The whole text, digits only: std::stoi took "2(x3)," and " 2".
  size_t pos = 0;
  auto number = [&] {
    long v = 0;
    const size_t start = pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9' && pos - start < 8)
      v = v * 10 + (text[pos++] - '0');
    if (pos == start || v < 1) throw bad();
    return v;
  };
  while (true) {
    const long count = number();
    long times = 1;
    if (text.compare(pos, 2, "(x") == 0) {
      pos += 2;
      times = number();
      if (pos >= text.size() || text[pos] != ')') throw bad();
      ++pos;
    }
    if (count > 1 << 20 || per_node.size() + size_t(times) > size_t(1) << 20) throw bad();
    per_node.insert(per_node.end(), size_t(times), int(count));
    if (pos == text.size()) break;
    if (text[pos++] != ',') throw bad();
  }
  if (size_t(node) >= per_node.size())
    throw InputError(std::string(name) + "='" + text + "' lists " +
                     std::to_string(per_node.size()) + " node(s), but SLURM_NODEID is " +
                     std::to_string(node));
  return per_node[size_t(node)];
}

// A token when the user gave none: the scheduler's job id, which stray connections
// from other jobs do not know. Weaker than a random token; we say so.
std::string token_from_job_id() {
  for (const char* v : {"SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"})
    if (const char* x = env(v)) return std::string("job-") + x;
  return {};
}

// This host in messages: its name, and the address it reaches the rendezvous from (which
// tells hosts apart whose names are the same, as network namespaces on one machine),
// unless that is loopback. The address is the one routing picks for the rendezvous (a UDP
// socket's connect sends nothing).
std::string world_host_label(const std::string& rendezvous_host, uint16_t port) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string label = name;
  try {
    namespace asio = boost::asio;
    asio::io_context io;
    asio::ip::udp::resolver resolver(io);
    asio::ip::udp::socket socket(io);
    boost::system::error_code ec;
    auto found = resolver.resolve(rendezvous_host, std::to_string(port), ec);
    if (ec || found.empty()) return label;
    socket.connect(found.begin()->endpoint(), ec);
    if (ec) return label;
    auto address = socket.local_endpoint(ec).address();
    if (!ec && !address.is_loopback() && !address.is_unspecified())
      label += " (" + address.to_string() + ")";
  } catch (const std::exception&) {
  }
  return label;
}

}  // namespace

std::string host_id() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string id = name;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {};
    if (std::fgets(boot, sizeof boot, f)) id += std::string("/") + boot;
    std::fclose(f);
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  }
  char ns[128] = {};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  // Appended piece by piece: `"/" + std::string(...)` (operator+(const char*, string&&),
  // which inserts at the front) draws a false -Wrestrict from GCC 12 at -O3 (GCC PR 105651).
  if (n > 0) {
    id += '/';
    id.append(ns, size_t(n));
  }
  return id;
}

std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what,
                                                 bool any_port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw InputError(what + "='" + text + "': expected host:port");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  const long lowest = any_port ? 0 : 1;
  if (port_text.empty() || *end != '\0' || port < lowest || port > 65535)
    throw InputError(what + "='" + text + "': the port must be a number from " +
                     std::to_string(lowest) + " to 65535");
  return {host, uint16_t(port)};
}

LaunchEnv read_launch_env() {
  LaunchEnv e;
  // Variables that come in pairs: both or neither.
  auto pair = [](const Source& s, const char* a, const char* b) {
    if (a == nullptr || b == nullptr || bool(env(a)) == bool(env(b))) return;
    throw InputError(std::string(s.name) + ": " + (env(a) ? b : a) + " is not set but " +
                     (env(a) ? a : b) + " is");
  };
  for (const Source& s : kSources) {
    if (!env(s.rank) && !env(s.size)) continue;
    pair(s, s.rank, s.size);
    pair(s, s.local_rank, s.local_size);
    e.source = s.name;
    e.rank_from = s.rank;
    e.size_from = s.size;
    e.size = env_int(s.size, 1, 1 << 20);
    e.rank = env_int(s.rank, 0, e.size - 1);
    if (s.local_size == nullptr) {
      // Unknown: at least this task's place among them.
      e.local_size = slurm_tasks_here().value_or(
          env(s.local_rank) ? env_int(s.local_rank, 0, e.size - 1) + 1 : 1);
      if (e.local_size > e.size)
        throw InputError("Slurm: " + std::to_string(e.local_size) +
                         " tasks on this node in a job of " + std::to_string(e.size));
    } else {
      e.local_size = env(s.local_size) ? env_int(s.local_size, 1, e.size) : 1;
    }
    e.local_rank = env(s.local_rank) ? env_int(s.local_rank, 0, e.local_size - 1) : 0;
    break;
  }
  if (const char* r = env("BATON_RENDEZVOUS")) {
    e.rendezvous = r;
    parse_host_port(e.rendezvous, "BATON_RENDEZVOUS");
  }
  if (const char* t = env("BATON_JOB_TOKEN")) e.token = t;
  e.store_hosted =
      env("BATON_STORE_HOSTED") != nullptr && std::string(env("BATON_STORE_HOSTED")) == "1";
  e.bind_self = env("BATON_BIND") != nullptr && std::string(env("BATON_BIND")) == "self";
  if (e.size > 1) {
    if (e.rendezvous.empty())
      throw InputError("world of " + std::to_string(e.size) + " ranks (from " + e.source +
                       ") but BATON_RENDEZVOUS is not set: give host:port of rank 0's host, e.g. "
                       "BATON_RENDEZVOUS=node0:29500 (baton launch sets it itself)");
    if (e.token.empty()) {
      e.token = token_from_job_id();
      if (e.token.empty())
        throw InputError(
            "BATON_JOB_TOKEN is not set: give every rank the same secret, e.g. "
            "`mpirun -x BATON_JOB_TOKEN=$(openssl rand -hex 16) ...`");
      // Once: the environment is read more than once per process (thread counts, then
      // the world).
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        spdlog::warn(
            "BATON_JOB_TOKEN is not set; using the scheduler's job id as the rendezvous token");
    }
  }
  return e;
}

std::vector<int> allowed_cores() {
  cpu_set_t mine;
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) cores.push_back(c);
  return cores;
}

int bind_dealt(int place, const LaunchEnv& env) {
  if (!env.bind_self || env.local_size != env.size || place < 0) return -1;
  const std::vector<int> cores = allowed_cores();
  if (cores.empty() || env.local_size <= int(cores.size())) return -1;  // the launcher bound it
  const int core = cores[size_t(place) % cores.size()];
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(core, &one);
  // And batch scheduling: time-sliced ranks gain nothing by preempting each other at every
  // wake-up (each tensor-parallel all-reduce wakes a partner); a batch thread woken waits
  // for the running one's slice. Tensor-parallel plans ran 0-6% faster, never slower
  // (docs/transport.md).
  const sched_param batch{};
  auto set = [&](pid_t tid) {
    return sched_setaffinity(tid, sizeof one, &one) == 0 &&
           sched_setscheduler(tid, SCHED_BATCH, &batch) == 0;
  };
  // Every thread: these calls change only the thread named.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = pid_t(std::atol(task.path().filename().c_str()));
    if (!set(tid) && tid == pid_t(gettid())) return -1;
  }
  if (ec && !set(0)) return -1;
  spdlog::debug("rank {}: {} ranks on {} cores, bound to core {} (batch scheduling)", env.rank,
                env.local_size, cores.size(), core);
  return core;
}

World init_world(const WorldOptions& options) {
  World w;
  w.env = read_launch_env();
  const LaunchEnv& e = w.env;
  if (e.size == 1) {
    w.comm = make_local_world(1, options.comm)[0];
    return w;
  }
  auto [host, port] = parse_host_port(e.rendezvous, "BATON_RENDEZVOUS");
  if (e.rank == 0 && !e.store_hosted) {
    w.server = std::make_unique<StoreServer>(host, port, e.token);
    spdlog::debug("rank 0: rendezvous listening on {}:{}", host, port);
  }
  HostLabels hosts;
  hosts.mine = world_host_label(host, port);
  // Registered as a rank: the rendezvous refuses a rank twice, world sizes that differ
  // and another job token, for every rank at once.
  const StoreMember me{e.rank, e.rank_from, e.size, e.size_from, hosts.mine};
  try {
    w.store = std::make_shared<TcpStore>(host, port, e.token, options.comm.connect_timeout, me);
    w.comm = make_ucx_world(e.rank, e.size, w.store, options.comm, options.prefix, hosts);
  } catch (const std::exception& error) {
    // The ranks waiting at this rank's rendezvous learn why it closes (the ranks that
    // never came), rather than reading an end of file.
    const bool input = dynamic_cast<const InputError*>(&error) != nullptr;
    if (w.server) w.server->fail(error.what(), input);
    // Bad input (a rank's wrong token, a rank twice): ranks still starting would find no
    // rendezvous once this process is gone and wait out their connect timeout, told only
    // "connection refused". They are answered for a few seconds, or until every rank's
    // hello has come.
    if (w.server && input) {
      const auto until = std::chrono::steady_clock::now() + kFailedRendezvousLinger;
      while (int(w.server->heard_from().size()) < e.size &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw;
  }
  note_world_hosts(e.rank, std::move(hosts.of));
  return w;
}

}  // namespace baton::transport
