// Median, min and max of timed repetitions, one definition for the benchmarks (and `baton
// bench comm`, mpi_comm_bench): the median of an even count is the mean of the middle two,
// as the bench/*.sh scripts take it (the upper one had made the median of 2 the max).
// Header-only and without baton's libraries, so mpi_comm_bench can include it.
#pragma once

#include <algorithm>
#include <vector>

namespace baton::bench {

struct Stats {
  double median = 0, min = 0, max = 0;
};

// `v` sorted and not empty (the callers time at least one repetition).
inline double median_of_sorted(const std::vector<double>& v) {
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Of `v` in any order, not empty.
inline Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {median_of_sorted(v), v.front(), v.back()};
}

}  // namespace baton::bench
