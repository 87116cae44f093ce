// The automatic schedule on costs in the proportions of the Zero Bubble paper's profiled
// models (F about B, W half to three quarters of F, a hop a few percent of F) at its
// memory limits p and 2p and the ladder around them: every result within its limit,
// and a larger limit never slower. Labelled slow: seconds per row on a loaded machine.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>

#include "memory/error.h"
#include "schedule/auto_schedule.h"

using namespace baton::schedule;

TEST(AutoScheduleRows, ZeroBubbleShapedRowsNeverSlowerWithMoreMemory) {
  struct Row {
    double f, b, w, hop;
    int p, m;
  };
  for (const Row& row : {Row{18.5, 18.1, 9.3, 0.6, 8, 24}, Row{29.7, 29.3, 19.9, 0.8, 8, 32},
                         Row{11.3, 11.2, 8.1, 0.4, 16, 48}, Row{10.4, 10.2, 7.9, 0.35, 32, 96}}) {
    CostSpec c = CostSpec::unit();
    c.forward.values = {row.f};
    c.backward_input.values = {row.b};
    c.backward_weight.values = {row.w};
    c.latency = row.hop;
    double prev = std::numeric_limits<double>::infinity();
    for (double k : {1.0, 1.5, 2.0, 3.0}) {
      AutoOptions o;
      o.num_ranks = row.p;
      o.num_micro_batches = row.m;
      o.memory_limit = {k * row.p};
      const AutoResult r = auto_schedule(c, o);
      SCOPED_TRACE("p=" + std::to_string(row.p) + " m=" + std::to_string(row.m) +
                   " limit=" + std::to_string(k) + "p, chosen " + r.chosen);
      std::printf("p=%d m=%d limit %.1fp: makespan %.1f span bubble %.2f%% (%s)\n", row.p, row.m, k,
                  r.sim.makespan, 100 * r.sim.span_bubble, r.chosen.c_str());
      EXPECT_LE(r.sim.peak_micro_batches, k * row.p + 1e-9);
      EXPECT_LE(r.sim.makespan, prev * (1 + 1e-12));
      prev = std::min(prev, r.sim.makespan);
    }
  }
}
