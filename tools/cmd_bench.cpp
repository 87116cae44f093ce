// `baton bench <benchmark> [options]`: runs one of the registered benchmarks.
#include <cstdio>

#include "memory/error.h"
#include "tools/bench.h"
#include "tools/command.h"

namespace baton::tools {

namespace {
std::vector<Benchmark>& benchmark_table() {
  static std::vector<Benchmark> r;
  return r;
}

int run_bench(const std::vector<std::string>& args) {
  std::string usage =
      "usage: baton bench <benchmark> [options]   (baton bench <benchmark> --help)\n\n"
      "benchmarks:\n";
  std::vector<SubCommand> subs;
  for (const auto& b : benchmark_table()) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-12s %s\n", b.name.c_str(), b.summary.c_str());
    usage += line;
    subs.push_back({b.name, b.run});
  }
  return run_subcommand("bench", args, subs, usage);
}

const RegisterCommand register_bench{
    {"bench", "run a benchmark (baton bench --help lists them)", run_bench}};
}  // namespace

RegisterBenchmark::RegisterBenchmark(Benchmark b) {
  benchmark_table().push_back(std::move(b));
}
const std::vector<Benchmark>& benchmarks() {
  return benchmark_table();
}

}  // namespace baton::tools
