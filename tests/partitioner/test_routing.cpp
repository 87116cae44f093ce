// Rank views, gradient groups and boundary routing; and one step of whole plans run
// through the engine as threads (each rank its physical graph, activations and gradients
// moved as boundary_transfers() says, gradients summed over gradient_groups()) against the
// logical graph on one thread:
// per-stage tensor-parallel degrees (broadcast and gather at the boundaries), data
// parallelism, tied embeddings across stages, interleaved and V placements.
#include <gtest/gtest.h>

#include <set>

#include "partitioner/groups.h"
#include "partitioner/routing.h"
#include "schedule/lower.h"
#include "tp_harness.h"

namespace baton::partitioner {
namespace {

using nlohmann::json;
using namespace testing;

json gpt_model() {
  return {{"type", "gpt2"},     {"name", "tiny"},   {"n_layer", 2}, {"n_head", 4},
          {"n_embd", 16},       {"n_positions", 8}, {"context", 5}, {"vocab_size", 12},
          {"resid_pdrop", 0.1}, {"attn_pdrop", 0.1}};
}
json mlp_model() {
  return {{"type", "mlp"}, {"context", 4}, {"vocab_size", 16}, {"n_embd", 8}, {"hidden", {16, 16}}};
}

ResolvedPlan plan_of(json model, int dp, json tp, const std::string& schedule, int m, int64_t b,
                     json stages, int chunks = 0, json splits = nullptr) {
  int pp = tp.is_array() ? int(tp.size()) : 0;
  int replica = 0;
  if (tp.is_array())
    for (auto& t : tp) replica += t.get<int>();
  json j = {{"version", 1},
            {"model", model},
            {"devices", dp * replica},
            {"parallel", {{"dp", dp}, {"pp", pp}, {"tp", tp}}},
            {"batch", {{"micro_batch_size", b}}},
            {"schedule", {{"name", schedule}, {"micro_batches", m}}},
            {"stages", stages}};
  if (chunks > 0) j["schedule"]["chunks"] = chunks;
  if (!splits.is_null()) j["splits"] = splits;
  Plan p = parse_plan(j, "plan.json", ".");
  return resolve_plan(p, load_plan_model(p));
}

TEST(Groups, TinyGptPp2Tp2Dp2) {
  ResolvedPlan r =
      plan_of(gpt_model(), 2, {2, 2}, "1f1b", 4, 2, {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}});
  RankView v = rank_view(r, 3);  // dp 0, pp 1, tp 1
  EXPECT_EQ(v.coord, (RankCoord{0, 1, 1}));
  EXPECT_EQ(v.tp_group, (std::vector<int>{2, 3}));
  EXPECT_EQ(v.dp_group, (std::vector<int>{3, 7}));
  ASSERT_EQ(v.stages.size(), 1u);
  EXPECT_EQ(v.stages[0].first_layer, 2);
  EXPECT_EQ(v.stages[0].last_layer, 4);
  EXPECT_EQ(v.pipeline_peers, (std::vector<int>{1}));
  std::map<std::string, std::vector<int>> groups;
  for (const GradientGroup& g : gradient_groups(r, 3)) groups[g.name] = g.ranks;
  // wte is tied: the embedding's stage holds the same block (tp index 1) on ranks 1 and 5.
  EXPECT_EQ(groups.at("wte.weight"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(groups.at("h.1.attn.c_attn.weight"), (std::vector<int>{3, 7}));
  EXPECT_EQ(groups.at("ln_f.weight"), (std::vector<int>{3, 7}));
  EXPECT_FALSE(groups.count("wpe.weight"));
}

TEST(Routing, BroadcastAndGatherBetweenDegrees) {
  // tp 2 -> 4 -> 2: ranks 0-1 | 2-5 | 6-7.
  ResolvedPlan r = plan_of(gpt_model(), 1, {2, 4, 2}, "1f1b", 3, 1,
                           {{{"layers", {0, 2}}}, {{"layers", {2, 3}}}, {{"layers", {3, 4}}}});
  auto list = [&](int rank, int stage) {
    std::vector<std::string> out;
    for (const schedule::Transfer& t : boundary_transfers(r, rank, stage))
      out.push_back(std::string(t.kind == schedule::Transfer::Kind::send ? "send " : "recv ") +
                    (t.phase == schedule::Transfer::Phase::activation ? "act " : "grad ") +
                    std::to_string(t.peer) + " " + t.value + " " + std::to_string(t.part) + "/" +
                    std::to_string(t.parts));
    return out;
  };
  // 2 -> 4, broadcast: receiver j from sender j mod 2; gradients back: gather 4 -> 2.
  EXPECT_EQ(list(0, 0),
            (std::vector<std::string>{"send act 2 h.0.add_2 0/1", "send act 4 h.0.add_2 0/1",
                                      "recv grad 2 h.0.add_2 0/2", "recv grad 4 h.0.add_2 1/2"}));
  EXPECT_EQ(list(5, 0),
            (std::vector<std::string>{"recv act 1 h.0.add_2 0/1", "send grad 1 h.0.add_2 1/2"}));
  // 4 -> 2, gather: receiver j from senders j, j + 2, in parts.
  EXPECT_EQ(list(7, 1),
            (std::vector<std::string>{"recv act 3 h.1.add_2 0/2", "recv act 5 h.1.add_2 1/2",
                                      "send grad 3 h.1.add_2 0/1", "send grad 5 h.1.add_2 0/1"}));
  EXPECT_TRUE(list(0, 1).empty());
  EXPECT_TRUE(list(6, 2).empty());  // the last stage hands on nothing
  EXPECT_EQ(schedule::part_range(10 * 4, 4, 1, 3),
            (std::pair<int64_t, int64_t>{12, 24}));  // whole rows
  EXPECT_EQ(schedule::part_range(7, 7, 1, 2),
            (std::pair<int64_t, int64_t>{3, 7}));  // fewer rows than parts
}

TEST(Routing, SplitValueCannotCrossADegreeChange) {
  // With one degree, the MLP's fc0 is split by columns and fc1 by rows, and fc0's split
  // output crosses the cut between them (rank i sends its shard to rank i). Where the
  // degree changes there, the default keeps fc0 whole; forcing its split is an error.
  json stages = {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}};
  ResolvedPlan same = plan_of(mlp_model(), 1, {2, 2}, "1f1b", 2, 2, stages);
  EXPECT_TRUE(same.sharding.values[size_t(same.graph->find_value("fc0.act"))].split);
  ResolvedPlan change = plan_of(mlp_model(), 1, {2, 1}, "1f1b", 2, 2, stages);
  EXPECT_FALSE(change.sharding.values[size_t(change.graph->find_value("fc0.act"))].split);
  try {
    plan_of(mlp_model(), 1, {2, 1}, "1f1b", 2, 2, stages, 0, {{"fc0", "column"}});
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan.json: $.parallel.tp: value 'fc0.act' is split over a tensor-parallel group of "
              "2 ranks and "
              "consumed by linear node 'fc1' (layer fc1) in a group of 1: where the degree changes "
              "between "
              "pipeline stages, the values crossing the cut must be replicated (cut elsewhere)");
  }
}

// Every message a SEND action makes is received by exactly one RECV of the peer, and both
// name it with the same tag (schedule::message_tag of the transfers the routing gives
// either side); the messages of one action to one peer have different tags.
TEST(Routing, SendAndReceiveAgreeOnEveryMessageTag) {
  ResolvedPlan r = plan_of(gpt_model(), 1, {2, 4, 2}, "1f1b", 3, 1,
                           {{{"layers", {0, 2}}}, {{"layers", {2, 3}}}, {{"layers", {3, 4}}}});
  const schedule::Schedule lowered = schedule::lower(r.schedule);
  using K = schedule::ActionKind;
  int messages = 0;
  for (int rank = 0; rank < r.layout.world(); ++rank)
    for (const schedule::Action& a : lowered.ranks[size_t(r.layout.coord(rank).pp)]) {
      if (!schedule::is_send(a.kind)) continue;
      const schedule::Crossing c = schedule::transfer_crossing(lowered, a);
      ASSERT_GE(c.boundary, 0) << schedule::to_token(a);
      // The matching RECV: the same micro-batch on the other side of the boundary.
      schedule::Action recv = a;
      recv.kind = a.kind == K::send_activation ? K::recv_activation : K::recv_gradient;
      recv.stage = a.kind == K::send_activation ? a.stage + 1 : a.stage - 1;
      std::set<std::pair<int, uint64_t>> tags;  // (peer, tag)
      for (const schedule::Transfer& t : boundary_transfers(r, rank, c.boundary)) {
        if (t.kind != schedule::Transfer::Kind::send || t.phase != c.phase) continue;
        int found = 0;
        for (const schedule::Transfer& u : boundary_transfers(r, t.peer, c.boundary))
          if (u.kind == schedule::Transfer::Kind::recv && u.phase == t.phase && u.peer == rank &&
              u.value == t.value && u.part == t.part) {
            ++found;
            EXPECT_EQ(schedule::message_tag(lowered, recv, u), schedule::message_tag(lowered, a, t))
                << schedule::to_token(a) << " from " << rank << " to " << t.peer;
          }
        EXPECT_EQ(found, 1) << schedule::to_token(a) << " from " << rank << " to " << t.peer;
        EXPECT_TRUE(tags.insert({t.peer, schedule::message_tag(lowered, a, t)}).second);
        ++messages;
      }
    }
  // Per micro-batch: 2 -> 4 broadcast (4 messages) and 4 -> 2 gather (4), gradients
  // back the same way (4 + 4).
  EXPECT_EQ(messages, 3 * 16);
}

struct PlanCase {
  std::string name;
  std::function<ResolvedPlan()> make;
};

class WholePlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(WholePlan, MatchesLogicalGraph) {
  ResolvedPlan r = GetParam().make();
  RunSpec spec;
  RunOutput got = run_plan(r, spec);
  RunSpec logical = spec;
  logical.micro_batches = r.plan.dp * r.plan.micro_batches;
  logical.samples = r.plan.micro_batch_size;
  expect_same_run(run_logical(r.graph, logical), got, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, WholePlan,
    ::testing::Values(PlanCase{"gpt_tp_2_4_2",
                               [] {
                                 return plan_of(gpt_model(), 1, {2, 4, 2}, "1f1b", 3, 2,
                                                {{{"layers", {0, 2}}},
                                                 {{"layers", {2, 3}}},
                                                 {{"layers", {3, 4}}}});
                               }},
                      PlanCase{"gpt_pp2_tp2_dp2",
                               [] {
                                 return plan_of(gpt_model(), 2, {2, 2}, "1f1b", 2, 2,
                                                {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}});
                               }},
                      PlanCase{"mlp_tp_2_1_dp2",
                               [] {
                                 return plan_of(mlp_model(), 2, {2, 1}, "gpipe", 2, 3,
                                                {{{"layers", {0, 1}}}, {{"layers", {1, 4}}}});
                               }},
                      PlanCase{"mlp_tp2_split_cut",
                               [] {
                                 return plan_of(mlp_model(), 1, {2, 2}, "1f1b", 2, 2,
                                                {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}});
                               }},
                      PlanCase{"mlp_tp_1_4",
                               [] {
                                 return plan_of(mlp_model(), 1, {1, 4}, "1f1b", 2, 2,
                                                {{{"layers", {0, 1}}}, {{"layers", {1, 4}}}});
                               }},
                      PlanCase{"gpt_interleaved",
                               [] {
                                 return plan_of(gpt_model(), 1, {1, 1}, "interleaved-1f1b", 2, 2,
                                                {{{"layers", {0, 1}}},
                                                 {{"layers", {1, 2}}},
                                                 {{"layers", {2, 3}}},
                                                 {{"layers", {3, 4}}}},
                                                2);
                               }},
                      PlanCase{"gpt_zb_v_tp2",
                               [] {
                                 return plan_of(gpt_model(), 1, {2, 2}, "zb-v", 2, 2,
                                                {{{"layers", {0, 1}}},
                                                 {{"layers", {1, 2}}},
                                                 {{"layers", {2, 3}}},
                                                 {{"layers", {3, 4}}}});
                               }},
                      PlanCase{"gpt_dualpipe",
                               [] {
                                 return plan_of(gpt_model(), 1, {1, 1}, "dualpipe", 4, 1,
                                                {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}});
                               }}),
    [](const ::testing::TestParamInfo<PlanCase>& i) { return i.param.name; });

}  // namespace
}  // namespace baton::partitioner
