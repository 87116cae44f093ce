// The building-block generator and the V family (Qi et al. 2024): validity over a grid,
// peak activation memory against the blocks' lifetimes (docs/schedules.md), the
// bubble, a hand-written block, and the automatic scheduler choosing them.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "memory/error.h"
#include "schedule/auto_schedule.h"
#include "schedule/generators.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

using namespace baton::schedule;
using baton::InputError;

namespace {

SimResult unit_sim(const Schedule& s) {
  return simulate(s, resolve(CostSpec::unit(), s));
}

// The lag L of the one-slot-per-hop blocks (as gen_block.cpp chooses it).
int lag(int p, int want) {
  int L = want + want % 2;
  while ((p + L / 2) % 3 == 0) L += 2;
  return L;
}

}  // namespace

TEST(BuildingBlocks, ValidOverAGrid) {
  for (const char* name : {"v-min", "v-half", "v-zb"})
    for (int p : {1, 2, 3, 4, 5, 6, 8})
      for (int m : {1, 2, 3, 5, 8, 13, 24}) {
        Schedule s = generate(name, p, m);
        ValidationReport r = validate(s);
        ASSERT_TRUE(r.ok) << name << " p=" << p << " m=" << m << "\n" << r.to_string();
        EXPECT_EQ(s.placement, v_placement(p, 2));
      }
}

// Rank 0 holds a micro-batch's chunk 0 from its F to its W, about 4p + L slots (V-Min)
// or 6p (V-Half) of a period of 6, and chunk 1 about L (or 3) slots: in micro-batches
// (two chunks make one), (4p + 2L) / 12 and (6p + 3) / 12, plus up to 1.5 for the W's
// slots and the micro-batch in flight at the peak.
TEST(BuildingBlocks, PeakMemoryAgainstTheBlocks) {
  for (int p : {4, 6, 8, 12, 16, 24}) {
    const int m = 4 * p;
    const double one_f_one_b = unit_sim(generate("1f1b", p, m)).peak_micro_batches;
    EXPECT_DOUBLE_EQ(one_f_one_b, p);
    const double vmin = unit_sim(generate("v-min", p, m)).peak_micro_batches;
    const double vhalf = unit_sim(generate("v-half", p, m)).peak_micro_batches;
    SCOPED_TRACE("p=" + std::to_string(p) + " v-min " + std::to_string(vmin) + " v-half " +
                 std::to_string(vhalf));
    const double min_formula = (4.0 * p + 2 * lag(p, 0)) / 12, half_formula = (6.0 * p + 3) / 12;
    EXPECT_GE(vmin, min_formula - 1e-9);
    EXPECT_LE(vmin, min_formula + 1.5);
    EXPECT_GE(vhalf, half_formula - 1e-9);
    EXPECT_LE(vhalf, half_formula + 1.5);
    EXPECT_LT(vmin, vhalf);
    if (p >= 16) {  // the ratios to 1F1B the family is named for
      EXPECT_NEAR(vmin / one_f_one_b, 1.0 / 3, 0.07);
      EXPECT_NEAR(vhalf / one_f_one_b, 1.0 / 2, 0.07);
    }
  }
}

// On the V placement a chunk's F, B, W take half a rank's share: with F = B = W the
// repeated block leaves about the lifetime of one micro-batch idle per rank (4p + L or
// 6p slots of half a unit), below 1F1B's 3(p - 1), and the span bubble falls with m.
TEST(BuildingBlocks, Bubble) {
  for (int p : {4, 8}) {
    const int m = 4 * p;
    const SimResult ofob = unit_sim(generate("1f1b", p, m));
    for (const char* name : {"v-min", "v-half"}) {
      const SimResult r = unit_sim(generate(name, p, m));
      SCOPED_TRACE(std::string(name) + " p=" + std::to_string(p) + " bubble " +
                   std::to_string(r.bubble) + " (1f1b " + std::to_string(ofob.bubble) + ")");
      EXPECT_LT(r.bubble, ofob.bubble);
      EXPECT_LT(r.makespan - 3.0 * m, 3.0 * (p - 1));
      const SimResult longer = unit_sim(generate(name, p, 8 * p));
      EXPECT_LT(longer.span_bubble, r.span_bubble);
    }
  }
}

// A block written by hand: 1F1B on one chunk per rank is the block F at slot r, B at
// slot 2p-1-r (period 3, W filling the free slots).
TEST(BuildingBlocks, HandWrittenBlock) {
  const int p = 4, m = 8;
  BuildingBlock b;
  b.period = 3;
  for (int r = 0; r < p; ++r) {
    b.chunk_stage.push_back({r});
    b.forward.push_back({r});
    b.backward.push_back({2 * p - 1 - r});
  }
  Schedule s = block_schedule("mine", p, m, b);
  ASSERT_TRUE(validate(s).ok) << validate(s).to_string();
  EXPECT_EQ(s.placement, loop_placement(p, 1));
  // Every W follows its B.
  for (const auto& list : s.ranks)
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].kind == ActionKind::backward_weight) {
        auto b_at =
            std::find(list.begin(), list.end(),
                      make_action(ActionKind::backward_input, list[i].micro_batch, list[i].stage));
        EXPECT_LT(size_t(b_at - list.begin()), i);
      }
  BuildingBlock bad = b;
  bad.chunk_stage[1] = {0};
  EXPECT_THROW(block_schedule("bad", p, m, bad), InputError);
}

// V-ZB: V-Min's block with a lag of about 4p (a micro-batch lives 12p slots on rank 0: p
// micro-batches) laid out by the reorder pass at p. With F = B = W = T per rank share a
// V rank's actions take T/2, and the only idle left is the V's ramp: makespan
// 3mT + (p-1)T/2 at m = p and m >= 2p-1 (ZB-V reaches it only from 2p-1), peak p
// micro-batches (1F1B's largest) on every rank, reached on rank 0.
TEST(BuildingBlocks, VZeroBubble) {
  for (int p : {2, 3, 4, 5, 8, 12, 16})
    for (int m : {1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1, 6 * p}) {
      if (m < 1) continue;
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const SimResult r = unit_sim(generate("v-zb", p, m));
      const SimResult zbv = unit_sim(generate("zb-v", p, m));
      for (const RankStats& rr : r.ranks) EXPECT_LE(rr.peak_micro_batches, p + 1e-9);
      // Between p and 2p micro-batches neither reaches the bound everywhere; V-ZB is
      // mostly ahead there and never more than one half action behind.
      EXPECT_LE(r.makespan, zbv.makespan + 0.5 + 1e-9);
      if (m == p || m >= 2 * p - 1) {
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * m + (p - 1) / 2.0);
      }
      if (m >= p) {
        EXPECT_DOUBLE_EQ(r.ranks[0].peak_micro_batches, p);
      }
    }
}

// The reorder pass orders each rank once, so its memory bound holds for any costs (the
// peak depends on a rank's order alone), and the order has no cycle for any costs.
TEST(BuildingBlocks, ReorderPassHoldsForAnyCosts) {
  const int p = 6, m = 20;
  Schedule s = generate("v-zb", p, m);
  ASSERT_TRUE(validate(s).ok);
  CostSpec spec = CostSpec::unit();
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    Costs c = resolve(spec, s);
    uint32_t x = seed * 2654435761u;
    auto next = [&] {
      x = x * 1664525u + 1013904223u;
      return 0.3 + double(x >> 8) / double(1u << 24) * 2.0;
    };
    for (auto* field : {&c.forward, &c.backward_input, &c.backward_weight})
      for (double& t : *field) t = next();
    const SimResult r = simulate(s, c);
    for (const RankStats& rr : r.ranks) EXPECT_LE(rr.peak_micro_batches, p + 1e-9);
  }
  // The pass on a block of its own, at a limit below the block's lifetimes.
  BuildingBlock b = v_block("v-half", p);
  b.memory_limit = 2;
  Schedule tight = block_schedule("v-half-2", p, m, b);
  ASSERT_TRUE(validate(tight).ok) << validate(tight).to_string();
  for (const RankStats& rr : unit_sim(tight).ranks) EXPECT_LE(rr.peak_micro_batches, 2 + 1e-9);
  // At one micro-batch the pass without reservations stalls (every rank full of first
  // chunks); with them it completes, one micro-batch per rank at a time.
  b.memory_limit = 1;
  Schedule one = block_schedule("v-half-1", p, m, b);
  ASSERT_TRUE(validate(one).ok) << validate(one).to_string();
  for (const RankStats& rr : unit_sim(one).ranks) EXPECT_LE(rr.peak_micro_batches, 1 + 1e-9);
  b.memory_limit = 0.4;  // not even one micro-batch
  EXPECT_THROW(block_schedule("bad", p, m, b), InputError);
  // A limit beyond an int once overflowed its conversion (UB, a wrong message): any limit
  // of m micro-batches or more is m's, the pass unbound.
  b.memory_limit = m;
  const Schedule loose = block_schedule("v-half-m", p, m, b);
  for (double big : {1.1e9, 1e300, std::numeric_limits<double>::infinity()}) {
    b.memory_limit = big;
    EXPECT_EQ(block_schedule("v-half-m", p, m, b), loose) << big;
    EXPECT_EQ(v_shape_within("v-zb", p, m, Costs::uniform(2 * p, 1, 1, 1), big).ranks,
              v_shape_within("v-zb", p, m, Costs::uniform(2 * p, 1, 1, 1), m).ranks)
        << big;
  }
  b.memory_limit = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(block_schedule("bad", p, m, b), InputError);
  b = v_block("v-half", p);
  b.memory_limit = 3;
  std::swap(b.chunk_stage[0][0], b.chunk_stage[0][1]);
  std::swap(b.forward[0][0], b.forward[0][1]);
  EXPECT_THROW(block_schedule("bad", p, m, b), InputError);
}

TEST(BuildingBlocks, AutoScheduleConsidersThem) {
  AutoOptions o;
  o.num_ranks = 8;
  o.num_micro_batches = 32;
  o.memory_limit = {3.5};
  o.refine = false;
  o.max_greedy_runs = 8;
  AutoResult r = auto_schedule(CostSpec::unit(), o);
  bool listed = false;
  for (const AutoCandidate& c : r.fixed) listed = listed || c.name == "v-min";
  EXPECT_TRUE(listed);
  EXPECT_LE(r.sim.peak_micro_batches, 3.5 + 1e-9);
}
