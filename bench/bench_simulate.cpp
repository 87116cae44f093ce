// Simulator speed: generate, lower, validate, build (validate + index) and run the
// simulator for p = 128 ranks and m = 1024 micro-batches (and any p, m given), for
// several schedules. Prints median, min and max over repetitions after a warm-up.
//   bench_simulate [ranks=128] [micro-batches=1024] [repetitions=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

using namespace baton::schedule;

namespace {

struct Stats {
  double median, min, max;
};

// Runs f once to warm up, then `reps` times; milliseconds.
Stats measure(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

std::string cell(const Stats& s) {
  char b[64];
  std::snprintf(b, sizeof b, "%8.1f [%6.1f,%7.1f]", s.median, s.min, s.max);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int p = argc > 1 ? std::atoi(argv[1]) : 128;
  const int m = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  std::printf(
      "bench_simulate: p=%d m=%d, %d repetitions after one warm-up; milliseconds, median [min, "
      "max]\n",
      p, m, reps);
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
