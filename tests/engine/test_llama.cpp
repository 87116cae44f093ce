// A LLaMA-family model (grouped-query attention with key/value heads split or replicated
// by tensor parallelism, rotary, SwiGLU, untied head) under a few plans, each rank a
// thread over the local transport: loss and gradient norm within 1e-5 relative of the
// one-process trainer with the same global batch, and pure pipeline parallelism with the
// one-process accumulation order bit for bit. Hugging Face checkpoints into a plan
// (--init-from: each rank reads only its blocks, the losses are the one-process run's)
// and out of one (a PP2xTP2xDP2-trained model exported and read back computes what the
// trained model computes).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine_harness.h"
#include "partitioner/evaluate.h"
#include "partitioner/groups.h"
#include "stages/evaluation.h"
#include "stages/generate.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "stages/model.h"
#include "stages/shorthands.h"

namespace baton::engine_testing {
namespace {

json tiny_llama_json(int64_t kv) {
  return {{"type", "llama"},
          {"name", "tiny-llama"},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", kv},
          {"vocab_size", 256},
          {"max_position_embeddings", 16},
          {"context", 16},
          {"rope_theta", 10000.0}};
}

struct LlamaCase {
  int pp, tp, dp;
  std::string schedule;
  int64_t kv;
};

class LlamaPlans : public ::testing::TestWithParam<LlamaCase> {};

TEST_P(LlamaPlans, MatchesOneProcess) {
  const LlamaCase c = GetParam();
  PlanSpec p;
  p.model = tiny_llama_json(c.kv);
  p.dp = c.dp;
  p.tp.assign(size_t(c.pp), c.tp);
  p.schedule = c.schedule;
  SCOPED_TRACE(p.describe());
  Workspace ws("llama");
  RunSettings s;
  s.steps = 6;
  auto plan = resolve(p, ws);
  std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  expect_steps_match(got, want, /*bitwise=*/c.tp == 1 && c.dp == 1);
}

// A few plans of the whole grid (test_llama_grid.cpp, labelled slow): pure PP under 1F1B
// and ZB-V (bit for bit), PP x TP, TP x DP, PP x TP x DP. kv 2: split at TP 2; kv 1:
// replicated (multi-query).
INSTANTIATE_TEST_SUITE_P(Plans, LlamaPlans,
                         ::testing::Values(LlamaCase{2, 1, 1, "1f1b", 2},
                                           LlamaCase{2, 1, 1, "zb-v", 2},
                                           LlamaCase{2, 2, 1, "1f1b", 2},
                                           LlamaCase{1, 2, 2, "gpipe", 1},
                                           LlamaCase{2, 2, 2, "1f1b", 1}),
                         [](const auto& param_info) {
                           const LlamaCase& c = param_info.param;
                           std::string n = "pp" + std::to_string(c.pp) + "_tp" +
                                           std::to_string(c.tp) + "_dp" + std::to_string(c.dp) +
                                           "_" + c.schedule + "_kv" + std::to_string(c.kv);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// A checkpoint written under PP2 x TP2 (key/value heads split) resumes under TP2 x DP2
// (GPipe) and under one process: the loss curve of one uninterrupted one-process run.
TEST(LlamaCheckpoint, ResumesUnderAnotherPlan) {
  PlanSpec before;
  before.model = tiny_llama_json(2);
  before.tp = {2, 2};
  PlanSpec after = before;
  after.tp = {2};
  after.dp = 2;
  after.schedule = "gpipe";
  after.micro_batches = 2;
  Workspace ws("llama-ckpt");
  RunSettings s;
  s.steps = 6;
  const std::vector<engine::StepRecord> want = run_reference(before, ws, s);
  RunSettings first = s;
  first.steps = 3;
  engine::PlanTrainOptions o = train_options(ws, first);
  o.checkpoint_dir = ws.path("ckpt");
  const std::vector<engine::StepRecord> a = run_threads(resolve(before, ws), o);
  // Each resumed run writes its own last checkpoint: the one process resumes from a copy.
  std::filesystem::copy(ws.path("ckpt"), ws.path("ckpt-one"),
                        std::filesystem::copy_options::recursive);
  o = train_options(ws, s);
  o.checkpoint_dir = ws.path("ckpt");
  o.resume = true;
  const std::vector<engine::StepRecord> b = run_threads(resolve(after, ws), o);
  // And one process from the same checkpoint.
  engine::TrainOptions one = one_process_options(ws, s, 8, 4);
  one.checkpoint_dir = ws.path("ckpt-one");
  one.resume = true;
  const std::vector<engine::StepRecord> c = engine::run_training(one).records;
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < 6; ++i) {
    for (const auto* run : {&b, &c}) {
      const engine::StepRecord& r = i < 3 ? a[i] : (*run)[i - 3];
      EXPECT_EQ(r.step, int64_t(i + 1));
      EXPECT_NEAR(r.loss, want[i].loss, 1e-5 * want[i].loss) << "step " << i + 1;
      EXPECT_NEAR(r.grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm) << "step " << i + 1;
    }
  }
}

std::string fixture(const std::string& name) {
  return std::string(BATON_SOURCE_DIR) + "/tests/fixtures/" + name;
}

// A fixture's config.json as the llama shorthand, trained at context 16.
json fixture_model(const std::string& name) {
  const json cfg = stages::read_hf_model_config(fixture(name));
  json sh = stages::hf_config_to_shorthand(stages::JsonReader(cfg, name + "/config.json"));
  sh["context"] = 16;
  return sh;
}

// The header's bytes (length and JSON) of a safetensors file, and the file's size.
std::pair<uint64_t, uint64_t> header_and_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  unsigned char b[8] = {};
  in.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return {8 + n, size};
}

// PP2 x TP2 over the BF16 shards of qwen2_sharded (shard 1: the embedding, layer 0 and
// layer 1's attention; shard 2: the rest of layer 1, the final norm and the head): each
// rank opens only the shards that the index names for its own parameters (the first
// pipeline stage only shard 1) and reads their headers and exactly the bytes of its own
// blocks, less than its tensors hold; the two tensor-parallel ranks of a stage together
// read all of them.
TEST(LlamaInitFrom, EachRankReadsOnlyItsShardsAndBlocks) {
  const std::string dir = fixture("qwen2_sharded");
  const json index = stages::read_json_file(dir + "/model.safetensors.index.json");
  PlanSpec p;
  p.model = fixture_model("qwen2_sharded");
  p.tp = {2, 2};
  Workspace ws("llama-init-bytes");
  auto plan = resolve(p, ws);
  uint64_t pair_blocks[2] = {0, 0}, stage_tensors[2] = {0, 0};
  for (int rank = 0; rank < plan->layout.world(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::shared_ptr<stages::Graph> g = partitioner::physical_graph(*plan, rank);
    const partitioner::RankView v = partitioner::rank_view(*plan, rank);
    stages::HfCheckpoint ckpt(dir);
    uint64_t blocks = 0, tensors = 0;
    std::set<std::string> files;
    for (const partitioner::RankStage& rs : v.stages) {
      stages::Stage st(g, rs.first_layer, rs.last_layer);
      stages::load_hf_weights(ckpt, st);
      for (int id : st.param_ids()) {
        const stages::Param& prm = g->params[size_t(id)];
        blocks += uint64_t(st.param(id).numel()) * 2;  // BF16
        tensors += uint64_t(memory::shape_numel(prm.logical_shape)) * 2;
        files.insert(index.at("weight_map").at(prm.name).get<std::string>());
      }
    }
    uint64_t headers = 0;
    for (const std::string& f : files) headers += header_and_size(dir + "/" + f).first;
    const int pp = v.coord.pp;
    EXPECT_EQ(ckpt.opened(), std::vector<std::string>(files.begin(), files.end()));
    if (pp == 0) {
      EXPECT_EQ(files, std::set<std::string>{"model-00001-of-00002.safetensors"});
    }
    EXPECT_EQ(ckpt.bytes_read(), headers + blocks);
    EXPECT_LT(blocks, tensors);
    pair_blocks[pp] += blocks;
    stage_tensors[pp] = tensors;
    std::printf("rank %d (pp %d, tp %d): %zu file(s), %llu of its tensors' %llu bytes\n", rank, pp,
                v.coord.tp, files.size(), static_cast<unsigned long long>(blocks),
                static_cast<unsigned long long>(tensors));
  }
  for (int pp = 0; pp < 2; ++pp)
    EXPECT_GE(pair_blocks[pp], stage_tensors[pp]) << "pipeline stage " << pp;
}

// A PP2 x TP2 run (key/value heads split) from llama_gqa's weights: the losses and
// gradient norms of the one-process run from the same weights, within 1e-5 relative.
TEST(LlamaInitFrom, PlanMatchesOneProcess) {
  const std::string dir = fixture("llama_gqa");
  PlanSpec p;
  p.model = fixture_model("llama_gqa");
  p.tp = {2, 2};
  Workspace ws("llama-init");
  RunSettings s;
  s.steps = 4;
  auto plan = resolve(p, ws);
  engine::TrainOptions one =
      one_process_options(ws, s, p.micro_batches * p.micro_batch_size, p.micro_batches);
  kernels::set_num_threads(1);
  const std::vector<engine::StepRecord> fresh = engine::run_training(one).records;
  one.init_from = dir;
  const std::vector<engine::StepRecord> want = engine::run_training(one).records;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.init_from = dir;
  const std::vector<engine::StepRecord> got = run_threads(plan, o);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
        << "step " << i + 1;
  }
  // The weights were the fixture's, not a random initialisation.
  std::printf("first step: grad norm %.6f from the fixture, %.6f from a random start\n",
              want[0].grad_norm, fresh[0].grad_norm);
  EXPECT_GT(std::abs(want[0].grad_norm - fresh[0].grad_norm), 1e-3 * fresh[0].grad_norm);
}

// A Hugging Face directory of its own (moved or edited by the test): llama_gqa's fixture.
std::string llama_hf_dir(Workspace& ws) {
  const std::string dir = ws.path("hf");
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(fixture("llama_gqa") + "/" + f, dir + "/" + f);
  return dir;
}

// --resume over a checkpoint of an --init-from run does not read the Hugging Face
// directory (moved away here): one process, with --model and with the model its
// config.json gave (now the checkpoint's), and a TP2 plan each continue at step 3 with
// the loss of a run from the same weights that had not stopped.
TEST(LlamaInitFrom, ResumeFromACheckpointDoesNotReadTheDirectory) {
  Workspace ws("llama-init-resume");
  const std::string dir = llama_hf_dir(ws);
  PlanSpec p;
  p.model = fixture_model("llama_gqa");
  p.tp = {2};
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 3;
  kernels::set_num_threads(1);
  engine::TrainOptions one =
      one_process_options(ws, s, p.micro_batches * p.micro_batch_size, p.micro_batches);
  one.init_from = dir;
  engine::TrainOptions bare = one;  // the model from config.json, then from the checkpoint
  bare.model_path.clear();
  engine::PlanTrainOptions o = train_options(ws, s);
  o.init_from = dir;
  // What each gives at step 3 without stopping.
  const std::vector<engine::StepRecord> want = engine::run_training(one).records;
  const std::vector<engine::StepRecord> want_bare = engine::run_training(bare).records;
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(want_bare.size(), 3u);
  one.checkpoint_dir = ws.path("ck-one");
  bare.checkpoint_dir = ws.path("ck-bare");
  o.checkpoint_dir = ws.path("ck-plan");
  one.steps = bare.steps = o.steps = 2;
  engine::run_training(one);
  engine::run_training(bare);
  run_threads(plan, o);
  std::filesystem::rename(dir, ws.path("hf-moved"));

  one.resume = bare.resume = o.resume = true;
  one.steps = bare.steps = o.steps = 3;
  for (const auto& [r, w] : {std::pair{one, want[2]}, std::pair{bare, want_bare[2]}}) {
    const std::vector<engine::StepRecord> got = engine::run_training(r).records;
    ASSERT_EQ(got.size(), 1u) << r.checkpoint_dir;
    EXPECT_EQ(got[0].step, 3);
    EXPECT_EQ(got[0].loss, w.loss) << r.checkpoint_dir;
  }
  const std::vector<engine::StepRecord> got = run_threads(plan, o);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step, 3);
  EXPECT_NEAR(got[0].loss, want[2].loss, 1e-5 * std::abs(want[2].loss));

  // Without a checkpoint the directory is read as before: gone, it is an error.
  one.checkpoint_dir = ws.path("ck-none");
  EXPECT_THROW(engine::run_training(one), InputError);
}

// The stop ids of an --init-from directory's generation_config.json (which transformers'
// generate takes over config.json's) live on in its run's checkpoints, one process and
// under a plan, through a resume that does not read the directory, and export writes them
// back as generation_config.json.
TEST(LlamaInitFrom, CheckpointsKeepTheDirectorysStopIds) {
  Workspace ws("llama-init-stop-ids");
  const std::string dir = llama_hf_dir(ws);
  std::ofstream(dir + "/generation_config.json") << "{\"eos_token_id\": [5, 7]}\n";
  PlanSpec p;
  p.model = fixture_model("llama_gqa");
  p.tp = {2};
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 1;
  kernels::set_num_threads(1);
  engine::TrainOptions one =
      one_process_options(ws, s, p.micro_batches * p.micro_batch_size, p.micro_batches);
  one.init_from = dir;
  one.checkpoint_dir = ws.path("ck-one");
  engine::PlanTrainOptions o = train_options(ws, s);
  o.init_from = dir;
  o.checkpoint_dir = ws.path("ck-plan");
  engine::run_training(one);
  run_threads(plan, o);
  std::filesystem::rename(dir, ws.path("hf-moved"));
  one.resume = o.resume = true;
  one.steps = o.steps = 2;
  engine::run_training(one);
  run_threads(plan, o);
  const std::vector<int32_t> want = {5, 7};
  for (const std::string& root : {one.checkpoint_dir, o.checkpoint_dir}) {
    const std::string step_dir = stages::resolve_checkpoint(root);
    EXPECT_EQ(stages::checkpoint_eos_token_ids(stages::read_manifest(step_dir),
                                               step_dir + "/manifest.json"),
              want)
        << step_dir;
    const std::string out = root + "-hf";
    EXPECT_EQ(stages::export_hf(step_dir, out, {}), 2);
    std::ifstream gen(out + "/generation_config.json");
    ASSERT_TRUE(gen.good()) << out;
    EXPECT_EQ(nlohmann::json::parse(gen)["eos_token_id"], nlohmann::json(want)) << out;
  }
}

// A plan whose model is not the one the weights were made for: an InputError naming the
// field, both values and the directory's config.json, before any rank is assembled.
TEST(LlamaInitFrom, ModelThatDiffersFromTheConfigIsAnError) {
  const std::string dir = fixture("llama_gqa");
  PlanSpec p;
  p.model = fixture_model("llama_gqa");
  p.model["rope_theta"] = 500000.0;
  p.tp = {2};
  Workspace ws("llama-init-bad");
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 1;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.init_from = dir;
  try {
    run_threads(plan, o);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    const std::string m = e.what();
    std::printf("%s\n", m.c_str());
    EXPECT_NE(m.find("rope_theta is 500000"), std::string::npos) << m;
    EXPECT_NE(m.find(dir + "/config.json has 10000"), std::string::npos) << m;
  }
}

// A config.json that asks for a much larger model than its weights (a vocabulary of 65536
// beside a table of 256 rows), on one process and under PP2 x TP2: the InputError names
// the file, the tensor and both shapes, found from the safetensors header before the
// stage allocates the parameters, gradients and optimizer state config.json asks for.
TEST(LlamaInitFrom, ConfigLargerThanTheWeightsIsRefusedBeforeAllocating) {
  Workspace ws("llama-init-wide");
  const std::string dir = ws.path("wide");
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(fixture("llama_gqa") + "/" + f, dir + "/" + f);
  json cfg = stages::read_json_file(dir + "/config.json");
  cfg["vocab_size"] = 65536;
  std::ofstream(dir + "/config.json") << cfg.dump();
  // The embedding's or (on a rank of the last pipeline stage) the head's.
  auto expect_refused = [&](const std::string& tensor, const std::function<void()>& run) {
    const std::vector<std::string> parts = {dir + "/model.safetensors: tensor '" + tensor,
                                            "has shape [256, 32]", "is [65536, 32]"};
    memory::Allocator& alloc = memory::allocator_for(memory::Device::cpu());
    alloc.reset_peak();
    try {
      run();
      ADD_FAILURE() << "no error";
    } catch (const InputError& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    // The embedding alone would be 8 MiB, its head, gradients and moments seven times more.
    EXPECT_LT(alloc.stats().peak, size_t(4) << 20);
  };
  RunSettings s;
  s.steps = 1;
  engine::TrainOptions one = one_process_options(ws, s, 4, 1);
  one.model_path.clear();
  one.init_from = dir;
  expect_refused("model.embed_tokens.weight", [&] { engine::run_training(one); });

  PlanSpec p;
  p.model = stages::hf_config_to_shorthand(stages::JsonReader(cfg, "wide/config.json"));
  p.model["context"] = 16;
  p.tp = {2, 2};
  auto plan = resolve(p, ws);
  engine::PlanTrainOptions o = train_options(ws, s);
  o.init_from = dir;
  expect_refused("", [&] { run_threads(plan, o); });
}

// A model trained under PP2 x TP2 x DP2 (every parameter split or replicated somewhere),
// its checkpoint exported in the Hugging Face layout and read back: every tensor the
// trained model's bit for bit, the logits at every position of a sequence equal, and the
// held-out loss the plan measured after its last step within 1e-5 relative.
TEST(LlamaExport, TrainedUnderPp2Tp2Dp2ReimportsWithTheSameLogits) {
  PlanSpec p;
  p.model = tiny_llama_json(2);
  p.tp = {2, 2};
  p.dp = 2;
  Workspace ws("llama-export");
  RunSettings s;
  s.steps = 3;
  const std::string data = std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";
  s.configure = [&](engine::LoopOptions& o) { o.data.eval_data = {data}; };
  engine::PlanTrainOptions o = train_options(ws, s);
  o.checkpoint_dir = ws.path("ckpt");
  const std::vector<engine::StepRecord> got = run_threads(resolve(p, ws), o);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got.back().eval_loss.has_value());

  const std::string step_dir = stages::resolve_checkpoint(ws.path("ckpt"));
  EXPECT_EQ(stages::export_hf(step_dir, ws.path("hf"), {}), 3);
  stages::WholeModel trained = stages::load_whole_checkpoint(step_dir);
  const json cfg = stages::read_hf_model_config(ws.path("hf"));
  auto g =
      std::make_shared<stages::Graph>(stages::load_model_json(cfg, ws.path("hf") + "/config.json"));
  stages::Stage back(g, 0, g->num_layers());
  stages::load_hf_weights(ws.path("hf"), back);
  ASSERT_EQ(back.param_ids().size(), trained.stage->param_ids().size());
  for (int id : back.param_ids()) {
    const std::string& name = g->params[size_t(id)].name;
    EXPECT_EQ(back.param(id).to_vector<float>(), trained.stage->param(name).to_vector<float>())
        << name;
  }
  stages::Generator a(*trained.stage, 16), b(back, 16);
  for (int32_t t : {76, 105, 99, 101, 110, 115, 101, 32, 116, 101, 120, 116}) {
    const std::vector<float> la = a.feed({t}), lb = b.feed({t});
    ASSERT_EQ(la.size(), 256u);
    EXPECT_EQ(la, lb) << "position " << a.position();
  }
  stages::DataFlags flags;
  flags.data = {data};
  flags.eval_data = {data};
  stages::TrainData d = stages::open_train_data(flags, *g, "export");
  const int64_t batch = int64_t(p.dp) * p.micro_batches * p.micro_batch_size;
  const double loss =
      stages::evaluate_loss(back, *d.eval, {1, batch, p.dp * p.micro_batches, s.seed});
  std::printf("held-out loss: %.8f under the plan, %.8f exported and read back\n",
              *got.back().eval_loss, loss);
  EXPECT_NEAR(loss, *got.back().eval_loss, 1e-5 * loss);
}

}  // namespace
}  // namespace baton::engine_testing
