// The pipeline cut against brute force on random small problems: same feasibility, same
// bottleneck; every stage non-empty, within its capacity, on allowed cuts and fixed counts.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "partitioner/cut.h"

namespace baton::partitioner {
namespace {

struct Problem {
  std::vector<LayerCosts> costs;
  std::vector<CutStage> stages;
  std::vector<bool> allowed;
};

Problem random_problem(std::mt19937_64& rng, int L, int K) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Problem p;
  int classes = int(uni(1, 2));
  for (int c = 0; c < classes; ++c) {
    LayerCosts lc;
    lc.optimizer_states = int(uni(0, 2));
    for (int l = 0; l < L; ++l) {
      // Heavy first and last layers sometimes, like an embedding and an LM head.
      int64_t scale = (l == 0 || l == L - 1) && uni(0, 1) ? 5 : 1;
      lc.time.push_back(uni(0, 20) * scale);
      MicroBatchMemory m;
      m.stash = uni(0, 50);
      m.w_stash = uni(0, 60);
      m.forward_peak = m.stash + uni(0, 30);
      m.backward_peak = m.stash + uni(0, 40);
      m.weight_peak = m.w_stash;
      lc.mem.push_back(m);
      lc.own_bytes.push_back(uni(0, 100));
    }
    if (uni(0, 1)) lc.shared.push_back({uni(1, 30), {0, L - 1}});  // a tied parameter
    p.costs.push_back(lc);
  }
  for (int k = 0; k < K; ++k) {
    CutStage s;
    s.costs = int(uni(0, classes - 1));
    s.capacity = uni(0, 2) == 0 ? 0 : uni(150, 900);
    int terms = int(uni(1, 3));
    for (int t = 0; t < terms; ++t)
      s.terms.push_back({int(uni(0, K - k)), int(uni(0, 2)), int(uni(0, 2))});
    p.stages.push_back(s);
  }
  if (uni(0, 3) == 0) p.stages[size_t(uni(0, K - 1))].fixed_layers = int(uni(1, L - K + 1));
  p.allowed.assign(size_t(L + 1), true);
  for (int c = 1; c < L; ++c)
    if (uni(0, 5) == 0) p.allowed[size_t(c)] = false;
  return p;
}

// Every composition of L layers into K non-empty stages.
void brute_force(const Cutter& cut, const Problem& p, bool& feasible, int64_t& best) {
  const int L = cut.layers(), K = cut.stages();
  feasible = false;
  best = INT64_MAX;
  std::vector<int> b(size_t(K + 1), 0);
  b[size_t(K)] = L;
  std::function<void(int)> rec = [&](int k) {
    if (k == K) {
      int64_t worst = 0;
      for (int s = 0; s < K; ++s) {
        int i = b[size_t(s)], j = b[size_t(s + 1)];
        if (!cut.fits_memory(s, i, j)) return;
        if (p.stages[size_t(s)].fixed_layers > 0 && j - i != p.stages[size_t(s)].fixed_layers)
          return;
        worst = std::max(worst, cut.time(s, i, j));
      }
      feasible = true;
      best = std::min(best, worst);
      return;
    }
    int lo = b[size_t(k - 1)] + 1, hi = L - (K - k);
    for (int c = lo; c <= hi; ++c) {
      if (!p.allowed[size_t(c)]) continue;
      b[size_t(k)] = c;
      rec(k + 1);
    }
  };
  if (K == 1) {
    rec(1);
    return;
  }
  rec(1);
}

TEST(Cut, OptimalAgainstBruteForce) {
  uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  int feasible_cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    int L = int(std::uniform_int_distribution<int>(1, 10)(rng));
    int K = int(std::uniform_int_distribution<int>(1, std::min(L, 5))(rng));
    Problem p = random_problem(rng, L, K);
    Cutter cut(p.costs, p.stages, p.allowed);
    CutResult r = cut.solve();
    bool bf_ok;
    int64_t bf_best;
    brute_force(cut, p, bf_ok, bf_best);
    ASSERT_EQ(r.feasible, bf_ok) << "seed " << seed << " trial " << trial << ": " << r.reason;
    if (!r.feasible) continue;
    ++feasible_cases;
    ASSERT_EQ(r.bottleneck, bf_best) << "seed " << seed << " trial " << trial;
    // Starting from the optimum without capacities (what the search passes) changes nothing.
    std::vector<CutStage> free_stages = p.stages;
    for (auto& s : free_stages) s.capacity = 0;
    CutResult unlimited = Cutter(p.costs, free_stages, p.allowed).solve();
    ASSERT_TRUE(unlimited.feasible);
    ASSERT_LE(unlimited.bottleneck, r.bottleneck);
    ASSERT_EQ(cut.solve(unlimited.bottleneck).bottleneck, bf_best)
        << "seed " << seed << " trial " << trial;
    ASSERT_EQ(int(r.bounds.size()), K + 1);
    EXPECT_EQ(r.bounds.front(), 0);
    EXPECT_EQ(r.bounds.back(), L);
    for (int k = 0; k < K; ++k) {
      int i = r.bounds[size_t(k)], j = r.bounds[size_t(k + 1)];
      EXPECT_LT(i, j) << "empty stage " << k;
      EXPECT_TRUE(cut.fits_memory(k, i, j)) << "stage " << k << " over its capacity";
      EXPECT_LE(cut.time(k, i, j), r.bottleneck);
      if (k > 0) {
        EXPECT_TRUE(p.allowed[size_t(i)]);
      }
      if (p.stages[size_t(k)].fixed_layers > 0) {
        EXPECT_EQ(j - i, p.stages[size_t(k)].fixed_layers);
      }
    }
  }
  EXPECT_GT(feasible_cases, 1000);
}

TEST(Cut, MemoryCapMovesLayersOffTheFirstStage) {
  // Equal times, but stage 0 holds 4 micro-batches in flight and stage 1 one (1F1B):
  // without a cap the cut is even; with a tight cap on stage 0 it takes fewer layers.
  LayerCosts c;
  for (int l = 0; l < 8; ++l) {
    c.time.push_back(10);
    c.mem.push_back({100, 100, 100, 100, 100});
    c.own_bytes.push_back(10);
  }
  CutStage s0{0, 0, {{3, 0, 0}}, 0}, s1{0, 0, {{0, 0, 0}}, 0};
  CutResult free = Cutter({c}, {s0, s1}).solve();
  ASSERT_TRUE(free.feasible);
  EXPECT_EQ(free.bounds, (std::vector<int>{0, 4, 8}));
  s0.capacity = 3 * 410;  // 3 layers: 30 persistent + 4 x 300 activations = 1230
  CutResult capped = Cutter({c}, {s0, s1}).solve();
  ASSERT_TRUE(capped.feasible) << capped.reason;
  EXPECT_EQ(capped.bounds, (std::vector<int>{0, 3, 8}));
  EXPECT_EQ(capped.bottleneck, 50);
  s0.capacity = 100;  // not even one layer
  CutResult none = Cutter({c}, {s0, s1}).solve();
  EXPECT_FALSE(none.feasible);
  EXPECT_NE(none.reason.find("stage 0 cannot hold even one layer"), std::string::npos)
      << none.reason;
}

TEST(Cut, LargeModelIsFast) {
  // 10,000 layers into 64 stages: the bisection's O(K L) tests stay cheap.
  LayerCosts c;
  std::mt19937_64 rng(1);
  for (int l = 0; l < 10000; ++l) {
    c.time.push_back(int64_t(1000 + rng() % 1000));
    c.mem.push_back({1000, 1200, 1100, 1300, 1200});
    c.own_bytes.push_back(5000);
  }
  std::vector<CutStage> st;
  for (int k = 0; k < 64; ++k)
    st.push_back({0, int64_t(12000000), {{64 - k, 0, 0}, {64 - k - 1, 0, 1}}, 0});
  Cutter cut({c}, st);
  CutResult r = cut.solve();
  ASSERT_TRUE(r.feasible) << r.reason;
  int64_t total = 0;
  for (int64_t t : c.time) total += t;
  EXPECT_GE(r.bottleneck, total / 64);
  EXPECT_LE(r.bottleneck, total / 64 + 2000);
}

}  // namespace
}  // namespace baton::partitioner

namespace baton::partitioner {
namespace {

TEST(Cut, GreedyPathEqualsGeneralPath) {
  // Without capacities, fixed counts or forbidden cuts the cut takes a greedy path; a
  // capacity nothing reaches forces the general one. Both must give the same bottleneck.
  uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    int L = int(1 + rng() % 300), K = int(1 + rng() % std::min(L, 40));
    LayerCosts c;
    for (int l = 0; l < L; ++l) {
      c.time.push_back(int64_t(rng() % 1000));
      c.mem.push_back({1, 1, 1, 1, 1});
      c.own_bytes.push_back(1);
    }
    std::vector<CutStage> free_stages(static_cast<size_t>(K)), capped(static_cast<size_t>(K));
    for (auto& s : capped) s.capacity = INT64_MAX / 8;
    CutResult a = Cutter({c}, free_stages).solve(), b = Cutter({c}, capped).solve();
    ASSERT_TRUE(a.feasible && b.feasible);
    ASSERT_EQ(a.bottleneck, b.bottleneck) << "seed " << seed << " trial " << trial;
  }
}

}  // namespace
}  // namespace baton::partitioner
