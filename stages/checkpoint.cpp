#include "stages/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "memory/file_io.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "stages/shorthands.h"

namespace baton::stages {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kBlocksKey = "baton.blocks";
// Each tensor's crc32 (8 hex digits), a JSON string {key: crc}: the manifest's checksum
// of the whole file says whether it is intact, these say which tensor is not.
constexpr const char* kCrcKey = "baton.crc32";

// zlib's crc32, continued over a buffer of any size (zlib takes 32-bit lengths).
uint32_t crc32_of(uint32_t crc, const void* data, size_t n) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    uInt chunk = uInt(std::min<size_t>(n, size_t(1) << 30));
    crc = uint32_t(::crc32(uLong(crc), p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, v);
  return buf;
}

std::string offsets_str(const Shape& o) {
  std::string s;
  for (size_t i = 0; i < o.size(); ++i) s += (i ? "," : "") + std::to_string(o[i]);
  return s;
}

// A tensor to store: its key, data (a view of the stage's tensor: staged on the host only
// while the shard is written, one at a time) and block of a logical tensor.
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
    out.push_back({logical + "@" + offsets_str(piece.global_offsets), logical, view,
                   p.logical_shape, piece.global_offsets});
  }
}

// ---- a sharded optimizer's part (ZeRO): a flat element range of a local tensor ----

// A rectangular block of a tensor: offsets and sizes per dimension.
struct Rect {
  Shape offsets, sizes;
};

// Cuts the row-major element range [lo, hi) of a tensor of `shape` into rectangular
// blocks (a partial row at each end, whole rows between, recursively): at most two per
// dimension.
void flat_rects(const Shape& shape, size_t d, Shape prefix, int64_t lo, int64_t hi,
                std::vector<Rect>& out) {
  if (lo >= hi) return;
  const size_t n = shape.size();
  if (n == 0) {
    out.push_back({{}, {}});
    return;
  }
  if (d + 1 == n) {
    Shape off = prefix, sz(d, 1);
    off.push_back(lo);
    sz.push_back(hi - lo);
    out.push_back({off, sz});
    return;
  }
  int64_t row = 1;
  for (size_t k = d + 1; k < n; ++k) row *= shape[k];
  auto sub = [&](int64_t r, int64_t a, int64_t b) {
    Shape p = prefix;
    p.push_back(r);
    flat_rects(shape, d + 1, p, a, b, out);
  };
  if (lo % row != 0) {
    const int64_t r = lo / row, end = std::min(hi, (r + 1) * row);
    sub(r, lo - r * row, end - r * row);
    lo = end;
  }
  if (lo >= hi) return;
  if (hi / row > lo / row) {
    Shape off = prefix, sz(d, 1);
    off.push_back(lo / row);
    sz.push_back(hi / row - lo / row);
    for (size_t k = d + 1; k < n; ++k) {
      off.push_back(0);
      sz.push_back(shape[k]);
    }
    out.push_back({off, sz});
  }
  if (hi % row != 0) sub(hi / row, 0, hi - (hi / row) * row);
}

// The blocks of the logical tensor that the elements [lo, hi) of the local tensor of `p`
// cover, as views of `part` (those hi - lo elements) with their global offsets: each
// rectangle of the range (contiguous in the range) intersected with each local piece.
std::vector<std::pair<Tensor, Shape>> part_blocks(const Param& p, int64_t lo, int64_t hi,
                                                  const Tensor& part) {
  std::vector<Rect> rects;
  flat_rects(p.shape, 0, {}, lo, hi, rects);
  const Shape strides = memory::contiguous_strides(p.shape);
  const Tensor flat = part.view({hi - lo});
  std::vector<std::pair<Tensor, Shape>> out;
  for (const Rect& r : rects) {
    int64_t start = 0;
    for (size_t d = 0; d < r.offsets.size(); ++d) start += r.offsets[d] * strides[d];
    const Tensor block = flat.narrow(0, start - lo, memory::shape_numel(r.sizes)).view(r.sizes);
    if (!p.is_shard()) {
      out.push_back({block, r.offsets});
      continue;
    }
    for (const ParamPiece& piece : p.pieces) {
      Tensor x = block;
      Shape global(r.offsets.size());
      bool any = true;
      for (size_t d = 0; d < r.offsets.size() && any; ++d) {
        const int64_t a = std::max(r.offsets[d], piece.local_offsets[d]);
        const int64_t e =
            std::min(r.offsets[d] + r.sizes[d], piece.local_offsets[d] + piece.shape[d]);
        any = e > a;
        if (any) x = x.narrow(int64_t(d), a - r.offsets[d], e - a);
        global[d] = a - piece.local_offsets[d] + piece.global_offsets[d];
      }
      if (any) out.push_back({x, global});
    }
  }
  return out;
}

// The stored blocks of an optimizer state `part` holding elements [lo, hi) of the local
// tensor of `p` (a 1-D tensor of hi - lo elements), as views of it.
void add_part_pieces(std::vector<Stored>& out, const std::string& logical, const Param& p,
                     const Tensor& part, int64_t lo, int64_t hi) {
  for (const auto& [block, global] : part_blocks(p, lo, hi, part))
    out.push_back({logical + "@" + offsets_str(global), logical, block, p.logical_shape, global});
}

ShardFile write_shard(const std::string& step_dir, const std::string& file, const std::string& kind,
                      int rank, const std::vector<Stored>& tensors) {
  // Views of the stage's tensors, staged one at a time as they are written.
  std::vector<NamedTensor> named;
  json blocks = json::object();
  for (const Stored& s : tensors) {
    named.push_back({s.key, s.data});
    blocks[s.key] = {{"name", s.logical}, {"global_shape", s.global_shape}, {"offsets", s.offsets}};
  }
  std::string path = step_dir + "/" + file, hash;
  try {
    hash = write_checksummed(path, named, {{"format", "pt"}, {kBlocksKey, blocks.dump()}});
  } catch (const std::exception& e) {
    // A full disk: free what we wrote; the step directory stays without a manifest
    // (incomplete), and the checkpoints before it are untouched.
    std::error_code ec;
    fs::remove(path + ".tmp", ec);
    throw RuntimeError("checkpoint " + step_dir + ": cannot write " + file + ": " + e.what() +
                       " (any earlier checkpoint is untouched)");
  }
  ShardFile sf;
  sf.file = file;
  sf.kind = kind;
  sf.rank = rank;
  sf.bytes = uint64_t(fs::file_size(path));
  sf.hash = hash;
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
  BlockIndex(const std::string& step_dir, const Manifest& m, const std::string& kind)
      : kind_(kind) {
    for (const ShardFile& sf : m.shards) {
      if (sf.kind != kind) continue;
      listed_ += (listed_.empty() ? "" : ", ") + sf.file;
      files_.push_back(std::make_unique<SafetensorsReader>(step_dir + "/" + sf.file));
      const SafetensorsReader& r = *files_.back();
      auto it = r.metadata().find(kBlocksKey);
      json blocks = it == r.metadata().end()
                        ? json::object()
                        : memory::parse_json_text(it->second, r.path() + " (" + kBlocksKey + ")");
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
  // The shards searched, for messages: a manifest that lost an entry names none of its
  // tensors' files.
  std::string searched() const {
    return "the " + kind_ + " shards manifest.json $.shards lists (" +
           (listed_.empty() ? std::string("none") : listed_) + ")";
  }

 private:
  std::string kind_, listed_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::vector<BlockRef>> by_name_;
};

// Fills region [goff, goff + shape) of logical tensor `name` into `dst` (a view of that
// shape) from whichever stored blocks overlap it.
void fill_region(const BlockIndex& index, const std::string& name, const Shape& logical_shape,
                 const Shape& goff, Tensor dst, const std::string& where) {
  const std::vector<BlockRef>* blocks = index.find(name);
  if (blocks == nullptr)
    throw InputError(where + ": no tensor '" + name + "' in " + index.searched());
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
    // Read into host staging and copied into the tensor already allocated: nothing of
    // the device's budget is taken.
    Tensor tmp = Tensor::staging(len, stored);
    Shape in_block(goff.size());
    for (size_t d = 0; d < goff.size(); ++d) in_block[d] = lo[d] - b.offsets[d];
    b.file->read_block(*b.entry, in_block, tmp);
    Tensor view = dst;
    for (size_t d = 0; d < goff.size(); ++d)
      view = view.narrow(int64_t(d), lo[d] - goff[d], len[d]);
    view.copy_from(tmp.to_staging(dst.dtype()));
    covered += memory::shape_numel(len);
  }
  if (covered != need)
    throw InputError(where + ": the checkpoint's blocks of '" + name + "' cover " +
                     std::to_string(covered) + " of the " + std::to_string(need) +
                     " elements needed (missing or overlapping shards)");
}

// Fills `out` (hi - lo elements) with the elements [lo, hi) of the local tensor of `p`
// stored under `name`: the blocks they cover, read straight into views of `out`.
void load_part(const BlockIndex& index, const std::string& name, const Param& p, int64_t lo,
               int64_t hi, Tensor out, const std::string& where) {
  for (const auto& [block, global] : part_blocks(p, lo, hi, out))
    fill_region(index, name, p.logical_shape, global, block, where);
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

namespace {

// The crc32 of a manifest's content: its compact dump without the "crc32" field (keys
// sorted, numbers as nlohmann writes them, so a reader recomputes it from the parsed file).
// The manifest's text. Its strings are UTF-8 (baton train refuses other paths): a string
// that is not would show as U+FFFD, never throw nlohmann's raw type_error after the
// shards are written. The crc32 is of the same text, so it checks as read back.
std::string manifest_text(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string manifest_crc(json j) {
  j.erase("crc32");
  const std::string text = manifest_text(j, -1);
  return hex32(crc32_of(0, text.data(), text.size()));
}

}  // namespace

json Manifest::to_json() const {
  json shard_list = json::array();
  for (const ShardFile& s : shards)
    shard_list.push_back({{"file", s.file},
                          {"kind", s.kind},
                          {"rank", s.rank},
                          {"bytes", s.bytes},
                          {"hash", s.hash}});
  json j = {
      {"format", "baton-checkpoint"},
      {"version", kVersion},
      {"step", step},
      {"seed", seed},
      {"optimizer", {{"config", optimizer.to_json()}, {"steps", optimizer_steps}}},
      {"rng", {{"seed", seed}, {"scheme", "counter-based: (seed, step, name, logical index)"}}},
      {"data", data},
      {"model", model},
      {"train", train},
      {"shards", shard_list}};
  // A flipped bit anywhere (AdamW's step count, the data position) is a damaged
  // checkpoint, as one in a shard is.
  j["crc32"] = manifest_crc(j);
  return j;
}

namespace {

// Refuses a manifest of a format version this baton does not know, naming it: a newer
// baton's checkpoint may mean something this one would misread.
void check_manifest_version(const JsonReader& r) {
  if (r.at("format").as_string() != "baton-checkpoint") r.at("format").fail("\"baton-checkpoint\"");
  r.check_version("the checkpoint", Manifest::kMinVersion, Manifest::kVersion);
}

}  // namespace

Manifest Manifest::from_json(const json& j, const std::string& source) {
  JsonReader r(j, source);
  r.expect_object();
  check_manifest_version(r);
  r.expect_only({"format", "version", "step", "seed", "optimizer", "rng", "data", "model", "train",
                 "shards", "crc32"});
  if (r.has("crc32")) {
    const std::string want = r.at("crc32").as_string(), got = manifest_crc(j);
    if (got != want)
      r.at("crc32").fail_message("the manifest is damaged: its content's crc32 is " + got +
                                 ", written as " + want);
  } else if (r.at("version").as_int() >= 3) {
    r.fail_message("missing required field 'crc32' (the manifest's checksum, from version 3)");
  }
  Manifest m;
  m.step = r.at("step").as_int(0, INT64_MAX);
  m.seed = r.at("seed").as_uint64();
  JsonReader opt = r.at("optimizer");
  opt.expect_only({"config", "steps"});
  m.optimizer = OptimizerConfig::from_json(opt.at("config").raw(), source + " $.optimizer.config");
  m.optimizer_steps = opt.at("steps").as_int(0, INT64_MAX);
  // The nested parts are read where they are used (resume, export); their shapes are
  // checked here, so a hand edit (its crc recomputed) is refused naming the field rather
  // than read in part or skipped.
  if (r.has("rng")) {
    const JsonReader rng = r.at("rng");
    rng.expect_only({"seed", "scheme"});
    if (rng.has("seed") && rng.at("seed").as_uint64() != m.seed)
      rng.at("seed").fail("$.seed's " + std::to_string(m.seed),
                          std::to_string(rng.at("seed").as_uint64()));
    if (rng.has("scheme")) rng.at("scheme").as_string();
  }
  // null: a checkpoint saved without a data source (a stage saved by itself).
  if (!r.at("data").raw().is_null()) {
    r.at("data").expect_object();
    // The position is the next step to run, the steps done: one that is not $.step is a
    // damaged manifest (--resume falls back past it, as past a wrong step). Every version
    // writes it; the resume reads $.step, so a manifest without it still loads.
    if (r.at("data").has("position")) {
      const JsonReader pos = r.at("data").at("position");
      if (const int64_t p = pos.as_int(0, INT64_MAX); p != m.step)
        pos.fail_message(
            "the manifest is inconsistent: the data position (the next step to run) "
            "is " +
            std::to_string(p) + ", but $.step says " + std::to_string(m.step) + " steps are done");
    }
  }
  m.data = r.at("data").raw();
  m.model = r.at("model").raw();
  if (r.has("train") && !r.at("train").raw().is_null()) {
    const JsonReader t = r.at("train");
    t.expect_object();
    for (const char* count : {"batch", "micro_batches"})
      if (t.has(count)) t.at(count).as_int(1, INT64_MAX);
    if (t.has("steps")) t.at("steps").as_int(0, INT64_MAX);
    if (t.has("grad_clip")) t.at("grad_clip").as_double(0, HUGE_VAL);
    for (const char* part : {"lr_schedule", "loss_scale", "local_sgd", "parameter_server"})
      if (t.has(part)) t.at(part).expect_object();
    // Compared with this run's schedule by its kind (engine/loop.cpp).
    if (t.has("lr_schedule") && t.at("lr_schedule").has("kind"))
      t.at("lr_schedule").at("kind").as_string();
  }
  m.train = r.get("train") && !r.at("train").raw().is_null() ? r.at("train").raw() : json::object();
  for (const JsonReader& s : r.at("shards").items()) {
    s.expect_only({"file", "kind", "rank", "bytes", "hash"});
    ShardFile sf;
    sf.file = s.at("file").as_string();
    if (sf.file.empty() || sf.file.find('/') != std::string::npos || sf.file[0] == '.')
      s.at("file").fail("a file name inside the checkpoint directory");
    sf.kind = s.at("kind").as_string();
    // "local-sgd": a rank's local SGD state, "parameter-server": a parameter server's
    // pulls in flight (engine/plan_trainer.cpp), verified like the others and read only
    // by a run of that mode.
    if (sf.kind != "model" && sf.kind != "optimizer" && sf.kind != "local-sgd" &&
        sf.kind != "parameter-server")
      s.at("kind").fail("\"model\", \"optimizer\", \"local-sgd\" or \"parameter-server\"");
    sf.rank = int(s.at("rank").as_int(0, 1 << 30));
    sf.bytes = uint64_t(s.at("bytes").as_int(0, INT64_MAX));
    sf.hash = s.at("hash").as_string();
    if (sf.hash.rfind("crc32:", 0) != 0 && sf.hash.rfind("fnv1a64:", 0) != 0)
      s.at("hash").fail("\"crc32:<8 hex digits>\" (or \"fnv1a64:...\" in version 1)",
                        json_brief(sf.hash));
    m.shards.push_back(sf);
  }
  return m;
}

std::string checkpoint_dir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return (fs::path(root) / buf).string();
}

std::string hash_file(const std::string& path, const std::string& algorithm) {
  if (algorithm != "crc32" && algorithm != "fnv1a64")
    throw InputError(path + ": unknown checksum '" + algorithm + "' (expected crc32 or fnv1a64)");
  memory::check_regular_file(path);  // a FIFO would be waited on for ever
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open to hash: " + std::strerror(errno));
  uint64_t h = 0xcbf29ce484222325ull;
  uint32_t crc = 0;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    size_t n = size_t(in.gcount());
    if (algorithm == "crc32") {
      crc = crc32_of(crc, buf.data(), n);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      h ^= uint64_t(static_cast<unsigned char>(buf[i]));
      h *= 0x100000001b3ull;
    }
  }
  if (algorithm == "crc32") return "crc32:" + hex32(crc);
  char out[40];
  std::snprintf(out, sizeof out, "fnv1a64:%016" PRIx64, h);
  return out;
}

// ---- writing ----

std::string write_checksummed(const std::string& path, const std::vector<NamedTensor>& tensors,
                              std::map<std::string, std::string> metadata) {
  // Staging every tensor first had held a host copy of all of them at once (of a rank's
  // weights and optimizer state, for a shard).
  std::vector<SafetensorsOut> entries;
  std::vector<uint32_t> crc;
  json crcs = json::object();
  for (const NamedTensor& t : tensors) {
    entries.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
    const Tensor host = t.tensor.to_staging(t.tensor.dtype());
    crc.push_back(crc32_of(0, host.raw_data(), host.nbytes()));
    crcs[t.name] = hex32(crc.back());
  }
  metadata[kCrcKey] = crcs.dump();
  write_safetensors(
      path, entries,
      [&](size_t i) { return tensors[i].tensor.to_staging(tensors[i].tensor.dtype()); }, metadata);
  // The file is its prefix and the tensors' bytes in order: its crc32 combines theirs.
  // Reading the file back (from the page cache it was just written to) had checked nothing
  // more, and took a third of a save's time beside the write itself.
  const std::string prefix = safetensors_prefix(entries, metadata);
  uint32_t whole = crc32_of(0, prefix.data(), prefix.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    whole = uint32_t(
        ::crc32_combine64(uLong(whole), uLong(crc[i]), z_off64_t(tensors[i].tensor.nbytes())));
  return "crc32:" + hex32(whole);
}

void begin_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  // A step written again (a resume from before it) starts empty: an interrupted write's
  // temporary files, and the shards of a plan with more ranks, would otherwise stay.
  // The manifest goes first, so a crash from here on leaves an incomplete directory.
  if (fs::remove(fs::path(step_dir) / "manifest.json", ec)) memory::fsync_path(step_dir, true);
  fs::remove_all(step_dir, ec);
  if (ec) throw RuntimeError(step_dir + ": cannot clear the earlier write: " + ec.message());
  fs::create_directories(step_dir, ec);
  if (ec) throw RuntimeError(step_dir + ": cannot create: " + ec.message());
  memory::fsync_path(step_dir, true);
  memory::fsync_path(fs::path(step_dir).parent_path().string(), true);
}

std::vector<ShardFile> write_stage_shards(const std::string& step_dir, const Stage& stage, int rank,
                                          const std::function<bool(int)>& owns) {
  std::function<bool(size_t, int)> own;
  if (owns) own = [&](size_t, int id) { return owns(id); };
  return write_rank_shards(step_dir, {&stage}, rank, own);
}

std::vector<ShardFile> write_rank_shards(const std::string& step_dir,
                                         const std::vector<const Stage*>& stages, int rank,
                                         const std::function<bool(size_t, int)>& owns,
                                         const std::function<bool(size_t, int)>& owns_state) {
  std::vector<Stored> model, optim;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& stage = *stages[k];
    const Graph& g = stage.graph();
    for (int id : stage.param_ids()) {
      if (owns && !owns(k, id)) continue;
      const Param& p = g.params[size_t(id)];
      add_pieces(model, p.name, p, stage.param(id));
      if (owns_state && owns_state(k, id)) continue;  // written below
      for (const auto& [state_name, t] : stage.optimizer_state(id))
        add_pieces(optim, p.name + ":" + state_name, p, t);
    }
    // A sharded optimizer's state: the part this rank holds, as the blocks it covers.
    for (int id : stage.param_ids()) {
      if (!owns_state || !owns_state(k, id)) continue;
      const Param& p = g.params[size_t(id)];
      auto [lo, hi] = stage.optimizer_shard(id);
      for (const auto& [state_name, t] : stage.optimizer_state(id))
        if (lo == 0 && hi == stage.param(id).numel())
          add_pieces(optim, p.name + ":" + state_name, p, t);
        else
          add_part_pieces(optim, p.name + ":" + state_name, p, t, lo, hi);
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

ShardFile write_part_shard(const std::string& step_dir, const std::string& file,
                           const std::string& kind, int rank, const std::vector<ParamPart>& parts) {
  std::vector<Stored> stored;
  for (const ParamPart& x : parts)
    if (x.hi > x.lo) add_part_pieces(stored, x.name, *x.param, x.values, x.lo, x.hi);
  return write_shard(step_dir, file, kind, rank, stored);
}

void write_manifest(const std::string& step_dir, const Manifest& m) {
  try {
    memory::write_file_durably(step_dir + "/manifest.json", manifest_text(m.to_json(), 2) + "\n");
  } catch (const RuntimeError& e) {
    throw RuntimeError("checkpoint " + step_dir + ": cannot write manifest.json: " + e.what() +
                       " (any earlier checkpoint is untouched)");
  }
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
  return Manifest::from_json(read_json_regular_file(path), path);
}

namespace {

uint64_t le64(const unsigned char b[8]) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

// Why a shard of `size` bytes (shorter than written) is cut: which tensor the end of the
// file falls in, read from what is left of the header.
std::string locate_cut(const std::string& path, uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(len), 8)) return "the header length is cut";
  uint64_t n = le64(len);
  if (n > size - 8)
    return "the header is cut (it is " + std::to_string(n) + " bytes, " + std::to_string(size - 8) +
           " remain)";
  std::string header(size_t(n), '\0');
  if (!in.read(header.data(), std::streamsize(n))) return "the header cannot be read";
  json h = json::parse(header, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return "the header does not parse";
  const uint64_t data = size - 8 - n;
  std::string first;
  uint64_t first_begin = UINT64_MAX, first_end = 0;
  int cut = 0;
  for (const auto& [key, e] : h.items()) {
    if (key == "__metadata__" || !e.is_object() || !e.contains("data_offsets")) continue;
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      continue;
    uint64_t b = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end <= data) continue;
    ++cut;
    if (b < first_begin) first = key, first_begin = b, first_end = end;
  }
  if (cut == 0) return "yet every tensor of its header is whole";
  return "tensor '" + first + "' (data bytes [" + std::to_string(first_begin) + ", " +
         std::to_string(first_end) + ")) is cut at data byte " + std::to_string(data) +
         (cut > 1 ? " and " + std::to_string(cut - 1) + " tensor(s) after it are missing" : "");
}

// Which part of a shard of the right size differs from what was written: the first tensor
// whose bytes disagree with its recorded crc32, or the header.
std::string locate_damage(const std::string& path) {
  try {
    SafetensorsReader r(path);
    auto it = r.metadata().find(kCrcKey);
    if (it == r.metadata().end()) return "the file records no per-tensor checksums";
    json crcs = json::parse(it->second, nullptr, false);
    if (!crcs.is_object()) return "its per-tensor checksums do not parse: the header is damaged";
    if (r.entries().empty()) return "the header is damaged";
    const uint64_t data_start = r.file_size() - r.entries().back().end;
    std::ifstream in(path, std::ios::binary);
    std::vector<char> buf;
    for (const SafetensorsEntry& e : r.entries()) {
      buf.resize(size_t(e.bytes()));
      in.seekg(std::streamoff(data_start + e.begin));
      if (!in.read(buf.data(), std::streamsize(buf.size())))
        return "cannot read tensor '" + e.name + "'";
      std::string got = hex32(crc32_of(0, buf.data(), buf.size()));
      if (!crcs.contains(e.name) || !crcs[e.name].is_string())
        return "tensor '" + e.name + "' has no recorded checksum: the header is damaged";
      if (crcs[e.name].get<std::string>() != got)
        return "tensor '" + e.name + "' (data bytes [" + std::to_string(e.begin) + ", " +
               std::to_string(e.end) + ")) is damaged: crc32 " + got + ", written as " +
               crcs[e.name].get<std::string>();
    }
    return "every tensor matches its checksum: the header is damaged";
  } catch (const InputError& e) {
    return std::string("the header is damaged: ") + e.what();
  }
}

}  // namespace

std::optional<std::string> verify_checkpoint(const std::string& step_dir, const Manifest& m) {
  for (const ShardFile& s : m.shards) {
    std::string path = step_dir + "/" + s.file;
    std::error_code ec;
    // A FIFO or a directory has no file size either: named as what it is, not "missing".
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return path + ": not a regular file: " + memory::file_kind(st.st_mode);
    uint64_t size = fs::file_size(path, ec);
    if (ec) return path + ": missing";
    if (size < s.bytes)
      return path + ": truncated: " + std::to_string(size) + " bytes, the manifest says " +
             std::to_string(s.bytes) + "; " + locate_cut(path, size);
    if (size > s.bytes)
      return path + ": " + std::to_string(size) + " bytes, the manifest says " +
             std::to_string(s.bytes) + " (bytes were added)";
    std::string h = hash_file(path, s.hash.substr(0, s.hash.find(':')));
    if (h != s.hash)
      return path + ": checksum " + h + ", the manifest says " + s.hash + "; " +
             locate_damage(path);
  }
  return std::nullopt;
}

namespace {

// The step-<N> directories under `root` with their steps, the newest first (other names
// are not checkpoints and are left alone).
// warn: name the step-* folders that are not baton's names (once, where a run resumes).
std::vector<std::pair<int64_t, std::string>> checkpoint_dirs_newest_first(const std::string& root,
                                                                          bool warn = false) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    // Only the name baton writes for the step: every rank of a plan rebuilds the path
    // rank 0 verified from the step alone (a copy named step-6 had been verified by rank
    // 0 while the ranks loaded step-00000006).
    if (fs::path(checkpoint_dir(root, step)).filename() != name) {
      if (warn)
        spdlog::warn("{}: not a checkpoint name baton writes ({} for step {}); ignored",
                     e.path().string(), fs::path(checkpoint_dir(root, step)).filename().string(),
                     step);
      continue;
    }
    dirs.emplace_back(step, e.path().string());
  }
  std::sort(dirs.rbegin(), dirs.rend());
  return dirs;
}

}  // namespace

CheckpointRootLock::CheckpointRootLock(const std::string& root) {
  // The directory itself: no file is left behind (a run refused for bad input writes
  // nothing there).
  fd_ = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0)
    throw InputError("--checkpoint-dir " + root + ": cannot open it: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw InputError("--checkpoint-dir " + root + ": cannot lock it: " + std::strerror(err));
    throw InputError("--checkpoint-dir " + root +
                     ": in use by another run (it holds the directory's lock); give each run "
                     "its own directory");
  }
}

CheckpointRootLock::~CheckpointRootLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void prepare_checkpoint_root(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec || !fs::is_directory(root))
    throw InputError("--checkpoint-dir " + root + ": cannot create the directory: " +
                     (ec ? ec.message() : std::string("a file is in the way")));
  // Room for the longest file a checkpoint writes (a data-parallel mode's own state; the
  // temporary names are relative to their directory): a root near PATH_MAX had passed a
  // short probe and failed at the first save, after the first steps.
  const std::string longest = "step-00000000/parameter-server-rank-00000.safetensors";
  if (root.size() + 1 + longest.size() > PATH_MAX - 1)
    throw InputError("--checkpoint-dir " + root + ": a path of " + std::to_string(root.size()) +
                     " bytes leaves no room for the files under it (such as " + longest + ", " +
                     std::to_string(root.size() + 1 + longest.size()) +
                     " bytes in all): the system's limit is " + std::to_string(PATH_MAX - 1) +
                     " bytes a path");
  static std::atomic<uint64_t> probes{0};  // ranks of one process (threads) check at once
  const std::string probe =
      root + "/.write-test." + std::to_string(::getpid()) + "." + std::to_string(probes++);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw InputError("--checkpoint-dir " + root + ": cannot write in it: " + std::strerror(errno));
  ::close(fd);
  fs::remove(probe, ec);
}

std::optional<std::string> newest_written_checkpoint(const std::string& root) {
  for (const auto& [step, dir] : checkpoint_dirs_newest_first(root))
    if (fs::exists(dir + "/manifest.json")) return dir;
  return std::nullopt;
}

namespace {

// Why the checkpoint of `step` in `dir` cannot be resumed from ("is damaged: ..."), or
// nothing. One of a newer format version is an InputError, never passed over: falling
// back past it would silently resume from older work and then overwrite the newer.
std::optional<std::string> problem_of(const std::string& dir, int64_t step) {
  const std::string path = dir + "/manifest.json";
  if (!fs::exists(path)) return "has no manifest (incomplete)";
  json j;
  try {
    j = read_json_regular_file(path);
  } catch (const InputError& e) {
    return std::string("is unreadable (") + e.what() + ")";
  }
  if (j.is_object() && j.contains("version") && j["version"].is_number_integer() &&
      j["version"].get<int64_t>() > Manifest::kVersion)
    check_manifest_version(JsonReader(j, path));  // throws, naming the version
  try {
    Manifest m = Manifest::from_json(j, path);
    // Every rank loads the directory of the step it agreed on (checkpoint_dir): one
    // copied or renamed under another step's name is not that step's.
    if (m.step != step)
      return "holds the manifest of step " + std::to_string(m.step) +
             " (a copied or renamed directory)";
    if (auto problem = verify_checkpoint(dir, m)) {
      // A live run's pruning (its manifest goes first) is not damage.
      if (!fs::exists(path)) return "was removed while being verified (a run pruning it)";
      return "is damaged: " + *problem;
    }
  } catch (const InputError& e) {
    return std::string("is unreadable (") + e.what() + ")";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  const auto found = checkpoint_dirs_newest_first(root, /*warn=*/true);
  bool skipped = false;
  for (size_t i = 0; i < found.size(); ++i) {
    const auto& [step, dir] = found[i];
    if (auto problem = problem_of(dir, step)) {
      // The oldest has none to fall back to (the warning had said it fell back all the same).
      spdlog::warn("checkpoint {} {}; {}", dir, *problem,
                   i + 1 < found.size() ? "falling back to an older one"
                                        : "no older checkpoint to fall back to");
      skipped = true;
      continue;
    }
    if (skipped) spdlog::warn("using checkpoint {}, the newest complete one", dir);
    return dir;
  }
  return std::nullopt;
}

std::string unusable_newest(const std::string& root) {
  for (const auto& [step, dir] : checkpoint_dirs_newest_first(root))
    if (fs::exists(dir + "/manifest.json"))
      return "the newest, " + dir + ", " + problem_of(dir, step).value_or("is usable");
  return "none has a manifest";
}

void prune_checkpoints(const std::string& root, int keep, int64_t written) {
  if (keep <= 0) return;
  const auto dirs = checkpoint_dirs_newest_first(root);
  std::error_code ec;
  int complete = 0;
  for (const auto& [step, dir] : dirs) {
    if (step > written) continue;
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
    auto [lo, hi] = stage.optimizer_shard(id);
    const bool part = !(lo == 0 && hi == stage.param(id).numel());
    for (auto& [state_name, t] : stage.optimizer_state(id)) {
      Tensor local = t;
      if (!part) {
        load_tensor(optim, p.name + ":" + state_name, p, local, step_dir);
        continue;
      }
      // A sharded optimizer's part: the blocks its elements cover.
      load_part(optim, p.name + ":" + state_name, p, lo, hi, local, step_dir);
    }
  }
}

void load_parts(const std::string& step_dir, const Manifest& m, const std::string& kind,
                const std::vector<ParamPart>& parts) {
  BlockIndex index(step_dir, m, kind);
  for (const ParamPart& x : parts)
    if (x.hi > x.lo) load_part(index, x.name, *x.param, x.lo, x.hi, x.values, step_dir);
}

// ---- Hugging Face ----

json read_hf_config(const std::string& dir) {
  return read_hf_model_config(dir);
}

void load_hf_gpt2(const std::string& dir, Stage& stage) {
  load_hf_weights(dir, stage);
}

void save_hf_gpt2(const std::string& dir, const Stage& stage) {
  const Graph& g = stage.graph();
  const json hf = hf_config_of(g, DType::f32);  // the export's config (stages/hf.h)
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create: " + ec.message());
  std::vector<NamedTensor> tensors;
  for (int id : stage.param_ids())
    tensors.push_back({g.params[size_t(id)].name, stage.param(id).to(DType::f32)});
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  memory::write_file_durably(dir + "/config.json", hf.dump(2) + "\n");
}

}  // namespace baton::stages
