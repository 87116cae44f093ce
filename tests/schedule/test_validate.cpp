// The validator on broken schedules (each rejected with the right message, rank and
// index), and the dependency rule the executor reuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "memory/error.h"
#include "schedule/dependencies.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/transfer.h"
#include "schedule/validate.h"

using namespace baton::schedule;
using K = ActionKind;

namespace {

// Position of the action with this token on rank r.
int index_of(const Schedule& s, int r, const std::string& token) {
  const auto& list = s.ranks[size_t(r)];
  for (size_t i = 0; i < list.size(); ++i)
    if (to_token(list[i]) == token) return int(i);
  ADD_FAILURE() << token << " not on rank " << r;
  return -1;
}

void erase(Schedule& s, int r, const std::string& token) {
  auto& l = s.ranks[size_t(r)];
  l.erase(l.begin() + index_of(s, r, token));
}

void expect_invalid(const Schedule& s, int rank, int index, const std::vector<std::string>& words) {
  ValidationReport r = validate(s);
  ASSERT_FALSE(r.ok) << to_text(s);
  EXPECT_EQ(r.rank, rank) << r.to_string();
  EXPECT_EQ(r.index, index) << r.to_string();
  for (const auto& w : words)
    EXPECT_NE(r.message.find(w), std::string::npos) << "'" << w << "' not in:\n" << r.to_string();
  if (rank >= 0) {
    EXPECT_NE(r.grid.find("rank " + std::to_string(rank)), std::string::npos) << r.grid;
    if (index >= 0) {
      EXPECT_NE(r.grid.find("> "), std::string::npos) << r.grid;
    }
  }
}

}  // namespace

TEST(Validate, AcceptsGeneratedAndLoweredSchedules) {
  for (const auto& name : schedule_names()) {
    Schedule s = generate(name, 4, 8);
    EXPECT_TRUE(validate(s).ok) << name << "\n" << validate(s).to_string();
    EXPECT_TRUE(validate(lower(s)).ok) << name << "\n" << validate(lower(s)).to_string();
    EXPECT_TRUE(validate(split_backward(s)).ok) << name;
    EXPECT_TRUE(validate(merge_backward(split_backward(s))).ok) << name;
    // A schedule with its STEP but no REDUCE (valid: STEP then waits for the W's) lowers
    // to the fully lowered form.
    LowerOptions no_reduce;
    no_reduce.reduce = false;
    const Schedule stepped = lower(s, no_reduce);
    EXPECT_TRUE(validate(stepped).ok) << name;
    EXPECT_EQ(lower(stepped), lower(s)) << name;
  }
}

TEST(Validate, DroppedComputeActionIsMissing) {
  Schedule s = split_backward(generate("1f1b", 3, 4));
  erase(s, 1, "1B2");
  expect_invalid(s, 1, index_of(s, 1, "1W2"),
                 {"missing 1B2", "micro-batch 2 of stage 1 (rank 1)", "no B"});

  Schedule t = generate("gpipe", 2, 3);
  erase(t, 0, "0F1");
  expect_invalid(t, 0, index_of(t, 0, "0BW1"), {"missing 0F1", "no F"});

  Schedule u = generate("zb-h1", 2, 2);
  erase(u, 1, "1W0");
  expect_invalid(u, 1, index_of(u, 1, "1B0"), {"missing 1W0", "no W"});

  // A dropped BW is named as the file would have written it.
  Schedule b = generate("1f1b", 3, 4);
  erase(b, 1, "1BW2");
  expect_invalid(b, 1, index_of(b, 1, "1F2"),
                 {"missing 1BW2 (or 1B2 and 1W2)", "micro-batch 2 of stage 1", "no backward"});
}

TEST(Validate, DroppedTransferHasNoMatch) {
  Schedule s = lower(generate("1f1b", 2, 3));
  erase(s, 1, "1RECV_F2");
  expect_invalid(s, 0, index_of(s, 0, "0SEND_F2"),
                 {"0SEND_F2", "no matching 1RECV_F2 on rank 1", "every send must meet a receive"});

  Schedule t = lower(generate("1f1b", 2, 3));
  erase(t, 1, "1SEND_B0");
  expect_invalid(t, 0, index_of(t, 0, "0RECV_B0"),
                 {"0RECV_B0", "no matching 1SEND_B0", "wait forever"});
}

TEST(Validate, SwappedSendAndReceiveOnOneRank) {
  // The receive placed after the forward that needs it.
  Schedule s = lower(generate("1f1b", 2, 2));
  int recv = index_of(s, 1, "1RECV_F1"), fwd = index_of(s, 1, "1F1");
  ASSERT_EQ(recv + 1, fwd);
  std::swap(s.ranks[1][size_t(recv)], s.ranks[1][size_t(fwd)]);
  expect_invalid(s, 1, recv,
                 {"receive after use", "1F1", "1RECV_F1",
                  "later on the same rank (action " + std::to_string(fwd) + ")"});

  // The send placed before the forward that produces it.
  Schedule t = lower(generate("1f1b", 2, 2));
  int f = index_of(t, 0, "0F0"), send = index_of(t, 0, "0SEND_F0");
  std::swap(t.ranks[0][size_t(f)], t.ranks[0][size_t(send)]);
  expect_invalid(t, 0, f, {"send before compute", "0SEND_F0", "0F0"});
}

TEST(Validate, SwappedSendAndReceiveAcrossRanksIsACycle) {
  // Rank 0 waits for the gradient of micro-batch 0 before sending its activation, but
  // rank 1 needs that activation to produce the gradient: a cycle of waits.
  Schedule s = parse_text(
      "0: 0F0 0RECV_B0 0SEND_F0 0BW0\n"
      "1: 1RECV_F0 1F0 1BW0 1SEND_B0\n",
      "cycle.txt");
  expect_invalid(s, 0, 1,
                 {"deadlock", "cycle of waits between ranks 0, 1",
                  "rank 0, action 1 (0RECV_B0) waits for 1SEND_B0",
                  "rank 1, action 0 (1RECV_F0) waits for 0SEND_F0 (rank 0, action 2)"});
}

TEST(Validate, CycleOfWaitsInComputeOnlySchedule) {
  Schedule s = parse_text(
      "0: 0F0 0BW0 0F1 0BW1\n"
      "1: 1F0 1F1 1BW1 1BW0\n"
      "2: 2F1 2BW1 2F0 2BW0\n",
      "c.txt");
  // Rank 0's 0BW0 needs 1BW0, which rank 1 runs only after 1F1, which needs 0F1, which
  // rank 0 runs only after 0BW0. Rank 2 waits on the cycle without being part of it.
  expect_invalid(s, 0, 1,
                 {"deadlock", "between ranks 0, 1 ",
                  "rank 0, action 1 (0BW0) waits for 1BW0 (rank 1, action 3)",
                  "rank 1, action 1 (1F1) waits for 0F1 (rank 0, action 2)"});
}

TEST(Validate, ACycleSaysWhichRankWaitsAtTheVeryActionAskedFor) {
  // Each rank's first action waits for another rank's first: nobody has run anything.
  Schedule s = parse_text(
      "ranks: 3\nplacement: 0 1 2 0 1 2\n"
      "0: 3F0 0F0 3BW0 0BW0\n1: 1F0 4F0 4BW0 1BW0\n2: 2F0 5F0 5BW0 2BW0\n",
      "c.txt");
  const ValidationReport r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("which rank 1 cannot run: it waits itself"), std::string::npos)
      << r.message;
  EXPECT_EQ(r.message.find("which rank 1 has not reached"), std::string::npos) << r.message;
}

TEST(Validate, WBeforeItsB) {
  Schedule s = split_backward(generate("1f1b", 2, 2));
  int b = index_of(s, 0, "0B1"), w = index_of(s, 0, "0W1");
  std::swap(s.ranks[0][size_t(b)], s.ranks[0][size_t(w)]);
  expect_invalid(s, 0, b, {"W before its B", "0W1", "0B1", "(action " + std::to_string(w) + ")"});
}

TEST(Validate, BackwardBeforeForward) {
  Schedule s = generate("gpipe", 1, 2);
  std::swap(s.ranks[0][0], s.ranks[0][2]);  // 0BW0 first
  expect_invalid(s, 0, 0, {"backward before its forward", "0BW0", "0F0"});
}

TEST(Validate, ActionsOutOfPlace) {
  Schedule s = generate("1f1b", 2, 2);
  s.ranks[0].push_back(make_action(K::forward, 0, 1));  // stage 1 lives on rank 1
  expect_invalid(s, 0, int(s.ranks[0].size()) - 1, {"stage 1 lives on rank 1"});

  Schedule t = generate("1f1b", 2, 2);
  t.ranks[1][0].micro_batch = 5;
  expect_invalid(t, 1, 0, {"micro-batch 5 is out of range"});

  Schedule u = generate("1f1b", 2, 2);
  u.ranks[1][0].stage = 7;
  expect_invalid(u, 1, 0, {"stage 7 does not exist"});

  Schedule d = generate("1f1b", 2, 2);
  d.ranks[0].push_back(make_action(K::forward, 1, 0));
  expect_invalid(d, 0, int(d.ranks[0].size()) - 1, {"0F1 appears twice", "rank 0, action"});
}

TEST(Validate, TransfersOnlyAcrossRanksWithTheRightPeer) {
  Schedule s = lower(generate("zb-v", 2, 2));
  // Stages 1 and 2 share rank 1: no transfer between them.
  s.ranks[1].insert(s.ranks[1].begin() + 1, Action{K::send_activation, 0, 1, 1});
  expect_invalid(s, 1, 1, {"both live on rank 1", "no transfer is needed"});

  Schedule t = lower(generate("1f1b", 2, 2));
  int i = index_of(t, 0, "0SEND_F0");
  t.ranks[0][size_t(i)].peer = 0;
  expect_invalid(t, 0, i, {"peer 0, but the placement puts stage 1 on rank 1"});

  Schedule u = lower(generate("1f1b", 2, 2));
  u.ranks[1].push_back(Action{K::send_activation, 0, 1, 0});
  expect_invalid(u, 1, int(u.ranks[1].size()) - 1,
                 {"last stage of its direction", "no next stage"});
}

TEST(Validate, ReduceAndStep) {
  Schedule s = lower(generate("1f1b", 2, 2));
  erase(s, 1, "1REDUCE");
  expect_invalid(s, 1, -1, {"missing 1REDUCE"});

  Schedule t = lower(generate("1f1b", 2, 2));
  erase(t, 0, "STEP");
  expect_invalid(t, 0, -1, {"missing STEP on rank 0"});

  Schedule u = lower(generate("1f1b", 2, 3));
  auto& l = u.ranks[0];
  std::rotate(l.begin(), l.end() - 1, l.end());  // STEP first
  expect_invalid(u, 0, 0, {"STEP too early"});

  // A send after STEP: STEP meets every rank, so the send's peer (waiting for it before
  // its own STEP) and this rank (in STEP) would wait for each other.
  Schedule v = lower(generate("1f1b", 2, 4));
  auto& r1 = v.ranks[1];
  auto send = std::find_if(r1.rbegin(), r1.rend(),
                           [](const Action& a) { return a.kind == K::send_gradient; });
  ASSERT_NE(send, r1.rend());
  const Action moved = *send;
  r1.erase(std::next(send).base());
  r1.push_back(moved);
  expect_invalid(v, 1, int(r1.size()) - 1, {"comes after the rank's STEP", "last action"});
}

TEST(Validate, MixedTransferSchedulesMustNameEveryTransfer) {
  Schedule s = generate("1f1b", 2, 2);
  s.ranks[0].insert(s.ranks[0].begin() + 1, Action{K::send_activation, 0, 0, 1});
  ValidationReport r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("no matching 1RECV_F0"), std::string::npos) << r.to_string();
}

TEST(Validate, CheckValidThrowsInputErrorWithGrid) {
  Schedule s = split_backward(generate("1f1b", 2, 2));
  erase(s, 0, "0W0");
  try {
    check_valid(s, "my.txt");
    FAIL() << "no error";
  } catch (const baton::InputError& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("my.txt: invalid schedule: missing 0W0", 0), 0u) << m;
    EXPECT_NE(m.find("  action  rank 0"), std::string::npos) << m;
  }
}

TEST(Dependencies, RuleForComputeOnlyAndLoweredSchedules) {
  Schedule s = split_backward(generate("1f1b", 3, 2));
  DependencyGraph g(s);
  EXPECT_FALSE(g.lowered());
  auto deps_of = [&](const DependencyGraph& gr, const Schedule& sc, int r, const std::string& tok) {
    std::vector<std::string> out;
    for (int d : gr.dependencies(r, index_of(sc, r, tok))) {
      ActionRef ref = gr.ref(d);
      out.push_back(std::to_string(ref.rank) + ":" + to_token(gr.action(d)));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(deps_of(g, s, 1, "1F1"), (std::vector<std::string>{"0:0F1"}));
  EXPECT_EQ(deps_of(g, s, 1, "1B1"), (std::vector<std::string>{"1:1F1", "2:2B1"}));
  EXPECT_EQ(deps_of(g, s, 2, "2B1"), (std::vector<std::string>{"2:2F1"}));
  EXPECT_EQ(deps_of(g, s, 1, "1W1"), (std::vector<std::string>{"1:1B1"}));
  EXPECT_TRUE(deps_of(g, s, 0, "0F0").empty());

  Schedule l = lower(s);
  DependencyGraph gl(l);
  EXPECT_TRUE(gl.lowered());
  EXPECT_EQ(deps_of(gl, l, 1, "1F1"), (std::vector<std::string>{"1:1RECV_F1"}));
  EXPECT_EQ(deps_of(gl, l, 1, "1RECV_F1"), (std::vector<std::string>{"0:0SEND_F1"}));
  EXPECT_EQ(deps_of(gl, l, 1, "1B1"), (std::vector<std::string>{"1:1F1", "1:1RECV_B1"}));
  EXPECT_EQ(deps_of(gl, l, 1, "1SEND_B1"), (std::vector<std::string>{"1:1B1"}));
  EXPECT_EQ(deps_of(gl, l, 1, "1REDUCE"), (std::vector<std::string>{"1:1W0", "1:1W1"}));
  EXPECT_EQ(deps_of(gl, l, 1, "STEP"), (std::vector<std::string>{"1:1REDUCE"}));

  // A BW meets a "B" requirement; co-located stages (V turn) need no transfer.
  Schedule v = lower(generate("zb-v", 2, 1));
  DependencyGraph gv(v);
  EXPECT_EQ(deps_of(gv, v, 1, "2F0"), (std::vector<std::string>{"1:1F0"}));
  Schedule bw = generate("1f1b", 2, 1);
  DependencyGraph gb(bw);
  EXPECT_EQ(deps_of(gb, bw, 0, "0BW0"), (std::vector<std::string>{"0:0F0", "1:1BW0"}));
}

TEST(Dependencies, RunInOrderGivesATopologicalOrder) {
  Schedule s = lower(generate("dualpipev", 3, 6));
  DependencyGraph g(s);
  Progress pr = run_in_order(g);
  ASSERT_TRUE(pr.complete);
  ASSERT_EQ(int(pr.order.size()), g.num_nodes());
  std::vector<int> when(size_t(g.num_nodes()));
  for (size_t i = 0; i < pr.order.size(); ++i) when[size_t(pr.order[i])] = int(i);
  for (int n = 0; n < g.num_nodes(); ++n) {
    for (int d : g.dependencies(n)) EXPECT_LT(when[size_t(d)], when[size_t(n)]);
    ActionRef r = g.ref(n);
    if (r.index > 0) {
      EXPECT_LT(when[size_t(g.node(r.rank, r.index - 1))], when[size_t(n)]);
    }
  }
}

TEST(Schedule, TransferTagsPairSendsWithReceives) {
  Schedule s = lower(generate("zb-v", 3, 4));
  std::map<int64_t, std::vector<Action>> by_tag;
  for (const auto& list : s.ranks)
    for (const Action& a : list) {
      const int64_t tag = transfer_tag(s, a);
      if (is_transfer(a.kind)) {
        ASSERT_GE(tag, 0);
        by_tag[tag].push_back(a);
      } else {
        EXPECT_EQ(tag, -1);
      }
    }
  EXPECT_EQ(by_tag.size(),
            4u * 4 * 2);  // 4 micro-batches x 4 rank boundaries x (activation, gradient)
  for (const auto& [tag, pair] : by_tag) {
    ASSERT_EQ(pair.size(), 2u) << tag;
    EXPECT_TRUE(is_send(pair[0].kind) != is_send(pair[1].kind));
    EXPECT_EQ(pair[0].micro_batch, pair[1].micro_batch);
  }
}

TEST(Validate, RandomMutationsNeverCrashAndValidMeansRunnable) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<Schedule> bases = {lower(generate("1f1b", 3, 4)), generate("zb-v", 3, 5),
                                       lower(generate("dualpipe", 2, 4)),
                                       generate("interleaved", 2, 4, 2)};
  int valid = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Schedule s = bases[size_t(trial) % bases.size()];
    const int mutations = 1 + int(rng() % 3);
    for (int k = 0; k < mutations; ++k) {
      auto& list = s.ranks[rng() % s.ranks.size()];
      if (list.empty()) continue;
      const size_t i = rng() % list.size(), j = rng() % list.size();
      switch (rng() % 6) {
        case 0:
          list.erase(list.begin() + long(i));
          break;
        case 1:
          list.insert(list.begin() + long(j), list[i]);
          break;
        case 2:
          std::swap(list[i], list[j]);
          break;
        case 3:
          list[i].micro_batch += int(rng() % 5) - 2;
          break;
        case 4:
          list[i].stage += int(rng() % 5) - 2;
          break;
        case 5:
          list[i].kind = static_cast<ActionKind>(rng() % kNumActionKinds);
          break;
      }
    }
    ValidationReport r = validate(s);
    if (!r.ok) {
      EXPECT_FALSE(r.message.empty());
      continue;
    }
    ++valid;  // a harmless mutation (e.g. two independent actions swapped)
    DependencyGraph g(s);
    EXPECT_TRUE(run_in_order(g).complete) << to_text(s);
  }
  EXPECT_LT(valid, 400);
}
