// Checkpoints: parameters and optimizer state round-trip, and a checkpoint written under
// one partition loads under another (whole <-> tensor-parallel shards with several
// blocks per tensor), because tensors are stored with their block of the logical tensor.
#include <filesystem>
#include <fstream>

#include "stages/checkpoint.h"
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
      piece.global_offsets = matrix ? memory::Shape{0, j * c + r * h} : memory::Shape{j * c + r * h};
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
}

TEST(Checkpoint, ManifestErrorsNameTheField) {
  std::string dir = fresh_dir("ckpt_bad_manifest");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/manifest.json") << R"({"format": "baton-checkpoint", "version": 1, "step": -1})";
  try {
    read_manifest(dir);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: $.step"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace baton::stages
