// Plan files: the examples round-trip and validate; every invalid plan gives its exact
// error (file, JSON path, expected vs found).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "memory/error.h"
#include "memory/units.h"
#include "partitioner/evaluate.h"
#include "partitioner/plan.h"
#include "partitioner/resolved_plan.h"
#include "schedule/generators.h"
#include "schedule/schedule_io.h"
#include "stages/json_reader.h"

namespace baton::partitioner {
namespace {

using nlohmann::json;

const std::string kDir = std::string(BATON_SOURCE_DIR) + "/examples/plans";

json tiny_plan() {
  return json::parse(R"({
    "version": 1,
    "model": {"type": "gpt2", "name": "tiny", "n_layer": 2, "n_head": 4, "n_embd": 64,
              "n_positions": 16, "vocab_size": 48},
    "devices": 8,
    "device_memory": "64MiB",
    "parallel": {"dp": 2, "pp": 2, "tp": 2},
    "batch": {"micro_batch_size": 2, "global": 16},
    "schedule": {"name": "1f1b", "micro_batches": 4},
    "stages": [{"layers": [0, 2]}, {"layers": [2, 4]}]
  })");
}

// Parses, loads the model and resolves: the whole check `baton plan --check` makes
// before estimating.
ResolvedPlan plan_check(const json& j) {
  Plan p = parse_plan(j, "plan.json", kDir);
  return resolve_plan(p, load_plan_model(p));
}

std::string plan_error_of(const json& j) {
  try {
    plan_check(j);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Plan, ExamplesAreValidAndRoundTrip) {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(kDir)) {
    SCOPED_TRACE(f.path().string());
    Plan p = read_plan(f.path().string());
    ResolvedPlan r = resolve_plan(p, load_plan_model(p));
    json written = plan_to_json(r.plan, kDir);
    Plan again = parse_plan(written, "again", kDir);
    ResolvedPlan r2 = resolve_plan(again, load_plan_model(again));
    EXPECT_EQ(plan_to_json(r2.plan, kDir), written);
    EXPECT_EQ(r2.chunk_first, r.chunk_first);
    EXPECT_EQ(r2.layer_tp, r.layer_tp);
    ++n;
  }
  EXPECT_GE(n, 4);
}

// An error inside a model embedded in the plan continues the plan's JSON path (it had read
// "plan.json: $.model: $.n_hed", as two documents).
TEST(Plan, EmbeddedModelErrorsContinueThePlansPath) {
  json j = tiny_plan();
  j["model"]["n_hed"] = 3;
  EXPECT_EQ(plan_error_of(j).rfind("plan.json: $.model.n_hed: unknown field 'n_hed'", 0), 0u)
      << plan_error_of(j);
  j = tiny_plan();
  j["model"]["n_head"] = "four";
  EXPECT_EQ(plan_error_of(j).rfind("plan.json: $.model.n_head: expected", 0), 0u)
      << plan_error_of(j);
}

TEST(Plan, LayerMissingOrTwice) {
  json j = tiny_plan();
  j["stages"] = {{{"layers", {0, 1}}}, {{"layers", {2, 4}}}};
  EXPECT_EQ(plan_error_of(j), "plan.json: $.stages: layer 1 ('h.0') is in no stage");
  j["stages"] = {{{"layers", {0, 2}}}, {{"layers", {1, 4}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[1].layers: layer 1 ('h.0') is placed twice (also in $.stages[0])");
  j["stages"] = {{{"layers", {"embed", "h.1"}}}, {{"layers", {"h.0", "head"}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].layers: a stage holds consecutive layers in model order; layer "
            "2 ('h.1') "
            "does not follow layer 0 ('embed')");
  j["stages"] = {{{"layers", {2, 4}}}, {{"layers", {0, 2}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].layers: stages hold the model's layers in order, but layer 2 "
            "('h.1') comes "
            "after layer 1 ('h.0') of a later stage");
  j["stages"] = {{{"layers", {0, 2}}}, {{"layers", {2, 9}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[1].layers: expected layer indices within the model's 4 layers "
            "(last <= 4), found [2, 9]");
  j["stages"] = {{{"layers", {"embed", "h.9"}}}, {{"layers", {2, 4}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].layers[1]: no layer named 'h.9' in the model");
  j["stages"] = {{{"layers", {0, 4}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages: expected 2 stages (schedule 1f1b on 2 pipeline ranks holds 2 "
            "model chunks), found 1");
  j["stages"] = {{{"layers", {1, 1}}}, {{"layers", {1, 4}}}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].layers: expected first < last (a stage holds at least one "
            "layer), found [1, 1]");
}

// A plan of one model chunk (data and tensor parallelism only) may leave "stages" out:
// one stage of every layer, written back without them; a pipeline must give its stages.
TEST(Plan, StagesLeftOutMeanOneChunkOfEveryLayer) {
  json j = tiny_plan();
  j.erase("stages");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages: expected 2 stages (schedule 1f1b on 2 pipeline ranks holds 2 "
            "model chunks), found none: only a plan of one model chunk may leave them out");
  j["parallel"] = {{"dp", 4}, {"pp", 1}, {"tp", 2}};
  j["batch"]["global"] = 32;
  const Plan p = parse_plan(j, "plan.json", kDir);
  EXPECT_EQ(plan_to_json(p, kDir).count("stages"), 0u);
  const ResolvedPlan r = resolve_plan(p, load_plan_model(p));
  EXPECT_EQ(r.chunk_first, std::vector<int>{0});
  EXPECT_EQ(r.chunk_last, std::vector<int>{4});
  EXPECT_EQ(r.layer_tp, (std::vector<int>{2, 2, 2, 2}));
  // The resolved plan names its stage, and reads back as the plan that wrote it out.
  const json written = plan_to_json(r.plan, kDir);
  EXPECT_EQ(written.at("stages"), json::parse(R"([{"layers": [0, 4], "pipeline_ranks": [0],
                                                   "recompute": false}])"));
  j["stages"] = written["stages"];
  const ResolvedPlan given = plan_check(j);
  EXPECT_EQ(plan_to_json(given.plan, kDir), written);
}

// A written plan reads back with its device memory to the byte: a cap that is no round
// size (`baton plan --device-memory 49430528`) is written as bytes, since "47.14 MiB" would
// read back 1393 bytes short and refuse the plan written for it.
TEST(Plan, DeviceMemoryRoundTripsToTheByte) {
  for (auto [bytes, as_size] :
       {std::pair{int64_t(64) << 20, true}, std::pair{int64_t(3) << 30, true},
        std::pair{int64_t(49430528), false},
        // Its size rounds up to 8388608.00 TiB, past 2^63 - 1, which cannot be read back:
        // writing the plan had failed with "invalid size".
        std::pair{INT64_MAX, false}}) {
    json j = tiny_plan();
    j["device_memory"] = bytes;
    const json written = plan_to_json(parse_plan(j, "plan.json", kDir), kDir);
    EXPECT_EQ(parse_plan(written, "again", kDir).device_memory, bytes) << written["device_memory"];
    EXPECT_EQ(written["device_memory"].is_string(), as_size) << written["device_memory"];
  }
}

TEST(Plan, RanksInconsistentWithDegrees) {
  json j = tiny_plan();
  j["devices"] = 6;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.devices: expected dp x (sum of tp over the pipeline ranks) = 2 x 4 = 8 "
            "devices, found 6");
  j = tiny_plan();
  j["parallel"]["tp"] = {2, 2, 2};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.tp: expected one tensor-parallel degree per pipeline rank (pp = "
            "2), found 3 values");
  j = tiny_plan();
  j["ranks"] = json::array();
  for (int r = 0; r < 8; ++r)
    j["ranks"].push_back({{"rank", r}, {"dp", r / 4}, {"pp", (r / 2) % 2}, {"tp", r % 2}});
  EXPECT_EQ(plan_error_of(j), "(no error)");
  j["ranks"][3]["pp"] = 0;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.ranks[3]: expected {rank 3, dp 0, pp 1, tp 1} (rank = (dp * PP + pp) * "
            "TP + tp), found "
            "{rank 3, dp 0, pp 0, tp 1}");
  j = tiny_plan();
  j["stages"][1]["pipeline_ranks"] = {0};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[1].pipeline_ranks: expected [1] (the 1f1b placement of model "
            "chunk 1), found [0]");
  j["stages"][1]["pipeline_ranks"] = {2};  // a pipeline rank the plan does not have
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[1].pipeline_ranks[0]: expected an integer in [0, 1], found 2");
  j = tiny_plan();
  j["boundaries"] = {{{"after_stage", 0},
                      {"from_pipeline_rank", 0},
                      {"to_pipeline_rank", 1},
                      {"from_tp", 2},
                      {"to_tp", 2},
                      {"pattern", "one-to-one"}}};
  EXPECT_EQ(plan_error_of(j), "(no error)");
  j["boundaries"][0]["pattern"] = "gather";
  EXPECT_EQ(
      plan_error_of(j),
      "plan.json: $.boundaries[0]: expected "
      "{\"after_stage\":0,\"from_pipeline_rank\":0,\"from_tp\":2,"
      "\"pattern\":\"one-to-one\",\"to_pipeline_rank\":1,\"to_tp\":2} (from the degrees and the "
      "placement), "
      "found {\"after_stage\":0,\"from_pipeline_rank\":0,\"from_tp\":2,\"pattern\":\"gather\","
      "\"to_pipeline_rank\":1,\"to_tp\":2}");
  j = tiny_plan();
  j["batch"]["global"] = 12;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.batch.global: expected dp x micro_batches x micro_batch_size = 2 x 4 x 2 "
            "= 16, found 12");
}

TEST(Plan, DegreeMustDivideWhatItSplits) {
  json j = tiny_plan();
  j["devices"] = 6;
  j["parallel"] = {{"dp", 1}, {"pp", 2}, {"tp", 3}};
  j["batch"] = {{"micro_batch_size", 2}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.tp: tensor-parallel degree 3 does not divide n_head = 4 of "
            "attention node "
            "'h.0.attn.attn' (layer h.0)");
  // A vocabulary the degree does not divide is padded (below), unless the last rank
  // would hold padding only.
  j["model"]["vocab_size"] = 4;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.tp: tensor-parallel degree 3 over the vocabulary (table rows) "
            "= 4 of embedding node 'wte' (layer embed) leaves the last ranks no part (parts of "
            "2); degrees up to 4 that leave every rank part of this table: 2, 4; or keep it "
            "whole with the plan field \"splits\": {\"wte\": \"none\", \"lm_head\": \"none\"}");
  // The hidden size of an MLP's split linear.
  j["model"] = {
      {"type", "mlp"}, {"context", 4}, {"vocab_size", 16}, {"n_embd", 8}, {"hidden", {10, 16}}};
  j["devices"] = 8;
  j["parallel"] = {{"dp", 1}, {"pp", 2}, {"tp", 4}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.tp: tensor-parallel degree 4 does not divide the output "
            "features = 10 of "
            "linear node 'fc0' (layer fc0)");
  // A tied parameter on pipeline ranks of different degrees.
  j = tiny_plan();
  j["devices"] = 12;
  j["parallel"]["tp"] = {2, 4};
  EXPECT_EQ(
      plan_error_of(j),
      "plan.json: $.parallel.tp: parameter 'wte.weight' is used by layer 0 ('embed') and layer 3 "
      "('head') on "
      "pipeline ranks of different tensor-parallel degrees; a tied parameter needs one degree");
}

TEST(Plan, StageOverCapacity) {
  json j = tiny_plan();
  j["device_memory"] = "256KiB";
  ResolvedPlan r = plan_check(j);
  CostModel model(r.graph, Machine{});
  PlanEstimate e = evaluate_plan(r, model);
  ASSERT_EQ(e.problems.size(), 2u);  // both pipeline ranks
  const RankEstimate& r0 = e.ranks[0];
  EXPECT_EQ(e.problems[0], "rank 0 (pp 0, embed .. h.0) needs " +
                               memory::format_bytes(double(r0.peak)) +
                               ", over its capacity of 256.00 KiB by " +
                               memory::format_bytes(double(r0.peak - (256 << 10))) +
                               " (as do its tensor- and data-parallel peers)");
  EXPECT_FALSE(e.fits());
  j["device_memory"] = "64MiB";
  r = plan_check(j);
  EXPECT_TRUE(evaluate_plan(r, model).fits());
  EXPECT_EQ(format_estimate(r, evaluate_plan(r, model)).find("within 3% of the capacity"),
            std::string::npos);
  // A plan that fits by less than the estimate's accuracy says so.
  j["device_memory"] = std::to_string(e.max_peak() + e.max_peak() / 100);
  r = plan_check(j);
  const PlanEstimate tight = evaluate_plan(r, model);
  EXPECT_TRUE(tight.fits());
  EXPECT_NE(format_estimate(r, tight).find("note: the peak is within 3% of the capacity"),
            std::string::npos)
      << format_estimate(r, tight);
}

TEST(Plan, UnknownScheduleAndFields) {
  json j = tiny_plan();
  j["schedule"]["name"] = "2f2b";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule.name: unknown schedule '2f2b' (expected one of gpipe, 1f1b, "
            "interleaved-1f1b, "
            "zb-h1, zb-h2, zb-v, dualpipev, dualpipe, v-min, v-half, v-zb)");
  j = tiny_plan();
  j["schedule"]["name"] = "forward-only";  // evaluates: a plan trains
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule.name: forward-only evaluates (no backward, no optimizer "
            "step); a training schedule is one of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, "
            "zb-v, dualpipev, dualpipe, v-min, v-half, v-zb");
  j = tiny_plan();
  j["schedule"] = {{"name", "dualpipev"}, {"micro_batches", 2}};
  j["batch"].erase("global");
  EXPECT_EQ(plan_error_of(j).substr(0, 57),
            "plan.json: $.schedule: dualpipev: micro-batches: expected");
  j = tiny_plan();
  j["tensor_parallel"] = 2;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.tensor_parallel: unknown field 'tensor_parallel' (allowed here: version, "
            "model, devices, "
            "device_memory, device, transport, parallel, batch, schedule, optimizer, "
            "optimizer_sharding, optimizer_step, dp_sync, sync_batchnorm, stages, splits, ranks, "
            "boundaries, predicted)");
  j = tiny_plan();
  j["stages"][0]["layer"] = 1;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].layer: unknown field 'layer' (allowed here: layers, "
            "pipeline_ranks, recompute, spatial)");
  j = tiny_plan();
  j["version"] = 2;
  j["future_field"] = 1;  // a newer baton's file is named by its version, not its fields
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.version: the plan is in format version 2, written by a newer baton; "
            "this one reads version 1");
  j["version"] = 0;
  EXPECT_EQ(plan_error_of(j), "plan.json: $.version: expected format version 1, found 0");
  j = tiny_plan();
  j["device_memory"] = "lots";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: invalid size 'lots': expected a number with an optional "
            "unit, e.g. 512MiB");
  j = tiny_plan();
  j["optimizer"] = "adam";
  EXPECT_EQ(
      plan_error_of(j),
      "plan.json: $.optimizer: expected \"adamw\", \"sgd\" or \"sgd-momentum\", found \"adam\"");
}

// schedule.chunks, when given, is at least 1 (a 0 had passed: on interleaved-1f1b as its
// default 2), and a schedule of its own count refuses any other; the predicted block,
// though informational, holds what `baton plan` writes: numbers, byte counts per rank and
// the time model's name.
TEST(Plan, ChunksAndPredictedAreChecked) {
  json j = tiny_plan();
  // The range said is every generator's (it had said the plan format's 2^24, and a count
  // within it was then refused by the generator).
  j["schedule"]["micro_batches"] = 0;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule.micro_batches: expected an integer in [1, 1048576], found 0");
  j = tiny_plan();
  j["schedule"]["chunks"] = 0;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule.chunks: expected an integer in [1, 16777216], found 0");
  j["schedule"] = {{"name", "interleaved-1f1b"}, {"micro_batches", 4}, {"chunks", 0}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule.chunks: expected an integer in [1, 16777216], found 0");
  j = tiny_plan();
  j["schedule"]["chunks"] = 2;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.schedule: 1f1b: chunks: expected 1 (the schedule's own), found 2");
  j["schedule"]["chunks"] = 1;
  EXPECT_EQ(plan_error_of(j), "(no error)");

  const json good = {{"step_time_s", 0.01},
                     {"bubble", 0.25},
                     {"tokens_per_s", 1000},
                     {"memory_bytes", {1, 2, 3, 4, 5, 6, 7, 8}},
                     {"time_model", "analytic"}};
  j = tiny_plan();
  j["predicted"] = good;
  EXPECT_EQ(plan_error_of(j), "(no error)");
  auto with = [&](const std::string& key, const json& value) {
    json k = tiny_plan();
    k["predicted"] = good;
    k["predicted"][key] = value;
    return plan_error_of(k);
  };
  EXPECT_EQ(with("bubble", "hello"),
            "plan.json: $.predicted.bubble: expected a number, found \"hello\"");
  EXPECT_EQ(with("bubble", 1.5),
            "plan.json: $.predicted.bubble: expected a number in [0, 1], found 1.5");
  EXPECT_EQ(with("step_time_s", json::array({1})),
            "plan.json: $.predicted.step_time_s: expected a number, found an array of 1");
  EXPECT_EQ(with("tokens_per_s", -1),
            "plan.json: $.predicted.tokens_per_s: expected a number >= 0, found -1");
  EXPECT_EQ(with("memory_bytes", "x"),
            "plan.json: $.predicted.memory_bytes: expected an array, found \"x\"");
  EXPECT_EQ(with("memory_bytes", json::array({1, -2})),
            "plan.json: $.predicted.memory_bytes[1]: expected a byte count >= 0, found -2");
  EXPECT_EQ(with("time_model", 42),
            "plan.json: $.predicted.time_model: expected a string, found 42");
  EXPECT_EQ(with("time_model", "guessed"),
            "plan.json: $.predicted.time_model: expected \"measured\" or \"analytic\", found "
            "\"guessed\"");
}

// optimizer_sharding: none (the default, not written back), zero1 or zero2; anything
// else is an error naming the field.
TEST(Plan, OptimizerSharding) {
  json j = tiny_plan();
  EXPECT_EQ(plan_check(j).plan.optimizer_sharding, OptimizerSharding::none);
  EXPECT_FALSE(plan_to_json(plan_check(j).plan).contains("optimizer_sharding"));
  for (auto [name, want] :
       {std::pair{"none", OptimizerSharding::none}, std::pair{"zero1", OptimizerSharding::zero1},
        std::pair{"zero2", OptimizerSharding::zero2}}) {
    j["optimizer_sharding"] = name;
    Plan p = plan_check(j).plan;
    EXPECT_EQ(p.optimizer_sharding, want) << name;
    EXPECT_EQ(parse_plan(plan_to_json(p), "again.json", kDir).optimizer_sharding, want) << name;
  }
  j["optimizer_sharding"] = "zero3";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.optimizer_sharding: expected \"none\", \"zero1\" or \"zero2\", found "
            "\"zero3\"");
  j["optimizer_sharding"] = 1;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.optimizer_sharding: expected \"none\", \"zero1\" or \"zero2\", found 1");
}

// device: "cpu" (the default, not written back) or "cuda"; transport: "ucx" or "nccl"
// (absent: the device's default, NCCL on GPUs), "nccl" only with "cuda".
TEST(Plan, DeviceAndTransport) {
  json j = tiny_plan();
  Plan p = plan_check(j).plan;
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.transport_of(), "ucx");
  EXPECT_FALSE(plan_to_json(p).contains("device"));
  EXPECT_FALSE(plan_to_json(p).contains("transport"));
  j["device"] = "cuda";
  p = plan_check(j).plan;
  EXPECT_EQ(p.transport_of(), "nccl");
  for (const char* t : {"nccl", "ucx"}) {
    j["transport"] = t;
    p = plan_check(j).plan;
    Plan again = parse_plan(plan_to_json(p), "again.json", kDir);
    EXPECT_EQ(again.device, "cuda") << t;
    EXPECT_EQ(again.transport_of(), t);
  }
  j["device"] = "gpu";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device: expected \"cpu\" or \"cuda\" (each rank takes the GPU of its "
            "local rank), found \"gpu\"");
  j["device"] = 0;
  EXPECT_EQ(plan_error_of(j).substr(0, 34), "plan.json: $.device: expected \"cpu");
  j["device"] = "cpu";
  j["transport"] = "tcp";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.transport: expected \"ucx\" or \"nccl\", found \"tcp\"");
  j["transport"] = "nccl";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.transport: expected \"ucx\" (NCCL moves CUDA tensors only: \"nccl\" "
            "needs \"device\": \"cuda\"), found \"nccl\" with \"device\": \"cpu\"");
}

// dp_sync: "allreduce" (the default, not written back) or {"mode": "local-sgd",
// "sync_every": H, "outer_optimizer": ...}; bad forms name the path, expected and found.
TEST(Plan, DpSync) {
  json j = tiny_plan();
  EXPECT_EQ(plan_check(j).plan.dp_sync.mode, DpSync::Mode::allreduce);
  EXPECT_FALSE(plan_to_json(plan_check(j).plan).contains("dp_sync"));
  j["dp_sync"] = "allreduce";
  EXPECT_EQ(plan_check(j).plan.dp_sync.mode, DpSync::Mode::allreduce);
  j["dp_sync"] = {{"mode", "allreduce"}};
  EXPECT_EQ(plan_check(j).plan.dp_sync.mode, DpSync::Mode::allreduce);
  j["dp_sync"] = {{"mode", "local-sgd"}, {"sync_every", 8}};
  DpSync s = plan_check(j).plan.dp_sync;
  EXPECT_TRUE(s.local());
  EXPECT_EQ(s.sync_every, 8);
  EXPECT_EQ(s.outer, DpSync::Outer::average);
  j["dp_sync"] = {{"mode", "local-sgd"},
                  {"sync_every", 4},
                  {"outer_optimizer", "nesterov"},
                  {"outer_lr", 0.5},
                  {"outer_momentum", 0.8}};
  Plan p = plan_check(j).plan;
  EXPECT_EQ(p.dp_sync.outer, DpSync::Outer::nesterov);
  EXPECT_EQ(p.dp_sync.outer_lr, 0.5);
  EXPECT_EQ(p.dp_sync.outer_momentum, 0.8);
  json back = plan_to_json(p);
  EXPECT_EQ(back["dp_sync"], j["dp_sync"]);
  DpSync again = parse_plan(back, "again.json", kDir).dp_sync;
  EXPECT_EQ(again.sync_every, 4);
  EXPECT_EQ(again.outer_lr, 0.5);

  const std::vector<std::pair<json, std::string>> bad = {
      {"ring",
       "$.dp_sync: expected \"allreduce\", \"local-sgd\", \"gossip\" or \"parameter-server\", "
       "found \"ring\""},
      {3,
       "$.dp_sync: expected \"allreduce\", \"local-sgd\", \"gossip\" or \"parameter-server\", "
       "or an object with \"mode\" and its parameters, found 3"},
      {"local-sgd",
       "$.dp_sync: expected an object {\"mode\": \"local-sgd\", \"sync_every\": H} "
       "(local-sgd needs H), found \"local-sgd\""},
      {{{"sync_every", 2}}, "$.dp_sync: missing required field 'mode'"},
      {{{"mode", "local-sgd"}}, "$.dp_sync: missing required field 'sync_every'"},
      {{{"mode", "local-sgd"}, {"sync_every", 0}}, "$.dp_sync.sync_every: expected"},
      {{{"mode", "local-sgd"}, {"sync_every", 2}, {"outer_optimizer", "adam"}},
       "$.dp_sync.outer_optimizer: expected \"average\" or \"nesterov\", found \"adam\""},
      {{{"mode", "local-sgd"}, {"sync_every", 2}, {"outer_lr", 0.7}},
       "$.dp_sync.outer_lr: outer_lr is a parameter of outer_optimizer \"nesterov\""},
      {{{"mode", "allreduce"}, {"sync_every", 2}}, "$.dp_sync.sync_every: unknown field"},
      {{{"mode", "local-sgd"}, {"sync_every", 2}, {"peers", 2}}, "$.dp_sync.peers: unknown field"},
      {"parameter-server",
       "$.dp_sync: expected an object {\"mode\": \"parameter-server\", \"max_staleness\": s} "
       "(parameter-server needs its staleness bound), found \"parameter-server\""},
      {{{"mode", "parameter-server"}}, "$.dp_sync: missing required field 'max_staleness'"},
      {{{"mode", "parameter-server"}, {"max_staleness", -1}}, "$.dp_sync.max_staleness: expected"},
      {{{"mode", "parameter-server"}, {"max_staleness", "1"}}, "$.dp_sync.max_staleness: expected"},
      {{{"mode", "parameter-server"}, {"max_staleness", 1}, {"ps_ranks", 65}},
       "$.dp_sync.ps_ranks: expected"},
      {{{"mode", "parameter-server"}, {"max_staleness", 1}, {"sync_every", 2}},
       "$.dp_sync.sync_every: unknown field"},
  };
  for (const auto& [value, want] : bad) {
    j["dp_sync"] = value;
    const std::string got = plan_error_of(j);
    EXPECT_NE(got.find("plan.json: " + want), std::string::npos) << got;
  }
  // Extra server ranks are not devices: the devices message says so (it had read as if the
  // job's ranks were the devices, which `baton launch -n` then contradicted).
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 1}, {"ps_ranks", 1}};
  j["devices"] = j["devices"].get<int>() + 1;
  EXPECT_NE(plan_error_of(j).find("(the training ranks: $.dp_sync.ps_ranks are not counted here, "
                                  "but `baton launch -n` counts them)"),
            std::string::npos)
      << plan_error_of(j);
  j["devices"] = j["devices"].get<int>() - 1;
  j["dp_sync"] = {{"mode", "gossip"}, {"peers", 1}, {"seed", 7}};
  Plan g = plan_check(j).plan;
  EXPECT_EQ(g.dp_sync.mode, DpSync::Mode::gossip);
  EXPECT_EQ(g.dp_sync.seed, 7u);
  EXPECT_EQ(plan_to_json(g)["dp_sync"], j["dp_sync"]);
  // The seed takes --seed's range, [0, 2^64).
  j["dp_sync"]["seed"] = UINT64_MAX;
  EXPECT_EQ(plan_check(j).plan.dp_sync.seed, UINT64_MAX);
  EXPECT_EQ(plan_to_json(plan_check(j).plan)["dp_sync"], j["dp_sync"]);
  j["dp_sync"]["seed"] = -1;
  EXPECT_NE(plan_error_of(j).find("$.dp_sync.seed: expected an integer in [0, 2^64), found -1"),
            std::string::npos)
      << plan_error_of(j);
  j["dp_sync"]["seed"] = 7;
  j["dp_sync"]["peers"] = 2;  // dp 2: one partner at most
  EXPECT_NE(plan_error_of(j).find("$.dp_sync.peers: expected at most dp - 1 = 1 peers, found 2"),
            std::string::npos)
      << plan_error_of(j);
  // One replica has none to synchronise with: gossip and local SGD at dp 1 had been taken
  // (and charged messages and an anchor copy in the estimates).
  {
    json one = j;
    one["parallel"]["dp"] = 1;
    one["devices"] = 4;
    one["batch"]["global"] = 8;
    for (const json& mode :
         {json{{"mode", "gossip"}, {"peers", 5}}, json{{"mode", "local-sgd"}, {"sync_every", 2}}}) {
      one["dp_sync"] = mode;
      EXPECT_NE(plan_error_of(one).find(
                    "$.dp_sync: \"" + mode["mode"].get<std::string>() +
                    "\" synchronises data-parallel replicas; expected dp >= 2, found dp 1"),
                std::string::npos)
          << plan_error_of(one);
    }
  }
  j["dp_sync"] = {{"mode", "local-sgd"}, {"sync_every", 2}};
  j["optimizer_sharding"] = "zero1";
  EXPECT_NE(plan_error_of(j).find("cannot be combined with optimizer_sharding \"zero1\""),
            std::string::npos)
      << plan_error_of(j);
  j.erase("optimizer_sharding");
  j["optimizer_step"] = "post-validated";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.optimizer_step: \"post-validated\" cannot be combined with dp_sync "
            "\"local-sgd\" (only with \"allreduce\")");
  j.erase("optimizer_step");

  // parameter-server: written back whole; refused with zero1/zero2, a post-validated step
  // and DualPipe (whose chunks zero1 does not shard).
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 2}};
  Plan ps = plan_check(j).plan;
  EXPECT_TRUE(ps.dp_sync.parameter_server());
  EXPECT_EQ(ps.dp_sync.max_staleness, 2);
  EXPECT_EQ(ps.dp_sync.ps_ranks, 0);
  EXPECT_EQ(ps.sharding(), OptimizerSharding::zero1);
  EXPECT_EQ(ps.optimizer_sharding, OptimizerSharding::none);
  EXPECT_FALSE(ps.dp_sync.independent());
  json ps_back = plan_to_json(ps);
  EXPECT_EQ(ps_back["dp_sync"],
            (json{{"mode", "parameter-server"}, {"max_staleness", 2}, {"ps_ranks", 0}}));
  EXPECT_EQ(parse_plan(ps_back, "again.json", kDir).dp_sync.max_staleness, 2);
  j["optimizer_sharding"] = "zero2";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.dp_sync: \"parameter-server\" shards the optimizer state over its "
            "servers itself; expected optimizer_sharding \"none\" (or absent), found \"zero2\"");
  j["optimizer_sharding"] = "none";
  EXPECT_TRUE(plan_check(j).plan.dp_sync.parameter_server());
  j.erase("optimizer_sharding");
  j["optimizer_step"] = "post-validated";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.optimizer_step: \"post-validated\" cannot be combined with dp_sync "
            "\"parameter-server\" (only with \"allreduce\")");
  j.erase("optimizer_step");
  // Extra server ranks: after the replicas' ranks in the world; written back; refused at
  // dp 1 (nothing sharded to serve) and off the CPU.
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 1}, {"ps_ranks", 2}};
  ResolvedPlan extra = plan_check(j);
  EXPECT_EQ(extra.plan.dp_sync.ps_ranks, 2);
  EXPECT_EQ(extra.world(), extra.layout.world() + 2);
  EXPECT_EQ(extra.server_ranks(),
            (std::vector<int>{extra.layout.world(), extra.layout.world() + 1}));
  EXPECT_FALSE(extra.is_server(extra.layout.world() - 1));
  EXPECT_EQ(plan_to_json(extra.plan)["dp_sync"], j["dp_sync"]);
  json one = j;
  one["parallel"]["dp"] = 1;
  one["devices"] = one["devices"].get<int>() / 2;
  one["batch"]["global"] = 8;
  EXPECT_NE(plan_error_of(one).find("plan.json: $.dp_sync.ps_ranks: extra server ranks serve the "
                                    "parameters of several data-parallel replicas; expected dp "
                                    ">= 2 with ps_ranks 2, found dp 1"),
            std::string::npos)
      << plan_error_of(one);
  json gpu = j;
  gpu["device"] = "cuda";
  EXPECT_NE(plan_error_of(gpu).find("plan.json: $.dp_sync.ps_ranks: extra server ranks run on the "
                                    "CPU; expected device \"cpu\" with ps_ranks > 0, found "
                                    "\"cuda\""),
            std::string::npos)
      << plan_error_of(gpu);
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 2}};

  j["schedule"]["name"] = "dualpipe";
  EXPECT_NE(plan_error_of(j).find("plan.json: $.dp_sync.mode: \"parameter-server\" needs a "
                                  "schedule whose chunks live on one pipeline rank each"),
            std::string::npos)
      << plan_error_of(j);
}

// The data-parallel traffic per step in the estimate: local-sgd with H = 8 sends an
// eighth of allreduce's bytes (the same all-reduce, of the parameter deltas, once every 8
// steps); its anchor (and nesterov's momentum) count as optimizer state.
// A tied embedding on one stage (read by the first and the last layer) has gradient
// buffers for both uses, but its one gradient is all-reduced once: the traffic is the
// parameters' bytes, not the gradient buffers'.
TEST(Plan, TiedWeightsAreReducedOnce) {
  json j = tiny_plan();
  j["devices"] = 2;
  j["parallel"] = {{"dp", 2}};
  j.erase("stages");
  ResolvedPlan r = plan_check(j);
  CostModel model(r.graph, Machine{});
  PlanEstimate e = evaluate_plan(r, model);
  for (const RankEstimate& re : e.ranks) {
    ASSERT_GT(re.grad_bytes, re.param_bytes) << "the tie no longer adds a gradient buffer";
    EXPECT_DOUBLE_EQ(re.dp_bytes, double(re.param_bytes)) << "rank " << re.rank;
  }
}

TEST(Plan, DpSyncTrafficAndMemoryInTheEstimate) {
  json j = tiny_plan();
  ResolvedPlan all = plan_check(j);
  j["dp_sync"] = {{"mode", "local-sgd"}, {"sync_every", 8}};
  ResolvedPlan local = plan_check(j);
  j["dp_sync"]["outer_optimizer"] = "nesterov";
  ResolvedPlan diloco = plan_check(j);
  CostModel model(all.graph, Machine{});
  PlanEstimate a = evaluate_plan(all, model), b = evaluate_plan(local, model),
               c = evaluate_plan(diloco, model);
  ASSERT_GT(a.dp_bytes_per_step, 0);
  EXPECT_NEAR(b.dp_bytes_per_step, a.dp_bytes_per_step / 8, 1e-9 * a.dp_bytes_per_step);
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    // dp 2: each rank sends (2 - 1) / 2 * 2 = 1 times its gradients' bytes per all-reduce.
    EXPECT_DOUBLE_EQ(a.ranks[k].dp_bytes, double(a.ranks[k].param_bytes)) << "rank " << k;
    EXPECT_DOUBLE_EQ(b.ranks[k].dp_bytes, a.ranks[k].dp_bytes / 8) << "rank " << k;
    EXPECT_EQ(b.ranks[k].optimizer_bytes - a.ranks[k].optimizer_bytes, a.ranks[k].grad_bytes);
    EXPECT_EQ(c.ranks[k].optimizer_bytes - a.ranks[k].optimizer_bytes, 2 * a.ranks[k].grad_bytes);
  }
  EXPECT_NE(format_estimate(local, b).find("data-parallel sync local-sgd every 8 steps"),
            std::string::npos)
      << format_estimate(local, b);
  EXPECT_EQ(dp_bytes_per_step(DpSync{}, 1000, 4), 1500);
  DpSync h4;
  h4.mode = DpSync::Mode::local_sgd;
  h4.sync_every = 4;
  EXPECT_EQ(dp_bytes_per_step(h4, 1000, 4), 375);
  EXPECT_EQ(dp_bytes_per_step(h4, 1000, 1), 0);
  DpSync gossip;
  gossip.mode = DpSync::Mode::gossip;
  gossip.peers = 2;
  EXPECT_EQ(dp_bytes_per_step(gossip, 1000, 4), 2000);  // the parameters to two partners
  DpSync extra;
  extra.mode = DpSync::Mode::parameter_server;
  extra.ps_ranks = 2;
  EXPECT_EQ(dp_bytes_per_step(extra, 1000, 4), 1000);  // the push; the servers pull

  // Extra server ranks: two more ranks in the estimate holding the served parts and their
  // state (AdamW: 2 states), the replicas none of it; a server sends its part to each of
  // the dp replicas.
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 0}};
  PlanEstimate own = evaluate_plan(plan_check(j), model);
  j["dp_sync"]["ps_ranks"] = 2;
  ResolvedPlan served = plan_check(j);
  PlanEstimate d = evaluate_plan(served, model);
  ASSERT_EQ(d.ranks.size(), a.ranks.size() + 2);
  int64_t saved = 0, held = 0;
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    EXPECT_LT(d.ranks[k].optimizer_bytes, own.ranks[k].optimizer_bytes) << "rank " << k;
    saved += own.ranks[k].optimizer_bytes - d.ranks[k].optimizer_bytes;
  }
  for (size_t k = a.ranks.size(); k < d.ranks.size(); ++k) {
    const RankEstimate& s = d.ranks[k];
    EXPECT_EQ(s.rank, int(k));
    EXPECT_GT(s.param_bytes, 0);
    EXPECT_EQ(s.optimizer_bytes, 2 * s.param_bytes);
    EXPECT_GT(s.peak, s.param_bytes + s.grad_bytes + s.optimizer_bytes);
    EXPECT_DOUBLE_EQ(s.dp_bytes, 2.0 * double(s.param_bytes));
    held += s.optimizer_bytes;
  }
  // What the replicas no longer hold (their own-rank parts) the servers hold (within the
  // parts' rounding).
  EXPECT_NEAR(double(held), double(saved), 0.02 * double(held));
  const std::string text = format_estimate(served, d);
  EXPECT_NE(text.find("rank 8: parameter server"), std::string::npos) << text;
  EXPECT_NE(text.find("2 extra server ranks serve the parts"), std::string::npos) << text;
}

// A parameter server: allreduce's bytes per step (a push and a pull of (n - 1) / n of
// the parameters each), zero1's optimizer state plus s pull buffers (the served
// parameters and the rank's part each: wte, tied over the pipeline ranks, is all-reduced,
// not served), and a step no slower with staleness (the pull hidden behind the
// compute of the next steps); its time per step on the link: the push and what s steps
// of compute leave of the pull.
TEST(Plan, ParameterServerInTheEstimate) {
  json j = tiny_plan();
  ResolvedPlan all = plan_check(j);
  j["optimizer_sharding"] = "zero1";
  ResolvedPlan zero = plan_check(j);
  j.erase("optimizer_sharding");
  j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", 0}};
  ResolvedPlan ps0 = plan_check(j);
  j["dp_sync"]["max_staleness"] = 2;
  ResolvedPlan ps2 = plan_check(j);
  Machine slow;
  slow.dp_bandwidth = 1e6;  // a slow link: the pull is worth hiding
  CostModel model(all.graph, slow);
  PlanEstimate a = evaluate_plan(all, model), z = evaluate_plan(zero, model),
               p0 = evaluate_plan(ps0, model), p2 = evaluate_plan(ps2, model);
  ASSERT_EQ(a.ranks.size(), p2.ranks.size());
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    EXPECT_DOUBLE_EQ(p0.ranks[k].dp_bytes, a.ranks[k].dp_bytes) << "rank " << k;
    EXPECT_DOUBLE_EQ(p2.ranks[k].dp_bytes, a.ranks[k].dp_bytes) << "rank " << k;
    EXPECT_EQ(p0.ranks[k].optimizer_bytes, z.ranks[k].optimizer_bytes) << "rank " << k;
    // Every rank holds its tensor-parallel half of wte (48 x 64 floats).
    const int64_t served = p2.ranks[k].param_bytes - 48 * 64 * 4 / 2;
    EXPECT_NEAR(double(p2.ranks[k].optimizer_bytes - p0.ranks[k].optimizer_bytes),
                2 * (double(served) + double(served) / 2), 8)
        << "rank " << k;
  }
  EXPECT_DOUBLE_EQ(p0.step_time, z.step_time);
  EXPECT_LT(p2.step_time, p0.step_time);
  EXPECT_NE(format_estimate(ps2, p2).find("parameter-server with staleness 2"), std::string::npos)
      << format_estimate(ps2, p2);

  DpSync s = ps2.plan.dp_sync;
  const double half = all_gather_time(1e6, 4, 1e9, 1e-6);
  EXPECT_DOUBLE_EQ(dp_time_per_step(s, 1e6, 4, 1e9, 1e-6, 1.0), half);  // the pull hidden
  EXPECT_DOUBLE_EQ(dp_time_per_step(s, 1e6, 4, 1e9, 1e-6, 0.0), 2 * half);
  EXPECT_DOUBLE_EQ(dp_time_per_step(s, 1e6, 4, 1e9, 1e-6, half / 4), 2 * half - half / 2);
  s.max_staleness = 0;
  EXPECT_DOUBLE_EQ(dp_time_per_step(s, 1e6, 4, 1e9, 1e-6, 1.0), 2 * half);
  EXPECT_EQ(dp_bytes_per_step(s, 1000, 4), 1500);
}

// Extra server ranks' step times (ps_server_times): the push and the pull each take the
// busier end of a link, the replica's own bytes or a server's share of every replica's
// (replicas x served / N), so more servers push faster on a shared link until the
// replicas' own links bound it; the servers' update streams their 1/N parts; staleness s
// hides s steps of compute's worth of update and pull.
TEST(Plan, ExtraParameterServersTimes) {
  Machine m;
  m.dp_bandwidth = 1e8;
  m.dp_latency = 1e-5;
  m.memory_bandwidth = 1e10;
  const double bytes = 4e6, served = 8e6;  // two replica positions of 4 MB each
  const int replicas = 4, adamw = 2;
  DpSync s;
  s.mode = DpSync::Mode::parameter_server;
  auto at = [&](int n, int staleness, double compute) {
    DpSync x = s;
    x.ps_ranks = n;
    x.max_staleness = staleness;
    return ps_server_times(x, bytes, served, replicas, m, adamw, compute);
  };
  // One server receives every replica's gradients of both positions: 4 x 8 MB.
  const ServerTimes one = at(1, 0, 0), two = at(2, 0, 0), many = at(16, 0, 0);
  EXPECT_DOUBLE_EQ(one.push, m.dp_latency + replicas * served / m.dp_bandwidth);
  EXPECT_LT(two.push, one.push);
  EXPECT_DOUBLE_EQ(one.push - m.dp_latency, 2 * (two.push - m.dp_latency));
  // 16 servers take 2 MB each from every replica: the replica's own 4 MB bound it.
  EXPECT_DOUBLE_EQ(many.push, m.dp_latency + bytes / m.dp_bandwidth);
  EXPECT_DOUBLE_EQ(at(32, 0, 0).push, many.push);
  EXPECT_DOUBLE_EQ(one.pull, one.push);  // each server's part to every replica
  // The update: master, gradient and AdamW's two states over each server's part.
  EXPECT_DOUBLE_EQ(one.update, (3 + 2 * adamw) * served / m.memory_bandwidth);
  EXPECT_DOUBLE_EQ(two.update, one.update / 2);
  // s = 0 waits for the update and the pull; s steps of compute hide up to s x compute.
  EXPECT_DOUBLE_EQ(one.exposed, one.update + one.pull);
  const double c = (one.update + one.pull) / 4;
  EXPECT_DOUBLE_EQ(at(1, 1, c).exposed, one.exposed - c);
  EXPECT_DOUBLE_EQ(at(1, 3, c).exposed, one.exposed - 3 * c);
  EXPECT_DOUBLE_EQ(at(1, 4, c).exposed, 0);
  EXPECT_DOUBLE_EQ(at(1, 8, c).exposed, 0);
  EXPECT_DOUBLE_EQ(at(1, 0, c).exposed, one.exposed);  // s = 0 hides nothing
  EXPECT_DOUBLE_EQ(at(1, 4, c).push, one.push);        // the push is never hidden
  // Not a parameter server with extra ranks: nothing.
  EXPECT_DOUBLE_EQ(at(0, 0, 0).push + at(0, 0, 0).exposed, 0);
  // dp_time_per_step for one position (all of `bytes` served): push and exposed pull.
  DpSync x = s;
  x.ps_ranks = 2;
  EXPECT_DOUBLE_EQ(dp_time_per_step(x, bytes, replicas, m.dp_bandwidth, m.dp_latency, 0),
                   2 * (m.dp_latency + replicas * bytes / 2 / m.dp_bandwidth));
  x.ps_ranks = 4;
  EXPECT_DOUBLE_EQ(dp_time_per_step(x, bytes, replicas, m.dp_bandwidth, m.dp_latency, 0),
                   2 * (m.dp_latency + bytes / m.dp_bandwidth));
}

// The estimate with extra server ranks on a slow link: the step waits for the servers'
// update and pull after the backward, so two servers (half the bytes on each server's
// link) give a shorter step than one, and staleness hides the pull; `baton plan --check`
// prints the times.
TEST(Plan, ExtraParameterServersInTheStepTime) {
  json j = tiny_plan();
  auto at = [&](int n, int staleness) {
    j["dp_sync"] = {{"mode", "parameter-server"}, {"max_staleness", staleness}, {"ps_ranks", n}};
    return plan_check(j);
  };
  Machine slow;
  slow.dp_bandwidth = 1e6;
  const ResolvedPlan r1 = at(1, 0), r2 = at(2, 0), r1s = at(1, 2);
  CostModel model(r1.graph, slow);
  const PlanEstimate one = evaluate_plan(r1, model), two = evaluate_plan(r2, model),
                     stale = evaluate_plan(r1s, model);
  ASSERT_GT(one.servers.push, 0);
  EXPECT_LT(two.servers.push, one.servers.push);
  EXPECT_LT(two.servers.update, one.servers.update);
  EXPECT_LT(two.step_time, one.step_time);
  // The step holds what is exposed: s = 0 everything after the backward.
  EXPECT_DOUBLE_EQ(one.servers.exposed, one.servers.update + one.servers.pull);
  EXPECT_GT(one.step_time, one.servers.exposed);
  EXPECT_LT(stale.servers.exposed, one.servers.exposed);
  EXPECT_LT(stale.step_time, one.step_time);
  // What the step saves with s = 2 is at most what it no longer exposes.
  EXPECT_LE(one.step_time - stale.step_time,
            one.servers.exposed - stale.servers.exposed + 1e-9 * one.step_time);
  // The servers' update is their compute (the replicas do not run it).
  EXPECT_DOUBLE_EQ(one.ranks.back().compute_time, one.servers.update);
  const std::string text = format_estimate(r1, one);
  EXPECT_NE(text.find("parameter servers per step: push"), std::string::npos) << text;
  EXPECT_NE(text.find("updates in"), std::string::npos) << text;
}

// The estimate under zero1: every rank holds half the optimizer state of every parameter
// but the tied wte (summed with the other pipeline rank: whole), and its peak is lower by
// exactly what its optimizer bytes are.
TEST(Plan, OptimizerShardingInTheEstimate) {
  json j = tiny_plan();
  ResolvedPlan none = plan_check(j);
  j["optimizer_sharding"] = "zero1";
  ResolvedPlan zero = plan_check(j);
  CostModel model(none.graph, Machine{});
  PlanEstimate a = evaluate_plan(none, model), b = evaluate_plan(zero, model);
  const stages::Param& wte = none.graph->params[size_t(none.graph->find_param("wte.weight"))];
  const int64_t wte_state =
      2 * memory::shape_numel(wte.logical_shape) / 2 * 4;  // vocab split over tp 2
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    const int64_t saved = a.ranks[k].optimizer_bytes - b.ranks[k].optimizer_bytes;
    EXPECT_EQ(a.ranks[k].peak - b.ranks[k].peak, saved) << "rank " << k;
    const double half_of_the_rest = double(a.ranks[k].optimizer_bytes - wte_state) / 2;
    EXPECT_NEAR(double(saved), half_of_the_rest, 0.01 * half_of_the_rest) << "rank " << k;
  }
  EXPECT_NE(format_estimate(zero, b).find("sharded over the data-parallel replicas (zero1)"),
            std::string::npos);
}

// zero2 against zero1: the same optimizer state, half the gradients of every sharded
// parameter (the tied wte keeps its whole gradient), a lower peak, and a reduce-scatter
// per micro-batch: (m + 1) / 2 times zero1's data-parallel bytes.
TEST(Plan, Zero2InTheEstimate) {
  json j = tiny_plan();
  j["optimizer_sharding"] = "zero1";
  ResolvedPlan z1 = plan_check(j);
  j["optimizer_sharding"] = "zero2";
  ResolvedPlan z2 = plan_check(j);
  CostModel model(z1.graph, Machine{});
  PlanEstimate a = evaluate_plan(z1, model), b = evaluate_plan(z2, model);
  const stages::Param& wte = z1.graph->params[size_t(z1.graph->find_param("wte.weight"))];
  const int64_t wte_grads = memory::shape_numel(wte.logical_shape) / 2 * 4;  // vocab over tp 2
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    EXPECT_EQ(a.ranks[k].optimizer_bytes, b.ranks[k].optimizer_bytes) << "rank " << k;
    const int64_t saved = a.ranks[k].grad_bytes - b.ranks[k].grad_bytes;
    const double half_of_the_rest = double(a.ranks[k].grad_bytes - wte_grads) / 2;
    EXPECT_NEAR(double(saved), half_of_the_rest, 0.1 * half_of_the_rest) << "rank " << k;
    EXPECT_NEAR(b.ranks[k].dp_bytes, a.ranks[k].dp_bytes * (4 + 1) / 2.0,
                1e-9 * a.ranks[k].dp_bytes)
        << "rank " << k;
  }
  EXPECT_NE(format_estimate(z2, b).find("(zero2)"), std::string::npos);
  // zero2 saves at most the gradients: its W holds the whole gradients it makes until
  // their bucket is reduce-scattered, and the reduce-scatter's scratch (a ring's 1 MiB
  // window above 32 KiB, whatever the message), so with the default 4 MiB buckets (one
  // bucket here) its peak is near zero1's; smaller buckets, below the ring's size, lower
  // it (the measured saving on a larger model: tests/engine/test_zero_memory.cpp).
  EvaluateOptions small;
  small.bucket_bytes = 8 << 10;
  const PlanEstimate c = evaluate_plan(z2, model, small);
  for (size_t k = 0; k < a.ranks.size(); ++k) {
    const int64_t saved = a.ranks[k].grad_bytes - b.ranks[k].grad_bytes;
    EXPECT_GE(b.ranks[k].peak, a.ranks[k].peak - saved) << "rank " << k;
    EXPECT_LT(c.ranks[k].peak, b.ranks[k].peak) << "rank " << k;
  }
}

TEST(Plan, SplitOverridesAndRecompute) {
  json j = tiny_plan();
  j["splits"] = {{"h.0.mlp.c_fc", "row"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.h.0.mlp.c_fc: row split of linear node 'h.0.mlp.c_fc' (layer h.0) "
            "needs its input "
            "split over the last dimension, but 'h.0.ln_2' is replicated (it comes whole out of "
            "layernorm node 'h.0.ln_2' (layer h.0): a split passes only through the ops "
            "docs/partitioner.md lists)");
  // Two linears with an unsplit one first: the hint names it.
  j["splits"] = {{"h.0.mlp.c_fc", "none"}, {"h.0.mlp.c_proj", "row"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.h.0.mlp.c_proj: row split of linear node 'h.0.mlp.c_proj' (layer "
            "h.0) needs its input split over the last dimension, but 'h.0.mlp.gelu' is "
            "replicated (split linear node 'h.0.mlp.c_fc' (layer h.0) by columns)");
  // A dropout between two linears gathers the split: it is named (the hint had been to
  // split the first linear by columns, which the plan did).
  json g = json::parse(R"({"type": "graph", "name": "g",
    "inputs": [{"name": "tokens", "shape": [16], "dtype": "i32"},
               {"name": "targets", "shape": [16], "dtype": "i32"}],
    "params": [{"name": "emb", "shape": [48, 32], "init": {"type": "zeros"}}, {"name": "w1", "shape": [64, 32], "init": {"type": "zeros"}},
               {"name": "w2", "shape": [32, 64], "init": {"type": "zeros"}}, {"name": "wo", "shape": [48, 32], "init": {"type": "zeros"}}],
    "layers": [{"name": "embed", "nodes": [{"name": "lookup", "op": "embedding",
                 "inputs": ["tokens"], "outputs": ["x"], "params": {"weight": "emb"}}]},
               {"name": "mlp", "nodes": [
                 {"name": "fc1", "op": "linear", "inputs": ["x"], "outputs": ["h"],
                  "params": {"weight": "w1"}},
                 {"name": "act", "op": "gelu", "inputs": ["h"], "outputs": ["a"]},
                 {"name": "drop", "op": "dropout", "inputs": ["a"], "outputs": ["ad"],
                  "attrs": {"p": 0.3}},
                 {"name": "fc2", "op": "linear", "inputs": ["ad"], "outputs": ["y"],
                  "params": {"weight": "w2"}}]},
               {"name": "head", "nodes": [
                 {"name": "out", "op": "linear", "inputs": ["y"], "outputs": ["logits"],
                  "params": {"weight": "wo"}},
                 {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "targets"],
                  "outputs": ["loss"]}]}],
    "loss": "loss"})");
  json p = tiny_plan();
  p["model"] = g;
  p["devices"] = 2;
  p["parallel"] = {{"tp", 2}};
  p["batch"] = {{"micro_batch_size", 2}, {"global", 8}};
  p.erase("stages");
  p["splits"] = {{"fc1", "column"}, {"fc2", "row"}};
  EXPECT_EQ(plan_error_of(p),
            "plan.json: $.splits.fc2: row split of linear node 'fc2' (layer mlp) needs its input "
            "split over the last dimension, but 'ad' is replicated (it comes whole out of "
            "dropout node 'drop' (layer mlp): a split passes only through the ops "
            "docs/partitioner.md lists)");
  j["splits"] = {{"h.0.ln_1", "column"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.h.0.ln_1: node 'h.0.ln_1' (op layernorm) cannot be split; only "
            "linear, conv2d, embedding, "
            "attention and cross_entropy nodes take a split");
  j["splits"] = {{"h.0.attn.attn", "column"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.h.0.attn.attn: expected \"heads\" or \"none\" for attention node "
            "'h.0.attn.attn', found \"column\"");
  j["splits"] = {{"nope", "none"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.nope: no node named 'nope' in the model (its splittable nodes "
            "are named like 'wte', 'h.0.attn.c_attn', 'h.0.attn.attn'; a cost file of `baton "
            "profile` lists every node)");
  // A name of a node in every layer lists them.
  j["splits"] = {{"mlp.c_fc", "none"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.mlp.c_fc: no node named 'mlp.c_fc' in the model; nodes of that "
            "name: 'h.0.mlp.c_fc', 'h.1.mlp.c_fc' (one override per node)");
  // A name without the model's prefix is completed.
  j["splits"] = {{"0.mlp.c_fc", "none"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.splits.0.mlp.c_fc: no node named '0.mlp.c_fc' in the model; did you "
            "mean 'h.0.mlp.c_fc'?");
  j["splits"] = {{"lm_head", "none"}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.tp: parameter 'wte.weight' is split along dimension 0 over 2 "
            "ranks by embedding node "
            "'wte' (layer embed) but replicated by linear node 'lm_head' (layer head); nodes "
            "sharing a parameter need "
            "the same split (and the same degree) (keep both whole: \"splits\": {\"wte\": "
            "\"none\", \"lm_head\": \"none\"})");
  j["splits"] = {{"lm_head", "none"}, {"wte", "none"}, {"h.1.mlp.c_fc", "none"}};
  ResolvedPlan r = plan_check(j);
  auto kind_of = [&](const std::string& node) {
    for (size_t n = 0; n < r.graph->nodes.size(); ++n)
      if (r.graph->nodes[n].name == node) return r.sharding.nodes[n].kind;
    return SplitKind::heads;
  };
  EXPECT_EQ(kind_of("h.1.mlp.c_fc"), SplitKind::none);
  EXPECT_EQ(kind_of("h.1.mlp.c_proj"), SplitKind::none);  // its input is replicated now
  EXPECT_EQ(kind_of("h.0.mlp.c_fc"), SplitKind::column);
  EXPECT_EQ(kind_of("h.0.mlp.c_proj"), SplitKind::row);
  EXPECT_EQ(kind_of("h.1.attn.attn"), SplitKind::heads);
  EXPECT_EQ(kind_of("wte"), SplitKind::none);
  j = tiny_plan();
  j["stages"][1]["recompute"] = {"h.0"};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[1].recompute[0]: expected a layer of this stage (h.1 .. head), "
            "found 'h.0'");
  j["stages"][1]["recompute"] = {"h.1"};
  ResolvedPlan r2 = plan_check(j);
  EXPECT_EQ(r2.recompute[1], (std::set<int>{2}));
}

// A degree that does not divide what an override splits names the override, not the
// degree (it had named $.parallel.tp): k_proj and v_proj split by columns on a multi-query
// LLaMA (one key/value head), k_proj's 16 features over 3 ranks.
TEST(Plan, OverrideDivisibilityNamesTheOverride) {
  json j = json::parse(R"({"version": 1, "devices": 2, "parallel": {"tp": 2},
    "model": {"type": "llama", "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 1, "num_attention_heads": 6, "num_key_value_heads": 1,
              "max_position_embeddings": 32, "vocab_size": 240, "context": 16},
    "batch": {"micro_batch_size": 1}, "schedule": {"name": "gpipe", "micro_batches": 2}})");
  const std::string k = "model.layers.0.self_attn.k_proj", v = "model.layers.0.self_attn.v_proj";
  j["splits"] = {{k, "column"}, {v, "column"}};
  EXPECT_EQ(plan_error_of(j), "plan.json: $.splits." + k +
                                  ": tensor-parallel degree 2 does not divide n_kv_head = 1 of "
                                  "rotary node 'model.layers.0.self_attn.rotary' (layer "
                                  "layers.0)");
  j["model"]["num_key_value_heads"] = 2;
  j["devices"] = 3;
  j["parallel"]["tp"] = 3;
  j["splits"] = {{k, "column"}};
  EXPECT_EQ(plan_error_of(j), "plan.json: $.splits." + k +
                                  ": tensor-parallel degree 3 does not divide the output "
                                  "features = 16 of linear node '" +
                                  k + "' (layer layers.0)");
  j.erase("splits");  // the default keeps k_proj whole at tp 3
  EXPECT_EQ(plan_error_of(j), "(no error)");
  // k kept whole by an override while v is split: the override is named, and which input
  // is split (the degree's $.parallel.tp had been named).
  j["devices"] = 2;
  j["parallel"]["tp"] = 2;
  j["splits"] = {{k, "none"}};
  EXPECT_EQ(plan_error_of(j), "plan.json: $.splits." + k +
                                  ": rotary node 'model.layers.0.self_attn.rotary' (layer "
                                  "layers.0) has its v input split by heads and its k input "
                                  "not; split both or neither");
}

// "none" on an op that only passes a split on (gelu) is honoured: the linear before it is
// not split for it (the override had been accepted and ignored).
TEST(Plan, NoneOnAPassingOpIsHonoured) {
  json j = tiny_plan();
  j["splits"] = {{"h.0.mlp.gelu", "none"}};
  ResolvedPlan r = plan_check(j);
  auto kind_of = [&](const std::string& node) {
    for (size_t n = 0; n < r.graph->nodes.size(); ++n)
      if (r.graph->nodes[n].name == node) return r.sharding.nodes[n].kind;
    return SplitKind::heads;
  };
  EXPECT_EQ(kind_of("h.0.mlp.c_fc"), SplitKind::none);
  EXPECT_EQ(kind_of("h.0.mlp.c_proj"), SplitKind::none);
  EXPECT_EQ(kind_of("h.1.mlp.c_fc"), SplitKind::column);
}

// A stage's spatial degree and sync_batchnorm: the layout, the devices they need, the
// written form, and the refusals that need no engine.
json spatial_resnet_plan() {
  return json::parse(R"({
    "version": 1,
    "model": "../models/resnet-tiny.json",
    "devices": 8,
    "parallel": {"dp": 2, "pp": 2},
    "batch": {"micro_batch_size": 4},
    "schedule": {"name": "1f1b", "micro_batches": 2},
    "sync_batchnorm": true,
    "stages": [{"layers": [0, 2], "spatial": 2}, {"layers": [2, 4], "spatial": 2}]
  })");
}

// A schedule file that places the chunks otherwise keeps each chunk's spatial degree on a
// pipeline rank of that degree (the degrees set the devices of each pipeline rank).
TEST(Plan, AnotherPlacementKeepsEachChunksSpatialDegree) {
  json j = spatial_resnet_plan();
  j["devices"] = 3;
  j["parallel"] = {{"dp", 1}, {"pp", 2}};
  j["stages"] = json::parse(R"([{"layers": [0, 2], "spatial": 2}, {"layers": [2, 4]}])");
  ResolvedPlan r = plan_check(j);
  const schedule::Schedule swapped = schedule::parse_text(
      "placement: 1 0\n0: 1F0 1F1 1BW0 1BW1\n1: 0F0 0F1 0BW0 0BW1\n", "swap.txt");
  try {
    use_schedule(r, swapped, "swap.txt");
    ADD_FAILURE() << "a spatial chunk placed on a rank without its devices";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "swap.txt: placement: model chunk 0 (spatial 2) on pipeline rank 1, whose spatial "
              "degree is 1 under the plan's placement [0 1]");
  }
  // Both chunks at one degree: the swapped placement is taken.
  j["devices"] = 4;
  j["stages"] =
      json::parse(R"([{"layers": [0, 2], "spatial": 2}, {"layers": [2, 4], "spatial": 2}])");
  ResolvedPlan both = plan_check(j);
  use_schedule(both, swapped, "swap.txt");
  EXPECT_EQ(both.schedule.placement, (std::vector<int>{1, 0}));
  EXPECT_EQ(both.plan.stages[0].pipeline_ranks, std::vector<int>{1});
  // Batch norm's running statistics and two copies of each chunk: refused for the schedule
  // that runs, a file of two directions under a plan naming 1f1b too (it had passed, and
  // its checkpoint kept one copy's statistics); a plan naming dualpipe run with a file of
  // one direction is taken.
  j["devices"] = 2;
  j["stages"] = json::parse(R"([{"layers": [0, 2]}, {"layers": [2, 4]}])");
  j["schedule"] = {{"name", "1f1b"}, {"micro_batches", 4}};
  ResolvedPlan one = plan_check(j);
  const schedule::Schedule two = schedule::generate("dualpipe", 2, 4);
  try {
    use_schedule(one, two, "two.txt");
    ADD_FAILURE() << "two copies of batch norm's statistics";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("two.txt: \"two.txt\" keeps two copies of each chunk "
                                         "(two directions), each seeing half the micro-batches"),
              std::string::npos)
        << e.what();
  }
  j["schedule"] = {{"name", "dualpipe"}, {"micro_batches", 4}};
  EXPECT_NE(plan_error_of(j).find("\"dualpipe\" keeps two copies of each chunk"), std::string::npos)
      << plan_error_of(j);
  const Plan named = parse_plan(j, "plan.json", kDir);
  const schedule::Schedule gpipe = schedule::generate("gpipe", 2, 4);
  const ResolvedPlan taken = resolve_plan(named, load_plan_model(named), &gpipe, "g.txt");
  EXPECT_EQ(taken.schedule.num_directions, 1);
}

// Batch norm's running statistics move in the order of a stage's forwards: a schedule
// file running them out of micro-batch order is named (train warns: the statistics end
// each step other than the one-process run's, up to 3.7e-2 on resnet-tiny), one in order
// or a model without batch norm is not.
TEST(Plan, ForwardOrderNoteForRunningStatistics) {
  json j = spatial_resnet_plan();
  j["devices"] = 2;
  j["parallel"] = {{"dp", 1}, {"pp", 2}};
  j["schedule"] = {{"name", "1f1b"}, {"micro_batches", 4}};
  j["sync_batchnorm"] = false;
  j["stages"] = json::parse(R"([{"layers": [0, 2]}, {"layers": [2, 4]}])");
  ResolvedPlan r = plan_check(j);
  EXPECT_EQ(forward_order_note(r), "");  // the generator's
  ResolvedPlan gpipe = r;
  use_schedule(gpipe,
               schedule::parse_text("0: 0F0 0F1 0F2 0F3 0BW3 0BW2 0BW1 0BW0\n"
                                    "1: 1F0 1F1 1F2 1F3 1BW3 1BW2 1BW1 1BW0\n",
                                    "g.txt"),
               "g.txt");
  EXPECT_EQ(forward_order_note(gpipe), "");  // backwards in any order
  use_schedule(r,
               schedule::parse_text("0: 0F0 0F1 0F2 0F3 0BW3 0BW2 0BW1 0BW0\n"
                                    "1: 1F0 1BW0 1F2 1BW2 1F1 1BW1 1F3 1BW3\n",
                                    "rev.txt"),
               "rev.txt");
  const std::string note = forward_order_note(r);
  EXPECT_EQ(note.rfind("rank 1 runs the forward of micro-batch 1 on stage 1 after that of 2: the "
                       "running statistics of '",
                       0),
            0u)
      << note;
  // The stage's own batch norm (layer2.0's), not the model's first (the stem's, on stage 0).
  EXPECT_NE(note.find("of 'layer2.0."), std::string::npos) << note;
  // A stage without batch norm (the head alone) runs its forwards in any order; another
  // stage out of order names its own.
  j["stages"] = json::parse(R"([{"layers": [0, 3]}, {"layers": [3, 4]}])");
  ResolvedPlan head = plan_check(j);
  use_schedule(head,
               schedule::parse_text("0: 0F0 0F1 0F2 0F3 0BW3 0BW2 0BW1 0BW0\n"
                                    "1: 1F3 1BW3 1F2 1BW2 1F1 1BW1 1F0 1BW0\n",
                                    "r1rev.txt"),
               "r1rev.txt");
  EXPECT_EQ(forward_order_note(head), "");
  use_schedule(head,
               schedule::parse_text("0: 0F1 0F0 0F2 0F3 0BW3 0BW2 0BW1 0BW0\n"
                                    "1: 1F0 1BW0 1F1 1BW1 1F2 1BW2 1F3 1BW3\n",
                                    "r0.txt"),
               "r0.txt");
  const std::string on0 = forward_order_note(head);
  EXPECT_EQ(on0.rfind("rank 0 runs the forward of micro-batch 0 on stage 0 after that of 1: the "
                      "running statistics of '",
                      0),
            0u)
      << on0;
  // A model without batch norm: the order is the schedule's own business.
  json gpt = json::parse(R"({"version": 1, "model": "../models/tiny-gpt.json", "devices": 2,
    "parallel": {"pp": 2}, "batch": {"micro_batch_size": 2},
    "schedule": {"name": "1f1b", "micro_batches": 4},
    "stages": [{"layers": ["embed", "h.0"]}, {"layers": ["h.1", "head"]}]})");
  ResolvedPlan m = plan_check(gpt);
  m.schedule.ranks[0] = {m.schedule.ranks[0].rbegin(), m.schedule.ranks[0].rend()};
  EXPECT_EQ(forward_order_note(m), "");
}

TEST(Plan, SpatialDegreePerStage) {
  ResolvedPlan r = plan_check(spatial_resnet_plan());
  EXPECT_EQ(r.plan.spatial, (std::vector<int>{2, 2}));
  EXPECT_TRUE(r.plan.sync_batchnorm);
  EXPECT_EQ(r.layout.world(), 8);
  // rank = dp * 4 + pp * 2 + sp
  EXPECT_EQ(r.layout.coord(5), (RankCoord{1, 0, 0, 1}));
  EXPECT_EQ(r.layout.spatial_group(6), (std::vector<int>{6, 7}));
  EXPECT_EQ(r.layout.dp_group(3), (std::vector<int>{3, 7}));
  json written = plan_to_json(r.plan, kDir);
  EXPECT_EQ(written["stages"][1]["spatial"], 2);
  EXPECT_EQ(written["sync_batchnorm"], true);
  EXPECT_EQ(written["ranks"][5], json::parse(R"({"rank": 5, "dp": 1, "pp": 0, "tp": 0, "sp": 1})"));
  EXPECT_EQ(written["boundaries"][0]["pattern"], "one-to-one");
  EXPECT_EQ(plan_error_of(written), "(no error)");  // the rank table and boundaries check

  json j = spatial_resnet_plan();
  j["devices"] = 4;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.devices: expected dp x (sum of tp x spatial over the pipeline ranks) = "
            "2 x 4 = 8 devices, found 4");
  j = spatial_resnet_plan();
  j["stages"][0]["spatial"] = 0;
  EXPECT_EQ(plan_error_of(j).substr(0, 35), "plan.json: $.stages[0].spatial: exp");
  // Two chunks of one pipeline rank (interleaved) with different degrees.
  j = spatial_resnet_plan();
  j["schedule"] = {{"name", "interleaved-1f1b"}, {"micro_batches", 2}, {"chunks", 2}};
  j["stages"] = json::parse(R"([{"layers": [0, 1], "spatial": 2}, {"layers": [1, 2], "spatial": 2},
                               {"layers": [2, 3]}, {"layers": [3, 4], "spatial": 2}])");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[2].spatial: 1, but pipeline rank 0 also holds $.stages[0] with "
            "spatial 2; the chunks of one pipeline rank share its spatial degree");
  // A stage count other than the schedule's chunks is named first: with spatial degrees it
  // had been reported as a device count ("1 x 2 = 2 devices, found 4").
  j = spatial_resnet_plan();
  j["parallel"]["dp"] = 1;
  j["devices"] = 4;
  j["schedule"] = {{"name", "dualpipe"}, {"micro_batches", 4}};
  j["stages"] = json::parse(R"([{"layers": [0, 1], "spatial": 2}, {"layers": [1, 2], "spatial": 2},
                               {"layers": [2, 3], "spatial": 2}, {"layers": [3, 4], "spatial": 2}])");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages: expected 2 stages (schedule dualpipe on 2 pipeline ranks holds "
            "2 model chunks), found 4");
  j["schedule"] = {{"name", "1f1b"}, {"micro_batches", 2}};
  j["stages"] = json::parse(R"([{"layers": [0, 4], "spatial": 2}])");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages: expected 2 stages (schedule 1f1b on 2 pipeline ranks holds 2 "
            "model chunks), found 1");
  // Tiles re-tiled between degrees in more blocks per tile than the message tags hold:
  // 32 tiles of one row into one whole image.
  const std::string model =
      (std::filesystem::temp_directory_path() / "baton-retile-32.json").string();
  std::ofstream(model) << R"({"type": "resnet", "in_channels": 1, "image_size": 32, "classes": 2,
    "stem_channels": 2, "stem_kernel": 3, "stem_stride": 1, "stem_pool": false,
    "widths": [2], "depths": [1], "strides": [1]})";
  j = spatial_resnet_plan();
  j["model"] = model;
  j["parallel"] = {{"dp", 1}, {"pp", 2}};
  j["devices"] = 33;
  j["stages"] = json::parse(R"([{"layers": [0, 2], "spatial": 32}, {"layers": [2, 3]}])");
  EXPECT_NE(plan_error_of(j).find("plan.json: $.stages[1].spatial: 1, but value 'layer1.0.relu' "
                                  "crosses the boundary from $.stages[0] (spatial 32) as image "
                                  "tiles, re-tiled in 32 blocks of rows per tile; at most 16"),
            std::string::npos)
      << plan_error_of(j);
  std::filesystem::remove(model);
  // Tensor parallelism and the spatial split in one stage: a pipeline rank's tp x s ranks,
  // the tile's tensor-parallel peers next to each other, then the tiles
  // (rank = dp * 8 + pp * 4 + sp * 2 + tp).
  j = spatial_resnet_plan();
  j["parallel"]["tp"] = 2;
  j["devices"] = 16;
  ResolvedPlan tps = plan_check(j);
  EXPECT_EQ(tps.layout.coord(11), (RankCoord{1, 0, 1, 1}));
  EXPECT_EQ(tps.layout.coord(5), (RankCoord{0, 1, 1, 0}));
  EXPECT_EQ(tps.layout.tp_group(11), (std::vector<int>{10, 11}));
  EXPECT_EQ(tps.layout.spatial_group(11), (std::vector<int>{9, 11}));
  EXPECT_EQ(tps.layout.dp_group(11), (std::vector<int>{3, 11}));
  written = plan_to_json(tps.plan, kDir);
  EXPECT_EQ(written["ranks"][11],
            json::parse(R"({"rank": 11, "dp": 1, "pp": 0, "tp": 1, "sp": 1})"));
  EXPECT_EQ(plan_error_of(written), "(no error)");
  // Strides the tiles cannot keep aligned: 8 rows over 8 tiles.
  j = spatial_resnet_plan();
  j["stages"][0]["spatial"] = 8;
  j["stages"][1]["spatial"] = 8;
  j["devices"] = 32;
  EXPECT_NE(
      plan_error_of(j).find("plan.json: $.stages[0].spatial: spatial degree 8: conv2d node "
                            "'layer2.0.conv1' (layer layer2.0) has stride 2 along the height"),
      std::string::npos)
      << plan_error_of(j);
}

// The world dp x (sum of tp x spatial) is computed in 64 bits and bounded by 2^20 ranks:
// dp 641 x tp 6700417 had wrapped to 1 in int, matched "devices": 1 and crashed training.
TEST(Plan, DegreesWhoseProductPassesTheWorldLimit) {
  json j = tiny_plan();
  j["devices"] = 1;
  j["parallel"] = {{"dp", 641}, {"pp", 1}, {"tp", 6700417}};
  j.erase("stages");
  j.erase("batch");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel: expected degrees whose world dp x (sum of tp over the pipeline "
            "ranks) is at most 1048576 ranks, found 641 x 6700417 = 4294967297");
  j["parallel"] = {{"dp", 1024}, {"pp", 2}, {"tp", {512, 513}}};
  EXPECT_NE(plan_error_of(j).find("found 1024 x 1025 = 1049600"), std::string::npos);
  j = tiny_plan();
  j["devices"] = (1 << 20) + 1;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.devices: expected an integer in [1, 1048576], found 1048577");
  // The spatial degrees multiply in too.
  j = spatial_resnet_plan();
  j["stages"][0]["spatial"] = 1 << 20;
  j["stages"][1]["spatial"] = 1 << 20;
  EXPECT_NE(plan_error_of(j).find("plan.json: $.stages: expected spatial degrees whose world dp x "
                                  "(sum of tp x spatial over the pipeline ranks) is at most "
                                  "1048576 ranks, found 2 x 2097152 = 4194304"),
            std::string::npos)
      << plan_error_of(j);
  EXPECT_THROW(Layout(2048, {513}), std::logic_error);  // a world no plan reaches
}

// Integers from 2^63 up (nlohmann keeps them unsigned) had read wrapped ("found
// -9223372036854775808") or beside a contradicting range ("expected an integer >= 1,
// found 9223372036854775808").
TEST(Plan, IntegersFrom2To63UpNameTheirRange) {
  json j = tiny_plan();
  j["batch"]["global"] = uint64_t(1) << 63;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.batch.global: expected an integer in [1, 9223372036854775807], found "
            "9223372036854775808");
  j = tiny_plan();
  j["version"] = uint64_t(1) << 63;
  EXPECT_NE(plan_error_of(j).find("$.version: expected an integer in [-9223372036854775808, "
                                  "9223372036854775807], found 9223372036854775808"),
            std::string::npos)
      << plan_error_of(j);
  j = tiny_plan();
  j["device_memory"] = UINT64_MAX;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: expected an integer in [0, 9223372036854775807], found "
            "18446744073709551615");
  j = tiny_plan();
  j["parallel"]["dp"] = uint64_t(1) << 63;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.dp: expected an integer in [1, 16777216], found "
            "9223372036854775808");
  // Counts each in range whose product (the global batch) is past int64: it had wrapped
  // to a global batch of -2^63, a "valid plan", or been compared as that with "global".
  j = tiny_plan();
  j["devices"] = 1 << 19;
  j["parallel"] = {{"dp", 1 << 19}, {"pp", 1}, {"tp", 1}};
  j["schedule"]["micro_batches"] = 1 << 20;
  j["batch"] = {{"micro_batch_size", 1 << 24}};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.batch: expected a global batch dp x micro_batches x micro_batch_size "
            "of at most 2^63 - 1, found 524288 x 1048576 x 16777216");
  j["batch"]["global"] = 1;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.batch: expected a global batch dp x micro_batches x micro_batch_size "
            "of at most 2^63 - 1, found 524288 x 1048576 x 16777216");
  // A whole float out of range is a range error (it had said "expected an integer"), and
  // one in range but beyond double's exact integers asks for digits.
  j = tiny_plan();
  j["device_memory"] = 1e19;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: expected an integer in [0, 9223372036854775807], found "
            "1e+19");
  j = tiny_plan();
  j["parallel"]["dp"] = 3e7;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.parallel.dp: expected an integer in [1, 16777216], found 30000000.0");
  j = tiny_plan();
  j["device_memory"] = 1e17;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: expected an integer written in digits (a float this "
            "large is not exact), found 1e+17");
}

// A device_memory beyond int64 (it had wrapped to INT64_MIN) or under one byte (0.4 had
// rounded to 0): both had read as unlimited.
TEST(Plan, DeviceMemoryBeyondInt64OrUnderOneByte) {
  json j = tiny_plan();
  j["device_memory"] = "1e30GiB";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: invalid size '1e30GiB': expected at most 2^63 - 1 bytes "
            "(8 EiB)");
  j["device_memory"] = "0.4";
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: invalid size '0.4': expected 0 or at least 1 byte");
  j["device_memory"] = "0";
  EXPECT_EQ(parse_plan(j, "plan.json", kDir).device_memory, 0);
  // 2^63 - 1 as a string is exact (it had rounded to 2^63 and been refused); a value that
  // is neither a number nor a string names both forms (it had said "an integer").
  j["device_memory"] = "9223372036854775807";
  EXPECT_EQ(parse_plan(j, "plan.json", kDir).device_memory, INT64_MAX);
  j["device_memory"] = true;
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.device_memory: expected a number of bytes or a size string such as "
            "\"64MiB\", found true");
}

// "pipeline_ranks": [] had read as absent (unchecked), a layer named twice in recompute
// had passed.
TEST(Plan, EmptyPipelineRanksAndRepeatedRecompute) {
  json j = tiny_plan();
  j["stages"][0]["pipeline_ranks"] = json::array();
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].pipeline_ranks: expected the pipeline ranks holding the chunk "
            "(at least one), found []");
  j = tiny_plan();
  j["stages"][0]["recompute"] = {"h.0", "h.0"};
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.stages[0].recompute[1]: expected each layer once, found \"h.0\" again "
            "(also at recompute[0])");
}

// A batch norm over one value per channel (micro-batches of one sample reaching a 1 x 1
// map): training refuses it on every rank at the first step, so `baton plan --check`
// refuses it, as the search never proposes it; joined over the replicas (sync_batchnorm),
// or with two samples a micro-batch, it is accepted.
TEST(Plan, BatchNormOverOneValuePerChannel) {
  json j = json::parse(R"({
    "version": 1,
    "model": {"type": "resnet", "in_channels": 1, "image_size": 2, "classes": 3,
              "stem_channels": 4, "stem_kernel": 3, "stem_stride": 1, "stem_pool": false,
              "widths": [4, 4], "depths": [1, 1]},
    "devices": 2,
    "parallel": {"dp": 2},
    "batch": {"micro_batch_size": 1},
    "schedule": {"name": "1f1b", "micro_batches": 1}
  })");
  EXPECT_EQ(plan_error_of(j),
            "plan.json: $.batch.micro_batch_size: micro-batches of 1 sample(s) leave the batch "
            "norm 'layer2.0.bn1' (batchnorm2d, 1 position(s) per sample) 1 value per channel on "
            "each replica: its variance is 0 and the layers before it would learn nothing; "
            "expected micro-batches of at least 2 samples, or \"sync_batchnorm\": true");
  j["sync_batchnorm"] = true;
  EXPECT_EQ(plan_error_of(j), "(no error)");
  j.erase("sync_batchnorm");
  j["batch"]["micro_batch_size"] = 2;
  EXPECT_EQ(plan_error_of(j), "(no error)");
  j["batch"]["micro_batch_size"] = 1;
  j["devices"] = 1;
  j["parallel"] = {{"dp", 1}};
  EXPECT_NE(plan_error_of(j).find("1 value per channel: its variance is 0"), std::string::npos)
      << plan_error_of(j);
}

}  // namespace
}  // namespace baton::partitioner
