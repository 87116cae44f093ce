// comm_worker: the program the multi-process tests start with `baton launch` (or by
// hand, in network namespaces). It builds the world from the environment and runs one
// scenario:
//   check               every collective and point-to-point, checked; prints "ok"
//   kill VICTIM MS      all-reduces in a loop; VICTIM SIGKILLs itself after MS ms
//   hang VICTIM MS      the same, but VICTIM stops (SIGSTOP): alive, silent
//   late                2 ranks: rank 1 sends rank 0 a 1 MiB message (rendezvous) and
//                       SIGKILLs itself; rank 0, once a receive has shown rank 1 dead,
//                       asks for that message: a PeerError, printed as "late: ..."
//   wedge               3 ranks: rank 0 dies inside a send to rank 1, its message half
//                       written into rank 1's shared-memory FIFO; see wedge_scenario
//   pause DIR           each rank waits on a receive from the previous one, says so
//                       (DIR/ready.RANK), and sends only once DIR/go exists: the test
//                       stops the whole job (SIGSTOP) meanwhile; prints "resumed ok"
// A rank that sees a PeerError prints it with the peer, leaves the launcher its failure
// report, and exits 3; bad input (an InputError) exits 2, as baton's commands do.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "memory/tensor.h"
#include "transport/launch.h"
#include "transport/world.h"

using namespace baton;
using namespace baton::transport;
using memory::DType;
using memory::Tensor;

namespace {

int g_rank = -1;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
  std::exit(1);
}

double value(int rank, int64_t i) {
  return double(int64_t((uint64_t(i) * 7 + uint64_t(rank) * 13) % 17) - 8);
}

Tensor input(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(value(rank, i));
  return Tensor::from_vector(v, {n});
}

void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

void check(Communicator& c) {
  const int r = c.rank(), n = c.size();
  for (int64_t count : {int64_t(0), int64_t(5), int64_t(100'003), int64_t(4'194'305)}) {
    std::string at = " (count " + std::to_string(count) + ")";
    // all-reduce sum and max
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      Tensor t = input(r, count);
      c.all_reduce(t, op)->wait();
      const float* p = t.data<float>();
      for (int64_t i = 0; i < count; ++i) {
        double want = op == ReduceOp::max ? -1e9 : 0;
        for (int q = 0; q < n; ++q)
          want = op == ReduceOp::max ? std::max(want, value(q, i)) : want + value(q, i);
        if (p[i] != float(want)) fail("all_reduce element " + std::to_string(i) + at);
      }
    }
    // all-gather and reduce-scatter with uneven parts
    std::vector<int64_t> parts;
    int64_t total = 0;
    for (int q = 0; q < n; ++q) {
      parts.push_back(count / n + (q < count % n ? 1 : 0));
      total += parts.back();
    }
    Tensor mine = input(r, parts[size_t(r)]);
    Tensor gathered = Tensor::zeros({total});
    c.all_gather(mine, gathered, parts)->wait();
    int64_t off = 0;
    for (int q = 0; q < n; ++q) {
      for (int64_t i = 0; i < parts[size_t(q)]; ++i)
        if (gathered.data<float>()[off + i] != float(value(q, i)))
          fail("all_gather from rank " + std::to_string(q) + at);
      off += parts[size_t(q)];
    }
    Tensor full = input(r, total);
    Tensor part = Tensor::zeros({parts[size_t(r)]});
    c.reduce_scatter(full, part, ReduceOp::sum, parts)->wait();
    int64_t base = 0;
    for (int q = 0; q < r; ++q) base += parts[size_t(q)];
    for (int64_t i = 0; i < parts[size_t(r)]; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q) want += value(q, base + i);
      if (part.data<float>()[i] != float(want))
        fail("reduce_scatter element " + std::to_string(i) + at);
    }
    // broadcast from the last rank
    Tensor b = r == n - 1 ? input(n - 1, count) : Tensor::zeros({count});
    c.broadcast(b, n - 1)->wait();
    for (int64_t i = 0; i < count; ++i)
      if (b.data<float>()[i] != float(value(n - 1, i))) fail("broadcast" + at);
    // point to point around the ring, with a tag per count
    Tensor out = input(r, count), in = Tensor::zeros({count});
    auto rw = c.irecv(in, (r + n - 1) % n, uint64_t(count % 1000));
    auto sw = c.isend(out, (r + 1) % n, uint64_t(count % 1000));
    rw->wait();
    sw->wait();
    for (int64_t i = 0; i < count; ++i)
      if (in.data<float>()[i] != float(value((r + n - 1) % n, i))) fail("send/recv" + at);
    // point to point with oneself (UCX cannot connect a worker to itself)
    Tensor self = Tensor::zeros({count});
    auto sw2 = c.isend(out, r, 1000 + uint64_t(count % 1000));
    c.irecv(self, r, 1000 + uint64_t(count % 1000))->wait();
    sw2->wait();
    for (int64_t i = 0; i < count; ++i)
      if (self.data<float>()[i] != float(value(r, i))) fail("send/recv to oneself" + at);
  }
  // Pairs as tensor-parallel groups (the last rank alone when n is odd).
  std::vector<int> pair{r - r % 2};
  if (r - r % 2 + 1 < n) pair.push_back(r - r % 2 + 1);
  auto tp = c.split(pair);
  Tensor t = Tensor::full({1000}, double(r + 1));
  tp->all_reduce(t, ReduceOp::sum)->wait();
  double want = 0;
  for (int g : pair) want += g + 1;
  expect(t.data<float>()[999] == float(want), "all_reduce in a sub-group");
  c.barrier()->wait();
}

void print_peer_error(const Communicator& c, const PeerError& e,
                      std::chrono::steady_clock::time_point start) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d: PeerError peer=%d after %.2f s: %s\n", c.rank(), e.peer(), secs, e.what());
  std::fflush(stdout);
  report_failure(e);  // as baton's commands do, for the launcher's summary
}

// All-reduces until a peer fails; the victim kills or stops itself after `ms`.
int fail_scenario(Communicator& c, const std::string& how, int victim, int ms) {
  auto start = std::chrono::steady_clock::now();
  if (c.rank() == victim) {
    std::thread([how, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      std::fprintf(stderr, "victim: %s now\n", how.c_str());
      std::fflush(stderr);
      raise(how == "kill" ? SIGKILL : SIGSTOP);
    }).detach();
  }
  Tensor t = Tensor::full({1 << 22}, 1.0);
  try {
    for (long k = 0;; ++k) {
      c.all_reduce(t, ReduceOp::avg)->wait();
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60))
        fail("no failure seen in 60 s");
    }
  } catch (const PeerError& e) {
    print_peer_error(c, e, start);
    return 3;
  }
}

// Rank 0 dies inside a send to rank 1, 0.3 s in: its 1 KiB buffer runs into an unreadable
// page, so the copy into rank 1's shared-memory FIFO faults after UCX has claimed the
// slot, and the fault kills it. The slot is never completed, and every later message in
// that FIFO waits behind it. Rank 2 waits on rank 1 from the start (a broadcast from it,
// by the tree: straight from rank 1); rank 1 waits on rank 0 only from 1.3 s. Rank 2 must
// hear of rank 0 from rank 1, not take the live but deafened rank 1 for the dead one.
int wedge_scenario(Communicator& c) {
  if (c.size() != 3) fail("wedge needs 3 ranks");
  auto start = std::chrono::steady_clock::now();
  Tensor t = Tensor::full({256}, 1.0);
  c.all_reduce(t, ReduceOp::sum)->wait();  // every endpoint of the ring is connected
  if (c.rank() == 0) {
    const long page = sysconf(_SC_PAGESIZE);
    void* m =
        mmap(nullptr, size_t(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(static_cast<char*>(m) + page, size_t(page), PROT_NONE) != 0)
      fail("mmap");
    // Ours, not UCX's (which prints a backtrace first): die as if killed, at once.
    struct sigaction sa {};
    sa.sa_handler = [](int) { raise(SIGKILL); };
    sigaction(SIGSEGV, &sa, nullptr);
    Tensor bad = Tensor::from_blob(static_cast<char*>(m) + page - 512, {256}, DType::f32,
                                   memory::Device::cpu());
    std::this_thread::sleep_until(start + std::chrono::milliseconds(300));
    std::fprintf(stderr, "victim: dying inside a send now\n");
    std::fflush(stderr);
    c.isend(bad, 1, 5)->wait();
    fail("a send from an unreadable buffer completed");
  }
  try {
    if (c.rank() == 1) {
      std::this_thread::sleep_until(start + std::chrono::milliseconds(1300));
      c.irecv(t, 0, 5)->wait();
    } else {
      // Rank 1 is the root and never joins. A collective, not a receive: its failures
      // in scope are the whole world's, so rank 0's counts once someone reports it.
      c.broadcast(t, 1)->wait();
    }
    fail("a receive completed");
  } catch (const PeerError& e) {
    print_peer_error(c, e, start);
    return 3;
  }
}

// A dead peer's message still queued at the receiver as a rendezvous request.
int late_scenario(Communicator& c) {
  if (c.size() != 2) fail("late needs 2 ranks");
  Tensor big = Tensor::full({1 << 18}, 1.0);  // 1 MiB: above the rendezvous threshold
  if (c.rank() == 1) {
    auto sw = c.isend(big, 0, 7);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the request is there
    std::fprintf(stderr, "victim: kill now\n");
    std::fflush(stderr);
    raise(SIGKILL);
  }
  try {
    Tensor small = Tensor::zeros({1});
    c.irecv(small, 1, 8)->wait();  // never sent: fails once rank 1 is found dead
    fail("a receive from a dead peer completed");
  } catch (const PeerError&) {
  }
  try {
    c.irecv(big, 1, 7)->wait();
    fail("the dead peer's rendezvous message was received");
  } catch (const PeerError& e) {
    std::printf("late: PeerError peer=%d\n", e.peer());
    std::fflush(stdout);
    return 3;
  }
}

// Every rank waits on the previous one (watched by the liveness protocol) while the
// test stops and continues the whole job, as a host too busy to run it for seconds does;
// nobody may be declared failed for the silence of that pause.
int pause_scenario(Communicator& c, const std::string& dir) {
  const int r = c.rank(), n = c.size();
  c.barrier()->wait();  // every endpoint connected
  Tensor in = Tensor::zeros({256}), out = Tensor::full({256}, double(r));
  auto start = std::chrono::steady_clock::now();
  auto rw = c.irecv(in, (r + n - 1) % n, 9);
  std::ofstream(dir + "/ready." + std::to_string(r)) << "waiting\n";
  while (!std::filesystem::exists(dir + "/go")) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) fail("no go in 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  try {
    auto sw = c.isend(out, (r + 1) % n, 9);
    rw->wait();
    sw->wait();
  } catch (const PeerError& e) {
    print_peer_error(c, e, start);
    return 3;
  }
  expect(in.data<float>()[255] == float((r + n - 1) % n), "the message after the pause");
  std::printf("rank %d: resumed ok\n", r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: comm_worker check | kill VICTIM MS | hang VICTIM MS | late | wedge | "
                 "pause DIR\n");
    return 2;
  }
  std::string scenario = argv[1];
  try {
    World w = init_world();
    g_rank = w.comm->rank();
    if (scenario == "check") {
      check(*w.comm);
      std::printf("rank %d of %d ok (%s, %s)\n", w.comm->rank(), w.comm->size(),
                  w.comm->backend().c_str(), w.env.source.c_str());
      return 0;
    }
    if (scenario == "late") return late_scenario(*w.comm);
    if (scenario == "wedge") return wedge_scenario(*w.comm);
    if (scenario == "pause" && argc == 3) return pause_scenario(*w.comm, argv[2]);
    if ((scenario == "kill" || scenario == "hang") && argc == 4)
      return fail_scenario(*w.comm, scenario, std::atoi(argv[2]), std::atoi(argv[3]));
    std::fprintf(stderr, "comm_worker: unknown scenario %s\n", scenario.c_str());
    return 2;
  } catch (const InputError& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    report_failure(e);
    return 1;
  }
}
