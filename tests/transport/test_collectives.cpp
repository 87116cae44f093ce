// Every collective against a serial reference, for world sizes 1 to 8, sizes from zero
// elements to several MiB (counts that do not divide by the world size), every dtype,
// on both backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "memory/tensor.h"
#include "tests/transport/world_harness.h"
#include "transport/detail/collectives.h"

namespace baton::transport::testing {
namespace {

using memory::DType;

#if defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

constexpr uint32_t kSeed = 12345;

Tensor make_input(int rank, int64_t n, DType dt, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = test_value(rank, i + offset, kSeed);
  return Tensor::from_vector(v, {n}).to(dt);
}

// The reference for one element: sum / avg / max over ranks, rounded as the dtype does.
double reference(int nranks, int64_t i, ReduceOp op, DType dt) {
  double acc = op == ReduceOp::max ? -1e300 : 0.0;
  for (int r = 0; r < nranks; ++r) {
    double x = test_value(r, i, kSeed);
    acc = op == ReduceOp::max ? std::max(acc, x) : acc + x;
  }
  if (op != ReduceOp::avg) return acc;
  switch (dt) {
    case DType::f64:
      return acc / nranks;
    case DType::i32:
    case DType::i64: {
      const int64_t truncated = int64_t(acc) / nranks;  // the integer average truncates
      return double(truncated);
    }
    case DType::f32:
      return double(float(acc) / float(nranks));
    case DType::bf16:
      return memory::bf16_to_float(memory::float_to_bf16(float(acc) / float(nranks)));
    case DType::f16:
      return memory::f16_to_float(memory::float_to_f16(float(acc) / float(nranks)));
  }
  return acc;
}

// Compares a tensor against expected(i) and reports the first difference.
template <class F>
void expect_values(const Tensor& t, F&& expected, const std::string& what) {
  auto got = t.to(DType::f64).to_vector<double>();
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = expected(int64_t(i));
    if (got[i] != e) {
      if (wrong == 0)
        ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << e;
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << what;
}

std::string trace(const Communicator& c, const char* op, int64_t n, DType dt) {
  return std::string(op) + " rank " + std::to_string(c.rank()) + "/" + std::to_string(c.size()) +
         " count " + std::to_string(n) + " " + std::string(memory::dtype_name(dt));
}

void check_all_reduce(Communicator& c, int64_t n, DType dt, ReduceOp op) {
  Tensor t = make_input(c.rank(), n, dt);
  c.all_reduce(t, op)->wait();
  expect_values(
      t, [&](int64_t i) { return reference(c.size(), i, op, dt); },
      trace(c,
            op == ReduceOp::sum   ? "all_reduce sum"
            : op == ReduceOp::avg ? "all_reduce avg"
                                  : "all_reduce max",
            n, dt));
}

// Uneven parts: rank r gets base + (r % 3), some parts empty when base is 0.
std::vector<int64_t> uneven(int size, int64_t base) {
  std::vector<int64_t> c;
  for (int r = 0; r < size; ++r) c.push_back(base + (r % 3) - (base > 0 && r == 1 ? 1 : 0));
  return c;
}

int64_t sum_of(const std::vector<int64_t>& c, int upto) {
  int64_t s = 0;
  for (int r = 0; r < upto; ++r) s += c[size_t(r)];
  return s;
}

// Element i of the concatenation of every rank's input part.
auto gathered(const std::vector<int64_t>& counts) {
  std::vector<int64_t> start{0};
  for (int64_t c : counts) start.push_back(start.back() + c);
  return [start](int64_t i) {
    int q = int(std::upper_bound(start.begin(), start.end(), i) - start.begin()) - 1;
    while (start[size_t(q) + 1] == start[size_t(q)]) ++q;  // skip empty parts
    return test_value(q, i - start[size_t(q)], kSeed);
  };
}

void check_all_gather(Communicator& c, const std::vector<int64_t>& counts, DType dt,
                      bool pass_counts) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  Tensor in = make_input(r, counts[size_t(r)], dt);
  Tensor out = Tensor::full({total}, -99, dt);
  c.all_gather(in, out, pass_counts ? std::span<const int64_t>(counts) : std::span<const int64_t>())
      ->wait();
  expect_values(out, gathered(counts), trace(c, "all_gather", total, dt));
}

void check_reduce_scatter(Communicator& c, const std::vector<int64_t>& counts, DType dt,
                          ReduceOp op, bool pass_counts) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  Tensor in = make_input(r, total, dt);
  Tensor out = Tensor::full({counts[size_t(r)]}, -99, dt);
  c.reduce_scatter(in, out, op,
                   pass_counts ? std::span<const int64_t>(counts) : std::span<const int64_t>())
      ->wait();
  int64_t base = sum_of(counts, r);
  expect_values(
      out, [&](int64_t i) { return reference(c.size(), base + i, op, dt); },
      trace(c, "reduce_scatter", total, dt));
}

// In place: the output is a view of this rank's own part of the input.
void check_reduce_scatter_in_place(Communicator& c, const std::vector<int64_t>& counts, DType dt,
                                   ReduceOp op) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  int64_t base = sum_of(counts, r);
  Tensor in = make_input(r, total, dt);
  Tensor out = in.narrow(0, base, counts[size_t(r)]);
  c.reduce_scatter(in, out, op, counts)->wait();
  expect_values(
      out, [&](int64_t i) { return reference(c.size(), base + i, op, dt); },
      trace(c, "reduce_scatter in place", total, dt));
}

// In place: the input is a view of this rank's own part of the output.
void check_all_gather_in_place(Communicator& c, const std::vector<int64_t>& counts, DType dt) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  Tensor out = Tensor::full({total}, -99, dt);
  Tensor in = out.narrow(0, sum_of(counts, r), counts[size_t(r)]);
  in.copy_from(make_input(r, counts[size_t(r)], dt));
  c.all_gather(in, out, counts)->wait();
  expect_values(out, gathered(counts), trace(c, "all_gather in place", total, dt));
}

void check_broadcast(Communicator& c, int64_t n, DType dt, int root) {
  Tensor t = c.rank() == root ? make_input(root, n, dt) : Tensor::full({n}, -99, dt);
  c.broadcast(t, root)->wait();
  expect_values(
      t, [&](int64_t i) { return test_value(root, i, kSeed); }, trace(c, "broadcast", n, dt));
}

[[maybe_unused]] void check_scatter(Communicator& c, const std::vector<int64_t>& counts, DType dt,
                                    int root) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  Tensor in = r == root ? make_input(root, total, dt) : Tensor();
  Tensor out = Tensor::full({counts[size_t(r)]}, -99, dt);
  c.scatter(in, out, root, counts)->wait();
  int64_t base = sum_of(counts, r);
  expect_values(
      out, [&](int64_t i) { return test_value(root, base + i, kSeed); },
      trace(c, "scatter", total, dt));
}

[[maybe_unused]] void check_gather(Communicator& c, const std::vector<int64_t>& counts, DType dt,
                                   int root) {
  const int r = c.rank();
  int64_t total = sum_of(counts, c.size());
  Tensor in = make_input(r, counts[size_t(r)], dt);
  Tensor out = r == root ? Tensor::full({total}, -99, dt) : Tensor();
  c.gather(in, out, root, counts)->wait();
  if (r != root) return;
  expect_values(out, gathered(counts), trace(c, "gather", total, dt));
}

// Sizes in elements: empty, tiny, below and above the small-message threshold, and
// several ring chunks; none divides by most world sizes.
[[maybe_unused]] std::vector<int64_t> grid_sizes() {
  if (kSanitized) return {0, 1, 7, 1001, 16411, 70001};
  return {0, 1, 7, 1001, 16411, 262147, 1048579};
}

#ifndef BATON_TEST_BIG
class Collectives : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(Collectives, EveryOpEverySize) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  run_world(backend, n, [&](Communicator& c) {
    for (int64_t count : grid_sizes()) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
        check_all_reduce(c, count, DType::f32, op);
      int root = int(count % n);
      check_broadcast(c, count, DType::f32, root);
      // Equal parts when the count divides, then uneven parts with explicit counts.
      int64_t per = count / n;
      std::vector<int64_t> equal(static_cast<size_t>(n), per);
      check_all_gather(c, equal, DType::f32, false);
      check_reduce_scatter(c, equal, DType::f32, ReduceOp::sum, false);
      auto parts = uneven(n, per);
      check_all_gather(c, parts, DType::f32, true);
      check_reduce_scatter(c, parts, DType::f32, ReduceOp::sum, true);
      check_reduce_scatter(c, parts, DType::f32, ReduceOp::avg, true);
      check_reduce_scatter_in_place(c, parts, DType::f32, ReduceOp::sum);
      check_all_gather_in_place(c, parts, DType::f32);
      check_scatter(c, parts, DType::f32, root);
      check_gather(c, parts, DType::f32, (root + 1) % n);
      c.barrier()->wait();
    }
  });
}

TEST_P(Collectives, EveryDtype) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  run_world(backend, n, [&](Communicator& c) {
    for (DType dt : {DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      for (int64_t count : {int64_t(5), int64_t(40003)}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
          check_all_reduce(c, count, dt, op);
        auto parts = uneven(n, count / n);
        check_reduce_scatter(c, parts, dt, ReduceOp::avg, true);
        check_all_gather(c, parts, dt, true);
        check_broadcast(c, count, dt, n - 1);
      }
    }
  });
}

// Collectives issued back to back without waiting in between complete in order and
// never take each other's messages.
TEST_P(Collectives, ManyInFlight) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  run_world(backend, n, [&](Communicator& c) {
    std::vector<Tensor> ts;
    std::vector<WorkPtr> ws;
    for (int k = 0; k < 24; ++k) {
      int64_t count = (k % 3 == 0) ? 100000 + k : 10 + k;
      ts.push_back(make_input(c.rank(), count, DType::f32));
      ws.push_back(c.all_reduce(ts.back(), ReduceOp::sum));
    }
    for (int k = 23; k >= 0; --k) ws[size_t(k)]->wait();
    for (size_t k = 0; k < ts.size(); ++k)
      expect_values(
          ts[k], [&](int64_t i) { return reference(c.size(), i, ReduceOp::sum, DType::f32); },
          "in-flight all_reduce " + std::to_string(k));
  });
}

// Ranks that name different roots all fail, each naming both roots, and the communicator
// stays broken: no message of the disagreement is left over for a later collective to
// match (the tag's sequence number wraps every 255 collectives; a stale small broadcast
// had been taken by the 255th after it, and every later one was one behind).
TEST_P(Collectives, MismatchedRootsFailOnEveryRank) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  if (n == 1) GTEST_SKIP() << "one rank has only one root";
  for (std::string op : {"broadcast", "scatter", "gather"}) {
    for (int64_t count : {int64_t(10), int64_t(262147)}) {  // below and above the threshold
      for (bool each_itself : {true, false}) {              // else rank 0 names 0, the others 1
        std::atomic<int> failed{0};
        // The buffers are made once per rank: the failing calls below should take no time.
        auto call = [&](Communicator& c, int root, Tensor& mine, Tensor& all) {
          Tensor none;
          Tensor& many = c.rank() == root ? all : none;
          if (op == "broadcast")
            c.broadcast(mine, root)->wait();
          else if (op == "scatter")
            c.scatter(many, mine, root)->wait();
          else
            c.gather(mine, many, root)->wait();
        };
        const std::string want =
            op + ": the ranks disagree on the root: rank 0 names root 0, rank " +
            std::to_string(n - 1) + " names root " + std::to_string(each_itself ? n - 1 : 1);
        const std::string what = op + " of " + std::to_string(count) + " elements";
        run_world(
            backend, n,
            [&](Communicator& c) {
              const int r = c.rank();
              Tensor mine = Tensor::full({count}, r + 1), all = Tensor::zeros({count * n});
              try {
                call(c, each_itself ? r : (r == 0 ? 0 : 1), mine, all);
                ADD_FAILURE() << what << ": rank " << r << " finished with a mismatched root";
              } catch (const RuntimeError& e) {
                EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
                    << what << ": " << e.what();
                ++failed;
              }
              // Past the sequence number's wrap: every later call fails the same way.
              for (int k = 0; k < 300; ++k) {
                try {
                  call(c, 1, mine, all);
                  ADD_FAILURE() << what << ": call " << k << " after the mismatch finished";
                  break;
                } catch (const RuntimeError& e) {
                  if (std::string(e.what()).find(want) == std::string::npos) {
                    ADD_FAILURE() << what << ": call " << k << ": " << e.what();
                    break;
                  }
                }
              }
            },
            test_options(), /*leave_together=*/false);  // a broken world cannot meet again
        EXPECT_EQ(failed.load(), n) << what;
      }
    }
  }
}

#endif  // BATON_TEST_BIG

#if !defined(BATON_TEST_BIG) && !defined(BATON_TEST_UCX)
// BATON_SMALL_BYTES, BATON_RING_CHUNK and BATON_RING_WINDOW take whole numbers only: a
// sign, a blank or a suffix is bad input, as is 0 or a value past the limit (strtoull
// had read "-1" as 2^64 - 1).
TEST(AlgoTuning, BadValuesAreInputErrors) {
  for (const char* name : {"BATON_SMALL_BYTES", "BATON_RING_CHUNK", "BATON_RING_WINDOW"}) {
    for (const char* bad : {"-1", "0", "abc", " 5", "+5", "5k", "99999999999999999999999"}) {
      setenv(name, bad, 1);
      try {
        detail::AlgoTuning::from_env();
        ADD_FAILURE() << name << "=" << bad << " was accepted";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(name) + "='" + bad + "'"),
                  std::string::npos)
            << e.what();
      }
    }
    setenv(name, "4096", 1);
    EXPECT_NO_THROW(detail::AlgoTuning::from_env()) << name;
    unsetenv(name);
  }
  setenv("BATON_RING_WINDOW", "65537", 1);  // would not fit the window's int
  EXPECT_THROW(detail::AlgoTuning::from_env(), InputError);
  unsetenv("BATON_RING_WINDOW");
}
#endif

std::string name_of(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return backend_name(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param));
}

#ifdef BATON_TEST_BIG
// Large messages, counts that divide by no world size, 2 to 8 ranks: 64 MiB (the
// nccl-tests size) at 2 ranks, 16 MiB at more (still many 512 KiB ring chunks per rank's
// block; 64 MiB at 8 threads on 2 cores took 19 s). Their own program, labelled slow.
class BigMessages : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(BigMessages, SixteenToSixtyFourMiB) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  const int64_t count = (int64_t(n == 2 ? 64 : 16) << 20) / 4 + 3;
  run_world(backend, n, [&](Communicator& c) {
    check_all_reduce(c, count, DType::f32, ReduceOp::sum);
    check_all_reduce(c, count, DType::f32, ReduceOp::avg);
    check_broadcast(c, count, DType::f32, n - 1);
    auto parts = uneven(n, count / n);
    check_all_gather(c, parts, DType::f32, true);
    check_reduce_scatter(c, parts, DType::f32, ReduceOp::sum, true);
    check_reduce_scatter_in_place(c, parts, DType::f32, ReduceOp::sum);
    check_all_gather_in_place(c, parts, DType::f32);
    c.barrier()->wait();
  });
}
#endif

// One source, three programs: the local backend's (also run under ThreadSanitizer),
// UCX's (ranks as threads, each with its own UCX worker), and the 64 MiB messages.
#if defined(BATON_TEST_BIG)
INSTANTIATE_TEST_SUITE_P(Local, BigMessages,
                         ::testing::Combine(::testing::Values(Backend::local),
                                            ::testing::Values(2, 3, 5, 8)),
                         name_of);
INSTANTIATE_TEST_SUITE_P(Ucx, BigMessages,
                         ::testing::Combine(::testing::Values(Backend::ucx),
                                            ::testing::Values(2, 3)),
                         name_of);
#elif defined(BATON_TEST_UCX)
INSTANTIATE_TEST_SUITE_P(Ucx, Collectives,
                         ::testing::Combine(::testing::Values(Backend::ucx),
                                            ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8)),
                         name_of);
#else
INSTANTIATE_TEST_SUITE_P(Local, Collectives,
                         ::testing::Combine(::testing::Values(Backend::local),
                                            ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8)),
                         name_of);
#endif

}  // namespace
}  // namespace baton::transport::testing
