// The building-block generator and the V family (Qi et al. 2024): validity over a grid,
// peak activation memory against the blocks' lifetimes (docs/schedules.md), the
// bubble, a hand-written block, and the automatic scheduler choosing them.
#include <gtest/gtest.h>

#include <algorithm>

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
  for (const char* name : {"v-min", "v-half"})
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
