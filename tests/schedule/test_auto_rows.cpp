// The automatic schedule on the Zero Bubble paper's profiled costs (Qi et al., "Zero
// Bubble Pipeline Parallelism", ICLR 2024: Table 9's F, B, W and per-hop communication
// for its 1.5B, 6.2B, 14.6B and 28.3B models; Table 5's bubble rates of its automatic
// schedules ZB-1p and ZB-2p), with the paper's memory model: a micro-batch holds M_B =
// 34h + 5as (per token and layer, s = 1024) from its F to its B and M_W = 32h from its B
// to its W; ZB-1p and ZB-2p may hold p and 2p times M_B. The paper's bubble rate is 1 -
// m(F + B + W) / (the longest stage's span from its first F to its last W), which is
// baton's span bubble when every stage has the same costs. Labelled slow: a few seconds
// per p = 32 row on a loaded machine.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>

#include "schedule/auto_schedule.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"

using namespace baton::schedule;

namespace {

struct PaperRow {
  const char* model;
  int p, m;
  double f, b, w, comm;  // Table 9
  double hidden, heads;  // the model's h and a (the memory model)
  double zb1p, zb2p;     // Table 5, percent
};

// Table 9 and Table 5 of the paper, every row.
const PaperRow kPaperRows[] = {
    {"1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 2304, 24, 15.85, 4.33},
    {"1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 2304, 24, 12.42, 0.39},
    {"1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 2304, 24, 6.74, 0.26},
    {"6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 4096, 32, 13.23, 0.29},
    {"6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 4096, 32, 10.45, 0.22},
    {"6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 4096, 32, 5.54, 0.10},
    {"14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 5120, 40, 6.72, 0.86},
    {"14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 5120, 40, 5.16, 0.68},
    {"14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 5120, 40, 2.68, 0.34},
    {"28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 6144, 48, 6.41, 0.38},
    {"28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 6144, 48, 4.90, 0.29},
    {"28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 6144, 48, 2.57, 0.15},
};

double auto_rows_m_b(const PaperRow& r) {
  return 34 * r.hidden + 5 * r.heads * 1024;
}

CostSpec auto_rows_costs(const PaperRow& r, bool paper_memory) {
  CostSpec c = CostSpec::unit();
  c.forward.values = {r.f};
  c.backward_input.values = {r.b};
  c.backward_weight.values = {r.w};
  c.latency = r.comm;
  if (paper_memory) {
    c.activation_bytes = {{auto_rows_m_b(r)}, false, true};
    c.activation_bytes_after_b = {{32 * r.hidden}, false, true};
  }
  return c;
}

}  // namespace

// The rows with the smallest m (the paper's m = 3p) through the automatic schedule at
// the paper's memory limits, p and 2p micro-batches of M_B: baton's span bubble at or
// below the paper's ZB-1p and ZB-2p, and no worse at 2p than at p. The tolerance, 0.005
// percentage points, is the paper's rounding to two decimals: on several rows baton's
// heuristic finds the paper's own schedule.
TEST(AutoScheduleRows, PaperRowsAtOrBelowZb1pAndZb2p) {
  for (const PaperRow& r : kPaperRows) {
    if (r.m != 3 * r.p) continue;
    const CostSpec c = auto_rows_costs(r, true);
    double prev = std::numeric_limits<double>::infinity();
    for (int k : {1, 2}) {
      AutoOptions o;
      o.num_ranks = r.p;
      o.num_micro_batches = r.m;
      o.memory_limit = {k * r.p * auto_rows_m_b(r)};
      o.limit_in_bytes = true;
      o.objective = AutoOptions::Objective::span;
      const AutoResult a = auto_schedule(c, o);
      const double paper = k == 1 ? r.zb1p : r.zb2p;
      std::printf("%-5s p=%2d m=%3d limit %dp: span bubble %.2f%% (paper ZB-%dp %.2f%%), %s\n",
                  r.model, r.p, r.m, k, 100 * a.sim.span_bubble, k, paper, a.chosen.c_str());
      SCOPED_TRACE(std::string(r.model) + " p=" + std::to_string(r.p) +
                   " m=" + std::to_string(r.m) + " limit " + std::to_string(k) + "p: " + a.chosen);
      EXPECT_LE(a.sim.peak_bytes, o.memory_limit[0] * (1 + 1e-9));
      EXPECT_LE(100 * a.sim.span_bubble, paper + 0.005);
      EXPECT_LE(a.sim.span_bubble, prev + 1e-12);  // more memory is never worse
      prev = a.sim.span_bubble;
    }
  }
}

// The other rows through the two candidates that win them in the automatic schedule
// (milliseconds each instead of seconds): at p, ZB-V (the V placement, p micro-batches
// at most); at 2p, the zero-bubble heuristic over its knobs. One row stays above the
// paper's ZB-2p: 28.3B at m = 256, where with Table 9's T_comm = 0.460 rank 0's first B
// cannot arrive before 32F + 31B + 62 T_comm, 13.3 after its 2p = 64 forwards end, a
// bubble of at least 0.18% for any schedule within 2p (the paper reports 0.15%, which the
// same row with the other 28.3B rows' T_comm = 0.408 allows: the heuristic then finds
// 0.14%); there the bound is asserted.
TEST(AutoScheduleRows, OtherRowsZbVAtPAndZbGreedyAt2p) {
  for (const PaperRow& r : kPaperRows) {
    if (r.m == 3 * r.p) continue;
    const CostSpec spec = auto_rows_costs(r, true);
    const double mb = auto_rows_m_b(r);
    const Schedule v = split_backward(generate("zb-v", r.p, r.m));
    const SimResult at_p = simulate(v, resolve(spec, v));
    EXPECT_LE(at_p.peak_bytes, r.p * mb * (1 + 1e-9));
    EXPECT_LE(100 * at_p.span_bubble, r.zb1p + 0.005) << r.model << " m=" << r.m;
    const Costs c = resolve(spec, r.p, r.p, 1);
    double best = 1;
    for (int knobs = 0; knobs < 8; ++knobs)
      for (int delta = -2; delta <= 2; ++delta) {
        const ZbGreedyPolicy pol{bool(knobs & 1), bool(knobs & 2), bool(knobs & 4), delta};
        const SimResult s = simulate(zb_greedy_schedule(r.p, r.m, c, {2 * r.p * mb}, true, pol), c);
        EXPECT_LE(s.peak_bytes, 2 * r.p * mb * (1 + 1e-9));
        best = std::min(best, s.span_bubble);
      }
    std::printf(
        "%-5s p=%2d m=%3d: zb-v at p %.2f%% (paper ZB-1p %.2f%%), zb-greedy at 2p %.2f%% "
        "(paper ZB-2p %.2f%%)\n",
        r.model, r.p, r.m, 100 * at_p.span_bubble, r.zb1p, 100 * best, r.zb2p);
    const bool comm_bound = r.p == 32 && r.m == 256;
    EXPECT_LE(100 * best, comm_bound ? 0.25 : r.zb2p + 0.005) << r.model << " m=" << r.m;
    EXPECT_LE(best, at_p.span_bubble);
  }
}

// baton's own memory unit (a micro-batch counts whole from its F to its W) on the rows
// with the smallest m, the limit ladder around p and 2p with the default objective (the
// makespan): every result within its limit, and a larger limit never slower.
TEST(AutoScheduleRows, LargerLimitNeverWorse) {
  for (const PaperRow& r : kPaperRows) {
    if (r.m != 3 * r.p) continue;
    const CostSpec c = auto_rows_costs(r, false);
    for (auto objective : {AutoOptions::Objective::makespan}) {
      double prev = std::numeric_limits<double>::infinity();
      for (double k : {1.0, 1.5, 2.0, 3.0}) {
        AutoOptions o;
        o.num_ranks = r.p;
        o.num_micro_batches = r.m;
        o.memory_limit = {k * r.p};
        o.objective = objective;
        const AutoResult a = auto_schedule(c, o);
        const double v =
            objective == AutoOptions::Objective::span ? a.sim.span_bubble : a.sim.makespan;
        std::printf(
            "%-5s p=%2d m=%3d limit %.1fp (micro-batches) by %s: makespan %.1f span "
            "bubble %.2f%% (%s)\n",
            r.model, r.p, r.m, k, objective == AutoOptions::Objective::span ? "span" : "makespan",
            a.sim.makespan, 100 * a.sim.span_bubble, a.chosen.c_str());
        SCOPED_TRACE(std::string(r.model) + " limit " + std::to_string(k) + "p: " + a.chosen);
        EXPECT_LE(a.sim.peak_micro_batches, k * r.p + 1e-9);
        EXPECT_LE(v, prev * (1 + 1e-12) + 1e-12);
        prev = std::min(prev, v);
      }
    }
  }
}
