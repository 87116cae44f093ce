// The process-wide thread count shared by OpenBLAS and the CPU kernels' loops, and a
// one-time check of the OpenBLAS kernels in use.
#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>

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

void sync_blas_threads() {
  const int n = thread_count();
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

void select_blas_kernels(char** argv) {
  // The user's choice stands; BATON_BLAS_REEXEC marks the re-executed process (no loop).
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("BATON_BLAS_REEXEC") != nullptr)
    return;
  const char* core = better_blas_core();
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  setenv("BATON_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the slow kernels; check_blas_core() warns.
  unsetenv("OPENBLAS_CORETYPE");
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
