#include "stages/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "stages/hf.h"
#include "stages/json_reader.h"
#include "stages/shorthands.h"

namespace baton::stages {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kBlocksKey = "baton.blocks";

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(path + ": cannot open to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(path + ": fsync failed: " + std::strerror(errno));
}

void rename_durably(const std::string& tmp, const std::string& final_path) {
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) throw RuntimeError("cannot rename " + tmp + " to " + final_path + ": " + ec.message());
  fsync_path(fs::path(final_path).parent_path().string(), true);
}

void write_text_durably(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw RuntimeError(tmp + ": cannot create");
    out << text;
    out.flush();
    if (!out) throw RuntimeError(tmp + ": write error");
  }
  fsync_path(tmp, false);
  rename_durably(tmp, path);
}

std::string offsets_str(const Shape& o) {
  std::string s;
  for (size_t i = 0; i < o.size(); ++i) s += (i ? "," : "") + std::to_string(o[i]);
  return s;
}

// A tensor to store: its key, data and block of a logical tensor.
struct Stored {
  std::string key, logical;
  Tensor data;
  Shape global_shape, offsets;
};

// The stored pieces of one logical tensor held locally as `local` (whole or in pieces).
void add_pieces(std::vector<Stored>& out, const std::string& logical, const Param& p,
                const Tensor& local) {
  if (!p.is_shard()) {
    out.push_back({logical, logical, local, p.logical_shape, Shape(p.shape.size(), 0)});
    return;
  }
  for (const ParamPiece& piece : p.pieces) {
    Tensor view = local;
    for (size_t d = 0; d < piece.shape.size(); ++d)
      view = view.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
    out.push_back({logical + "@" + offsets_str(piece.global_offsets), logical, view.contiguous(),
                   p.logical_shape, piece.global_offsets});
  }
}

ShardFile write_shard(const std::string& step_dir, const std::string& file,
                      const std::string& kind, int rank, const std::vector<Stored>& tensors) {
  std::vector<NamedTensor> named;
  json blocks = json::object();
  for (const Stored& s : tensors) {
    named.push_back({s.key, s.data});
    blocks[s.key] = {{"name", s.logical}, {"global_shape", s.global_shape}, {"offsets", s.offsets}};
  }
  std::map<std::string, std::string> meta{{"format", "pt"}, {kBlocksKey, blocks.dump()}};
  std::string path = step_dir + "/" + file;
  write_safetensors(path + ".tmp", named, meta);
  rename_durably(path + ".tmp", path);
  ShardFile sf;
  sf.file = file;
  sf.kind = kind;
  sf.rank = rank;
  sf.bytes = uint64_t(fs::file_size(path));
  sf.hash = hash_file(path);
  return sf;
}

// One stored block as the loader sees it.
struct BlockRef {
  const SafetensorsReader* file;
  const SafetensorsEntry* entry;
  Shape global_shape, offsets;
};

// Every block of every shard file of one kind, by logical name.
class BlockIndex {
 public:
  BlockIndex(const std::string& step_dir, const Manifest& m, const std::string& kind) {
    for (const ShardFile& sf : m.shards) {
      if (sf.kind != kind) continue;
      files_.push_back(std::make_unique<SafetensorsReader>(step_dir + "/" + sf.file));
      const SafetensorsReader& r = *files_.back();
      auto it = r.metadata().find(kBlocksKey);
      json blocks = it == r.metadata().end() ? json::object()
                                             : parse_json_text(it->second, r.path() + " (" + kBlocksKey + ")");
      for (const SafetensorsEntry& e : r.entries()) {
        BlockRef b{&r, &e, e.shape, Shape(e.shape.size(), 0)};
        std::string logical = e.name;
        if (blocks.contains(e.name)) {
          JsonReader br(blocks[e.name], r.path() + " (" + kBlocksKey + ")", "$." + e.name);
          logical = br.at("name").as_string();
          b.global_shape = br.at("global_shape").as_int_list();
          b.offsets = br.at("offsets").as_int_list();
          if (b.offsets.size() != e.shape.size() || b.global_shape.size() != e.shape.size())
            br.fail("a block of the tensor's rank " + std::to_string(e.shape.size()));
          for (size_t d = 0; d < e.shape.size(); ++d)
            if (b.offsets[d] < 0 || b.offsets[d] + e.shape[d] > b.global_shape[d])
              br.fail("a block inside its global shape");
        }
        by_name_[logical].push_back(b);
      }
    }
  }
  const std::vector<BlockRef>* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &it->second;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::vector<BlockRef>> by_name_;
};

// Fills region [goff, goff + shape) of logical tensor `name` into `dst` (a view of that
// shape) from whichever stored blocks overlap it.
void fill_region(const BlockIndex& index, const std::string& name, const Shape& logical_shape,
                 const Shape& goff, Tensor dst, const std::string& where) {
  const std::vector<BlockRef>* blocks = index.find(name);
  if (blocks == nullptr) throw InputError(where + ": no tensor '" + name + "' in the checkpoint");
  int64_t need = dst.numel(), covered = 0;
  for (const BlockRef& b : *blocks) {
    if (b.global_shape != logical_shape)
      throw InputError(b.file->path() + ": tensor '" + b.entry->name + "' is a block of " +
                       memory::shape_str(b.global_shape) + " but the model's '" + name + "' is " +
                       memory::shape_str(logical_shape));
    Shape lo(goff.size()), len(goff.size());
    bool overlap = true;
    for (size_t d = 0; d < goff.size(); ++d) {
      int64_t a = std::max(goff[d], b.offsets[d]);
      int64_t e = std::min(goff[d] + dst.size(int64_t(d)), b.offsets[d] + b.entry->shape[d]);
      lo[d] = a;
      len[d] = e - a;
      overlap = overlap && e > a;
    }
    if (!overlap) continue;
    DType stored;
    if (!safetensors_dtype(b.entry->dtype, stored))
      throw InputError(b.file->path() + ": tensor '" + b.entry->name + "' has dtype " +
                       b.entry->dtype + ", which baton cannot load");
    Tensor tmp = Tensor::empty(len, stored);
    Shape in_block(goff.size());
    for (size_t d = 0; d < goff.size(); ++d) in_block[d] = lo[d] - b.offsets[d];
    b.file->read_block(*b.entry, in_block, tmp);
    Tensor view = dst;
    for (size_t d = 0; d < goff.size(); ++d) view = view.narrow(int64_t(d), lo[d] - goff[d], len[d]);
    view.copy_from(tmp.to(dst.dtype()).to(dst.device()));
    covered += memory::shape_numel(len);
  }
  if (covered != need)
    throw InputError(where + ": the checkpoint's blocks of '" + name + "' cover " +
                     std::to_string(covered) + " of the " + std::to_string(need) +
                     " elements needed (missing or overlapping shards)");
}

// Loads one logical tensor held locally as `local` (whole or in pieces).
void load_tensor(const BlockIndex& index, const std::string& name, const Param& p, Tensor& local,
                 const std::string& where) {
  if (!p.is_shard()) {
    fill_region(index, name, p.logical_shape, Shape(p.shape.size(), 0), local, where);
    return;
  }
  for (const ParamPiece& piece : p.pieces) {
    Tensor view = local;
    for (size_t d = 0; d < piece.shape.size(); ++d)
      view = view.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
    fill_region(index, name, p.logical_shape, piece.global_offsets, view, where);
  }
}

}  // namespace

// ---- manifest ----

json Manifest::to_json() const {
  json shard_list = json::array();
  for (const ShardFile& s : shards)
    shard_list.push_back({{"file", s.file}, {"kind", s.kind}, {"rank", s.rank},
                          {"bytes", s.bytes}, {"hash", s.hash}});
  return {{"format", "baton-checkpoint"},
          {"version", kVersion},
          {"step", step},
          {"seed", seed},
          {"optimizer", {{"config", optimizer.to_json()}, {"steps", optimizer_steps}}},
          {"rng", {{"seed", seed}, {"scheme", "counter-based: (seed, step, name, logical index)"}}},
          {"data", data},
          {"model", model},
          {"train", train},
          {"shards", shard_list}};
}

Manifest Manifest::from_json(const json& j, const std::string& source) {
  JsonReader r(j, source);
  r.expect_only({"format", "version", "step", "seed", "optimizer", "rng", "data", "model",
                 "train", "shards"});
  if (r.at("format").as_string() != "baton-checkpoint") r.at("format").fail("\"baton-checkpoint\"");
  if (r.at("version").as_int() != kVersion)
    r.at("version").fail("version " + std::to_string(kVersion));
  Manifest m;
  m.step = r.at("step").as_int(0, INT64_MAX);
  m.seed = uint64_t(r.at("seed").as_int(0, INT64_MAX));
  JsonReader opt = r.at("optimizer");
  opt.expect_only({"config", "steps"});
  m.optimizer = OptimizerConfig::from_json(opt.at("config").raw(), source + " $.optimizer.config");
  m.optimizer_steps = opt.at("steps").as_int(0, INT64_MAX);
  m.data = r.at("data").raw();
  m.model = r.at("model").raw();
  m.train = r.get("train") ? r.at("train").raw() : json::object();
  for (const JsonReader& s : r.at("shards").items()) {
    s.expect_only({"file", "kind", "rank", "bytes", "hash"});
    ShardFile sf;
    sf.file = s.at("file").as_string();
    if (sf.file.empty() || sf.file.find('/') != std::string::npos || sf.file[0] == '.')
      s.at("file").fail("a file name inside the checkpoint directory");
    sf.kind = s.at("kind").as_string();
    if (sf.kind != "model" && sf.kind != "optimizer") s.at("kind").fail("\"model\" or \"optimizer\"");
    sf.rank = int(s.at("rank").as_int(0, 1 << 30));
    sf.bytes = uint64_t(s.at("bytes").as_int(0, INT64_MAX));
    sf.hash = s.at("hash").as_string();
    m.shards.push_back(sf);
  }
  return m;
}

std::string checkpoint_dir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return (fs::path(root) / buf).string();
}

std::string hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open to hash");
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    std::streamsize n = in.gcount();
    for (std::streamsize i = 0; i < n; ++i) {
      h ^= uint64_t(static_cast<unsigned char>(buf[size_t(i)]));
      h *= 0x100000001b3ull;
    }
  }
  char out[40];
  std::snprintf(out, sizeof out, "fnv1a64:%016" PRIx64, h);
  return out;
}

// ---- writing ----

void begin_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) throw RuntimeError(step_dir + ": cannot create: " + ec.message());
  fs::remove(fs::path(step_dir) / "manifest.json", ec);
  fsync_path(step_dir, true);
  fsync_path(fs::path(step_dir).parent_path().string(), true);
}

std::vector<ShardFile> write_stage_shards(const std::string& step_dir, const Stage& stage,
                                          int rank, const std::function<bool(int)>& owns) {
  std::function<bool(size_t, int)> own;
  if (owns) own = [&](size_t, int id) { return owns(id); };
  return write_rank_shards(step_dir, {&stage}, rank, own);
}

std::vector<ShardFile> write_rank_shards(const std::string& step_dir,
                                         const std::vector<const Stage*>& stages, int rank,
                                         const std::function<bool(size_t, int)>& owns) {
  std::vector<Stored> model, optim;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& stage = *stages[k];
    const Graph& g = stage.graph();
    for (int id : stage.param_ids()) {
      if (owns && !owns(k, id)) continue;
      const Param& p = g.params[size_t(id)];
      add_pieces(model, p.name, p, stage.param(id));
      for (const auto& [state_name, t] : stage.optimizer_state(id))
        add_pieces(optim, p.name + ":" + state_name, p, t);
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-rank%05d.safetensors", rank);
  std::vector<ShardFile> out{write_shard(step_dir, buf, "model", rank, model)};
  if (!optim.empty()) {
    std::snprintf(buf, sizeof buf, "optimizer-rank%05d.safetensors", rank);
    out.push_back(write_shard(step_dir, buf, "optimizer", rank, optim));
  }
  return out;
}

void write_manifest(const std::string& step_dir, const Manifest& m) {
  write_text_durably(step_dir + "/manifest.json", m.to_json().dump(2) + "\n");
}

std::string save_checkpoint(const std::string& root, const Stage& stage, Manifest m) {
  std::string dir = checkpoint_dir(root, m.step);
  begin_checkpoint(dir);
  m.shards = write_stage_shards(dir, stage, 0);
  m.optimizer = stage.optimizer();
  m.optimizer_steps = stage.optimizer_steps();
  write_manifest(dir, m);
  return dir;
}

// ---- reading ----

Manifest read_manifest(const std::string& step_dir) {
  std::string path = step_dir + "/manifest.json";
  return Manifest::from_json(read_json_file(path), path);
}

std::optional<std::string> verify_checkpoint(const std::string& step_dir, const Manifest& m) {
  for (const ShardFile& s : m.shards) {
    std::string path = step_dir + "/" + s.file;
    std::error_code ec;
    uint64_t size = fs::file_size(path, ec);
    if (ec) return path + ": missing";
    if (size != s.bytes)
      return path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(s.bytes);
    std::string h = hash_file(path);
    if (h != s.hash) return path + ": hash " + h + ", the manifest says " + s.hash;
  }
  return std::nullopt;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    found.emplace_back(step, e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [step, dir] : found) {
    if (!fs::exists(dir + "/manifest.json")) {
      spdlog::warn("checkpoint {} has no manifest (incomplete); skipped", dir);
      continue;
    }
    try {
      Manifest m = read_manifest(dir);
      if (auto problem = verify_checkpoint(dir, m)) {
        spdlog::warn("checkpoint {} is damaged ({}); skipped", dir, *problem);
        continue;
      }
      return dir;
    } catch (const InputError& e) {
      spdlog::warn("checkpoint {} is unreadable ({}); skipped", dir, e.what());
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& root, int keep) {
  if (keep <= 0) return;
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    dirs.emplace_back(step, e.path().string());
  }
  std::sort(dirs.rbegin(), dirs.rend());
  int complete = 0;
  for (const auto& [step, dir] : dirs) {
    bool done = fs::exists(dir + "/manifest.json");
    // Keep the newest `keep` complete ones and anything newer than the newest complete
    // one (a checkpoint being written).
    if ((done && complete < keep) || (!done && complete == 0)) {
      complete += done ? 1 : 0;
      continue;
    }
    // The manifest goes first, so a crash mid-removal leaves an incomplete directory.
    fs::remove(dir + "/manifest.json", ec);
    fs::remove_all(dir, ec);
    if (ec) spdlog::warn("cannot remove old checkpoint {}: {}", dir, ec.message());
  }
}

void load_stage(const std::string& step_dir, const Manifest& m, Stage& stage, bool optimizer) {
  const Graph& g = stage.graph();
  BlockIndex model(step_dir, m, "model");
  for (int id : stage.param_ids()) {
    const Param& p = g.params[size_t(id)];
    load_tensor(model, p.name, p, stage.param(id), step_dir);
  }
  if (!optimizer) return;
  stage.set_optimizer(m.optimizer);
  stage.set_optimizer_steps(m.optimizer_steps);
  BlockIndex optim(step_dir, m, "optimizer");
  for (int id : stage.param_ids()) {
    const Param& p = g.params[size_t(id)];
    for (auto& [state_name, t] : stage.optimizer_state(id)) {
      Tensor local = t;
      load_tensor(optim, p.name + ":" + state_name, p, local, step_dir);
    }
  }
}

// ---- Hugging Face ----

json read_hf_config(const std::string& dir) { return read_hf_model_config(dir); }

void load_hf_gpt2(const std::string& dir, Stage& stage) { load_hf_weights(dir, stage); }

void save_hf_gpt2(const std::string& dir, const Stage& stage) {
  const Graph& g = stage.graph();
  JsonReader cfg(g.config, g.source);
  Gpt2Config c = cfg.has("model_type") ? parse_hf_gpt2_config(cfg) : parse_gpt2_shorthand(cfg);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create: " + ec.message());
  std::vector<NamedTensor> tensors;
  for (int id : stage.param_ids())
    tensors.push_back({g.params[size_t(id)].name, stage.param(id).to(DType::f32)});
  write_safetensors(dir + "/model.safetensors.tmp", tensors, {{"format", "pt"}});
  rename_durably(dir + "/model.safetensors.tmp", dir + "/model.safetensors");
  json hf = {{"model_type", "gpt2"},
             {"architectures", {"GPT2LMHeadModel"}},
             {"n_layer", c.n_layer},
             {"n_head", c.n_head},
             {"n_embd", c.n_embd},
             {"n_positions", c.n_positions},
             {"n_ctx", c.n_positions},
             {"vocab_size", c.vocab_size},
             {"n_inner", c.n_inner > 0 ? json(c.n_inner) : json(nullptr)},
             {"activation_function", "gelu_new"},
             {"layer_norm_epsilon", c.layer_norm_epsilon},
             {"initializer_range", c.initializer_range},
             {"embd_pdrop", c.embd_pdrop},
             {"resid_pdrop", c.resid_pdrop},
             {"attn_pdrop", c.attn_pdrop},
             {"tie_word_embeddings", true}};
  write_text_durably(dir + "/config.json", hf.dump(2) + "\n");
}

}  // namespace baton::stages
