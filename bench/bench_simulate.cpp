// Simulator speed: generate, lower, validate, build (validate + index) and run the
// simulator for p = 128 ranks and m = 1024 micro-batches (and any p, m given), for
// several schedules. Prints median, min and max over repetitions after a warm-up.
//   bench_simulate [ranks=128] [micro-batches=1024] [repetitions=7] [--cpu-time]
// --cpu-time times by the process's CPU clock instead of the wall clock: the calls are
// single-threaded, so on a quiet machine the two agree, and on a shared one the CPU
// clock leaves out the time other processes held the cores.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/stats.h"
#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

using namespace baton::schedule;

namespace {

using baton::bench::Stats;

bool g_cpu_time = false;

double now_ms() {
  if (!g_cpu_time)
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

// Runs f once to warm up, then `reps` times; milliseconds.
Stats measure(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    f();
    ms.push_back(now_ms() - t0);
  }
  return baton::bench::stats(ms);
}

std::string cell(const Stats& s) {
  char b[64];
  std::snprintf(b, sizeof b, "%8.1f [%6.1f,%7.1f]", s.median, s.min, s.max);
  return b;
}

const char* const kUsage =
    "usage: bench_simulate [ranks=128] [micro-batches=1024] [repetitions=7] [--cpu-time]\n";

int run(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    // An unknown flag (--cpu-tme) had been read as a count of 0 or ignored.
    if (a == "--cpu-time")
      g_cpu_time = true;
    else if (a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])))
      throw baton::InputError("unknown option '" + a + "'\n" + kUsage);
    else
      args.push_back(a);
  }
  if (args.size() > 3)
    throw baton::InputError(
        "expected at most 3 numbers (ranks, micro-batches, repetitions), found " +
        std::to_string(args.size()) + "\n" + kUsage);
  using baton::bench::parse_int;
  const int p = args.size() > 0 ? parse_int("ranks", args[0], 1) : 128;
  const int m = args.size() > 1 ? parse_int("micro-batches", args[1], 1) : 1024;
  const int reps = args.size() > 2 ? parse_int("repetitions", args[2], 1) : 7;
  std::printf(
      "bench_simulate: p=%d m=%d, %d repetitions after one warm-up; %s milliseconds, median "
      "[min, max]\n",
      p, m, reps, g_cpu_time ? "CPU-time" : "wall-clock");
  std::printf(
      "costs: F=1, B=1.2, W=0.8 per rank share, 1 MiB messages over 10 GB/unit with 1e-5 "
      "latency\n");
  std::printf("end-to-end = generate + lower + build + one run (what `baton simulate` does)\n\n");
  std::printf("%-18s %9s %24s %24s %24s %24s %24s %10s\n", "schedule", "actions", "generate",
              "lower", "build", "run", "end-to-end", "ns/action");
  CostSpec spec = CostSpec::unit();
  spec.backward_input.values = {1.2};
  spec.backward_weight.values = {0.8};
  spec.message_bytes = {{1048576.0}, false, true};
  spec.activation_bytes = {{1e8}, false, true};
  spec.bandwidth = 1e10;
  spec.latency = 1e-5;
  for (const char* name : {"1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"}) {
    Schedule s;
    try {
      s = generate(name, p, m);
    } catch (const std::exception& e) {
      std::printf("%-18s not defined: %s\n", name, e.what());
      continue;
    }
    const Schedule lowered = lower(s);
    const Costs costs = resolve(spec, lowered);
    Stats gen = measure(reps, [&] { generate(name, p, m); });
    Stats low = measure(reps, [&] { lower(s); });
    Stats build = measure(reps, [&] { Simulator sim(lowered); });
    Simulator sim(lowered);
    double makespan = 0;
    Stats run = measure(reps, [&] { makespan = sim.run(costs).makespan; });
    Stats all = measure(reps, [&] {
      Simulator sm(lower(generate(name, p, m)));
      sm.run(costs);
    });
    std::printf("%-18s %9zu %24s %24s %24s %24s %24s %10.1f   (makespan %.1f)\n", name,
                lowered.num_actions(), cell(gen).c_str(), cell(low).c_str(), cell(build).c_str(),
                cell(run).c_str(), cell(all).c_str(),
                run.median * 1e6 / double(lowered.num_actions()), makespan);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return baton::bench::run_main("bench_simulate", [&] { return run(argc, argv); });
}
