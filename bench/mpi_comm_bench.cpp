// The peer for `baton bench comm`: the same operations, sizes, timing method and table,
// measured with MPI (Debian's Open MPI). Built only when MPI is found; never a dependency
// of the library or the tests.
//
//   mpirun -n 2 build/release/bench/mpi_comm_bench [--op all_reduce,...] [--min-bytes N]
//          [--max-bytes N] [--reps R]
//
// Timing: after warm-up, R batches of m back-to-back iterations; a batch's time per
// iteration is the slowest rank's; the table shows the median, min and max over batches.
// Bus bandwidth as nccl-tests defines it. #wrong counts wrong elements of one checked run.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace {

struct Options {
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "sendrecv"};
  size_t min_bytes = 8;
  size_t max_bytes = size_t(64) << 20;
  int reps = 7;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mpi_comm_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: mpirun -n N mpi_comm_bench [--op all_reduce,...] [--min-bytes N] "
          "[--max-bytes N] [--reps R]\n");
      std::exit(0);
    }
    if (a == "--op")
      o.ops = split_list(next());
    else if (a == "--min-bytes")
      o.min_bytes = std::stoull(next());
    else if (a == "--max-bytes")
      o.max_bytes = std::stoull(next());
    else if (a == "--reps")
      o.reps = std::stoi(next());
    else {
      std::fprintf(stderr, "mpi_comm_bench: unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Iterations per batch: many for small messages (so the timer's resolution and the
// barrier skew do not matter), few for large ones.
int batch_iters(size_t bytes) {
  size_t m = (size_t(16) << 20) / std::max<size_t>(bytes, 1);
  return int(std::clamp<size_t>(m, 2, 200));
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (op == "all_gather" || op == "reduce_scatter") return n > 1 ? double(n - 1) / n : 0.0;
  return 1.0;
}

struct Bench {
  int rank = 0, n = 1;
  std::vector<float> a, b;  // reused buffers, touched once before timing

  // One run of `op` with `count` floats per rank-part; returns nothing, fills b or a.
  void run(const std::string& op, size_t count) {
    float* x = a.data();
    float* y = b.data();
    int c = int(count);
    if (op == "all_reduce") {
      MPI_Allreduce(MPI_IN_PLACE, x, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "all_gather") {
      MPI_Allgather(x, c, MPI_FLOAT, y, c, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op == "reduce_scatter") {
      MPI_Reduce_scatter_block(x, y, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "broadcast") {
      MPI_Bcast(x, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else if (op == "sendrecv") {
      MPI_Sendrecv(x, c, MPI_FLOAT, (rank + 1) % n, 7, y, c, MPI_FLOAT, (rank + n - 1) % n, 7,
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }

  // Element counts: `count` is per part (all_gather input, reduce_scatter output).
  void fill(const std::string& op, size_t count) {
    size_t total = count;
    if (op == "reduce_scatter") total = count * size_t(n);
    for (size_t i = 0; i < total; ++i) a[i] = float((i * 7 + size_t(rank) * 13) % 101);
    std::fill(b.begin(), b.begin() + std::max(count * size_t(n), count), -1.0f);
  }

  long check(const std::string& op, size_t count) {
    long wrong = 0;
    auto v = [&](size_t i, int r) { return float((i * 7 + size_t(r) * 13) % 101); };
    if (op == "all_reduce") {
      for (size_t i = 0; i < count; ++i) {
        float s = 0;
        for (int r = 0; r < n; ++r) s += v(i, r);
        wrong += a[i] != s;
      }
    } else if (op == "all_gather") {
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) wrong += b[size_t(r) * count + i] != v(i, r);
    } else if (op == "reduce_scatter") {
      for (size_t i = 0; i < count; ++i) {
        float s = 0;
        for (int r = 0; r < n; ++r) s += v(size_t(rank) * count + i, r);
        wrong += b[i] != s;
      }
    } else if (op == "broadcast") {
      for (size_t i = 0; i < count; ++i) wrong += a[i] != v(i, 0);
    } else if (op == "sendrecv") {
      int src = (rank + n - 1) % n;
      for (size_t i = 0; i < count; ++i) wrong += b[i] != v(i, src);
    }
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return wrong;
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Options o = parse(argc, argv);
  Bench b;
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.n);
  size_t max_elems = o.max_bytes / sizeof(float) * size_t(b.n) + 16;
  b.a.assign(max_elems, 0.0f);
  b.b.assign(max_elems, 0.0f);
  if (b.rank == 0) {
    std::printf("# mpi_comm_bench: %d ranks, f32, %d batches after warm-up\n", b.n, o.reps);
    std::printf("%-15s %12s %12s %10s %10s %10s %9s %9s %7s\n", "op", "size(B)", "count",
                "time(us)", "min(us)", "max(us)", "algbw", "busbw", "#wrong");
  }
  for (const auto& op : o.ops) {
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      // size is the bytes per rank of the larger side, as nccl-tests reports it.
      size_t total = bytes / sizeof(float);
      size_t count = total;  // per-part count for all_gather / reduce_scatter
      const bool split = op == "all_gather" || op == "reduce_scatter";
      if (split) count = total / size_t(b.n);
      const size_t size = split ? count * size_t(b.n) * 4 : count * 4;
      // As `baton bench comm`: no row whose whole elements fall below --min-bytes.
      if (count == 0 || size < o.min_bytes) continue;
      b.fill(op, count);
      b.run(op, count);
      long wrong = b.check(op, count);
      int m = batch_iters(bytes);
      for (int i = 0; i < m; ++i) b.run(op, count);  // warm-up
      std::vector<double> times;
      for (int r = 0; r < o.reps; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < m; ++i) b.run(op, count);
        double t = (MPI_Wtime() - t0) / m;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times.push_back(t);
      }
      const baton::bench::Stats t = baton::bench::stats(times);
      const double med = t.median;
      double algbw = double(size) / med / 1e9;
      if (b.rank == 0)
        std::printf("%-15s %12zu %12zu %10.2f %10.2f %10.2f %9.3f %9.3f %7ld\n", op.c_str(), size,
                    size / 4, med * 1e6, t.min * 1e6, t.max * 1e6, algbw,
                    algbw * bus_factor(op, b.n), wrong);
    }
  }
  MPI_Finalize();
  return 0;
}
