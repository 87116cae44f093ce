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

void print_benchmarks() {
  std::printf(
      "usage: baton bench <benchmark> [options]   (baton bench <benchmark> "
      "--help)\n\nbenchmarks:\n");
  for (const auto& b : benchmark_table())
    std::printf("  %-12s %s\n", b.name.c_str(), b.summary.c_str());
}

int run_bench(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    print_benchmarks();
    return args.empty() ? 2 : 0;
  }
  for (const auto& b : benchmark_table())
    if (b.name == args[0]) return b.run({args.begin() + 1, args.end()});
  throw InputError("unknown benchmark '" + args[0] + "' (baton bench --help lists them)");
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
