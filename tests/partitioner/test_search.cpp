// Plan search and the measured cost model: the best plan fits and is what evaluation
// predicts; memory limits move the search to recompute or deeper pipelines; when nothing
// fits the closest candidate says which rank is short and by how much; the degrees,
// schedule and layer counts a user fixes are kept; measured op times replace FLOPs.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/units.h"
#include "partitioner/evaluate.h"
#include "partitioner/layout.h"
#include "partitioner/memory_model.h"
#include "partitioner/plan.h"
#include "partitioner/predict.h"
#include "partitioner/profile.h"
#include "partitioner/resolved_plan.h"
#include "partitioner/search.h"
#include "partitioner/spatial.h"
#include "schedule/simulate.h"
#include "stages/model.h"
#include "stages/shorthands.h"
#include "transport/local.h"

namespace baton::partitioner {
namespace {

using stages::Graph;

std::shared_ptr<const Graph> load_search_model(const std::string& name) {
  return std::make_shared<const Graph>(
      stages::load_model(std::string(BATON_SOURCE_DIR) + "/examples/models/" + name));
}

// A search with the degrees (0: searched), the schedule and the micro-batches per replica
// fixed, no recompute.
SearchOptions search_fixed(int devices, int dp, int pp, int tp, const std::string& schedule,
                           int micro_batches, int64_t global_batch) {
  return {.devices = devices,
          .tp = tp,
          .pp = pp,
          .dp = dp,
          .schedules = {schedule},
          .micro_batches = micro_batches,
          .global_batch = global_batch,
          .recompute = 0};
}

// With optimizer_sharding zero1 the search's data-parallel plans carry the field, and
// their peaks (the search's own, and the exact evaluation's) are lower than unsharded.
TEST(Search, KnowsTheShardedOptimizer) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  Candidate none = search_plans(g, model, o).ranked.at(0);
  o.optimizer_sharding = OptimizerSharding::zero1;
  Candidate zero = search_plans(g, model, o).ranked.at(0);
  EXPECT_EQ(zero.plan.optimizer_sharding, OptimizerSharding::zero1);
  EXPECT_EQ(none.plan.optimizer_sharding, OptimizerSharding::none);
  EXPECT_LT(zero.peak, none.peak);
  PlanEstimate en = evaluate_plan(resolve_plan(none.plan, g), model);
  PlanEstimate ez = evaluate_plan(resolve_plan(zero.plan, g), model);
  EXPECT_LT(ez.max_peak(), en.max_peak());
  // The search's saving (state of parameters used by one layer / dp) is within a few
  // percent of the exact one (it counts tied parameters whole).
  const double exact = double(en.max_peak() - ez.max_peak()),
               searched = double(none.peak - zero.peak);
  EXPECT_NEAR(searched, exact, 0.1 * exact);
}

// The search's composed peak counts what each sharding and sync mode holds per parameter
// (zero1's sharded state, zero2's part-sized gradients, local SGD's anchor and Nesterov
// momentum, a parameter server's pulls in flight): it stays an upper bound of the exact
// evaluation's peak, and its change against the unsharded, synchronous plan is the exact
// one's within 10%. zero2's W holds transient buckets, which the search bounds by two
// whole ones: there it is only an upper bound.
TEST(Search, ComposedMemoryFollowsShardingAndSync) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  auto searched_and_exact = [&](const SearchOptions& opts) {
    Candidate c = search_plans(g, model, opts).ranked.at(0);
    return std::pair<double, double>(
        double(c.peak), double(evaluate_plan(resolve_plan(c.plan, g), model).max_peak()));
  };
  const auto [base, base_exact] = searched_and_exact(o);
  struct Variant {
    const char* name;
    std::function<void(SearchOptions&)> set;
  };
  const std::vector<Variant> variants = {
      {"zero1", [](SearchOptions& v) { v.optimizer_sharding = OptimizerSharding::zero1; }},
      {"zero2", [](SearchOptions& v) { v.optimizer_sharding = OptimizerSharding::zero2; }},
      {"local-sgd average",
       [](SearchOptions& v) {
         v.dp_sync.mode = DpSync::Mode::local_sgd;
         v.dp_sync.sync_every = 4;
       }},
      {"local-sgd nesterov",
       [](SearchOptions& v) {
         v.dp_sync.mode = DpSync::Mode::local_sgd;
         v.dp_sync.sync_every = 4;
         v.dp_sync.outer = DpSync::Outer::nesterov;
       }},
      {"parameter-server s=2",
       [](SearchOptions& v) {
         v.dp_sync.mode = DpSync::Mode::parameter_server;
         v.dp_sync.max_staleness = 2;
       }},
  };
  std::map<std::string, double> peak;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    SearchOptions vo = o;
    v.set(vo);
    const auto [searched, exact] = searched_and_exact(vo);
    peak[v.name] = searched;
    EXPECT_GE(searched, exact);
    if (std::string(v.name) == "zero2") continue;
    const double want = exact - base_exact, got = searched - base;
    ASSERT_NE(want, 0);
    // The parameter server's pull posted before the oldest completes is a moment after
    // the step in the exact estimate; the search holds it all the step (a bound): 20%.
    const double near = std::string(v.name).rfind("parameter-server", 0) == 0 ? 0.2 : 0.1;
    EXPECT_NEAR(got, want, near * std::abs(want)) << "searched " << got << ", exact " << want;
  }
  // zero2 holds part-sized gradient accumulators, but the search bounds its W's
  // transient buckets by two whole ones, which for this model's 13 MB of gradients costs
  // more than the sharding saves: the bound is above zero1's by less than those buckets.
  EXPECT_LT(peak["zero2"], peak["zero1"] + 2.0 * double(EvaluateOptions{}.bucket_bytes));
  EXPECT_GT(peak["local-sgd nesterov"], peak["local-sgd average"]);
}

// The search costs each dp_sync mode's traffic: on a slow data-parallel link local SGD
// with H = 8 (its all-reduce once every 8 steps) predicts a shorter step than allreduce,
// and the plans found carry the field.
TEST(Search, ComparesDpSyncModesOnASlowLink) {
  auto g = load_search_model("gpt-config-a.json");
  Machine slow;
  slow.dp_bandwidth = 1e7;  // 10 MB/s between replicas
  CostModel model(g, slow);
  SearchOptions o = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  Candidate all = search_plans(g, model, o).ranked.at(0);
  o.dp_sync.mode = DpSync::Mode::local_sgd;
  o.dp_sync.sync_every = 8;
  Candidate local = search_plans(g, model, o).ranked.at(0);
  EXPECT_FALSE(all.plan.dp_sync.local());
  ASSERT_TRUE(local.plan.dp_sync.local());
  EXPECT_EQ(local.plan.dp_sync.sync_every, 8);
  EXPECT_LT(local.step_time, all.step_time);
  std::printf("  step time on a 10 MB/s link: allreduce %.3f ms, local-sgd H=8 %.3f ms\n",
              1e3 * all.step_time, 1e3 * local.step_time);
}

// What a plan file would refuse is not a candidate: gossip with more peers than the
// replicas leave is skipped with the reason, local SGD with a sharded optimizer and a
// synchronisation without replicas are refused up front, as are negative degrees.
TEST(Search, RefusesWhatAPlanFileWouldRefuse) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  o.dp_sync.mode = DpSync::Mode::gossip;
  o.dp_sync.peers = 5;
  const SearchResult r = search_plans(g, model, o);
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("$.dp_sync.peers: expected at most dp - 1 = 1 peers, found 5"),
            std::string::npos)
      << r.skipped[0];
  auto error_of = [&](SearchOptions s) {
    try {
      search_plans(g, model, s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SearchOptions local = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  local.dp_sync.mode = DpSync::Mode::local_sgd;
  local.optimizer_sharding = OptimizerSharding::zero1;
  EXPECT_EQ(error_of(local),
            "--dp-sync: \"local-sgd\" keeps a whole optimizer per replica; expected "
            "--optimizer-sharding none, found zero1");
  local.optimizer_sharding = OptimizerSharding::none;
  local.dp = 1;
  local.pp = 2;
  EXPECT_EQ(error_of(local),
            "--dp-sync: \"local-sgd\" synchronises data-parallel replicas, and --dp 1 has none");
  SearchOptions negative = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  negative.tp = -1;
  EXPECT_EQ(error_of(negative), "--tp: expected at least 1 (0 or absent: searched), found -1");
  negative = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  negative.keep = 0;
  EXPECT_EQ(error_of(negative), "--top: expected at least 1 plan to list, found 0");
}

// A parameter server on the same slow link: with staleness 0 the step costs zero1's, with
// staleness 2 the pull hides behind two steps of compute and the step is shorter; the
// plans found carry the field.
TEST(Search, ParameterServerStalenessOnASlowLink) {
  auto g = load_search_model("gpt-config-a.json");
  Machine slow;
  slow.dp_bandwidth = 1e7;
  CostModel model(g, slow);
  SearchOptions o;
  o.devices = 2;
  o.dp = 2;
  o.pp = 1;
  o.tp = 1;
  o.schedules = {"1f1b"};
  o.micro_batches = 2;
  o.recompute = 0;
  o.global_batch = 8;
  o.optimizer_sharding = OptimizerSharding::zero1;
  Candidate zero = search_plans(g, model, o).ranked.at(0);
  o.optimizer_sharding = OptimizerSharding::none;
  o.dp_sync.mode = DpSync::Mode::parameter_server;
  o.dp_sync.max_staleness = 0;
  Candidate ps0 = search_plans(g, model, o).ranked.at(0);
  o.dp_sync.max_staleness = 2;
  Candidate ps2 = search_plans(g, model, o).ranked.at(0);
  ASSERT_TRUE(ps2.plan.dp_sync.parameter_server());
  EXPECT_EQ(ps2.plan.dp_sync.max_staleness, 2);
  EXPECT_DOUBLE_EQ(ps0.step_time, zero.step_time);
  EXPECT_LT(ps2.step_time, ps0.step_time);
  std::printf("  step time on a 10 MB/s link: parameter server s=0 %.3f ms, s=2 %.3f ms\n",
              1e3 * ps0.step_time, 1e3 * ps2.step_time);
}

// Extra server ranks in the search (--dp-sync with ps_ranks): the plans carry them, the
// devices are still the replicas' (dp 2 on 2 devices), the replicas hold no optimizer
// state of the served parameters (a lower peak than the replicas' own servers'), and on a
// slow link two servers (each taking half the bytes) predict a shorter step than one,
// and the search's step time is the exact evaluation's.
TEST(Search, ExtraParameterServersOnASlowLink) {
  auto g = load_search_model("gpt-config-a.json");
  Machine slow;
  slow.dp_bandwidth = 1e7;
  CostModel model(g, slow);
  SearchOptions o = search_fixed(2, 2, 1, 1, "1f1b", 2, 8);
  o.dp_sync.mode = DpSync::Mode::parameter_server;
  const Candidate own = search_plans(g, model, o).ranked.at(0);
  o.dp_sync.ps_ranks = 1;
  const Candidate one = search_plans(g, model, o).ranked.at(0);
  o.dp_sync.ps_ranks = 2;
  const Candidate two = search_plans(g, model, o).ranked.at(0);
  EXPECT_EQ(two.plan.dp_sync.ps_ranks, 2);
  EXPECT_EQ(two.plan.devices, 2);
  EXPECT_NE(two.describe().find("+ 2 parameter-server ranks"), std::string::npos) << two.describe();
  // The replicas' peak: the server rank holds more than a replica now that B and W run
  // as one pass (the replicas' activations are lower).
  auto replicas_peak = [&](const Candidate& c) {
    int64_t peak = 0;
    for (const RankEstimate& r : evaluate_plan(resolve_plan(c.plan, g), model).ranks)
      if (r.rank < c.plan.devices) peak = std::max(peak, r.peak);
    return peak;
  };
  EXPECT_LT(replicas_peak(one), replicas_peak(own));
  EXPECT_LT(two.step_time, one.step_time);
  for (const Candidate* c : {&one, &two}) {
    const PlanEstimate e = evaluate_plan(resolve_plan(c->plan, g), model);
    EXPECT_NEAR(c->step_time, e.step_time, 1e-9 * e.step_time);
    EXPECT_EQ(int(e.ranks.size()), 2 + c->plan.dp_sync.ps_ranks);
  }
  std::printf(
      "  step time on a 10 MB/s link: parameter server on the replicas %.3f ms, "
      "1 server rank %.3f ms, 2 server ranks %.3f ms\n",
      1e3 * own.step_time, 1e3 * one.step_time, 1e3 * two.step_time);
}

// Extra server ranks' own memory: one server holds the parameter, summed gradient and
// optimizer state of every served parameter, more than a replica. Under a capacity the
// replicas fit in but one server does not, the search takes no plan with one server (the
// closest names the servers, and the exact evaluation agrees it does not fit), and takes
// the same plan with two servers, each holding half, whose every rank then fits.
TEST(Search, ExtraParameterServersWithinDeviceMemory) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(4, 2, 2, 1, "1f1b", 2, 4);  // each replica rank: half the layers
  o.dp_sync.mode = DpSync::Mode::parameter_server;
  o.dp_sync.ps_ranks = 2;
  const Candidate two = search_plans(g, model, o).ranked.at(0);
  o.dp_sync.ps_ranks = 1;
  const Candidate one = search_plans(g, model, o).ranked.at(0);
  EXPECT_EQ(one.peak_rank, -1);  // the server holds the most
  const PlanEstimate exact = evaluate_plan(resolve_plan(one.plan, g), model);
  int64_t server = 0;
  for (const RankEstimate& re : exact.ranks)
    if (re.layers == "(parameter server)") server = std::max(server, re.peak);
  EXPECT_GE(one.peak, server);  // the search's bound
  std::printf("  one server: %.2f MiB (search %.2f MiB); with two, the largest rank %.2f MiB\n",
              double(server) / (1 << 20), double(one.peak) / (1 << 20),
              double(two.peak) / (1 << 20));
  ASSERT_LT(two.peak, server);
  o.device_memory = (two.peak + server) / 2;
  const SearchResult over = search_plans(g, model, o);
  EXPECT_TRUE(over.ranked.empty());
  ASSERT_TRUE(over.closest.has_value());
  EXPECT_EQ(over.closest->peak_rank, -1);
  EXPECT_GT(over.closest->peak, o.device_memory);
  Plan p = one.plan;
  p.device_memory = o.device_memory;
  const PlanEstimate checked = evaluate_plan(resolve_plan(p, g), model);
  ASSERT_FALSE(checked.fits());
  EXPECT_NE(checked.problems.front().find("(parameter server) needs"), std::string::npos)
      << checked.problems.front();
  o.dp_sync.ps_ranks = 2;
  const SearchResult fits = search_plans(g, model, o);
  ASSERT_FALSE(fits.ranked.empty());
  p = fits.ranked.front().plan;
  EXPECT_EQ(p.dp_sync.ps_ranks, 2);
  const PlanEstimate e = evaluate_plan(resolve_plan(p, g), model);
  EXPECT_TRUE(e.fits());
  EXPECT_EQ(int(e.ranks.size()), 4 + 2);
  for (const RankEstimate& re : e.ranks) EXPECT_LE(re.peak, o.device_memory) << re.layers;
}

TEST(Search, BestPlanFitsAndMatchesItsEvaluation) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o;
  o.devices = 4;
  o.global_batch = 16;
  o.device_memory = 64 << 20;
  SearchResult res = search_plans(g, model, o);
  ASSERT_FALSE(res.ranked.empty());
  EXPECT_GT(res.evaluated + res.pruned, 50);
  for (size_t i = 1; i < res.ranked.size(); ++i)
    EXPECT_LE(res.ranked[i - 1].step_time, res.ranked[i].step_time);
  for (const Candidate& c : res.ranked) {
    SCOPED_TRACE(c.describe());
    ResolvedPlan r = resolve_plan(c.plan, g);
    EXPECT_EQ(r.plan.devices, 4);
    PlanEstimate e = evaluate_plan(r, model);  // exact memory
    EXPECT_TRUE(e.fits());
    EXPECT_NEAR(e.step_time, c.step_time, 1e-12 * c.step_time);
    EXPECT_LE(e.max_peak(), c.peak);  // the search's composed memory bounds the exact one
  }
  // With the ranks slowing each other and measured tensor-parallel collectives, recomputed
  // forwards cost the same in the search as in the evaluation (they were not slowed).
  Machine shared;
  shared.colocated = {{4, 1.5}};
  shared.tp_collective = {{2, {{4, 30e-6}}}};
  CostModel slowed(g, shared);
  o.recompute = 1;
  o.device_memory = 0;
  res = search_plans(g, slowed, o);
  ASSERT_FALSE(res.ranked.empty());
  for (const Candidate& c : res.ranked) {
    SCOPED_TRACE(c.describe());
    EXPECT_NEAR(evaluate_plan(resolve_plan(c.plan, g), slowed).step_time, c.step_time,
                1e-9 * c.step_time);
  }
  o.tp = 2;
  for (const Candidate& c : search_plans(g, slowed, o).ranked)
    EXPECT_NEAR(evaluate_plan(resolve_plan(c.plan, g), slowed).step_time, c.step_time,
                1e-9 * c.step_time)
        << c.describe();
}

// The search's composed peak bounds the exact evaluation's on every plan it lists, and
// closely: over the models of examples/ and a grouped-query LLaMA, 2 to 8 devices, every
// schedule, micro-batch count and recompute choice, unsharded and under zero1 and zero2.
// A loose bound would reject plans that fit. Beyond 10%, it may exceed the exact peak by
// the executor's buffers it bounds without a physical graph (a few collective windows),
// and under zero2 by a W's transient buckets (two, filling and flat).
TEST(Search, ComposedPeakBoundsTheExactOneClosely) {
  const std::string llama = std::string(BATON_SOURCE_DIR) + "/tests/fixtures/llama_gqa/config.json";
  struct Case {
    std::shared_ptr<const Graph> g;
    int64_t batch;
  };
  const std::vector<Case> cases = {{load_search_model("gpt-config-a.json"), 16},
                                   {load_search_model("tiny-gpt.json"), 16},
                                   {std::make_shared<const Graph>(stages::load_model(llama)), 8},
                                   {load_search_model("resnet-tiny.json"), 8}};
  const EvaluateOptions eo;
  int checked = 0;
  double worst = 0;
  for (const Case& c : cases)
    for (int devices : {2, 4, 8})
      for (OptimizerSharding sharding :
           {OptimizerSharding::none, OptimizerSharding::zero1, OptimizerSharding::zero2}) {
        CostModel model(c.g, Machine{});
        SearchOptions o;
        o.devices = devices;
        o.global_batch = c.batch;
        o.optimizer_sharding = sharding;
        o.keep = 12;
        const double allowed =
            1.5 * (1 << 20) +
            (sharding == OptimizerSharding::zero2 ? 2.0 * double(eo.bucket_bytes) : 0.0);
        for (const Candidate& cand : search_plans(c.g, model, o).ranked) {
          SCOPED_TRACE(c.g->name + " on " + std::to_string(devices) + ": " + cand.describe());
          const double exact =
              double(evaluate_plan(resolve_plan(cand.plan, c.g), model).max_peak());
          EXPECT_LE(exact, double(cand.peak));
          EXPECT_LE(double(cand.peak), 1.1 * exact + allowed);
          worst = std::max(worst, double(cand.peak) / exact - 1);
          ++checked;
        }
      }
  EXPECT_GT(checked, 300);
  std::printf("%d plans; the search's peak at most %.1f%% over the exact one\n", checked,
              100 * worst);
}

// The spatial split with tensor parallelism in one stage: on the tiny ResNet, 4 devices
// at tp 2 x spatial 2 give plans that resolve, run at the step time the search predicted
// and fit its composed memory bound; searched freely, the (tp, spatial) pairs are among
// the candidates.
TEST(Search, TensorParallelTimesSpatial) {
  auto g = load_search_model("resnet-tiny.json");
  CostModel model(g, Machine{});
  SearchOptions o;
  o.devices = 4;
  o.global_batch = 8;
  o.tp = 2;
  o.spatial = 2;
  o.keep = 3;
  SearchResult res = search_plans(g, model, o);
  ASSERT_FALSE(res.ranked.empty());
  for (const Candidate& c : res.ranked) {
    SCOPED_TRACE(c.describe());
    EXPECT_EQ(c.plan.tp, std::vector<int>(size_t(c.plan.pp), 2));
    EXPECT_EQ(c.plan.spatial, std::vector<int>(size_t(c.plan.pp), 2));
    ResolvedPlan r = resolve_plan(c.plan, g);
    EXPECT_EQ(r.layout.world(), 4);
    PlanEstimate e = evaluate_plan(r, model);  // exact memory, on the ranks' tile graphs
    EXPECT_NEAR(e.step_time, c.step_time, 1e-12 * c.step_time);
    EXPECT_LE(e.max_peak(), c.peak);
  }
  // The same on a host of 2 cores that the tiles share and slow (time-sliced, the
  // co-located factor) with measured exchanges, with and without recompute: the search
  // costs a tile's ranks, exchanges and recomputed forwards as the evaluation does (it
  // had counted neither the tiles nor the exchanges, nor slowed the recompute).
  Machine shared;
  shared.cores_per_host = 2;
  shared.colocated = {{2, 1.1}, {4, 2.4}};
  shared.spatial_exchange = {{2, {{4, 40e-6}}}};
  CostModel on_two_cores(g, shared);
  o.spatial = 2;
  o.tp = 1;
  for (int recompute : {0, 1}) {
    o.recompute = recompute;
    const SearchResult sliced = search_plans(g, on_two_cores, o);
    ASSERT_FALSE(sliced.ranked.empty());
    for (const Candidate& c : sliced.ranked) {
      SCOPED_TRACE(c.describe());
      const PlanEstimate e = evaluate_plan(resolve_plan(c.plan, g), on_two_cores);
      EXPECT_GT(e.time_sliced_cores, 0);
      EXPECT_NEAR(e.step_time, c.step_time, 1e-9 * c.step_time);
      const PlanEstimate alone = evaluate_plan(resolve_plan(c.plan, g), model);
      EXPECT_GT(e.step_time, alone.step_time);
    }
  }
  o.recompute = -1;
  o.tp = 0;
  o.spatial = 0;
  o.keep = 1000;
  res = search_plans(g, model, o);
  bool both = false;
  for (const Candidate& c : res.ranked)
    both = both || (c.plan.has_spatial() && c.plan.tp.front() > 1);
  EXPECT_TRUE(both);
}

TEST(Search, MemoryLimitForcesRecomputeThenNothingFits) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  // gpipe: every micro-batch in flight, recompute pays off most.
  SearchOptions o{
      .devices = 2, .pp = 2, .schedules = {"gpipe"}, .micro_batches = 8, .global_batch = 16};
  SearchResult free = search_plans(g, model, o);
  ASSERT_FALSE(free.ranked.empty());
  const Candidate& fast = free.ranked.front();
  EXPECT_FALSE(fast.plan.stages[0].recompute_all);  // recompute only costs time
  const int64_t exact = evaluate_plan(resolve_plan(fast.plan, g), model).max_peak();
  ASSERT_LT(exact, fast.peak);  // the composed peak bounds it
  // Exactly what the plan without recompute needs, below the search's bound: checked
  // exactly before it is turned away, it is still the best, listed with its exact peak.
  o.device_memory = exact;
  SearchResult just = search_plans(g, model, o);
  ASSERT_FALSE(just.ranked.empty());
  EXPECT_FALSE(just.ranked.front().plan.stages[0].recompute_all);
  EXPECT_EQ(just.ranked.front().peak, exact);
  EXPECT_GT(just.exact_checks, 0);
  // Just under it: only recompute fits.
  o.device_memory = exact - 1;
  SearchResult tight = search_plans(g, model, o);
  ASSERT_FALSE(tight.ranked.empty());
  EXPECT_TRUE(tight.ranked.front().plan.stages[0].recompute_all);
  EXPECT_LE(tight.ranked.front().peak, o.device_memory);
  // Below the parameters' own memory nothing fits; the closest says by how much.
  o.device_memory = 4 << 20;
  SearchResult none = search_plans(g, model, o);
  EXPECT_TRUE(none.ranked.empty());
  ASSERT_TRUE(none.closest.has_value());
  EXPECT_FALSE(none.closest->fits);
  EXPECT_GT(none.closest->peak, o.device_memory);
  EXPECT_NEAR(none.closest->over, double(none.closest->peak) / double(o.device_memory), 1e-12);
}

// The faster candidates (recompute off) may spend every exact check on their moves
// between stages; a recompute-on candidate over the capacity by its composed bound alone,
// which fits exactly, was then turned away and nothing fitted. Starved of checks (a
// budget of one), the search now checks it again with a fresh share and finds it; when
// nothing fits with candidates judged on the bound alone, the message says so. The
// closest named is the least over of the cuts tried.
TEST(Search, ExactBudgetSpentOnFasterCandidatesStillFindsThePlan) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o{.devices = 2,
                  .pp = 2,
                  .schedules = {"gpipe"},
                  .micro_batches = 8,
                  .global_batch = 16,
                  .recompute = 1};
  SearchResult rc = search_plans(g, model, o);
  ASSERT_FALSE(rc.ranked.empty());
  const int64_t exact = evaluate_plan(resolve_plan(rc.ranked.front().plan, g), model).max_peak();
  ASSERT_LT(exact, rc.ranked.front().peak);  // over by its bound: only the exact check fits it
  o.device_memory = exact;
  o.recompute = 0;
  ASSERT_TRUE(search_plans(g, model, o).ranked.empty());  // without recompute nothing fits
  o.recompute = -1;
  o.exact_work = int64_t(g->num_layers()) * o.devices;  // one check
  SearchResult starved = search_plans(g, model, o);
  ASSERT_FALSE(starved.ranked.empty());
  EXPECT_TRUE(starved.ranked.front().plan.stages[0].recompute_all);
  EXPECT_LE(starved.ranked.front().peak, exact);
  EXPECT_EQ(starved.bound_only, 0);
  // Under it nothing fits; with one check the retry cannot tell, and the message says so.
  o.device_memory = exact - (64 << 10);
  SearchResult none = search_plans(g, model, o);
  ASSERT_TRUE(none.ranked.empty());
  EXPECT_GT(none.bound_only, 0);
  EXPECT_NE(no_plan_message(none, o.device_memory, "").find("memory bound alone"),
            std::string::npos);
  // With the whole budget every candidate is checked: the closest is never above the
  // exact peak of the recompute plan's cut, the least of any candidate's time-optimal cut.
  o.exact_work = 0;
  SearchResult checked = search_plans(g, model, o);
  ASSERT_TRUE(checked.ranked.empty());
  EXPECT_EQ(checked.bound_only, 0);
  ASSERT_TRUE(checked.closest.has_value());
  EXPECT_LE(checked.closest->peak, exact);
  EXPECT_EQ(no_plan_message(checked, o.device_memory, "").find("memory bound alone"),
            std::string::npos);
}

// A rank holding two stages (DualPipe, the V schedules, interleaving) fits when the two
// together fit, however the cut shares its memory between them: under a capacity equal to
// the least peak of any cut, the search finds a plan (every cut enumerated, each
// evaluated exactly), where the even split of a rank's memory between its stages used
// to refuse them all.
TEST(Search, FindsTheCutThatFitsARankOfSeveralStages) {
  const std::string llama = std::string(BATON_SOURCE_DIR) + "/tests/fixtures/llama_gqa/config.json";
  const std::vector<std::shared_ptr<const Graph>> models = {
      load_search_model("gpt-config-a.json"),
      std::make_shared<const Graph>(stages::load_model(llama))};
  int cases = 0;
  for (const auto& g : models) {
    CostModel model(g, Machine{});
    const int L = g->num_layers();
    for (const std::string schedule : {"dualpipe", "dualpipev", "zb-v", "interleaved-1f1b"})
      for (int m : {4, 8}) {
        SearchOptions o = search_fixed(2, 1, 2, 1, schedule, m, 8);
        const int K = schedule == "dualpipe" ? 2 : 4;
        int64_t least = INT64_MAX;
        std::vector<int> counts(size_t(K), 1);
        std::function<void(int, int)> each_cut = [&](int k, int left) {
          if (k + 1 == K) {
            counts[size_t(k)] = left;
            o.layers_per_stage = counts;
            const SearchResult r = search_plans(g, model, o);
            ASSERT_EQ(r.ranked.size(), 1u);
            least =
                std::min(least, evaluate_plan(resolve_plan(r.ranked[0].plan, g), model).max_peak());
            return;
          }
          for (int n = 1; n <= left - (K - 1 - k); ++n) {
            counts[size_t(k)] = n;
            each_cut(k + 1, left - n);
          }
        };
        each_cut(0, L);
        SCOPED_TRACE(g->name + ", " + schedule + ", " + std::to_string(m) + " micro-batches, " +
                     memory::format_bytes(double(least)));
        o.layers_per_stage.clear();
        o.device_memory = least;
        const SearchResult r = search_plans(g, model, o);
        ASSERT_EQ(r.ranked.size(), 1u);
        EXPECT_LE(evaluate_plan(resolve_plan(r.ranked[0].plan, g), model).max_peak(), least);
        ++cases;
      }
  }
  EXPECT_EQ(cases, 16);
}

// A model without batch norm takes micro-batches of any size: the check for batch
// norm's one value per channel had overflowed past 4 samples and skipped every larger
// micro-batch, blaming a batch norm the model does not have.
TEST(Search, LargeMicroBatchesWithoutBatchNorm) {
  auto g = load_search_model("tiny-gpt.json");
  CostModel model(g, Machine{});
  SearchResult one = search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", 1, 64));
  ASSERT_EQ(one.ranked.size(), 1u) << (one.skipped.empty() ? "" : one.skipped[0]);
  EXPECT_EQ(one.ranked[0].plan.micro_batch_size, 64);
  SearchOptions o = search_fixed(1, 1, 1, 1, "1f1b", 0, 64);
  o.keep = 16;  // every micro-batch size listed (equal steps rank by the smaller peak)
  SearchResult all = search_plans(g, model, o);
  std::set<int64_t> sizes;
  for (const Candidate& c : all.ranked) sizes.insert(c.plan.micro_batch_size);
  EXPECT_TRUE(sizes.count(64) && sizes.count(8)) << all.ranked.size() << " candidates";
  for (const std::string& reason : all.skipped)
    EXPECT_EQ(reason.find("batch norm"), std::string::npos) << reason;
}

// Options that rule out every candidate say why (docs/partitioner.md promises the first
// reason): a schedule needing more stages than the model has layers, and a spatial split
// of a model without images, had returned with no reason ("no plan matches the options").
TEST(Search, OptionsThatMatchNothingSayWhy) {
  auto g = load_search_model("tiny-gpt.json");
  CostModel model(g, Machine{});
  SearchResult r = search_plans(g, model, search_fixed(4, 1, 4, 1, "zb-v", 0, 8));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_EQ(r.skipped[0], "zb-v on 4 ranks: 8 stages, but the model has " +
                              std::to_string(g->num_layers()) +
                              " layers (a stage holds at least one)");
  SearchOptions o = search_fixed(2, 1, 1, 1, "1f1b", 0, 8);
  o.spatial = 2;
  r = search_plans(g, model, o);
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_EQ(r.skipped[0], "spatial 2: the model has no image input to tile");
  // More devices than a plan may have ranks are refused before searching.
  try {
    search_plans(g, model, search_fixed(kMaxWorld + 1, 0, 0, 0, "1f1b", 0, 8));
    ADD_FAILURE() << "a search over 2^20 + 1 devices ran";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--devices: expected from 1 to 1048576 devices, found 1048577");
  }
}

TEST(Search, KeepsWhatTheUserFixes) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(8, 0, 2, 2, "zb-h1", 4, 16);
  o.layers_per_stage = {2, 4};
  SearchResult res = search_plans(g, model, o);
  ASSERT_FALSE(res.ranked.empty());
  for (const Candidate& c : res.ranked) {
    EXPECT_EQ(c.plan.tp, (std::vector<int>{2, 2}));
    EXPECT_EQ(c.plan.pp, 2);
    EXPECT_EQ(c.plan.dp, 2);
    EXPECT_EQ(c.plan.schedule, "zb-h1");
    EXPECT_EQ(c.plan.micro_batches, 4);
    EXPECT_EQ(c.plan.micro_batch_size, 2);
    EXPECT_EQ(c.plan.stages[0].last_layer, 2);
    EXPECT_FALSE(c.plan.stages[0].recompute_all);
  }
  EXPECT_EQ(res.evaluated, 1);
}

// The best plan does not hang on how many are listed: ties in the step fall to the lower
// peak, then the description, and which candidates get their layer moves is not --top's.
TEST(Search, BestPlanDoesNotDependOnTop) {
  stages::Gpt2Config c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.n_positions = 64;
  c.vocab_size = 256;
  auto g = std::make_shared<const Graph>(stages::load_model_json(c.to_json(), "w2-gpt"));
  CostModel model(g, Machine{});
  SearchOptions o{.devices = 3, .global_batch = 64};
  std::vector<Candidate> first;
  for (int keep : {1, 5, 400}) {
    o.keep = keep;
    const SearchResult r = search_plans(g, model, o);
    ASSERT_FALSE(r.ranked.empty());
    first.push_back(r.ranked.front());
    for (size_t i = 1; i < r.ranked.size(); ++i)
      EXPECT_LE(r.ranked[i - 1].step_time, r.ranked[i].step_time * (1 + 1e-9)) << keep;
  }
  for (const Candidate& f : first) {
    EXPECT_EQ(f.describe(), first[0].describe());
    EXPECT_EQ(f.peak, first[0].peak);
    EXPECT_EQ(f.step_time, first[0].step_time);
  }
}

// A longer list spends the search's budgets (exact memory checks) on runners-up: with 50
// listed, a memory-bound search had written a plan 0.3% slower than with 1 (35.285 ms
// against 35.174). The best plan of a longer list is never slower.
TEST(Search, ALongerListNeverWritesASlowerPlan) {
  auto g = std::make_shared<const Graph>(stages::load_model_json({{"type", "llama"},
                                                                  {"name", "l"},
                                                                  {"hidden_size", 128},
                                                                  {"intermediate_size", 256},
                                                                  {"num_hidden_layers", 4},
                                                                  {"num_attention_heads", 4},
                                                                  {"num_key_value_heads", 2},
                                                                  {"max_position_embeddings", 128},
                                                                  {"vocab_size", 256},
                                                                  {"context", 64}},
                                                                 "llama"));
  CostModel model(g, Machine{});
  SearchOptions o{.devices = 8, .device_memory = 7 << 20, .global_batch = 48};
  std::vector<double> best;
  for (int keep : {1, 8, 50}) {
    o.keep = keep;
    const SearchResult r = search_plans(g, model, o);
    ASSERT_FALSE(r.ranked.empty()) << keep;
    EXPECT_LE(int(r.ranked.size()), keep);
    for (const Candidate& c : r.ranked) EXPECT_LE(c.peak, o.device_memory) << c.describe();
    best.push_back(r.ranked.front().step_time);
  }
  EXPECT_EQ(best[0], best[1]);
  EXPECT_LE(best[2], best[0] * (1 + 1e-12));
}

// --chunks: interleaved-1F1B with v model chunks per pipeline rank (it was 2 whatever the
// layer counts given), recorded in the plan as schedule.chunks.
TEST(Search, InterleavedTakesTheChunksAsked) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(2, 1, 2, 1, "interleaved-1f1b", 4, 8);
  o.chunks = 3;
  const SearchResult r = search_plans(g, model, o);
  ASSERT_FALSE(r.ranked.empty());
  const Plan& p = r.ranked.front().plan;
  EXPECT_EQ(p.chunks, 3);
  EXPECT_EQ(p.stages.size(), 6u);
  EXPECT_EQ(plan_to_json(p)["schedule"]["chunks"], 3);
  EXPECT_EQ(resolve_plan(p, g).schedule.num_stages(), 6);
  // Layer counts for 6 chunks without --chunks 3: skipped, saying how to get them.
  o.chunks = 0;
  o.layers_per_stage = {1, 1, 1, 1, 1, 1};
  const SearchResult two = search_plans(g, model, o);
  EXPECT_TRUE(two.ranked.empty());
  bool said = false;
  for (const std::string& why : two.skipped)
    said = said || why.find("6 layer counts were given (--chunks 3 gives each rank that many)") !=
                       std::string::npos;
  EXPECT_TRUE(said);
}

// On one pipeline rank with replicas, two chunks (two stages on the rank) let the later
// chunk's reduction overlap the earlier one's backward: the search tries them.
TEST(Search, TriesTwoChunksOnOnePipelineRankWithReplicas) {
  auto g = load_search_model("gpt-config-a.json");
  CostModel model(g, Machine{});
  SearchOptions o{.devices = 2, .pp = 1, .dp = 2, .global_batch = 8, .keep = 400};
  const SearchResult r = search_plans(g, model, o);
  std::set<std::string> names;
  for (const Candidate& cand : r.ranked) names.insert(cand.plan.schedule);
  EXPECT_TRUE(names.count("1f1b"));
  EXPECT_GT(names.size(), 1u) << "only 1F1B at pp 1";
  // Without replicas every schedule is 1F1B on one rank: only it is tried.
  o.devices = 1;
  o.dp = 1;
  names.clear();
  for (const Candidate& cand : search_plans(g, model, o).ranked) names.insert(cand.plan.schedule);
  EXPECT_EQ(names, std::set<std::string>{"1f1b"});
}

// More ranks per host than the plan has say nothing 0 does not: refused, naming the flag.
TEST(Search, RefusesMoreRanksPerHostThanRanks) {
  auto g = load_search_model("gpt-config-a.json");
  Machine m;
  m.ranks_per_host = 5;
  m.cores_per_host = 2;
  CostModel model(g, m);
  SearchOptions o{.devices = 4, .global_batch = 8};
  try {
    search_plans(g, model, o);
    FAIL() << "accepted 5 ranks per host for 4 devices";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--ranks-per-host"), std::string::npos) << e.what();
  }
  m.ranks_per_host = 4;
  CostModel fits(g, m);
  EXPECT_FALSE(search_plans(g, fits, o).ranked.empty());
}

TEST(Search, CutBalancesEmbeddingAndHeadByTheirCost) {
  // A large vocabulary makes the LM head (and its cross-entropy) heavy: the last stage
  // takes fewer blocks than the first.
  stages::Gpt2Config c;
  c.n_layer = 8;
  c.n_head = 4;
  c.n_embd = 128;
  c.n_positions = 64;
  c.vocab_size = 16384;
  auto g = std::make_shared<const Graph>(stages::load_model_json(c.to_json(), "big-vocab"));
  CostModel model(g, Machine{});
  SearchOptions o = search_fixed(2, 0, 2, 1, "1f1b", 8, 8);
  SearchResult res = search_plans(g, model, o);
  ASSERT_FALSE(res.ranked.empty());
  const Plan& p = res.ranked.front().plan;
  int first_blocks = p.stages[0].last_layer - 1, last_blocks = 8 - first_blocks;
  EXPECT_GT(first_blocks, last_blocks) << "stage 0 holds [0, " << p.stages[0].last_layer << ")";
}

// The quickest profile: one timed run per op, no warm-up, at micro-batches of `batch`;
// the whole-pass calibration only when asked.
ProfileOptions quick_profile(int64_t batch, bool in_step) {
  ProfileOptions po;
  po.batch = batch;
  po.repeats = 1;
  po.warmup = 0;
  po.in_step = in_step;
  return po;
}

// The tiny GPT's PP2 x TP2 x DP2 example plan (8 ranks), read and resolved.
struct TinyPlan {
  Plan plan;
  std::shared_ptr<const stages::Graph> graph;
  ResolvedPlan resolved;
};
TinyPlan tiny_pp2_tp2_dp2() {
  Plan plan =
      read_plan(std::string(BATON_SOURCE_DIR) + "/examples/plans/tiny-gpt-pp2-tp2-dp2.json");
  auto g = load_plan_model(plan);
  ResolvedPlan r = resolve_plan(plan, g);
  return {std::move(plan), std::move(g), std::move(r)};
}

// Batches far beyond any plan: the divisors are found in O(sqrt n) (a loop to n had run
// for minutes, and past 2^31 narrowed a count to 0 and died of a division by it), and
// what the search proposes stays within the plan format's limits (micro-batches and
// their samples at most 2^24 each); a batch no plan can hold says why.
TEST(Search, HugeBatchesFinishWithinThePlanFormat) {
  auto g = load_search_model("tiny-gpt.json");
  CostModel model(g, Machine{});
  const auto t0 = std::chrono::steady_clock::now();
  SearchOptions o = search_fixed(1, 1, 1, 1, "1f1b", 0, int64_t(1) << 32);
  o.model_path = std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json";
  SearchResult r = search_plans(g, model, o);
  ASSERT_FALSE(r.ranked.empty()) << (r.skipped.empty() ? "" : r.skipped[0]);
  for (const Candidate& c : r.ranked) {
    EXPECT_LE(c.plan.micro_batch_size, kMaxPlanCount) << c.describe();
    EXPECT_LE(c.plan.micro_batches, kMaxPlanCount) << c.describe();
  }
  // What it writes reads back.
  const std::string path = testing::TempDir() + "huge_batch_plan.json";
  write_plan(r.ranked[0].plan, path);
  EXPECT_EQ(read_plan(path).global_batch, int64_t(1) << 32);
  r = search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", 0, INT64_MAX));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("9223372036854775807 samples"), std::string::npos) << r.skipped[0];
  EXPECT_NE(r.skipped[0].find("the plan format's limit"), std::string::npos) << r.skipped[0];
  // One micro-batch of 2^25 samples is more than a plan may say.
  r = search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", 1, int64_t(1) << 25));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("expected micro-batches of at most 16777216 samples"),
            std::string::npos)
      << r.skipped[0];
  // Past 2^20 micro-batches (the generators' limit) of 2^24 samples, no --micro-batches
  // can help, and the reason says so rather than pointing at that flag.
  r = search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", 0, int64_t(1) << 45));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("more than 1048576 (the schedules' limit)"), std::string::npos)
      << r.skipped[0];
  try {
    search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", (1 << 20) + 1, 1 << 21));
    ADD_FAILURE() << "searched";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "--micro-batches: expected at most 1048576 (the schedules' limit)"),
              std::string::npos)
        << e.what();
  }
  // Left open, the micro-batches split it within the limit.
  r = search_plans(g, model, search_fixed(1, 1, 1, 1, "1f1b", 0, int64_t(1) << 25));
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_LE(r.ranked[0].plan.micro_batch_size, kMaxPlanCount);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
}

// A micro-batch beyond what the memory estimate's int64 bytes count (LLaMA 405B's shape
// at 2^24 samples) is refused naming the plan's field, where its sums had wrapped to a
// negative activation size ("costs: activation_bytes[0]", a field no plan has) or, under
// tensor parallelism, to a peak just below 2^63 that fit a large enough capacity.
TEST(Evaluate, MicroBatchesBeyondWhatTheEstimateCountsAreRefused) {
  const std::string dir = testing::TempDir();
  {
    FILE* f = std::fopen((dir + "l405.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"type": "llama", "name": "llama405b", "hidden_size": 16384,
      "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
      "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
      "context": 131072, "rope_theta": 500000})",
               f);
    std::fclose(f);
  }
  auto check = [&](int tp, int64_t samples) {
    const std::string path = dir + "ov_" + std::to_string(tp) + ".json";
    FILE* f = std::fopen(path.c_str(), "w");
    const std::string b = std::to_string(samples);
    std::fputs(("{\"version\": 1, \"model\": \"l405.json\", \"devices\": " + std::to_string(tp) +
                ", \"parallel\": {\"dp\": 1, \"pp\": 1, \"tp\": " + std::to_string(tp) +
                "}, \"batch\": {\"micro_batch_size\": " + b + ", \"global\": " + b +
                "}, \"schedule\": {\"name\": \"1f1b\", \"micro_batches\": 1}, "
                "\"device_memory\": \"8388607TiB\"}")
                   .c_str(),
               f);
    std::fclose(f);
    Plan plan = read_plan(path);
    auto g = load_plan_model(plan);
    CostModel model(g, Machine{});
    return evaluate_plan(resolve_plan(plan, g), model);
  };
  for (int tp : {1, 8}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    try {
      check(tp, int64_t(1) << 24);
      ADD_FAILURE() << "evaluated";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("$.batch.micro_batch_size: micro-batches of 16777216 samples of "
                          "model llama405b"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("more than the 2^62 bytes"), std::string::npos) << what;
    }
  }
  // One sample is counted (6 TiB a rank: over the capacity by nothing, under tp 8).
  const PlanEstimate one = check(8, 1);
  EXPECT_GT(one.max_peak(), int64_t(4) << 40);
  EXPECT_TRUE(one.fits());
  // The search skips such micro-batches, saying why.
  auto g = std::make_shared<const Graph>(stages::load_model(dir + "l405.json"));
  CostModel model(g, Machine{});
  SearchResult r = search_plans(g, model, search_fixed(8, 1, 1, 8, "1f1b", 1, int64_t(1) << 24));
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("more than the 2^62 bytes the memory estimate counts"),
            std::string::npos)
      << r.skipped[0];
}

// A rank holding one stage fits when its whole peak does, the executor's buffers
// included, which the cut under its capacity leaves out: under a capacity equal to the
// least exact peak of any cut, the search finds a plan, where it used to take the cut
// that fit by the cut's count, find it over by the buffers and report that no plan fits
// (LLaMA-70B on 128 devices of 16 GiB, scaled down: cases that had failed so).
TEST(Search, FindsTheCutThatFitsWithTheExecutorsBuffers) {
  const std::string llama = std::string(BATON_SOURCE_DIR) + "/tests/fixtures/llama_gqa/config.json";
  struct Case {
    std::shared_ptr<const Graph> g;
    int pp;
    std::string schedule;
    int micro_batches, recompute;
  };
  const auto a = load_search_model("gpt-config-a.json"), b = load_search_model("gpt-config-b.json");
  const auto l = std::make_shared<const Graph>(stages::load_model(llama));
  for (const Case& c :
       {Case{a, 3, "1f1b", 2, 1}, Case{a, 5, "gpipe", 4, 1}, Case{b, 2, "1f1b", 4, 0},
        Case{b, 5, "1f1b", 2, 0}, Case{b, 3, "gpipe", 2, 1}, Case{l, 3, "1f1b", 8, 1}}) {
    CostModel model(c.g, Machine{});
    SearchOptions o = search_fixed(c.pp, 1, c.pp, 1, c.schedule, c.micro_batches, 8);
    o.recompute = c.recompute;
    int64_t least = INT64_MAX;
    std::vector<int> counts(size_t(c.pp), 1);
    std::function<void(int, int)> each_cut = [&](int k, int left) {
      if (k + 1 == c.pp) {
        counts[size_t(k)] = left;
        o.layers_per_stage = counts;
        const SearchResult r = search_plans(c.g, model, o);
        ASSERT_EQ(r.ranked.size(), 1u);
        least =
            std::min(least, evaluate_plan(resolve_plan(r.ranked[0].plan, c.g), model).max_peak());
        return;
      }
      for (int n = 1; n <= left - (c.pp - 1 - k); ++n) {
        counts[size_t(k)] = n;
        each_cut(k + 1, left - n);
      }
    };
    each_cut(0, c.g->num_layers());
    SCOPED_TRACE(c.g->name + ", pp " + std::to_string(c.pp) + ", " + c.schedule + ", " +
                 std::to_string(c.micro_batches) + " micro-batches, recompute " +
                 std::to_string(c.recompute) + ", " + memory::format_bytes(double(least)));
    o.layers_per_stage.clear();
    o.device_memory = least;
    const SearchResult r = search_plans(c.g, model, o);
    ASSERT_EQ(r.ranked.size(), 1u) << no_plan_message(r, least, "");
    EXPECT_LE(evaluate_plan(resolve_plan(r.ranked[0].plan, c.g), model).max_peak(), least);
  }
}

// The cut minimises the slowest stage, but under 1F1B the last stage's work sits in the
// fill and the drain too: the plan listed is no slower than any cut a layer off it (a
// final descent on the simulated step time), in cases where the cut alone was up to 7%
// slower than a neighbour.
TEST(Search, NoNeighbouringCutIsFaster) {
  const auto a = load_search_model("gpt-config-a.json"), b = load_search_model("gpt-config-b.json");
  struct Case {
    std::shared_ptr<const Graph> g;
    int pp;
    std::string schedule;
    int micro_batches, recompute;
  };
  for (const Case& c : {Case{a, 3, "1f1b", 4, 0}, Case{a, 3, "1f1b", 8, 1},
                        Case{b, 2, "1f1b", 2, 0}, Case{b, 2, "zb-h1", 1, 1}}) {
    SCOPED_TRACE(c.g->name + ", pp " + std::to_string(c.pp) + ", " + c.schedule + ", " +
                 std::to_string(c.micro_batches) + " micro-batches");
    CostModel model(c.g, Machine{});
    SearchOptions o = search_fixed(c.pp, 1, c.pp, 1, c.schedule, c.micro_batches, 8);
    o.recompute = c.recompute;
    const SearchResult r = search_plans(c.g, model, o);
    ASSERT_EQ(r.ranked.size(), 1u);
    const Candidate& best = r.ranked[0];
    std::vector<int> bounds;
    for (const PlanStage& st : best.plan.stages) bounds.push_back(st.first_layer);
    bounds.push_back(best.plan.stages.back().last_layer);
    for (size_t k = 1; k + 1 < bounds.size(); ++k)
      for (int d : {-1, 1}) {
        std::vector<int> at = bounds;
        at[k] += d;
        if (at[k] <= at[k - 1] || at[k] >= at[k + 1]) continue;
        SearchOptions fixed = o;
        for (size_t i = 0; i + 1 < at.size(); ++i)
          fixed.layers_per_stage.push_back(at[i + 1] - at[i]);
        const SearchResult n = search_plans(c.g, model, fixed);
        ASSERT_EQ(n.ranked.size(), 1u);
        EXPECT_GE(n.ranked[0].step_time, best.step_time * (1 - 1e-9))
            << "boundary " << k << " moved by " << d;
      }
  }
}

// DualPipe holds each chunk on two pipeline ranks, one per direction, and the two copies
// sum their gradients every step as replicas do: each stage's reduction is the all-reduce
// of its chunk's gradients over two ranks (the tiny GPT's tied embedding adds its own, the
// same in both schedules), where 1F1B's chunks, held once, reduce only the tied one.
TEST(Evaluate, DualPipeChunksSumTheirGradientsAcrossTheirTwoRanks) {
  nlohmann::json j = {{"version", 1},
                      {"model", std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json"},
                      {"devices", 2},
                      {"parallel", {{"dp", 1}, {"pp", 2}, {"tp", 1}}},
                      {"batch", {{"micro_batch_size", 2}, {"global", 8}}},
                      {"schedule", {{"name", "dualpipe"}, {"micro_batches", 4}}},
                      {"stages", {{{"layers", {"embed", "h.0"}}}, {{"layers", {"h.1", "head"}}}}}};
  auto costs_of = [&](const std::string& schedule) {
    j["schedule"]["name"] = schedule;
    Plan plan = parse_plan(j, "plan.json", ".");
    auto g = load_plan_model(plan);
    ResolvedPlan r = resolve_plan(plan, g);
    CostModel model(g, Machine{}, nullptr);
    const CostTable& t = model.table_for(r.sharding, plan.micro_batch_size);
    return std::tuple{schedule_costs(r, t, model.machine()), r, t};
  };
  const auto [dual, rd, td] = costs_of("dualpipe");
  const auto [once, ro, to] = costs_of("1f1b");
  ASSERT_EQ(dual.reduce.size(), 4U);  // two chunks, each in both directions
  const Machine m;
  for (size_t s = 0; s < dual.reduce.size(); ++s) {
    const int k = rd.chunk_of_stage[s];
    const double own =
        all_reduce_time(double(td.param_bytes(rd.chunk_first[size_t(k)], rd.chunk_last[size_t(k)])),
                        2, m.dp_bandwidth, m.dp_latency);
    EXPECT_GT(own, 0.0);
    EXPECT_NEAR(dual.reduce[s], once.reduce[size_t(k)] + own, 1e-12 * own) << "stage " << s;
  }
}

// Each pipeline rank steps its own layers' parameters: the rank holding more of them
// steps for longer, and the predicted step (the slowest rank's) is the largest of them.
// Post-validated, each rank first copies what it overwrites: every rank's step is longer.
TEST(Evaluate, OptimizerStepTimePerRank) {
  nlohmann::json j = {{"version", 1},
                      {"model", std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json"},
                      {"devices", 2},
                      {"parallel", {{"dp", 1}, {"pp", 2}, {"tp", 1}}},
                      {"batch", {{"micro_batch_size", 2}, {"global", 8}}},
                      {"schedule", {{"name", "1f1b"}, {"micro_batches", 4}}},
                      {"stages", {{{"layers", {"embed"}}}, {{"layers", {"h.0", "h.1", "head"}}}}}};
  auto costs_of = [&](const char* step) {
    j["optimizer_step"] = step;
    Plan plan = parse_plan(j, "plan.json", ".");
    auto g = load_plan_model(plan);
    ResolvedPlan r = resolve_plan(plan, g);
    CostModel model(g, Machine{}, nullptr);
    return schedule_costs(r, model.table_for(r.sharding, plan.micro_batch_size), model.machine());
  };
  const schedule::Costs sync = costs_of("synchronous"), post = costs_of("post-validated");
  ASSERT_EQ(sync.optimizer_step_rank.size(), 2U);
  EXPECT_GT(sync.optimizer_step_rank[1], sync.optimizer_step_rank[0]);
  EXPECT_GT(sync.optimizer_step_rank[0], 0.0);
  EXPECT_DOUBLE_EQ(sync.optimizer_step, sync.optimizer_step_rank[1]);
  for (size_t r = 0; r < 2; ++r)
    EXPECT_GT(post.optimizer_step_rank[r], sync.optimizer_step_rank[r]) << r;
  EXPECT_DOUBLE_EQ(post.optimizer_step, post.optimizer_step_rank[1]);
}

// A send is held until the transport reports it done, which a later receive from the same
// peer shows when the peer sent that message after taking the send: the first stage's B
// at one micro-batch (1F1B) or two (GPipe) waits for the gradient its peer sends only after
// taking the stage's last activation, so nothing sent is held during the B; the estimate
// had counted that activation (6% over at 2048 tokens). Under 1F1B at two micro-batches
// the first B's gradient left before the second activation arrived: that one stays
// counted. The loader's micro-batches are counted per action: three at the first F of
// two micro-batches (the step's second and the next step's two), two from the second on.
// (Micro-batches of 8: 128 KiB activations, sent by rendezvous.)
TEST(Evaluate, SendsAnsweredBeforeTheNextComputeAreDone) {
  auto posted = [](const std::string& schedule, int micro_batches) {
    nlohmann::json j = {
        {"version", 1},
        {"model", std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json"},
        {"devices", 2},
        {"parallel", {{"pp", 2}}},
        {"batch", {{"micro_batch_size", 8}}},
        {"schedule", {{"name", schedule}, {"micro_batches", micro_batches}}},
        {"stages", {{{"layers", {"embed", "h.0"}}}, {{"layers", {"h.1", "head"}}}}}};
    Plan plan = parse_plan(j, "plan.json", ".");
    auto g = load_plan_model(plan);
    const ResolvedPlan r = resolve_plan(plan, g);
    return rank_buffers(r, 0, *physical_graph(r, 0));
  };
  // One micro-batch: F0 SEND_F0 RECV_B0 BW0; at F0 only the gradient's receive buffer.
  const RankBuffers one = posted("1f1b", 1);
  ASSERT_EQ(one.posted.size(), 2u);
  const int64_t a = one.posted[0];  // one boundary tensor
  EXPECT_GT(a, 0);
  EXPECT_EQ(one.posted[1], 0);
  // GPipe: F0 SEND_F0 F1 SEND_F1 RECV_B0 BW0 RECV_B1 BW1 (the peer's B0 after both F).
  const RankBuffers gpipe = posted("gpipe", 2);
  ASSERT_EQ(gpipe.posted.size(), 4u);
  // A micro-batch of int32 token ids ([8, 64]); the loader holds two throughout, and the
  // unread targets of the one it makes.
  const int64_t tokens = 8 * 64 * 4;
  EXPECT_EQ(gpipe.loader, 3 * tokens);
  EXPECT_EQ(gpipe.posted, (std::vector<int64_t>{2 * a + tokens, 3 * a, a, 0}));
  // 1F1B: F0 SEND_F0 F1 SEND_F1 RECV_B0 BW0 RECV_B1 BW1 (the peer's B0 before its F1).
  const RankBuffers f1b1 = posted("1f1b", 2);
  EXPECT_EQ(f1b1.loader, gpipe.loader);
  EXPECT_EQ(f1b1.posted, (std::vector<int64_t>{2 * a + tokens, 3 * a, 2 * a, 0}));
}

// A rendezvous send is taken only once its receiver has posted the receive, recv_ahead
// receives ahead of the one it waits for; the sender knows it posted once a message
// arrives that the receiver sent after posting. A first stage of only the embedding
// (1F1B, PP 4, 4 micro-batches) makes its four Fs before any message arrives, so each
// send is held until the gradient that answers it: at F3, F0 to F2 and the two receives
// posted (GPT-2 124M so had been one 384 KiB activation under its measured peak, the
// estimate holding a send through the next compute action only). F3 is known posted by
// the receive of B0 and held through BW0. Sends under UCX's rendezvous size are done at
// once (micro-batches of 2: 32 KiB): none held.
TEST(Evaluate, SendsHeldUntilTheirReceiveIsKnownPosted) {
  auto buffers = [](int64_t micro_batch_size) {
    nlohmann::json j = {{"version", 1},
                        {"model", std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json"},
                        {"devices", 4},
                        {"parallel", {{"pp", 4}}},
                        {"batch", {{"micro_batch_size", micro_batch_size}}},
                        {"schedule", {{"name", "1f1b"}, {"micro_batches", 4}}},
                        {"stages",
                         {{{"layers", {"embed"}}},
                          {{"layers", {"h.0"}}},
                          {{"layers", {"h.1"}}},
                          {{"layers", {"head"}}}}}};
    Plan plan = parse_plan(j, "plan.json", ".");
    auto g = load_plan_model(plan);
    const ResolvedPlan r = resolve_plan(plan, g);
    return rank_buffers(r, 0, *physical_graph(r, 0));
  };
  // F0 SEND_F0 F1 SEND_F1 F2 SEND_F2 F3 SEND_F3 RECV_B0 BW0 RECV_B1 BW1 ...; the loader
  // holds four micro-batches throughout.
  const RankBuffers big = buffers(8);
  ASSERT_EQ(big.posted.size(), 8u);
  const int64_t a = big.posted[0] / 2;  // the receives of B0 and B1
  EXPECT_EQ(a, 8 * 64 * 64 * 4);
  EXPECT_EQ(std::vector<int64_t>(big.posted.begin(), big.posted.begin() + 5),
            (std::vector<int64_t>{2 * a, 3 * a, 4 * a, 5 * a, 3 * a}));
  const RankBuffers small = buffers(2);
  ASSERT_EQ(small.posted.size(), 8u);
  EXPECT_EQ(std::vector<int64_t>(small.posted.begin(), small.posted.begin() + 5),
            (std::vector<int64_t>(5, small.posted[0])));
}

// The replicas of one position (pipeline rank, tensor-parallel index) hold the same stages
// and buffers: every rank's own buffers (rank_buffers, which evaluate_plan had computed
// for every rank, O(world) each) equal its replica 0's, and so does its estimate, which
// evaluate_plan now takes from replica 0. Over tensor parallelism, zero1 and a parameter
// server on the replicas and on an extra rank; then a pipeline of 2 x 4096 replicas (8192
// ranks), whose evaluation had grown with the world's square (minutes; now well under a
// second: docs/partitioner.md).
TEST(Evaluate, ReplicasShareTheirPositionsEstimate) {
  nlohmann::json j = {{"version", 1},
                      {"model", std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json"},
                      {"devices", 12},
                      {"parallel", {{"dp", 3}, {"pp", 2}, {"tp", 2}}},
                      {"batch", {{"micro_batch_size", 2}}},
                      {"schedule", {{"name", "1f1b"}, {"micro_batches", 4}}},
                      {"stages", {{{"layers", {"embed", "h.0"}}}, {{"layers", {"h.1", "head"}}}}}};
  auto expect_replicas_equal = [](const ResolvedPlan& r, const PlanEstimate& e) {
    ASSERT_EQ(int(e.ranks.size()), r.world());
    for (int k = 0; k < r.layout.world(); ++k) {
      const RankCoord c = r.layout.coord(k);
      const RankEstimate &got = e.ranks[size_t(k)],
                         &first = e.ranks[size_t(r.layout.rank(0, c.pp, c.tp, c.sp))];
      EXPECT_EQ(got.rank, k);
      EXPECT_EQ(got.coord.dp, c.dp);
      EXPECT_EQ(got.peak, first.peak) << "rank " << k;
      EXPECT_EQ(got.activation_peak, first.activation_peak) << "rank " << k;
      EXPECT_EQ(got.param_bytes + got.grad_bytes + got.optimizer_bytes,
                first.param_bytes + first.grad_bytes + first.optimizer_bytes)
          << "rank " << k;
      EXPECT_EQ(got.parameters, first.parameters) << "rank " << k;
      EXPECT_EQ(got.layers, first.layers) << "rank " << k;
      EXPECT_DOUBLE_EQ(got.dp_bytes, first.dp_bytes) << "rank " << k;
    }
  };
  for (const nlohmann::json& extra :
       {nlohmann::json::object(), nlohmann::json{{"optimizer_sharding", "zero1"}},
        nlohmann::json{{"dp_sync", {{"mode", "parameter-server"}, {"max_staleness", 1}}}},
        nlohmann::json{
            {"dp_sync", {{"mode", "parameter-server"}, {"max_staleness", 0}, {"ps_ranks", 1}}}}}) {
    SCOPED_TRACE(extra.dump());
    nlohmann::json k = j;
    k.update(extra);
    Plan plan = parse_plan(k, "plan.json", ".");
    auto g = load_plan_model(plan);
    const ResolvedPlan r = resolve_plan(plan, g);
    CostModel model(g, Machine{}, nullptr);
    const PlanEstimate e = evaluate_plan(r, model);
    expect_replicas_equal(r, e);
    for (int q = 0; q < r.layout.world(); ++q) {
      const RankCoord c = r.layout.coord(q);
      const int first = r.layout.rank(0, c.pp, c.tp, c.sp);
      const RankBuffers a = rank_buffers(r, q, *physical_graph(r, q)),
                        b = rank_buffers(r, first, *physical_graph(r, first));
      EXPECT_EQ(a.loader, b.loader) << "rank " << q;
      EXPECT_EQ(a.reduction, b.reduction) << "rank " << q;
      EXPECT_EQ(a.step, b.step) << "rank " << q;
      // A stale parameter server's extra pull holds the rank's part of each parameter, one
      // block each, whose sizes fall differently on each replica: a few 64-byte blocks
      // apart (replica 0's figure is every replica's, 0.1% under at most).
      if (k.contains("dp_sync") && k["dp_sync"]["max_staleness"] == 1)
        EXPECT_LE(std::abs(a.gather - b.gather), 4 * 64) << "rank " << q;
      else
        EXPECT_EQ(a.gather, b.gather) << "rank " << q;
      EXPECT_EQ(a.posted, b.posted) << "rank " << q;
    }
  }

  j["devices"] = 2 * 4096;
  j["parallel"] = {{"dp", 4096}, {"pp", 2}, {"tp", 1}};
  Plan plan = parse_plan(j, "plan.json", ".");
  auto g = load_plan_model(plan);
  const ResolvedPlan r = resolve_plan(plan, g);
  CostModel model(g, Machine{}, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const PlanEstimate e = evaluate_plan(r, model);
  std::printf("  pp 2 x dp 4096 (8192 ranks) evaluated in %.3f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  expect_replicas_equal(r, e);
}

// A cost file of another model, or one lacking some of the model's ops, is used with a
// warning naming what differs (it had been used without a word).
TEST(Profile, ForeignOrIncompleteCostFilesAreNamed) {
  auto g = load_search_model("tiny-gpt.json");
  MeasuredCosts m;
  m.model = "another-model";
  for (const stages::Node& n : g->nodes) m.ops[n.name] = {n.op, 1e-6, 1e-6, 1e-6, 0};
  m.ops.erase(g->nodes[3].name);
  m.ops[g->nodes[5].name].op = "not-its-op";
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  { CostModel model(g, Machine{}, &m); }
  m.model = g->name;
  for (const stages::Node& n : g->nodes) m.ops[n.name] = {n.op, 1e-6, 1e-6, 1e-6, 0};
  { CostModel whole(g, Machine{}, &m); }
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  EXPECT_NE(text.find("the cost file was profiled for model 'another-model', and this model is '" +
                      g->name + "'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("2 of the model's " + std::to_string(g->nodes.size()) +
                      " ops are not in the cost file (with their op) (" + g->nodes[3].name + ", " +
                      g->nodes[5].name + "): they are timed by their FLOPs"),
            std::string::npos)
      << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;  // the whole file: none
}

// A cost file of a model with the same names but another shape: its ops' FLOPs at the
// file's micro-batch differ from the model's, said (the times had been scaled by them
// without a word).
TEST(Profile, AnotherShapeUnderTheSameNamesIsNamed) {
  auto g = load_search_model("tiny-gpt.json");
  MeasuredCosts m;
  m.model = g->name;
  for (const stages::Node& n : g->nodes) {
    const stages::OpCost c = n.impl->cost(m.batch);
    m.ops[n.name] = {n.op, 1e-6, 1e-6, 1e-6,
                     c.forward_flops + c.backward_input_flops + c.backward_weight_flops};
  }
  auto warnings = [&] {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    { CostModel model(g, Machine{}, &m); }
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  EXPECT_EQ(warnings(), "");
  const stages::Node* wider = nullptr;
  for (const stages::Node& n : g->nodes)
    if (m.ops[n.name].flops > 0 && wider == nullptr) wider = &n;
  ASSERT_NE(wider, nullptr);
  m.ops[wider->name].flops /= 4;
  const std::string text = warnings();
  EXPECT_NE(text.find("1 of the model's " + std::to_string(g->nodes.size()) +
                      " ops have other FLOPs at the cost file's micro-batch 1 than it records (" +
                      wider->name + ": "),
            std::string::npos)
      << text;
}

TEST(Profile, MeasuredTimesReplaceFlops) {
  auto g = load_search_model("tiny-gpt.json");
  const ProfileOptions po = quick_profile(2, false);
  ProfileSummary sum;
  MeasuredCosts m = profile_model(*g, po, &sum);
  EXPECT_EQ(m.in_step, 1.0);
  EXPECT_EQ(m.ops.size(), g->nodes.size());
  EXPECT_LT(sum.distinct_ops, int(g->nodes.size()));  // the two blocks' ops are timed once
  for (const auto& [name, op] : m.ops) EXPECT_GT(op.forward, 0.0) << name;
  // Replace the times with known ones: the table must add them up per layer.
  for (auto& [name, op] : m.ops) {
    op.forward = 1e-3;
    op.backward_input = 2e-3;
    op.backward_weight = op.op == "linear" ? 3e-3 : 0.0;
  }
  CostModel model(g, Machine{}, &m);
  const CostTable& t1 = model.table(1, 2);
  const stages::Layer& h0 = g->layers[size_t(g->find_layer("h.0"))];
  EXPECT_NEAR(t1.layers[1].f, 1e-3 * double(h0.nodes.size()), 1e-12);
  EXPECT_NEAR(t1.layers[1].w, 3e-3 * 4, 1e-12);  // four linears
  // At twice the batch, twice the time; split over 2 ranks, half a split op's time plus
  // the collectives.
  EXPECT_NEAR(model.table(1, 4).layers[1].f, 2e-3 * double(h0.nodes.size()), 1e-12);
  const CostTable& t2 = model.table(2, 2);
  EXPECT_LT(t2.layers[1].w, t1.layers[1].w * 0.6);
  EXPECT_GT(t2.layers[1].w, t1.layers[1].w * 0.4);
}

// The ops' time in whole passes over their time one by one: measured by default, kept in
// the cost file, and every measured op's time is multiplied by it.
TEST(Profile, InStepFactorScalesTheMeasuredOps) {
  auto g = load_search_model("tiny-gpt.json");
  // Without a warm-up the ops' first calls pay one-time costs: no ratio is taken.
  EXPECT_EQ(profile_model(*g, quick_profile(2, true)).in_step, 1.0);
  ProfileOptions warm = quick_profile(2, true);
  warm.warmup = 1;
  MeasuredCosts m = profile_model(*g, warm);
  // Within a pass the ops take about their own time (1.1x here on a quiet machine); the
  // ratio taken on cold first calls was 0.005-0.03.
  EXPECT_GT(m.in_step, 0.1);
  EXPECT_LT(m.in_step, 10.0);
  // The same passes' AdamW step gives the optimizer's streaming rate (60 GB/s for config
  // B here; the tiny model's state fits the caches, so more); cold, none is taken.
  EXPECT_GT(m.memory_bandwidth, 1e8);
  EXPECT_LT(m.memory_bandwidth, 1e13);
  EXPECT_EQ(profile_model(*g, quick_profile(2, true)).memory_bandwidth, 0.0);
  m.in_step = 1.25;
  const std::string path = testing::TempDir() + "in_step_costs.json";
  write_measured_costs(m, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.in_step, 1.25);
  MeasuredCosts one = back;
  one.in_step = 1;
  CostModel scaled(g, Machine{}, &back), plain(g, Machine{}, &one);
  const CostTable &a = scaled.table(1, 2), &b = plain.table(1, 2);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_NEAR(a.layers[l].f, 1.25 * b.layers[l].f, 1e-15) << l;
    EXPECT_NEAR(a.layers[l].b, 1.25 * b.layers[l].b, 1e-15) << l;
    EXPECT_NEAR(a.layers[l].w, 1.25 * b.layers[l].w, 1e-15) << l;
  }
  // A schedule's cost file says what it is (it had read "missing required field 'version'").
  memory::write_file_durably(path + ".sched", R"({"forward": 1, "backward_input": 2})");
  try {
    read_measured_costs(path + ".sched");
    ADD_FAILURE() << "a schedule cost file was read as op times";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("$: a schedule cost file (per-stage action times"),
              std::string::npos)
        << e.what();
  }
  // Bad input: out of range, not a number.
  for (const char* bad : {"0", "-1", "\"fast\""}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["in_step"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
}

// The measured streaming rate replaces the Machine's assumed one in the optimizer step's
// time: through the file, a plan's STEP inversely proportional to it; none measured
// leaves the Machine's.
TEST(Profile, MeasuredBandwidthTimesTheOptimizerStep) {
  const TinyPlan tiny = tiny_pp2_tp2_dp2();
  MeasuredCosts m = profile_model(*tiny.graph, quick_profile(1, false));
  EXPECT_EQ(m.memory_bandwidth, 0.0);  // no whole passes: not measured
  const std::string path = testing::TempDir() + "bandwidth_costs.json";
  write_measured_costs(m, path);
  EXPECT_EQ(nlohmann::json::parse(memory::read_file(path)).count("memory_bandwidth"), 0U);
  const MeasuredCosts none = read_measured_costs(path);
  m.memory_bandwidth = 2 * Machine{}.memory_bandwidth;
  write_measured_costs(m, path);
  const MeasuredCosts twice = read_measured_costs(path);
  EXPECT_EQ(twice.memory_bandwidth, m.memory_bandwidth);

  CostModel assumed(tiny.graph, Machine{}, &none), measured(tiny.graph, Machine{}, &twice);
  EXPECT_EQ(assumed.machine().memory_bandwidth, Machine{}.memory_bandwidth);
  EXPECT_EQ(measured.machine().memory_bandwidth, m.memory_bandwidth);
  const auto step = [&](CostModel& model) {
    return schedule_costs(tiny.resolved,
                          model.table_for(tiny.resolved.sharding, tiny.plan.micro_batch_size),
                          model.machine())
        .optimizer_step;
  };
  // The step also waits for its reductions, which do not depend on the memory's speed.
  Machine no_wait = Machine{};
  no_wait.dp_latency = 0;
  no_wait.dp_bandwidth = 1e30;
  CostModel a(tiny.graph, no_wait, &none), b(tiny.graph, no_wait, &twice);
  ASSERT_GT(step(a), 0.0);
  EXPECT_NEAR(step(b), step(a) / 2, 1e-9 * step(a));
  EXPECT_GT(step(assumed), step(measured));

  // Bad input: zero, negative, not a number.
  for (const char* bad : {"0", "-1", "\"fast\""}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["memory_bandwidth"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
}

// Ops timed at several micro-batch sizes: a table at a timed size takes that size's
// times, between two sizes the line through them, outside the sizes the nearest one
// scaled by the FLOPs; through the file, with a size timed twice refused.
TEST(Profile, OpsTimedAtSeveralBatchesAreInterpolated) {
  auto g = load_search_model("tiny-gpt.json");
  MeasuredCosts one = profile_model(*g, quick_profile(1, false));
  for (auto& [name, op] : one.ops) op.forward = op.backward_input = op.backward_weight = 1e-3;
  // At 4 samples each op takes 3 times its time at 1, not 4.
  MeasuredCosts::AtBatch four{4, 1.0, one.ops, {}};
  for (auto& [name, op] : four.ops) {
    op.forward = op.backward_input = op.backward_weight = 3e-3;
    op.flops *= 4;
  }
  MeasuredCosts both = one;
  both.more_batches.push_back(four);
  const int h0 = g->find_layer("h.0");
  int n = 0;
  for (const auto& [name, op] : one.ops) n += name.rfind("h.0.", 0) == 0 ? 1 : 0;
  ASSERT_GT(n, 0);
  CostModel linear(g, Machine{}, &one), measured(g, Machine{}, &both);
  // Per op: what the two sizes give over what batch 1 scaled linearly gives.
  for (auto [batch, per_op] :
       {std::pair<int64_t, double>{1, 1e-3}, {2, 1e-3 + 2e-3 / 3}, {4, 3e-3}, {8, 6e-3}}) {
    const LayerCost& a = linear.table(1, batch).layers[size_t(h0)];
    const LayerCost& b = measured.table(1, batch).layers[size_t(h0)];
    const double shift = n * (per_op - 1e-3 * double(batch));
    EXPECT_NEAR(b.f - a.f, shift, 1e-12) << "batch " << batch;
    EXPECT_NEAR(b.b - a.b, shift, 1e-12) << "batch " << batch;
    EXPECT_NEAR(b.w - a.w, shift, 1e-12) << "batch " << batch;
  }
  const std::string path = testing::TempDir() + "batches_costs.json";
  write_measured_costs(both, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.batches(), (std::vector<int64_t>{1, 4}));
  ASSERT_EQ(back.more_batches.size(), 1U);
  EXPECT_EQ(back.more_batches[0].ops.at("h.0.mlp.c_fc").forward, 3e-3);
  for (const char* bad : {R"([{"batch": 1, "ops": {}}])", R"([{"batch": 4, "ops": {}, "x": 1}])",
                          R"([{"batch": 0, "ops": {}}])", R"([{"ops": {}}])"}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["more_batches"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
}

// A tensor-parallel rank's shard: its split ops timed at their own shapes (a split linear
// does half the FLOPs at degree 2), none that communicates, and a table at that degree
// takes its ops' times from them.
TEST(Profile, TensorParallelShardsAreTimedAtTheirOwnShapes) {
  auto g = load_search_model("tiny-gpt.json");
  const ProfileOptions po = quick_profile(2, false);
  MeasuredCosts m = profile_model(*g, po);
  profile_tensor_parallel(*g, po, 2, m);
  ASSERT_EQ(m.tp_ops.count(2), 1U);
  const auto& shard = m.tp_ops.at(2);
  ASSERT_TRUE(shard.count("h.0.mlp.c_fc"));
  EXPECT_DOUBLE_EQ(shard.at("h.0.mlp.c_fc").flops, m.ops.at("h.0.mlp.c_fc").flops / 2);
  for (const auto& [name, op] : shard)
    EXPECT_TRUE(op.op != "tp_reduce" && op.op != "tp_copy" && op.op != "tp_gather" &&
                op.op != "vocab_parallel_cross_entropy")
        << name << " communicates";
  // Known times for the shard's ops: the degree-2 table moves by exactly their count in
  // layer h.0 when they change, and the degree-1 table not at all.
  auto with_forward = [&](double f) {
    MeasuredCosts c = m;
    for (auto& [name, op] : c.tp_ops.at(2)) op.forward = f;
    return c;
  };
  const MeasuredCosts a = with_forward(1e-3), b = with_forward(2e-3);
  CostModel ma(g, Machine{}, &a), mb(g, Machine{}, &b);
  const int h0 = g->find_layer("h.0");
  int in_h0 = 0;
  for (const auto& [name, op] : shard) in_h0 += name.rfind("h.0.", 0) == 0 ? 1 : 0;
  ASSERT_GT(in_h0, 0);
  EXPECT_NEAR(mb.table(2, 2).layers[size_t(h0)].f - ma.table(2, 2).layers[size_t(h0)].f,
              1e-3 * in_h0, 1e-12);
  EXPECT_EQ(mb.table(1, 2).layers[size_t(h0)].f, ma.table(1, 2).layers[size_t(h0)].f);
  // Through the file, and bad keys refused.
  const std::string path = testing::TempDir() + "tp_costs.json";
  write_measured_costs(a, path);
  const MeasuredCosts back = read_measured_costs(path);
  ASSERT_EQ(back.tp_ops.count(2), 1U);
  EXPECT_EQ(back.tp_ops.at(2).size(), shard.size());
  EXPECT_EQ(back.tp_ops.at(2).at("h.0.mlp.c_fc").forward, 1e-3);
  for (const char* bad : {R"({"1": {}})", R"({"two": {}})", R"({"2": {"x": {"op": "linear"}}})"}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["tp_ops"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
  // A degree that does not divide the heads.
  EXPECT_THROW(profile_tensor_parallel(*g, po, 3, m), InputError);
}

// A row-split linear's bias moves to a bias_add after the reduce: the shard's profile
// times it as it runs (one of the shard's ops, in tp_ops), and a table at that degree
// takes its time; without tp_ops it has no entry and is timed by its FLOPs.
TEST(Profile, ShardBiasAddIsTimedAndUsed) {
  auto g = load_search_model("tiny-gpt.json");
  const ProfileOptions po = quick_profile(2, false);
  MeasuredCosts m = profile_model(*g, po);
  const std::string bias = "h.0.attn.c_proj.bias_add";
  EXPECT_EQ(m.ops.count(bias), 0U);
  profile_tensor_parallel(*g, po, 2, m);
  ASSERT_EQ(m.tp_ops.at(2).count(bias), 1U);
  EXPECT_EQ(m.tp_ops.at(2).at(bias).op, "bias_add");
  MeasuredCosts slow = m;
  slow.tp_ops.at(2).at(bias).forward += 1e-3;
  CostModel ma(g, Machine{}, &m), mb(g, Machine{}, &slow);
  const int h0 = g->find_layer("h.0");
  EXPECT_NEAR(mb.table(2, 2).layers[size_t(h0)].f - ma.table(2, 2).layers[size_t(h0)].f, 1e-3,
              1e-12);
}

// Count keys (ranks per host, degrees) as write_measured_costs writes them: "02", " 2" and
// "+2" had been read as 2 (two spellings of one count, one silently winning), and a bad
// key's message quoted its value.
TEST(Profile, CountKeysAreCanonicalIntegers) {
  MeasuredCosts m;
  m.model = "m";
  m.ops["x"] = {"linear", 1e-3, 1e-3, 1e-3, 1e6};
  m.colocated[2] = 1.5;
  m.tp_ops[2]["x"] = m.ops["x"];
  m.tp_collective[2][2] = 1e-5;
  m.spatial_exchange[2][2] = 1e-5;
  const std::string path = testing::TempDir() + "count_keys_costs.json";
  write_measured_costs(m, path);
  const nlohmann::json good = nlohmann::json::parse(memory::read_file(path));
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.colocated.at(2), 1.5);
  EXPECT_EQ(back.tp_collective.at(2).at(2), 1e-5);
  struct Case {
    std::string field, inner, key, message;
  };
  for (const Case& c : {
           Case{"colocated", "", "02", "$.colocated.02: expected ranks per host as a key"},
           Case{"colocated", "", " 2", "found the key \" 2\""},
           Case{"colocated", "", "+2", "found the key \"+2\""},
           Case{"colocated", "", "2 ", "found the key \"2 \""},
           Case{"colocated", "", "1",
                "$.colocated.1: expected ranks per host as a key: an "
                "integer from 2 to 65536 in decimal digits (no sign, "
                "spaces or leading zeros), found the key \"1\""},
           Case{"colocated", "", "65537", "found the key \"65537\""},
           Case{"tp_ops", "", "02", "$.tp_ops.02: expected a tensor-parallel degree as a key"},
           Case{"tp_collective", "", "02", "found the key \"02\""},
           Case{"tp_collective", "2", "02", "$.tp_collective.2.02: expected ranks per host"},
           Case{"spatial_exchange", "", "002", "expected a spatial degree as a key"},
       }) {
    nlohmann::json j = good;
    nlohmann::json& at = c.inner.empty() ? j[c.field] : j[c.field][c.inner];
    at[c.key] = at.begin().value();  // beside the canonical "2" (a duplicate count)
    memory::write_file_durably(path, j.dump());
    try {
      read_measured_costs(path);
      ADD_FAILURE() << c.field << " " << c.key << ": accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << c.key << ": " << e.what();
    }
  }
}

// A micro-batch size's entry lacking some of the ops the top-level entry has is warned of
// by the size and the ops (it had fallen back to the other sizes' times without a word).
TEST(Profile, MoreBatchesEntriesLackingOpsAreNamed) {
  auto g = load_search_model("tiny-gpt.json");
  MeasuredCosts m;
  m.model = g->name;
  for (const stages::Node& n : g->nodes) m.ops[n.name] = {n.op, 1e-6, 1e-6, 1e-6, 0};
  MeasuredCosts::AtBatch four{4, 1.0, m.ops, {}};
  four.ops.erase(g->nodes[3].name);
  four.ops[g->nodes[5].name].op = "not-its-op";
  m.more_batches.push_back(four);
  m.more_batches.push_back({8, 1.0, m.ops, {}});
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  { CostModel model(g, Machine{}, &m); }
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  EXPECT_NE(text.find("2 of the model's " + std::to_string(g->nodes.size()) +
                      " ops are not in the cost file's more_batches entry for batch 4 (with "
                      "their op) (" +
                      g->nodes[3].name + ", " + g->nodes[5].name +
                      "): at that size they take the other sizes' times"),
            std::string::npos)
      << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;  // batch 8: complete
}

// A cost file timed at another thread count than each of a plan's ranks computes with by
// default on this host (the cores over the ranks per host) is warned of, once per cost
// model, by plan evaluation and prediction alike; the same count says nothing.
TEST(Profile, CostFileThreadsOtherThanTheRanksDefaultAreWarned) {
  const TinyPlan tiny = tiny_pp2_tp2_dp2();  // 8 ranks on one host
  const int each = std::max(1, int(std::max(1U, std::thread::hardware_concurrency())) / 8);
  MeasuredCosts m = profile_model(*tiny.graph, quick_profile(1, false));
  auto warnings = [&](int threads, Machine machine) {
    m.threads = threads;
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    {
      CostModel model(tiny.graph, machine, &m);
      evaluate_plan(tiny.resolved, model);
      evaluate_plan(tiny.resolved, model);
      predict_step(tiny.resolved, model);
    }
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  const std::string other = warnings(each + 1, Machine{});
  EXPECT_NE(other.find("the cost file timed the ops at " + std::to_string(each + 1) +
                       " thread(s), and each of the plan's 8 rank(s) per host computes with " +
                       std::to_string(each)),
            std::string::npos)
      << other;
  EXPECT_EQ(std::count(other.begin(), other.end(), '\n'), 1) << other;
  EXPECT_EQ(warnings(each, Machine{}), "");
  // Two ranks per host: each gets the cores over 2.
  Machine two;
  two.ranks_per_host = 2;
  const int each2 = std::max(1, int(std::max(1U, std::thread::hardware_concurrency())) / 2);
  EXPECT_EQ(warnings(each2, two), "");
  EXPECT_NE(warnings(each2 + 1, two).find("each of the plan's 2 rank(s) per host"),
            std::string::npos);
}

// Whole passes (what --colocated compares alone and beside copies): they run a model's
// training step end to end, on any model a profile takes, and refuse an empty pass.
TEST(Profile, PassesRunWholeTrainingSteps) {
  auto g = load_search_model("tiny-gpt.json");
  ProfileOptions po;
  po.batch = 2;
  po.repeats = 1;
  po.warmup = 1;
  const PassTimes t = time_passes(*g, po, 2);
  EXPECT_TRUE(std::isfinite(t.pass));
  EXPECT_GT(t.compute, 0.0);
  EXPECT_GT(t.pass, t.compute);  // the optimizer step after the micro-batches
  EXPECT_EQ(t.passes, 1);
  // A time budget stops the timed passes once spent, after two; without one, all run.
  po.repeats = 4;
  po.pass_seconds = 1e-9;
  EXPECT_EQ(time_passes(*g, po, 1).passes, 2);
  po.pass_seconds = 0;
  EXPECT_EQ(time_passes(*g, po, 1).passes, 4);
  try {
    time_passes(*g, po, 0);
    ADD_FAILURE() << "a pass of no micro-batches ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expected at least 1, found 0"), std::string::npos)
        << e.what();
  }
}

// Ranks whose passes must pair (--tp's probe: collectives in every pass) stop on rank 0's
// clock: here rank 0's budget is spent after two passes and rank 1 has none of its own,
// and both run two.
TEST(Profile, RanksOfAGroupRunAsManyPasses) {
  auto g = load_search_model("tiny-gpt.json");
  std::vector<transport::CommPtr> world = transport::make_local_world(2);
  int passes[2] = {0, 0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      ProfileOptions po;
      po.batch = 1;
      po.warmup = 1;
      po.repeats = 4;
      po.pass_seconds = r == 0 ? 1e-9 : 0;
      po.pass_group = world[size_t(r)].get();
      passes[r] = time_passes(*g, po, 1).passes;
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(passes[0], 2);
  EXPECT_EQ(passes[1], 2);
}

// The profile's colocated slowdown: written and read back, interpolated between the
// measured points, and applied to the compute of a plan by the ranks sharing its host;
// the tied embedding's stages reduce together.
TEST(Profile, ColocatedSlowdownScalesComputeByRanksPerHost) {
  const TinyPlan tiny = tiny_pp2_tp2_dp2();
  ASSERT_EQ(tiny.resolved.world(), 8);
  MeasuredCosts m = profile_model(*tiny.graph, quick_profile(1, false));
  m.colocated = {{2, 1.5}, {4, 2.5}};
  const std::string path = testing::TempDir() + "colocated_costs.json";
  write_measured_costs(m, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.colocated, m.colocated);

  Machine machine;
  machine.colocated = back.colocated;
  EXPECT_DOUBLE_EQ(colocation_slowdown(machine, 1), 1.0);
  EXPECT_DOUBLE_EQ(colocation_slowdown(machine, 2), 1.5);
  EXPECT_DOUBLE_EQ(colocation_slowdown(machine, 3), 2.0);
  EXPECT_DOUBLE_EQ(colocation_slowdown(machine, 8), 2.5);  // beyond: the largest measured

  CostModel plain(tiny.graph, Machine{}, nullptr);
  CostModel measured(tiny.graph, Machine{}, &back);  // takes the file's slowdown
  const schedule::Costs base = schedule_costs(
      tiny.resolved, plain.table_for(tiny.resolved.sharding, tiny.plan.micro_batch_size),
      plain.machine());
  auto scaled = [&](int ranks_per_host) {
    Machine mm = measured.machine();
    mm.ranks_per_host = ranks_per_host;
    mm.flops = plain.machine().flops;
    // The analytic table (no measured times) with the measured slowdown: only the factor
    // differs from `base`.
    return schedule_costs(tiny.resolved,
                          plain.table_for(tiny.resolved.sharding, tiny.plan.micro_batch_size), mm);
  };
  for (auto [per_host, factor] : {std::pair{0, 2.5}, {1, 1.0}, {2, 1.5}, {3, 2.0}}) {
    const schedule::Costs c = scaled(per_host);
    for (size_t s = 0; s < base.forward.size(); ++s) {
      EXPECT_NEAR(c.forward[s], factor * base.forward[s], 1e-15) << per_host;
      EXPECT_NEAR(c.backward_weight[s], factor * base.backward_weight[s], 1e-15) << per_host;
    }
    EXPECT_DOUBLE_EQ(c.optimizer_step, base.optimizer_step);
  }
  // The embedding is tied to the head across the two stages: one reduction group.
  EXPECT_EQ(base.reduce_group, (std::vector<int>{0, 0}));

  // Bad input: a key that is no rank count, a factor out of range.
  for (const char* bad : {R"({"one": 1.5})", R"({"1": 1.5})", R"({"2": -1})", R"([1.5])"}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["colocated"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
}

// More ranks than cores on the one host: each core gets ranks of every pipeline rank
// (Layout::core_deal_order, as the ranks bind themselves), the simulator shares the
// cores among the ranks computing, and the ops carry only the colocated slowdown beyond
// the cores' fair share. The cost file keeps the cores the factors were measured on.
TEST(Profile, RanksOutnumberingTheCoresAreTimeSliced) {
  const Layout pp2_tp2_dp2(2, {2, 2});  // rank = (dp * 2 + pp) * 2 + tp
  EXPECT_EQ(pp2_tp2_dp2.core_deal_order(), (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
  const Layout pp2_dp2(2, {1, 1});  // dealt to 2 cores: a replica on each
  EXPECT_EQ(pp2_dp2.core_deal_order(), (std::vector<int>{0, 2, 1, 3}));

  const TinyPlan tiny = tiny_pp2_tp2_dp2();
  MeasuredCosts m = profile_model(*tiny.graph, quick_profile(1, false));
  m.colocated = {{2, 1.02}, {8, 4.4}};
  m.cores = 2;
  const std::string path = testing::TempDir() + "time_sliced_costs.json";
  write_measured_costs(m, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.cores, 2);

  CostModel plain(tiny.graph, Machine{}, nullptr);
  CostModel measured(tiny.graph, Machine{}, &back);
  EXPECT_EQ(measured.machine().cores_per_host, 2);
  const CostTable& table = plain.table_for(tiny.resolved.sharding, tiny.plan.micro_batch_size);
  const schedule::Costs base = schedule_costs(tiny.resolved, table, plain.machine());
  EXPECT_TRUE(base.core_ranks.empty());
  auto costs = [&](int cores, int ranks_per_host) {
    Machine mm = measured.machine();
    mm.cores_per_host = cores;
    mm.ranks_per_host = ranks_per_host;
    return schedule_costs(tiny.resolved, table, mm);
  };
  // 8 ranks on 2 cores: two of each pipeline rank on each core, the ops 4.4 / (8 / 2).
  const schedule::Costs sliced = costs(2, 0);
  EXPECT_EQ(sliced.core_ranks, (std::vector<std::vector<double>>{{2, 2}, {2, 2}}));
  for (size_t s = 0; s < base.forward.size(); ++s)
    EXPECT_NEAR(sliced.forward[s], 1.1 * base.forward[s], 1e-12);
  // 3 cores: 3, 3 and 2 ranks, each core holding both pipeline ranks.
  EXPECT_EQ(costs(3, 0).core_ranks, (std::vector<std::vector<double>>{{2, 1}, {1, 2}, {1, 1}}));
  // As many cores as ranks (per host): the fixed factor as before.
  for (auto [cores, per_host, factor] : {std::tuple{8, 0, 4.4}, {2, 2, 1.02}}) {
    const schedule::Costs c = costs(cores, per_host);
    EXPECT_TRUE(c.core_ranks.empty()) << cores;
    EXPECT_NEAR(c.forward[0], factor * base.forward[0], 1e-12) << cores;
  }
  // Two hosts of 4 ranks on 2 cores each: each host's ranks share its own cores (a row
  // per core, host by host), as one host of 4 ranks would.
  const schedule::Costs hosts = costs(2, 4);
  ASSERT_EQ(hosts.core_ranks.size(), 4u);
  for (const std::vector<double>& core : hosts.core_ranks)
    EXPECT_EQ(core[0] + core[1], 2) << "2 of a host's 4 ranks on each of its cores";
  EXPECT_NEAR(hosts.forward[0], (1.02 + (4.4 - 1.02) / 3) * 2 / 4 * base.forward[0], 1e-12);
  // Measured at no more ranks than cores: carried beyond as it is, the time-slicing left to
  // the simulator (it had been divided by 8 / 2, to the floor of 1).
  {
    Machine two = measured.machine();
    two.colocated = {{2, 1.5}};
    two.cores_per_host = 2;
    const schedule::Costs c = schedule_costs(tiny.resolved, table, two);
    EXPECT_FALSE(c.core_ranks.empty());
    EXPECT_NEAR(c.forward[0], 1.5 * base.forward[0], 1e-12);
  }
  // The simulated step: time-sliced, under the fixed factor's (every rank busy always).
  const schedule::Schedule sched = tiny.resolved.schedule;
  const double fixed = schedule::simulate(sched, costs(8, 0)).makespan;
  const double shared = schedule::simulate(sched, sliced).makespan;
  EXPECT_LT(shared, fixed);

  nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
  j["cores"] = 0;
  memory::write_file_durably(path, j.dump());
  EXPECT_THROW(read_measured_costs(path), InputError);
}

// A spatial split's exchanges (halos, tiled batch norms' statistics, the pooled mean)
// among co-located ranks (`baton profile --colocated k --spatial s`): counted per layer
// range, derived from the probe's passes so that the cost model gives them back, written
// and read back, and added, slowed like the ops, to F and B of every spatial stage.
TEST(Profile, SpatialExchangesCostWhatTheCoLocatedRanksMeasured) {
  Plan plan =
      read_plan(std::string(BATON_SOURCE_DIR) + "/examples/plans/resnet-pp2-spatial2-dp2.json");
  auto g = load_plan_model(plan);
  const ResolvedPlan r = resolve_plan(plan, g);
  // resnet-tiny: the stem (conv 3x3, batch norm), layer1.0 (two of each), layer2.0 (two
  // of each and the 1x1 strided downsample's conv without a halo and its batch norm),
  // the head's pooled mean. Each halo is one exchange a pass; each batch norm two in F
  // (means, variances) and one in B.
  const SpatialSplit split = plan_spatial(*g, 2, "test");
  const SpatialExchanges all = spatial_exchanges(*g, split, 0, g->num_layers());
  EXPECT_EQ(all.forward, 5 + 2 * 6 + 1);
  EXPECT_EQ(all.backward, 5 + 6);
  const SpatialExchanges stem = spatial_exchanges(*g, split, 0, 1);
  EXPECT_EQ(stem.forward, 3);
  EXPECT_EQ(stem.backward, 2);

  MeasuredCosts m = profile_model(*g, quick_profile(plan.micro_batch_size, false));
  // The probe's passes: the whole model's slowed 2x by the sharing, the tile's by as much
  // and 30 us per exchange more than the model's tile (half of every op and the halos).
  CostModel model(g, Machine{}, &m);
  const CostTable& whole = model.table(1, m.batch);
  const double halo =
      spatial_halo_bytes(*g, split, 0, g->num_layers(), m.batch) / model.machine().tp_bandwidth;
  const double tile = kPassMicroBatches * (whole.total_time(false) / 2 + 2 * halo);
  const double whole_pass = 2 * kPassMicroBatches * whole.total_time(false);
  const double per_pass = kPassMicroBatches * (all.forward + all.backward);
  EXPECT_NEAR(spatial_exchange_from_pass(*g, m, 2, 2 * (tile + per_pass * 30e-6), whole_pass),
              30e-6, 1e-12);
  EXPECT_EQ(spatial_exchange_from_pass(*g, m, 2, 2 * tile * 0.9, whole_pass), 0.0);

  m.spatial_exchange = {{2, {{2, 20e-6}, {8, 80e-6}}}};
  const std::string path = testing::TempDir() + "spatial_exchange_costs.json";
  write_measured_costs(m, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.spatial_exchange, m.spatial_exchange);
  CostModel measured(g, Machine{}, &back);
  EXPECT_DOUBLE_EQ(spatial_exchange_extra(measured.machine(), 2, 4), 40e-6);
  EXPECT_DOUBLE_EQ(spatial_exchange_extra(measured.machine(), 4, 8), 0.0);  // not measured

  const CostTable& table = measured.table_for(r.sharding, plan.micro_batch_size);
  Machine none = measured.machine();
  none.spatial_exchange.clear();
  const schedule::Costs a = schedule_costs(r, table, none),
                        b = schedule_costs(r, table, measured.machine());
  const double slow = colocation_slowdown(measured.machine(), 8);
  for (int s = 0; s < r.schedule.num_stages(); ++s) {
    const int k = r.chunk_of_stage[size_t(s)];
    const SpatialExchanges ex =
        spatial_exchanges(*g, split, r.chunk_first[size_t(k)], r.chunk_last[size_t(k)]);
    EXPECT_GT(ex.forward, 0) << s;
    EXPECT_NEAR(b.forward[size_t(s)] - a.forward[size_t(s)], slow * ex.forward * 80e-6, 1e-12);
    EXPECT_NEAR(b.backward_input[size_t(s)] - a.backward_input[size_t(s)],
                slow * ex.backward * 80e-6, 1e-12);
    EXPECT_DOUBLE_EQ(b.backward_weight[size_t(s)], a.backward_weight[size_t(s)]);
  }
  nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
  j["spatial_exchange"] = nlohmann::json::parse(R"({"1": {"2": 1e-5}})");
  memory::write_file_durably(path, j.dump());
  EXPECT_THROW(read_measured_costs(path), InputError);
}

// What a tensor-parallel collective costs among co-located ranks beyond its analytic
// time (`baton profile --colocated k --tp t`): derived from the probe's passes so that the
// cost model gives them back, written and read back, interpolated between the measured
// rank counts, and added, slowed like the ops, to F and B of every stage per collective.
TEST(Profile, TensorParallelCollectivesCostWhatTheCoLocatedRanksMeasured) {
  const TinyPlan tiny = tiny_pp2_tp2_dp2();
  ASSERT_EQ(tiny.resolved.world(), 8);
  MeasuredCosts m = profile_model(*tiny.graph, quick_profile(tiny.plan.micro_batch_size, false));

  // The probe's passes: the whole model's slowed 3x by the sharing, the shard's by as
  // much and 40 us per collective more.
  CostModel model(tiny.graph, Machine{}, &m);
  const CostTable& whole = model.table(1, m.batch);
  const CostTable& split = model.table(2, m.batch);
  int collectives = 0;
  for (const LayerCost& l : whole.layers)
    EXPECT_EQ(l.tp_forward_collectives + l.tp_backward_collectives, 0);
  for (const LayerCost& l : split.layers)
    collectives += l.tp_forward_collectives + l.tp_backward_collectives;
  ASSERT_GT(collectives, 0);
  const double pass = kPassMicroBatches * split.total_time(false);
  const double whole_pass = 3 * kPassMicroBatches * whole.total_time(false);
  const double per_pass = kPassMicroBatches * collectives;
  EXPECT_NEAR(tp_collective_from_pass(*tiny.graph, m, 2, 3 * (pass + per_pass * 40e-6), whole_pass),
              40e-6, 1e-12);
  EXPECT_EQ(tp_collective_from_pass(*tiny.graph, m, 2, 3 * pass * 0.9, whole_pass),
            0.0);  // never below

  m.tp_collective = {{2, {{2, 10e-6}, {8, 50e-6}}}};
  const std::string path = testing::TempDir() + "tp_collective_costs.json";
  write_measured_costs(m, path);
  const MeasuredCosts back = read_measured_costs(path);
  EXPECT_EQ(back.tp_collective, m.tp_collective);
  CostModel measured(tiny.graph, Machine{}, &back);  // takes the file's
  const Machine& machine = measured.machine();
  EXPECT_DOUBLE_EQ(tp_collective_extra(machine, 2, 2), 10e-6);
  EXPECT_DOUBLE_EQ(tp_collective_extra(machine, 2, 5), 30e-6);
  EXPECT_DOUBLE_EQ(tp_collective_extra(machine, 2, 16), 50e-6);  // beyond: the nearest
  EXPECT_DOUBLE_EQ(tp_collective_extra(machine, 4, 8), 0.0);     // a degree not measured

  const CostTable& table = measured.table_for(tiny.resolved.sharding, tiny.plan.micro_batch_size);
  Machine none = machine;
  none.tp_collective.clear();
  for (auto [per_host, extra] : {std::pair{0, 50e-6}, {2, 10e-6}}) {
    Machine with = machine;
    with.ranks_per_host = none.ranks_per_host = per_host;
    const schedule::Costs a = schedule_costs(tiny.resolved, table, none),
                          b = schedule_costs(tiny.resolved, table, with);
    const double slow = colocation_slowdown(with, per_host > 0 ? per_host : 8);
    for (int s = 0; s < tiny.resolved.schedule.num_stages(); ++s) {
      const int k = tiny.resolved.chunk_of_stage[size_t(s)];
      int f = 0, bw = 0;
      for (int l = tiny.resolved.chunk_first[size_t(k)]; l < tiny.resolved.chunk_last[size_t(k)];
           ++l) {
        f += table.layers[size_t(l)].tp_forward_collectives;
        bw += table.layers[size_t(l)].tp_backward_collectives;
      }
      EXPECT_GT(f, 0) << s;
      EXPECT_NEAR(b.forward[size_t(s)] - a.forward[size_t(s)], slow * f * extra, 1e-12) << s;
      EXPECT_NEAR(b.backward_input[size_t(s)] - a.backward_input[size_t(s)], slow * bw * extra,
                  1e-12)
          << s;
      EXPECT_DOUBLE_EQ(b.backward_weight[size_t(s)], a.backward_weight[size_t(s)]) << s;
    }
  }

  // Bad input: a key that is no degree or rank count, seconds out of range, no object.
  for (const char* bad : {R"({"1": {"2": 1e-5}})", R"({"2": {"x": 1e-5}})", R"({"2": {"2": -1}})",
                          R"({"2": {"2": 2}})", R"({"2": 1e-5})"}) {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    j["tp_collective"] = nlohmann::json::parse(bad);
    memory::write_file_durably(path, j.dump());
    EXPECT_THROW(read_measured_costs(path), InputError) << bad;
  }
}

}  // namespace
}  // namespace baton::partitioner
