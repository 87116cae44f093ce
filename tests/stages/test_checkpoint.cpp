// Checkpoints: parameters and optimizer state round-trip, and a checkpoint written under
// one partition loads under another (whole <-> tensor-parallel shards with several
// blocks per tensor), because tensors are stored with their block of the logical tensor.
// Checkpoints prove themselves: a flipped byte or a cut shard is found and named (file
// and tensor), --resume falls back past it, a full disk leaves the earlier checkpoints
// intact, and a newer format version is refused.
#include <fcntl.h>
#include <sched.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "memory/file_io.h"
#include "stages/checkpoint.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "stages/safetensors.h"
#include "tests/fifo_read.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

// The graph as tensor-parallel rank `r` of 2 would hold it: c_attn of block 0 split by
// heads (its query, key and value columns: three blocks), wte split by vocabulary rows.
std::shared_ptr<Graph> sharded(const Graph& g, int r) {
  auto s = std::make_shared<Graph>(g);
  auto split_columns = [&](const std::string& name) {
    Param& p = s->params[size_t(s->find_param(name))];
    int64_t c3 = p.logical_shape.back(), c = c3 / 3, h = c / 2;
    bool matrix = p.logical_shape.size() == 2;
    int64_t rows = matrix ? p.logical_shape[0] : 0;
    p.shape = matrix ? memory::Shape{rows, 3 * h} : memory::Shape{3 * h};
    for (int64_t j = 0; j < 3; ++j) {
      ParamPiece piece;
      piece.local_offsets = matrix ? memory::Shape{0, j * h} : memory::Shape{j * h};
      piece.shape = matrix ? memory::Shape{rows, h} : memory::Shape{h};
      piece.global_offsets =
          matrix ? memory::Shape{0, j * c + r * h} : memory::Shape{j * c + r * h};
      p.pieces.push_back(piece);
    }
  };
  split_columns("h.0.attn.c_attn.weight");
  split_columns("h.0.attn.c_attn.bias");
  Param& wte = s->params[size_t(s->find_param("wte.weight"))];
  int64_t v = wte.logical_shape[0] / 2;
  wte.shape = {v, wte.logical_shape[1]};
  wte.pieces = {ParamPiece{{0, 0}, wte.shape, {r * v, 0}}};
  return s;
}

// The block of `full` that local piece k of param `p` holds.
Tensor block_of(const Tensor& full, const ParamPiece& piece) {
  Tensor t = full;
  for (size_t d = 0; d < piece.shape.size(); ++d)
    t = t.narrow(int64_t(d), piece.global_offsets[d], piece.shape[d]);
  return t.contiguous();
}

void expect_holds_blocks(const Stage& shard, const Stage& full) {
  const Graph& g = shard.graph();
  for (int id : shard.param_ids()) {
    const Param& p = g.params[size_t(id)];
    if (!p.is_shard()) {
      EXPECT_EQ(shard.param(id).to_vector<float>(), full.param(id).to_vector<float>()) << p.name;
      continue;
    }
    for (const ParamPiece& piece : p.pieces) {
      Tensor local = shard.param(id);
      for (size_t d = 0; d < piece.shape.size(); ++d)
        local = local.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
      EXPECT_EQ(local.to_vector<float>(), block_of(full.param(id), piece).to_vector<float>())
          << p.name;
    }
  }
}

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(d);
  return d;
}

// Caps the CPU allocator at what it holds, for the scope: a plan's cap with nothing spare.
struct CapAtInUse {
  memory::Allocator& a = memory::allocator_for(memory::Device::cpu());
  CapAtInUse() { a.set_capacity(a.stats().in_use); }
  ~CapAtInUse() { a.set_capacity(0); }
  CapAtInUse(const CapAtInUse&) = delete;
  CapAtInUse& operator=(const CapAtInUse&) = delete;
};

void scramble(Stage& st, uint64_t seed) {
  for (int id : st.param_ids()) {
    kernels::random_normal(st.param(id), 0, 1, seed, uint64_t(id), kernels::Block{});
    uint64_t k = 100;
    for (auto& [name, t] : st.optimizer_state(id)) {
      Tensor m = t;
      kernels::random_normal(m, 0, 1, seed + 1, uint64_t(id) * 7 + k++, kernels::Block{});
    }
  }
}

TEST(Checkpoint, ShardsStartFromTheUnsplitValues) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  StageOptions so{memory::Device::cpu(), 5};
  Stage full(g, 0, g->num_layers(), so);
  for (int r = 0; r < 2; ++r) {
    Stage shard(sharded(*g, r), 0, g->num_layers(), so);
    expect_holds_blocks(shard, full);
  }
}

TEST(Checkpoint, RoundTripWithOptimizerState) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage a(g, 0, g->num_layers());
  a.set_optimizer(OptimizerConfig{});
  scramble(a, 3);
  a.set_optimizer_steps(17);
  Manifest m;
  m.step = 17;
  m.model = g->config;
  std::string root = fresh_dir("ckpt_roundtrip");
  std::string dir = save_checkpoint(root, a, m);
  EXPECT_EQ(latest_checkpoint(root), dir);
  Manifest back = read_manifest(dir);
  EXPECT_EQ(back.step, 17);
  EXPECT_EQ(back.optimizer_steps, 17);
  EXPECT_EQ(back.shards.size(), 2u);
  Stage b(g, 0, g->num_layers(), StageOptions{memory::Device::cpu(), 9});
  load_stage(dir, back, b, true);
  EXPECT_EQ(b.optimizer_steps(), 17);
  for (int id : a.param_ids()) {
    EXPECT_EQ(a.param(id).to_vector<float>(), b.param(id).to_vector<float>());
    auto sa = a.optimizer_state(id), sb = b.optimizer_state(id);
    ASSERT_EQ(sa.size(), 2u);
    for (size_t k = 0; k < sa.size(); ++k)
      EXPECT_EQ(sa[k].second.to_vector<float>(), sb[k].second.to_vector<float>());
  }
}

// A buffer its op updates (batch norm's running statistics, "trainable": false) takes no
// optimizer step, so it has no optimizer state and none is written; a checkpoint written
// before, with zero moments for it, still loads (those entries are not read).
TEST(Checkpoint, BuffersHaveNoOptimizerStateAndOldEntriesAreIgnored) {
  const nlohmann::json model = nlohmann::json::parse(R"({
    "type": "graph", "name": "bn",
    "inputs": [{"name": "images", "shape": [1, 4, 4], "dtype": "f32"},
               {"name": "labels", "shape": [], "dtype": "i64"}],
    "params": [{"name": "c.w", "shape": [2, 1, 3, 3], "init": {"type": "normal", "std": 0.3}},
               {"name": "bn.w", "shape": [2], "init": {"type": "ones"}},
               {"name": "bn.b", "shape": [2], "init": {"type": "zeros"}},
               {"name": "bn.rm", "shape": [2], "init": {"type": "zeros"}, "trainable": false},
               {"name": "bn.rv", "shape": [2], "init": {"type": "ones"}, "trainable": false},
               {"name": "fc.w", "shape": [3, 2], "init": {"type": "normal", "std": 0.3}}],
    "layers": [{"name": "a", "nodes": [
      {"name": "c", "op": "conv2d", "inputs": ["images"], "outputs": ["h"],
       "params": {"weight": "c.w"}, "attrs": {"padding": 1}},
      {"name": "bn", "op": "batchnorm2d", "inputs": ["h"], "outputs": ["n"],
       "params": {"weight": "bn.w", "bias": "bn.b", "running_mean": "bn.rm",
                  "running_var": "bn.rv"}},
      {"name": "gap", "op": "global_avgpool", "inputs": ["n"], "outputs": ["v"]},
      {"name": "fc", "op": "linear", "inputs": ["v"], "outputs": ["logits"],
       "params": {"weight": "fc.w"}},
      {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "labels"], "outputs": ["loss"]}]}],
    "loss": "loss"})");
  auto g = std::make_shared<Graph>(load_model_json(model, "bn.json"));
  const std::set<std::string> buffers{"bn.rm", "bn.rv"};
  Stage a(g, 0, g->num_layers());
  a.set_optimizer(OptimizerConfig{});
  for (int id : a.param_ids())
    EXPECT_EQ(a.optimizer_state(id).size(), buffers.count(g->params[size_t(id)].name) ? 0u : 2u)
        << g->params[size_t(id)].name;
  scramble(a, 7);
  Manifest m;
  m.step = 3;
  m.model = g->config;
  const std::string dir = save_checkpoint(fresh_dir("ckpt_buffers"), a, m);
  SafetensorsReader opt(dir + "/optimizer-rank00000.safetensors");
  EXPECT_EQ(opt.entries().size(), 2 * (g->params.size() - buffers.size()));
  for (const SafetensorsEntry& e : opt.entries())
    EXPECT_FALSE(buffers.count(e.name.substr(0, e.name.find(':')))) << e.name;

  // The same checkpoint as written before: the buffers' moments stored too.
  auto old_graph = std::make_shared<Graph>(*g);
  for (Param& p : old_graph->params) p.trainable = true;
  Stage old(old_graph, 0, old_graph->num_layers());
  old.set_optimizer(OptimizerConfig{});
  scramble(old, 7);
  const std::string old_dir = save_checkpoint(fresh_dir("ckpt_buffers_old"), old, m);
  SafetensorsReader old_opt(old_dir + "/optimizer-rank00000.safetensors");
  ASSERT_NE(old_opt.find("bn.rm:exp_avg"), nullptr);
  Stage b(g, 0, g->num_layers(), StageOptions{memory::Device::cpu(), 9});
  load_stage(old_dir, read_manifest(old_dir), b, true);
  for (int id : b.param_ids()) {
    SCOPED_TRACE(g->params[size_t(id)].name);
    EXPECT_EQ(b.param(id).to_vector<float>(), old.param(id).to_vector<float>());
    auto sb = b.optimizer_state(id), so = old.optimizer_state(id);
    ASSERT_EQ(sb.size(), buffers.count(g->params[size_t(id)].name) ? 0u : 2u);
    for (size_t k = 0; k < sb.size(); ++k)
      EXPECT_EQ(sb[k].second.to_vector<float>(), so[k].second.to_vector<float>());
  }
}

// SGD keeps a momentum buffer whenever its kernel reads one (momentum != 0): a negative
// momentum (baton train refuses it; the API takes it) had none and failed its first step
// ("kernels::sgd_step: momentum_buf is undefined").
TEST(Checkpoint, AnyNonzeroMomentumKeepsItsBuffer) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::sgd;
  for (double momentum : {0.0, 0.9, -0.5}) {
    Stage a(g, 0, g->num_layers());
    c.sgd.momentum = momentum;
    a.set_optimizer(c);
    for (int id : a.param_ids())
      EXPECT_EQ(a.optimizer_state(id).size(), momentum != 0 ? 1u : 0u) << momentum;
    a.zero_grad();
    EXPECT_NO_THROW(a.step()) << momentum;
  }
}

// A step written again (a run resumed from before it) leaves nothing of the earlier write:
// not an interrupted write's temporary file, not the shards of a plan with more ranks.
TEST(Checkpoint, AStepWrittenAgainStartsEmpty) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage a(g, 0, g->num_layers());
  scramble(a, 5);
  Manifest m;
  m.step = 4;
  m.model = g->config;
  std::string root = fresh_dir("ckpt_rewrite");
  std::string dir = checkpoint_dir(root, 4);
  std::filesystem::create_directories(dir + "/sub");
  for (const char* stale : {"/model-rank00003.safetensors", "/model-rank00000.safetensors.tmp77.0",
                            "/manifest.json", "/sub/x"})
    std::ofstream(dir + stale) << "stale";
  EXPECT_EQ(save_checkpoint(root, a, m), dir);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "model-rank00000.safetensors"}));
  EXPECT_EQ(verify_checkpoint(dir, read_manifest(dir)), std::nullopt);
}

TEST(Checkpoint, WholeCheckpointLoadsIntoShards) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage full(g, 0, g->num_layers());
  full.set_optimizer(OptimizerConfig{});
  scramble(full, 4);
  Manifest m;
  m.model = g->config;
  std::string dir = save_checkpoint(fresh_dir("ckpt_to_shards"), full, m);
  for (int r = 0; r < 2; ++r) {
    Stage shard(sharded(*g, r), 0, g->num_layers());
    load_stage(dir, read_manifest(dir), shard, true);
    expect_holds_blocks(shard, full);
  }
}

TEST(Checkpoint, ShardedCheckpointLoadsWhole) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage full(g, 0, g->num_layers());
  scramble(full, 6);
  std::string root = fresh_dir("ckpt_from_shards");
  Manifest m;
  m.step = 3;
  m.model = g->config;
  std::string src = save_checkpoint(fresh_dir("ckpt_src"), full, m);
  std::string dir = checkpoint_dir(root, 3);
  begin_checkpoint(dir);
  for (int r = 0; r < 2; ++r) {
    Stage shard(sharded(*g, r), 0, g->num_layers());
    load_stage(src, read_manifest(src), shard, false);
    // Replicated parameters are written by rank 0 only.
    auto owns = [&](int id) { return r == 0 || shard.graph().params[size_t(id)].is_shard(); };
    for (ShardFile& f : write_stage_shards(dir, shard, r, owns)) m.shards.push_back(f);
  }
  write_manifest(dir, m);
  EXPECT_EQ(latest_checkpoint(root), dir);
  Stage back(g, 0, g->num_layers(), StageOptions{memory::Device::cpu(), 77});
  load_stage(dir, read_manifest(dir), back, false);
  for (int id : full.param_ids())
    EXPECT_EQ(back.param(id).to_vector<float>(), full.param(id).to_vector<float>())
        << g->params[size_t(id)].name;

  // Without rank 1's file, the blocks of the split tensors do not cover them.
  Manifest partial = read_manifest(dir);
  partial.shards.erase(partial.shards.begin() + 1);
  try {
    load_stage(dir, partial, back, false);
    FAIL() << "a partial checkpoint loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cover"), std::string::npos) << e.what();
  }
  // A manifest that lost its shards' entries (the files all there): the message names the
  // list it searched (it had said "no tensor ... in the checkpoint").
  partial = read_manifest(dir);
  partial.shards.clear();
  try {
    load_stage(dir, partial, back, false);
    FAIL() << "a checkpoint without shards loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("' in the model shards manifest.json $.shards lists "
                                         "(none)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, ManifestErrorsNameTheField) {
  std::string dir = fresh_dir("ckpt_bad_manifest");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/manifest.json")
      << R"({"format": "baton-checkpoint", "version": 1, "step": -1})";
  try {
    read_manifest(dir);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: $.step"), std::string::npos) << e.what();
  }
}

// A manifest's optimizer as the flags take it: eps 0 (0 / 0 for a parameter whose
// gradients were all 0) and Nesterov without a momentum are refused, naming the field.
TEST(Checkpoint, ManifestOptimizerOutsideTheFlagsRangesIsRefused) {
  for (const auto& [config, field] :
       {std::pair<const char*, const char*>{R"({"type": "adamw", "lr": 0.001, "eps": 0})", "eps"},
        {R"({"type": "sgd", "lr": 0.1, "nesterov": true})", "nesterov"}}) {
    try {
      OptimizerConfig::from_json(nlohmann::json::parse(config), "m.json $.optimizer.config");
      ADD_FAILURE() << config;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("$.optimizer.config: $.") + field),
                std::string::npos)
          << e.what();
    }
  }
  const OptimizerConfig ok = OptimizerConfig::from_json(
      nlohmann::json::parse(R"({"type": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": true})"),
      "m.json");
  EXPECT_TRUE(ok.sgd.nesterov);
}

// --seed takes [0, 2^64): a manifest of a run seeded from 2^63 up is read back, not taken
// for a damaged one.
TEST(Checkpoint, ManifestSeedTakesTheWholeUint64Range) {
  const std::string root = fresh_dir("ckpt_seed64");
  for (uint64_t seed : {uint64_t(INT64_MAX) + 1, UINT64_MAX}) {
    auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
    Stage a(g, 0, g->num_layers());
    Manifest m;
    m.step = seed == UINT64_MAX ? 2 : 1;
    m.seed = seed;
    m.model = g->config;
    const std::string dir = save_checkpoint(root, a, m);
    EXPECT_EQ(read_manifest(dir).seed, seed);
    EXPECT_EQ(latest_checkpoint(root), dir);
  }
  json j = Manifest{}.to_json();
  j.erase("crc32");
  j["version"] = 2;  // no checksum, so the seed's own check speaks
  j["seed"] = -1;
  try {
    Manifest::from_json(j, "manifest.json");
    FAIL() << "a negative seed was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: $.seed: expected an integer in [0, 2^64)"),
              std::string::npos)
        << e.what();
  }
}

// ---- checkpoints that prove themselves ----

std::string save_scrambled(const std::string& root, int64_t step, uint64_t seed) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage a(g, 0, g->num_layers());
  a.set_optimizer(OptimizerConfig{});
  scramble(a, seed);
  Manifest m;
  m.step = step;
  m.model = g->config;
  return save_checkpoint(root, a, m);
}

// Byte `at` of the data of tensor `name` in a safetensors file, as a file offset.
uint64_t data_offset(const std::string& path, const std::string& name, uint64_t at) {
  SafetensorsReader r(path);
  const SafetensorsEntry* e = r.find(name);
  EXPECT_NE(e, nullptr) << name;
  return r.file_size() - r.entries().back().end + e->begin + at;
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(std::streamoff(offset));
  f.write(&c, 1);
}

TEST(Checkpoint, ManifestRecordsCrc32OfEveryShard) {
  std::string dir = save_scrambled(fresh_dir("ckpt_crc"), 1, 1);
  Manifest m = read_manifest(dir);
  ASSERT_EQ(m.shards.size(), 2u);
  for (const ShardFile& s : m.shards) {
    EXPECT_EQ(s.hash.rfind("crc32:", 0), 0u) << s.hash;
    EXPECT_EQ(s.hash.size(), 6u + 8u) << s.hash;
    EXPECT_EQ(hash_file(dir + "/" + s.file), s.hash);
  }
  // zlib's crc32 of "123456789" is the standard check value cbf43926.
  std::string f = ::testing::TempDir() + "/crc_check.txt";
  std::ofstream(f, std::ios::binary) << "123456789";
  EXPECT_EQ(hash_file(f), "crc32:cbf43926");
  EXPECT_EQ(hash_file(f, "fnv1a64"), "fnv1a64:06d5573923c6cdfc");
  EXPECT_EQ(verify_checkpoint(dir, m), std::nullopt);
}

TEST(Checkpoint, FlippedByteNamesTheFileAndTheTensor) {
  std::string dir = save_scrambled(fresh_dir("ckpt_flip"), 1, 2);
  Manifest m = read_manifest(dir);
  std::string file = dir + "/model-rank00000.safetensors";
  flip_byte(file, data_offset(file, "h.0.mlp.c_fc.weight", 13));
  auto problem = verify_checkpoint(dir, m);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find(file + ": checksum crc32:"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("tensor 'h.0.mlp.c_fc.weight'"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("is damaged"), std::string::npos) << *problem;
  // The optimizer file names its tensor the same way.
  std::string opt = dir + "/optimizer-rank00000.safetensors";
  std::string dir2 = save_scrambled(fresh_dir("ckpt_flip2"), 1, 2);
  opt = dir2 + "/optimizer-rank00000.safetensors";
  flip_byte(opt, data_offset(opt, "wte.weight:exp_avg_sq", 0));
  problem = verify_checkpoint(dir2, read_manifest(dir2));
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("tensor 'wte.weight:exp_avg_sq'"), std::string::npos) << *problem;
  // A flipped byte in the header: the header is named.
  std::string dir3 = save_scrambled(fresh_dir("ckpt_flip3"), 1, 2);
  flip_byte(dir3 + "/model-rank00000.safetensors", 8);
  problem = verify_checkpoint(dir3, read_manifest(dir3));
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("header"), std::string::npos) << *problem;
}

TEST(Checkpoint, TruncatedShardNamesTheTensorItEndsIn) {
  std::string dir = save_scrambled(fresh_dir("ckpt_cut"), 1, 3);
  Manifest m = read_manifest(dir);
  std::string file = dir + "/model-rank00000.safetensors";
  std::string name;
  uint64_t cut_at = 0;
  {
    SafetensorsReader r(file);
    // Cut inside the second tensor from the end: it and the last one are lost.
    const SafetensorsEntry& e = r.entries()[r.entries().size() - 2];
    name = e.name;
    cut_at = r.file_size() - r.entries().back().end + e.begin + 2;
  }
  std::filesystem::resize_file(file, cut_at);
  auto problem = verify_checkpoint(dir, m);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find(file + ": truncated: " + std::to_string(cut_at) + " bytes"),
            std::string::npos)
      << *problem;
  EXPECT_NE(problem->find("tensor '" + name + "'"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("1 tensor(s) after it are missing"), std::string::npos) << *problem;
  // Cut inside the header.
  std::filesystem::resize_file(file, 20);
  problem = verify_checkpoint(dir, m);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("the header is cut"), std::string::npos) << *problem;
  std::filesystem::remove(file);
  EXPECT_EQ(verify_checkpoint(dir, m), file + ": missing");
}

// A FIFO where a checkpoint or a Hugging Face directory has a file is refused at once,
// named as what it is: reading one had waited for ever for a writer (--resume, --init-from
// and generate hung), and a FIFO shard had been called missing.
TEST(Checkpoint, FifosInCheckpointAndModelDirectoriesAreRefused) {
  using testing_support::input_error_reading_fifo;
  auto make_fifo = [](const std::string& path) {
    std::filesystem::remove(path);
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  };
  auto refused = [](const std::string& path) {
    return path + ": cannot open file (not a regular file: a FIFO)";
  };
  std::string dir = save_scrambled(fresh_dir("ckpt_fifo"), 1, 2);
  const Manifest m = read_manifest(dir);
  const std::string shard = dir + "/model-rank00000.safetensors";
  make_fifo(shard);
  EXPECT_EQ(verify_checkpoint(dir, m), shard + ": not a regular file: a FIFO");
  EXPECT_EQ(input_error_reading_fifo(shard, [&] { SafetensorsReader r(shard); }), refused(shard));
  EXPECT_EQ(input_error_reading_fifo(shard, [&] { hash_file(shard); }), refused(shard));
  make_fifo(dir + "/manifest.json");
  EXPECT_EQ(input_error_reading_fifo(dir + "/manifest.json", [&] { read_manifest(dir); }),
            refused(dir + "/manifest.json"));

  const std::string hf = fresh_dir("ckpt_fifo_hf");
  std::filesystem::copy(std::string(BATON_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny", hf);
  for (const std::string name : {"config.json", "generation_config.json"}) {
    const std::string path = hf + "/" + name;
    make_fifo(path);
    EXPECT_EQ(input_error_reading_fifo(path,
                                       [&] {
                                         if (name == "config.json")
                                           read_hf_model_config(hf, std::nullopt);
                                         else
                                           hf_eos_token_ids(hf);
                                       }),
              refused(path));
  }
}

TEST(Checkpoint, ResumeFallsBackToThePreviousCompleteOneWithAWarning) {
  std::string root = fresh_dir("ckpt_fallback");
  std::string older = save_scrambled(root, 4, 5);
  std::string newer = save_scrambled(root, 8, 6);
  EXPECT_EQ(latest_checkpoint(root), newer);
  std::string file = newer + "/optimizer-rank00000.safetensors";
  flip_byte(file, data_offset(file, "h.0.ln_1.weight:exp_avg", 1));
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  auto found = latest_checkpoint(root);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(found, older);
  std::string text = log.str();
  EXPECT_NE(text.find("checkpoint " + newer + " is damaged"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor 'h.0.ln_1.weight:exp_avg'"), std::string::npos) << text;
  EXPECT_NE(text.find("falling back"), std::string::npos) << text;
  EXPECT_NE(text.find("using checkpoint " + older), std::string::npos) << text;
}

// A run resumed from an older checkpoint (the newer one damaged) keeps its good ones when
// it prunes: the damaged later step is left for the run to write over, not counted among
// the kept; a directory copied under another step's name is not taken as that step.
TEST(Checkpoint, PruningKeepsTheGoodOnesBelowADamagedNewerOne) {
  std::string root = fresh_dir("ckpt_prune_damaged");
  std::string s4 = save_scrambled(root, 4, 5);
  std::string s6 = save_scrambled(root, 6, 5);
  std::string s8 = save_scrambled(root, 8, 6);
  std::string file = s8 + "/optimizer-rank00000.safetensors";
  flip_byte(file, data_offset(file, "h.0.ln_1.weight:exp_avg", 1));
  EXPECT_EQ(latest_checkpoint(root), s6);
  std::string s7 = save_scrambled(root, 7, 5);  // the resumed run's next checkpoint
  prune_checkpoints(root, 2, 7);
  EXPECT_TRUE(std::filesystem::exists(s7 + "/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(s6 + "/manifest.json"));  // kept: two up to step 7
  EXPECT_FALSE(std::filesystem::exists(s4));
  EXPECT_TRUE(std::filesystem::exists(s8));  // later: left to be written over
  EXPECT_EQ(latest_checkpoint(root), s7);
  prune_checkpoints(root, 1, 7);
  EXPECT_EQ(latest_checkpoint(root), s7);  // it had deleted the one just written
  EXPECT_EQ(newest_written_checkpoint(root), s8);

  std::string copy = root + "/step-00000009";
  std::filesystem::copy(s7, copy);
  EXPECT_EQ(latest_checkpoint(root), s7);  // step-9 holds step 7's manifest
}

// Only the names baton writes are checkpoints: under a plan every rank rebuilds the path
// of the step rank 0 verified, so a copy named step-6 (verified by rank 0) had been
// passed over for the damaged step-00000006 the ranks then loaded.
TEST(Checkpoint, OnlyBatonsOwnStepNamesAreCheckpoints) {
  std::string root = fresh_dir("ckpt_names");
  std::string s4 = save_scrambled(root, 4, 5);
  std::string s6 = save_scrambled(root, 6, 5);
  std::filesystem::copy(s6, root + "/step-6");
  std::string file = s6 + "/model-rank00000.safetensors";
  flip_byte(file, data_offset(file, "h.0.mlp.c_fc.weight", 13));
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  EXPECT_EQ(latest_checkpoint(root), s4);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_NE(log.str().find(root + "/step-6: not a checkpoint name baton writes (step-00000006 "
                                  "for step 6); ignored"),
            std::string::npos)
      << log.str();
  // A step directory named outright (export, generate) is verified too, and refused
  // rather than read damaged.
  try {
    resolve_checkpoint(s6);
    ADD_FAILURE() << "a damaged step directory was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(s6 + ": a damaged checkpoint: " + file + ": checksum"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(resolve_checkpoint(s4), s4);
  EXPECT_EQ(resolve_checkpoint(root), s4);
}

// A manifest's string that is not UTF-8 (a data path; baton train refuses them) is written
// as U+FFFD and reads back with its crc32, where nlohmann's dump had thrown its raw
// type_error after the shards were written, leaving a step without a manifest.
TEST(Checkpoint, AManifestWithANonUtf8StringIsWrittenAndReadBack) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage a(g, 0, g->num_layers());
  Manifest m;
  m.step = 3;
  m.model = g->config;
  m.data = {{"position", 3}, {"train", {{"file", "data-\xff.txt"}}}};
  const std::string root = fresh_dir("ckpt_utf8");
  const std::string dir = save_checkpoint(root, a, m);
  EXPECT_EQ(latest_checkpoint(root), dir);
  EXPECT_EQ(read_manifest(dir).data["train"]["file"], "data-\xef\xbf\xbd.txt");
}

// Every checkpoint damaged: export and generate say so, naming the newest, as --resume
// does (they had said there was no manifest); the oldest's warning does not claim a
// fall-back it has not.
TEST(Checkpoint, AllDamagedSaysNoneIsCompleteAndUndamaged) {
  std::string root = fresh_dir("ckpt_all_damaged");
  std::string s2 = save_scrambled(root, 2, 5);
  std::string s4 = save_scrambled(root, 4, 6);
  for (const std::string& dir : {s2, s4}) {
    std::string file = dir + "/model-rank00000.safetensors";
    flip_byte(file, data_offset(file, "h.0.mlp.c_fc.weight", 13));
  }
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  try {
    resolve_checkpoint(root);
    ADD_FAILURE() << "damaged checkpoints were accepted";
  } catch (const InputError& e) {
    // The newest's reason in the error itself: --log-level error hides the warnings.
    const std::string want = root +
                             ": no checkpoint in it is complete and undamaged (the newest, " + s4 +
                             ", is damaged: ";
    EXPECT_EQ(std::string(e.what()).substr(0, want.size()), want) << e.what();
    EXPECT_NE(std::string(e.what()).find("h.0.mlp.c_fc.weight"), std::string::npos) << e.what();
  }
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  EXPECT_NE(text.find("checkpoint " + s4 + " is damaged: "), std::string::npos) << text;
  EXPECT_NE(text.find("; falling back to an older one"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoint " + s2 + " is damaged: "), std::string::npos) << text;
  EXPECT_NE(text.find("; no older checkpoint to fall back to"), std::string::npos) << text;
  EXPECT_EQ(text.find("falling back", text.find("checkpoint " + s2)), std::string::npos) << text;
  // No manifest at all: the directory holds none.
  const std::string empty = fresh_dir("ckpt_none");
  std::filesystem::create_directories(empty + "/step-00000002");
  try {
    resolve_checkpoint(empty);
    ADD_FAILURE() << "an empty checkpoint directory was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(": no complete checkpoint (no manifest.json"),
              std::string::npos)
        << e.what();
  }
}

// A live run with --keep-checkpoints prunes the step that export or generate is reading
// (manifest first, then the files): the reader takes the newest again, and when the step
// keeps vanishing, or was named outright, says that it was removed while being read (a
// RuntimeError: exit 1), not that a file is missing (exit 2). Errors of the checkpoint
// itself pass through untouched.
TEST(Checkpoint, AStepPrunedWhileReadIsReadAgainFromTheNewest) {
  auto prune = [](const std::string& dir) {
    std::filesystem::remove(dir + "/manifest.json");
    std::filesystem::remove_all(dir);
  };
  std::string root = fresh_dir("ckpt_pruned_while_read");
  std::string s2 = save_scrambled(root, 2, 5);
  std::string s4 = save_scrambled(root, 4, 6);
  std::vector<std::string> tried;
  Manifest got;
  read_checkpoint(root, [&](const std::string& step_dir) {
    tried.push_back(step_dir);
    if (tried.size() == 1) prune(step_dir);  // between resolving and loading
    got = read_manifest(step_dir);
  });
  EXPECT_EQ(tried, (std::vector<std::string>{s4, s2}));
  EXPECT_EQ(got.step, 2);

  // Pruned every time (a run writing a new one and pruning the one being read): bounded.
  tried.clear();
  int64_t next = 6;
  try {
    read_checkpoint(root, [&](const std::string& step_dir) {
      tried.push_back(step_dir);
      save_scrambled(root, next++, 7);
      prune(step_dir);
      read_manifest(step_dir);
    });
    ADD_FAILURE() << "read a pruned checkpoint";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(tried.back() +
                                         ": the checkpoint was removed while being read (5 times)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(tried.size(), 5u);

  // A step directory named outright cannot be resolved again.
  std::string s20 = save_scrambled(root, 20, 8);
  try {
    read_checkpoint(s20, [&](const std::string& step_dir) {
      prune(step_dir);
      read_manifest(step_dir);
    });
    ADD_FAILURE() << "read a pruned checkpoint";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(s20 + ": the checkpoint was removed while being read"),
              std::string::npos)
        << e.what();
  }

  // Nothing changed: the reader's own error, once.
  int calls = 0;
  EXPECT_THROW(read_checkpoint(root,
                               [&](const std::string&) {
                                 ++calls;
                                 throw InputError("bad model");
                               }),
               InputError);
  EXPECT_EQ(calls, 1);
}

// One run at a time in a checkpoint directory: a second holder is refused, and the
// directory is free again once the first lets go; nothing is left in it.
TEST(Checkpoint, ARunHoldsItsCheckpointDirectory) {
  std::string root = fresh_dir("ckpt_lock");
  prepare_checkpoint_root(root);
  {
    CheckpointRootLock first(root);
    try {
      CheckpointRootLock second(root);
      ADD_FAILURE() << "two runs held one checkpoint directory";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), "--checkpoint-dir " + root +
                                           ": in use by another run (it holds the directory's "
                                           "lock); give each run its own directory");
    }
  }
  CheckpointRootLock again(root);
  EXPECT_TRUE(std::filesystem::is_empty(root));
}

// A checkpoint directory that cannot hold checkpoints is refused when the run starts.
TEST(Checkpoint, CheckpointRootIsMadeAndTriedAtTheStart) {
  std::string root = fresh_dir("ckpt_root") + "/a/b";
  prepare_checkpoint_root(root);
  EXPECT_TRUE(std::filesystem::is_directory(root));
  EXPECT_TRUE(std::filesystem::is_empty(root));  // the probe is gone
  std::string file = fresh_dir("ckpt_root_file");
  std::ofstream(file) << "x";
  try {
    prepare_checkpoint_root(file + "/under");
    ADD_FAILURE() << "a path under a file accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--checkpoint-dir " + file + "/under: cannot create"),
              std::string::npos)
        << e.what();
  }
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::permissions(
        root, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    EXPECT_THROW(prepare_checkpoint_root(root), InputError);
    std::filesystem::permissions(root, std::filesystem::perms::owner_all);
  }
}

// A root whose path leaves no room for a shard's name (PATH_MAX) had passed a short probe
// and failed at the first save, after the first steps.
// The longest is a data-parallel mode's own state, parameter-server-rank-N (the probe had
// been sized on optimizer-rank-N and passed a root that failed at its first save).
TEST(Checkpoint, ACheckpointRootTooLongForItsFilesIsRefusedAtTheStart) {
  std::string root = fresh_dir("ckpt_root_long");
  while (root.size() < 4045)
    root += "/" + std::string(std::min<size_t>(200, 4044 - root.size()), 'd');
  ASSERT_EQ(root.size(), 4045u);
  try {
    prepare_checkpoint_root(root);
    ADD_FAILURE() << "a root with no room for step-*/parameter-server-rank-*.safetensors accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(": a path of 4045 bytes leaves no room for the files "
                                         "under it (such as step-00000000/parameter-server-rank-"
                                         "00000.safetensors, 4099 bytes in all): the system's "
                                         "limit is 4095 bytes a path"),
              std::string::npos)
        << e.what();
  }
  // One a byte shorter than that limit allows holds them: written and read back.
  root.resize(4041);
  prepare_checkpoint_root(root);
  const std::string deepest = root + "/step-00000000/parameter-server-rank-00000.safetensors";
  ASSERT_EQ(deepest.size(), 4095u);
  std::filesystem::create_directories(root + "/step-00000000");
  memory::write_file_durably(deepest, "state");
  EXPECT_EQ(memory::read_file(deepest), "state");
}

TEST(Checkpoint, NewerFormatVersionIsRefusedWithTheVersionNamed) {
  std::string root = fresh_dir("ckpt_newer");
  save_scrambled(root, 2, 7);
  std::string dir = save_scrambled(root, 3, 7);
  json j = read_json_file(dir + "/manifest.json");
  j["version"] = Manifest::kVersion + 1;
  j["a_field_of_the_future"] = true;
  std::ofstream(dir + "/manifest.json") << j.dump();
  std::string want =
      "format version " + std::to_string(Manifest::kVersion + 1) + ", written by a newer baton";
  try {
    read_manifest(dir);
    FAIL() << "a newer manifest was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: $.version: the checkpoint is in " + want),
              std::string::npos)
        << e.what();
  }
  // --resume does not fall back past it (that would resume older work and overwrite it).
  try {
    latest_checkpoint(root);
    FAIL() << "--resume skipped a newer checkpoint";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, VersionOneManifestsWithFnvHashesStillLoad) {
  std::string root = fresh_dir("ckpt_v1");
  std::string dir = save_scrambled(root, 2, 8);
  json j = read_json_file(dir + "/manifest.json");
  j["version"] = 1;
  j.erase("crc32");
  for (auto& s : j["shards"])
    s["hash"] = hash_file(dir + "/" + s["file"].get<std::string>(), "fnv1a64");
  std::ofstream(dir + "/manifest.json") << j.dump();
  Manifest m = read_manifest(dir);
  EXPECT_EQ(m.shards[0].hash.rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(verify_checkpoint(dir, m), std::nullopt);
  EXPECT_EQ(latest_checkpoint(root), dir);
  flip_byte(dir + "/model-rank00000.safetensors",
            data_offset(dir + "/model-rank00000.safetensors", "wpe.weight", 0));
  auto problem = verify_checkpoint(dir, m);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("tensor 'wpe.weight'"), std::string::npos) << *problem;
}

// The nested fields a resume reads are checked when the manifest is read: a hand edit
// (its checksum recomputed) is refused naming the field, rather than read in part or
// skipped (a grad_clip that was no number had skipped the resume's warning).
TEST(Checkpoint, ManifestNestedFieldsAreChecked) {
  const std::vector<std::pair<std::function<void(Manifest&)>, std::string>> cases = {
      {[](Manifest& m) {
         m.train = {{"grad_clip", "x"}};
       },
       "$.train.grad_clip"},
      {[](Manifest& m) {
         m.train = {{"micro_batches", 0}};
       },
       "$.train.micro_batches"},
      {[](Manifest& m) {
         m.train = {{"lr_schedule", 3}};
       },
       "$.train.lr_schedule"},
      {[](Manifest& m) {
         m.train = {{"lr_schedule", {{"kind", 3}}}};
       },
       "$.train.lr_schedule.kind"},
      {[](Manifest& m) { m.train = json::array(); }, "$.train"},
      {[](Manifest& m) {
         m.data = {{"position", -1}};
       },
       "$.data.position"},
      {[](Manifest& m) { m.data = "text"; }, "$.data"}};
  for (const auto& [edit, where] : cases) {
    Manifest m;
    m.step = 2;
    m.data = {{"position", 2}};
    edit(m);
    try {
      Manifest::from_json(m.to_json(), "manifest.json");
      ADD_FAILURE() << where << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("manifest.json: " + where + ": expected"),
                std::string::npos)
          << e.what();
    }
  }
  // A position that is not the steps done: refused as damaged (it had been read over).
  Manifest skewed;
  skewed.step = 2;
  skewed.data = {{"position", 3}};
  try {
    Manifest::from_json(skewed.to_json(), "manifest.json");
    ADD_FAILURE() << "a position other than the step accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "manifest.json: $.data.position: the manifest is inconsistent: the data position "
              "(the next step to run) is 3, but $.step says 2 steps are done");
  }
  skewed.data = {{"train", json::object()}};  // no position: loads
  EXPECT_NO_THROW(Manifest::from_json(skewed.to_json(), "manifest.json"));
  Manifest fine;
  fine.train = {{"batch", 8}, {"grad_clip", 0}, {"steps", 0}, {"lr_schedule", json::object()}};
  EXPECT_EQ(Manifest::from_json(fine.to_json(), "manifest.json").train, fine.train);
}

// One flipped bit in the manifest (AdamW's step count: bias correction) is a damaged
// checkpoint: read_manifest refuses it naming the checksum, --resume falls back past it
// with a warning. Manifests of version 2 (no checksum) still load.
TEST(Checkpoint, ManifestCarriesItsOwnCrc32) {
  std::string root = fresh_dir("ckpt_manifest_crc");
  std::string older = save_scrambled(root, 4, 5);
  std::string newer = save_scrambled(root, 6, 6);
  const std::string path = newer + "/manifest.json";
  std::string text = memory::read_file(path);
  json j = json::parse(text);
  EXPECT_EQ(j["version"], 3);
  ASSERT_TRUE(j["crc32"].is_string());
  const auto at = text.find("\"steps\": 0");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 9] ^= 1;  // '0' -> '1'
  std::ofstream(path, std::ios::binary) << text;
  try {
    read_manifest(newer);
    FAIL() << "a damaged manifest was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": $.crc32: the manifest is damaged"),
              std::string::npos)
        << e.what();
  }
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  auto found = latest_checkpoint(root);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(found, older);
  EXPECT_NE(log.str().find("the manifest is damaged"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("falling back"), std::string::npos) << log.str();
  // Version 2, before the checksum: read as it is; version 3 without one is damaged.
  j = read_json_file(older + "/manifest.json");
  j.erase("crc32");
  std::ofstream(older + "/manifest.json") << j.dump(2);
  EXPECT_THROW(read_manifest(older), InputError);
  j["version"] = 2;
  std::ofstream(older + "/manifest.json") << j.dump(2);
  EXPECT_EQ(read_manifest(older).step, 4);
  EXPECT_EQ(latest_checkpoint(root), older);
}

// A disk that fills while a checkpoint is written. The child process mounts a small
// tmpfs in a mount namespace of its own (root); where that is not allowed, a file size
// limit (RLIMIT_FSIZE) stands in for the full disk. Returns "" or what went wrong.
// A full disk for what comes next: on the tmpfs, someone else fills it but for half of
// `used` bytes; otherwise no file may grow past half of them.
void leave_room_for_half_of(const std::string& root, uint64_t used, bool used_tmpfs) {
  if (used_tmpfs) {
    struct statvfs st {};
    statvfs(root.c_str(), &st);
    uint64_t avail = uint64_t(st.f_bavail) * st.f_bsize;
    if (avail > used / 2) {
      std::ofstream ballast(root + "/ballast", std::ios::binary);
      std::string chunk(avail - used / 2, 'x');
      ballast.write(chunk.data(), std::streamsize(chunk.size()));
    }
  } else {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{rlim_t(used / 2), rlim_t(used / 2)};
    setrlimit(RLIMIT_FSIZE, &lim);
  }
}

std::string full_disk_scenario(const std::string& root, bool& used_tmpfs) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  Stage a(g, 0, g->num_layers());
  a.set_optimizer(OptimizerConfig{});
  scramble(a, 9);
  Manifest m;
  m.model = g->config;
  m.step = 1;
  std::string first = save_checkpoint(root, a, m);
  uint64_t used = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) used += e.file_size();
  // Files as large as the model shard are allowed, the optimizer's (twice as large)
  // are not.
  leave_room_for_half_of(root, used, used_tmpfs);
  scramble(a, 10);
  m.step = 2;
  try {
    save_checkpoint(root, a, m);
    return "the second checkpoint was written on a full disk";
  } catch (const RuntimeError& e) {
    std::string w = e.what();
    if (w.find("checkpoint " + checkpoint_dir(root, 2) + ": cannot write") == std::string::npos ||
        w.find(used_tmpfs ? "No space left on device" : "File too large") == std::string::npos ||
        w.find("any earlier checkpoint is untouched") == std::string::npos)
      return "unclear error: " + w;
  }
  if (latest_checkpoint(root) != first) return "the first checkpoint is no longer the latest";
  if (auto p = verify_checkpoint(first, read_manifest(first))) return "the first is damaged: " + *p;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.path().extension() == ".tmp") return "left behind: " + e.path().string();
  if (std::filesystem::exists(checkpoint_dir(root, 2) + "/manifest.json"))
    return "the failed checkpoint has a manifest";
  Stage b(g, 0, g->num_layers());
  b.set_optimizer(OptimizerConfig{});
  load_stage(first, read_manifest(first), b, true);
  return "";
}

// Runs scenario(root, tmpfs) in a child process with a 1 MB tmpfs mounted at root where
// it may (else tmpfs is false and the scenario limits file sizes); returns the child's
// report: how the disk was filled, then "" or what went wrong.
std::string in_child_with_small_disk(const std::string& root,
                                     const std::function<std::string(bool&)>& scenario) {
  std::filesystem::create_directories(root);
  int fds[2];
  if (pipe(fds) != 0) return "?\npipe failed";
  pid_t pid = fork();
  if (pid < 0) return "?\nfork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string why;
    bool tmpfs = unshare(CLONE_NEWNS) == 0 &&
                 mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                 mount("tmpfs", root.c_str(), "tmpfs", 0, "size=1m") == 0;
    try {
      why = scenario(tmpfs);
    } catch (const std::exception& e) {
      why = std::string("exception: ") + e.what();
    }
    std::string report = std::string(tmpfs ? "tmpfs" : "rlimit") + "\n" + why;
    ssize_t ignored = ::write(fds[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) report.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "?\nthe child ended with status " + std::to_string(status);
  return report;
}

TEST(Checkpoint, FullDiskLeavesTheEarlierCheckpointIntactAndSaysSo) {
  std::string root = fresh_dir("ckpt_full");
  std::string report =
      in_child_with_small_disk(root, [&](bool& tmpfs) { return full_disk_scenario(root, tmpfs); });
  auto nl = report.find('\n');
  ASSERT_NE(nl, std::string::npos) << report;
  RecordProperty("full_disk", report.substr(0, nl));
  std::printf("full disk simulated with: %s\n", report.substr(0, nl).c_str());
  EXPECT_EQ(report.substr(nl + 1), "");
}

// An export over an earlier one on a disk that fills: the new files are written aside
// first, so the earlier export stays whole (save_hf had removed its weights first, then
// left config.json and some shards), and nothing of the failed one is left.
std::string full_disk_export_scenario(const std::string& root, bool& used_tmpfs) {
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 64, 16, 256);  // 470 KB in f32
  Stage a(g, 0, g->num_layers());
  scramble(a, 11);
  const std::string out = root + "/hf";
  // bf16 first, f32 after: the new export needs more room than deleting the old one
  // first would free, so the fault shows on tmpfs too.
  HfWriteOptions sharded;
  sharded.max_shard_bytes = 64000;
  sharded.dtype = DType::bf16;
  save_hf(out, a, sharded);
  std::map<std::string, std::string> before;
  uint64_t used = 0;
  for (const auto& e : std::filesystem::directory_iterator(out)) {
    before[e.path().filename().string()] = memory::read_file(e.path().string());
    used += e.file_size();
  }
  if (before.size() < 3) return "the first export has no shards";
  leave_room_for_half_of(root, used, used_tmpfs);
  scramble(a, 12);
  std::string error;
  try {
    save_hf(out, a, HfWriteOptions{});  // f32 in one file: more than the disk has room for
    return "the second export was written on a full disk";
  } catch (const RuntimeError& e) {
    error = e.what();
  }
  std::map<std::string, std::string> after;
  for (const auto& e : std::filesystem::directory_iterator(out))
    after[e.path().filename().string()] = memory::read_file(e.path().string());
  if (after != before) {
    std::string names;
    for (const auto& [name, bytes] : after) names += " " + name;
    return "the earlier export changed; now:" + names + " (" + error + ")";
  }
  if (error.find(out + ": cannot write the export") == std::string::npos ||
      error.find(used_tmpfs ? "No space left on device" : "File too large") == std::string::npos ||
      error.find("an earlier export there is untouched") == std::string::npos)
    return "unclear error: " + error;
  HfCheckpoint back(out);
  if (back.names().size() != a.param_ids().size()) return "the earlier export lost tensors";
  return "";
}

TEST(Checkpoint, FullDiskExportLeavesTheEarlierExportIntact) {
  std::string root = fresh_dir("hf_export_full");
  std::string report = in_child_with_small_disk(
      root, [&](bool& tmpfs) { return full_disk_export_scenario(root, tmpfs); });
  auto nl = report.find('\n');
  ASSERT_NE(nl, std::string::npos) << report;
  std::printf("full disk simulated with: %s\n", report.substr(0, nl).c_str());
  EXPECT_EQ(report.substr(nl + 1), "");
}

// The files of an export directory by name (a crashed export's staging directory aside).
std::map<std::string, std::string> export_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".baton-export-", 0) != 0) files[name] = memory::read_file(e.path().string());
  }
  return files;
}

// An export over an earlier one, looked at after each change it makes to the directory
// (each a point where a kill may stop it): the directory is the earlier export whole, has
// no config.json (visibly incomplete), or is the new export whole. config.json had been
// renamed in before the earlier model.safetensors went (beside a new index, transformers
// and --init-from read it: the earlier weights), and a kill amid the shard renames had
// left config.json over a mix of both exports' shards.
// Two exports into one directory at once: the second fails naming the first (they had
// deleted each other's staging directory), and an export removes only the staging
// directories of exports whose process is gone.
TEST(Checkpoint, ConcurrentExportsToOneDirectoryDoNotMix) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 16, 8, 64);
  Stage a(g, 0, g->num_layers());
  scramble(a, 31);
  const std::string out = fresh_dir("export-lock-" + std::to_string(getpid()));
  std::filesystem::create_directories(out);
  // pid 1 lives; no pid is as large as 999999999 (pid_max is at most 2^22).
  const std::string live = out + "/.baton-export-1", stale = out + "/.baton-export-999999999";
  std::filesystem::create_directories(live);
  std::filesystem::create_directories(stale);
  {
    // The other export: a hold on the directory's lock (another open file, as another
    // process has).
    const int fd = ::open(out.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    try {
      save_hf(out, a, HfWriteOptions{});
      ADD_FAILURE() << "an export ran beside another";
    } catch (const RuntimeError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(out + ": another baton export is writing into it"), std::string::npos)
          << what;
      EXPECT_NE(what.find("pid 1"), std::string::npos) << what;
    }
    ::close(fd);
  }
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(out + "/config.json"));
  save_hf(out, a, HfWriteOptions{});
  EXPECT_TRUE(std::filesystem::exists(out + "/config.json"));
  EXPECT_TRUE(std::filesystem::exists(live)) << "a live export's staging directory was removed";
  EXPECT_FALSE(std::filesystem::exists(stale));
  std::filesystem::remove_all(out);
}

// An export under a step's name among checkpoints (ck/step-00000010) had been written, and
// a run resumed to step 10 cleared it with no word: refused, as is a step directory an
// interrupted save left (files, no manifest.json). Elsewhere a step's name is only a name.
TEST(Checkpoint, AnExportIsRefusedUnderACheckpointStepsName) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 16, 8, 64);
  Stage a(g, 0, g->num_layers());
  const std::string root = fresh_dir("export_step_name");
  std::filesystem::create_directories(root + "/ck/step-00000005");
  std::ofstream(root + "/ck/step-00000005/manifest.json") << "{}";
  auto refusal = [&](const std::string& out) {
    try {
      save_hf(out, a, HfWriteOptions{});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const std::string& out : {root + "/ck/step-00000010", root + "/ck/step-00000010/"}) {
    const std::string what = refusal(out);
    EXPECT_NE(what.find(out + ": a checkpoint step's name in a directory of checkpoints "
                              "(step-00000005)"),
              std::string::npos)
        << what;
  }
  EXPECT_FALSE(std::filesystem::exists(root + "/ck/step-00000010"));
  std::filesystem::create_directories(root + "/cut/step-00000003");
  std::ofstream(root + "/cut/step-00000003/rank-0.safetensors") << "x";
  const std::string what = refusal(root + "/cut/step-00000003");
  EXPECT_NE(what.find("no manifest.json or config.json (an interrupted checkpoint save?)"),
            std::string::npos)
      << what;
  EXPECT_EQ(refusal(root + "/plain/step-00000010"), "");
  EXPECT_EQ(refusal(root + "/ck/export"), "");
  std::filesystem::remove_all(root);
}

// An earlier model's generation_config.json had stayed beside a new export, its
// eos_token_id deciding where generation from the new one stops: it goes with the rest.
TEST(Checkpoint, AnExportRemovesAnEarlierGenerationConfig) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 16, 8, 64);
  Stage a(g, 0, g->num_layers());
  const std::string out = fresh_dir("export_genconfig") + "/hf";
  std::filesystem::create_directories(out);
  std::ofstream(out + "/generation_config.json") << R"({"eos_token_id": 11})";
  std::ofstream(out + "/tokenizer.json") << "{}";
  save_hf(out, a, HfWriteOptions{});
  EXPECT_FALSE(std::filesystem::exists(out + "/generation_config.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json")) << "not the export's to remove";
  EXPECT_EQ(hf_eos_token_ids(out), std::vector<int32_t>{}) << "config.json's, which has none";
}

TEST(Checkpoint, AnExportStoppedAnywhereIsTheOldOneNoneOrTheNewOne) {
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 64, 16, 256);
  Stage earlier(g, 0, g->num_layers()), later(g, 0, g->num_layers());
  scramble(earlier, 21);
  scramble(later, 22);
  HfWriteOptions whole, sharded, sharded_other;
  sharded.max_shard_bytes = 64000;
  sharded_other.max_shard_bytes = 100000;
  struct Case {
    const char* name;
    HfWriteOptions before, after;
  };
  for (const Case& c :
       {Case{"whole then sharded", whole, sharded}, Case{"sharded then sharded", sharded, sharded},
        Case{"sharded then sharded otherwise", sharded, sharded_other},
        Case{"sharded then whole", sharded, whole}}) {
    SCOPED_TRACE(c.name);
    const std::string ref = fresh_dir("hf_swap_ref"), out = fresh_dir("hf_swap");
    save_hf(ref, later, c.after);
    const auto want_after = export_files(ref);
    save_hf(out, earlier, c.before);
    const auto want_before = export_files(out);
    ASSERT_NE(want_before, want_after);
    HfWriteOptions opt = c.after;
    std::vector<std::string> steps;
    opt.on_swap_step = [&](const std::string& what) {
      steps.push_back(what);
      const auto now = export_files(out);
      if (now == want_before || now == want_after || !now.count("config.json")) return;
      std::string names;
      for (const auto& [name, bytes] : now) names += " " + name;
      ADD_FAILURE() << "after " << what << " (step " << steps.size()
                    << ") the directory has config.json over other weights:" << names;
    };
    save_hf(out, later, opt);
    EXPECT_GE(steps.size(), 3u);
    EXPECT_EQ(steps.back(), "renamed config.json");
    EXPECT_EQ(export_files(out), want_after);
  }
}

// Checkpoint I/O stages its tensors on the host, outside the device's cap, one at a time:
// under a cap of exactly what the stages hold, a tensor-parallel shard whose optimizer
// state is a ZeRO part (elements [lo, hi) of each tensor, cutting rows) saves and resumes,
// and Hugging Face weights load (--init-from). Saving had copied every tensor at once (a
// whole zeroed parameter per ZeRO part), loading had read each block and a whole-parameter
// buffer into the capped allocator: out of memory under a plan's accepted cap.
TEST(Checkpoint, SaveAndLoadTakeNothingOfTheDeviceCap) {
  auto g = testing::tiny_gpt(DType::f32, 1, 2, 8, 4, 12);
  memory::Allocator& alloc = memory::allocator_for(memory::Device::cpu());
  struct Uncap {
    memory::Allocator& a;
    ~Uncap() { a.set_capacity(0); }
  };
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("tensor-parallel rank " + std::to_string(r));
    auto make = [&](uint64_t seed) {
      auto st = std::make_unique<Stage>(sharded(*g, r), 0, g->num_layers(),
                                        StageOptions{memory::Device::cpu(), seed});
      for (int id : st->param_ids()) {
        const int64_t n = st->param(id).numel();
        st->set_optimizer_shard(id, n / 3, n / 3 + n / 2);
      }
      st->set_optimizer(OptimizerConfig{});
      return st;
    };
    auto a = make(5), b = make(9);
    scramble(*a, 11 + uint64_t(r));
    Manifest m;
    m.step = 2;
    m.model = g->config;
    const std::string dir = checkpoint_dir(fresh_dir("ckpt_cap" + std::to_string(r)), 2);
    const std::string hf = fresh_dir("ckpt_cap_hf" + std::to_string(r));
    begin_checkpoint(dir);
    {
      Uncap guard{alloc};
      alloc.set_capacity(alloc.stats().in_use);
      // As the engine writes a rank's ZeRO part (owns_state).
      m.shards = write_rank_shards(dir, {a.get()}, 0, {}, [](size_t, int) { return true; });
      m.optimizer = a->optimizer();
      m.optimizer_steps = 2;
      write_manifest(dir, m);
      load_stage(dir, read_manifest(dir), *b, true);
    }
    for (int id : a->param_ids()) {
      EXPECT_EQ(a->param(id).to_vector<float>(), b->param(id).to_vector<float>());
      auto sa = a->optimizer_state(id), sb = b->optimizer_state(id);
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t k = 0; k < sa.size(); ++k)
        EXPECT_EQ(sa[k].second.to_vector<float>(), sb[k].second.to_vector<float>());
    }
    // --init-from: the whole model's weights into this rank's shard.
    Stage full(g, 0, g->num_layers());
    scramble(full, 21);
    save_hf_gpt2(hf, full);
    {
      Uncap guard{alloc};
      alloc.set_capacity(alloc.stats().in_use);
      load_hf_gpt2(hf, *b);
    }
    expect_holds_blocks(*b, full);
  }
}

// `baton export --dtype bf16|f16` converts each tensor in host staging, one at a time, as
// its file is written: under a cap of exactly what the model holds it exports, whole or
// sharded, and each file is the one a whole-tensor conversion (Tensor::to) writes, bit for
// bit. The export had converted every tensor first, in the capped allocator: out of memory
// under the cap the weights fit in, and a second copy of the model at once.
TEST(Checkpoint, ExportConvertsOneTensorAtATimeOutsideTheDeviceCap) {
  auto g = testing::tiny_gpt(DType::f32, 2, 2, 64, 16, 256);
  Stage st(g, 0, g->num_layers());
  scramble(st, 31);
  for (DType dtype : {DType::bf16, DType::f16}) {
    uint64_t largest = 0, total = 0;     // the converted tensors' bytes
    std::map<std::string, Tensor> want;  // by stored name: the reference conversion
    for (int id : st.param_ids()) {
      Tensor c = st.param(id).to(dtype);
      largest = std::max(largest, uint64_t(c.nbytes()));
      total += c.nbytes();
      want[hf_tensor_name(*g, g->params[size_t(id)].name)] = c;
    }
    for (uint64_t max_shard : {uint64_t(0), uint64_t(40000)}) {
      SCOPED_TRACE(std::string(memory::dtype_name(dtype)) + (max_shard ? " sharded" : " whole"));
      const std::string out = fresh_dir("hf_cap");
      HfWriteOptions wo;
      wo.dtype = dtype;
      wo.max_shard_bytes = max_shard;
      const size_t held = Tensor::staging_stats().in_use;
      Tensor::reset_staging_peak();
      {
        CapAtInUse cap;
        save_hf(out, st, wo);
      }
      // One tensor's copy at a time (f16's range check reads it back through f32 too).
      const size_t peak = Tensor::staging_stats().peak - held;
      EXPECT_LE(peak, 3 * largest + 2 * memory::Allocator::alignment());
      EXPECT_LT(peak, total);
      size_t seen = 0;
      for (const auto& e : std::filesystem::directory_iterator(out)) {
        if (e.path().extension() != ".safetensors") continue;
        SafetensorsReader r(e.path().string());
        for (const SafetensorsEntry& x : r.entries()) {
          ASSERT_TRUE(want.count(x.name)) << x.name;
          const Tensor back = r.read(x.name);
          const Tensor& ref = want[x.name];
          ASSERT_EQ(back.dtype(), dtype) << x.name;
          ASSERT_EQ(back.nbytes(), ref.nbytes()) << x.name;
          EXPECT_EQ(std::memcmp(back.raw_data(), ref.raw_data(), ref.nbytes()), 0) << x.name;
          ++seen;
        }
      }
      EXPECT_EQ(seen, want.size());
      if (max_shard > 0) {
        EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
        continue;
      }
      // The whole file, header included, as writing the converted tensors gives it.
      std::vector<NamedTensor> ref;
      for (int id : st.param_ids()) {
        const std::string name = hf_tensor_name(*g, g->params[size_t(id)].name);
        ref.push_back({name, want[name]});
      }
      const std::string ref_dir = fresh_dir("hf_cap_ref");
      std::filesystem::create_directories(ref_dir);
      write_safetensors(ref_dir + "/model.safetensors", ref, {{"format", "pt"}});
      EXPECT_EQ(memory::read_file(out + "/model.safetensors"),
                memory::read_file(ref_dir + "/model.safetensors"));
    }
  }
}

// A data-parallel mode's own state file (local SGD's, the parameter server's:
// engine/plan_trainer.cpp) is written as a shard is, each tensor staged on the host once
// for its crc32 and again for its bytes, one at a time. checksummed() had staged all of
// them first: a host copy of the rank's state at once (on a GPU, where every tensor needs
// one; strided CPU tensors stand in for them here). The file is the one its contiguous
// tensors give, crc32s included.
TEST(Checkpoint, ChecksummedFilesStageOneTensorAtATime) {
  std::vector<NamedTensor> strided, dense;
  for (int i = 0; i < 8; ++i) {
    Tensor x = Tensor::empty({64, 32}, DType::f32);
    kernels::random_normal(x, 0, 1, 41, uint64_t(i), kernels::Block{});
    strided.push_back({"state/" + std::to_string(i), x.transpose(0, 1)});
    dense.push_back({"state/" + std::to_string(i), x.transpose(0, 1).contiguous()});
  }
  const std::string dir = fresh_dir("ckpt_checksummed");
  std::filesystem::create_directories(dir);
  const size_t held = Tensor::staging_stats().in_use;
  Tensor::reset_staging_peak();
  {
    CapAtInUse cap;
    write_checksummed(dir + "/strided.safetensors", strided, {{"format", "pt"}});
  }
  EXPECT_LE(Tensor::staging_stats().peak - held, size_t(64 * 32 * 4));  // one tensor
  write_checksummed(dir + "/dense.safetensors", dense, {{"format", "pt"}});
  EXPECT_EQ(memory::read_file(dir + "/strided.safetensors"),
            memory::read_file(dir + "/dense.safetensors"));
  SafetensorsReader r(dir + "/strided.safetensors");
  const auto crcs = nlohmann::json::parse(r.metadata().at("baton.crc32"));
  EXPECT_EQ(crcs.size(), dense.size());
}

}  // namespace
}  // namespace baton::stages
