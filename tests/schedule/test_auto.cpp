// The automatic scheduler: within the memory limit, never slower than the best fixed
// schedule that fits the same limit, on random costs (seed printed).
#include <gtest/gtest.h>

#include <random>

#include "memory/error.h"
#include "schedule/auto_schedule.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/validate.h"
#include "tests/input_error.h"

using namespace baton::schedule;

namespace {

struct Fixed {
  double makespan;
  bool fits;
};

// Every fixed generator, as generated (full backward where it uses one) and with B
// and W split, simulated on the same costs independently of the auto scheduler.
double best_fixed_that_fits(const CostSpec& c, int p, int m, double limit, bool bytes) {
  double best = std::numeric_limits<double>::infinity();
  for (const auto& name : schedule_names()) {
    if (name == "dualpipe") continue;  // two model replicas: not a candidate (docs/schedules.md)
    Schedule s;
    try {
      s = generate(name, p, m);
    } catch (const baton::InputError&) {
      continue;
    }
    for (const Schedule& t : {s, split_backward(s)}) {
      SimResult r = simulate(t, resolve(c, t));
      bool fit = true;
      for (const RankStats& rs : r.ranks)
        fit = fit && (bytes ? rs.peak_bytes : rs.peak_micro_batches) <= limit * (1 + 1e-9);
      if (fit) best = std::min(best, r.makespan);
    }
  }
  return best;
}

}  // namespace

TEST(AutoSchedule, WithinLimitAndNeverSlowerThanTheBestFixedThatFits) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::uniform_real_distribution<double> f(0.5, 2.0), b(0.5, 3.0), w(0.1, 2.0), lat(0.0, 0.3);
  for (int trial = 0; trial < 12; ++trial) {
    const int p = 2 + int(rng() % 5), m = p + int(rng() % (2 * p + 1));
    CostSpec c = CostSpec::unit();
    c.forward.values = {f(rng)};
    c.backward_input.values = {b(rng)};
    c.backward_weight.values = {w(rng)};
    c.latency = lat(rng);
    const bool bytes = trial % 2 == 1;
    c.activation_bytes = {{1000.0}, false, true};
    c.activation_bytes_after_b = {{400.0}, false, true};
    // Between one micro-batch and more than any schedule needs.
    const double units = std::uniform_real_distribution<double>(1.0, 2.5 * p)(rng);
    const double limit = bytes ? units * 1000.0 : units;
    AutoOptions o;
    o.num_ranks = p;
    o.num_micro_batches = m;
    o.memory_limit = {limit};
    o.limit_in_bytes = bytes;
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) +
                 " limit=" + std::to_string(limit) + (bytes ? " bytes" : " micro-batches"));
    AutoResult r = auto_schedule(c, o);
    ASSERT_TRUE(validate(r.schedule).ok) << validate(r.schedule).to_string();
    for (const Action& a : r.schedule.ranks[0])
      ASSERT_NE(a.kind, ActionKind::full_backward);  // B/W split
    SimResult again = simulate(r.schedule, resolve(c, r.schedule));
    EXPECT_DOUBLE_EQ(again.makespan, r.sim.makespan);
    for (const RankStats& rs : again.ranks)
      EXPECT_LE(bytes ? rs.peak_bytes : rs.peak_micro_batches, limit * (1 + 1e-9)) << r.chosen;
    EXPECT_LE(r.sim.makespan, best_fixed_that_fits(c, p, m, limit, bytes) * (1 + 1e-12))
        << r.chosen;
  }
}

TEST(AutoSchedule, PerRankLimitsAndPerStageCosts) {
  CostSpec c;
  c.forward = {{1, 1, 1, 2}, true, true};  // a heavy last stage (the loss)
  c.backward_input = {{1, 1, 1, 2}, true, true};
  c.backward_weight = {{0.5, 0.5, 0.5, 1}, true, true};
  AutoOptions o;
  o.num_ranks = 4;
  o.num_micro_batches = 8;
  o.memory_limit = {4, 3, 2, 2};
  AutoResult r = auto_schedule(c, o);
  EXPECT_EQ(r.schedule.num_stages(), 4);  // per-stage costs for 4 stages: one stage per rank
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_LE(r.sim.ranks[size_t(rank)].peak_micro_batches, o.memory_limit[size_t(rank)]);
  // The fixed schedules with another stage count cannot use these costs.
  for (const AutoCandidate& f : r.fixed)
    if (f.name == "zb-v") {
      EXPECT_FALSE(f.defined);
    }
}

TEST(AutoSchedule, ClearErrorWhenNothingFits) {
  AutoOptions o;
  o.num_ranks = 4;
  o.num_micro_batches = 8;
  o.memory_limit = {0.4};
  try {
    auto_schedule(CostSpec::unit(), o);
    FAIL();
  } catch (const baton::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no schedule fits the memory limit of 0.4 micro-batches"),
              std::string::npos)
        << e.what();
  }
  o.memory_limit = {1, 2};
  EXPECT_THROW(auto_schedule(CostSpec::unit(), o), baton::InputError);
}

// Per-stage costs for no candidate's stage count (2 values at p = 4): the cost file's
// error, naming it, as a fixed schedule reports it; it had blamed the (infinite) memory
// limit ("no schedule fits the memory limit of inf micro-batches per rank").
TEST(AutoSchedule, CostsForAnotherStageCountAreTheError) {
  CostSpec c;
  c.forward = {{1, 1.4}, true, true};
  c.backward_input = {{1.5, 2}, true, true};
  c.backward_weight = {{0.7, 1.2}, true, true};
  AutoOptions o;
  o.num_ranks = 4;
  o.num_micro_batches = 8;
  o.costs_source = "uc.json";
  const std::string expected =
      "uc.json: costs: forward: has 2 values but the schedule has 4 stages (give one value per "
      "stage, or one number for a rank's share)";
  EXPECT_EQ(baton::testing_support::input_error_of([&] { auto_schedule(c, o); }), expected);
  o.memory_limit = {100};
  EXPECT_EQ(baton::testing_support::input_error_of([&] { auto_schedule(c, o); }), expected);
  o.include_fixed = false;  // the other candidates fail alike (the first has 8 stages)
  EXPECT_EQ(baton::testing_support::input_error_of([&] {
              auto_schedule(c, o);
            }).rfind("uc.json: costs: forward: has 2 values but the schedule has 8 stages", 0),
            0u);
  // Costs for 2 stages per rank fit some candidates: a too small limit is still the limit.
  c.forward = {{1, 1, 1, 1, 1, 1, 1, 1}, true, true};
  c.backward_input = {{1, 1, 1, 1, 1, 1, 1, 1}, true, true};
  c.backward_weight = {{1, 1, 1, 1, 1, 1, 1, 1}, true, true};
  o.include_fixed = true;
  o.memory_limit = {0.4};
  EXPECT_EQ(baton::testing_support::input_error_of([&] {
              auto_schedule(c, o);
            }).rfind("auto: no schedule fits the memory limit of 0.4 micro-batches", 0),
            0u);
}

TEST(ListScheduler, RespectsMemoryOnEveryPlacement) {
  for (const char* placement : {"loop", "v"})
    for (int chunks : {1, 2}) {
      if (std::string(placement) == "v" && chunks == 1) continue;
      Costs c = Costs::uniform(4 * chunks, 1, 1.5, 0.5);
      for (double limit : {1.0, 2.0, 3.5}) {
        GreedyPolicy pol;
        pol.placement = placement;
        pol.chunks = chunks;
        Schedule s = list_schedule(4, 10, c, {limit}, false, pol);
        ASSERT_TRUE(validate(s).ok) << placement << chunks << "\n" << validate(s).to_string();
        EXPECT_LE(simulate(s, c).peak_micro_batches, limit + 1e-9) << placement << chunks;
      }
    }
}

TEST(LocalSearch, FindsZeroBubbleQualityFrom1F1B) {
  // Starting from 1F1B with its backward split, moving W's is enough to reach ZB-H1's
  // makespan at the same memory when F = B = W.
  Schedule start = split_backward(generate("1f1b", 4, 8));
  Costs c = resolve(CostSpec::unit(), start);
  const double zb_h1 = simulate(generate("zb-h1", 4, 8), c).makespan;
  Schedule better = refine_schedule(start, c, {4}, false, 200000);
  ASSERT_TRUE(validate(better).ok);
  SimResult r = simulate(better, c);
  EXPECT_LT(r.makespan, simulate(start, c).makespan);
  EXPECT_LE(r.makespan, zb_h1 + 1e-9);
  EXPECT_LE(r.peak_micro_batches, 4 + 1e-9);
}

namespace {

CostSpec fbw(double f, double b, double w, double hop) {
  CostSpec c = CostSpec::unit();
  c.forward.values = {f};
  c.backward_input.values = {b};
  c.backward_weight.values = {w};
  c.latency = hop;
  return c;
}

// The automatic schedule over a ladder of memory limits: each result within its limit,
// and a larger limit never slower (the candidates that fit a limit fit every larger
// one, but the list scheduler and the local search depend on the limit, so this is a
// property of the search, not of its construction).
void expect_monotone(const CostSpec& c, int p, int m, const std::vector<double>& limits) {
  double prev = std::numeric_limits<double>::infinity();
  for (double limit : limits) {
    AutoOptions o;
    o.num_ranks = p;
    o.num_micro_batches = m;
    o.memory_limit = {limit};
    AutoResult r;
    try {
      r = auto_schedule(c, o);
    } catch (const baton::InputError&) {
      continue;  // nothing fits this one
    }
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) +
                 " limit=" + std::to_string(limit) + " chosen " + r.chosen);
    EXPECT_LE(r.sim.peak_micro_batches, limit + 1e-9);
    EXPECT_LE(r.sim.makespan, prev * (1 + 1e-12));
    EXPECT_LE(r.sim.makespan, best_fixed_that_fits(c, p, m, limit, false) * (1 + 1e-12));
    prev = std::min(prev, r.sim.makespan);
  }
}

}  // namespace

TEST(AutoSchedule, LargerMemoryLimitNeverSlower) {
  // Uneven costs with a hop, and the F = B = W case the V blocks are built for.
  for (const CostSpec& c : {fbw(1, 1.3, 0.6, 0.05), fbw(1, 1, 1, 0)})
    expect_monotone(c, 4, 8, {2, 4, 8, std::numeric_limits<double>::infinity()});
}

// By the longest rank span (the Zero Bubble paper's measure): within the limit, never a
// longer span than the makespan choice nor than any fixed schedule that fits.
TEST(AutoSchedule, SpanObjective) {
  const CostSpec c = fbw(18.5, 18.1, 9.3, 0.6);
  AutoOptions o;
  o.num_ranks = 4;
  o.num_micro_batches = 8;
  o.memory_limit = {8};
  const AutoResult by_makespan = auto_schedule(c, o);
  o.objective = AutoOptions::Objective::span;
  const AutoResult by_span = auto_schedule(c, o);
  const double span = objective_value(by_span.sim, o.objective);
  EXPECT_LE(span, objective_value(by_makespan.sim, o.objective) * (1 + 1e-12));
  EXPECT_LE(by_span.sim.peak_micro_batches, 8 + 1e-9);
  for (const char* name : {"1f1b", "zb-h1", "zb-h2", "zb-v"}) {
    Schedule s = split_backward(generate(name, 4, 8));
    const SimResult r = simulate(s, resolve(c, s));
    if (r.peak_micro_batches <= 8) {
      EXPECT_LE(span, objective_value(r, o.objective) * (1 + 1e-12)) << name;
    }
  }
  EXPECT_THROW(parse_objective("fastest", "--objective"), baton::InputError);
}

// The zero-bubble heuristic on unit costs: the best of its knobs is ZB-H1 at p
// micro-batches (bubble (p-1) / (3m + p-1)) and zero bubble at 2p, as the paper's.
TEST(ZbGreedy, ZbH1AtPAndZeroBubbleAt2pOnUnitCosts) {
  for (int p : {2, 4, 8})
    for (int m : {2 * p, 3 * p})
      for (int k : {1, 2}) {
        const Costs c = Costs::uniform(p, 1, 1, 1);
        double best = 1;
        for (int knobs = 0; knobs < 8; ++knobs)
          for (int delta = -2; delta <= 2; ++delta) {
            const ZbGreedyPolicy pol{bool(knobs & 1), bool(knobs & 2), bool(knobs & 4), delta};
            const SimResult r =
                simulate(zb_greedy_schedule(p, m, c, {double(k * p)}, false, pol), c);
            EXPECT_LE(r.peak_micro_batches, k * p + 1e-9);
            best = std::min(best, r.span_bubble);
          }
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) +
                     " limit=" + std::to_string(k) + "p");
        EXPECT_NEAR(best, k == 1 ? double(p - 1) / (3 * m + p - 1) : 0.0, 1e-9);
      }
}

// On random costs and memory (bytes, less held between B and W): every knob setting gives
// a valid schedule within the limit; a limit below one micro-batch is refused.
TEST(ZbGreedy, ValidAndWithinLimitOnRandomCosts) {
  const unsigned seed = 20261202;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.2, 2.0), lat(0.0, 0.3), share(0.2, 1.0);
  for (int trial = 0; trial < 12; ++trial) {
    const int p = 2 + trial % 5, m = p + trial % 7 * 2;
    Costs c = Costs::uniform(p, 1, 1, 1);
    for (int j = 0; j < p; ++j) {
      c.forward[size_t(j)] = u(rng);
      c.backward_input[size_t(j)] = u(rng);
      c.backward_weight[size_t(j)] = u(rng);
      c.activation_bytes.push_back(100 * u(rng));
      c.activation_bytes_after_b.push_back(c.activation_bytes.back() * share(rng));
    }
    c.latency = lat(rng);
    const double most = *std::max_element(c.activation_bytes.begin(), c.activation_bytes.end());
    const double limit = most * std::uniform_real_distribution<double>(1.0, 2.5 * p)(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    for (int knobs = 0; knobs < 8; ++knobs) {
      const ZbGreedyPolicy pol{bool(knobs & 1), bool(knobs & 2), bool(knobs & 4), knobs % 3 - 1};
      const Schedule s = zb_greedy_schedule(p, m, c, {limit}, true, pol);
      EXPECT_TRUE(validate(s).ok) << validate(s).to_string();
      const SimResult r = simulate(s, c);
      for (const RankStats& rs : r.ranks) EXPECT_LE(rs.peak_bytes, limit * (1 + 1e-9));
    }
    EXPECT_THROW(zb_greedy_schedule(p, m, c, {most * 0.99}, true, {}), baton::InputError);
  }
}
