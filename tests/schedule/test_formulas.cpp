// The generators against the papers' formulas, with uneven F, B, W and over several
// (p, m): the idle time inside rank 0's span (it starts first and ends last, so this is
// the bubble the papers draw) and the peak activation memory. Zero Bubble (Qi et al.
// 2023, Table 1): 1F1B (p-1)(F+B+W) at p micro-batches, ZB-H1 (p-1)(F+B-W) at p, ZB-H2
// (p-1)(F+B-2W) at 2p-1; Megatron's interleaving divides 1F1B's by v; the V family
// (Qi et al. 2024) holds about p/3 (V-Min), p/2 (V-Half) and p (V-ZB) micro-batches.
#include <gtest/gtest.h>

#include <string>

#include "schedule/generators.h"
#include "schedule/simulate.h"

using namespace baton::schedule;

namespace {

struct Fbw {
  double f, b, w;
};

// F + B >= 2W in each, the papers' regime (a W is no longer than an F or a B).
constexpr Fbw kCosts[] = {{1, 1, 1}, {1, 1.5, 0.7}, {1, 2, 1}, {1, 1.2, 0.9}, {1.2, 1, 0.5}};

SimResult run(const std::string& name, int p, int m, const Fbw& c, int v = 0) {
  CostSpec spec = CostSpec::unit();
  spec.forward.values = {c.f};
  spec.backward_input.values = {c.b};
  spec.backward_weight.values = {c.w};
  Schedule s = generate(name, p, m, v);
  return simulate(s, resolve(spec, s));
}

double span_idle(const SimResult& r, int rank) {
  const RankStats& s = r.ranks[size_t(rank)];
  return s.end - s.start - s.busy;
}

std::string where(const Fbw& c, int p, int m) {
  return "F=" + std::to_string(c.f) + " B=" + std::to_string(c.b) + " W=" + std::to_string(c.w) +
         " p=" + std::to_string(p) + " m=" + std::to_string(m);
}

}  // namespace

TEST(PaperFormulas, ZeroBubbleTableOne) {
  for (const Fbw& c : kCosts)
    for (int p : {2, 3, 4, 8})
      for (int m : {2 * p, 3 * p + 1, 4 * p}) {
        SCOPED_TRACE(where(c, p, m));
        const SimResult ofob = run("1f1b", p, m, c);
        const SimResult h1 = run("zb-h1", p, m, c);
        const SimResult h2 = run("zb-h2", p, m, c);
        EXPECT_NEAR(span_idle(ofob, 0), (p - 1) * (c.f + c.b + c.w), 1e-9);
        EXPECT_NEAR(span_idle(h1, 0), (p - 1) * (c.f + c.b - c.w), 1e-9);
        EXPECT_NEAR(span_idle(h2, 0), (p - 1) * (c.f + c.b - 2 * c.w), 1e-9);
        // Makespan = rank 0's work plus its idle (rank 0 starts at 0 and ends last).
        EXPECT_NEAR(ofob.makespan, m * (c.f + c.b + c.w) + (p - 1) * (c.f + c.b + c.w), 1e-9);
        EXPECT_DOUBLE_EQ(ofob.peak_micro_batches, p);
        EXPECT_DOUBLE_EQ(h1.peak_micro_batches, p);
        EXPECT_DOUBLE_EQ(h2.peak_micro_batches, 2 * p - 1);
        // 1F1B's bubble fraction (p-1)/(m+p-1) on rank 0.
        EXPECT_NEAR(ofob.ranks[0].bubble, double(p - 1) / (m + p - 1), 1e-12);
      }
}

TEST(PaperFormulas, InterleavedDividesTheFlushByV) {
  for (const Fbw& c : kCosts)
    for (int p : {2, 4})
      for (int v : {2, 3})
        for (int m : {p, 2 * p, 4 * p}) {
          SCOPED_TRACE(where(c, p, m) + " v=" + std::to_string(v));
          const SimResult r = run("interleaved-1f1b", p, m, c, v);
          EXPECT_NEAR(span_idle(r, 0), (p - 1) * (c.f + c.b + c.w) / v, 1e-9);
          // Megatron's memory: rank 0 holds p + (p-1)/v micro-batches at its peak once
          // its warm-up is whole (m >= 2p); at m = p, all p of them.
          const double peak = m >= 2 * p ? p + (p - 1.0) / v : double(p);
          EXPECT_NEAR(r.ranks[0].peak_micro_batches, peak, 1e-9);
          EXPECT_NEAR(r.peak_micro_batches, peak, 1e-9);
        }
}

// One chunk per rank is 1F1B itself, action for action, at any m (the interleaved
// warm-up formula would hold 2(p-1-r) + 1 micro-batches).
TEST(PaperFormulas, InterleavedWithOneChunkIs1F1B) {
  for (int p : {2, 3, 4})
    for (int m : {1, p - 1, p + 1, 3 * p}) {
      if (m < 1) continue;
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule one = generate("interleaved-1f1b", p, m, 1);
      EXPECT_EQ(one.ranks, generate("1f1b", p, m).ranks);
    }
}

// The V family with F = B = W (the regime the building blocks are designed in): peaks
// near p/3, p/2 and p against 1F1B's p, and V-ZB's makespan at the V's bound.
TEST(PaperFormulas, VFamilyMemoryAndBubble) {
  const Fbw eq{1, 1, 1};
  for (int p : {4, 8, 16, 24})
    for (int m : {2 * p, 4 * p}) {
      SCOPED_TRACE(where(eq, p, m));
      const double vmin = run("v-min", p, m, eq).peak_micro_batches;
      const double vhalf = run("v-half", p, m, eq).peak_micro_batches;
      const SimResult vzb = run("v-zb", p, m, eq);
      EXPECT_GE(vmin, p / 3.0 - 1e-9);
      EXPECT_LE(vmin, p / 3.0 + 2);
      EXPECT_GE(vhalf, p / 2.0 - 1e-9);
      EXPECT_LE(vhalf, p / 2.0 + 2);
      EXPECT_DOUBLE_EQ(vzb.peak_micro_batches, p);
      EXPECT_DOUBLE_EQ(vzb.makespan, 3.0 * m + (p - 1) / 2.0);
      // Every V rank idles at least the ramp (p-1)/2; V-ZB exactly that on rank p-1.
      EXPECT_NEAR(vzb.makespan - vzb.ranks[size_t(p - 1)].busy, (p - 1) / 2.0, 1e-9);
    }
}
