// Generators and the simulator: every generated schedule valid over a grid, the
// analytical results of the literature reproduced, real durations, transfers, memory,
// reductions, speed, and timelines.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "memory/error.h"
#include "schedule/detail/util.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/simulate.h"
#include "schedule/timeline.h"
#include "schedule/trace_compare.h"
#include "schedule/validate.h"
#include "tests/input_error.h"

using namespace baton::schedule;
using baton::InputError;

namespace {

CostSpec spec_fbw(double f, double b, double w) {
  CostSpec c = CostSpec::unit();
  c.forward.values = {f};
  c.backward_input.values = {b};
  c.backward_weight.values = {w};
  return c;
}

SimResult sim(const Schedule& s, const CostSpec& c) {
  return simulate(s, resolve(c, s));
}

double idle(const SimResult& r, int rank) {
  return r.makespan - r.ranks[size_t(rank)].busy;
}

}  // namespace

TEST(Generators, EveryScheduleValidOverAGrid) {
  int checked = 0;
  for (const auto& name : schedule_names())
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 3 * p + 2; ++m)
        for (int v : {0, 3, 4}) {
          if (v != 0 && name != "interleaved-1f1b") continue;
          Schedule s;
          try {
            s = generate(name, p, m, v);
          } catch (const InputError&) {
            continue;  // outside the schedule's domain (tested below)
          }
          ++checked;
          ASSERT_EQ(s.num_micro_batches, m);
          ValidationReport r = validate(s);
          ASSERT_TRUE(r.ok) << name << " p=" << p << " m=" << m << " v=" << v << "\n"
                            << r.to_string();
          ValidationReport rl = validate(lower(s));
          ASSERT_TRUE(rl.ok) << name << " lowered p=" << p << " m=" << m << "\n" << rl.to_string();
        }
  EXPECT_GT(checked, 900);
}

TEST(Generators, DomainsAndClearErrors) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([] { generate("1F1B", 0, 4); }).find("1f1b: ranks: expected 1 to"),
            std::string::npos);
  EXPECT_NE(msg([] { generate("gpipe", 2, 0); }).find("gpipe: micro-batches: expected 1 to"),
            std::string::npos);
  EXPECT_NE(msg([] { generate("zb-v", 4, 8, 3); }).find("zb-v: chunks: expected 2"),
            std::string::npos);
  EXPECT_EQ(msg([] { generate("interleaved", 4, 8, 0); }), "");  // 0: its own two chunks
  EXPECT_EQ(generate("interleaved", 4, 8, 0).num_stages(), 8);
  EXPECT_NE(msg([] {
              generate("interleaved", 4, 8, 65);
            }).find("interleaved-1f1b: chunks: expected 1 to 64, found 65"),
            std::string::npos);
  EXPECT_NE(msg([] { generate("dualpipev", 4, 7); }).find("at least 2 x ranks = 8, found 7"),
            std::string::npos);
  EXPECT_NE(msg([] { generate("dualpipe", 3, 12); }).find("ranks: expected an even number"),
            std::string::npos);
  EXPECT_NE(msg([] {
              generate("dualpipe", 4, 9);
            }).find("micro-batches: expected an even number of at least"),
            std::string::npos);
  EXPECT_NE(msg([] {
              generate("pipedream", 4, 8);
            }).find("unknown schedule 'pipedream' (expected one of gpipe"),
            std::string::npos);
  EXPECT_NE(msg([] { generate("1f1b", 4096, 4096); }).find("beyond the supported"),
            std::string::npos);
  EXPECT_EQ(generate("interleaved", 4, 8).name, "interleaved-1f1b");
  EXPECT_EQ(generate("interleaved", 4, 8).num_stages(), 8);
}

TEST(Simulate, GPipeAnd1F1BBubbleIsPMinus1OverMPlusPMinus1) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 4, 8, 32})
      for (const char* name : {"gpipe", "1f1b"}) {
        SimResult r = sim(generate(name, p, m), spec_fbw(1.5, 1.5, 0));  // equal F and B
        const double expected = double(p - 1) / (m + p - 1);
        EXPECT_NEAR(r.makespan, (m + p - 1) * 3.0, 1e-9) << name << " p=" << p << " m=" << m;
        for (const RankStats& rs : r.ranks)
          EXPECT_NEAR(rs.bubble, expected, 1e-12) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.bubble, expected, 1e-12);
      }
}

TEST(Simulate, InterleavedBubbleShrinksByV) {
  // Megatron-LM: with v chunks per rank the pipeline flush costs (p-1)(F+B)/v.
  for (int p : {2, 4, 8})
    for (int v : {2, 3, 4})
      for (int m : {p, 2 * p, 4 * p}) {
        const CostSpec c = spec_fbw(1, 1, 0);  // per rank share; each chunk gets 1/v
        SimResult one = sim(generate("1f1b", p, m), c);
        SimResult inter = sim(generate("interleaved-1f1b", p, m, v), c);
        const double flush = (p - 1) * 2.0 / v;
        EXPECT_NEAR(inter.makespan, 2.0 * m + flush, 1e-9) << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_NEAR(idle(inter, 0), idle(one, 0) / v, 1e-9);
        EXPECT_NEAR(inter.bubble, flush / (2.0 * m + flush), 1e-12);
      }
}

TEST(Simulate, OneFOneBPeakInFlightIsPMinusR) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 8, 16}) {
      SimResult r = sim(generate("1f1b", p, m), CostSpec::unit());
      for (int rank = 0; rank < p; ++rank)
        EXPECT_DOUBLE_EQ(r.ranks[size_t(rank)].peak_micro_batches, std::min(p - rank, m))
            << "p=" << p << " m=" << m;
      SimResult g = sim(generate("gpipe", p, m), CostSpec::unit());
      EXPECT_DOUBLE_EQ(g.peak_micro_batches, m);
    }
}

TEST(Simulate, ZeroBubbleSchedulesWithEqualFBW) {
  const CostSpec c = spec_fbw(1, 1, 1);
  for (int p : {2, 4, 8})
    for (int m : {2 * p, 3 * p, 6 * p}) {
      SimResult base = sim(generate("1f1b", p, m), c);
      SimResult h1 = sim(generate("zb-h1", p, m), c);
      SimResult h2 = sim(generate("zb-h2", p, m), c);
      SimResult zv = sim(generate("zb-v", p, m), c);
      // ZB-H1: a third of 1F1B's bubble ((p-1)(F+B-W) against (p-1)(F+B+W)) at the
      // same peak memory.
      for (int r = 0; r < p; ++r)
        EXPECT_NEAR(idle(h1, r), idle(base, r) / 3, 1e-9) << "p=" << p << " m=" << m;
      EXPECT_NEAR(h1.bubble / base.bubble, (3.0 * m + 3 * (p - 1)) / (3 * (3.0 * m + p - 1)), 1e-9);
      EXPECT_LE(h1.peak_micro_batches, p);
      // ZB-H2 and ZB-V: no bubble inside any rank's span (the zero-bubble paper's
      // measure); what remains is the ranks' staggered start (docs/schedules.md).
      EXPECT_LT(h2.span_bubble, 1e-12) << "p=" << p << " m=" << m;
      EXPECT_LT(zv.span_bubble, 1e-12) << "p=" << p << " m=" << m;
      EXPECT_LE(h2.peak_micro_batches, 2 * p - 1);
      EXPECT_LE(zv.peak_micro_batches, p);  // ZB-V: 1F1B's peak memory
      EXPECT_LT(zv.makespan, h1.makespan);
      // The whole-iteration bubble of ZB-V is the stagger of the V: (p-1) F/2.
      EXPECT_NEAR(idle(zv, p - 1), (p - 1) * 0.5, 1e-9);
    }
}

TEST(Simulate, DualPipeSchedules) {
  const CostSpec c = spec_fbw(1, 1, 1);
  for (int p : {2, 4, 8})
    for (int m : {2 * p, 4 * p}) {
      SimResult dv = sim(generate("dualpipev", p, m), c);
      SimResult h1 = sim(generate("zb-h1", p, m), c);
      EXPECT_LT(dv.makespan, h1.makespan);
      EXPECT_NEAR(dv.peak_micro_batches, p + 0.5, 1e-12);  // DeepSeek's table: PP + 1/2
      SimResult d = sim(generate("dualpipe", p, m), c);
      EXPECT_NEAR(d.peak_micro_batches, p + 1, 1e-12);  // PP + 1
      for (const RankStats& rs : d.ranks) EXPECT_NEAR(rs.busy, 3.0 * m, 1e-9);
    }
}

TEST(Simulate, RealDurationsLatencyAndBandwidth) {
  // Two ranks, one micro-batch: F 1, backward 2, a 100-byte message over 100 B/unit
  // with 0.5 latency each way: 1 + 1.5 + 1 + 2 + 1.5 + 2 = 9.
  CostSpec c = spec_fbw(1, 2, 0);
  c.message_bytes = {{100}, false, true};
  c.bandwidth = 100;
  c.latency = 0.5;
  for (bool lowered : {false, true}) {
    Schedule s = generate("1f1b", 2, 1);
    if (lowered) s = lower(s, {.reduce = false, .step = false});
    Simulator sim2(s);
    const SimResult& r = sim2.run(resolve(c, s));
    EXPECT_DOUBLE_EQ(r.makespan, 9.0) << lowered;
    EXPECT_DOUBLE_EQ(r.ranks[0].busy, 3.0);
    EXPECT_DOUBLE_EQ(r.ranks[1].start, 2.5);
  }
  // One link, first come first served: the second message waits for the first.
  CostSpec d = spec_fbw(0.1, 0.1, 0);
  d.message_bytes = {{10}, false, true};
  d.bandwidth = 10;
  Schedule g = generate("gpipe", 2, 2);
  Simulator s3(g);
  s3.run(resolve(d, g));
  EXPECT_NEAR(s3.start_time(1, 0), 1.1, 1e-12);  // 0F0 ends at 0.1, one unit on the link
  EXPECT_NEAR(s3.start_time(1, 1), 2.1, 1e-12);  // 0F1 ends at 0.2 but the link is busy until 1.1
}

// An action's start is kept, not recomputed as its end less its duration: (a + b) - b is
// not a, and at costs of 3000.1234567 the next action on a rank had started one ulp before
// its predecessor ended (Perfetto wants a thread's events to nest).
TEST(Simulate, ARanksNextActionStartsNoEarlierThanTheLastEnds) {
  const CostSpec c = spec_fbw(3000.1234567, 3000.3333333, 3000.7777777);
  for (const char* name : {"zb-h1", "1f1b", "zb-v"}) {
    const Schedule s = generate(name, 2, 4);
    Simulator sim(s);
    sim.run(resolve(c, s));
    for (int r = 0; r < s.num_ranks; ++r)
      for (int i = 1; i < int(s.ranks[size_t(r)].size()); ++i)
        EXPECT_GE(sim.start_time(r, i), sim.end_time(r, i - 1))
            << name << " rank " << r << " " << i;
    const Timeline t = sim.timeline(1.0);
    std::map<int, double> last_end;
    for (const TimelineEvent& e : t.events) {
      if (e.lane != 0) continue;
      if (last_end.count(e.rank)) {
        EXPECT_GE(e.start, last_end[e.rank]) << name;
      }
      last_end[e.rank] = e.end;
    }
  }
}

TEST(Simulate, ActivationMemoryInBytes) {
  Schedule s = parse_text("0: 0F0 0F1 0B0 0B1 0W0 0W1\n", "m.txt");
  CostSpec c = CostSpec::unit();
  c.activation_bytes = {{10}, false, true};
  c.activation_bytes_after_b = {{4}, false, true};
  SimResult r = sim(s, c);
  EXPECT_DOUBLE_EQ(r.peak_bytes, 20);
  EXPECT_DOUBLE_EQ(r.peak_micro_batches, 2);
  // Two chunks per rank: a (micro-batch, stage) pair is half a micro-batch.
  SimResult v = sim(generate("zb-v", 2, 4), c);
  EXPECT_DOUBLE_EQ(v.peak_micro_batches, 2.0);
  EXPECT_DOUBLE_EQ(v.peak_bytes, 4 * 5.0);  // four pairs of 10/2 bytes
}

TEST(Simulate, ReductionAndOptimizerStep) {
  CostSpec c = spec_fbw(1, 1, 1);
  c.reduce = {{5}, false, true};
  c.optimizer_step = 2;
  Schedule s = lower(generate("gpipe", 1, 1));  // 0F0 0BW0 0REDUCE STEP
  SimResult r = sim(s, c);
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 2 + 5 + 2);
  EXPECT_DOUBLE_EQ(r.ranks[0].busy, 1 + 2 + 2);
  // Without STEP the reduction still ends the iteration.
  SimResult q = sim(lower(generate("gpipe", 1, 1), {.step = false}), c);
  EXPECT_DOUBLE_EQ(q.makespan, 8);
}

// STEP and the global gradient norm: synchronous, every rank's STEP starts when the last
// rank reached its STEP plus one latency (the norm's all-reduce); post-validated, each
// STEP starts when its rank is ready and the step ends no earlier than that all-reduce.
TEST(Simulate, SynchronousAndPostValidatedSteps) {
  Schedule s = lower(generate("1f1b", 4, 8));
  Costs c = resolve(spec_fbw(1, 1, 1), s);
  c.optimizer_step = 2;
  c.latency = 0.5;
  Simulator simr(s);
  c.post_validated_step = true;
  const SimResult post = simr.run(c);
  std::vector<double> reached;
  for (int r = 0; r < 4; ++r)
    reached.push_back(simr.start_time(r, int(s.ranks[size_t(r)].size()) - 1));
  const double last = *std::max_element(reached.begin(), reached.end());
  // 1F1B: the first rank runs the last backward; the others reach STEP earlier.
  EXPECT_DOUBLE_EQ(reached[0], last);
  EXPECT_LT(reached[3], reached[0] - 1);
  EXPECT_DOUBLE_EQ(post.makespan, last + 2);  // the latency hides under rank 0's own step
  EXPECT_DOUBLE_EQ(post.ranks[3].end, reached[3] + 2);
  c.post_validated_step = false;
  const SimResult sync = simr.run(c);
  for (int r = 0; r < 4; ++r) {
    EXPECT_DOUBLE_EQ(simr.start_time(r, int(s.ranks[size_t(r)].size()) - 1), last + 0.5);
    EXPECT_DOUBLE_EQ(sync.ranks[size_t(r)].end, last + 2.5);
    EXPECT_DOUBLE_EQ(sync.ranks[size_t(r)].busy, post.ranks[size_t(r)].busy);
  }
  EXPECT_DOUBLE_EQ(sync.makespan, last + 2.5);
  // The last rank no longer idles until the others are done: a smaller span bubble.
  EXPECT_LT(post.ranks[3].span_bubble, sync.ranks[3].span_bubble);
  // A latency longer than the step: the post-validated step ends with the validation.
  c.latency = 5;
  c.post_validated_step = true;
  const double slow = simr.run(c).makespan;
  double reached_slow = 0;
  for (int r = 0; r < 4; ++r)
    reached_slow = std::max(reached_slow, simr.start_time(r, int(s.ranks[size_t(r)].size()) - 1));
  EXPECT_DOUBLE_EQ(slow, reached_slow + 5);
  // One rank holds every gradient: no message, no latency (a one-device plan's predicted
  // step had grown by --p2p-latency).
  Schedule one = lower(generate("1f1b", 1, 2));
  Costs c1 = resolve(spec_fbw(1, 1, 1), one);
  c1.optimizer_step = 2;
  const double alone = simulate(one, c1).makespan;
  c1.latency = 5;
  EXPECT_DOUBLE_EQ(simulate(one, c1).makespan, alone);
  // The cost file's key.
  CostSpec f = parse_costs(R"({"forward": 1, "backward_input": 1, "backward_weight": 1,
      "optimizer_step_mode": "post-validated"})",
                           "c.json");
  EXPECT_TRUE(resolve(f, s).post_validated_step);
  EXPECT_THROW(parse_costs(R"({"forward": 1, "backward_input": 1, "backward_weight": 1,
      "optimizer_step_mode": "later"})",
                           "c.json"),
               InputError);
}

// Ranks that update different shares of the model step for different times: each STEP
// lasts its own rank's time, synchronous or post-validated.
TEST(Simulate, StepTimesPerRank) {
  Schedule s = lower(generate("1f1b", 4, 8));
  Costs c = resolve(spec_fbw(1, 1, 1), s);
  c.optimizer_step = 9;  // ignored where the ranks' times are given
  c.optimizer_step_rank = {1, 2, 3, 4};
  Simulator simr(s);
  for (bool post : {false, true}) {
    c.post_validated_step = post;
    const SimResult r = simr.run(c);
    for (int k = 0; k < 4; ++k) {
      const int last = int(s.ranks[size_t(k)].size()) - 1;
      EXPECT_DOUBLE_EQ(r.ranks[size_t(k)].end, simr.start_time(k, last) + k + 1) << post;
    }
  }
  c.optimizer_step_rank = {1, 2, 3};
  EXPECT_THROW(simr.run(c), InputError);
  c.optimizer_step_rank = {1, 2, -3, 4};
  EXPECT_THROW(simr.run(c), InputError);
}

// A reduction shared by pipeline ranks (a tied parameter): it starts when the last rank
// of its group issues its REDUCE, so the other rank's STEP waits for that rank's backward.
// GPipe, 2 ranks, 1 micro-batch, F = B = W = 1, no link costs: rank 0 runs 0F0 [0, 1] and
// 0BW0 [4, 6], rank 1 1F0 [1, 2] and 1BW0 [2, 4]; the REDUCEs are issued at 6 and 4.
TEST(Simulate, TiedReductionWaitsForTheOtherRank) {
  Schedule s = lower(generate("gpipe", 2, 1), {.transfers = false});
  Costs c = resolve(spec_fbw(1, 1, 1), s);
  c.reduce = {1, 4};
  c.optimizer_step = 2;
  Simulator simr(s);
  auto step_end = [&](int r) { return simr.end_time(r, int(s.ranks[size_t(r)].size()) - 1); };
  auto step_event = [&](int r) {
    for (const TimelineEvent& e : simr.timeline().events)
      if (e.rank == r && e.kind == ActionKind::optimizer_step) return e;
    ADD_FAILURE() << "no STEP on rank " << r;
    return TimelineEvent{};
  };
  for (bool post : {true, false}) {
    SCOPED_TRACE(post ? "post-validated" : "synchronous");
    c.post_validated_step = post;
    // Alone: rank 1's reduction is done at 4 + 4, rank 0's at 6 + 1.
    c.reduce_group.clear();
    double alone = simr.run(c).makespan;
    EXPECT_DOUBLE_EQ(step_end(1), 8 + 2);
    EXPECT_DOUBLE_EQ(step_end(0), post ? 7 + 2 : 8 + 2);
    EXPECT_DOUBLE_EQ(alone, 10);
    // Tied: rank 1's starts when rank 0 issues its REDUCE at 6, done at 10.
    c.reduce_group = {0, 0};
    double tied = simr.run(c).makespan;
    EXPECT_DOUBLE_EQ(step_end(1), 10 + 2);
    EXPECT_DOUBLE_EQ(step_end(0), post ? 7 + 2 : 10 + 2);
    EXPECT_DOUBLE_EQ(tied, 12);
    // The timeline's STEP holds the wait, from when the rank reached it (as the executor
    // records it); its reduction from REDUCE to done.
    EXPECT_DOUBLE_EQ(step_event(1).start, 4);
    EXPECT_DOUBLE_EQ(step_event(1).end, 12);
    EXPECT_DOUBLE_EQ(step_event(0).start, 6);
  }
  // The cost file's key, and its checks.
  CostSpec f = parse_costs(R"({"forward": 1, "backward_input": 1, "backward_weight": 1,
      "reduce_group": [0, 0]})",
                           "c.json");
  EXPECT_EQ(resolve(f, s).reduce_group, (std::vector<int>{0, 0}));
  for (const char* bad : {R"([0])", R"([0, 2])", R"([0, "a"])", R"(0)"}) {
    const std::string text =
        std::string(
            R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "reduce_group": )") +
        bad + "}";
    EXPECT_THROW(resolve(parse_costs(text, "c.json"), s), InputError) << bad;
  }
}

TEST(Simulate, ReusedWithNewCostsAndCheckedInput) {
  Schedule s = generate("zb-h1", 4, 8);
  Simulator simr(s);
  const double a = simr.run(resolve(spec_fbw(1, 1, 1), s)).makespan;
  const double b = simr.run(resolve(spec_fbw(2, 2, 2), s)).makespan;
  EXPECT_DOUBLE_EQ(b, 2 * a);
  EXPECT_THROW(simr.run(Costs::uniform(3, 1, 1, 1)), InputError);
  Costs bad = Costs::uniform(4, 1, 1, 1);
  bad.forward[2] = -1;
  EXPECT_THROW(simr.run(bad), InputError);
  Schedule broken = s;
  broken.ranks[0].pop_back();
  EXPECT_THROW(Simulator{broken}, InputError);
}

// More ranks than cores (Costs::core_ranks): a core is shared among the processes
// computing on it, not among all. Two processes of one rank on one core run at half
// speed; ranks each alone on their core run as without it; two pipeline ranks sharing
// one core keep it busy from the first F to the last B (1F1B leaves no moment with both
// idle), so the step takes their work end to end: the mean-field sweeps come within 1%
// of that, and well under what every process busy all the time would take.
TEST(Simulate, TimeSlicedRanksShareTheirCoresAmongThoseComputing) {
  Schedule one = lower(generate("1f1b", 1, 4));
  Costs c1 = resolve(spec_fbw(1, 2, 1), one);
  c1.optimizer_step = 0.5;
  const double alone = simulate(one, c1).makespan;
  c1.core_ranks = {{2}};
  EXPECT_NEAR(simulate(one, c1).makespan, 2 * alone, 1e-9);

  Schedule s = generate("1f1b", 2, 8);
  Costs c = resolve(spec_fbw(1, 2, 0), s);
  const SimResult free_run = simulate(s, c);
  c.core_ranks = {{1, 0}, {0, 1}};
  EXPECT_DOUBLE_EQ(simulate(s, c).makespan, free_run.makespan);

  c.core_ranks = {{1, 1}};
  const SimResult shared = simulate(s, c);
  const double work = free_run.ranks[0].busy + free_run.ranks[1].busy;  // 2 x 8 x 3
  EXPECT_DOUBLE_EQ(work, 48);
  EXPECT_GT(shared.makespan, 0.99 * work);  // 48.24 (0.5% over)
  EXPECT_LT(shared.makespan, 1.01 * work);
  // A fixed factor of 2 (every process busy all the time) would take 2 x 27.
  EXPECT_LT(shared.makespan, 2 * free_run.makespan - 5);

  // Every generator (B/W splits, chunks, DualPipe's composites), lowered with a
  // reduction and STEP: one core for all of p = 4 ranks' processes does their work and
  // no more than every process busy all the time would take.
  for (const auto& name : schedule_names()) {
    Schedule g;
    try {
      g = lower(generate(name, 4, 8));
    } catch (const InputError&) {
      continue;
    }
    Costs k = resolve(spec_fbw(1, 1.5, 0.5), g);
    k.reduce.assign(k.forward.size(), 0.5);
    k.optimizer_step = 1;
    const SimResult separate = simulate(g, k);
    double busy = 0;
    for (const RankStats& rs : separate.ranks) busy += rs.busy;
    k.core_ranks = {{1, 1, 1, 1}};
    const SimResult shared_one = simulate(g, k);
    EXPECT_GT(shared_one.makespan, 0.98 * busy) << name;
    EXPECT_LT(shared_one.makespan, 4 * separate.makespan) << name;
  }

  Costs bad = c;
  bad.core_ranks = {{1, 1, 1}};
  try {
    simulate(s, bad);
    ADD_FAILURE() << "three entries for two ranks were taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("core_ranks[0]: expected 2 values (one per rank)"),
              std::string::npos)
        << e.what();
  }
  bad.core_ranks = {{1, -1}};
  EXPECT_THROW(simulate(s, bad), InputError);
}

TEST(Simulate, P128M1024WellUnderASecond) {
#if !defined(__OPTIMIZE__) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a speed bound means something only in an optimised build without sanitizers";
#endif
  const auto t0 = std::chrono::steady_clock::now();
  Schedule s = lower(generate("1f1b", 128, 1024));
  Simulator simr(s);
  SimResult r = simr.run(resolve(CostSpec::unit(), s));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NEAR(r.makespan, 3.0 * (1024 + 127), 1e-6);
  // Generate, lower, validate, index and run: about 0.3 s on the development machine;
  // the bound leaves room for a loaded machine. One more run alone is much faster.
  EXPECT_LT(seconds, 2.0);
  const auto t1 = std::chrono::steady_clock::now();
  simr.run(resolve(spec_fbw(1, 2, 1), s));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 0.5);
}

TEST(Timeline, ChromeTraceRoundTripsAndSvgDrawsEveryAction) {
  CostSpec c = spec_fbw(1, 1, 1);
  c.message_bytes = {{1}, false, true};
  c.bandwidth = 4;
  c.latency = 0.25;
  Schedule s = lower(generate("zb-v", 2, 3));
  Simulator simr(s);
  simr.run(resolve(c, s));
  Timeline t = simr.timeline(1e-3);
  size_t compute = 0, transfers = 0;
  for (const auto& e : t.events) (e.lane == 0 ? compute : transfers) += 1;
  EXPECT_EQ(compute, 3u * 3 * 4 + 2);  // F, B, W of 3 micro-batches on 4 stages; STEP per rank
  EXPECT_EQ(transfers, 3u * 2 * 2);    // activation and gradient over two rank boundaries
  Timeline back = from_chrome_trace(to_chrome_trace(t), "t.json");
  EXPECT_EQ(back.name, "zb-v");
  EXPECT_EQ(back.num_ranks, 2);
  EXPECT_DOUBLE_EQ(back.seconds_per_unit, 1e-3);
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].kind, t.events[i].kind);
    EXPECT_EQ(back.events[i].micro_batch, t.events[i].micro_batch);
    EXPECT_EQ(back.events[i].stage, t.events[i].stage);
    EXPECT_EQ(back.events[i].lane, t.events[i].lane);
    EXPECT_NEAR(back.events[i].start, t.events[i].start, 1e-6);
    EXPECT_NEAR(back.events[i].end, t.events[i].end, 1e-6);
  }
  const std::string svg = to_svg(t);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  // Scalable: a viewBox of its own width and height.
  const auto attr = [&](const std::string& name) {
    const size_t at = svg.find(" " + name + "=\"") + name.size() + 3;
    return svg.substr(at, svg.find('"', at) - at);
  };
  EXPECT_EQ(attr("viewBox"), "0 0 " + attr("width") + " " + attr("height"));
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1))
    ++rects;
  EXPECT_EQ(rects, 1 + t.events.size() + 7);            // background, one per event, legend
  EXPECT_NE(svg.find(">2</text>"), std::string::npos);  // micro-batch numbers in the boxes
  EXPECT_THROW(from_chrome_trace("{\"traceEvents\": 3}", "x.json"), InputError);
}

namespace {

// A small predicted timeline's Chrome trace: 1F1B on 2 ranks, 2 micro-batches, lowered.
nlohmann::json small_trace() {
  Schedule s = lower(generate("1f1b", 2, 2));
  Simulator simr(s);
  simr.run(resolve(spec_fbw(1, 1, 1), s));
  return nlohmann::json::parse(to_chrome_trace(simr.timeline(1e-3)));
}

// The index of the first complete ("X") event.
size_t first_complete(const nlohmann::json& j) {
  const auto& ev = j["traceEvents"];
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i]["ph"] == "X") return i;
  return ev.size();
}

}  // namespace

// Trace events are checked field by field, naming traceEvents[i].<field>: a pid beyond
// otherData.ranks (or 2^20 without it) had made `trace svg` draw a row per rank up to it
// (13 GB for pid 1e9) or overflow at 2^31 - 1; negative durations, stages below -1,
// unknown categories and phases, huge times and unknown lanes had passed or been dropped.
TEST(Timeline, ReaderRefusesMalformedEventsNamingTheField) {
  using baton::testing_support::input_error_of;
  const nlohmann::json base = small_trace();
  const size_t i = first_complete(base);
  ASSERT_LT(i, base["traceEvents"].size());
  const std::string at = "t.json: traceEvents[" + std::to_string(i) + "]";
  auto error_of = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = base;
    change(j["traceEvents"][i]);
    return input_error_of([&] { from_chrome_trace(j.dump(), "t.json"); });
  };
  EXPECT_EQ(error_of([](nlohmann::json&) {}), "");
  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::string what;
  };
  const std::vector<Case> cases = {
      {[](auto& e) { e["pid"] = 1000000000; },
       at + ".pid: expected a rank from 0 to 1 (otherData.ranks is 2), found 1000000000"},
      {[](auto& e) { e["pid"] = 2147483647; }, at + ".pid: expected a rank from 0 to 1"},
      {[](auto& e) { e["pid"] = 1e12; }, at + ".pid: expected a rank from 0 to 1"},
      {[](auto& e) { e["pid"] = -1; }, at + ".pid: expected a rank from 0 to 1"},
      {[](auto& e) { e["dur"] = -100.0; }, at + ".dur: expected a duration from 0"},
      {[](auto& e) { e["ts"] = 1e308; }, at + ".ts: expected a finite time"},
      {[](auto& e) { e["ts"] = "0"; }, at + ".ts: expected a finite time"},
      {[](auto& e) { e.erase("dur"); }, at + ".dur: missing"},
      {[](auto& e) { e["args"]["stage"] = -7; }, at + ".args.stage: expected an integer from "},
      {[](auto& e) { e["args"]["micro_batch"] = 2.5; }, at + ".args.micro_batch: expected"},
      {[](auto& e) { e["args"]["peer"] = 2; },
       at + ".args.peer: expected -1 or a rank from 0 to 1"},
      {[](auto& e) { e["cat"] = "ZZ"; }, at + ".cat: expected an action kind"},
      {[](auto& e) { e["ph"] = "B"; }, at + ".ph: expected \"X\" (a complete event) or \"M\""},
      {[](auto& e) { e["tid"] = -1; }, at + ".tid: expected a thread: 0 (compute), 2 (input)"},
      {[](auto& e) { e["tid"] = 1 << 21; }, at + ".tid: expected a thread: 0 (compute)"},
      {[](auto& e) { e = 3; }, at + ": expected a trace event object"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.change);
    EXPECT_EQ(msg.rfind(c.what, 0), 0u) << c.what << " -> " << msg;
  }
  // The header's rank count is checked too, and without it a pid is bounded by 2^20.
  nlohmann::json j = base;
  j["otherData"]["ranks"] = 1e9;
  EXPECT_EQ(input_error_of([&] {
              from_chrome_trace(j.dump(), "t.json");
            }).rfind("t.json: otherData.ranks: expected a number of ranks", 0),
            0u);
  // otherData.ranks 0 had turned the pid check's bound -1 into 2^64 - 1: any pid passed.
  j["otherData"]["ranks"] = 0;
  EXPECT_EQ(input_error_of([&] { from_chrome_trace(j.dump(), "t.json"); })
                .rfind("t.json: otherData.ranks: expected a number of ranks from 1 to 1048576, "
                       "found 0",
                       0),
            0u);
  // Threads 3 and up are more communication (transfers in flight at once).
  j = base;
  j["traceEvents"][i]["tid"] = 7;
  EXPECT_EQ(from_chrome_trace(j.dump(), "t.json").events[0].lane, 1);
  nlohmann::json bare = base["traceEvents"];  // the array form: no header
  bare[i]["pid"] = 5;
  EXPECT_EQ(from_chrome_trace(bare.dump(), "t.json").num_ranks, 6);
  bare[i]["pid"] = 1 << 20;
  EXPECT_NE(input_error_of([&] {
              from_chrome_trace(bare.dump(), "t.json");
            }).find(".pid: expected a rank from 0 to 1048575, found 1048576"),
            std::string::npos);
  // A labelled event (a halo receive, a load) is no action: skipped, not refused.
  j = base;
  j["traceEvents"][i]["cat"] = "HALO";
  j["traceEvents"][i]["name"] = "HALO_F0";
  EXPECT_EQ(from_chrome_trace(j.dump(), "t.json").events.size(),
            from_chrome_trace(base.dump(), "t.json").events.size() - 1);
}

// JSON has no infinity: a timeline whose times overflowed is refused rather than
// written as a trace no reader (baton's included) can parse.
TEST(Timeline, ChromeTraceRefusesNonFiniteTimes) {
  Timeline t{"huge", 1, 1.0, {}};
  t.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0.0, 1e9});
  EXPECT_NO_THROW(to_chrome_trace(t));
  t.events[0].end = 1e308;  // seconds: 1e314 microseconds, beyond double
  std::string msg = baton::testing_support::input_error_of([&] { to_chrome_trace(t); });
  EXPECT_NE(msg.find("0F0 on rank 0 lasts beyond 1e15 us"), std::string::npos) << msg;
  t.events[0].end = std::numeric_limits<double>::infinity();
  msg = baton::testing_support::input_error_of([&] { to_chrome_trace(t); });
  EXPECT_NE(msg.find("0F0 on rank 0 has no finite time"), std::string::npos) << msg;
}

// The writer refuses what the reader refuses: times beyond 1e15 us (1e9 s costs, within
// what cost files allow, sum past it) had been written, then refused by trace svg and
// trace compare, and "%.6f" into 64 characters had cut 1e306 to a wrong number.
TEST(Timeline, ChromeTraceWritesOnlyWhatItsReaderReads) {
  EXPECT_EQ(std::stod(baton::schedule::detail::format_number("%.6f", 1e306)), 1e306);
  EXPECT_EQ(baton::schedule::detail::format_number("%.6f", -1.0 * 1e306).size(), 308u + 7u);
  using baton::testing_support::input_error_of;
  Timeline t{"long", 1, 1.0, {}};
  t.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0.0, 1e9});  // 1e15 us: the most
  Timeline back = from_chrome_trace(to_chrome_trace(t), "t.json");
  EXPECT_DOUBLE_EQ(back.events.at(0).end, 1e9);
  t.events[0].end = 1.5e9;
  EXPECT_EQ(input_error_of([&] {
              to_chrome_trace(t);
            }).rfind("timeline \"long\": 0F0 on rank 0 lasts beyond 1e15 us", 0),
            0u);
  t.events[0] = {0, 0, ActionKind::forward, 0, 0, -1, 2e9, 2e9 + 1};
  EXPECT_NE(input_error_of([&] { to_chrome_trace(t); }).find("0F0 on rank 0 starts beyond 1e15 us"),
            std::string::npos);
  t.events[0] = {0, 0, ActionKind::forward, 0, 0, -1, 2.0, 1.0};
  EXPECT_NE(input_error_of([&] { to_chrome_trace(t); }).find("ends before it starts"),
            std::string::npos);
  t.events[0].end = 3.0;
  t.seconds_per_unit = 1e7;
  EXPECT_NE(input_error_of([&] { to_chrome_trace(t); }).find("a time unit of 1e+07 s"),
            std::string::npos);
  t.seconds_per_unit = 1.0;
  t.num_ranks = 0;
  EXPECT_NE(input_error_of([&] { to_chrome_trace(t); }).find("0 ranks, a Chrome trace holds 1"),
            std::string::npos);
  // Through the simulator: F = B = W = 1e9 s on 2 ranks (a 1.5e16 us step).
  Schedule s = lower(generate("1f1b", 2, 4));
  Simulator simr(s);
  simr.run(resolve(spec_fbw(1e9, 1e9, 1e9), s));
  EXPECT_THROW(to_chrome_trace(simr.timeline(1.0)), InputError);
}

// Events that meet in the timeline meet in the trace (ts and dur had been rounded apart:
// a BW ending at 144.738300 before its STEP starting at 144.738299), and transfers in
// flight at once are on threads of their own: on every thread, events nest or follow.
TEST(Timeline, ChromeTraceEventsOnAThreadNest) {
  CostSpec c = spec_fbw(1.0 / 3, 2.0 / 7, 1.0 / 9);
  c.latency = 2.1;  // each send still in flight when the next one leaves
  Schedule s = lower(generate("1f1b", 4, 6));
  Simulator simr(s);
  simr.run(resolve(c, s));
  const Timeline t = simr.timeline(1.234567e-3);
  const nlohmann::json j = nlohmann::json::parse(to_chrome_trace(t));
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> threads;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") {
      const int64_t ts = std::llround(e["ts"].get<double>() * 1e6);
      threads[{e["pid"], e["tid"]}].push_back(
          {ts, ts + std::llround(e["dur"].get<double>() * 1e6)});
    }
  int extra = 0;
  for (auto& [thread, events] : threads) {
    extra += thread.second >= 3;
    std::sort(events.begin(), events.end());
    for (size_t k = 1; k < events.size(); ++k)
      EXPECT_GE(events[k].first, events[k - 1].second)
          << "rank " << thread.first << " thread " << thread.second << " event " << k;
  }
  EXPECT_GT(extra, 0);
  const Timeline back = from_chrome_trace(j.dump(), "t.json");
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) EXPECT_EQ(back.events[i].lane, t.events[i].lane);
}

// Control characters in a name: replaced in the SVG (XML 1.0 has no character for them,
// not even a reference; the SVG had been refused by XML parsers).
TEST(Timeline, SvgReplacesControlCharactersInTheName) {
  Timeline t{"step\x01 one\x1b[31m \xEF\xBF\xBF<", 1, 1.0, {}};
  t.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0.0, 1.0});
  const std::string svg = to_svg(t);
  for (char c : svg) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 && c != '\n') << int(c);
  EXPECT_EQ(svg.find("\xEF\xBF\xBF"), std::string::npos);
  EXPECT_NE(svg.find("<title>step\xEF\xBF\xBD one\xEF\xBF\xBD[31m \xEF\xBF\xBD&lt;</title>"),
            std::string::npos);
}

// The prediction is measured from its own first action as the measured side is (a
// one-step trace against itself differs by nothing), and a prediction holding an action
// twice (a measured trace of two steps given as the prediction) is refused, naming it:
// it had matched arbitrarily (a trace against itself read -50%).
TEST(Timeline, CompareShiftsThePredictionAndRefusesRepeatedActions) {
  Schedule s = lower(generate("1f1b", 2, 3));
  Simulator simr(s);
  simr.run(resolve(spec_fbw(1, 2, 1), s));
  Timeline one = simr.timeline(1e-3);
  for (TimelineEvent& e : one.events) e.start += 7, e.end += 7;  // a measured step's offset
  TraceComparison c = compare_timelines(one, one);
  EXPECT_EQ(c.unmatched_measured, 0);
  EXPECT_EQ(c.unmatched_predicted, 0);
  EXPECT_DOUBLE_EQ(c.mean_abs_start_diff, 0.0);
  EXPECT_DOUBLE_EQ(c.mean_abs_duration_diff, 0.0);
  EXPECT_DOUBLE_EQ(c.measured_makespan, c.predicted_makespan);
  EXPECT_NEAR(c.predicted_makespan, simr.timeline(1e-3).end_time() * 1e-3, 1e-12);
  for (const ActionDiff& d : c.actions)
    EXPECT_DOUBLE_EQ(d.measured_start, d.predicted_start)
        << to_token({d.kind, d.micro_batch, d.stage, -1});
  // Two steps: every action twice.
  Timeline two = one;
  for (const TimelineEvent& e : one.events) {
    TimelineEvent later = e;
    later.start += 100, later.end += 100;
    two.events.push_back(later);
  }
  EXPECT_NO_THROW(compare_timelines(two, one));  // measured: its first step counts
  const std::string msg = baton::testing_support::input_error_of(
      [&] { compare_timelines(one, two, "m.json", "p.json"); });
  EXPECT_EQ(msg.rfind("p.json: 0F0 appears twice (rank 0 at 0.007 s and rank 0 at 0.107 s)", 0), 0u)
      << msg;
}

// A post-validation rollback redoes the update as a second STEP event of its rank: the
// measured makespan runs to the redo's end (it had stopped at the first STEP's), the
// redo is counted apart (not modelled, not matched), and the next step still is not part
// of the first.
TEST(Timeline, CompareCountsARollbacksRedoInTheMakespan) {
  Schedule s = lower(generate("zb-h2", 2, 4));
  Simulator simr(s);
  CostSpec c = spec_fbw(1, 2, 1);
  c.optimizer_step = 2;
  c.post_validated_step = true;
  simr.run(resolve(c, s));
  const Timeline one = simr.timeline(1e-3);
  double end = 0;
  for (const TimelineEvent& e : one.events) end = std::max(end, e.end);
  Timeline redone = one;
  for (const TimelineEvent& e : one.events)
    if (e.kind == ActionKind::optimizer_step) {
      TimelineEvent redo = e;  // after the norm arrives: past every rank's first update
      redo.start = end + 0.5;
      redo.end = end + 0.5 + (e.rank == 1 ? 3 : 2);
      redone.events.push_back(redo);
    }
  for (const TimelineEvent& e : one.events) {  // the next step
    TimelineEvent later = e;
    later.start += 100, later.end += 100;
    redone.events.push_back(later);
  }
  const TraceComparison cmp = compare_timelines(redone, one);
  EXPECT_NEAR(cmp.measured_makespan, (end + 3.5) * 1e-3, 1e-12);
  EXPECT_NEAR(cmp.predicted_makespan, end * 1e-3, 1e-12);
  EXPECT_EQ(cmp.redone_steps, 2);
  EXPECT_NEAR(cmp.redo_mean, 2.5e-3, 1e-12);
  EXPECT_EQ(cmp.unmatched_measured, 0);
  EXPECT_EQ(cmp.unmatched_predicted, 0);
  for (const KindSummary& k : cmp.kinds)  // the early updates, matched as predicted
    if (k.kind == ActionKind::optimizer_step) {
      EXPECT_EQ(k.count, 2);
      EXPECT_NEAR(k.measured_mean, k.predicted_mean, 1e-12);
    }
  EXPECT_NE(
      format_comparison(cmp, false).find("redo        2             2.500                  -"),
      std::string::npos)
      << format_comparison(cmp, false);
  // Without a redo nothing is reported apart.
  EXPECT_EQ(compare_timelines(one, one).redone_steps, 0);
  EXPECT_EQ(format_comparison(compare_timelines(one, one), false).find("redo"), std::string::npos);
}

// Timelines of different plans share actions, and their differences had been reported
// as the prediction's error (a measured PP 2 against a predicted PP 4: "F +1509%").
TEST(Timeline, CompareRefusesTimelinesOfDifferentPlans) {
  auto timeline = [](int p, int m) {
    Schedule s = lower(generate("1f1b", p, m));
    Simulator simr(s);
    simr.run(resolve(spec_fbw(1, 2, 1), s));
    return simr.timeline(1e-3);
  };
  using baton::testing_support::input_error_of;
  const Timeline pp2 = timeline(2, 4);
  EXPECT_EQ(input_error_of([&] { compare_timelines(pp2, timeline(4, 4), "m.json", "p.json"); }),
            "m.json has 2 pipeline ranks and p.json has 4: timelines of different plans "
            "(expected a run's trace and the prediction of the same plan)");
  EXPECT_EQ(input_error_of([&] {
              compare_timelines(timeline(1, 4), pp2, "m.json", "p.json");
            }).rfind("m.json has 1 pipeline ranks and p.json has 2", 0),
            0u);
  EXPECT_EQ(input_error_of([&] {
              compare_timelines(pp2, timeline(2, 2), "m.json", "p.json");
            }).rfind("m.json has 4 micro-batches and p.json has 2", 0),
            0u);
  Schedule v = lower(generate("zb-v", 2, 4));  // 4 stages on 2 ranks
  Simulator simv(v);
  simv.run(resolve(spec_fbw(1, 2, 1), v));
  EXPECT_EQ(input_error_of([&] {
              compare_timelines(pp2, simv.timeline(1e-3), "m.json", "p.json");
            }).rfind("m.json has 2 stages and p.json has 4", 0),
            0u);
  // A measured run of two data-parallel ranks per pipeline rank is the same plan.
  Timeline dp = pp2;
  dp.num_ranks = 4;
  for (const TimelineEvent& e : pp2.events) {
    TimelineEvent copy = e;
    copy.rank += 2;
    dp.events.push_back(copy);
  }
  EXPECT_NO_THROW(compare_timelines(dp, pp2));
}

// The two the wrong way round (by the names baton gives them) are refused: every
// difference had read with the opposite sign. Timelines of two schedules of one plan shape
// compare, opening with a note that the differences are the schedules'.
TEST(Timeline, CompareRefusesSwappedRolesAndNotesOtherSchedules) {
  auto timeline = [](const char* name, const std::string& label) {
    Schedule s = lower(generate(name, 2, 4));
    Simulator sim(s);
    sim.run(resolve(spec_fbw(1, 2, 1), s));
    Timeline t = sim.timeline(1e-3);
    t.name = label;
    return t;
  };
  using baton::testing_support::input_error_of;
  const Timeline measured = timeline("1f1b", "measured: 1f1b (3 steps)"),
                 predicted = timeline("1f1b", "predicted: 1f1b");
  EXPECT_EQ(compare_timelines(measured, predicted).schedule_note, "");
  EXPECT_EQ(input_error_of([&] { compare_timelines(predicted, measured, "p.json", "m.json"); }),
            "p.json is a prediction ('predicted: 1f1b') and m.json a measured run ('measured: "
            "1f1b (3 steps)'): the measured timeline goes first, then the prediction (swapped, "
            "every difference would read with the opposite sign)");
  // Two predictions (of two cost files) compare.
  EXPECT_NO_THROW(compare_timelines(predicted, predicted));
  const TraceComparison other = compare_timelines(measured, timeline("gpipe", "predicted: gpipe"));
  EXPECT_EQ(other.schedule_note.rfind("the timelines are of different schedules ('1f1b' "
                                      "measured, 'gpipe' predicted)",
                                      0),
            0u)
      << other.schedule_note;
  EXPECT_EQ(format_comparison(other, false).rfind("note: the timelines are of different", 0), 0u);
  // The simulator's timelines name the schedule alone.
  EXPECT_NE(compare_timelines(timeline("1f1b", "1f1b"), timeline("gpipe", "gpipe")).schedule_note,
            "");
}
