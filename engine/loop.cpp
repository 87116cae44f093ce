#include "engine/loop.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/detail/host_agreement.h"
#include "kernels/grad_scale.h"
#include "memory/cuda_device.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/json_object.h"
#include "memory/units.h"
#include "stages/hf.h"
#include "stages/image_data.h"

#ifdef BATON_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

namespace baton::engine {

namespace {

constexpr const char* kSummaryFormat = "baton-train-summary";
// 2: a constant schedule's lr_schedule without decay and min_lr (docs/formats/summary.md).
constexpr int kSummaryVersion = 2;

std::string duration_str(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

bool eval_due(const LoopOptions& o, int64_t done) {
  return done == o.steps || (o.eval_every > 0 && done % o.eval_every == 0);
}

bool checkpoint_due(const LoopOptions& o, int64_t done) {
  if (o.checkpoint_dir.empty()) return false;
  return done == o.steps || (o.checkpoint_every > 0 && done % o.checkpoint_every == 0);
}

// Whether `dir` is `root` or a folder under it, by their absolute lexical forms.
bool inside(const std::filesystem::path& dir, const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d = fs::absolute(dir.empty() ? fs::path(".") : dir, ec).lexically_normal();
  fs::path r = fs::absolute(root, ec).lexically_normal();
  if (r.filename().empty()) r = r.parent_path();  // "ck/"
  const fs::path rel = d.lexically_relative(r);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

void check_output_path(const std::string& path, const char* flag) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  // A descriptor (/dev/stdout, /dev/fd/N) or a device is written in place: its own
  // permission is what counts, not its folder's.
  struct stat st;
  if (path.rfind("/dev/", 0) == 0 || path.rfind("/proc/", 0) == 0 ||
      (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))) {
    if (::access(path.c_str(), W_OK) != 0)
      throw InputError(std::string(flag) + " " + path + ": cannot write: " + std::strerror(errno));
    // The descriptor itself: a closed standard output is held by /dev/null opened for
    // reading (tools/main.cpp), which access() finds writable; the run had failed after
    // its first step.
    if (const int fd = memory::descriptor_of(path); fd >= 0) {
      const int mode = ::fcntl(fd, F_GETFL);
      if (mode < 0 || (mode & O_ACCMODE) == O_RDONLY)
        throw InputError(std::string(flag) + " " + path + ": cannot write: descriptor " +
                         std::to_string(fd) + " is closed or open for reading only");
    }
    return;
  }
  // The file written is a symbolic link's target, in the target's folder: the link's
  // own folder had been checked, and a read-only target found only after the last step.
  std::string target;
  try {
    target = memory::resolve_links(path);
  } catch (const InputError& e) {
    throw InputError(std::string(flag) + " " + e.what());
  }
  const std::string via = target == path ? std::string() : " (the target of the link)";
  const fs::path parent = fs::path(target).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw InputError(std::string(flag) + " " + path + ": no directory " + parent.string() +
                     " to write it in" + via);
  if (fs::is_directory(target, ec))
    throw InputError(std::string(flag) + " " + path + ": a directory, expected a file");
  // Written at the end: a read-only folder had been found only after the last step.
  const std::string folder = parent.empty() ? std::string(".") : parent.string();
  if (::access(folder.c_str(), W_OK) != 0)
    throw InputError(std::string(flag) + " " + path + ": cannot write in " + folder + via + ": " +
                     std::strerror(errno));
  // The system's limits on a name and a path, before the work: a longer name had failed at
  // its rename after every step had run.
  const std::string name = fs::path(target).filename().string();
  const long name_max = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && name.size() > size_t(name_max))
    throw InputError(std::string(flag) + " " + path + ": the file name " + name + via + " is " +
                     std::to_string(name.size()) + " bytes, over the file system's limit of " +
                     std::to_string(name_max));
  if (target.size() > PATH_MAX - 1)
    throw InputError(std::string(flag) + " " + path + via + ": a path of " +
                     std::to_string(target.size()) + " bytes, over the system's limit of " +
                     std::to_string(PATH_MAX - 1));
}

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files,
                          size_t outputs) {
  // By resolved path: what is written through a symbolic link is its target, and a file
  // written by rename under another hard link loses nothing. A descriptor (/dev/stdout)
  // is written in place, and a device or FIFO is no file to lose.
  std::vector<std::string> resolved;
  // A descriptor's file and a path's, by device and inode: `--loss-log /dev/stdout >
  // s.json --summary s.json` had passed, and the summary's rename took the loss lines.
  // (Two descriptors on one file write in place, one after the other: no conflict.)
  struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
    bool known = false, descriptor = false;
  };
  std::vector<Identity> ids;
  for (const auto& [flag, path] : files) {
    struct stat st;
    Identity id;
    const int fd = path.empty() ? -1 : memory::descriptor_of(path);
    if (fd >= 0 ? ::fstat(fd, &st) == 0 : ::stat(path.c_str(), &st) == 0)
      if (S_ISREG(st.st_mode)) id = {st.st_dev, st.st_ino, true, fd >= 0};
    ids.push_back(id);
    if (path.empty() || fd >= 0 || (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))) {
      resolved.emplace_back();
      continue;
    }
    // Links followed as the writer follows them, a dangling one to the file it would
    // create (weakly_canonical leaves it unresolved).
    std::string target = path;
    try {
      target = memory::resolve_links(path);
    } catch (const InputError&) {
    }
    // Made absolute first: weakly_canonical leaves a path none of whose parts exists
    // relative, so a new out.json and ./out.json had compared unequal and one output
    // was lost.
    std::error_code ec;
    std::filesystem::path whole = std::filesystem::absolute(target, ec);
    if (ec) whole = target;
    const std::string r = std::filesystem::weakly_canonical(whole, ec).string();
    resolved.push_back(ec ? whole.string() : r);
  }
  auto same = [&](size_t i, size_t j) {
    if (!resolved[i].empty() && resolved[i] == resolved[j]) return true;
    return ids[i].known && ids[j].known && ids[i].descriptor != ids[j].descriptor &&
           ids[i].dev == ids[j].dev && ids[i].ino == ids[j].ino;
  };
  for (size_t i = 0; i < outputs && i < files.size(); ++i)
    for (size_t j = 0; j < files.size(); ++j)
      if (j != i && !(j < i && j < outputs) && same(i, j))
        throw InputError(files[i].first + " " + files[i].second + " is the same file as " +
                         files[j].first + " " + files[j].second + ": writing it would " +
                         (j < outputs ? "replace the other output" : "replace that input"));
}

std::string data_entry_path(const std::string& entry) {
  std::error_code ec;
  const size_t colon = entry.find(':');
  return colon != std::string::npos && !std::filesystem::exists(entry, ec) ? entry.substr(colon + 1)
                                                                           : entry;
}

std::vector<std::pair<std::string, std::string>> data_files(const LoopOptions& o) {
  std::vector<std::pair<std::string, std::string>> files;
  auto add = [&](const char* flag, const std::string& p) {
    // A Megatron PREFIX reads PREFIX.bin and PREFIX.idx.
    const std::string path = data_entry_path(p);
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      files.emplace_back(flag, path);
      return;
    }
    files.emplace_back(flag, path + ".bin");
    files.emplace_back(flag, path + ".idx");
  };
  if (!o.data_path.empty()) add("--data", o.data_path);
  for (const std::string& p : o.data.data) add("--data", p);
  for (const std::string& p : o.data.eval_data) add("--eval-data", p);
  return files;
}

void prepare_checkpoint_dir(const LoopOptions& o) {
  if (o.checkpoint_dir.empty()) return;
  stages::prepare_checkpoint_root(o.checkpoint_dir);
  // A fresh run would mix its checkpoints with an earlier run's, and pruning by step
  // would delete its own newest ones; --resume would then continue the other run.
  if (!o.resume)
    if (auto earlier = stages::newest_written_checkpoint(o.checkpoint_dir))
      throw InputError("--checkpoint-dir " + o.checkpoint_dir +
                       " holds the checkpoints of an earlier run (the newest: " + *earlier +
                       "): give --resume to continue it, or another --checkpoint-dir");
}

void warn_if_checkpoint_room_short(const LoopOptions& o, const stages::Graph& graph) {
  if (o.checkpoint_dir.empty()) return;
  const int states = o.optimizer.kind == stages::OptimizerConfig::Kind::adamw ? 2
                     : o.optimizer.sgd.momentum > 0                           ? 1
                                                                              : 0;
  double bytes = 0;
  for (const stages::Param& p : graph.params) {
    const memory::Shape& whole = p.logical_shape.empty() ? p.shape : p.logical_shape;
    double n = 1;
    for (int64_t d : whole) n *= double(d);
    bytes += 4 * n * (1 + (p.trainable ? states : 0));
  }
  struct statvfs fs {};
  if (::statvfs(o.checkpoint_dir.c_str(), &fs) != 0) return;
  const double room = double(fs.f_bavail) * double(fs.f_frsize);
  if (room < bytes)
    spdlog::warn(
        "--checkpoint-dir {}: {} free, where a checkpoint of this model takes about {} (its "
        "parameters and optimizer state): its first save may fail",
        o.checkpoint_dir, memory::format_bytes(room), memory::format_bytes(bytes));
}

void check_loop_options(const LoopOptions& o) {
  if (o.steps < 0) throw InputError("--steps must be >= 0");
  if (o.resume && o.checkpoint_dir.empty()) throw InputError("--resume needs --checkpoint-dir");
  if (o.checkpoint_every < 0)
    throw InputError("--checkpoint-every: expected steps >= 0 (0: at the end only), found " +
                     std::to_string(o.checkpoint_every));
  if (o.keep_checkpoints < 0)
    throw InputError("--keep-checkpoints: expected a count >= 0 (0: all), found " +
                     std::to_string(o.keep_checkpoints));
  if (o.checkpoint_dir.empty() && (o.checkpoint_every > 0 || o.keep_checkpoints > 0))
    throw InputError("--checkpoint-every and --keep-checkpoints need --checkpoint-dir");
  // A log or summary kept inside the checkpoint folder of a first run: the folder, which
  // the first save would make, is made now (the log's first line comes before it).
  for (const std::string* path : {&o.summary_path, &o.loss_log})
    if (!path->empty() && !o.checkpoint_dir.empty() &&
        inside(std::filesystem::path(*path).parent_path(), o.checkpoint_dir)) {
      std::error_code ec;
      std::filesystem::create_directories(o.checkpoint_dir, ec);
    }
  check_output_path(o.summary_path, "--summary");
  check_output_path(o.loss_log, "--loss-log");
  {
    std::vector<std::pair<std::string, std::string>> files = {{"--summary", o.summary_path},
                                                              {"--loss-log", o.loss_log}};
    for (auto& f : data_files(o)) files.push_back(std::move(f));
    check_distinct_files(files, 2);
  }
  lr_schedule_of(o).validate();
  if (o.eval_every < 0)
    throw InputError("--eval-every: expected >= 0, found " + std::to_string(o.eval_every));
  if (o.eval_batches <= 0)
    throw InputError("--eval-batches: expected >= 1, found " + std::to_string(o.eval_batches));
  stages::check_eval_fraction(o.data.eval_fraction);
  const bool held_out = !o.data.eval_data.empty() || o.data.eval_fraction > 0;
  if (o.eval_every > 0 && !held_out)
    throw InputError("--eval-every needs held-out data (--eval-data PATH or --eval-fraction F)");
  // Its default is 1: another count without held-out data had been accepted without effect.
  // baton train also refuses an explicit 1 (it knows what was given).
  if (o.eval_batches != 1 && !held_out)
    throw InputError("--eval-batches needs held-out data (--eval-data PATH or --eval-fraction F)");
}

stages::LrSchedule lr_schedule_of(const LoopOptions& o) {
  stages::LrSchedule s = o.lr_schedule;
  s.lr = o.optimizer.lr();
  s.total = o.steps;
  return s;
}

stages::DataFlags data_flags(const LoopOptions& o) {
  stages::DataFlags f = o.data;
  if (f.data.empty()) {
    if (o.data_path.empty()) throw InputError("--data is required");
    f.data = {o.data_path};
  }
  return f;
}

void expect_token_model(const stages::Graph& g, const LoopOptions& o) {
  if (g.find_value("images") < 0 || g.find_value("tokens") >= 0) return;
  const std::string& path = o.data.data.empty() ? o.data_path : o.data.data[0];
  if (!path.empty()) {
    // "1:DIR" is a weighted part of a blend: without this it read as a missing path.
    const std::vector<stages::DataSpec> specs = stages::parse_data_specs(
        o.data.data.empty() ? std::vector<std::string>{path} : o.data.data, "--data");
    if (specs.size() > 1 || specs[0].weighted)
      throw InputError("--data: '" + path +
                       "': weights and blends (WEIGHT:PATH) are for token data; a model that "
                       "reads images (its input 'images') takes one directory holding "
                       "images.npy and labels.npy (docs/formats/images.md)");
  }
  std::error_code ec;
  const std::string found = !std::filesystem::exists(path, ec) ? "no such file or directory"
                            : std::filesystem::is_directory(path, ec)
                                ? "a directory without images.npy"
                                : "a file";
  throw InputError(path +
                   ": the model reads images (its input 'images'), so --data must be "
                   "a directory holding images.npy and labels.npy (docs/formats/images.md); "
                   "found " +
                   found);
}

bool image_data(const LoopOptions& o) {
  if (!o.data.data.empty() && o.data.data.size() != 1) return false;
  const std::string& path = o.data.data.empty() ? o.data_path : o.data.data[0];
  if (path.empty() || !stages::is_image_dataset(path)) return false;
  const stages::DataFlags& f = o.data;
  if (f.format != "auto" || !f.token_dtype.empty() || !f.cross_documents || !f.eval_data.empty() ||
      f.eval_fraction != 0)
    throw InputError(path +
                     ": an image directory; --data-format, --token-dtype, --no-cross-documents, "
                     "--eval-data and --eval-fraction are for token data");
  // Said before check_loop_options, which would ask for held-out data image data refuses.
  // (baton train refuses an explicit --eval-batches 1 too: it knows what was given.)
  if (o.eval_every != 0) throw InputError("--eval-every: evaluation is for token data");
  if (o.eval_batches != 1) throw InputError("--eval-batches: evaluation is for token data");
  return true;
}

void log_data_opened(const stages::TrainData& d) {
  spdlog::info("opened the data in {:.3f} s{}", d.open_seconds,
               d.check ? fmt::format("; its {} tokens are checked against the model's vocabulary "
                                     "of {} in the background",
                                     d.check->tokens(), d.check->vocab())
                       : std::string());
}

namespace {

// The key naming a dataset's file ("file") or directory (an image dataset's "dir").
const char* path_key(const nlohmann::json& j) {
  for (const char* k : {"file", "dir"})
    if (j.contains(k) && j[k].is_string()) return k;
  return nullptr;
}

// Each data file or directory of `j` (a dataset's to_json, a blend's parts) gets
// "contents", its size and head/tail hash: the same name can hold other data on resume.
void add_fingerprints(nlohmann::json& j) {
  if (j.is_array())
    for (auto& e : j) add_fingerprints(e);
  if (!j.is_object()) return;
  const char* key = path_key(j);
  if (key) {
    const std::string id = detail::contents_identity(j[key].get<std::string>());
    if (id != "missing") j["contents"] = id;  // an in-memory store names no file
  }
  for (auto& [k, v] : j.items())
    if (!key || k != key) add_fingerprints(v);
}

// The training data as resume compares it: a file with a fingerprint is known by it (and
// not by its name: `./tok.bin` and its absolute path are one file); a manifest written
// before fingerprints (`fingerprinted` false) compares names, lexically normalised (an
// image directory's trailing slash too).
nlohmann::json comparable_data(nlohmann::json j, bool fingerprinted) {
  if (j.is_array())
    for (auto& e : j) e = comparable_data(e, fingerprinted);
  if (!j.is_object()) return j;
  if (!fingerprinted) j.erase("contents");
  if (const char* key = path_key(j)) {
    if (j.contains("contents")) {
      j.erase(key);
    } else {
      std::filesystem::path p = std::filesystem::path(j[key].get<std::string>()).lexically_normal();
      if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
      j[key] = p.string();
    }
  }
  for (auto& [k, v] : j.items()) v = comparable_data(v, fingerprinted);
  return j;
}

bool has_fingerprint(const nlohmann::json& j) {
  if (j.is_object() && j.contains("contents")) return true;
  if (j.is_structured())
    for (const auto& e : j)
      if (has_fingerprint(e)) return true;
  return false;
}

}  // namespace

nlohmann::json data_manifest(const stages::TrainData& d, int64_t position) {
  nlohmann::json j = {{"position", position}, {"train", d.train->to_json()}};
  add_fingerprints(j["train"]);
  if (d.eval) {
    j["eval"] = d.eval->to_json();
    add_fingerprints(j["eval"]);
  }
  return j;
}

nlohmann::json data_manifest(const stages::ImageDataset& d, int64_t position) {
  nlohmann::json j = {{"position", position}, {"train", d.to_json()}};
  add_fingerprints(j["train"]);
  return j;
}

void check_resume(const stages::Manifest& m, const std::string& dir,
                  const nlohmann::json& model_json, const std::string& model_source,
                  uint64_t seed) {
  // A gpt2 or llama model is compared as --init-from compares it: by the fields that
  // change what the weights compute (a default spelled out, a new name, other dropout or
  // context are the same model).
  if (!stages::hf_math_fields(model_json, model_source).is_null()) {
    stages::check_same_model_math(model_json, model_source, m.model,
                                  dir + "/manifest.json: $.model",
                                  "the checkpoint was written for that model");
  } else if (m.model != model_json) {
    // The first field that differs, as a JSON patch names it ("/n_embd").
    std::string what;
    const nlohmann::json patch = nlohmann::json::diff(m.model, model_json);
    if (!patch.empty() && patch[0].contains("path")) {
      const std::string path = patch[0]["path"].get<std::string>();
      const nlohmann::json::json_pointer at(path);
      auto value = [&at](const nlohmann::json& j) {
        return j.contains(at) ? "has " + j.at(at).dump() : std::string("has no such field");
      };
      what = " (" + (path.empty() ? std::string("the whole model") : path.substr(1)) +
             ": the checkpoint's model " + value(m.model) + ", the run's " + value(model_json) +
             ")";
    }
    throw InputError(dir +
                     "/manifest.json: $.model: the checkpoint was written for another model than " +
                     model_source + what);
  }
  if (m.seed != seed)
    throw InputError(dir + "/manifest.json: $.seed: expected the run's --seed " +
                     std::to_string(seed) + ", found " + std::to_string(m.seed));
}

void warn_unused_dp_state(const stages::Manifest& m, const std::string& dir, bool local_sgd,
                          bool parameter_server) {
  if (!m.train.is_object()) return;
  if (m.train.contains("local_sgd") && !local_sgd)
    spdlog::warn(
        "{}/manifest.json: $.train.local_sgd: the checkpoint holds each replica's own "
        "parameters (local SGD's or gossip's, with local SGD's anchor and outer momentum), "
        "which this run does not use: it continues from the first replica's parameters",
        dir);
  if (m.train.contains("parameter_server") && !parameter_server)
    spdlog::warn(
        "{}/manifest.json: $.train.parameter_server: the checkpoint holds a parameter server's "
        "pulls in flight, which this run does not use: it continues from the replicas' working "
        "parameters, behind the servers' by the staleness",
        dir);
}

std::string plan_optimizer_name(const LoopOptions& o) {
  return o.optimizer.kind == stages::OptimizerConfig::Kind::adamw ? "adamw"
         : o.optimizer.sgd.momentum > 0                           ? "sgd-momentum"
                                                                  : "sgd";
}

int64_t batchnorm_samples(const stages::Graph& g, int64_t samples) {
  for (const stages::Node& n : g.nodes)
    if (n.op == "batchnorm2d") return samples;
  return 0;
}

void warn_resume_changes(const stages::Manifest& m, const std::string& dir,
                         const nlohmann::json& data, const LoopOptions& o, int64_t batch,
                         int64_t batchnorm_samples) {
  // Data paths, shown even where they are not UTF-8 (nlohmann's dump throws on those).
  auto text_of = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  // --steps is the run's total: a checkpoint past it leaves nothing to train (the run had
  // ended at once, exit 0, without a word).
  if (m.step > o.steps)
    spdlog::warn(
        "{}: the checkpoint is at step {}, past --steps {} (the run's total steps, not the "
        "steps to add): nothing is trained; give --steps above {} to continue",
        dir, m.step, o.steps, m.step);
  // Samples per step change every step's gradient (micro-batches do not: they sum to the
  // same batch, but for batch norm, which normalises each micro-batch on its own).
  if (m.train.is_object() && m.train.contains("batch")) {
    // A batch that is no count ("two", 4.5) had skipped this warning without a word.
    const nlohmann::json& b = m.train.at("batch");
    if (!b.is_number_integer() || b.get<int64_t>() < 1)
      throw InputError(dir +
                       "/manifest.json: $.train.batch: expected the samples a step (an integer "
                       ">= 1), found " +
                       memory::json_brief(b));
    if (b.get<int64_t>() != batch)
      spdlog::warn(
          "{}/manifest.json: $.train.batch: the checkpoint's run took {} samples a step; "
          "continuing with {} (the loss curve is not the uninterrupted run's)",
          dir, b.get<int64_t>(), batch);
    // Checkpoints before the field was written: batch / micro-batches, no sync_batchnorm.
    const nlohmann::json* was = nullptr;
    nlohmann::json derived;
    if (m.train.contains("batchnorm_samples")) {
      was = &m.train.at("batchnorm_samples");
    } else if (m.train.contains("micro_batches") && m.train["micro_batches"].is_number_integer() &&
               m.train["micro_batches"].get<int64_t>() > 0) {
      derived = b.get<int64_t>() / m.train["micro_batches"].get<int64_t>();
      was = &derived;
    }
    if (batchnorm_samples > 0 && was != nullptr && was->is_number_integer() &&
        was->get<int64_t>() != batchnorm_samples)
      spdlog::warn(
          "{}/manifest.json: $.train: the checkpoint's run normalised each batch norm over {} "
          "samples; this run over {} (other micro-batches: the statistics, the running "
          "averages and the loss curve are not the uninterrupted run's)",
          dir, was->get<int64_t>(), batchnorm_samples);
  }
  // A constant rate (after its warm-up) does not depend on the run's length (and older
  // manifests gave it a decay and a floor).
  auto curve = [](nlohmann::json j) {
    if (j.is_object() && j.value("kind", "") == "constant") {
      j.erase("total");
      j.erase("decay");
      j.erase("min_lr");
    }
    return j;
  };
  const nlohmann::json mine = lr_schedule_of(o).to_json();
  if (m.train.is_object() && m.train.contains("lr_schedule") &&
      curve(m.train["lr_schedule"]) != curve(mine))
    spdlog::warn(
        "{}/manifest.json: $.train.lr_schedule: the checkpoint's schedule was {}; continuing "
        "under {}",
        dir, m.train["lr_schedule"].dump(), mine.dump());
  // The optimizer's settings travel with its state: the checkpoint's continue, whatever
  // the flags say (the rate aside: the schedule above sets it).
  auto settings = [](nlohmann::json j) {
    j.erase("lr");
    return j;
  };
  if (settings(m.optimizer.to_json()) != settings(o.optimizer.to_json()))
    spdlog::warn(
        "{}/manifest.json: $.optimizer: the checkpoint's optimizer {} continues with its state; "
        "this run's settings {} are not used",
        dir, settings(m.optimizer.to_json()).dump(), settings(o.optimizer.to_json()).dump());
  if (m.train.is_object() && m.train.contains("grad_clip") && m.train["grad_clip"].is_number() &&
      m.train["grad_clip"].get<double>() != o.grad_clip)
    spdlog::warn(
        "{}/manifest.json: $.train.grad_clip: the checkpoint's run clipped at {}; "
        "continuing with --grad-clip {}",
        dir, m.train["grad_clip"].get<double>(), o.grad_clip);
  // The training data (held-out data does not change the training curve).
  if (m.data.is_object() && m.data.contains("train") && data.contains("train") &&
      comparable_data(m.data["train"], has_fingerprint(m.data["train"])) !=
          comparable_data(data["train"], has_fingerprint(m.data["train"])))
    spdlog::warn(
        "{}/manifest.json: $.data.train: the checkpoint was written for {}; continuing with {}",
        dir, text_of(m.data["train"]), text_of(data["train"]));
  // The held-out data and batches: the held-out losses after the resume are of others.
  const nlohmann::json no_eval;
  const nlohmann::json& was_eval =
      m.data.is_object() && m.data.contains("eval") ? m.data["eval"] : no_eval;
  const nlohmann::json& now_eval = data.contains("eval") ? data["eval"] : no_eval;
  if (!was_eval.is_null() && !now_eval.is_null() &&
      comparable_data(was_eval, has_fingerprint(was_eval)) !=
          comparable_data(now_eval, has_fingerprint(was_eval)))
    spdlog::warn(
        "{}/manifest.json: $.data.eval: the checkpoint's run held out {}; continuing with {} (the "
        "held-out losses before and after the resume are of different data)",
        dir, text_of(was_eval), text_of(now_eval));
  if (m.train.is_object() && m.train.contains("eval_batches") &&
      m.train["eval_batches"].is_number_integer() && !now_eval.is_null() &&
      m.train["eval_batches"].get<int64_t>() != o.eval_batches)
    spdlog::warn(
        "{}/manifest.json: $.train.eval_batches: the checkpoint's run averaged {} held-out "
        "batches; continuing with --eval-batches {} (the held-out losses before and after the "
        "resume are of different batches)",
        dir, m.train["eval_batches"].get<int64_t>(), o.eval_batches);
  // Image checkpoints before "train" recorded the directory and image count beside the
  // position: those two are compared.
  if (m.data.is_object() && !m.data.contains("train") && m.data.contains("dir") &&
      data.contains("train") && data["train"].contains("dir")) {
    const nlohmann::json was = {{"dir", m.data["dir"]}, {"images", m.data.value("images", 0)}};
    const nlohmann::json now = {{"dir", data["train"]["dir"]}, {"images", data["train"]["images"]}};
    if (comparable_data(was, false) != comparable_data(now, false))
      spdlog::warn(
          "{}/manifest.json: $.data: the checkpoint was written for {}; continuing with {}", dir,
          text_of(was), text_of(now));
  }
}

LossLog::LossLog(const std::string& path, int64_t start, bool restorable) {
  if (path.empty()) return;
  std::string keep;
  // Only a regular file is read back and trimmed: a pipe, FIFO or terminal (`--loss-log
  // /dev/stdout | cat`) would block the read on the run's own output, so it is appended to.
  // A descriptor is the shell's redirection: read back and renamed over, its file had
  // lost its other output or taken the kept lines twice.
  given_fd_ = memory::descriptor_of(path);
  struct stat st;
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (!exists && errno != ENOENT)
    throw InputError(path + ": cannot read the loss log (--loss-log): " + std::strerror(errno));
  const bool regular = given_fd_ < 0 && exists && S_ISREG(st.st_mode);
  if (start > 0 && regular) {
    // A log that cannot be read is an error, not an empty one: rewriting it lost its steps.
    std::ifstream old(path);
    if (!old)
      throw InputError(
          path + ": cannot read the loss log to resume it (--loss-log): " + std::strerror(errno));
    std::string line;
    int64_t last = -1;  // the last step kept
    // A line that is no step's record: only the last one may be, cut short by a kill while
    // it was written; another (a damaged log, or a file that is no loss log) stops the
    // resume, since rewriting the log up to the checkpoint would delete it.
    int64_t number = 0, bad = 0;
    std::string bad_line;
    while (std::getline(old, line)) {
      ++number;
      // A blank line (an editor's last newline) holds no record to lose: left out.
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      const bool record =
          !j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer();
      if (bad > 0)
        throw InputError(path + ":" + std::to_string(bad) +
                         ": not a loss-log line (expected a JSON object with an integer "
                         "\"step\"), found " +
                         memory::json_brief(nlohmann::json(bad_line)) +
                         "; --resume rewrites the log up to the checkpoint's step and would "
                         "delete it: repair the line or give another --loss-log");
      if (!record) {
        bad = number;
        bad_line = line;
        continue;
      }
      if (j["step"].get<int64_t>() <= start) {
        keep += line + "\n";
        last = j["step"].get<int64_t>();
      }
    }
    if (old.bad())
      throw InputError(
          path + ": cannot read the loss log to resume it (--loss-log): " + std::strerror(errno));
    if (bad > 0)
      spdlog::warn(
          "{}:{}: the loss log's last line is no step's record (cut short while it was "
          "written?): dropped",
          path, bad);
    // A run stopped during the evaluation that follows a checkpoint (written first) had
    // not written that step's line: restored from the checkpoint's record where it has
    // one (run_loop), said otherwise.
    lacks_start_ = last == start - 1;
    holds_start_ = last == start;
    const int64_t from = std::max<int64_t>(last + 1, 1), to = restorable ? start - 1 : start;
    if (last < start && !(lacks_start_ && restorable) && from <= to)
      spdlog::warn(
          "{}: the loss log {}, before the checkpoint's step {} ({}): the log goes on "
          "without steps {}..{}",
          path, last >= 0 ? "ends at step " + std::to_string(last) : std::string("has no step"),
          start,
          bad > 0        ? "its last line cut short"
          : lacks_start_ ? "the run stopped between the checkpoint and the step's line, "
                           "during its evaluation"
          : last < 0     ? "an empty log, or another run's"
                         : "cut short, or another run's log",
          from, to);
  }
  path_ = path;
  keep_ = std::move(keep);
  replace_ = given_fd_ < 0 && (!exists || regular);
  // A resumed run's log holds its steps up to the checkpoint from now on (what it held
  // beyond is a crashed run's); a new run's replaces the previous log at its first line,
  // so that a run refused before any step (a bad token in its data) leaves it whole.
  if (start > 0) open();
}

LossLog::~LossLog() {
  if (fd_ >= 0) ::close(fd_);
}

void LossLog::open() {
  // The steps up to the checkpoint replace the log in one rename, then the run appends: a
  // run killed right after resuming (before its first step) keeps them. Truncating and
  // rewriting in place lost them (a restart test's third kill found the log empty).
  if (replace_) {
    try {
      memory::write_file_durably(path_, keep_);
    } catch (const InputError& e) {
      throw InputError(path_ + ": cannot open for writing (--loss-log): " + e.what());
    }
  }
  struct stat st;
  if (given_fd_ < 0 && ::stat(path_.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) {
    // A FIFO waits for its reader, but not past a stop signal: opened blocking, a run
    // told to stop had hung in the open, its checkpoint never written.
    bool said = false;
    while ((fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0 && errno == ENXIO) {
      if (stop_signal_received() != 0) {
        spdlog::warn("{}: no reader of the loss log (a FIFO) before the stop: its lines are lost",
                     path_);
        path_.clear();
        return;
      }
      if (!said) spdlog::warn("{}: waiting for a reader of the loss log (a FIFO)", path_);
      said = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (fd_ >= 0) ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  } else {
    fd_ = given_fd_ >= 0 ? ::fcntl(given_fd_, F_DUPFD_CLOEXEC, 0)
                         : ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  }
  if (fd_ < 0)
    throw InputError(path_ + ": cannot open for writing (--loss-log): " + std::strerror(errno));
}

void LossLog::write(const StepRecord& r) {
  if (path_.empty()) return;
  if (fd_ < 0) open();
  if (fd_ < 0) return;  // a FIFO no reader opened before a stop
  char buf[320];
  // A skipped step's norm is inf or NaN, which JSON cannot say: null (a held-out loss
  // too: "-nan" had made the line no JSON).
  char norm[32] = "null", loss[32] = "null", eval[32] = "null";
  if (std::isfinite(r.grad_norm)) std::snprintf(norm, sizeof norm, "%.17g", r.grad_norm);
  if (std::isfinite(r.loss)) std::snprintf(loss, sizeof loss, "%.17g", r.loss);
  if (r.eval_loss && std::isfinite(*r.eval_loss))
    std::snprintf(eval, sizeof eval, "%.17g", *r.eval_loss);
  int n = std::snprintf(buf, sizeof buf,
                        "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %.17g",
                        static_cast<long long>(r.step), loss, norm, r.lr);
  if (r.eval_loss) n += std::snprintf(buf + n, sizeof buf - size_t(n), ", \"eval_loss\": %s", eval);
  // Under loss scaling every line says whether its step was skipped; without it only a
  // skipped step does (a non-finite gradient), so the usual line stays as it was.
  if (r.loss_scale > 0)
    std::snprintf(buf + n, sizeof buf - size_t(n), ", \"loss_scale\": %.17g, \"skipped\": %s",
                  r.loss_scale, r.skipped ? "true" : "false");
  else if (r.skipped)
    std::snprintf(buf + n, sizeof buf - size_t(n), ", \"skipped\": true");
  std::string line = std::string(buf) + "}\n";
  // Whole, in as many writes as it takes (a pipe may take part of it). A full disk or a
  // closed pipe: said, not a run that ends well with its log empty.
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    // Its reader gone, where that stops the run after this step (on_broken_pipe), or where
    // a stop was asked already (Ctrl-C reaches `| cat` too): the log ends here, and the
    // run saves its checkpoint.
    if (w < 0 && errno == EPIPE && stop_signal_received() != 0) {
      ::close(fd_);
      fd_ = -1;
      path_.clear();
      return;
    }
    if (w <= 0)
      throw RuntimeError(path_ + ": cannot write the loss log (--loss-log): " +
                         std::strerror(w < 0 ? errno : ENOSPC));
    done += size_t(w);
  }
}

nlohmann::json step_record_json(const StepRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"grad_norm", r.grad_norm},
                      {"lr", r.lr},
                      {"loss_scale", r.loss_scale},
                      {"skipped", r.skipped}};
  // JSON has no inf or NaN (a skipped step's norm): null, read back as NaN.
  for (const char* k : {"loss", "grad_norm"})
    if (!std::isfinite(j[k].get<double>())) j[k] = nullptr;
  return j;
}

namespace {
std::atomic<bool> g_watching{false};  // watch_stop_signals() ran: the signals are the watcher's
std::atomic<bool> g_graceful{false};  // a run_loop with stop_on_signal runs
std::atomic<int> g_stop_signal{0};    // the signal it was asked to stop by, or 0
std::atomic<const char*> g_said{nullptr};  // StopSignals' `said`
std::atomic<int64_t> g_first_ns{0};        // when the stop signal (or SIGPIPE's stop) came
std::atomic<bool> g_ran{false};            // a graceful loop has ended in this process

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A line on standard error from the signal watcher, only where it can be written without
// waiting: through spdlog it had waited on the console's lock, held by a thread blocked on
// a stalled reader (a paused terminal, a pager), and then no signal could end the run.
void say_now(const std::string& line) {
  const std::string text = "baton: " + line + "\n";
  pollfd p{STDERR_FILENO, POLLOUT, 0};
  if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) != 0)
    (void)!::write(STDERR_FILENO, text.data(), text.size());
}

// The one thread that receives SIGTERM and SIGINT (blocked in every other): while a loop
// runs gracefully the first asks it to stop and a repeat within a second is the same one
// (`baton launch` signals a rank and its process group); otherwise the signal's default
// action ends the process, as it would have without the watcher.
[[noreturn]] void watch_signals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    const int64_t now = monotonic_ns();
    const char* said = g_said.load();
    if (g_graceful.load() && g_stop_signal.load() == 0) {
      g_first_ns.store(now);
      g_stop_signal.store(sig);
      if (said != nullptr) say_now("got " + signal_text(sig) + ": " + said);
      continue;
    }
    if (g_stop_signal.load() != 0 && now - g_first_ns.load() < 1000000000) continue;
    if (g_graceful.load() && said != nullptr)
      say_now("got " + signal_text(sig) +
              (g_stop_signal.load() == SIGPIPE ? " after the output was closed" : " again") +
              ": ending now, the step unfinished and no checkpoint written");
    // What the command was writing is not left half-written (train-tokenizer's
    // temporaries, an export's staging directory). remove_on_stop keeps its registry
    // locked: the command cannot go on past what was removed before the process ends.
    if (const auto removed = memory::remove_on_stop(true); !removed.empty()) {
      std::string list;
      for (const std::string& p : removed) list += (list.empty() ? "" : ", ") + p;
      say_now("got " + signal_text(sig) + ": ending now; removed what was being written: " + list);
    }
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);  // this thread's now: the default action ends the process
  }
}

// SIGPIPE comes from a write whose reader has gone (`baton train | head`), on the thread
// that wrote, never in the middle of a kernel: a handler is safe here. Inside a graceful
// loop the run stops after its step, with its checkpoint, as `baton launch` stops a job
// whose output was closed (it had died at once, its steps since the last checkpoint
// lost); outside one, the default action, as without the handler.
void on_broken_pipe(int) {
  int none = 0;
  if (g_graceful.load()) {
    // The window for a repeat starts here too: a later single signal had read as the
    // second and killed the run mid-step.
    if (g_stop_signal.compare_exchange_strong(none, SIGPIPE)) g_first_ns.store(monotonic_ns());
    return;
  }
  // After the loop (its closing lines, the summary still to write): ignored, the writes
  // failing instead; the run had died before writing its --summary.
  if (g_ran.load()) return;
  ::signal(SIGPIPE, SIG_DFL);
  ::raise(SIGPIPE);  // pending until this handler returns, then the default action
}

}  // namespace

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

StopSignals::StopSignals(bool on, const char* said) : on_(on && g_watching.load()) {
  if (!on_) return;
  g_stop_signal.store(0);  // an earlier run's in this process is not this one's
  g_said.store(said);
  g_graceful.store(true);
}

StopSignals::~StopSignals() {
  if (!on_) return;
  g_ran.store(true);
  g_graceful.store(false);
  g_said.store(nullptr);
}

int StopSignals::received() const {
  return on_ ? g_stop_signal.load() : 0;
}

void watch_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old {};
    // One the process was started ignoring (nohup, a shell's trap '') stays ignored.
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;
  std::thread(watch_signals, set).detach();
  g_watching.store(true);
  struct sigaction pipe {};
  if (::sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_DFL) {
    pipe.sa_handler = on_broken_pipe;
    sigemptyset(&pipe.sa_mask);
    pipe.sa_flags = SA_RESTART;
    ::sigaction(SIGPIPE, &pipe, nullptr);
  }
}

int stop_signal_received() {
  return g_stop_signal.load();
}

nlohmann::json pending_step_of(const stages::Manifest& m) {
  if (!m.train.is_object() || !m.train.contains("pending_step")) return nullptr;
  return m.train["pending_step"];
}

StepRecord step_record_from_json(const nlohmann::json& j) {
  const auto number = [&](const char* k) {
    return j.at(k).is_null() ? std::numeric_limits<double>::quiet_NaN() : j.at(k).get<double>();
  };
  StepRecord r;
  r.step = j.at("step").get<int64_t>();
  r.loss = number("loss");
  r.grad_norm = number("grad_norm");
  r.lr = j.at("lr").get<double>();
  r.loss_scale = j.at("loss_scale").get<double>();
  r.skipped = j.at("skipped").get<bool>();
  return r;
}

TrainSummary run_loop(const LoopOptions& o, int64_t start, int64_t tokens_per_step, bool lead,
                      const LoopSteps& steps,
                      const std::function<void(const StepRecord&)>& on_step) {
  TrainSummary summary;
  summary.first_step = start;
  std::optional<StepRecord> pending;  // the checkpoint's step, its line after the checkpoint
  if (steps.resumed_pending.is_object() && start > 0) {
    try {
      pending = step_record_from_json(steps.resumed_pending);
    } catch (const nlohmann::json::exception& e) {
      throw InputError("the checkpoint's manifest: $.train.pending_step: " + std::string(e.what()));
    }
    if (pending->step != start) pending.reset();
  }
  LossLog loss_log(lead ? o.loss_log : std::string(), start, pending.has_value());
  const StopSignals stop_signals(
      o.stop_on_signal,
      !lead ? nullptr
      : o.checkpoint_dir.empty()
          ? "the run stops after this step (no --checkpoint-dir: nothing is saved); a second "
            "signal a second or more later ends it at once"
          : "the run stops after this step and writes a checkpoint; a second signal a second "
            "or more later ends it at once, without one");
  if (pending) {
    // Every rank evaluates the checkpoint's weights again (a collective under a plan), as
    // the run did after writing it: the held-out loss is the one it lost.
    // Not where the lead's log holds the line already (every rank learns it: the
    // evaluation is a collective): each resume from a run's last checkpoint had evaluated
    // it again. Without a log read back (none, a pipe, a new path) the evaluation is this
    // run's to report: in the summary, and a log line where there is a log.
    int lacks = lead && !loss_log.holds_start() ? 1 : 0;
    if (steps.max_over_ranks) lacks = steps.max_over_ranks(lacks);
    if (lacks != 0) {
      if (steps.evaluate && eval_due(o, pending->step)) {
        pending->eval_loss = steps.evaluate();
        summary.evaluations.emplace_back(pending->step, *pending->eval_loss);
      }
      if (lead) loss_log.write(*pending);
    }
  }
  const stages::LrSchedule schedule = lr_schedule_of(o);
  // The time left: the wall clock since the first iteration (the warm-up, which the summary's
  // rate leaves out too) over the steps since, evaluations and checkpoints included.
  std::chrono::steady_clock::time_point warm{};
  bool data_checked = steps.data_check == nullptr;
  auto check_data = [&](bool wait) {
    if (data_checked) return;
    if (wait) steps.data_check->wait();
    if (!steps.data_check->done()) return;
    data_checked = true;
    if (lead)
      spdlog::info(
          "vocabulary check: all {} tokens of the data are below the model's vocabulary of {} "
          "(checked in {:.3f} s, in the background)",
          steps.data_check->tokens(), steps.data_check->vocab(), steps.data_check->seconds());
  };
  for (int64_t step = start; step < o.steps; ++step) {
    if (step == start + 1) warm = std::chrono::steady_clock::now();
    // The rate is a pure function of the step: a resumed run continues the curve.
    const double lr = schedule.at(step + 1);
    if (steps.set_lr) steps.set_lr(lr);
    StepRecord rec = steps.step(step);
    rec.lr = lr;
    // A loss scaler's skips are its routine (the loss log and the summary count them); a
    // non-finite gradient without one is news. Said here for every trainer alike.
    // A loss that is not finite stops the run (exit 1), after its line in the loss log:
    // nothing after it would train.
    if (!std::isfinite(rec.loss)) {
      loss_log.write(rec);
      throw RuntimeError(
          fmt::format("loss is {} at step {}: the run stops (a lower --lr, "
                      "--grad-clip or the data may be the cause)",
                      std::isnan(rec.loss) ? "nan"
                      : rec.loss > 0       ? "inf"
                                           : "-inf",
                      rec.step));
    }
    // A stop signal ends the run after this step, on every rank after the same one.
    int stop = stop_signals.received();
    if (steps.max_over_ranks) stop = steps.max_over_ranks(stop);
    if (rec.skipped && rec.loss_scale <= 0 && lead)
      spdlog::warn("step {}: the gradient norm is {}; the optimizer step is skipped", rec.step,
                   std::isnan(rec.grad_norm) ? "nan" : fmt::format("{}", rec.grad_norm));
    check_data(false);
    const bool eval = steps.evaluate && eval_due(o, rec.step);
    std::string written;
    auto checkpoint = [&](const nlohmann::json& pending_line) {
      check_data(true);  // no checkpoint of a run whose data holds a bad token
      written = steps.checkpoint(rec.step, pending_line);
      summary.last_checkpoint = written;
    };
    // A due checkpoint comes before the step's evaluation: an evaluation that failed (its
    // held-out data truncated under the run) had lost it, at the end of a run its last.
    // Without one it comes after the step's loss-log line, which a resumed run then finds.
    const bool save = checkpoint_due(o, rec.step) || (stop != 0 && !o.checkpoint_dir.empty());
    // (checkpoint_due holds at the last step: a stop there changes nothing.)
    if (save && eval) checkpoint(step_record_json(rec));
    if (eval) {
      try {
        rec.eval_loss = steps.evaluate();
      } catch (...) {
        // With the step's checkpoint written, no line: a resume from it finds the log one
        // short, evaluates again and writes the line whole (a line without the held-out
        // loss had been kept, and the loss lost for good: a peer killed during the
        // evaluation, then --max-restarts). Without one, the line for the record.
        if (written.empty()) try {
            loss_log.write(rec);
          } catch (...) {
            // A log that cannot be written: the evaluation's error is the one reported.
          }
        throw;
      }
    }
    if (o.keep_records) summary.records.push_back(rec);
    if (summary.steps_run++ == 0)
      summary.first = rec;
    else if (rec.seconds > 0)
      summary.step_seconds.add(rec.seconds);
    summary.last = rec;
    if (rec.eval_loss) summary.evaluations.emplace_back(rec.step, *rec.eval_loss);
    summary.skipped_steps += rec.skipped ? 1 : 0;
    loss_log.write(rec);
    if (lead && ((o.log_every > 0 &&
                  (rec.step % o.log_every == 0 || rec.step == o.steps || step == start)) ||
                 eval))
      spdlog::info(
          "step {:>6}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f}{} | {:>8.0f} {} | "
          "{:.1f} ms/step{}",
          rec.step, o.steps, rec.loss,
          rec.eval_loss ? fmt::format(" | val loss {:.4f}", *rec.eval_loss) : std::string(), lr,
          rec.grad_norm,
          rec.loss_scale > 0 ? fmt::format(" | loss scale {:g}{}", rec.loss_scale,
                                           rec.skipped ? " | SKIPPED (gradient overflow)" : "")
          : rec.skipped      ? std::string(" | SKIPPED (non-finite gradient)")
                             : std::string(),
          double(tokens_per_step) / rec.seconds, steps.rate_unit, rec.seconds * 1e3,
          step == start ? std::string()
                        : " | " +
                              duration_str(std::chrono::duration<double>(
                                               std::chrono::steady_clock::now() - warm)
                                               .count() /
                                           double(step - start) * double(o.steps - rec.step)) +
                              " left");
    // Before the checkpoint: a launcher told of the step (cmd_train's progress) names it
    // when that checkpoint fails ("after step N" had named the step before).
    if (on_step) on_step(rec);
    if (save && !eval) checkpoint(nullptr);
    if (lead && !written.empty()) spdlog::info("checkpoint {}", written);
    if (stop != 0 && rec.step < o.steps) {  // at the last step the run is done: no stop
      summary.stopped_by = stop;
      if (lead)
        spdlog::warn("stopped by {}{} after step {} of {}{}", signal_text(stop),
                     stop == SIGPIPE ? " (its output was closed)" : "", rec.step, o.steps,
                     written.empty() ? std::string("; no checkpoint (no --checkpoint-dir)")
                                     : "; --resume continues from " + written);
      break;
    }
  }
  // A run of no steps with a checkpoint directory writes its initial weights as step 0:
  // the way to export them, or to start an outside reference from them.
  // With held-out data it evaluates them: the held-out loss before training (a run of no
  // steps had evaluated nothing, without a word).
  if (o.steps == 0 && start == 0 && steps.evaluate) {
    const double loss = steps.evaluate();
    summary.evaluations.emplace_back(0, loss);
    if (lead) spdlog::info("step      0/0 | val loss {:.4f} (the initial weights)", loss);
  }
  if (o.steps == 0 && start == 0 && !o.checkpoint_dir.empty()) {
    check_data(true);
    summary.last_checkpoint = steps.checkpoint(0, nullptr);
    if (lead) spdlog::info("checkpoint {} (the initial weights)", summary.last_checkpoint);
  }
  check_data(true);
  return summary;
}

void prepare_device(const LoopOptions& o) {
  memory::cuda::require_device(o.device);
  kernels::check_precision(o.precision, o.device);
#ifdef BATON_HAVE_CUDA
  if (o.device.is_cuda()) kernels::cuda::set_allow_tf32(o.precision == kernels::Precision::tf32);
#endif
}

std::unique_ptr<kernels::LossScaler> make_loss_scaler(const LoopOptions& o) {
  if (o.loss_scaling) return std::make_unique<kernels::LossScaler>(*o.loss_scaling);
  if (kernels::needs_loss_scaling(o.precision)) return std::make_unique<kernels::LossScaler>();
  return nullptr;
}

UpdateDecision decide_update(double sum_squares, double grad_clip, kernels::LossScaler* scaler) {
  UpdateDecision d;
  const double carried = scaler ? scaler->scale() : 0.0;
  const kernels::ClipDecision c = kernels::clip_decision(sum_squares, grad_clip, carried);
  if (scaler) {
    d.loss_scale = carried;
    scaler->update(!c.apply);
  }
  d.grad_norm = c.grad_norm;
  d.apply = c.apply;
  d.grad_scale = c.grad_scale;
  return d;
}

void save_loss_scale(stages::Manifest& m, const kernels::LossScaler* scaler) {
  if (!scaler) return;
  m.train["loss_scale"] = {{"scale", scaler->scale()}, {"good_steps", scaler->good_steps()}};
}

void restore_loss_scale(const stages::Manifest& m, kernels::LossScaler* scaler) {
  if (!scaler || !m.train.is_object() || !m.train.contains("loss_scale")) return;
  const nlohmann::json& j = m.train.at("loss_scale");
  if (!j.is_object() || !j.contains("scale") || !j["scale"].is_number() ||
      !(j["scale"].get<double>() > 0) || !j.contains("good_steps") ||
      !j["good_steps"].is_number_integer())
    throw InputError(
        "checkpoint manifest: $.train.loss_scale: expected {\"scale\": a positive "
        "number, \"good_steps\": an integer}, found " +
        j.dump());
  scaler->restore(j["scale"].get<double>(), j["good_steps"].get<int64_t>());
}

void log_resume(const std::optional<std::string>& dir, int64_t step, const std::string& root) {
  if (dir)
    spdlog::info("resumed from {} (step {})", *dir, step);
  else
    spdlog::info("no complete checkpoint in {}; starting from step 0", root);
}

void refuse_unusable_checkpoints(const std::string& root) {
  if (stages::newest_written_checkpoint(root))
    throw InputError("--resume: no checkpoint in " + root + " is complete and undamaged (" +
                     stages::unusable_newest(root) +
                     "); starting over would write over them: move them away, or give another "
                     "--checkpoint-dir");
}

nlohmann::json summary_json(const LoopOptions& o, const TrainSummary& s, int64_t tokens_per_step,
                            const std::vector<RankPeak>& ranks, const std::string& schedule,
                            const std::string& plan) {
  using nlohmann::json;
  auto text_or_null = [](const std::string& t) { return t.empty() ? json(nullptr) : json(t); };
  json j = json::object();
  j["format"] = kSummaryFormat;
  j["version"] = kSummaryVersion;
  j["first_step"] = s.first_step;
  j["steps_run"] = s.steps_run;
  j["last_step"] = s.first_step + s.steps_run;
  j["first_loss"] = s.first ? json(s.first->loss) : json(nullptr);
  j["last_loss"] = s.last ? json(s.last->loss) : json(nullptr);
  j["loss_log"] = text_or_null(o.loss_log);
  j["lr_schedule"] = lr_schedule_of(o).to_json();
  j["last_lr"] = s.last ? json(s.last->lr) : json(nullptr);
  json evals = json::array();
  for (const auto& [step, loss] : s.evaluations) evals.push_back({{"step", step}, {"loss", loss}});
  j["evaluations"] = evals;
  j["last_eval_loss"] = evals.empty() ? json(nullptr) : evals.back()["loss"];
  j["tokens_per_step"] = tokens_per_step;
  j["tokens_per_second"] = median_tokens_per_second(s, tokens_per_step);
  json list = json::array();
  for (const RankPeak& r : ranks) {
    json e = {{"rank", r.rank}, {"peak_bytes", r.peak_bytes}};
    e["estimated_peak_bytes"] =
        r.estimated_peak_bytes >= 0 ? json(r.estimated_peak_bytes) : json(nullptr);
    list.push_back(e);
  }
  j["ranks"] = list;
  j["schedule"] = text_or_null(schedule);
  j["plan"] = text_or_null(plan);
  j["last_checkpoint"] = text_or_null(s.last_checkpoint);
  j["stopped_by"] = s.stopped_by != 0 ? json(signal_text(s.stopped_by)) : json(nullptr);
  j["device"] = o.device.str();
  j["precision"] = std::string(kernels::precision_name(o.precision));
  j["skipped_steps"] = s.skipped_steps;
  return j;
}

void write_summary(const std::string& path, const nlohmann::json& summary) {
  // Its paths are UTF-8 (baton train refuses others); one that is not shows as U+FFFD
  // rather than throw nlohmann's raw type_error at the end of the run.
  memory::write_file_durably(
      path, summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  spdlog::info("summary written to {}", path);
}

void StepTimes::add(double seconds) {
  if (seen_++ % stride_ != 0) return;
  kept_.push_back(seconds);
  if (kept_.size() < kCapacity) return;
  // Full: keep every other one (those of steps 0, 2s, 4s, ...) and take every 2s-th on.
  for (size_t i = 0; 2 * i < kept_.size(); ++i) kept_[i] = kept_[2 * i];
  kept_.resize(kept_.size() / 2);
  stride_ *= 2;
}

double median_tokens_per_second(const TrainSummary& s, int64_t tokens_per_step) {
  std::vector<double> rates;
  for (double seconds : s.step_seconds.kept()) rates.push_back(double(tokens_per_step) / seconds);
  if (rates.empty()) return 0;
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  return n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
}

}  // namespace baton::engine
