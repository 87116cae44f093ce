// The `forward-only` generator (evaluation through the pipeline): valid before and after
// lowering (activation transfers only, no REDUCE or STEP), simulated with the makespan
// of a pure pipeline fill and no activation memory kept; a missing forward is caught.
#include <gtest/gtest.h>

#include "memory/error.h"
#include "schedule/forward_only.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

namespace baton::schedule {
namespace {

TEST(ForwardOnly, ValidLoweredAndSimulated) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 9; ++m) {
      Schedule s = generate("forward-only", p, m);
      ASSERT_TRUE(is_forward_only(s));
      ASSERT_TRUE(validate(s).ok) << validate(s).to_string();
      Schedule l = lower(s);  // transfers only: no REDUCE or STEP for an evaluation pass
      ASSERT_TRUE(is_forward_only(l));
      ValidationReport r = validate(l);
      ASSERT_TRUE(r.ok) << "p=" << p << " m=" << m << "\n" << r.to_string();
      size_t sends = 0;
      for (const auto& list : l.ranks)
        for (const Action& a : list) {
          EXPECT_NE(a.kind, ActionKind::send_gradient);
          EXPECT_NE(a.kind, ActionKind::recv_gradient);
          sends += a.kind == ActionKind::send_activation;
        }
      EXPECT_EQ(sends, size_t((p - 1) * m));
      Costs c = Costs::uniform(p, 2.0, 3.0, 1.0);
      c.activation_bytes.assign(size_t(p), 100.0);
      SimResult res = simulate(l, c);
      EXPECT_DOUBLE_EQ(res.makespan, 2.0 * (p - 1 + m));  // fill, then one F per step
      EXPECT_DOUBLE_EQ(res.peak_bytes, 100.0);            // one forward's activations at a time
    }
}

TEST(ForwardOnly, LikeEveryTrainingSchedule) {
  for (const auto& name : schedule_names())
    for (int p : {2, 4}) {
      Schedule t = generate(name, p, 2 * p);
      Schedule s = forward_only_like(t);
      ASSERT_EQ(s.placement, t.placement);
      LowerOptions lo;
      lo.reduce = lo.step = false;
      ValidationReport r = validate(lower(s, lo));
      ASSERT_TRUE(r.ok) << name << " p=" << p << "\n" << r.to_string();
    }
}

TEST(ForwardOnly, NotATrainingScheduleButKnown) {
  for (const auto& n : schedule_names()) EXPECT_NE(n, "forward-only");
  EXPECT_EQ(canonical_schedule_name("Forward-Only"), "forward-only");
  EXPECT_THROW(generate("forward-only", 2, 4, 2), InputError);  // one stage per rank
}

TEST(ForwardOnly, MissingForwardIsCaught) {
  Schedule s = generate("forward-only", 3, 4);
  s.ranks[1].erase(s.ranks[1].begin() + 2);
  ValidationReport r = validate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("missing 1F2"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace baton::schedule
