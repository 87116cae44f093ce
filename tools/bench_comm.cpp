// `baton bench comm`: collective and point-to-point bandwidth in the nccl-tests
// convention (size, time, algbw, busbw, #wrong), on the local backend (ranks as threads)
// or UCX (ranks as processes, under `baton launch`). bench/mpi_comm_bench.cpp measures
// Open MPI with the same sizes, timing and table; bench/comm_compare.py runs both.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bench/stats.h"
#include "memory/error.h"
#include "memory/tensor.h"
#include "memory/units.h"
#include "tools/bench.h"
#include "tools/command.h"
#include "transport/local.h"
#include "transport/world.h"

namespace baton::tools {
namespace {

using memory::DType;
using memory::Tensor;
using transport::Communicator;
using transport::ReduceOp;
using Clock = std::chrono::steady_clock;

struct CommBenchOptions {
  std::vector<std::string> ops;
  size_t min_bytes = 8;
  size_t max_bytes = size_t(64) << 20;
  int reps = 7;
};

const std::vector<std::string> kOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                       "sendrecv"};

// Iterations per timed batch: many for small messages, a few for large ones.
int batch_iters(size_t bytes) {
  size_t m = (size_t(16) << 20) / std::max<size_t>(bytes, 1);
  return int(std::clamp<size_t>(m, 2, 200));
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (op == "all_gather" || op == "reduce_scatter") return n > 1 ? double(n - 1) / n : 0.0;
  return 1.0;
}

float value(size_t i, int r) {
  return float((i * 7 + size_t(r) * 13) % 101);
}

// An op's count of elements at `bytes`: a rank's part for all-gather and reduce-scatter.
size_t count_of(const std::string& op, size_t bytes, int n) {
  size_t count = bytes / sizeof(float);
  return op == "all_gather" || op == "reduce_scatter" ? count / size_t(n) : count;
}

// The size a row reports for `bytes`: whole f32 elements (whole parts per rank for
// all-gather and reduce-scatter), so at most `bytes`.
size_t row_size(const std::string& op, size_t bytes, int n) {
  const size_t count = count_of(op, bytes, n);
  return (op == "all_gather" || op == "reduce_scatter" ? count * size_t(n) : count) * 4;
}

// Whether `bytes` gives a row: an element to send, and a size that rounds down to no
// less than --min-bytes (--min-bytes 6 had printed a 4-byte row).
bool has_row(const std::string& op, size_t bytes, int n, size_t min_bytes) {
  return count_of(op, bytes, n) > 0 && row_size(op, bytes, n) >= min_bytes;
}

// The largest size the doubling from --min-bytes reaches without passing --max-bytes.
size_t largest_size(const CommBenchOptions& o) {
  size_t bytes = o.min_bytes;
  while (bytes <= o.max_bytes / 2) bytes *= 2;
  return bytes;
}

// Every op needs a size that holds an element (a part of one per rank, for all-gather and
// reduce-scatter) and rounds down to whole ones within --min-bytes: a table with no row is
// no result. The rows grow with the size, so the largest one decides.
void check_sizes(const CommBenchOptions& o, int n) {
  for (const auto& op : o.ops) {
    const bool split = op == "all_gather" || op == "reduce_scatter";
    const std::string range = "--min-bytes " + std::to_string(o.min_bytes) + " to --max-bytes " +
                              std::to_string(o.max_bytes) + ": ";
    if (count_of(op, largest_size(o), n) == 0)
      throw InputError(range + "no size holds " +
                       (split ? "a 4-byte f32 element per rank for " + op + " over " +
                                    std::to_string(n) + " ranks (at least " +
                                    std::to_string(4 * n) + " bytes)"
                              : "a 4-byte f32 element for " + op));
    if (!has_row(op, largest_size(o), n, o.min_bytes))
      throw InputError(range + "the sizes round down to whole 4-byte f32 elements" +
                       (split ? " per rank (multiples of " + std::to_string(4 * n) + " bytes for " +
                                    op + " over " + std::to_string(n) + " ranks)"
                              : " for " + op) +
                       ", and none is at least --min-bytes");
  }
}

// Buffers as large as the ops need at --max-bytes, no larger: all-reduce, broadcast
// and send/recv a message each way; all-gather's output and reduce-scatter's input
// are the whole message, their other side one rank's part of it. Elements of the two.
std::pair<size_t, size_t> buffer_elements(const std::vector<std::string>& ops, size_t max_bytes,
                                          int n) {
  const size_t whole = max_bytes / sizeof(float), part = whole / size_t(n);
  size_t a = 0, b = 0;
  for (const auto& op : ops) {
    if (op == "all_gather") {
      a = std::max(a, part);
      b = std::max(b, part * size_t(n));
    } else if (op == "reduce_scatter") {
      a = std::max(a, part * size_t(n));
      b = std::max(b, part);
    } else {
      a = std::max(a, whole);
      if (op == "sendrecv") b = std::max(b, whole);
    }
  }
  return {a, b};
}

// The largest --max-bytes: beyond it a size is a typo more likely than a benchmark (a
// terabyte had ended in a bare "std::bad_alloc").
constexpr size_t kMaxMessageBytes = size_t(16) << 30;

// --max-bytes within kMaxMessageBytes, and what the host's `local` ranks allocate (their
// buffers, and rank 0's two memcpy buffers) within its memory.
void check_memory(const CommBenchOptions& o, const std::string& text, int n, int local) {
  if (o.max_bytes > kMaxMessageBytes)
    throw InputError("--max-bytes " + text + ": expected at most " +
                     memory::format_bytes(double(kMaxMessageBytes)) + " per message");
  const auto [a, b] = buffer_elements(o.ops, o.max_bytes, n);
  const double per_rank = double(a + b) * sizeof(float);
  const double need = per_rank * local + 2.0 * double(largest_size(o));
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > have)
    throw InputError(
        "--max-bytes " + text + ": " + std::to_string(local) + " rank(s) on this host need " +
        memory::format_bytes(need) + " (buffers of " + memory::format_bytes(per_rank) +
        " per rank, and a memcpy's two), and it has " + memory::format_bytes(have) + " of memory");
}

class Bench {
 public:
  Bench(Communicator& c, const std::vector<std::string>& ops, size_t max_bytes)
      : c_(c), n_(c.size()), r_(c.rank()) {
    const auto [a, b] = buffer_elements(ops, max_bytes, n_);
    a_ = Tensor::zeros({int64_t(a)});
    b_ = Tensor::zeros({int64_t(b)});
    one_ = Tensor::zeros({1}, DType::f64);
  }

  size_t buffer_bytes() const { return a_.nbytes() + b_.nbytes(); }

  // Views of the reused buffers for one operation and size, made once before timing
  // (making a view allocates; the timed loop should measure communication only).
  void prepare(const std::string& op, size_t count) {
    op_ = op == "all_reduce"       ? Op::all_reduce
          : op == "all_gather"     ? Op::all_gather
          : op == "reduce_scatter" ? Op::reduce_scatter
          : op == "broadcast"      ? Op::broadcast
                                   : Op::sendrecv;
    int64_t k = int64_t(count);
    if (op == "all_reduce" || op == "broadcast") {
      x_ = a_.narrow(0, 0, k);
    } else if (op == "all_gather") {
      x_ = a_.narrow(0, 0, k);
      y_ = b_.narrow(0, 0, k * n_);
    } else if (op == "reduce_scatter") {
      x_ = a_.narrow(0, 0, k * n_);
      y_ = b_.narrow(0, 0, k);
    } else if (op == "sendrecv") {
      x_ = a_.narrow(0, 0, k);
      y_ = b_.narrow(0, 0, k);
    }
  }

  // One operation on the prepared views: the op was read in prepare (comparing its name
  // here was 4% of an 8-byte run's time).
  void run() {
    switch (op_) {
      case Op::all_reduce:
        c_.all_reduce(x_, ReduceOp::sum)->wait();
        break;
      case Op::all_gather:
        c_.all_gather(x_, y_)->wait();
        break;
      case Op::reduce_scatter:
        c_.reduce_scatter(x_, y_, ReduceOp::sum)->wait();
        break;
      case Op::broadcast:
        c_.broadcast(x_, 0)->wait();
        break;
      case Op::sendrecv: {
        auto rw = c_.irecv(y_, (r_ + n_ - 1) % n_, 7);
        auto sw = c_.isend(x_, (r_ + 1) % n_, 7);
        rw->wait();
        sw->wait();
        break;
      }
    }
  }

  void fill(const std::string& op, size_t count) {
    size_t total = op == "reduce_scatter" ? count * size_t(n_) : count;
    float* a = a_.data<float>();
    for (size_t i = 0; i < total; ++i) a[i] = value(i, r_);
    // The output's extent: b holds all-gather's output, reduce-scatter's and send/recv's.
    size_t out = op == "all_gather"                           ? count * size_t(n_)
                 : op == "reduce_scatter" || op == "sendrecv" ? count
                                                              : 0;
    float* b = b_.data<float>();
    std::fill(b, b + out, -1.0f);
  }

  // Wrong elements of one run, summed over the ranks.
  double check(const std::string& op, size_t count) {
    const float* a = a_.data<float>();
    const float* b = b_.data<float>();
    double wrong = 0;
    auto sum = [&](size_t i) {
      float s = 0;
      for (int q = 0; q < n_; ++q) s += value(i, q);
      return s;
    };
    if (op == "all_reduce") {
      for (size_t i = 0; i < count; ++i) wrong += a[i] != sum(i);
    } else if (op == "all_gather") {
      for (int q = 0; q < n_; ++q)
        for (size_t i = 0; i < count; ++i) wrong += b[size_t(q) * count + i] != value(i, q);
    } else if (op == "reduce_scatter") {
      for (size_t i = 0; i < count; ++i) wrong += b[i] != sum(size_t(r_) * count + i);
    } else if (op == "broadcast") {
      for (size_t i = 0; i < count; ++i) wrong += a[i] != value(i, 0);
    } else if (op == "sendrecv") {
      for (size_t i = 0; i < count; ++i) wrong += b[i] != value(i, (r_ + n_ - 1) % n_);
    }
    return reduce_scalar(wrong, ReduceOp::sum);
  }

  double reduce_scalar(double x, ReduceOp op) {
    one_.data<double>()[0] = x;
    c_.all_reduce(one_, op)->wait();
    return one_.data<double>()[0];
  }

  // Warm-buffer memcpy of `bytes` on this thread: the ceiling for moving bytes here. Its
  // own buffers, freed before the operations run.
  static double memcpy_gbs(size_t bytes) {
    std::vector<char> from(bytes, 1), to(bytes, 0);
    std::vector<double> t;
    for (int i = 0; i < 11; ++i) {
      auto t0 = Clock::now();
      std::memcpy(to.data(), from.data(), bytes);
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return double(bytes) / bench::stats(t).median / 1e9;
  }

  Communicator& c_;
  int n_, r_;
  Tensor a_, b_, one_;
  Tensor x_, y_;  // the prepared views
  enum class Op { all_reduce, all_gather, reduce_scatter, broadcast, sendrecv } op_ = Op::sendrecv;
};

void bench_rank(Communicator& c, const CommBenchOptions& o, const std::string& settings) {
  const int n = c.size();
  check_sizes(o, n);
  const double mc = c.rank() == 0 ? Bench::memcpy_gbs(largest_size(o)) : 0.0;
  Bench b(c, o.ops, o.max_bytes);
  if (c.rank() == 0) {
    std::printf("# baton bench comm: backend %s, %d ranks, f32, %d batches after warm-up; %s\n",
                c.backend().c_str(), n, o.reps, settings.c_str());
    std::printf("# memcpy %s warm buffers, one thread: %.2f GB/s; buffers %s per rank\n",
                memory::format_bytes(double(largest_size(o))).c_str(), mc,
                memory::format_bytes(double(b.buffer_bytes())).c_str());
    std::printf("%-15s %12s %12s %10s %10s %10s %9s %9s %7s\n", "op", "size(B)", "count",
                "time(us)", "min(us)", "max(us)", "algbw", "busbw", "#wrong");
    std::fflush(stdout);
  }
  c.barrier()->wait();
  for (const auto& op : o.ops) {
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      if (!has_row(op, bytes, n, o.min_bytes)) continue;
      const size_t count = count_of(op, bytes, n);
      b.fill(op, count);
      b.prepare(op, count);
      b.run();
      double wrong = b.check(op, count);
      int m = batch_iters(bytes);
      for (int i = 0; i < m; ++i) b.run();  // warm-up
      std::vector<double> times;
      for (int rep = 0; rep < o.reps; ++rep) {
        c.barrier()->wait();
        auto t0 = Clock::now();
        for (int i = 0; i < m; ++i) b.run();
        double t = std::chrono::duration<double>(Clock::now() - t0).count() / m;
        times.push_back(b.reduce_scalar(t, ReduceOp::max));
      }
      const bench::Stats t = bench::stats(times);
      const double med = t.median;
      const size_t size = row_size(op, bytes, n);
      double algbw = double(size) / med / 1e9;
      if (c.rank() == 0) {
        std::printf("%-15s %12zu %12zu %10.2f %10.2f %10.2f %9.3f %9.3f %7.0f\n", op.c_str(), size,
                    size / 4, med * 1e6, t.min * 1e6, t.max * 1e6, algbw, algbw * bus_factor(op, n),
                    wrong);
        std::fflush(stdout);
      }
    }
  }
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int run_comm(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()(
      "backend", po::value<std::string>(),
      "local (ranks as threads) or ucx (ranks as processes; run under baton launch); "
      "default: ucx when launched, else local")("ranks,n", po::value<int>()->default_value(2),
                                                "ranks of the local backend (under a launcher: "
                                                "the launched world's, which a -n must match)")(
      "op",
      po::value<std::string>()->default_value(
          "all_reduce,all_gather,reduce_scatter,broadcast,sendrecv"),
      "operations, comma-separated, each once")(
      "min-bytes", po::value<std::string>()->default_value("8"), "smallest message (e.g. 8, 4KiB)")(
      "max-bytes", po::value<std::string>()->default_value("64MiB"),
      "largest message (at most 16GiB, and the buffers within the host's memory)")(
      "reps", po::value<int>()->default_value(7), "timed batches per size (median, min, max)");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args, "baton bench comm [options]", opts, vm)) return 0;
  apply_common_options(vm);
  CommBenchOptions o;
  o.ops = split_comma_list(vm["op"].as<std::string>(), "--op");
  if (o.ops.empty())
    throw InputError(
        "--op: expected one or more of all_reduce, all_gather, reduce_scatter, "
        "broadcast and sendrecv, found '" +
        vm["op"].as<std::string>() + "'");
  // A repeated item had been run twice, the table showing it so.
  for (size_t i = 0; i < o.ops.size(); ++i) {
    const std::string& op = o.ops[i];
    if (std::find(kOps.begin(), kOps.end(), op) == kOps.end())
      throw InputError(
          "--op: unknown operation '" + op +
          "' (expected all_reduce, all_gather, reduce_scatter, broadcast or sendrecv)");
    if (std::find(o.ops.begin(), o.ops.begin() + ptrdiff_t(i), op) != o.ops.begin() + ptrdiff_t(i))
      throw InputError("--op: " + op + " is listed twice");
  }
  o.min_bytes = parse_bytes_option("--min-bytes", vm["min-bytes"].as<std::string>());
  o.max_bytes = parse_bytes_option("--max-bytes", vm["max-bytes"].as<std::string>());
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes)
    throw InputError("--min-bytes must be at least 1 and at most --max-bytes");
  o.reps = vm["reps"].as<int>();
  if (o.reps < 1) throw InputError("--reps: expected at least 1");
  // Launched (baton launch, mpirun, srun): ucx; the variables of each launcher as the
  // world reads them (BATON_WORLD_SIZE alone had left mpirun's ranks each on its own).
  std::string backend = vm.count("backend")                     ? vm["backend"].as<std::string>()
                        : transport::read_launch_env().size > 1 ? "ucx"
                                                                : "local";
  std::string settings = "UCX_TLS=" + env_or("UCX_TLS", "(UCX's choice)") +
                         ", BATON_RING_CHUNK=" + env_or("BATON_RING_CHUNK", "(default)");
  if (backend == "local") {
    int n = vm["ranks"].as<int>();
    if (n < 1) throw InputError("--ranks: expected at least 1");
    check_sizes(o, n);
    // The ranks are threads of this process.
    check_memory(o, vm["max-bytes"].as<std::string>(), n, n);
    auto world = transport::make_local_world(n, transport::CommOptions::from_env());
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          bench_rank(*world[size_t(r)], o, settings);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return 0;
  }
  if (backend != "ucx") throw InputError("--backend: expected local or ucx, got '" + backend + "'");
  // Outside a launcher the world is this one process, and would run on the local backend
  // under a UCX heading.
  const transport::LaunchEnv env = transport::read_launch_env();
  if (env.size < 2)
    throw InputError(
        "--backend ucx: the ranks are processes started by a launcher, and this process is "
        "a world of one (BATON_WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS "
        "unset or 1): run it as `baton launch -n N -- baton bench comm`, or pass --backend "
        "local --ranks N");
  // -n had been ignored here: the launcher's ranks ran, whatever it said.
  if (!vm["ranks"].defaulted() && vm["ranks"].as<int>() != env.size)
    throw InputError("--ranks " + std::to_string(vm["ranks"].as<int>()) +
                     ": the launcher started " + std::to_string(env.size) +
                     " ranks, and they are the ranks over UCX (leave -n out, or launch with -n " +
                     std::to_string(vm["ranks"].as<int>()) + ")");
  check_memory(o, vm["max-bytes"].as<std::string>(), env.size, env.local_size);
  transport::World w = transport::init_world();
  bench_rank(*w.comm, o, settings);
  return 0;
}

const RegisterBenchmark register_comm{
    {"comm", "communication: all-reduce, all-gather, reduce-scatter, broadcast, send/recv",
     run_comm}};

}  // namespace
}  // namespace baton::tools
