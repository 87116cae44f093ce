// Compiled without -march (tools/CMakeLists.txt), so this runs on any x86-64 CPU.
#include "tools/cpu_check.h"

#include <sstream>

#include "memory/error.h"

namespace baton::tools {

namespace {

// "avx2 fma avx512f ...": the kernels' -march, expanded by CMake (kernels/CMakeLists.txt).
#ifndef BATON_ARCH_FEATURES
#define BATON_ARCH_FEATURES ""
#endif
#ifndef BATON_ARCH
#define BATON_ARCH ""
#endif

bool cpu_has(const std::string& name) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  // __builtin_cpu_supports takes a literal: the names both GCC 12 and clang 14 know. A
  // build feature outside this list is not checked.
  struct Known {
    const char* name;
    bool present;
  };
  const Known known[] = {
      {"avx", __builtin_cpu_supports("avx") != 0},
      {"avx2", __builtin_cpu_supports("avx2") != 0},
      {"fma", __builtin_cpu_supports("fma") != 0},
      {"bmi", __builtin_cpu_supports("bmi") != 0},
      {"bmi2", __builtin_cpu_supports("bmi2") != 0},
      {"popcnt", __builtin_cpu_supports("popcnt") != 0},
      {"sse4.2", __builtin_cpu_supports("sse4.2") != 0},
      {"avx512f", __builtin_cpu_supports("avx512f") != 0},
      {"avx512bw", __builtin_cpu_supports("avx512bw") != 0},
      {"avx512dq", __builtin_cpu_supports("avx512dq") != 0},
      {"avx512vl", __builtin_cpu_supports("avx512vl") != 0},
      {"avx512cd", __builtin_cpu_supports("avx512cd") != 0},
      {"avx512vnni", __builtin_cpu_supports("avx512vnni") != 0},
      {"avx512bf16", __builtin_cpu_supports("avx512bf16") != 0},
      {"avx512vbmi", __builtin_cpu_supports("avx512vbmi") != 0},
      {"avx512vbmi2", __builtin_cpu_supports("avx512vbmi2") != 0},
      {"avx512ifma", __builtin_cpu_supports("avx512ifma") != 0},
      {"avx512bitalg", __builtin_cpu_supports("avx512bitalg") != 0},
      {"avx512vpopcntdq", __builtin_cpu_supports("avx512vpopcntdq") != 0},
      {"gfni", __builtin_cpu_supports("gfni") != 0},
      {"vpclmulqdq", __builtin_cpu_supports("vpclmulqdq") != 0},
  };
  for (const Known& k : known)
    if (name == k.name) return k.present;
#else
  (void)name;
#endif
  return true;
}

}  // namespace

std::vector<std::string> missing_cpu_features() {
  std::vector<std::string> missing;
  std::istringstream in(BATON_ARCH_FEATURES);
  for (std::string f; in >> f;)
    if (!cpu_has(f)) missing.push_back(f);
  return missing;
}

void require_cpu_features() {
  const std::vector<std::string> missing = missing_cpu_features();
  if (missing.empty()) return;
  std::string names;
  for (const auto& f : missing) names += (names.empty() ? "" : " ") + f;
  throw RuntimeError(std::string("this build's CPU kernels were compiled with -march=") +
                     BATON_ARCH + ", and this CPU lacks " + names +
                     "; rebuild on this machine, or with -DBATON_ARCH=x86-64-v3 (any AVX2 "
                     "CPU) for binaries and packages run on other machines");
}

}  // namespace baton::tools
