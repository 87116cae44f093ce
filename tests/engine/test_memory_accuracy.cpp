// The memory estimate against the measured peak: small plans run as one process per rank
// (`baton launch`, so that each rank's peak is its own allocator's), and each rank's
// `peak_bytes` in the run's summary is within 3% of its `estimated_peak_bytes` (`baton
// plan --check`'s figure) and never above it by more than 3%. The plans cover what the
// estimate must count beyond the stages' tensors: data-parallel gradient buckets and
// the all-reduces' scratch, DualPipe's replicated chunks, tensor-parallel collectives
// inside ops, receives posted ahead and the input loader's staged micro-batches, values
// handed between a V's two chunks on one rank, and of the spatial split: halos, tiles re-tiled
// between stages (their blocks of rows) and the optimizer state (and zero2's gradients) sharded
// over tiles and replicas. (The equivalence grid, the example plans and configs A and B:
// test_memory_grid.cpp, slow; docs/partitioner.md, "Memory accuracy".)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "engine_harness.h"
#include "process_helpers.h"
#include "stages/image_data.h"
#include "transport/detail/collectives.h"

namespace baton::engine_testing {
namespace {

void expect_accurate(const PlanSpec& spec, const json& extra = json::object(),
                     double over_slack = 0) {
  SCOPED_TRACE(spec.describe() + " " + extra.dump());
  std::printf("%s\n", spec.describe().c_str());
  Workspace ws("memacc");
  json plan = plan_json(spec, ws);
  plan.update(extra);
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), plan["devices"].get<int>(), ws.dir, " --steps 2",
                         data_file(), 0.03, over_slack);
}

PlanSpec gpt(std::vector<int> tp, int dp, const std::string& schedule) {
  PlanSpec p;
  p.model = tiny_gpt_json();
  p.tp = std::move(tp);
  p.dp = dp;
  p.schedule = schedule;
  return p;
}

// Data parallelism: the bucket's flat copy and the ring all-reduce's window (here most
// of a tiny model's peak).
TEST(MemoryAccuracy, DataParallelBuckets) {
  expect_accurate(gpt({1, 1}, 2, "1f1b"));
}

// Every kind at once: TP collectives in the ops, buckets over DP, a V schedule's two
// chunks per rank.
TEST(MemoryAccuracy, PipelineTensorDataParallel) {
  expect_accurate(gpt({2, 2}, 2, "zb-v"));
}

// A vocabulary TP does not divide, its head recomputed: the padded rank's loss masks a copy
// of the logits (they have another reader), made in the gradient's buffer. A copy of its
// own had put that rank one logits shard over the estimate (25 MB at GPT-2's vocabulary).
TEST(MemoryAccuracy, PaddedVocabularyRecomputed) {
  PlanSpec p;
  p.model = tiny_gpt_json(1);
  p.model["vocab_size"] = 4099;
  p.tp = {2};
  p.micro_batches = 1;
  expect_accurate(
      p,
      {{"stages", json::array({{{"layers", {"embed", "h.0", "head"}}, {"recompute", {"head"}}}})}});
}

// A post-validated optimizer step: the copy of the parameters and optimizer state it
// takes before updating (docs/engine.md), here above the tied wte's bucket.
TEST(MemoryAccuracy, PostValidatedStep) {
  expect_accurate(gpt({1, 1}, 1, "1f1b"), {{"optimizer_step", "post-validated"}});
}

// A post-validated step under ZeRO copies a replica's part of each sharded parameter, but
// the whole of one zero1 leaves whole: GPT-2's wte tied over the pipeline ranks (1 MiB at a
// vocabulary of 4096), every DualPipe chunk. Taken as 1/dp of every parameter, these
// estimates had been 17-27% under (1F1B with every stage recomputed, where the step is
// the peak; DualPipe under zero1 and zero2). DualPipeV under zero1 with its outer chunks
// recomputed: the replicas of a pipeline rank copy different parts (here the second copies
// the tied wte whole on both its chunks, the first none of it), and the second's estimate,
// replica 0's with its own parts of the state only, had been 3.4% under (29,056 bytes).
TEST(MemoryAccuracy, PostValidatedStepUnderZero) {
  auto with_stages = [](std::vector<std::pair<int, bool>> stages) {
    json out = {{"optimizer_step", "post-validated"}, {"stages", json::array()}};
    int first = 0;
    for (auto [layers, recompute] : stages) {
      out["stages"].push_back({{"layers", {first, first + layers}}, {"recompute", recompute}});
      first += layers;
    }
    return out;
  };
  PlanSpec tied = gpt({1, 1}, 2, "1f1b");
  tied.model = {{"type", "gpt2"}, {"n_layer", 2},      {"n_head", 2},
                {"n_embd", 64},   {"n_positions", 16}, {"vocab_size", 4096}};
  tied.micro_batches = 2;
  tied.micro_batch_size = 1;
  tied.optimizer_sharding = "zero1";
  expect_accurate(tied, with_stages({{2, true}, {2, true}}));
  PlanSpec dual = gpt({1, 1}, 2, "dualpipe");
  dual.model = {{"type", "gpt2"}, {"n_layer", 6},      {"n_head", 2},
                {"n_embd", 32},   {"n_positions", 32}, {"vocab_size", 256}};
  dual.micro_batch_size = 1;
  dual.optimizer_sharding = "zero1";
  expect_accurate(dual, with_stages({{4, false}, {4, false}}));
  dual.optimizer_sharding = "zero2";
  expect_accurate(dual, with_stages({{4, false}, {4, true}}));
  dual.schedule = "dualpipev";
  dual.optimizer_sharding = "zero1";
  expect_accurate(dual, with_stages({{2, true}, {2, false}, {2, false}, {2, true}}));
}

// A parameter server with staleness: each replica's s pulls in flight of the parameters
// it serves (GPT-2's wte, tied over the pipeline ranks, is all-reduced, not served); and
// an extra server rank, which keeps its part of each of the s pulls.
// (The runs take more steps than s: the pulls in flight fill up after s steps.) The
// server's parts also size the replicas' reduce-scatter window.
TEST(MemoryAccuracy, StaleParameterServer) {
  for (const auto& [tp, sync] :
       {std::pair{std::vector<int>{1, 1}, json{{"max_staleness", 3}}},
        std::pair{std::vector<int>{1}, json{{"max_staleness", 4}, {"ps_ranks", 1}}}}) {
    SCOPED_TRACE(sync.dump());
    Workspace ws("memacc-ps");
    json plan = plan_json(gpt(tp, 2, "1f1b"), ws);
    plan["dp_sync"] = sync;
    plan["dp_sync"]["mode"] = "parameter-server";
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    expect_memory_accurate(ws.path("plan.json"),
                           plan["devices"].get<int>() + sync.value("ps_ranks", 0), ws.dir,
                           " --steps 6");
  }
}

// Extra server ranks beside a pipeline (PP 2 x DP 2, 1F1B): each pipeline rank's served
// bucket is under 32 KiB, so its push is a direct exchange, in which the server (owning
// every part) receives each member's whole bucket (3 x 27 KiB: left out, the server's
// estimate had been 13,888 bytes short, and a run capped at it ran out of memory) and a
// replica (owning none) nothing (counted, the replicas' estimates had been 19-29% over).
// One server at staleness 0, two at staleness 1 (each sending its part, no all-gather
// output). The servers' and the replicas' estimates are never under the measured peak (the
// first stage's had been 64 bytes under in about 1 run of 5: the loader's thread making a
// micro-batch's targets, which that stage drops, at its peak).
TEST(MemoryAccuracy, ParameterServerRanksOfAPipeline) {
  for (const json& sync :
       {json{{"max_staleness", 0}, {"ps_ranks", 1}}, json{{"max_staleness", 1}, {"ps_ranks", 2}}}) {
    SCOPED_TRACE(sync.dump());
    Workspace ws("memacc-ps-pp");
    std::ofstream(ws.path("model.json"))
        << json{{"type", "gpt2"}, {"n_layer", 3},      {"n_head", 2},
                {"n_embd", 16},   {"n_positions", 16}, {"vocab_size", 256}}
               .dump();
    json plan = {{"version", 1},
                 {"model", "model.json"},
                 {"devices", 4},
                 {"parallel", {{"pp", 2}, {"dp", 2}}},
                 {"batch", {{"micro_batch_size", 1}}},
                 {"schedule", {{"name", "1f1b"}, {"micro_batches", 4}}},
                 {"stages", {{{"layers", {0, 3}}}, {{"layers", {3, 5}}}}},
                 {"dp_sync", sync}};
    plan["dp_sync"]["mode"] = "parameter-server";
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const int ranks = 4 + sync["ps_ranks"].get<int>();
    expect_memory_accurate(ws.path("plan.json"), ranks, ws.dir, " --steps 4");
    const json summary = json::parse(std::ifstream(ws.path("summary.json")));
    for (const json& r : summary["ranks"])
      EXPECT_GE(r["estimated_peak_bytes"].get<int64_t>(), r["peak_bytes"].get<int64_t>())
          << "rank " << r["rank"];
  }
}

// The one-time moments beyond a step, on small models whose activations leave them the
// peak. The MLP (n_embd 8, hidden [48, 32, 48, 48]) at TP 2 under SGD: a shard's pieces
// were drawn into a temporary beside the weights and gradients (117,888 bytes measured,
// 95,872 estimated, and a cap between them ran out of memory before the first step);
// they are drawn in place.
TEST(MemoryAccuracy, TensorParallelStartUp) {
  Workspace ws("memacc-tp-init");
  std::ofstream(ws.path("mlp.json")) << json{
      {"type", "mlp"},       {"name", "m"}, {"context", 8},
      {"vocab_size", 256},   {"n_embd", 8}, {"hidden", {48, 32, 48, 48}},
      {"activation", "relu"}}.dump();
  const json plan = {{"version", 1},
                     {"model", "mlp.json"},
                     {"devices", 2},
                     {"parallel", {{"tp", 2}}},
                     {"batch", {{"micro_batch_size", 1}}},
                     {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
                     {"optimizer", "sgd"}};
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), 2, ws.dir, " --steps 2 --optimizer sgd");
}

// A parameter server over two replicas of a small MLP with small buckets: at staleness 1
// the step's pull is posted (every bucket's output, the rank's part, its parts cloned)
// before the oldest completes, beside the one in flight (left out, 15-24% under at
// --bucket-mib 0.001 and 0.02); with an extra server rank at staleness 0, replica 0 seeds
// it at the first step, each bucket built whole (24% under on replica 0 alone).
TEST(MemoryAccuracy, ParameterServerMoments) {
  for (const auto& [sync, ranks] : {std::pair{json{{"max_staleness", 1}, {"ps_ranks", 0}}, 2},
                                    std::pair{json{{"max_staleness", 0}, {"ps_ranks", 1}}, 3}})
    for (const char* mib : {"0.001", "0.02"}) {
      SCOPED_TRACE(sync.dump() + " --bucket-mib " + mib);
      Workspace ws("memacc-ps-moments");
      std::ofstream(ws.path("mlp.json"))
          << json{{"type", "mlp"}, {"name", "m"},        {"context", 8},        {"vocab_size", 256},
                  {"n_embd", 8},   {"hidden", {16, 32}}, {"activation", "relu"}}
                 .dump();
      json plan = {{"version", 1},
                   {"model", "mlp.json"},
                   {"devices", 2},
                   {"parallel", {{"dp", 2}}},
                   {"batch", {{"micro_batch_size", 1}}},
                   {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
                   {"dp_sync", sync}};
      plan["dp_sync"]["mode"] = "parameter-server";
      std::ofstream(ws.path("plan.json")) << plan.dump(2);
      expect_memory_accurate(ws.path("plan.json"), ranks, ws.dir,
                             std::string(" --steps 3 --bucket-mib ") + mib);
    }
}

// DualPipe: every chunk on two ranks, reduced like data parallelism.
TEST(MemoryAccuracy, DualPipeReplicas) {
  expect_accurate(gpt({1, 1}, 1, "dualpipe"));
}

// The MLP with TP and four pipeline ranks: receives posted ahead, tied-free reductions.
TEST(MemoryAccuracy, MlpFourStages) {
  PlanSpec p;
  p.model = tiny_mlp_json();
  p.tp = {2, 2, 1, 1};
  p.micro_batches = 8;
  p.micro_batch_size = 1;
  expect_accurate(p);
}

// The spatial split (examples/models/resnet-tiny.json on the digits images): tiles and
// halos, and tiles re-tiled between stages of different degrees, 2 | 1 and 1 | 2, whose
// blocks of rows are received apart and sent as copies (Executor::post_recv, do_send);
// `zero`: spatial 2 x DP 2 with the tiled parameters' optimizer state (and under zero2
// their gradients) sharded over the tiles and replicas.
// `over`: how far above the measured peak the estimate may be.
// `tp`: the tensor-parallel degrees (empty: 1 on every pipeline rank).
void expect_spatial_accurate(std::vector<int> spatial, int dp, const std::string& zero,
                             double over = 0.03, std::vector<int> tp = {}) {
  PlanSpec p;
  p.model = json::parse(std::ifstream(source_dir() + "/examples/models/resnet-tiny.json"));
  p.tp = tp.empty() ? std::vector<int>(spatial.size(), 1) : tp;
  p.dp = dp;
  p.optimizer_sharding = zero;
  std::string what = p.describe() + " spatial";
  for (int s : spatial) what += " " + std::to_string(s);
  SCOPED_TRACE(what);
  std::printf("%s\n", what.c_str());
  Workspace ws("memacc-spatial");
  json plan = plan_json(p, ws);
  int devices = 0;
  for (size_t k = 0; k < spatial.size(); ++k) {
    plan["stages"][k]["spatial"] = spatial[k];
    devices += p.tp[k] * spatial[k];
  }
  plan["devices"] = dp * devices;
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), dp * devices, ws.dir, " --steps 2",
                         source_dir() + "/examples/data/digits", over);
}

// 2 | 1: the whole-image rank receives two blocks of rows per micro-batch (without them
// it was 5.2% under); the tiles exchange halos on one side only (counting both sides, the
// walk was 3.4% over, 6400 bytes). 1 | 2: the whole-image rank sends copies and receives
// the gradients' blocks; it had been 3.0% over (7936 bytes) while every send was counted
// through the next compute action: under UCX's rendezvous size a send is done at once.
TEST(MemoryAccuracy, SpatialRetiled) {
  expect_spatial_accurate({2, 1}, 1, "");
  expect_spatial_accurate({1, 2}, 1, "");
}

// Tensor parallelism and the spatial split in one stage: tiles of channel shards (their
// halos C / t rows where the input is split by channels), the tensor-parallel all-reduces
// on tiles (measured: the estimate equal to the peak); and with a second stage of tp 1 x
// spatial 2, each tile re-sent whole from its first shard rank. There the first stage is
// exact; it had been 3.8% (4608 bytes) while its second F's tile, a send under UCX's
// rendezvous size and so done at once, was counted through the first B, then 0.4% while
// the walk held its backward's halo rows sent through the adds of those received.
TEST(MemoryAccuracy, TensorParallelSpatial) {
  expect_spatial_accurate({2}, 1, "", 0.03, {2});
  expect_spatial_accurate({2, 2}, 1, "", 0.03, {2, 1});
}

// zero1 and zero2 over the tiles and replicas (zero2: the W's gradients, one bucket of
// them reduce-scattered in place over four ranks with the ring's window).
TEST(MemoryAccuracy, SpatialZero) {
  expect_spatial_accurate({2}, 2, "zero1");
  expect_spatial_accurate({2}, 2, "zero2");
}

// resnet-tiny, PP 2 x TP [1, 2] x DP 2, one micro-batch: the second stage's data-parallel
// bucket (all its gradients) became final inside its last BW before the tp_copy's
// all-reduce of the input gradient, and its all-reduce, started there, ran on the
// communicator's thread whenever that picked it up: with its scratch over the tp_copy's
// or after the BW, measured peaks 14% apart from run to run, the estimate (which counts
// the reduction at the step's end) up to 19% under (255,744 measured, 206,592
// estimated), and `baton plan --check` passed a device_memory the run exceeded. A host
// transport's bucket now starts when the compute action ends: the same peak on every
// run and rank. The estimate had been 4.8% over (9,472 bytes: the last BW's input gradient,
// counted as sent but not done at the step's end); a send under UCX's rendezvous size is
// copied out and done at once (transport::p2p_rendezvous_bytes), and the estimate is now
// within 64 bytes.
TEST(MemoryAccuracy, ConvTensorDataParallelBucketAfterTheW) {
  Workspace ws("memacc-conv-tp-dp");
  const json plan = {
      {"version", 1},
      {"model", source_dir() + "/examples/models/resnet-tiny.json"},
      {"devices", 6},
      {"parallel", {{"dp", 2}, {"pp", 2}, {"tp", {1, 2}}}},
      {"batch", {{"micro_batch_size", 4}}},
      {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
      {"stages", {{{"layers", {"stem", "layer1.0"}}}, {{"layers", {"layer2.0", "head"}}}}}};
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), 6, ws.dir, " --steps 2",
                         source_dir() + "/examples/data/digits");
}

// The ResNet example plans (spatial 2 on both stages, with DP 2 or with TP 2), as the README
// runs them: the first stage had been 3.8% and 4.8% over (about 10 KiB: its second F's
// output tile, a send under UCX's rendezvous size, counted through the first B).
TEST(MemoryAccuracy, ResNetExamplePlans) {
  for (const char* name : {"resnet-pp2-spatial2-dp2.json", "resnet-pp2-tp2-spatial2.json"}) {
    SCOPED_TRACE(name);
    std::printf("%s\n", name);
    Workspace ws("memacc-resnet-examples");
    expect_memory_accurate(source_dir() + "/examples/plans/" + name, 8, ws.dir, " --steps 2",
                           source_dir() + "/examples/data/digits");
  }
}

// A ResNet of 8 x 8 images whose plan (stages, schedule, parallel) is `fields`, on the digits.
void expect_tiny_resnet_accurate(const std::string& name, const json& model, const json& fields,
                                 int devices, const std::string& flags = " --steps 3",
                                 double over = 0.03) {
  SCOPED_TRACE(name + " " + fields.dump());
  std::printf("%s %s\n", name.c_str(), fields.dump().c_str());
  Workspace ws("memacc-" + name);
  std::ofstream(ws.path("r.json")) << model.dump();
  json plan = {{"version", 1}, {"model", ws.path("r.json")}, {"devices", devices}};
  plan.update(fields);
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), devices, ws.dir, flags,
                         source_dir() + "/examples/data/digits", over);
}

json tiny_resnet(const std::string& block, std::vector<int> strides) {
  return {{"type", "resnet"},   {"name", "r"},        {"in_channels", 1},  {"image_size", 8},
          {"classes", 10},      {"stem_channels", 8}, {"stem_kernel", 3},  {"stem_stride", 1},
          {"stem_pool", false}, {"block", block},     {"widths", {8, 16}}, {"depths", {1, 1}},
          {"strides", strides}};
}

// A value re-tiled to a higher spatial degree is sent in blocks of rows, each a copy made
// while Executor::do_send still holds the whole value: a head sending its input gradient
// back to spatial 2 had been 32% under (only the copies counted), a stem sending its
// output to spatial 2 15% under.
TEST(MemoryAccuracy, WholeValueBesideItsBlocks) {
  const json model = tiny_resnet("basic", {1, 1});
  expect_tiny_resnet_accurate(
      "blocks-back", model,
      {{"parallel", {{"pp", 2}}},
       {"batch", {{"micro_batch_size", 1}}},
       {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
       {"stages", {{{"layers", {0, 3}}, {"spatial", 2}}, {{"layers", {3, 4}}}}}},
      3);
  expect_tiny_resnet_accurate(
      "blocks-out", model,
      {{"parallel", {{"pp", 2}}},
       {"batch", {{"micro_batch_size", 4}}},
       {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
       {"stages", {{{"layers", {0, 1}}}, {{"layers", {1, 4}}, {"spatial", 2}}}}},
      3);
}

// Two chunks on one rank at DP 2 with small buckets: the later chunk's buckets start at
// the end of its W, before the earlier chunk's (recomputed) B and W; counted only at the
// step's end, the estimate had been 11% under. Now 3.9-4.1% over (9,472 bytes, in every
// run): allowed 5% over, never under.
TEST(MemoryAccuracy, BucketsStartedBeforeAnotherChunk) {
  for (const std::string schedule : {"v-half", "interleaved-1f1b"})
    expect_tiny_resnet_accurate(
        "early-buckets", tiny_resnet("bottleneck", {1, 2}),
        {{"parallel", {{"dp", 2}}},
         {"batch", {{"micro_batch_size", 1}}},
         {"schedule", {{"name", schedule}, {"micro_batches", 1}}},
         {"stages", {{{"layers", {0, 2}}, {"recompute", true}}, {{"layers", {2, 4}}}}}},
        2, " --steps 3 --bucket-mib 0.01", 0.05);
}

// n 3 x 64 x 64 images in `dir` (five classes) and, at `model`, a small ResNet reading them.
void write_images64(const std::string& dir, const std::string& model, int64_t n) {
  std::filesystem::create_directories(dir);
  std::vector<float> pixels(size_t(n) * 3 * 64 * 64);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float((i * 2654435761u) % 1000) / 1000;
  stages::write_npy(dir + "/images.npy", memory::Tensor::from_vector(pixels, {n, 3, 64, 64}));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 5);
  stages::write_npy(dir + "/labels.npy", memory::Tensor::from_vector(labels, {n}));
  std::ofstream(model) << R"({"type": "resnet", "in_channels": 3,
    "image_size": 64, "classes": 5, "stem_channels": 16, "stem_kernel": 7, "stem_stride": 2,
    "stem_pool": true, "block": "basic", "widths": [16, 32], "depths": [1, 1]})";
}

// A smaller ResNet than write_images64's over its images (an 8-channel stem, two basic blocks).
json resnet64() {
  return {{"type", "resnet"},  {"name", "r64"},      {"in_channels", 3}, {"image_size", 64},
          {"classes", 5},      {"stem_channels", 8}, {"stem_kernel", 3}, {"stem_stride", 2},
          {"stem_pool", true}, {"block", "basic"},   {"widths", {8, 8}}, {"depths", {1, 1}},
          {"strides", {1, 2}}};
}

// Images big enough to see (3 x 64 x 64, a micro-batch of one is 48 KiB), under PP 2, whose
// last stage reads only the labels, and spatial 2 x PP 2 (the plan `baton plan
// --device-memory 485KiB` picks), whose tiles read their rows: the loader makes what the
// rank reads, as the estimate counts. It had made whole images on every rank, and the
// last stage measured up to 8.5% over its estimate in 1 run of 4 at PP 2 (when the making
// met the peak), 3.3% with tiles, out of memory under the cap in 1-3 runs of 10: four runs
// each. The first stage had been 5.7-6.2% over, the loader counted one micro-batch more
// than it holds (one image); now 1.9-2.1%, and the last stage 1.7-3.1%.
TEST(MemoryAccuracy, ImagesReadAsTheRankReadsThem) {
  Workspace ws("memacc-images");
  const std::string data = ws.path("images");
  write_images64(data, ws.path("m64.json"), 64);
  for (const int spatial : {1, 2}) {
    SCOPED_TRACE("spatial " + std::to_string(spatial));
    json plan = {{"version", 1},
                 {"model", "m64.json"},
                 {"devices", 2 * spatial},
                 {"parallel", {{"pp", 2}}},
                 {"batch", {{"micro_batch_size", 1}}},
                 {"schedule", {{"name", "1f1b"}, {"micro_batches", 16}}},
                 {"stages", {{{"layers", {0, 1}}}, {{"layers", {1, 4}}}}}};
    if (spatial > 1)
      for (json& st : plan["stages"]) st["spatial"] = spatial;
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    for (int run = 0; run < 4; ++run)
      expect_memory_accurate(ws.path("plan.json"), 2 * spatial, ws.dir, " --steps 3", data, 0.035);
  }
}

// Spatial 4 on both stages of a ResNet of 64 x 64 images (8 ranks): an edge tile exchanges
// halos on one side only, and each tile is estimated at its own position's figures. Every
// tile had been given the most of any position: the second stage's edge tiles 4.2% over
// (76,544 bytes measured, 79,744 estimated), its middle ones 1.5%, the first stage's edges
// 1.0%; then 1.3%, 1.3% and 0.3%, a row of 8 x 8 gradients over on every tile while the
// walk held a backward's halo rows sent through the adds of those received (the wait drops
// them first). Now every rank exact, never under.
TEST(MemoryAccuracy, EdgeTilesAtTheirOwnFigures) {
  Workspace ws("memacc-edge-tiles");
  const std::string data = ws.path("images");
  write_images64(data, ws.path("unused.json"), 16);
  std::ofstream(ws.path("r64.json")) << resnet64().dump();
  const json plan = {
      {"version", 1},
      {"model", "r64.json"},
      {"devices", 8},
      {"parallel", {{"pp", 2}}},
      {"batch", {{"micro_batch_size", 4}}},
      {"schedule", {{"name", "1f1b"}, {"micro_batches", 4}}},
      {"stages", {{{"layers", {0, 2}}, {"spatial", 4}}, {{"layers", {2, 4}}, {"spatial", 4}}}}};
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), 8, ws.dir, " --steps 2", data, 0.005);
  const json summary = json::parse(std::ifstream(ws.path("summary.json")));
  for (const json& r : summary["ranks"])
    EXPECT_GE(r["estimated_peak_bytes"].get<int64_t>(), r["peak_bytes"].get<int64_t>())
        << "rank " << r["rank"];
}

// zero2 on the equivalence grid's data-parallel GPT plans (the memory grid's schedule for
// each, test_memory_grid.cpp): each micro-batch's W makes whole gradients and
// reduce-scatters them bucket by bucket, the tied wte summed over its two layers in one
// stage (PP 1) or reduced whole with the other pipeline rank (PP > 1), chunks of V
// schedules, DualPipe's replicated chunks left unsharded.
class MemoryAccuracyZero2 : public ::testing::TestWithParam<GridCase> {};

TEST_P(MemoryAccuracyZero2, EstimateWithinThreePercent) {
  PlanSpec p = grid_plan(GetParam());
  p.optimizer_sharding = "zero2";
  expect_accurate(p);
}

// zero2 with the tied wte over two pipeline ranks: the last rank's last W starts the wte's
// all-reduce, which waits there for the first rank over the W's reduce-scatters. With
// messages above 16 KiB on the ring (BATON_SMALL_BYTES, read by the estimate and the
// transport alike) that is a 1 MiB window: 38% of the rank's peak when left out.
TEST(MemoryAccuracy, Zero2TiedAllReduceInTheLastW) {
  PlanSpec p = grid_plan({"gpt", 2, 1, 2, "1f1b"});
  p.optimizer_sharding = "zero2";
  ASSERT_EQ(setenv("BATON_SMALL_BYTES", "16384", 1), 0);
  // The all-reduce is too small to wake the communicator's background thread, so its ring
  // window overlaps the W's buffers only when that thread happens to run it before the
  // rank waits (in about 5 of 6 runs here). The estimate counts the overlap; a run
  // without it may measure that window less, never more.
  const transport::detail::AlgoTuning ring;  // the ranks' ring: its default window
  expect_accurate(p, json::object(), double(size_t(ring.window) * ring.chunk_bytes));
  unsetenv("BATON_SMALL_BYTES");
}

// Runs `cmd` (baton launch ... train --summary `dir`/summary.json) and returns each rank's
// measured and estimated peak.
std::map<int, std::pair<int64_t, int64_t>> run_peaks(const std::string& cmd,
                                                     const std::string& dir) {
  std::map<int, std::pair<int64_t, int64_t>> out;
  EXPECT_EQ(run(cmd + " --summary " + dir + "/summary.json", dir + "/run.out"), 0)
      << slurp(dir + "/run.out");
  const json summary = json::parse(slurp(dir + "/summary.json"), nullptr, false);
  if (summary.is_discarded() || !summary.contains("ranks")) return out;
  for (const json& r : summary["ranks"])
    out[r["rank"].get<int>()] = {r["peak_bytes"].get<int64_t>(),
                                 r["estimated_peak_bytes"].get<int64_t>()};
  return out;
}

// Each rank's estimate is at or above its measured peak and at most `over` (a fraction of
// the peak) above it; `what` names the case in the figures printed and in the failures.
void expect_peaks_within(const std::map<int, std::pair<int64_t, int64_t>>& peaks, double over,
                         const std::string& what) {
  for (const auto& [rank, pe] : peaks) {
    const auto [measured, estimated] = pe;
    std::printf("  %s rank %d: measured %lld, estimated %lld\n", what.c_str(), rank,
                (long long)measured, (long long)estimated);
    EXPECT_GE(estimated, measured) << what << " rank " << rank;
    EXPECT_LE(estimated - measured, over * double(measured)) << what << " rank " << rank;
  }
}

// One-device image plans of several micro-batches, as a run measures them: ResNets whose
// max pooling keeps its argmax and whose batch norms keep their statistics for the
// backward (the walk had left both out: a 64 x 64 image's 17 KiB, under the measured
// peak at 2 and 3 micro-batches), and a loader holding at most input_ahead (4)
// micro-batches, the queued ones (this step's and the next's) fewer than that (the
// estimate had counted min(input_ahead, m) + 1, one 48 KiB image over at 1 and from 4 on,
// hiding the rest). The digits on resnet-tiny (2 micro-batches of 4) had been 1,024 bytes
// under. Each estimate is never under its measured peak and within 3% of it.
TEST(MemoryAccuracy, ImagePlansOfSeveralMicroBatches) {
  Workspace ws("memacc-image-mbs");
  const std::string big = ws.path("images");
  write_images64(big, ws.path("m64.json"), 16);
  std::ofstream(ws.path("tiny.json"))
      << std::ifstream(source_dir() + "/examples/models/resnet-tiny.json").rdbuf();
  struct Case {
    std::string model, data;
    int micro_batches, size;
  };
  for (const Case& c : {Case{"m64.json", big, 2, 1}, Case{"m64.json", big, 5, 1},
                        Case{"tiny.json", source_dir() + "/examples/data/digits", 2, 4}}) {
    const std::string what =
        c.model + ", " + std::to_string(c.micro_batches) + " x " + std::to_string(c.size);
    SCOPED_TRACE(what);
    const json plan = {{"version", 1},
                       {"model", c.model},
                       {"devices", 1},
                       {"batch", {{"micro_batch_size", c.size}}},
                       {"schedule", {{"name", "1f1b"}, {"micro_batches", c.micro_batches}}},
                       {"stages", {{{"layers", {0, 4}}}}}};
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const auto peaks = run_peaks(baton() + " train --plan " + ws.path("plan.json") + " --data " +
                                     c.data + " --threads 1 --log-every 0 --steps 3",
                                 ws.dir);
    ASSERT_EQ(peaks.size(), 1u);
    expect_peaks_within(peaks, 0.03, what);
  }
}

// zero2 on examples/models/tiny-gpt.json, DP 2: each rank's part of a bucket holds some
// parameters whole, a part of one and none of others (no optimizer state, a gradient
// accumulator of 0 elements: still 64 bytes); the estimate had given every parameter ceil(numel /
// 2) elements on both ranks, 704 and 896 bytes under the measured peaks, so `baton plan
// --device-memory` at that estimate wrote a plan that ran out of memory in step 1. The estimate
// follows the engine's parts per rank now and is never under.
TEST(MemoryAccuracy, Zero2PartsAsTheEngineCutsThem) {
  PlanSpec p;
  p.model = json::parse(std::ifstream(source_dir() + "/examples/models/tiny-gpt.json"));
  p.dp = 2;
  p.micro_batches = 2;
  p.optimizer_sharding = "zero2";
  Workspace ws("memacc-zero2-parts");
  std::ofstream(ws.path("plan.json")) << plan_json(p, ws).dump(2);
  const std::string cmd = baton() + " launch -n 2 -- " + baton() + " train --plan " +
                          ws.path("plan.json") + " --data " + data_file() +
                          " --threads 1 --log-every 0 --steps 3";
  for (int run = 0; run < 3; ++run) {
    const auto peaks = run_peaks(cmd, ws.dir);
    ASSERT_EQ(peaks.size(), 2u);
    for (const auto& [rank, pe] : peaks) {
      std::printf("  run %d rank %d: measured %lld, estimated %lld\n", run, rank,
                  (long long)pe.first, (long long)pe.second);
      EXPECT_GE(pe.second, pe.first) << "rank " << rank << ", run " << run;
    }
  }
}

// Mid-run evaluation runs in an executor of its own, whose losses (one per micro-batch)
// had stayed allocated until its next run, through the training steps between, which the
// estimate does not count: capped at its own estimate, this plan (recompute on both
// stages) ran out of memory after step 2 when evaluated every 2 steps. They are freed
// when the evaluation ends: evaluated mid-run, the run fits its estimate.
TEST(MemoryAccuracy, MidRunEvaluationFreesItsLosses) {
  PlanSpec p;
  p.model = json::parse(std::ifstream(source_dir() + "/examples/models/tiny-gpt.json"));
  p.tp = {1, 1};
  p.micro_batches = 2;
  p.micro_batch_size = 4;
  Workspace ws("memacc-eval");
  json plan = plan_json(p, ws);
  for (json& st : plan["stages"]) st["recompute"] = true;
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  const std::string cmd = baton() + " launch -n 2 -- " + baton() + " train --plan " +
                          ws.path("plan.json") + " --data " + data_file() +
                          " --threads 1 --log-every 0 --steps 5 --eval-fraction 0.05";
  const auto at_end = run_peaks(cmd + " --eval-every 0", ws.dir);
  ASSERT_EQ(at_end.size(), 2u);
  int64_t cap = 0;
  for (const auto& [rank, pe] : at_end) cap = std::max(cap, pe.second);
  const auto mid_run =
      run_peaks(cmd + " --eval-every 2 --device-memory " + std::to_string(cap), ws.dir);
  ASSERT_EQ(mid_run.size(), 2u);
  for (const auto& [rank, pe] : mid_run) {
    std::printf("  rank %d: measured %lld evaluated mid-run, %lld at the end; estimated %lld\n",
                rank, (long long)pe.first, (long long)at_end.at(rank).first, (long long)pe.second);
    EXPECT_LE(pe.first, pe.second) << "rank " << rank;
  }
}

// Long context, few micro-batches, PP 2 (a LLaMA of hidden 32 over 2048 tokens, 256 KiB an
// activation): 1F1B at one micro-batch and GPipe at two. The first stage's B waits for the
// gradient its peer sends only after taking the activation the stage sent, so that send is
// done (Executor::poll_sends released it) before the B runs; the estimate had counted it
// held through the B, 6.1% over at one micro-batch, 3.6% at two under GPipe, where the
// loader was also counted one micro-batch over from the second F on (both stages).
TEST(MemoryAccuracy, LongContextFewMicroBatches) {
  Workspace ws("memacc-long-context");
  std::ofstream(ws.path("m.json")) << json{
      {"type", "llama"},          {"hidden_size", 32},
      {"intermediate_size", 48},  {"num_hidden_layers", 2},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2},
      {"vocab_size", 50},         {"max_position_embeddings", 4096},
      {"context", 2048}}.dump();
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t((i * 2654435761u) % 50);
  std::ofstream(ws.path("tokens.bin"), std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  for (const auto& [schedule, micro_batches] : {std::pair{"1f1b", 1}, std::pair{"gpipe", 2}}) {
    const std::string what = std::string(schedule) + ", " + std::to_string(micro_batches);
    SCOPED_TRACE(what);
    const json plan = {{"version", 1},
                       {"model", "m.json"},
                       {"devices", 2},
                       {"parallel", {{"pp", 2}}},
                       {"batch", {{"micro_batch_size", 1}}},
                       {"schedule", {{"name", schedule}, {"micro_batches", micro_batches}}},
                       {"stages", {{{"layers", {0, 2}}}, {{"layers", {2, 4}}}}}};
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const auto peaks =
        run_peaks(baton() + " launch -n 2 -- " + baton() + " train --plan " + ws.path("plan.json") +
                      " --data " + ws.path("tokens.bin") + " --threads 1 --log-every 0 --steps 3",
                  ws.dir);
    ASSERT_EQ(peaks.size(), 2u);
    expect_peaks_within(peaks, 0.01, what);
  }
}

// The rank holding a V's middle chunks hands each micro-batch's activation from its first
// chunk to its second in memory, and the gradient back (Executor::Pending's act_in and
// grad_in). v-zb runs other actions between (1F2 2B1 1B1 1W0 2F2), as dualpipev does
// (1F2 2BW0 2F2), whose BW with the second chunk recomputed is the rank's peak. The
// estimate had counted the value only in the F (or B) that makes it and the one that
// takes it: one residual activation (2 x 64 x 64 x 4 bytes here) under the measured peak,
// and a run capped at the estimate ran out of memory. Each V schedule: never under, and
// within 3% (zb-v, v-min, v-half and dualpipev without recompute were never under, their
// estimates unchanged).
TEST(MemoryAccuracy, ValuesHandedBetweenARanksChunks) {
  struct Case {
    std::string schedule;
    std::vector<int> tp;
    std::vector<bool> recompute;  // per stage
  };
  const std::vector<Case> cases = {{"v-zb", {1, 1}, {}},
                                   {"v-zb", {1, 2}, {true, true, true, true}},
                                   {"dualpipev", {1, 1}, {false, false, true, false}},
                                   {"dualpipev", {1, 1}, {}},
                                   {"zb-v", {1, 1}, {}},
                                   {"v-min", {1, 1}, {}},
                                   {"v-half", {1, 1}, {}}};
  Workspace ws("memacc-handed");
  for (const Case& c : cases) {
    PlanSpec p;
    p.model = json::parse(std::ifstream(source_dir() + "/examples/models/tiny-gpt.json"));
    p.tp = c.tp;
    p.schedule = c.schedule;
    json plan = plan_json(p, ws);
    std::string what = p.describe();
    for (size_t k = 0; k < c.recompute.size(); ++k)
      if (c.recompute[k]) {
        plan["stages"][k]["recompute"] = true;
        what += " recompute " + std::to_string(k);
      }
    SCOPED_TRACE(what);
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const auto peaks =
        run_peaks(baton() + " launch -n " + std::to_string(plan["devices"].get<int>()) + " -- " +
                      baton() + " train --plan " + ws.path("plan.json") + " --data " + data_file() +
                      " --threads 1 --log-every 0 --steps 2",
                  ws.dir);
    ASSERT_EQ(int(peaks.size()), plan["devices"].get<int>());
    expect_peaks_within(peaks, 0.03, what);
  }
}

// Sends under UCX's rendezvous size (64 KiB) are copied out and done at once. The
// estimate had held each through the rank's next compute action, which with every stage
// recomputed is the embedding stage's B (its recompute the rank's peak), one activation
// (2 x 64 x 64 x 4 bytes) and its row statistics over: tiny GPT at tp [2, 1], v-zb 4.9%
// over on the first pipeline rank, dualpipev 0.8% (3.4% at DP 2 on tiny-gpt-sp). Both
// are now estimated within 0.5% above their measured peaks, never under.
TEST(MemoryAccuracy, SmallSendsDoneAtOnce) {
  Workspace ws("memacc-small-sends");
  for (const std::string schedule : {"v-zb", "dualpipev"}) {
    PlanSpec p;
    p.model = json::parse(std::ifstream(source_dir() + "/examples/models/tiny-gpt.json"));
    p.tp = {2, 1};
    p.schedule = schedule;
    json plan = plan_json(p, ws);
    for (json& st : plan["stages"]) st["recompute"] = true;
    const std::string what = p.describe() + " recompute";
    SCOPED_TRACE(what);
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const auto peaks =
        run_peaks(baton() + " launch -n 3 -- " + baton() + " train --plan " + ws.path("plan.json") +
                      " --data " + data_file() + " --threads 1 --log-every 0 --steps 2",
                  ws.dir);
    ASSERT_EQ(peaks.size(), 3u);
    expect_peaks_within(peaks, 0.005, what);
  }
}

// A V schedule's first pipeline rank reads its inputs twice, the first stage the images (or
// token ids) and the last the labels (targets): the loader keeps each micro-batch's map from
// the first take to the second, and its images are the very tensor the first stage stashes
// for its backward, counted there. Counted again with the loader, a ResNet of 64 x 64 images
// (8 micro-batches of 4) was 12.8% over under zb-v (two micro-batches of images), 9.6%
// under dualpipev, 9.5% under v-min, 18.2% under v-zb, and a LLaMA at micro-batch 1 0.6%
// (its token ids); all now exact, never under.
TEST(MemoryAccuracy, InputsSharedWithTheFirstStagesStash) {
  Workspace ws("memacc-shared-inputs");
  const std::string images = ws.path("images");
  write_images64(images, ws.path("unused.json"), 32);
  std::ofstream(ws.path("r64.json")) << resnet64().dump();
  std::ofstream(ws.path("lc.json"))
      << json{{"type", "llama"},          {"name", "lc"},
              {"hidden_size", 8},         {"intermediate_size", 16},
              {"num_hidden_layers", 2},   {"num_attention_heads", 2},
              {"num_key_value_heads", 1}, {"max_position_embeddings", 1024},
              {"vocab_size", 256},        {"context", 1024}}
             .dump();
  struct Case {
    std::string model, schedule, data;
    int micro_batches, size;
  };
  for (const Case& c :
       {Case{"r64.json", "zb-v", images, 8, 4}, Case{"r64.json", "dualpipev", images, 8, 4},
        Case{"r64.json", "v-min", images, 8, 4}, Case{"lc.json", "zb-v", data_file(), 4, 1}}) {
    const std::string what = c.model + " " + c.schedule;
    SCOPED_TRACE(what);
    const json plan = {
        {"version", 1},
        {"model", c.model},
        {"devices", 2},
        {"parallel", {{"pp", 2}}},
        {"batch", {{"micro_batch_size", c.size}}},
        {"schedule", {{"name", c.schedule}, {"micro_batches", c.micro_batches}}},
        {"stages",
         {{{"layers", {0, 1}}}, {{"layers", {1, 2}}}, {{"layers", {2, 3}}}, {{"layers", {3, 4}}}}}};
    std::ofstream(ws.path("plan.json")) << plan.dump(2);
    const auto peaks =
        run_peaks(baton() + " launch -n 2 -- " + baton() + " train --plan " + ws.path("plan.json") +
                      " --data " + c.data + " --threads 1 --log-every 0 --steps 2",
                  ws.dir);
    ASSERT_EQ(peaks.size(), 2u);
    expect_peaks_within(peaks, 0.005, what);
  }
}

// A rendezvous send (64 KiB and over on UCX) is done when its receiver has taken it and
// the acknowledgement is back, which may be several actions after the receive is posted.
// ZB-H2's last stage, its gradients exactly 64 KiB (2 x 64 x 128 x 4 bytes), held its
// first two sends through its third B; the estimate had released each one action after
// its receive was known posted: 64-128 KiB under the measured peak in most runs, and a
// run capped at the estimate ran out of memory. Now held until a later receive shows
// them taken, else into the step's end: never under, in every run.
TEST(MemoryAccuracy, RendezvousSendsHeldUntilTaken) {
  Workspace ws("memacc-rendezvous");
  std::ofstream(ws.path("m.json"))
      << json{{"type", "gpt2"}, {"n_layer", 4},      {"n_head", 4},
              {"n_embd", 128},  {"n_positions", 64}, {"vocab_size", 256}}
             .dump();
  const json plan = {{"version", 1},
                     {"model", "m.json"},
                     {"devices", 2},
                     {"parallel", {{"pp", 2}}},
                     {"batch", {{"micro_batch_size", 2}}},
                     {"schedule", {{"name", "zb-h2"}, {"micro_batches", 4}}},
                     {"stages", {{{"layers", {0, 3}}}, {{"layers", {3, 6}}}}}};
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  for (int run = 0; run < 3; ++run) {
    const auto peaks =
        run_peaks(baton() + " launch -n 2 -- " + baton() + " train --plan " + ws.path("plan.json") +
                      " --data " + data_file() + " --threads 1 --log-every 0 --steps 3",
                  ws.dir);
    ASSERT_EQ(peaks.size(), 2u);
    expect_peaks_within(peaks, 0.03, "run " + std::to_string(run));
  }
}

// --trace gathers every rank's timeline on rank 0: every rank had allocated the whole
// job's events in the capped allocator, so the summary's peaks doubled (a narrow model at
// PP 4, sixteen micro-batches traced for three steps: +30% and more) and a plan that fits
// its cap ran out of memory after its last step. The trace's buffers are host staging now.
TEST(MemoryAccuracy, TraceAddsNothingToThePeak) {
  Workspace ws("memacc-trace");
  std::ofstream(ws.path("m.json")) << R"({"type": "gpt2", "name": "narrow", "n_layer": 4,
    "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256})";
  const json plan = {{"version", 1},
                     {"model", ws.path("m.json")},
                     {"devices", 4},
                     {"parallel", {{"pp", 4}}},
                     {"batch", {{"micro_batch_size", 1}}},
                     {"schedule", {{"name", "1f1b"}, {"micro_batches", 16}}},
                     {"stages",
                      {{{"layers", {"embed", "h.0"}}},
                       {{"layers", {"h.1"}}},
                       {{"layers", {"h.2"}}},
                       {{"layers", {"h.3", "head"}}}}}};
  std::ofstream(ws.path("plan.json")) << plan.dump(2);
  expect_memory_accurate(ws.path("plan.json"), 4, ws.dir,
                         " --steps 3 --trace-steps 3 --trace " + ws.path("t.json"));
  EXPECT_TRUE(std::filesystem::exists(ws.path("t.json")));
}

// Local SGD and gossip reduce no gradient over replicas: the estimate had counted the
// all-reduce's buckets anyway (33% over with 4 MiB buckets, 7% under with small ones) and
// not their own parameter sync after the step (gossip's received copy, local SGD's
// all-reduces of every delta at once). Local SGD had then been 3.3% over (every
// all-reduce's scratch summed, though the communicator runs them one at a time) and gossip
// 64 bytes under (STEP's norm and loss vector, held through the sync): both now exact.
TEST(MemoryAccuracy, ReplicasThatSyncParameters) {
  Workspace ws("memacc-dp-sync");
  std::ofstream(ws.path("m.json")) << R"({"type": "mlp", "name": "m", "context": 8,
    "vocab_size": 256, "n_embd": 4, "hidden": [32], "activation": "relu"})";
  for (const json& sync : {json{{"mode", "gossip"}, {"peers", 1}, {"seed", 3}},
                           json{{"mode", "local-sgd"}, {"sync_every", 2}}})
    for (const char* bucket : {" --bucket-mib 4", " --bucket-mib 0.001"}) {
      SCOPED_TRACE(sync.dump() + bucket);
      const json plan = {{"version", 1},
                         {"model", ws.path("m.json")},
                         {"devices", 2},
                         {"parallel", {{"dp", 2}}},
                         {"batch", {{"micro_batch_size", 1}}},
                         {"schedule", {{"name", "1f1b"}, {"micro_batches", 1}}},
                         {"optimizer", sync["mode"] == "gossip" ? "sgd" : "adamw"},
                         {"dp_sync", sync}};
      std::ofstream(ws.path("plan.json")) << plan.dump(2);
      expect_memory_accurate(ws.path("plan.json"), 2, ws.dir, std::string(" --steps 3") + bucket,
                             data_file(), 0.03);
    }
}

INSTANTIATE_TEST_SUITE_P(Grid, MemoryAccuracyZero2,
                         ::testing::Values(GridCase{"gpt", 1, 1, 2, "1f1b"},
                                           GridCase{"gpt", 1, 2, 2, "interleaved-1f1b"},
                                           GridCase{"gpt", 2, 1, 2, "zb-h2"},
                                           GridCase{"gpt", 2, 2, 2, "zb-v"},
                                           GridCase{"gpt", 4, 1, 2, "dualpipe"},
                                           GridCase{"gpt", 4, 2, 2, "gpipe"}),
                         [](const auto& named) { return grid_case_name(named.param); });

}  // namespace
}  // namespace baton::engine_testing
