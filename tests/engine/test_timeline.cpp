// Measured timelines: a run under a plan writes one Chrome trace (every rank a process
// row, compute and communication threads) in the simulator's format; every compute
// action of the schedule appears once, on the rank that ran it, in the schedule's order;
// and `compare_timelines` matches it action for action with the prediction.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine_harness.h"
#include "memory/file_io.h"
#include "partitioner/predict.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/trace_compare.h"

namespace baton::engine_testing {
namespace {

using schedule::ActionKind;

TEST(Timeline, MeasuredTraceHasEveryActionInOrder) {
  for (std::string name : {"zb-v", "1f1b"}) {
    Workspace ws("timeline");
    PlanSpec p;
    p.model = tiny_gpt_json();
    p.tp = {2, 2};
    p.dp = 1;
    p.schedule = name;
    auto plan = resolve(p, ws);
    RunSettings s;
    s.steps = 3;
    engine::PlanTrainOptions o = train_options(ws, s);
    o.trace_path = ws.path("trace.json");
    o.trace_steps = 1;
    run_threads(plan, o);
    schedule::Timeline t =
        schedule::from_chrome_trace(memory::read_file(o.trace_path), o.trace_path);
    ASSERT_EQ(t.num_ranks, 4);
    const schedule::Schedule lowered = schedule::lower(plan->schedule);
    for (int rank = 0; rank < 4; ++rank) {
      const int pp = plan->layout.coord(rank).pp;
      std::vector<std::string> want, got;
      for (const schedule::Action& a : lowered.ranks[size_t(pp)])
        if (schedule::is_compute(a.kind) || a.kind == ActionKind::optimizer_step)
          want.push_back(schedule::to_token(a));
      std::vector<schedule::TimelineEvent> mine;
      for (const auto& e : t.events)
        if (e.rank == rank && e.lane == 0) mine.push_back(e);
      std::sort(mine.begin(), mine.end(),
                [](const auto& a, const auto& b) { return a.start < b.start; });
      for (const auto& e : mine) {
        got.push_back(schedule::to_token(schedule::Action{e.kind, e.micro_batch, e.stage, -1}));
        EXPECT_LE(e.start, e.end);
        EXPECT_GE(e.start, -1e-3);  // the traced step starts at a barrier: time 0
      }
      EXPECT_EQ(got, want) << name << " rank " << rank;
      // Communication: a REDUCE per stage (gradients summed over tied wte's group), and
      // transfers on the communication lane.
      int reduces = 0, transfers = 0, sends = 0, recvs = 0;
      for (const auto& e : t.events)
        if (e.rank == rank && e.lane == 1) {
          reduces += e.kind == ActionKind::reduce_gradients;
          transfers += schedule::is_transfer(e.kind);
          if (!schedule::is_transfer(e.kind)) continue;
          // Sends and receives both name the world rank on the other side: TP 2 to TP 2
          // is one to one, so the peer is the same tensor-parallel rank of the other
          // pipeline rank (a receive recorded the pipeline rank before).
          ASSERT_GE(e.peer, 0) << schedule::to_token(
              schedule::Action{e.kind, e.micro_batch, e.stage, -1});
          ASSERT_LT(e.peer, 4);
          EXPECT_NE(plan->layout.coord(e.peer).pp, pp) << "rank " << rank << " peer " << e.peer;
          EXPECT_EQ(plan->layout.coord(e.peer).tp, plan->layout.coord(rank).tp)
              << "rank " << rank << " peer " << e.peer;
          (schedule::is_recv(e.kind) ? recvs : sends) += 1;
        }
      EXPECT_GT(sends, 0) << "rank " << rank;
      EXPECT_GT(recvs, 0) << "rank " << rank;
      // One time origin for the ranks sharing a clock: no receive ends before its send
      // began (each rank's own barrier exit as origin had put some there).
      for (const auto& e : t.events) {
        if (e.rank != rank || e.lane != 1 || !schedule::is_recv(e.kind)) continue;
        const ActionKind send = e.kind == ActionKind::recv_activation ? ActionKind::send_activation
                                                                      : ActionKind::send_gradient;
        bool sent_before = false;
        for (const auto& x : t.events)
          sent_before = sent_before || (x.rank == e.peer && x.peer == rank && x.kind == send &&
                                        x.micro_batch == e.micro_batch && x.start <= e.end);
        EXPECT_TRUE(sent_before) << name << ": rank " << rank << " received "
                                 << schedule::to_token(
                                        schedule::Action{e.kind, e.micro_batch, e.stage, -1})
                                 << " by " << e.end << " s, before rank " << e.peer << " sent it";
      }
      EXPECT_GT(transfers, 0) << "rank " << rank;
      EXPECT_EQ(reduces, int(plan->stages_of(pp).size())) << "rank " << rank;
    }
    // Compared with the prediction, every compute action matches.
    partitioner::CostModel model(plan->graph, partitioner::Machine{});
    partitioner::Prediction pred = partitioner::predict_step(*plan, model);
    schedule::TraceComparison c = schedule::compare_timelines(t, pred.timeline);
    EXPECT_EQ(c.unmatched_measured, 0);
    EXPECT_EQ(c.unmatched_predicted, 0);
    EXPECT_GT(c.measured_makespan, 0);
    EXPECT_GT(c.predicted_makespan, 0);
    std::printf("%s", schedule::format_comparison(c, false).c_str());
  }
}

TEST(Timeline, CompareMatchesByActionAndFirstRank) {
  using schedule::TimelineEvent;
  schedule::Timeline pred{"p", 2, 1e-3, {}};
  pred.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0, 10});
  pred.events.push_back({1, 0, ActionKind::forward, 0, 1, -1, 12, 22});
  pred.events.push_back({1, 0, ActionKind::full_backward, 0, 1, -1, 22, 42});
  schedule::Timeline meas{"m", 4, 1.0, {}};
  // Two tensor-parallel ranks per pipeline rank: ranks 0, 1 run stage 0; 2, 3 stage 1.
  meas.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0.000, 0.012});
  meas.events.push_back({1, 0, ActionKind::forward, 0, 0, -1, 0.000, 0.013});
  meas.events.push_back({2, 0, ActionKind::forward, 0, 1, -1, 0.013, 0.023});
  meas.events.push_back({3, 0, ActionKind::forward, 0, 1, -1, 0.013, 0.024});
  meas.events.push_back({2, 0, ActionKind::full_backward, 0, 1, -1, 0.023, 0.050});
  schedule::TraceComparison c = schedule::compare_timelines(meas, pred);
  ASSERT_EQ(c.actions.size(), 3u);
  for (const auto& d : c.actions) EXPECT_TRUE(d.matched);
  EXPECT_EQ(c.actions[0].measured_rank, 0);
  EXPECT_EQ(c.actions[1].measured_rank, 2);
  EXPECT_NEAR(c.actions[0].measured_end - c.actions[0].measured_start, 0.012, 1e-12);
  EXPECT_NEAR(c.predicted_makespan, 0.042, 1e-12);
  EXPECT_NEAR(c.measured_makespan, 0.050, 1e-12);
  EXPECT_EQ(c.unmatched_measured, 0);
  // A predicted action the run never did is reported, not matched.
  pred.events.push_back({0, 0, ActionKind::full_backward, 0, 0, -1, 42, 60});
  c = schedule::compare_timelines(meas, pred);
  EXPECT_EQ(c.unmatched_predicted, 1);
}

// A file with no pipeline action (another tool's trace, an empty list) or two timelines
// that share none (another plan) is refused, naming them, not reported as a 0 ms step.
TEST(Timeline, CompareRefusesTimelinesWithoutCommonActions) {
  auto error_of = [](const schedule::Timeline& m, const schedule::Timeline& p) {
    try {
      schedule::compare_timelines(m, p, "m.json", "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  schedule::Timeline pred{"p", 1, 1e-3, {}};
  pred.events.push_back({0, 0, ActionKind::forward, 0, 0, -1, 0, 10});
  schedule::Timeline empty{"e", 1, 1e-3, {}};
  EXPECT_EQ(error_of(empty, pred),
            "m.json: no pipeline action (F, B, W) in it: expected a timeline of baton train "
            "--trace, baton trace predict or baton simulate --trace");
  EXPECT_EQ(error_of(pred, empty).substr(0, 33), "p.json: no pipeline action (F, B,");
  schedule::Timeline other{"o", 1, 1e-3, {}};
  other.events.push_back({0, 0, ActionKind::backward_weight, 0, 0, -1, 0, 10});  // no F
  // (Another micro-batch count is refused before: compare_timelines checks the plan.)
  EXPECT_EQ(error_of(other, pred),
            "m.json and p.json share no action (kind, micro-batch, stage): timelines of different "
            "plans or schedules");
  EXPECT_EQ(error_of(pred, pred), "");
}

// Absurd op times (every op 4e6 s, in_step 100: each below the cost file's own limit of
// 1e9 s an op, scaled) make a step longer than a Chrome trace holds: the prediction refuses
// it, naming the cost file and its longest op time, where
// `baton trace predict` had printed a step time of many digits before the trace writer
// refused the timeline. Costs a trace holds are predicted as before.
TEST(Timeline, PredictionRefusesAStepATraceCannotHold) {
  Workspace ws("timeline-huge");
  PlanSpec p;
  p.model = tiny_gpt_json();
  p.tp = {1, 1};
  auto plan = resolve(p, ws);
  auto costs_of = [&](double seconds) {
    partitioner::MeasuredCosts c;
    c.model = plan->graph->name;
    c.in_step = 100;
    for (const stages::Node& n : plan->graph->nodes)
      c.ops[n.name] = {n.op, seconds, seconds, seconds, 0};
    return c;
  };
  const partitioner::MeasuredCosts huge = costs_of(4e6), small = costs_of(1e-6);
  partitioner::CostModel model(plan->graph, partitioner::Machine{}, &huge);
  try {
    partitioner::predict_step(*plan, model, "huge.json");
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const char* part : {"huge.json: the predicted step takes ", "beyond the 1e+09 s",
                             "its longest op time is $.ops.", " = 4e+06 s, in_step 100"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
  partitioner::CostModel fine(plan->graph, partitioner::Machine{}, &small);
  EXPECT_GT(partitioner::predict_step(*plan, fine, "small.json").step_time, 0);
}

// The loader's work on its own lane: with the last two steps traced, every rank whose
// stage reads model inputs (tokens on the first stage, targets on the last) shows a LOAD
// on the "input" thread for each micro-batch it made while recording, and a forward
// that waited for its inputs shows the wait (INPUT_WAIT) just before it, not inside it.
TEST(Timeline, InputLoadsOnTheirOwnLane) {
  Workspace ws("timeline-input");
  PlanSpec p;
  p.model = tiny_gpt_json();
  p.tp = {1, 1};
  p.dp = 1;
  p.schedule = "1f1b";
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 4;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.trace_path = ws.path("trace.json");
  o.trace_steps = 2;
  run_threads(plan, o);
  const nlohmann::json j = nlohmann::json::parse(memory::read_file(o.trace_path));
  std::map<int, int> loads;  // rank -> LOAD events
  std::map<int, std::string> input_thread;
  std::vector<nlohmann::json> waits, forwards;
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.value("tid", -1) == 2)
      input_thread[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.at("name").get<std::string>();
    if (name.rfind("LOAD", 0) == 0) {
      EXPECT_EQ(e.at("cat"), "INPUT");
      EXPECT_EQ(e.at("tid"), 2);
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      ++loads[e.at("pid").get<int>()];
    } else if (name.rfind("INPUT_WAIT", 0) == 0) {
      EXPECT_EQ(e.at("tid"), 0);
      waits.push_back(e);
    } else if (e.value("cat", "") == "F") {
      forwards.push_back(e);
    }
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ(input_thread[rank], "input") << "rank " << rank;
    // Two traced steps of 4 micro-batches: the loader made at least the second step's.
    EXPECT_GE(loads[rank], p.micro_batches) << "rank " << rank;
  }
  for (const auto& w : waits) {  // the forward of that micro-batch starts as the wait ends
    const double end = w.at("ts").get<double>() + w.at("dur").get<double>();
    bool found = false;
    for (const auto& f : forwards)
      if (f.at("pid") == w.at("pid") &&
          f.at("args").at("micro_batch") == w.at("args").at("micro_batch"))
        found |= std::abs(f.at("ts").get<double>() - end) < 50.0;  // microseconds
    EXPECT_TRUE(found) << w.dump();
  }
}

}  // namespace
}  // namespace baton::engine_testing
