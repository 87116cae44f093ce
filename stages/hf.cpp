#include "stages/hf.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "memory/file_io.h"
#include "stages/checkpoint.h"
#include "stages/json_reader.h"
#include "stages/model.h"
#include "stages/shorthands.h"

namespace baton::stages {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// Whether `path` exists. One that cannot be looked at (a symbolic-link loop, no
// permission) is bad input naming it: fs::exists without an error_code had thrown a
// filesystem_error ("failed: filesystem error: status: ...", exit 1).
bool path_exists(const std::string& path) {
  std::error_code ec;
  const bool found = fs::exists(path, ec);
  if (ec) throw InputError(path + ": cannot look at it: " + ec.message());
  return found;
}

// An export's hold on its output directory for its whole run: two exports into one
// directory at once had deleted each other's staging directory. An flock on the directory
// (released when the process ends, however it ends); a second export fails naming the
// holder's pid where a staging directory says it.
class ExportLock {
 public:
  explicit ExportLock(const std::string& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(dir + ": cannot open it: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw RuntimeError(dir + ": cannot lock it: " + std::strerror(err));
    std::string pids;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".baton-export-", 0) == 0)
        pids += (pids.empty() ? "" : ", ") + name.substr(14);
    }
    throw RuntimeError(dir + ": another baton export is writing into it" +
                       (pids.empty() ? std::string() : " (pid " + pids + ")") +
                       "; wait for it to end, or export to another directory");
  }
  ~ExportLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  ExportLock(const ExportLock&) = delete;
  ExportLock& operator=(const ExportLock&) = delete;

 private:
  int fd_ = -1;
};

// A staging directory left by an export that crashed: its process is gone. One whose pid
// lives (another host's export on a shared file system, a reused pid) is left alone.
bool stale_staging(const std::string& name) {
  const std::string digits = name.substr(14);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      digits.size() > 9)
    return false;
  const pid_t pid = pid_t(std::stol(digits));
  return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

// The step a name of baton's checkpoint steps ("step-00000010") stands for, else none.
std::optional<int64_t> checkpoint_step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() > 23) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const int64_t step = std::stoll(digits);
  if (fs::path(checkpoint_dir("", step)).filename() != name) return std::nullopt;
  return step;
}

// An export under a step's name in a checkpoint directory is the checkpoints' to clear: a
// run that resumes and saves that step had removed it with no word. A step directory
// without manifest.json (an interrupted save) counts as a checkpoint too.
void refuse_checkpoint_step_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  if (!checkpoint_step_of(name)) return;
  std::error_code ec;
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string other = e.path().filename().string();
    if (other == name || !checkpoint_step_of(other) || !e.is_directory(ec)) continue;
    throw InputError(dir + ": a checkpoint step's name in a directory of checkpoints (" + other +
                     (fs::exists(e.path() / "manifest.json", ec) ? "" : ", unfinished") +
                     "), which a resumed run clears when it saves that step; export to a "
                     "directory of its own");
  }
  if (fs::is_directory(p, ec) && !fs::exists(p / "config.json", ec) && !fs::is_empty(p, ec))
    throw InputError(dir +
                     ": a checkpoint step's name holding files but no manifest.json or "
                     "config.json (an interrupted checkpoint save?); export to a directory of "
                     "its own");
}
}  // namespace

json read_hf_model_config(const std::string& dir, std::optional<int64_t> context) {
  const std::string path = dir + "/config.json";
  if (!path_exists(path))
    throw InputError(path + ": no such file (a Hugging Face model directory has config.json)");
  json j = read_json_regular_file(path);
  // Only a Mistral's window depends on the context. One beyond the window is left to
  // check_same_model_math, whose message names the model that asks for it; one beyond
  // max_position_embeddings (MistralConfig's default when absent) is the other model's own.
  if (context)
    if (auto window = hf_sliding_window(JsonReader(j, path))) {
      const int64_t max_pos = hf_max_position_embeddings(JsonReader(j, path));
      j["context"] = std::min({*context, *window, max_pos});
    }
  hf_config_to_shorthand(JsonReader(j, path));  // validates
  return j;
}

std::optional<int64_t> model_json_context(const json& model, const std::string& source) {
  if (!model.is_object()) return std::nullopt;
  JsonReader r(model, source);
  if (model.contains("model_type")) return hf_config_to_shorthand(r)["context"].get<int64_t>();
  if (model.contains("type") && model["type"] == "gpt2") return parse_gpt2_shorthand(r).seq();
  if (model.contains("type") && model["type"] == "llama") return parse_llama_shorthand(r).seq();
  return std::nullopt;
}

namespace {
// eos_token_id as transformers writes it: an id, a list of ids, or null.
std::vector<int32_t> read_eos_ids(const JsonReader& r) {
  std::vector<int32_t> ids;
  auto e = r.get("eos_token_id");
  if (!e || e->raw().is_null()) return ids;
  if (!e->is_array() && !e->raw().is_number_integer())
    e->fail("a token id, a list of them, or null", json_brief(e->raw()));
  for (const JsonReader& id : e->is_array() ? e->items() : std::vector<JsonReader>{*e})
    ids.push_back(int32_t(id.as_int(INT32_MIN, INT32_MAX)));
  return ids;
}
}  // namespace

std::vector<int32_t> hf_eos_token_ids(const std::string& dir) {
  // transformers' generation config comes from generation_config.json when there is one
  // (config.json's ids are then unused), else from config.json.
  const std::string gen = dir + "/generation_config.json";
  const std::string path = path_exists(gen) ? gen : dir + "/config.json";
  const json j = read_json_regular_file(path);
  JsonReader r(j, path);
  r.expect_object();
  return read_eos_ids(r);
}

std::optional<std::vector<int32_t>> model_eos_token_ids(const json& model,
                                                        const std::string& source) {
  if (!model.is_object() || !model.contains("model_type")) return std::nullopt;
  return read_eos_ids(JsonReader(model, source));
}

std::optional<std::vector<int32_t>> checkpoint_eos_token_ids(const Manifest& m,
                                                             const std::string& source) {
  if (!m.train.is_object() || !m.train.contains("eos_token_ids")) return std::nullopt;
  const JsonReader r(m.train, source + ": $.train");
  std::vector<int32_t> ids;
  for (const JsonReader& id : r.at("eos_token_ids").items())
    ids.push_back(int32_t(id.as_int(INT32_MIN, INT32_MAX)));
  return ids;
}

HfCheckpoint::HfCheckpoint(std::string dir) : dir_(std::move(dir)) {
  const std::string single = dir_ + "/model.safetensors";
  // transformers loads model.safetensors when it exists, whatever index lies beside it.
  if (!path_exists(single) && path_exists(dir_ + "/model.safetensors.index.json")) {
    index_path_ = dir_ + "/model.safetensors.index.json";
    json j = read_json_regular_file(index_path_);
    JsonReader r(j, index_path_);
    r.expect_object();
    JsonReader map = r.at("weight_map");
    map.expect_object();
    for (const std::string& name : map.keys()) {
      std::string file = map.at(name).as_string();
      if (file.empty() || file.find('/') != std::string::npos || file == "..")
        map.at(name).fail("a file name inside the directory", "\"" + file + "\"");
      if (!path_exists(dir_ + "/" + file))
        map.at(name).fail_message("tensor '" + name + "' is in " + file +
                                  ", which does not exist in " + dir_);
      where_[name] = file;
    }
    return;
  }
  if (!path_exists(single))
    throw InputError(dir_ + ": no model.safetensors and no model.safetensors.index.json");
  if (path_exists(dir_ + "/model.safetensors.index.json"))
    spdlog::warn(
        "{}: holds both model.safetensors and model.safetensors.index.json; reading "
        "model.safetensors, as transformers does (the shards the index lists are not read)",
        dir_);
  auto f = std::make_unique<SafetensorsReader>(single);
  for (const SafetensorsEntry& e : f->entries()) where_[e.name] = "model.safetensors";
  files_["model.safetensors"] = std::move(f);
}

const SafetensorsEntry* HfCheckpoint::find(const std::string& name,
                                           const SafetensorsReader** file) {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  auto& f = files_[it->second];
  if (!f) f = std::make_unique<SafetensorsReader>(dir_ + "/" + it->second);
  const SafetensorsEntry* e = f->find(name);
  if (e == nullptr)
    throw InputError(index_path_ + ": names " + it->second + " for tensor '" + name +
                     "', but that file has no such tensor");
  *file = f.get();
  return e;
}

std::vector<std::string> HfCheckpoint::opened() const {
  std::vector<std::string> v;
  for (const auto& [name, f] : files_)
    if (f) v.push_back(name);
  return v;
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> v;
  for (const auto& [name, f] : where_) v.push_back(name);
  return v;
}

uint64_t HfCheckpoint::bytes_read() const {
  uint64_t n = 0;
  for (const auto& [name, f] : files_)
    if (f) n += f->bytes_read();
  return n;
}

json hf_math_fields(const json& model, const std::string& source) {
  if (!model.is_object()) return nullptr;
  JsonReader r(model, source);
  json sh;
  if (model.contains("model_type"))
    sh = hf_config_to_shorthand(r);
  else if (model.contains("type") && (model["type"] == "gpt2" || model["type"] == "llama"))
    sh = model;
  else
    return nullptr;
  JsonReader rs(sh, source);
  json j;
  if (sh["type"] == "gpt2") {
    // The resolved width: an explicit n_inner of 4·n_embd is the default (null or absent).
    const Gpt2Config c = parse_gpt2_shorthand(rs);
    j = c.to_json();
    j["n_inner"] = c.inner();
  } else {
    j = parse_llama_shorthand(rs).to_json();
  }
  for (const char* k : {"name", "context", "initializer_range", "embd_pdrop", "resid_pdrop",
                        "attn_pdrop", "attention_dropout", "max_position_embeddings"})
    j.erase(k);
  // The legacy "type" names the same scaling as "rope_type" (transformers reads either).
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    json& scaling = j["rope_scaling"];
    if (scaling.contains("type") && !scaling.contains("rope_type"))
      scaling["rope_type"] = scaling["type"];
    scaling.erase("type");
  }
  return j;
}

namespace {
struct RopeMismatch {
  std::string path;
  json have, want;
};

// Where a differing rope_theta or rope scaling (as hf_math_fields gives them) sits in a
// config.json that writes them as rope_parameters, with the values of that field; none
// for a file without rope_parameters.
std::optional<RopeMismatch> rope_parameters_path(const json& model, const std::string& key,
                                                 const json& have, const json& want) {
  if (!model.is_object() || !model.contains("model_type") || !model.contains("rope_parameters") ||
      !model["rope_parameters"].is_object())
    return std::nullopt;
  const json& rp = model["rope_parameters"];
  if (key == "rope_theta") {
    if (!rp.contains("rope_theta")) return std::nullopt;  // the top-level one, or the default
    return RopeMismatch{"$.rope_parameters.rope_theta", have, want};
  }
  // The default rope is null here: its rope_type "default".
  const json dflt = {{"rope_type", "default"}};
  const json& a = have.is_object() ? have : dflt;
  const json& b = want.is_object() ? want : dflt;
  std::vector<std::string> keys = {"rope_type"};
  for (const json* o : {&a, &b})
    for (const auto& [k, v] : o->items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  for (const std::string& k : keys) {
    const json x = a.contains(k) ? a[k] : json(nullptr), y = b.contains(k) ? b[k] : json(nullptr);
    if (x != y) return RopeMismatch{"$.rope_parameters." + k, x, y};
  }
  return std::nullopt;
}
}  // namespace

void check_same_model_math(const json& model, const std::string& source, const json& reference,
                           const std::string& reference_source, const std::string& why) {
  const json mine = hf_math_fields(model, source);
  if (mine.is_null()) return;
  const json theirs = hf_math_fields(reference, reference_source);
  // The family first: every field of the other family differs too, and the first of them
  // by name (a LLaMA's $.attention_bias) would hide why.
  if (theirs.is_object() && theirs.value("type", json()) != mine.value("type", json()))
    throw InputError(reference_source + " is a " + theirs["type"].get<std::string>() +
                     " model, but " + source + " is a " + mine["type"].get<std::string>() +
                     " model (" + why + ")");
  // Two Hugging Face model types of one family (llama and qwen2): the first field whose
  // math differs is a normalised one (qkv_bias) that neither config.json has, so the model
  // types are named, with what that field means ("$.qkv_bias is null" had named neither).
  const std::string my_type = model.value("model_type", json()).is_string()
                                  ? model["model_type"].get<std::string>()
                                  : "",
                    their_type = reference.value("model_type", json()).is_string()
                                     ? reference["model_type"].get<std::string>()
                                     : "";
  if (!my_type.empty() && !their_type.empty() && my_type != their_type && mine != theirs) {
    std::string key;
    for (const auto& [k, v] : theirs.items())
      if (key.empty() && (!mine.contains(k) || mine[k] != v)) key = k;
    for (const auto& [k, v] : mine.items())
      if (key.empty() && !theirs.contains(k)) key = k;
    auto with = [&key](const json& raw, const json& math) {
      const json v = math.contains(key) ? math[key] : json(nullptr);
      if (key == "qkv_bias") return std::string(v == true ? "with" : "without") + " q/k/v bias";
      return (raw.contains(key) ? "$." + key + " " : key + " (as baton reads it) ") + v.dump();
    };
    throw InputError(reference_source + " is a " + their_type + " model " +
                     with(reference, theirs) + ", but " + source + " is a " + my_type + " model " +
                     with(model, mine) + " (" + why + ")");
  }
  for (const auto& [key, v] : theirs.items()) {
    const json have = mine.contains(key) ? mine[key] : json(nullptr);
    if (have == v) continue;
    // A transformers 5 file holds the rope fields in $.rope_parameters: named there.
    if (key == "rope_scaling" || key == "rope_theta")
      if (auto at = rope_parameters_path(model, key, have, v))
        throw InputError(json_where(source, at->path) + " is " + at->have.dump() + ", but " +
                         reference_source + " has " + at->want.dump() + " (" + why + ")");
    throw InputError(json_where(source, "$." + key) + " is " + have.dump() + ", but " +
                     reference_source + " has " + v.dump() + " (" + why + ")");
  }
  for (const auto& [key, v] : mine.items())
    if (!theirs.contains(key))
      throw InputError(json_where(source, "$." + key) + " is " + v.dump() + ", but " +
                       reference_source + " has no such field (a " +
                       theirs.value("type", std::string("?")) + " model)");
  // Within a sliding window baton's full attention is the same math, beyond it not.
  if (auto window = hf_sliding_window(JsonReader(reference, reference_source))) {
    const json given = model.contains("model_type")
                           ? hf_config_to_shorthand(JsonReader(model, source))
                           : parse_llama_shorthand(JsonReader(model, source)).to_json();
    for (const char* k : {"context", "max_position_embeddings"})
      if (given[k].get<int64_t>() > *window)
        throw InputError(json_where(source, std::string("$.") + k) + " is " + given[k].dump() +
                         ", but " + reference_source + " is a Mistral whose sliding window holds " +
                         std::to_string(*window) +
                         " positions (baton has no sliding-window attention; " + why + ")");
  }
}

void check_hf_model_matches(const json& model, const std::string& source, const std::string& dir) {
  check_same_model_math(model, source, read_hf_model_config(dir, model_json_context(model, source)),
                        dir + "/config.json", "the weights of --init-from were made for it");
}

namespace {
bool is_gpt2(const Graph& g) {
  const json& c = g.config;
  return c.is_object() && ((c.contains("model_type") && c["model_type"] == "gpt2") ||
                           (c.contains("type") && c["type"] == "gpt2"));
}
}  // namespace

std::string hf_tensor_name(const Graph& g, const std::string& param) {
  return is_gpt2(g) ? "transformer." + param : param;
}

namespace {

// Buffers some writers store beside the weights, computed rather than learnt: GPT-2's
// causal mask ("attn.bias", "attn.masked_bias") and older LLaMA saves' rotary frequencies.
bool is_stored_buffer(const std::string& name) {
  auto ends = [&](std::string_view tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

// InputError for tensors the model has no parameter for: more layers, biases or a head than
// its config says usually mean a config.json from another model, and the weights would be
// used wrongly without a word. A tied head stored anyway is accepted when it equals the
// embedding; a different one is what transformers 5 would use untied, and older versions
// ignore.
void check_no_unused_tensors(HfCheckpoint& ckpt, const Graph& g) {
  std::set<std::string> known;
  for (const Param& p : g.params) {
    known.insert(p.name);
    known.insert(hf_tensor_name(g, p.name));
  }
  std::vector<std::string> unused;
  for (const std::string& name : ckpt.names())
    if (!known.count(name) && !is_stored_buffer(name)) unused.push_back(name);
  auto head = std::find(unused.begin(), unused.end(), "lm_head.weight");
  const SafetensorsReader *hf = nullptr, *ef = nullptr;
  const SafetensorsEntry* e = nullptr;
  for (const char* embed : {"model.embed_tokens.weight", "transformer.wte.weight", "wte.weight"})
    if (e == nullptr && known.count(embed)) e = ckpt.find(embed, &ef);
  if (head != unused.end() && e != nullptr) {
    const SafetensorsEntry* h = ckpt.find("lm_head.weight", &hf);
    const Tensor ht = hf->read(h->name), et = ef->read(e->name);
    if (h->dtype != e->dtype || ht.nbytes() != et.nbytes() ||
        std::memcmp(ht.raw_data(), et.raw_data(), ht.nbytes()) != 0)
      throw InputError(ckpt.dir() + ": holds an lm_head.weight different from the embedding " +
                       e->name +
                       ", but the model ties the head to the embedding: transformers 5 would use "
                       "the head untied, older versions ignore it" +
                       (e->name == "model.embed_tokens.weight"
                            ? "; set tie_word_embeddings to false in config.json to use it"
                            : ""));
    unused.erase(head);
  }
  if (unused.empty()) return;
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 4; ++i) list += (i ? ", " : "") + unused[i];
  if (unused.size() > 4) list += ", ... (" + std::to_string(unused.size()) + " in all)";
  throw InputError(ckpt.dir() + ": holds tensor(s) the model has no parameter for: " + list +
                   " (does config.json describe these weights? layers, biases and the head "
                   "must match)");
}

// The largest |value| of a floating CPU tensor: NaN when an element is NaN, inf when one
// is infinite. f16 and bf16 are read through f32, which holds them exactly.
double max_abs(const Tensor& t) {
  const bool wide = t.dtype() == DType::f32 || t.dtype() == DType::f64;
  const Tensor c = t.to_staging(wide ? t.dtype() : DType::f32);  // host, outside the cap
  double m = 0;
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < c.numel(); ++i) {
      const double a = std::abs(double(p[i]));
      if (std::isnan(a)) return a;
      m = std::max(m, a);
    }
    return m;
  };
  return c.dtype() == DType::f64 ? scan(c.data<double>()) : scan(c.data<float>());
}

// The stored tensor of parameter p, checked: present, of p's whole shape, floating.
struct StoredTensor {
  const SafetensorsEntry* entry = nullptr;
  const SafetensorsReader* file = nullptr;
  DType dtype = DType::f32;
};
StoredTensor find_stored(HfCheckpoint& ckpt, const Graph& g, const Param& p) {
  StoredTensor s;
  const std::string stored = hf_tensor_name(g, p.name);
  s.entry = ckpt.find(stored, &s.file);
  if (s.entry == nullptr && stored != p.name) s.entry = ckpt.find(p.name, &s.file);
  if (s.entry == nullptr)
    throw InputError(
        ckpt.dir() + ": no tensor '" + stored + "', which the model needs (" +
        (ckpt.sharded() ? "not in model.safetensors.index.json" : "not in model.safetensors") +
        "; does config.json describe these weights?)");
  const SafetensorsEntry& e = *s.entry;
  if (e.shape != p.logical_shape)
    throw InputError(s.file->path() + ": tensor '" + e.name + "' has shape " +
                     memory::shape_str(e.shape) + ", the model's '" + p.name + "' is " +
                     memory::shape_str(p.logical_shape) +
                     " (does config.json describe these weights?)");
  if (!safetensors_dtype(e.dtype, s.dtype) || !memory::is_floating(s.dtype))
    throw InputError(s.file->path() + ": tensor '" + e.name + "' has dtype " + e.dtype +
                     ", expected F32, F16, BF16 or F64");
  return s;
}

}  // namespace

void check_hf_weights(HfCheckpoint& ckpt, const Graph& g, const std::vector<int>& params) {
  check_no_unused_tensors(ckpt, g);
  for (int id : params) find_stored(ckpt, g, g.params[size_t(id)]);
}

void check_hf_weights(const std::string& dir, const Graph& g, const std::vector<int>& params) {
  HfCheckpoint c(dir);
  check_hf_weights(c, g, params);
}

void load_hf_weights(HfCheckpoint& ckpt, Stage& stage) {
  const Graph& g = stage.graph();
  check_no_unused_tensors(ckpt, g);
  for (int id : stage.param_ids()) {
    const Param& p = g.params[size_t(id)];
    const StoredTensor s = find_stored(ckpt, g, p);
    Tensor& local = stage.param(id);
    // A non-finite weight would only show as a NaN loss at the first step: refused here,
    // as is a value that the model's dtype cannot hold (an f64 file's 1e300 in f32).
    // Read into host staging and copied into the parameter already allocated: a block of
    // the file takes nothing of the device's budget.
    auto fill = [&](const Shape& offsets, Tensor view) {
      Tensor tmp = Tensor::staging(view.shape(), s.dtype);
      s.file->read_block(*s.entry, offsets, tmp);
      const double stored = max_abs(tmp);
      if (!std::isfinite(stored))
        throw InputError(s.file->path() + ": tensor '" + s.entry->name + "' holds " +
                         (std::isnan(stored) ? "NaN" : "inf") +
                         " (--init-from needs finite weights)");
      Tensor cast = tmp.to_staging(view.dtype());
      if (cast.dtype() != tmp.dtype() && !std::isfinite(max_abs(cast)))
        throw InputError(s.file->path() + ": tensor '" + s.entry->name + "' holds values up to " +
                         fmt::format("{} in magnitude, beyond the range of the model's {}", stored,
                                     memory::dtype_name(view.dtype())) +
                         " (--init-from)");
      view.copy_from(cast);
    };
    if (!p.is_shard()) {
      fill(Shape(p.shape.size(), 0), local);
      continue;
    }
    for (const ParamPiece& piece : p.pieces) {
      Tensor view = local;
      for (size_t d = 0; d < piece.shape.size(); ++d)
        view = view.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
      fill(piece.global_offsets, view);
    }
  }
}

void load_hf_weights(const std::string& dir, Stage& stage) {
  HfCheckpoint c(dir);
  load_hf_weights(c, stage);
}

// ---- writing ----

namespace {
// The config.json of a model's shorthand form.
json hf_config_fields(const Graph& g, DType dtype) {
  JsonReader r(g.config, g.source);
  json sh;
  if (g.config.is_object() && g.config.contains("model_type"))
    sh = hf_config_to_shorthand(r);
  else
    sh = g.config;
  const std::string type =
      sh.is_object() && sh.contains("type") ? sh["type"].get<std::string>() : "";
  const std::string torch_dtype = dtype == DType::bf16  ? "bfloat16"
                                  : dtype == DType::f16 ? "float16"
                                                        : "float32";
  if (type == "gpt2") {
    Gpt2Config c = parse_gpt2_shorthand(JsonReader(sh, g.source));
    return {{"model_type", "gpt2"},
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
            {"tie_word_embeddings", true},
            // transformers' GPT-2 defaults to 50256 (its <|endoftext|>): right for GPT-2's
            // vocabulary, an id outside a smaller one.
            {"bos_token_id", c.vocab_size > 50256 ? json(50256) : json(nullptr)},
            {"eos_token_id", c.vocab_size > 50256 ? json(50256) : json(nullptr)},
            {"torch_dtype", torch_dtype}};
  }
  if (type == "llama") {
    LlamaConfig c = parse_llama_shorthand(JsonReader(sh, g.source));
    // Biases on q, k, v alone exist only in Qwen2; everything else is a LlamaForCausalLM.
    const bool qwen = c.qkv_bias && !c.attention_bias;
    json j = {{"model_type", qwen ? "qwen2" : "llama"},
              {"architectures", {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"num_key_value_heads", c.kv_heads()},
              {"head_dim", c.head_size()},
              {"max_position_embeddings", c.max_position_embeddings},
              {"vocab_size", c.vocab_size},
              {"rms_norm_eps", c.rms_norm_eps},
              {"rope_theta", c.rope_theta},
              {"rope_scaling", c.rope_scaling},
              {"hidden_act", "silu"},
              {"initializer_range", c.initializer_range},
              {"attention_dropout", c.attention_dropout},
              {"tie_word_embeddings", c.tie_word_embeddings},
              {"torch_dtype", torch_dtype}};
    if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;  // the embedding's padding_idx
    if (qwen) {
      j["use_sliding_window"] = false;
    } else {
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
    }
    // transformers' LlamaConfig (not Qwen2Config) refuses such a config even when head_dim
    // is given: "The hidden size (64) is not a multiple of the number of attention heads (6)".
    if (!qwen && c.hidden_size % c.num_attention_heads != 0)
      throw InputError(g.source + ": hidden_size " + std::to_string(c.hidden_size) +
                       " is not a multiple of num_attention_heads " +
                       std::to_string(c.num_attention_heads) +
                       ": transformers' LlamaConfig refuses to load that, whatever head_dim is "
                       "(a Hugging Face LLaMA needs hidden_size % num_attention_heads == 0)");
    if (qwen && c.mlp_bias)
      throw InputError(g.source +
                       ": a model with biases on q, k, v only and on the MLP has no "
                       "Hugging Face architecture");
    return j;
  }
  throw InputError(g.source +
                   ": only gpt2 and llama models (shorthands or Hugging Face "
                   "configs) can be written in the Hugging Face layout");
}
}  // namespace

json hf_config_of(const Graph& g, DType dtype) {
  json j = hf_config_fields(g, dtype);
  // A model started from a Hugging Face config keeps its token ids (transformers' generate
  // stops at its eos_token_id); without them its config has its class's (LLaMA's eos 2).
  if (g.config.is_object() && g.config.contains("model_type"))
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (g.config.contains(k)) j[k] = g.config[k];
  return j;
}

void write_hf(const std::string& dir, const Graph& g, const std::vector<NamedTensor>& tensors,
              const HfWriteOptions& opt) {
  if (opt.dtype != DType::f32 && opt.dtype != DType::bf16 && opt.dtype != DType::f16)
    throw InputError("Hugging Face weights are written as f32, bf16 or f16, not " +
                     std::string(memory::dtype_name(opt.dtype)));
  json config = hf_config_of(g, opt.dtype);
  // Stored names and dtype; GPT-2's tied head has no tensor of its own. Converted in host
  // staging (outside the device's cap) one tensor at a time, when its file is written:
  // converting them all first had held a copy of the model in the capped allocator.
  std::vector<SafetensorsOut> out;
  for (const NamedTensor& t : tensors)
    out.push_back({hf_tensor_name(g, t.name), opt.dtype, t.tensor.shape()});
  auto stored = [&](size_t i) { return tensors[i].tensor.to_staging(opt.dtype); };
  // Checked before anything is written: a 16-bit type rounds values beyond its range to
  // inf (f16 from 65520 in magnitude, bf16 from about 3.39e38).
  if (opt.dtype == DType::f16 || opt.dtype == DType::bf16)
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!memory::is_floating(tensors[i].tensor.dtype())) continue;
      const double before = max_abs(tensors[i].tensor);
      const bool half = opt.dtype == DType::f16;
      if (std::isfinite(before) && !std::isfinite(max_abs(stored(i))))
        throw InputError(std::string("--dtype ") + (half ? "f16" : "bf16") + ": tensor '" +
                         out[i].name + "' holds values up to " + fmt::format("{:g}", before) +
                         " in magnitude, beyond " + (half ? "f16" : "bf16") + "'s range (at most " +
                         (half ? "65504" : "3.3895e+38") +
                         "), which would be written as inf; export with --dtype " +
                         (half ? "bf16 or f32" : "f32"));
    }
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(dir + ": not a directory (the export is a directory of files)");
  // An export into a checkpoint would replace or mix with its files.
  if (fs::exists(fs::path(dir) / "manifest.json", ec))
    throw InputError(dir +
                     ": holds a baton checkpoint (manifest.json); export to a directory "
                     "of its own");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && fs::exists(e.path() / "manifest.json", ec))
      throw InputError(dir + ": holds baton checkpoints (" + e.path().filename().string() +
                       "); export to a directory of its own");
  refuse_checkpoint_step_name(dir);
  // The directories this export makes, deepest first: removed again (each only when
  // empty) when it fails or is stopped, its new parents too (only `dir` had been).
  std::vector<std::string> made;
  for (fs::path d = fs::path(dir).lexically_normal(); !d.empty() && !fs::exists(d, ec);
       d = d.parent_path()) {
    made.push_back(d.string());
    if (d == d.parent_path()) break;
  }
  const bool existed = made.empty();
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir + ": cannot create: " + ec.message());
  const ExportLock lock(dir);
  // Consecutive tensors into shards of at most max_shard_bytes: each shard's entries and
  // the indices of its tensors.
  struct Shard {
    std::vector<SafetensorsOut> entries;
    std::vector<size_t> index;
  };
  auto nbytes = [&](const SafetensorsOut& e) {
    return uint64_t(memory::shape_numel(e.shape)) * memory::dtype_size(e.dtype);
  };
  std::vector<Shard> shards(1);
  uint64_t used = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t b = nbytes(out[i]);
    if (opt.max_shard_bytes > 0 && used > 0 && used + b > opt.max_shard_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().entries.push_back(out[i]);
    shards.back().index.push_back(i);
    used += b;
  }
  auto write_shard = [&](const std::string& path, const Shard& sh,
                         const std::map<std::string, std::string>& meta) {
    write_safetensors(
        path, sh.entries, [&](size_t k) { return stored(sh.index[k]); }, meta);
  };
  // The new files go to a staging directory inside `dir` first (the same file system, so
  // they rename in): an export that fails (a full disk) leaves the earlier one whole.
  // One that crashed leaves its staging directory, removed here (only once its process is
  // gone: the lock keeps out exports of this host, not those of another sharing the disk).
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".baton-export-", 0) == 0 && stale_staging(name)) fs::remove_all(e.path(), ec);
  }
  const fs::path staging = fs::path(dir) / (".baton-export-" + std::to_string(::getpid()));
  fs::create_directory(staging, ec);
  if (ec) throw InputError(dir + ": cannot write in it: " + ec.message());
  std::vector<std::string> written;  // file names, config.json last
  // A stop signal while writing removes them (and `dir` where this made it): a staging
  // directory had been left until the next export there.
  std::optional<memory::RemoveOnStop> on_stop;
  on_stop.emplace(std::vector<std::string>{staging.string()}, made);
  try {
    const std::map<std::string, std::string> meta{{"format", "pt"}};
    auto stage = [&](const std::string& name, auto&& write) {
      write((staging / name).string());
      written.push_back(name);
    };
    if (shards.size() == 1) {
      stage("model.safetensors",
            [&](const std::string& path) { write_shard(path, shards[0], meta); });
    } else {
      json weight_map = json::object();
      uint64_t total = 0;
      const size_t n = shards.size();
      for (size_t i = 0; i < n; ++i) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
        stage(name, [&](const std::string& path) { write_shard(path, shards[i], meta); });
        for (const SafetensorsOut& e : shards[i].entries) {
          weight_map[e.name] = name;
          total += nbytes(e);
        }
      }
      json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      stage("model.safetensors.index.json", [&](const std::string& path) {
        memory::write_file_durably(path, index.dump(2) + "\n");
      });
    }
    // transformers' generate takes generation_config.json's ids over config.json's; one
    // written only where they differ (a directory whose generation_config.json had others).
    if (opt.eos_token_ids &&
        *opt.eos_token_ids != read_eos_ids(JsonReader(config, "config.json"))) {
      const std::vector<int32_t>& ids = *opt.eos_token_ids;
      const json gen = {{"eos_token_id", ids.empty()       ? json(nullptr)
                                         : ids.size() == 1 ? json(ids[0])
                                                           : json(ids)}};
      stage("generation_config.json",
            [&](const std::string& path) { memory::write_file_durably(path, gen.dump(2) + "\n"); });
    }
    stage("config.json", [&](const std::string& path) {
      memory::write_file_durably(path, config.dump(2) + "\n");
    });
  } catch (const RuntimeError& e) {
    fs::remove_all(staging, ec);
    for (const std::string& d : made) fs::remove(d, ec);  // only when empty
    throw RuntimeError(dir + ": cannot write the export: " + e.what() +
                       (existed ? " (an earlier export there is untouched)" : ""));
  } catch (...) {
    fs::remove_all(staging, ec);
    for (const std::string& d : made) fs::remove(d, ec);
    throw;
  }
  // The swap is crash-safe by its order (below): a stop now is left to it, not undone.
  on_stop.reset();
  // All written: the swap. A crash at any instant must leave `dir` as the earlier export
  // whole, or without config.json (visibly incomplete: transformers and --init-from refuse
  // it), or as the new export whole; never config.json over the wrong weights (an earlier
  // model.safetensors beside a new index is read first, a crash amid shard renames mixes
  // two exports). So the earlier config.json goes first, then the earlier export's weight
  // files that the new one has not (other shard counts, an index), then the new files move
  // in, config.json last. Other files (an adapter's weights, a tokenizer) are not ours.
  auto step = [&](const std::string& what) {
    if (opt.on_swap_step) opt.on_swap_step(what);
  };
  const fs::path old_config = fs::path(dir) / "config.json";
  if (fs::exists(old_config, ec)) {
    fs::remove(old_config, ec);
    if (ec) {
      const std::string why = ec.message();
      fs::remove_all(staging, ec);
      throw RuntimeError(old_config.string() + ": cannot remove the earlier export's: " + why +
                         " (an earlier export there is untouched)");
    }
    step("removed config.json");
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    unsigned a = 0, b = 0;
    char rest = 0;
    // generation_config.json too: its eos_token_id and sampling defaults are the earlier
    // model's, and it overrides config.json's for transformers and baton generate.
    const bool ours =
        name == "model.safetensors" || name == "model.safetensors.index.json" ||
        name == "generation_config.json" ||
        (std::sscanf(name.c_str(), "model-%5u-of-%5u.safetensor%c", &a, &b, &rest) == 3 &&
         rest == 's' && name.size() == 32);
    if (ours && std::find(written.begin(), written.end(), name) == written.end()) {
      fs::remove(e.path(), ec);
      // A generation_config.json may be the user's own (sampling defaults written by
      // hand): said at warning level, where the shards' removal is a step.
      if (name == "generation_config.json")
        spdlog::warn(
            "{}: removed generation_config.json (the export's ids are config.json's; "
            "one left there would override them)",
            dir);
      else
        step("removed " + name);
    }
  }
  // Durable before the new files land: after a power loss too, no config.json survives
  // over a directory whose weights changed.
  memory::fsync_path(dir, true);
  for (const std::string& name : written) {
    if (name == "config.json") memory::fsync_path(dir, true);  // the weights first
    fs::rename(staging / name, fs::path(dir) / name, ec);
    if (ec) {
      const std::string why = ec.message();
      fs::remove_all(staging, ec);
      throw RuntimeError(dir + "/" + name + ": cannot move the export's file in: " + why +
                         " (the directory holds no complete export: it has no config.json)");
    }
    step("renamed " + name);
  }
  fs::remove_all(staging, ec);
  memory::fsync_path(dir, true);
}

void save_hf(const std::string& dir, const Stage& stage, const HfWriteOptions& opt) {
  const Graph& g = stage.graph();
  BATON_CHECK(stage.is_first() && stage.is_last(), "save_hf needs the whole model");
  std::vector<NamedTensor> tensors;
  for (int id : stage.param_ids()) {
    const stages::Param& p = g.params[size_t(id)];
    BATON_CHECK(!p.is_shard(), "save_hf of a split parameter " + p.name);
    tensors.push_back({p.name, stage.param(id)});
  }
  write_hf(dir, g, tensors, opt);
}

std::string resolve_checkpoint(const std::string& dir) {
  if (!path_exists(dir)) throw InputError(dir + ": no such checkpoint directory");
  if (path_exists(dir + "/manifest.json")) {
    // One step's directory, named by the user: verified as a resume verifies it, but
    // refused rather than passed over (export and generate had read it unchecked).
    if (auto problem = verify_checkpoint(dir, read_manifest(dir)))
      throw InputError(dir + ": a damaged checkpoint: " + *problem);
    return dir;
  }
  if (auto latest = latest_checkpoint(dir)) return *latest;
  // Manifests but none usable: not "no manifest" (as --resume says it).
  if (newest_written_checkpoint(dir))
    throw InputError(dir + ": no checkpoint in it is complete and undamaged (" +
                     unusable_newest(dir) + ")");
  throw InputError(dir +
                   ": no complete checkpoint (no manifest.json in it or in a step-* "
                   "directory under it)");
}

namespace {

// The step directories under `dir` and which hold a manifest: what a live run changes.
std::vector<std::string> checkpoint_listing(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0)
      out.push_back(e.path().filename().string() +
                    (fs::exists(e.path() / "manifest.json", ec) ? "+" : "-"));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void read_checkpoint(const std::string& dir,
                     const std::function<void(const std::string& step_dir)>& read) {
  std::error_code ec;
  const bool one_step = fs::exists(fs::path(dir) / "manifest.json", ec);
  constexpr int kTries = 5;
  for (int attempt = 1;; ++attempt) {
    const auto before = checkpoint_listing(dir);
    std::string step_dir;
    try {
      step_dir = resolve_checkpoint(dir);
      read(step_dir);
      return;
    } catch (const std::exception& e) {
      // Gone while read: a live run's pruning removes the manifest first. When none was
      // found in a checkpoint directory, a run's writing and pruning may have hidden them
      // all from the search.
      const bool vanished = !step_dir.empty()
                                ? !fs::exists(fs::path(step_dir) / "manifest.json", ec)
                            : one_step ? !fs::exists(fs::path(dir) / "manifest.json", ec)
                                       : checkpoint_listing(dir) != before;
      if (!vanished) throw;
      const std::string what = step_dir.empty() ? dir : step_dir;
      if (one_step || attempt == kTries)
        throw RuntimeError(what + ": the checkpoint was removed while being read" +
                           (one_step ? "" : " (" + std::to_string(attempt) + " times)") +
                           ": a run is pruning its checkpoints (--keep-checkpoints); " +
                           (one_step ? "name the checkpoint directory to read its newest"
                                     : "try again, or copy a checkpoint away from the run first") +
                           " (the read said: " + e.what() + ")");
      spdlog::warn("{} was removed while being read (a run pruning it); reading the newest again",
                   what);
    }
  }
}

WholeModel load_whole_checkpoint(const std::string& step_dir) {
  WholeModel w;
  w.manifest = read_manifest(step_dir);
  w.graph = std::make_shared<Graph>(
      load_model_json(w.manifest.model, step_dir + "/manifest.json: $.model"));
  StageOptions loaded;
  loaded.init = false;       // load_stage fills every parameter
  loaded.gradients = false;  // exported, never trained
  w.stage = std::make_unique<Stage>(w.graph, 0, w.graph->num_layers(), loaded);
  load_stage(step_dir, w.manifest, *w.stage, false);
  return w;
}

void export_hf(const WholeModel& w, const std::string& step_dir, const std::string& out,
               HfWriteOptions opt) {
  if (auto ids = checkpoint_eos_token_ids(w.manifest, step_dir + "/manifest.json"))
    opt.eos_token_ids = ids;
  save_hf(out, *w.stage, opt);
}

int64_t export_hf(const std::string& step_dir, const std::string& out, const HfWriteOptions& opt) {
  const WholeModel w = load_whole_checkpoint(step_dir);
  export_hf(w, step_dir, out, opt);
  return w.manifest.step;
}

}  // namespace baton::stages
