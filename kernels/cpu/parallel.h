// The CPU backend's threads: one OpenMP pool per process (shared with OpenBLAS, which is
// linked in its OpenMP build) sized by kernels::set_num_threads, and parallel_for over
// index ranges that only forks when the work pays for it.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace baton::kernels::cpu {

// Elements per thread below which an elementwise loop stays on one thread: a fork costs
// a few microseconds, about what one thread streams through 32K floats.
constexpr int64_t kElementwiseGrain = 1 << 15;

// The grain, in rows, of a row-wise loop whose rows cost `row_cost` element-steps each
// (heavier elements, such as an exp, count several): rows enough for kElementwiseGrain
// steps per thread, and at least `min_rows`.
inline int64_t row_grain(int64_t row_cost, int64_t min_rows = 1) {
  return std::max<int64_t>(min_rows, kElementwiseGrain / std::max<int64_t>(row_cost, 1));
}

// The process-wide thread count (kernels::num_threads()). Until set_thread_count is
// called it is OpenMP's default (OMP_NUM_THREADS, else the number of cores).
int thread_count();
// Sets it for OpenMP and OpenBLAS; n < 1 is an error the caller checks.
void set_thread_count(int n);

// Makes the calling thread's OpenMP setting (which OpenBLAS reads) match thread_count(),
// or 1 inside a LoneTask: omp_set_num_threads is per thread, and kernels may be called
// from any thread. Also runs check_blas_core() once per process.
void sync_blas_threads();

// The calling thread runs a task of parallel_tasks alone (one task, several threads): the
// GEMMs in it run on one thread, as they do in a task inside a parallel region. Their bits
// had depended on the thread count there (oneDNN splits some products' sums among its
// threads: the generic attention backward with one (batch, head) pair).
int& lone_task_depth();
struct LoneTask {
  LoneTask() : outer(omp_get_max_threads()) { ++lone_task_depth(); }
  ~LoneTask() {
    --lone_task_depth();
    omp_set_num_threads(outer);
  }
  LoneTask(const LoneTask&) = delete;
  LoneTask& operator=(const LoneTask&) = delete;
  int outer;
};

// Logs a warning when OpenBLAS picked kernels far below the CPU's instruction set.
void check_blas_core();
void configure_cpu_runtime(char** argv, bool computes);

// Calls f(begin, end) over [0, n) split into equal contiguous parts, one per thread, on
// at most thread_count() threads and only when every thread gets at least `grain`
// indices. Runs inline (one call) when nested inside another parallel region.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int64_t want = std::min<int64_t>(thread_count(), n / std::max<int64_t>(grain, 1));
  if (want <= 1 || omp_in_parallel()) {
    f(int64_t(0), n);
    return;
  }
  const int nt = int(want);
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
    const int64_t b = n * t / p, e = n * (t + 1) / p;
    if (b < e) f(b, e);
  }
}

// parallel_for for an elementwise loop with a vector body of `width` elements and a
// scalar tail: every part but the last starts and ends on a multiple of `width`, so only
// the last n mod width elements take the tail, on any number of threads. The tail's
// arithmetic may differ from the vector's in the last bit (GELU's and SiLU's reciprocal:
// a division against rcp14 and a Newton step), and with parts of n / threads elements
// which elements took it depended on the thread count.
template <class F>
void parallel_for_vectors(int64_t n, int64_t grain, int64_t width, F&& f) {
  const int64_t vectors = (n + width - 1) / width;
  parallel_for(vectors, std::max<int64_t>(grain / width, 1),
               [&](int64_t b, int64_t e) { f(b * width, std::min(e * width, n)); });
}

// Calls f(i) for every task i in [0, n) with dynamic scheduling (tasks of uneven cost),
// on up to thread_count() threads; inline when nested or single threaded.
template <class F>
void parallel_tasks(int64_t n, F&& f) {
  if (n <= 0) return;
  const int nt = int(std::min<int64_t>(thread_count(), n));
  if (n == 1 && thread_count() > 1 && !omp_in_parallel()) {
    LoneTask alone;
    f(0);
    return;
  }
  if (nt <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace baton::kernels::cpu
