// The process-wide thread count shared by OpenBLAS and the CPU kernels' loops, and a
// one-time check of the OpenBLAS kernels in use.
#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {

namespace {
std::atomic<int> g_threads{0};  // 0: not set yet
}

int thread_count() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  n = std::max(1, std::min(omp_get_max_threads(), omp_get_num_procs()));
  int expected = 0;
  g_threads.compare_exchange_strong(expected, n);
  return g_threads.load();
}

void set_thread_count(int n) {
  g_threads.store(n);
  omp_set_num_threads(n);
  // OpenBLAS keeps its own count: the OpenMP build reads omp_get_max_threads() on each
  // call only while that count is above one, so set both.
  openblas_set_num_threads(n);
}

int& lone_task_depth() {
  thread_local int depth = 0;
  return depth;
}

void sync_blas_threads() {
  const int n = lone_task_depth() > 0 ? 1 : thread_count();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  static std::once_flag checked;
  std::call_once(checked, check_blas_core);
}

namespace {

// OpenBLAS 0.3.21 does not recognise some recent CPUs and falls back to its SSE3
// ("Prescott") kernels: sgemm then runs 2-4x below what the CPU can do. Returns the core
// type it should use instead, or nullptr when its choice is fine.
const char* better_blas_core() {
#if defined(__x86_64__)
  const std::string_view core = openblas_get_corename();
  const bool old_core = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                        core == "Dunnington" || core == "Nehalem" || core == "Atom";
  if (!old_core) return nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

}  // namespace

void configure_cpu_runtime(char** argv, bool computes) {
  // BATON_REEXEC marks the re-executed process (no loop; unset so that the programs it
  // starts check for themselves). What the user set stands.
  if (std::getenv("BATON_REEXEC") != nullptr) {
    unsetenv("BATON_REEXEC");
    // The kernel named it after the executed file: the name it was started under again
    // (a link, `baton-dev`), which pgrep and killall look for.
    if (argv[0] != nullptr) prctl(PR_SET_NAME, std::filesystem::path(argv[0]).filename().c_str());
    return;
  }
  std::vector<const char*> set;
  if (const char* core = better_blas_core();
      core != nullptr && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    set.push_back("OPENBLAS_CORETYPE");
  }
  // libgomp's threads spin 300,000 rounds after each parallel region before they sleep;
  // with other processes on the cores, a spinning thread holds a core that its partner,
  // or the next region's work, needs. 3,000 rounds still catch back-to-back regions: config
  // A's two-thread step on 2 cores, quiet, 113-126 ms at 300,000, 1,000, 3,000 and 10,000
  // alike; beside two busy loops 406-1045 ms at 300,000, 252-328 at the others (passive,
  // no spinning: 141 quiet, 312-326 loaded). docs/kernels.md, "Threads".
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    setenv("GOMP_SPINCOUNT", "3000", 1);
    set.push_back("GOMP_SPINCOUNT");
  }
  // A process that runs no kernel (a launcher, --help) only passes them on to the programs
  // it starts: the re-execution cost it about 25 ms of loading the libraries again.
  if (set.empty() || !computes) return;
  setenv("BATON_REEXEC", "1", 1);
  // The file's own path, not /proc/self/exe, which would name the process "exe".
  std::array<char, 4096> path{};
  if (const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
      n > 0 && size_t(n) < path.size() - 1)
    execv(path.data(), argv);
  // exec failed: carry on as loaded (check_blas_core() warns about slow kernels).
  for (const char* name : set) unsetenv(name);
  unsetenv("BATON_REEXEC");
}

void check_blas_core() {
#if defined(__x86_64__)
  const std::string_view core = openblas_get_corename();
  const bool old_core = better_blas_core() != nullptr;
  if (old_core)
    spdlog::warn(
        "OpenBLAS runs its {} kernels on a CPU with {}; GEMMs are several times slower than "
        "they could be. Set OPENBLAS_CORETYPE={} before starting baton.",
        core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
        __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
#endif
}

}  // namespace baton::kernels::cpu
