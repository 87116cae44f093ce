// The consumer of the installed baton (tests/consumer/): generates and simulates a 1F1B
// schedule, runs an all-reduce on the local transport backend and a matrix product on
// the CPU kernels (oneDNN and OpenBLAS behind them: baton::baton's whole link interface),
// checking each against its closed form. Exits 1 on any mismatch.
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "kernels/ops.h"
#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/simulate.h"
#include "transport/local.h"

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what);
    ++failures;
  }
}

// 1F1B on p ranks and m micro-batches with F = 1 and BW = 2 per stage: every rank is busy
// 3m and the pipeline fills and drains in 3(p - 1), so the makespan is 3(m + p - 1).
void check_schedule() {
  const int p = 4, m = 8;
  const baton::schedule::Schedule s = baton::schedule::generate("1f1b", p, m);
  const auto r = baton::schedule::simulate(s, baton::schedule::Costs::uniform(p, 1.0, 1.0, 1.0));
  std::printf("consumer: 1f1b p=%d m=%d makespan %g, bubble %g\n", p, m, r.makespan, r.bubble);
  expect(r.makespan == 3.0 * (m + p - 1), "1f1b makespan is 3(m + p - 1)");
  expect(r.ranks.size() == size_t(p), "one RankStats per rank");
}

// Rank r contributes (r + 1) * (i + 1) at element i: the sum is n(n + 1)/2 * (i + 1).
void check_all_reduce() {
  const int n = 4;
  const int64_t len = 1000;
  auto world = baton::transport::make_local_world(n);
  std::vector<std::vector<float>> results(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<float> v(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) v[size_t(i)] = float((r + 1) * (i + 1));
        auto t = baton::memory::Tensor::from_vector(v, {len});
        world[size_t(r)]->all_reduce(t, baton::transport::ReduceOp::sum)->wait();
        results[size_t(r)] = t.to_vector<float>();
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (errors[size_t(r)]) std::rethrow_exception(errors[size_t(r)]);
    bool ok = results[size_t(r)].size() == size_t(len);
    for (int64_t i = 0; ok && i < len; ++i)
      ok = results[size_t(r)][size_t(i)] == float(n * (n + 1) / 2 * (i + 1));
    expect(ok, "all_reduce(sum) on the local backend");
  }
  std::printf("consumer: all_reduce of %lld floats on %d local ranks (%s backend)\n",
              static_cast<long long>(len), n, world[0]->backend().c_str());
}

// [[1 2 3] [4 5 6]] x [[7 8] [9 10] [11 12]] = [[58 64] [139 154]].
void check_matmul() {
  using baton::memory::Tensor;
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector(std::vector<float>{7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = Tensor::from_vector(std::vector<float>(4, 0.0f), {2, 2});
  baton::kernels::matmul(a, false, b, false, c);
  expect(c.to_vector<float>() == std::vector<float>{58, 64, 139, 154}, "matmul on the CPU kernels");
  std::printf("consumer: matmul 2x3 by 3x2 on the CPU kernels\n");
}

}  // namespace

int main() {
  try {
    check_schedule();
    check_all_reduce();
    check_matmul();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", e.what());
    return 1;
  }
  if (failures) return 1;
  std::printf("consumer: ok\n");
  return 0;
}
