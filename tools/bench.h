// `baton bench <name>`: benchmarks register here, so that other areas can add theirs
// (baton bench comm, ...) without touching the dispatcher.
#pragma once

#include <string>
#include <vector>

namespace baton::tools {

struct Benchmark {
  std::string name;
  std::string summary;
  int (*run)(const std::vector<std::string>& args);  // args after the benchmark's name
};

struct RegisterBenchmark {
  explicit RegisterBenchmark(Benchmark b);
};

const std::vector<Benchmark>& benchmarks();

}  // namespace baton::tools
