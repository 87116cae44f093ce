// The process-wide thread count shared by OpenBLAS and the CPU kernels' loops.
#include <cblas.h>
#include <omp.h>

#include <atomic>

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
}

}  // namespace baton::kernels::cpu
