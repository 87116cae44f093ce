// Convolutional networks under a plan: a tiny ResNet on the digits images, tensor
// parallelism (convolutions split by channels) alone and with pipeline stages, the
// spatial split (stages' `spatial`: images tiled by rows) alone, with pipeline stages (of
// one degree, and re-tiled between different ones), with data-parallel replicas (with
// and without sync_batchnorm) and with tensor parallelism in the same stage, 20 steps within 1e-5
// of the one-process trainer (same global batch and micro-batches, so batch norm sees the same
// samples; sync_batchnorm's statistics are those of the replicas' micro-batches together: the
// one-process run with one micro-batch of all of them).
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/rank_engine.h"
#include "engine_harness.h"
#include "memory/error.h"
#include "partitioner/groups.h"
#include "partitioner/plan.h"
#include "stages/checkpoint.h"
#include "stages/image_data.h"

namespace baton::engine_testing {
namespace {

json tiny_resnet() {
  return {{"type", "resnet"},   {"in_channels", 1}, {"image_size", 8},  {"classes", 10},
          {"stem_channels", 4}, {"stem_kernel", 3}, {"stem_stride", 1}, {"stem_pool", false},
          {"widths", {4, 8}},   {"depths", {1, 1}}, {"strides", {1, 2}}};
}

RunSettings conv_digits() {
  RunSettings s;
  s.data = std::string(BATON_SOURCE_DIR) + "/examples/data/digits";
  return s;
}

// Within 1e-5 (relative) step by step, or (same = false) at least 1e-4 apart somewhere.
void expect_conv_close(const std::vector<engine::StepRecord>& got,
                       const std::vector<engine::StepRecord>& want, bool same = true) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 20u);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i].loss - want[i].loss) / std::abs(want[i].loss));
    if (!same) continue;
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
        << "step " << i + 1;
  }
  if (!same) {
    EXPECT_GT(worst, 1e-4) << "the runs should differ";
  }
}

void run_conv_case(const PlanSpec& p) {
  SCOPED_TRACE(p.describe());
  Workspace ws("conv");
  RunSettings s = conv_digits();
  auto plan = resolve(p, ws);
  expect_conv_close(run_threads(plan, train_options(ws, s)), run_reference(p, ws, s));
}

// The harness's plan with a spatial degree per stage (and sync_batchnorm), the devices
// counted again.
std::shared_ptr<const partitioner::ResolvedPlan> resolve_conv_spatial(const PlanSpec& p,
                                                                      const Workspace& ws,
                                                                      std::vector<int> spatial,
                                                                      bool sync_batchnorm = false) {
  json j = plan_json(p, ws);
  int devices = 0;
  for (size_t k = 0; k < spatial.size(); ++k) {
    j["stages"][k]["spatial"] = spatial[k];
    devices += p.tp[k] * spatial[k];
  }
  j["devices"] = p.dp * devices;
  if (sync_batchnorm) j["sync_batchnorm"] = true;
  partitioner::Plan plan = partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
  auto graph = partitioner::load_plan_model(plan);
  return std::make_shared<const partitioner::ResolvedPlan>(partitioner::resolve_plan(plan, graph));
}

void run_conv_spatial_case(const PlanSpec& p, std::vector<int> spatial) {
  SCOPED_TRACE(p.describe() + " spatial " + std::to_string(spatial.front()));
  Workspace ws("conv-spatial");
  RunSettings s = conv_digits();
  auto plan = resolve_conv_spatial(p, ws, spatial);
  expect_conv_close(run_threads(plan, train_options(ws, s)), run_reference(p, ws, s));
}

TEST(ConvPlans, TensorParallel2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2};
  run_conv_case(p);
}

TEST(ConvPlans, Pipeline2TensorParallel2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2, 2};  // stem, layer1.0 | layer2.0, head
  run_conv_case(p);
}

TEST(ConvPlans, Spatial2) {
  PlanSpec p;
  p.model = tiny_resnet();
  run_conv_spatial_case(p, {2});
}

TEST(ConvPlans, Spatial4) {
  PlanSpec p;
  p.model = tiny_resnet();  // 8 rows: tiles of 2, then of 1 after layer2's stride 2
  run_conv_spatial_case(p, {4});
}

TEST(ConvPlans, Pipeline2Spatial2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {1, 1};  // stem, layer1.0 | layer2.0, head: tiles cross the boundary one to one
  run_conv_spatial_case(p, {2, 2});
}

// Tiles crossing between stages of different spatial degrees are re-tiled by blocks of
// rows (layer1.0's output, 8 rows): 2 tiles to the whole image, the whole image to 2
// tiles, 2 tiles to 4 (and the gradients back).
TEST(ConvPlans, Pipeline2SpatialRetiled) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {1, 1};  // stem, layer1.0 | layer2.0, head
  for (std::vector<int> spatial : {std::vector<int>{2, 1}, {1, 2}, {2, 4}}) {
    SCOPED_TRACE("spatial " + std::to_string(spatial[0]) + " | " + std::to_string(spatial[1]));
    Workspace ws("conv-retile");
    RunSettings s = conv_digits();
    auto plan = resolve_conv_spatial(p, ws, spatial);
    expect_conv_close(run_threads(plan, train_options(ws, s)), run_reference(p, ws, s));
  }
}

// Tensor parallelism and the spatial split in one stage: tp 2 x spatial 2 on 4 ranks,
// rank = sp * 2 + tp (partitioner/layout.h). Each rank holds channel shard tp of tile sp:
// the convolutions split by columns and rows, their all-reduces within the tile's two
// ranks, the halos between the ranks of one shard in neighbouring tiles, the batch norms
// (on channel shards and on the reduced sums) reducing their statistics over the tiles.
TEST(ConvPlans, TensorParallel2Spatial2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2};
  {
    Workspace ws("conv-tp-spatial-layout");
    auto plan = resolve_conv_spatial(p, ws, {2});
    ASSERT_EQ(plan->layout.world(), 4);
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      partitioner::RankView v = partitioner::rank_view(*plan, r);
      EXPECT_EQ(v.coord.tp, r % 2);
      EXPECT_EQ(v.coord.sp, r / 2);
      EXPECT_EQ(v.tp_group, (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
      EXPECT_EQ(v.spatial_group, (std::vector<int>{r % 2, r % 2 + 2}));
      EXPECT_EQ(v.batchnorm_group, v.spatial_group);
      // layer1.0.conv1 by columns (half its 4 output channels) on a tile of 4 of the 8
      // rows with its halo; conv2 by rows (half its input channels).
      auto g = partitioner::physical_graph(*plan, r);
      auto node = [&](const std::string& name) -> const stages::Node& {
        for (const stages::Node& n : g->nodes)
          if (n.name == name) return n;
        throw std::runtime_error("no node " + name);
      };
      const stages::Node& c1 = node("layer1.0.conv1");
      const stages::Node& c2 = node("layer1.0.conv2");
      EXPECT_EQ(g->params[size_t(c1.params[0])].shape[0], 2);
      EXPECT_EQ(g->params[size_t(c2.params[0])].shape[1], 2);
      EXPECT_EQ(g->values[size_t(c1.inputs[0])].type.shape, (std::vector<int64_t>{4, 4, 8}));
      EXPECT_EQ(g->values[size_t(c2.inputs[0])].type.shape, (std::vector<int64_t>{2, 4, 8}));
      EXPECT_EQ(c1.attrs.at("halo"), json::array({1, 1}));
      EXPECT_EQ(c2.attrs.at("halo"), json::array({1, 1}));
    }
  }
  run_conv_spatial_case(p, {2});
}

// tp x spatial with pipeline stages around it: both stages tp 2 x spatial 2 (tiles one
// to one), and from tp 2 x spatial 2 to tp 1 x spatial 2 (each tile from its first shard
// rank, the gradient back to both), to the whole image, and to tp 2 x spatial 4.
TEST(ConvPlans, Pipeline2TensorParallelSpatial) {
  using Case = std::pair<std::vector<int>, std::vector<int>>;  // tp, spatial per stage
  for (const Case& c :
       {Case{{2, 2}, {2, 2}}, Case{{2, 1}, {2, 2}}, Case{{2, 1}, {2, 1}}, Case{{1, 2}, {2, 4}}}) {
    PlanSpec p;
    p.model = tiny_resnet();
    p.tp = c.first;  // stem, layer1.0 | layer2.0, head
    SCOPED_TRACE("tp " + std::to_string(c.first[0]) + " x spatial " + std::to_string(c.second[0]) +
                 " | tp " + std::to_string(c.first[1]) + " x spatial " +
                 std::to_string(c.second[1]));
    Workspace ws("conv-tp-spatial-pp");
    RunSettings s = conv_digits();
    auto plan = resolve_conv_spatial(p, ws, c.second);
    expect_conv_close(run_threads(plan, train_options(ws, s)), run_reference(p, ws, s));
  }
}

// tp 2 x spatial 2 x DP 2 (8 ranks, one micro-batch of 2 per replica): with
// sync_batchnorm the statistics are reduced over the tiles of a channel shard in both
// replicas (the one-process run with one micro-batch of 4); under zero1 the tiled
// parameters' state is cut over the tiles and replicas of a shard index (each replica's
// own statistics: the one-process run with two micro-batches of 2).
TEST(ConvPlans, TensorParallelSpatialDataParallel) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2};
  p.dp = 2;
  p.micro_batches = 1;
  PlanSpec whole = p;
  whole.dp = 1;
  whole.micro_batch_size = 4;
  RunSettings s = conv_digits();
  Workspace ws("conv-tp-spatial-dp");
  {
    SCOPED_TRACE("sync_batchnorm");
    auto got = run_threads(resolve_conv_spatial(p, ws, {2}, true), train_options(ws, s));
    expect_conv_close(got, run_reference(whole, ws, s));
  }
  {
    SCOPED_TRACE("zero1");
    PlanSpec z = p;
    z.optimizer_sharding = "zero1";
    auto got = run_threads(resolve_conv_spatial(z, ws, {2}), train_options(ws, s));
    expect_conv_close(got, run_reference(p, ws, s));
  }
}

// A checkpoint written under tp 2 x spatial 2 (tile 0's two ranks write their channel
// shards) resumes under spatial 2 alone, under tp 2 alone and in tp 2 x spatial 2 | tp 1,
// with the one-process loss curve.
TEST(ConvPlans, TensorParallelSpatialCheckpoint) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2};
  RunSettings s = conv_digits();
  auto train = [&](const PlanSpec& q, std::vector<int> spatial, Workspace& ws, int64_t to,
                   bool resume) {
    RunSettings rs = s;
    rs.steps = to;
    engine::PlanTrainOptions o = train_options(ws, rs);
    o.checkpoint_dir = ws.path("ckpt");
    o.checkpoint_every = 2;
    o.resume = resume;
    return run_threads(resolve_conv_spatial(q, ws, spatial), o);
  };
  using Case = std::pair<std::vector<int>, std::vector<int>>;  // tp, spatial per stage
  for (const Case& c : {Case{{1}, {2}}, Case{{2}, {1}}, Case{{2, 1}, {2, 1}}}) {
    PlanSpec after = p;
    after.tp = c.first;
    SCOPED_TRACE("resumed under " + after.describe());
    Workspace ws("conv-tp-spatial-ckpt");
    const auto want = run_reference(p, ws, s);
    const auto first = train(p, {2}, ws, 4, false);
    stages::Manifest m = stages::read_manifest(*stages::latest_checkpoint(ws.path("ckpt")));
    std::set<int> writers;
    for (const auto& f : m.shards) writers.insert(f.rank);
    EXPECT_EQ(writers, (std::set<int>{0, 1}));
    const auto rest = train(after, c.second, ws, 8, true);
    ASSERT_EQ(first.size(), 4u);
    ASSERT_EQ(rest.size(), 4u);
    for (size_t i = 0; i < 8; ++i) {
      const engine::StepRecord& r = i < 4 ? first[i] : rest[i - 4];
      EXPECT_EQ(r.step, int64_t(i + 1));
      EXPECT_NEAR(r.loss, want[i].loss, 1e-5 * want[i].loss) << "step " << i + 1;
    }
  }
}

// Two-direction and V schedules with spatial stages, every stage at spatial 2: DualPipeV
// (two chunks per rank, one direction) trains as one process; DualPipe (each chunk on two
// pipeline ranks, one per direction, merged only by their gradients) is refused for the
// ResNet, whose batch norms' running statistics its two copies would not share.
TEST(ConvPlans, DualPipeSpatial) {
  for (std::string schedule : {"dualpipe", "dualpipev"}) {
    SCOPED_TRACE(schedule);
    PlanSpec p;
    p.model = tiny_resnet();
    p.tp = {1, 1};
    p.schedule = schedule;
    Workspace ws("conv-dualpipe");
    RunSettings s = conv_digits();
    json j = plan_json(p, ws);
    for (json& st : j["stages"]) st["spatial"] = 2;
    j["devices"] = 4;
    partitioner::Plan plan = partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
    auto graph = partitioner::load_plan_model(plan);
    if (schedule == "dualpipe") {
      try {
        partitioner::resolve_plan(plan, graph);
        ADD_FAILURE() << "DualPipe resolved for a model with running statistics";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("$.schedule.name: \"dualpipe\" keeps two copies of "
                                             "each chunk"),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("(batchnorm2d)"), std::string::npos) << e.what();
      }
      continue;
    }
    auto resolved =
        std::make_shared<const partitioner::ResolvedPlan>(partitioner::resolve_plan(plan, graph));
    expect_conv_close(run_threads(resolved, train_options(ws, s)), run_reference(p, ws, s));
  }
}

// The measured timeline of the last of `steps` steps of the tiny ResNet split in two
// spatial tiles.
json spatial_trace(const std::string& name, int64_t steps) {
  PlanSpec p;
  p.model = tiny_resnet();
  Workspace ws(name);
  RunSettings s = conv_digits();
  s.steps = steps;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.trace_path = ws.path("trace.json");
  o.trace_steps = 1;
  run_threads(resolve_conv_spatial(p, ws, {2}), o);
  return json::parse(std::ifstream(o.trace_path));
}

// The measured timeline shows each halo receive as an event of its own (HALO_F, HALO_B
// of the micro-batch on the communication lane, the neighbouring tile as the peer).
TEST(ConvPlans, SpatialHalosOnTheTimeline) {
  const json trace = spatial_trace("conv-halo-trace", 2);
  std::map<std::pair<int, std::string>, std::set<int>> seen;  // (rank, kind) -> micro-batches
  for (const json& e : trace["traceEvents"]) {
    if (e.value("cat", "") != "HALO") continue;
    const int rank = e["pid"].get<int>();
    const std::string name = e["name"].get<std::string>();
    // A communication thread: 1, or 3 and up for transfers in flight at once.
    EXPECT_TRUE(e["tid"] == 1 || e["tid"] >= 3) << name << " on thread " << e["tid"];
    EXPECT_GE(e["dur"].get<double>(), 0.0) << name;
    EXPECT_EQ(e["args"]["peer"], 1 - rank) << name;
    seen[{rank, name.substr(0, 6)}].insert(e["args"]["micro_batch"].get<int>());
  }
  for (int rank : {0, 1})
    for (std::string kind : {"HALO_F", "HALO_B"})
      EXPECT_EQ(seen[std::make_pair(rank, kind)], (std::set<int>{0, 1, 2, 3}))
          << "rank " << rank << " " << kind;
}

// The convolutions compute their interior while their halos are in flight: on each rank
// and for each micro-batch, a halo receive's interval (HALO_F, HALO_B: posting it to the
// convolution finding its data there) overlaps the rows computed meanwhile (INTERIOR_F,
// INTERIOR_B on the compute lane). Only that they overlap, not by how much (a loaded
// machine).
TEST(ConvPlans, SpatialHalosOverlapTheInterior) {
  const json trace = spatial_trace("conv-halo-overlap", 1);
  struct Span {
    double start, end;
  };
  // (rank, direction F/B, micro-batch) -> the halo receives' and the interiors' intervals
  std::map<std::tuple<int, char, int>, std::vector<Span>> halos, interiors;
  for (const json& e : trace["traceEvents"]) {
    const std::string cat = e.value("cat", "");
    if (cat != "HALO" && cat != "INTERIOR") continue;
    const std::string name = e["name"].get<std::string>();
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    const char dir = name[name.find('_') + 1];
    auto key = std::make_tuple(e["pid"].get<int>(), dir, e["args"]["micro_batch"].get<int>());
    if (cat == "INTERIOR") {
      EXPECT_EQ(e["tid"], 0) << name;
      EXPECT_EQ(name.rfind("INTERIOR_", 0), 0u) << name;
    }
    (cat == "HALO" ? halos : interiors)[key].push_back({ts, ts + dur});
  }
  for (int rank : {0, 1})
    for (char dir : {'F', 'B'})
      for (int mb = 0; mb < 4; ++mb) {
        const auto key = std::make_tuple(rank, dir, mb);
        bool overlap = false;
        for (const Span& h : halos[key])
          for (const Span& i : interiors[key])
            overlap = overlap || (h.start < i.end && i.start < h.end);
        EXPECT_TRUE(overlap) << "rank " << rank << " " << dir << mb << ": " << halos[key].size()
                             << " halo receives, " << interiors[key].size() << " interiors";
      }
}

// A graph whose only halos are its poolings' (a 1x1 convolution, max pooling 3/2/1 with
// a top halo only, average pooling 3/1/1 with both): digits [1, 8, 8] -> 10 classes.
json pooled_graph() {
  auto node = [](std::string name, std::string op, std::string in, json attrs = nullptr,
                 json params = nullptr) {
    json n = {{"name", name}, {"op", op}, {"inputs", {in}}, {"outputs", {name}}};
    if (!attrs.is_null()) n["attrs"] = attrs;
    if (!params.is_null()) n["params"] = params;
    return n;
  };
  const json normal = {{"type", "normal"}, {"std", 0.5}};
  json loss = node("loss", "cross_entropy", "fc");
  loss["inputs"] = {"fc", "labels"};
  return {
      {"type", "graph"},
      {"name", "pooled"},
      {"inputs", json::array({{{"name", "images"}, {"shape", {1, 8, 8}}, {"dtype", "f32"}},
                              {{"name", "labels"}, {"shape", json::array()}, {"dtype", "i32"}}})},
      {"params",
       json::array({{{"name", "conv.weight"}, {"shape", {4, 1, 1, 1}}, {"init", normal}},
                    {{"name", "conv.bias"}, {"shape", {4}}, {"init", normal}},
                    {{"name", "fc.weight"}, {"shape", {10, 4}}, {"init", normal}},
                    {{"name", "fc.bias"}, {"shape", {10}}, {"init", {{"type", "zeros"}}}}})},
      {"layers",
       json::array(
           {{{"name", "stem"},
             {"nodes",
              {node("conv", "conv2d", "images", nullptr,
                    {{"weight", "conv.weight"}, {"bias", "conv.bias"}}),
               node("relu", "relu", "conv")}}},
            {{"name", "pool"},
             {"nodes",
              {node("maxpool", "maxpool2d", "relu", {{"kernel", 3}, {"stride", 2}, {"padding", 1}}),
               node("avgpool", "avgpool2d", "maxpool",
                    {{"kernel", 3}, {"stride", 1}, {"padding", 1}})}}},
            {{"name", "head"},
             {"nodes",
              {node("gap", "global_avgpool", "avgpool"),
               node("fc", "linear", "gap", nullptr, {{"weight", "fc.weight"}, {"bias", "fc.bias"}}),
               loss}}}})},
      {"loss", "loss"}};
}

// The poolings compute their interior while their halos are in flight, as the
// convolutions do: the spatial run equals the one-process run, and on the measured
// timeline every halo receive (here only the poolings') overlaps the rows computed
// meanwhile on its rank (the hidden part bench/halo_hidden.py reads; not how much, on a
// loaded machine).
TEST(ConvPlans, SpatialPoolingHalosHidden) {
  PlanSpec p;
  p.model = pooled_graph();
  run_conv_spatial_case(p, {2});
  Workspace ws("conv-pool-halo");
  RunSettings s = conv_digits();
  s.steps = 1;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.trace_path = ws.path("trace.json");
  o.trace_steps = 1;
  run_threads(resolve_conv_spatial(p, ws, {2}), o);
  const json trace = json::parse(std::ifstream(o.trace_path));
  std::vector<json> halos, interiors;
  for (const json& e : trace["traceEvents"])
    (e.value("cat", "") == "HALO" ? halos : interiors).push_back(e);
  std::set<std::pair<int, std::string>> kinds;  // (rank, HALO_F / HALO_B)
  for (const json& h : halos) {
    const std::string name = h["name"].get<std::string>();
    kinds.insert({h["pid"].get<int>(), name.substr(0, 6)});
    const double h0 = h["ts"].get<double>(), h1 = h0 + h["dur"].get<double>();
    bool hidden = false;
    for (const json& i : interiors) {
      if (i.value("cat", "") != "INTERIOR" || i["pid"] != h["pid"] ||
          i["args"]["micro_batch"] != h["args"]["micro_batch"] ||
          i["name"].get<std::string>()[9] != name[5])
        continue;
      const double i0 = i["ts"].get<double>(), i1 = i0 + i["dur"].get<double>();
      hidden = hidden || (h0 < i1 && i0 < h1);
    }
    EXPECT_TRUE(hidden) << "rank " << h["pid"] << " " << name;
  }
  // Both directions on both ranks (each rank receives one pooling's halos or more).
  EXPECT_EQ(kinds.size(), 4u);
}

// Spatial 2 x DP 2, one micro-batch of 2 samples per replica. Without sync_batchnorm each
// replica's statistics are its own micro-batch's: the one-process run with two
// micro-batches of 2. With it they are the 4 samples': the one-process run with one
// micro-batch of 4, which the first differs from.
TEST(ConvPlans, SpatialDataParallelSyncBatchnorm) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.dp = 2;
  p.micro_batches = 1;
  PlanSpec whole = p;  // one micro-batch of the global batch
  whole.dp = 1;
  whole.micro_batch_size = 4;
  RunSettings s = conv_digits();
  Workspace ws("conv-syncbn");
  std::vector<engine::StepRecord> per_replica = run_reference(p, ws, s);
  std::vector<engine::StepRecord> together = run_reference(whole, ws, s);
  {
    SCOPED_TRACE("without sync_batchnorm");
    auto got = run_threads(resolve_conv_spatial(p, ws, {2}), train_options(ws, s));
    expect_conv_close(got, per_replica);
    expect_conv_close(got, together, false);
  }
  {
    SCOPED_TRACE("with sync_batchnorm");
    auto got = run_threads(resolve_conv_spatial(p, ws, {2}, true), train_options(ws, s));
    expect_conv_close(got, together);
    expect_conv_close(got, per_replica, false);
  }
  {
    SCOPED_TRACE("sync_batchnorm without the spatial split");
    auto got = run_threads(resolve_conv_spatial(p, ws, {1}, true), train_options(ws, s));
    expect_conv_close(got, together);
  }
}

// ZeRO under spatial 2 x DP 2. The convolutions' and batch norms' parameters are used on
// tiles: summed over both tiles of both replicas, their optimizer state is cut in four
// parts over those ranks; the classifier's (after the pooling: summed over the replicas
// of its tile) in two parts on each tile. zero1 and zero2 train as `none` does within
// 1e-6 over 20 steps, not bit for bit: the four members' reduce-scatter is not the
// all-reduce's algorithm (as with four replicas, test_zero.cpp), the norm adds the parts
// in another order and zero2 sums over the ranks per micro-batch first.
TEST(ConvPlans, SpatialDataParallelZero) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.dp = 2;
  RunSettings s = conv_digits();
  auto train = [&](const std::string& z, const RunSettings& rs) {
    PlanSpec q = p;
    q.optimizer_sharding = z;
    Workspace ws("conv-zero");
    return run_threads(resolve_conv_spatial(q, ws, {2}), train_options(ws, rs));
  };
  auto expect_within = [](const std::vector<engine::StepRecord>& got,
                          const std::vector<engine::StepRecord>& want, double tol,
                          const std::string& what) {
    ASSERT_EQ(got.size(), 20u) << what;
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i].loss, want[i].loss, tol * std::abs(want[i].loss))
          << what << " step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, tol * std::abs(want[i].grad_norm))
          << what << " step " << i + 1;
    }
  };
  const auto none = train("none", s);
  expect_within(train("zero1", s), none, 1e-6, "zero1");
  expect_within(train("zero2", s), none, 1e-6, "zero2");

  // The parts: per parameter, the four ranks' optimizer shards.
  p.optimizer_sharding = "zero1";
  Workspace ws("conv-zero-parts");
  auto plan = resolve_conv_spatial(p, ws, {2});
  const int n = plan->layout.world();
  ASSERT_EQ(n, 4);
  struct Part {
    int rank;
    int64_t begin, end, state, numel;
  };
  std::map<std::string, std::vector<Part>> parts;
  inspect_rank_engines(plan, [&](int r, engine::RankEngine& e) {
    for (const auto& [stage, st] : e.stages())
      for (int id : st->param_ids()) {
        if (!e.graph().params[size_t(id)].trainable) continue;
        auto [b, end] = st->optimizer_shard(id);
        int64_t state = 0;
        for (const auto& [name, t] : st->optimizer_state(id)) state += t.numel();
        parts[e.graph().params[size_t(id)].name].push_back(
            {r, b, end, state, st->param(id).numel()});
      }
  });
  int tiled = 0, per_tile = 0;
  int64_t tiled_numel = 0;
  std::vector<int64_t> held(size_t(n), 0);  // per rank: elements of tiled parameters' parts
  for (const auto& [name, ps] : parts) {
    SCOPED_TRACE(name);
    ASSERT_EQ(ps.size(), 4u);
    int64_t covered = 0;
    const bool head = name.rfind("fc.", 0) == 0;
    for (const Part& x : ps) {
      EXPECT_EQ(x.state, 2 * (x.end - x.begin));  // AdamW: two moments of the part
      covered += x.end - x.begin;
      if (!head) held[size_t(x.rank)] += x.end - x.begin;
    }
    // Used on tiles: the four parts cover it once; after the pooling, twice (each tile's
    // replicas, ranks {0, 2} and {1, 3}).
    EXPECT_EQ(covered, (head ? 2 : 1) * ps[0].numel);
    ++(head ? per_tile : tiled);
    if (!head) tiled_numel += ps[0].numel;
  }
  EXPECT_GT(tiled, 10);
  EXPECT_EQ(per_tile, 2);  // fc.weight, fc.bias
  // The buckets are cut in equal parts: each rank holds a quarter of the tiled state.
  for (int r = 0; r < n; ++r)
    EXPECT_NEAR(double(held[size_t(r)]), double(tiled_numel) / 4, 0.01 * double(tiled_numel))
        << "rank " << r;
}

// A zero1 checkpoint of spatial 2 x DP 2: every rank (both tiles of both replicas) writes
// its part of the state, and the run resumed from step 4 under the same plan, and under
// `none`, continues as the uninterrupted one (the same plan: bit for bit; `none`'s
// reduction order differs, within 1e-6).
TEST(ConvPlans, SpatialZeroCheckpoint) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.dp = 2;
  auto train = [&](const std::string& z, Workspace& ws, const std::string& dir, int64_t to,
                   bool resume) {
    PlanSpec q = p;
    q.optimizer_sharding = z;
    RunSettings s = conv_digits();
    s.steps = to;
    engine::PlanTrainOptions o = train_options(ws, s);
    o.checkpoint_dir = dir;
    o.checkpoint_every = 2;
    o.resume = resume;
    return run_threads(resolve_conv_spatial(q, ws, {2}), o);
  };
  for (std::string after : {"zero1", "none"}) {
    SCOPED_TRACE("zero1 -> " + after);
    Workspace ws("conv-zero-ckpt");
    const auto want = train(after, ws, ws.path("whole"), 6, false);
    train("zero1", ws, ws.path("ckpt"), 4, false);
    stages::Manifest m = stages::read_manifest(*stages::latest_checkpoint(ws.path("ckpt")));
    std::set<int> writers;
    for (const auto& f : m.shards)
      if (f.kind == "optimizer") writers.insert(f.rank);
    EXPECT_EQ(writers, (std::set<int>{0, 1, 2, 3}));
    const auto got = train(after, ws, ws.path("ckpt"), 6, true);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got[i].step, int64_t(i + 5));
      if (after == "zero1") {
        EXPECT_EQ(got[i].loss, want[i + 4].loss) << "step " << i + 5;
      } else {
        EXPECT_NEAR(got[i].loss, want[i + 4].loss, 1e-6 * want[i + 4].loss) << "step " << i + 5;
      }
    }
  }
}

std::string conv_spatial_error(const PlanSpec& p, std::vector<int> spatial) {
  Workspace ws("conv-spatial-bad");
  try {
    resolve_conv_spatial(p, ws, spatial);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ConvPlans, SpatialRefused) {
  PlanSpec p;
  p.model = tiny_resnet();
  // 8 rows over 8 tiles: one row each, layer2's stride 2 cannot split it.
  std::string e = conv_spatial_error(p, {8});
  EXPECT_NE(e.find("plan.json: $.stages[0].spatial: spatial degree 8: conv2d node "
                   "'layer2.0.conv1'"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("does not divide the tile's 1 rows"), std::string::npos) << e;
  // A model without images.
  PlanSpec mlp;
  mlp.model = tiny_mlp_json({16});
  e = conv_spatial_error(mlp, {2});
  EXPECT_NE(e.find("no floating image input"), std::string::npos) << e;
}

// What `run` logs at warning level and above.
std::string warnings_of(const std::function<void()>& run) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  sink->set_level(spdlog::level::warn);
  spdlog::default_logger()->sinks().push_back(sink);
  try {
    run();
  } catch (...) {
    spdlog::default_logger()->sinks().pop_back();
    throw;
  }
  spdlog::default_logger()->sinks().pop_back();
  return log.str();
}

// Resumed on other image data (another directory of another image count), a run warns as
// it does for token data, naming $.data.train and both; on the data its checkpoint was
// written for, it does not. It had compared the checkpoint's data with itself. One
// process, and under a plan of two pipeline ranks.
TEST(ConvPlans, ResumeOnOtherImageDataWarns) {
  Workspace ws("conv-resume-images");
  const std::string other = ws.path("digits-40");
  std::filesystem::create_directories(other);
  {
    stages::ImageDataset digits(conv_digits().data);
    memory::Tensor im = memory::Tensor::empty({40, 1, 8, 8}, memory::DType::f32);
    memory::Tensor lb = memory::Tensor::empty({40}, memory::DType::i64);
    digits.fill(5, 0, 0, 40, im, lb);
    stages::write_npy(other + "/images.npy", im);
    stages::write_npy(other + "/labels.npy", lb);
  }
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {1, 1};
  for (const bool plan : {false, true}) {
    SCOPED_TRACE(plan ? "plan" : "one process");
    const std::string ck = ws.path(plan ? "ck-plan" : "ck-one");
    auto run = [&](int64_t steps, const std::string& data) {
      RunSettings s = conv_digits();
      s.steps = steps;
      s.data = data;
      s.configure = [&](engine::LoopOptions& o) {
        o.checkpoint_dir = ck;
        o.resume = steps > 1;
      };
      return warnings_of([&] {
        if (plan)
          run_threads(resolve(p, ws), train_options(ws, s));
        else
          run_reference(p, ws, s);
      });
    };
    run(1, conv_digits().data);
    std::string text = run(2, other);
    // Each side with its files' fingerprint ("contents") before the directory.
    EXPECT_NE(text.find("$.data.train: the checkpoint was written for {\"classes\":10,"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("\"dir\":\"" + conv_digits().data + "\",\"images\":1797"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("continuing with {\"classes\":10,"), std::string::npos) << text;
    EXPECT_NE(text.find("\"dir\":\"" + other + "\",\"images\":40,\"shape\":[1,8,8]}"),
              std::string::npos)
        << text;
    text = run(3, other);
    EXPECT_EQ(text.find("$.data"), std::string::npos) << text;
  }
}

// --eval-every and --eval-batches on image data: evaluation is for token data, said first
// (they had asked for held-out data, which image data refuses).
TEST(ConvPlans, EvalEveryOnImagesIsForTokenData) {
  Workspace ws("conv-eval-images");
  PlanSpec p;
  p.model = tiny_resnet();
  RunSettings s = conv_digits();
  s.steps = 1;
  const std::vector<std::pair<std::function<void(engine::LoopOptions&)>, std::string>> cases = {
      {[](engine::LoopOptions& o) { o.eval_every = 2; }, "--eval-every"},
      {[](engine::LoopOptions& o) { o.eval_batches = 2; }, "--eval-batches"}};
  for (const auto& [configure, flag] : cases) {
    s.configure = configure;
    for (const bool plan : {false, true}) {
      SCOPED_TRACE(flag + (plan ? " plan" : " one process"));
      try {
        if (plan)
          run_threads(resolve(p, ws), train_options(ws, s));
        else
          run_reference(p, ws, s);
        ADD_FAILURE() << flag << " ran on images";
      } catch (const InputError& e) {
        EXPECT_EQ(std::string(e.what()), flag + ": evaluation is for token data");
      }
    }
  }
}

}  // namespace
}  // namespace baton::engine_testing
