// Planning speed: a GPT-2-style model with 10,000 blocks (and any count given) built in
// memory, planned for N devices under a memory limit. Prints median, min and max over
// repetitions after a warm-up, each repetition with a cold cost model (nothing cached).
//   bench_plan [blocks=10000] [devices=8] [repetitions=5]
// Rows: loading the model (shorthand expansion + graph with shape inference, not part of
// planning), the cost tables (per-layer costs and memory walks, one per distinct layer
// and degree), one exact cut, the whole search (every degree, micro-batch count,
// schedule and recompute choice: cost tables, cuts, memory, simulation), and the exact
// check of the best plan (`baton plan --check`: physical graph and stage walks).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/args.h"
#include "bench/stats.h"
#include "memory/units.h"
#include "partitioner/evaluate.h"
#include "partitioner/search.h"
#include "stages/model.h"
#include "stages/shorthands.h"

using namespace baton;
using namespace baton::partitioner;

namespace {

struct Stats {
  double median, min, max, cpu;  // wall milliseconds; cpu: the median's process CPU time
};

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec);
}

// Wall time and process CPU time (the planner is single-threaded, so on a loaded machine
// the CPU time is what a quiet one would take).
Stats measure(int reps, const std::function<void()>& f) {
  f();
  std::vector<std::pair<double, double>> ms;
  for (int i = 0; i < reps; ++i) {
    double c0 = cpu_ms();
    auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
         cpu_ms() - c0});
  }
  // By wall time; the cpu column is the median's own (the mean of the middle two's, as
  // baton::bench::stats takes the median of an even count).
  std::sort(ms.begin(), ms.end());
  std::vector<double> wall, cpu;
  for (const auto& [w, c] : ms) {
    wall.push_back(w);
    cpu.push_back(c);
  }
  return {baton::bench::median_of_sorted(wall), wall.front(), wall.back(),
          baton::bench::median_of_sorted(cpu)};
}

void row(const char* what, const Stats& s, const std::string& note) {
  std::printf("%-34s %10.1f %10.1f %10.1f %10.1f   %s\n", what, s.median, s.min, s.max, s.cpu,
              note.c_str());
}

const char* const kUsage =
    "usage: bench_plan [blocks=10000] [devices=8] [repetitions=5] [search [pause-seconds]]\n";

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    // atoi had read a flag as 0 blocks (an uncaught InputError from the model) and 0
    // repetitions had indexed an empty vector.
    if (a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])))
      throw InputError("unknown option '" + a + "'\n" + kUsage);
  }
  if (argc > 6) throw InputError("expected at most 5 arguments\n" + std::string(kUsage));
  using bench::parse_int;
  const int blocks = argc > 1 ? parse_int("blocks", argv[1], 1) : 10000;
  const int devices = argc > 2 ? parse_int("devices", argv[2], 1) : 8;
  const int reps = argc > 3 ? parse_int("repetitions", argv[3], 1) : 5;
  if (argc > 4 && std::string(argv[4]) != "search")
    throw InputError("fourth argument: expected 'search', found '" + std::string(argv[4]) + "'\n" +
                     kUsage);
  const bool only_search = argc > 4;  // for profiling
  const int pause = argc > 5 ? parse_int("pause-seconds", argv[5], 0) : 0;
  stages::Gpt2Config c;
  c.name = "gpt-" + std::to_string(blocks);
  c.n_layer = blocks;
  c.n_head = 8;
  c.n_embd = 512;
  c.n_positions = 256;
  c.vocab_size = 256;
  std::printf(
      "bench_plan: GPT %d blocks (n_embd 512, 8 heads, context 256, vocab 256), %d devices, "
      "%d repetitions after one warm-up; milliseconds\n",
      blocks, devices, reps);

  std::shared_ptr<const stages::Graph> g;
  Stats load = measure(std::max(1, reps / 2), [&] {
    g = std::make_shared<const stages::Graph>(stages::load_model_json(c.to_json(), c.name));
  });
  // Memory: half of what one device would need for the whole model with AdamW, so the
  // search must cut it.
  CostModel probe(g, Machine{});
  StageMemory whole = compose_stage_memory(probe.table(1, 1), 0, g->num_layers(), {}, 2);
  const int64_t capacity = whole.persistent() / 2 / devices * devices;
  SearchOptions o;
  o.devices = devices;
  o.global_batch = 64;
  o.device_memory = capacity;

  std::printf("%d layers, %.3g G parameters; device memory %s\n\n", g->num_layers(),
              double(g->num_parameters()) / 1e9, memory::format_bytes(double(capacity)).c_str());
  std::printf("%-34s %10s %10s %10s %10s\n", "step", "median", "min", "max", "cpu");
  row("load model (not planning)", load, "gpt2 shorthand -> graph");

  if (only_search) {
    spdlog::set_level(spdlog::level::debug);
    if (pause > 0) {  // a pause to attach a profiler after loading
      std::printf("loaded; searching in %d s\n", pause);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(pause));
    }
    CostModel m(g, Machine{});
    SearchResult r = search_plans(g, m, o);
    std::printf("search: %.1f ms, %d simulated, %d pruned\n", 1e3 * r.seconds, r.evaluated,
                r.pruned);
    std::fflush(stdout);
    std::_Exit(0);  // skip tearing the big graph down (profiling sees the search alone)
  }
  Stats tables = measure(reps, [&] {
    CostModel m(g, Machine{});
    for (int tp : {1, 2, 4, 8}) m.table(tp, 1);
  });
  row("cost tables, tp 1,2,4,8", tables, "cold: every distinct layer walked");

  CostModel warm(g, Machine{});
  LayerCosts lc = layer_costs(warm.table(1, 1), false, 2);
  auto prepared = std::make_shared<const PreparedCosts>(lc);
  CutResult cut;
  Stats cut_time = measure(reps, [&] {
    std::vector<CutStage> st(static_cast<size_t>(devices));
    for (int k = 0; k < devices; ++k)
      st[size_t(k)] = {0, capacity, {{devices - k, 0, 0}, {devices - k - 1, 0, 1}}, 0};
    cut = Cutter({prepared}, st).solve();
  });
  row("one exact cut, memory-bound", cut_time,
      std::to_string(devices) + " stages, " + (cut.feasible ? "feasible" : "infeasible"));

  // The degrees, schedule and micro-batches given (`baton plan --tp 2 --pp 4 ...`): the
  // cut, memory and simulation of each recompute choice.
  // TP 2 x PP 4 at 8 devices; at other counts the nearest degrees that divide them (a
  // fixed 2 x 4 had refused any count but a multiple of 8).
  SearchOptions fixed = o;
  fixed.tp = devices % 2 == 0 ? 2 : 1;
  fixed.pp = 1;
  for (int pp : {4, 2})
    if (fixed.pp == 1 && (devices / fixed.tp) % pp == 0) fixed.pp = pp;
  fixed.schedules = {"zb-h1"};
  fixed.micro_batches = 16;
  SearchResult fixed_res;
  Stats fixed_time = measure(reps, [&] {
    CostModel m(g, Machine{});
    fixed_res = search_plans(g, m, fixed);
  });
  row("plan, degrees given (cold)", fixed_time,
      fixed_res.ranked.empty() ? std::string("nothing fits") : fixed_res.ranked.front().describe());

  SearchResult res;
  // Cold: a new cost model each time (the per-layer structure, tables and walks too).
  Stats search = measure(reps, [&] {
    CostModel m(g, Machine{});
    res = search_plans(g, m, o);
  });
  row("search (cold, incl. cost model)", search,
      std::to_string(res.evaluated) + " candidates simulated, " + std::to_string(res.pruned) +
          " pruned by bound, " + std::to_string(res.exact_checks) + " checked exactly");
  if (res.ranked.empty()) {
    std::printf("nothing fits\n");
    return 1;
  }
  const Candidate& best = res.ranked.front();
  Stats check = measure(std::max(1, reps / 2), [&] {
    ResolvedPlan r = resolve_plan(best.plan, g);
    PlanEstimate e = evaluate_plan(r, warm);
    if (!e.fits()) std::printf("exact check: does not fit\n");
  });
  row("check best plan (exact memory)", check, best.describe());
  std::printf("\nplan = search: %.0f ms median wall (%.0f ms CPU) for %d layers on %d devices\n",
              search.median, search.cpu, g->num_layers(), devices);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("bench_plan", [&] { return run(argc, argv); });
}
