#include "engine/plan_trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "engine/detail/grad_reducer.h"
#include "engine/detail/host_agreement.h"
#include "engine/detail/local_sgd.h"
#include "engine/detail/param_server.h"
#include "engine/rank_engine.h"
#include "memory/file_io.h"
#include "memory/units.h"
#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"
#include "partitioner/groups.h"
#include "schedule/schedule_io.h"
#include "schedule/timeline.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/hf.h"
#include "stages/image_data.h"
#include "stages/json_reader.h"
#include "stages/safetensors.h"
#include "transport/launch.h"
#include "transport/world.h"

namespace baton::engine {

using memory::Tensor;
using partitioner::Plan;
using partitioner::ResolvedPlan;
using transport::Communicator;

namespace {

// ---- small collectives over the world ----

// Every rank's number, on every rank.
std::vector<int64_t> all_gather_int(Communicator& c, int64_t mine) {
  Tensor one = Tensor::from_vector(std::vector<int64_t>{mine}, {1});
  Tensor all = Tensor::empty({c.size()}, memory::DType::i64);
  c.all_gather(one, all)->wait();
  return all.to_vector<int64_t>();
}

// The time origin of a --trace, in steady_clock seconds: after a barrier, the earliest
// moment a rank of this host left it. Ranks sharing a host share steady_clock, so their
// events line up (each rank's own exit, up to a time slice apart when ranks outnumber the
// cores, had put receives before their sends); another host's clock is its own.
double host_trace_origin(Communicator& world) {
  world.barrier()->wait();
  const int64_t mine = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
  // The transport's identity of a host (name, boot, network namespace): two machines of
  // one name had shared a clock origin.
  const int64_t host = int64_t(std::hash<std::string>{}(transport::host_id()) >> 1);
  const std::vector<int64_t> hosts = all_gather_int(world, host), at = all_gather_int(world, mine);
  int64_t first = mine;
  for (size_t r = 0; r < at.size(); ++r)
    if (hosts[r] == host) first = std::min(first, at[r]);
  return double(first) * 1e-9;
}

// Every rank's string, on every rank.
std::vector<std::string> all_gather_strings(Communicator& c, const std::string& mine) {
  std::vector<int64_t> counts = all_gather_int(c, int64_t(mine.size()));
  int64_t total = 0;
  for (int64_t x : counts) total += x;
  std::vector<int32_t> chars(mine.begin(), mine.end());
  Tensor in = Tensor::from_vector(chars, {int64_t(chars.size())});
  Tensor out = Tensor::empty({total}, memory::DType::i32);
  c.all_gather(in, out, counts)->wait();
  std::vector<int32_t> all = out.to_vector<int32_t>();
  std::vector<std::string> res;
  int64_t off = 0;
  for (int64_t k : counts) {
    std::string s;
    for (int64_t i = 0; i < k; ++i) s.push_back(char(all[size_t(off + i)]));
    res.push_back(std::move(s));
    off += k;
  }
  return res;
}

// The flags every rank of a plan must share (what decides the losses, the data and the
// checkpoints), by the flag that sets them.
nlohmann::json shared_flags(const PlanTrainOptions& o, const ResolvedPlan& r) {
  const stages::DataFlags& d = o.data;
  // The plan by its contents and its model's, not by its path: copies on two hosts under
  // one name, one with other micro-batches, had hung the job in its first step. A hash
  // keeps the message short (every rank runs the same binary).
  nlohmann::json plan = partitioner::plan_to_json(r.plan);
  plan.erase("model");
  const std::string model = r.plan.model_json.is_null()
                                ? memory::read_file(r.plan.model_path_resolved)
                                : r.plan.model_json.dump();
  auto hash = [](const std::string& text) {
    char digest[24];
    std::snprintf(digest, sizeof digest, "%016zx", std::hash<std::string>{}(text));
    return std::string(digest);
  };
  // A --schedule file by its actions too: two hosts' files under one name, 1F1B on one
  // and GPipe on the other, had deadlocked in the first step.
  const nlohmann::json schedule = o.schedule_path.empty()
                                      ? nlohmann::json(o.schedule_path)
                                      : nlohmann::json(o.schedule_path + " (actions' hash " +
                                                       hash(schedule::to_text(r.schedule)) + ")");
  return {{"a plan (--plan's contents and its model's; hash)", hash(plan.dump() + model)},
          {"--data", o.data_path.empty() ? nlohmann::json(d.data) : nlohmann::json(o.data_path)},
          {"--eval-data", d.eval_data},
          {"--eval-fraction", d.eval_fraction},
          {"--data-format", d.format},
          {"--token-dtype", d.token_dtype},
          {"--no-cross-documents", !d.cross_documents},
          {"--steps", o.steps},
          {"--seed", o.seed},
          {"--grad-clip", o.grad_clip},
          {"the optimizer (--optimizer, --lr, --beta1, --beta2, --weight-decay, --momentum)",
           o.optimizer.to_json()},
          {"the learning-rate schedule (--lr-schedule and its flags)", lr_schedule_of(o).to_json()},
          {"--eval-every", o.eval_every},
          {"--eval-batches", o.eval_batches},
          {"--checkpoint-dir", o.checkpoint_dir},
          {"--checkpoint-every", o.checkpoint_every},
          {"--keep-checkpoints", o.keep_checkpoints},
          {"--resume", o.resume},
          {"--precision", std::string(kernels::precision_name(o.precision))},
          {"--init-from", o.init_from},
          {"--schedule", schedule},
          {"--trace-steps", o.trace_path.empty() ? 0 : o.trace_steps},
          // In MiB, as the flag takes it (bytes under its name had read as millions of MiB).
          {"--bucket-mib", double(o.bucket_bytes) / (1 << 20)}};
}

// Every rank compares every rank's shared flags with rank 0's and all fail alike, naming
// the first that differs: a rank started with another --lr or --data trained silently.
void check_ranks_agree(Communicator& world, const PlanTrainOptions& o, const ResolvedPlan& plan) {
  if (world.size() < 2) return;
  const std::vector<std::string> all = all_gather_strings(world, shared_flags(o, plan).dump());
  const nlohmann::json first = nlohmann::json::parse(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const nlohmann::json mine = nlohmann::json::parse(all[r]);
    for (const auto& [flag, value] : first.items())
      if (mine.value(flag, nlohmann::json()) != value)
        throw InputError("rank " + std::to_string(r) + " was started with " + flag + " " +
                         mine.value(flag, nlohmann::json()).dump() + " where rank 0 has " +
                         value.dump() + ": every rank of a plan takes the same training flags");
  }
}

// The files under the paths the ranks agree on must be the same too: one path on two
// hosts that do not share files can hold other data, and the ranks had trained on
// mismatched inputs and targets silently.
void check_same_inputs(Communicator& world, const PlanTrainOptions& o) {
  detail::check_same_contents(
      world, "--data", o.data_path.empty() ? o.data.data : std::vector<std::string>{o.data_path});
  detail::check_same_contents(world, "--eval-data", o.data.eval_data);
  if (!o.init_from.empty()) detail::check_same_contents(world, "--init-from", {o.init_from});
}

int64_t broadcast_int(Communicator& c, int64_t v) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{v}, {1});
  c.broadcast(t, 0)->wait();
  return t.to_vector<int64_t>()[0];
}

nlohmann::json model_json_of(const Plan& p) {
  if (!p.model_path.empty()) return stages::read_json_file(p.model_path_resolved);
  return p.model_json;
}

// LoopSteps::max_over_ranks over the world (servers included): one 8-byte all-reduce.
std::function<int(int)> max_over_ranks(const transport::CommPtr& world) {
  if (world->size() <= 1) return {};
  return [world](int sig) {
    Tensor t = Tensor::from_vector(std::vector<double>{double(sig)}, {1});
    world->all_reduce(t, transport::ReduceOp::max)->wait();
    return int(t.to_vector<double>()[0]);
  };
}

// ---- checkpoints ----

// A parameter's key in the files of a data-parallel mode's own state: "<stage>/<name>".
std::string local_key(const RankEngine& e, int stage, int param) {
  return std::to_string(stage) + "/" + e.graph().params[size_t(param)].name;
}

// The layout a data-parallel mode's own state is read back under (the checkpoint's train
// section records it; local SGD and the parameter server alike): what its keys
// "<stage>/<parameter>" and each rank's file depend on, the stages' ranks (placement),
// directions and layer ranges, the spatial split (it numbers the ranks: a replica's file
// had been read by a tile of another), and not the schedule's name (a --schedule file's
// is its path as typed: ./x.txt and x.txt had dropped the state). The parameter server's
// pulls are in zero1's parts, which the gradient buckets fix: `bucket_bytes` for it, 0
// for local SGD.
nlohmann::json own_state_layout(const ResolvedPlan& r, int64_t bucket_bytes) {
  nlohmann::json j = {{"dp_sync", partitioner::dp_sync_to_json(r.plan.dp_sync)},
                      {"dp", r.plan.dp},
                      {"tp", r.plan.tp},
                      {"placement", r.schedule.placement},
                      {"directions", r.schedule.num_directions},
                      {"chunk_first", r.chunk_first},
                      {"chunk_last", r.chunk_last}};
  if (r.plan.has_spatial()) j["spatial"] = r.plan.spatial;
  if (bucket_bytes > 0) j["bucket_bytes"] = bucket_bytes;
  return j;
}

// The layout as checkpoints before 2026-12-07 recorded it, with the schedule's name for the
// placement: such a checkpoint's state is read back when the name matches, as then.
nlohmann::json legacy_own_state_layout(const ResolvedPlan& r) {
  return {{"dp_sync", partitioner::dp_sync_to_json(r.plan.dp_sync)},
          {"dp", r.plan.dp},
          {"tp", r.plan.tp},
          {"schedule", r.schedule.name},
          {"chunk_first", r.chunk_first},
          {"chunk_last", r.chunk_last}};
}

// Writes this rank's file of a data-parallel mode's own state, "<kind>-rank-<rank>", and
// names it for the manifest.
stages::ShardFile write_own_state(int rank, const std::string& dir, const char* kind,
                                  const std::vector<stages::NamedTensor>& t,
                                  const std::map<std::string, std::string>& metadata) {
  char file[80];
  std::snprintf(file, sizeof file, "%s-rank-%05d.safetensors", kind, rank);
  const std::string path = dir + "/" + file;
  // Per-tensor checksums, as the shards have: a damaged file names its tensor. Staged on
  // the host one tensor at a time, as the shards are.
  const std::string hash = stages::write_checksummed(path, t, metadata);
  stages::ShardFile sf;
  sf.file = file;
  sf.kind = kind;
  sf.rank = rank;
  sf.bytes = uint64_t(std::filesystem::file_size(path));
  sf.hash = hash;
  return sf;
}

// The independent replicas' state (local SGD, gossip; docs/formats/checkpoint.md, kind
// "local-sgd"): one file per rank with local SGD's anchor and momentum of each of its
// parameters and, on replicas other than the
// first (whose parameters and optimizer state the model and optimizer files hold), its
// own parameters and optimizer state, which differ between syncs. Keys
// "<what>/<stage>/<parameter>[/<state>]"; read back only under the same layout.
stages::ShardFile save_local_sgd(RankEngine& e, const std::string& dir) {
  std::vector<stages::NamedTensor> t;
  if (detail::LocalSgd* ls = e.executor().local_sgd())
    for (const detail::LocalSgd::Entry& en : ls->entries()) {
      const std::string key = local_key(e, en.stage, en.param);
      if (en.anchor.defined()) t.push_back({"anchor/" + key, en.anchor});
      if (en.momentum.defined()) t.push_back({"momentum/" + key, en.momentum});
    }
  if (e.view().coord.dp > 0)
    for (const auto& [s, st] : e.stages())
      for (int id : st->param_ids()) {
        const std::string key = local_key(e, s, id);
        t.push_back({"param/" + key, st->param(id)});
        for (const auto& [name, x] : st->optimizer_state(id))
          t.push_back({"state/" + key + "/" + name, x});
      }
  return write_own_state(e.rank(), dir, "local-sgd", t, {{"format", "pt"}});
}

// This rank's shard of `kind` (a data-parallel mode's own state) when the checkpoint's
// train section records it under `key` with this plan's layout; null otherwise.
// Every rank decides alike: the manifest and the layout are the same on each.
const stages::ShardFile* own_state_shard(int rank, const stages::Manifest& m, const char* key,
                                         const ResolvedPlan& r, int64_t bucket_bytes,
                                         const char* kind) {
  if (!m.train.is_object() || !m.train.contains(key)) return nullptr;
  const nlohmann::json& had = m.train[key];
  // Checkpoints before the bucket size was recorded: read as then.
  nlohmann::json unsized = own_state_layout(r, 0);
  if (!had.contains("bucket_bytes")) unsized.erase("bucket_bytes");
  if (had != own_state_layout(r, bucket_bytes) && had != unsized &&
      had != legacy_own_state_layout(r))
    return nullptr;
  for (const stages::ShardFile& f : m.shards)
    if (f.kind == kind && f.rank == rank) return &f;
  return nullptr;
}

// Restores what save_local_sgd wrote for this rank, when the checkpoint has it under the
// same layout; otherwise every replica starts from the checkpoint's parameters (the
// first replica's) as its anchor, with no momentum.
void load_local_sgd(RankEngine& e, const std::string& dir, const stages::Manifest& m, bool lead) {
  detail::LocalSgd* ls = e.executor().local_sgd();
  const stages::ShardFile* mine =
      own_state_shard(e.rank(), m, "local_sgd", e.plan(), 0, "local-sgd");
  if (mine == nullptr) {
    if (lead)
      spdlog::warn(
          "{}/manifest.json: no local SGD state for this plan's layout; every replica resumes "
          "from the checkpoint's parameters, its anchor, with no outer momentum",
          dir);
    return;
  }
  stages::SafetensorsReader f(dir + "/" + mine->file);
  std::vector<detail::LocalSgd::Entry> no_entries;
  auto read_into = [&](const std::string& name, Tensor& out) {
    Tensor x = f.read(name);
    if (x.shape() != out.shape())
      throw InputError(f.path() + ": " + name + " has the wrong shape for this plan");
    out.copy_from(x.to(out.dtype()).to(out.device()));
  };
  for (detail::LocalSgd::Entry& en : ls ? ls->entries() : no_entries) {
    const std::string key = local_key(e, en.stage, en.param);
    const Tensor& p = e.stages().at(en.stage)->param(en.param);
    en.anchor = Tensor::empty(p.shape(), p.dtype(), p.device());
    read_into("anchor/" + key, en.anchor);
    if (ls->config().nesterov && f.find("momentum/" + key)) {
      en.momentum = Tensor::empty(p.shape(), p.dtype(), p.device());
      read_into("momentum/" + key, en.momentum);
    }
  }
  if (e.view().coord.dp > 0)
    for (const auto& [s, st] : e.stages())
      for (int id : st->param_ids()) {
        const std::string key = local_key(e, s, id);
        read_into("param/" + key, st->param(id));
        for (auto& [name, x] : st->optimizer_state(id)) read_into("state/" + key + "/" + name, x);
      }
  if (ls) ls->mark_anchored();
}

// A parameter server's pulls in flight (staleness s > 0; docs/formats/checkpoint.md, kind
// "parameter-server"): one file per rank with, for each in-flight pull (oldest first),
// the rank's part of every sharded parameter, keys "pull/<k>/<stage>/<parameter>". The
// checkpointed parameters are the working (stale) ones; the parts are the newer
// versions, the last the servers' masters. Read back only under the same layout.
stages::ShardFile save_parameter_server(RankEngine& e, const std::string& dir) {
  detail::GradReducer& red = e.executor().reducer();
  const std::vector<std::pair<int, int>> keys = red.stale_params();
  const std::vector<std::vector<Tensor>> parts = red.stale_parts();
  std::vector<stages::NamedTensor> t;
  for (size_t k = 0; k < parts.size(); ++k)
    for (size_t i = 0; i < keys.size(); ++i)
      t.push_back({"pull/" + std::to_string(k) + "/" + local_key(e, keys[i].first, keys[i].second),
                   parts[k][i]});
  return write_own_state(e.rank(), dir, "parameter-server", t,
                         {{"format", "pt"}, {"pulls", std::to_string(parts.size())}});
}

// Posts again the pulls save_parameter_server wrote for this rank, when the checkpoint
// has them under the same layout; otherwise none is in flight (the parameters read are
// the masters too), with a warning.
void load_parameter_server(RankEngine& e, const std::string& dir, const stages::Manifest& m,
                           int64_t bucket_bytes, bool lead) {
  const stages::ShardFile* mine =
      own_state_shard(e.rank(), m, "parameter_server", e.plan(), bucket_bytes, "parameter-server");
  if (mine == nullptr) {
    if (lead)
      spdlog::warn(
          "{}/manifest.json: no parameter-server pulls for this plan's layout (its ranks, "
          "spatial split and --bucket-mib); the replicas resume with none in flight, the "
          "checkpoint's parameters as the servers' masters",
          dir);
    return;
  }
  stages::SafetensorsReader f(dir + "/" + mine->file);
  detail::GradReducer& red = e.executor().reducer();
  const std::vector<std::pair<int, int>> keys = red.stale_params();
  std::vector<std::vector<Tensor>> parts;
  for (size_t k = 0;; ++k) {
    const std::string first = keys.empty() ? std::string()
                                           : "pull/" + std::to_string(k) + "/" +
                                                 local_key(e, keys[0].first, keys[0].second);
    if (keys.empty() || !f.find(first)) break;
    std::vector<Tensor> pull;
    for (const auto& [s, id] : keys) {
      const std::string name = "pull/" + std::to_string(k) + "/" + local_key(e, s, id);
      const Tensor& p = e.stages().at(s)->param(id);
      Tensor x = f.read(name);
      auto [lo, hi] = e.stages().at(s)->optimizer_shard(id);
      if (x.numel() != hi - lo)
        throw InputError(f.path() + ": " + name + " has the wrong size for this plan");
      pull.push_back(x.to(p.dtype()).to(p.device()));
    }
    parts.push_back(std::move(pull));
  }
  red.restore_stale(parts);
}

// The checkpoint after `step` steps: every rank writes its own files (`write_files`, each
// durable before it is reported), then rank 0 the manifest `base` naming them all.
std::string save_files(
    Communicator& world, const PlanTrainOptions& o, const stages::Manifest& base, int64_t step,
    const std::function<std::vector<stages::ShardFile>(const std::string& dir)>& write_files) {
  const std::string dir = stages::checkpoint_dir(o.checkpoint_dir, step);
  if (world.rank() == 0) stages::begin_checkpoint(dir);
  world.barrier()->wait();
  std::vector<stages::ShardFile> files = write_files(dir);
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& f : files)
    mine.push_back({{"file", f.file},
                    {"kind", f.kind},
                    {"rank", f.rank},
                    {"bytes", f.bytes},
                    {"hash", f.hash}});
  // Each rank's files are durable (fsynced, renamed) before it reports them, so the
  // manifest written after the exchange names only complete files.
  std::vector<std::string> all = all_gather_strings(world, mine.dump());
  if (world.rank() == 0) {
    stages::Manifest m = base;
    m.step = step;
    m.data["position"] = step;
    for (const std::string& s : all)
      for (const auto& f : nlohmann::json::parse(s)) {
        stages::ShardFile sf;
        sf.file = f["file"];
        sf.kind = f["kind"];
        sf.rank = f["rank"];
        sf.bytes = f["bytes"];
        sf.hash = f["hash"];
        m.shards.push_back(sf);
      }
    stages::write_manifest(dir, m);
    stages::prune_checkpoints(o.checkpoint_dir, o.keep_checkpoints, step);
  }
  return dir;
}

std::vector<stages::ShardFile> write_replica_files(RankEngine& e, const std::string& dir) {
  std::vector<const stages::Stage*> list;
  std::vector<int> ids;
  bool any = false;
  for (const auto& [s, st] : e.stages()) {
    list.push_back(st.get());
    ids.push_back(s);
    for (int p : st->param_ids()) any |= e.writes(s, p) || e.writes_state_part(s, p);
  }
  std::vector<stages::ShardFile> files;
  if (any)
    files = stages::write_rank_shards(
        dir, list, e.rank(), [&](size_t k, int p) { return e.writes(ids[k], p); },
        [&](size_t k, int p) { return e.writes_state_part(ids[k], p); });
  if (e.plan().plan.dp_sync.independent()) files.push_back(save_local_sgd(e, dir));
  if (e.plan().plan.dp_sync.parameter_server() && e.plan().plan.dp_sync.max_staleness > 0)
    files.push_back(save_parameter_server(e, dir));
  return files;
}

std::string save(RankEngine& e, const PlanTrainOptions& o, stages::Manifest base, int64_t step) {
  const stages::Stage& any_stage = *e.stages().begin()->second;
  base.optimizer = any_stage.optimizer();
  base.optimizer_steps = any_stage.optimizer_steps();
  return save_files(e.world(), o, base, step,
                    [&](const std::string& dir) { return write_replica_files(e, dir); });
}

// An extra server rank's files (docs/formats/checkpoint.md): its parts' optimizer state
// as the blocks of the logical tensors they cover (an "optimizer" file, which any plan
// and sharding reads) and, with staleness s > 0, its pulls in flight, keys
// "pull/<k>/<bucket>" (a "parameter-server" file, read back under the same layout). Its
// masters are the replicas' parameters at s = 0 and the newest pull at s > 0.
std::vector<stages::ShardFile> write_server_files(detail::ParamServer& server, int rank,
                                                  const std::string& dir) {
  std::vector<stages::ShardFile> files;
  std::vector<stages::ParamPart> state = server.state_parts(true);
  char file[64];
  std::snprintf(file, sizeof file, "optimizer-rank%05d.safetensors", rank);
  if (!state.empty())
    files.push_back(stages::write_part_shard(dir, file, "optimizer", rank, state));
  if (server.pulls().empty()) return files;
  std::vector<stages::NamedTensor> t;
  for (size_t k = 0; k < server.pulls().size(); ++k)
    for (size_t i = 0; i < server.pulls()[k].size(); ++i)
      t.push_back({"pull/" + std::to_string(k) + "/" + std::to_string(i), server.pulls()[k][i]});
  files.push_back(
      write_own_state(rank, dir, "parameter-server", t,
                      {{"format", "pt"}, {"pulls", std::to_string(server.pulls().size())}}));
  return files;
}

// A server's resume from any checkpoint: the checkpoint's optimizer and its state for the
// server's parts (whatever plan wrote them; the masters come from replica 0's seed, the
// parameters it loaded) and, under the same layout with s > 0, the pulls in flight
// posted again (their newest the masters).
void load_server(detail::ParamServer& server, const ResolvedPlan& r, int rank, int64_t bucket_bytes,
                 const std::string& dir, const stages::Manifest& m) {
  server.set_optimizer(m.optimizer, m.optimizer_steps);
  stages::load_parts(dir, m, "optimizer", server.state_parts(false));
  if (r.plan.dp_sync.max_staleness == 0) return;
  const stages::ShardFile* mine =
      own_state_shard(rank, m, "parameter_server", r, bucket_bytes, "parameter-server");
  if (mine == nullptr) return;  // the replicas warn
  stages::SafetensorsReader f(dir + "/" + mine->file);
  const std::vector<int64_t> sizes = server.part_sizes();
  std::vector<std::vector<Tensor>> pulls;
  for (size_t k = 0; !sizes.empty() && f.find("pull/" + std::to_string(k) + "/0"); ++k) {
    std::vector<Tensor> pull;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string name = "pull/" + std::to_string(k) + "/" + std::to_string(i);
      Tensor x = f.read(name);
      if (x.numel() != sizes[i])
        throw InputError(f.path() + ": " + name + " has the wrong size for this plan");
      pull.push_back(x);
    }
    pulls.push_back(std::move(pull));
  }
  server.restore_pulls(pulls);
}

}  // namespace

namespace detail {

namespace {

// Every rank's string compared with rank 0's: the first rank whose differs, or 0.
size_t first_differing(const std::vector<std::string>& all) {
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) return r;
  return 0;
}

// Each rank's copy of the manifest of the checkpoint after `step` must be rank 0's: each
// rank reads its own files, so a directory of the same name on another host resumed
// from whatever it held.
void check_same_manifest(Communicator& world, const std::string& root, int64_t step) {
  const std::string path = stages::checkpoint_dir(root, step) + "/manifest.json";
  std::string mine = "none";
  try {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) mine = stages::hash_file(path);
  } catch (const std::exception& e) {
    mine = std::string("unreadable (") + e.what() + ")";
  }
  const std::vector<std::string> all = all_gather_strings(
      world, nlohmann::json{{"manifest", mine}, {"host", transport::own_host_label()}}.dump());
  std::vector<std::string> manifests;
  for (const std::string& a : all) manifests.push_back(nlohmann::json::parse(a)["manifest"]);
  const size_t r = first_differing(manifests);
  if (r == 0) return;
  const nlohmann::json other = nlohmann::json::parse(all[r]);
  throw InputError(
      "--resume: rank " + std::to_string(r) + " (host " + other["host"].get<std::string>() +
      ") reads " + path + " as " + manifests[r] + " where rank 0 (host " +
      nlohmann::json::parse(all[0])["host"].get<std::string>() + ") resumes from " + manifests[0] +
      ": another run's checkpoint, or none, under that path on rank " + std::to_string(r) +
      "'s host; the checkpoint directory must be one file system every rank sees");
}

// The hash of a file's first and last 4 KiB (the whole file when smaller). A FIFO is
// refused, not opened (an ifstream had waited for a writer for ever), and a read that
// fails says why.
size_t head_tail_hash(const std::string& path, uint64_t bytes) {
  constexpr uint64_t kPart = 4096;
  const int fd = memory::open_regular_file(path);
  auto read_at = [&](std::string& part, uint64_t at) {
    size_t got = 0;
    while (got < part.size()) {
      const ssize_t n = ::pread(fd, part.data() + got, part.size() - got, off_t(at + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "the file is shorter than its size";
        ::close(fd);
        throw InputError(path + ": read error: " + why);
      }
      got += size_t(n);
    }
  };
  std::string head(size_t(std::min(bytes, kPart)), '\0'), tail;
  read_at(head, 0);
  if (bytes > kPart) {
    tail.resize(size_t(std::min(bytes - kPart, kPart)));
    read_at(tail, bytes - tail.size());
  }
  ::close(fd);
  return std::hash<std::string>{}(head + tail);
}

}  // namespace

int64_t agree_on_checkpoint(Communicator& world, const std::string& root) {
  int64_t step = -1;
  if (world.rank() == 0) {
    if (auto dir = stages::latest_checkpoint(root))
      step = stages::read_manifest(*dir).step;
    else if (stages::newest_written_checkpoint(root))
      step = -2;  // written, none usable: every rank refuses
  }
  if (world.size() > 1) step = broadcast_int(world, step);
  if (step == -2) {
    refuse_unusable_checkpoints(root);
    throw InputError("--resume: no checkpoint in " + root +
                     " is complete and undamaged (rank 0 "
                     "found them); starting over would write over them");
  }
  if (step >= 0 && world.size() > 1) check_same_manifest(world, root, step);
  return step;
}

void check_checkpoint_dir_shared(Communicator& world, const std::string& dir) {
  if (dir.empty() || world.size() < 2) return;
  // A nonce of this job, so that a file left by another job (or another host's) is not
  // taken for it.
  int64_t nonce = 0;
  std::string probe;
  if (world.rank() == 0) {
    nonce = int64_t((uint64_t(std::random_device{}()) << 32 ^ uint64_t(std::random_device{}()) ^
                     uint64_t(std::chrono::steady_clock::now().time_since_epoch().count())) >>
                    1);
    probe = dir + "/.baton-shared-probe-" + std::to_string(nonce);
    memory::write_file_durably(probe, std::to_string(nonce));
  }
  nonce = broadcast_int(world, nonce);  // after the write: the file is there for rank 0
  probe = dir + "/.baton-shared-probe-" + std::to_string(nonce);
  // A file system shared over the network may show a new file a moment late.
  bool seen = false;
  for (int tries = 0; tries < 20 && !seen; ++tries) {
    std::error_code ec;
    seen = std::filesystem::exists(probe, ec) && memory::read_file(probe) == std::to_string(nonce);
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<std::string> all =
      all_gather_strings(world, seen ? "" : transport::own_host_label());
  if (world.rank() == 0) std::filesystem::remove(probe);
  for (size_t r = 1; r < all.size(); ++r)
    if (!all[r].empty())
      throw InputError("--checkpoint-dir " + dir + ": rank " + std::to_string(r) + " (host " +
                       all[r] + ") does not see the file rank 0 wrote there at start-up: the " +
                       "directory is not shared, but every rank writes its shards into it and " +
                       "rank 0 the manifest naming them; the checkpoint directory must be one " +
                       "file system every rank sees");
}

std::string contents_identity(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "missing";
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(path, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  uint64_t bytes = 0;
  std::string parts;
  for (const auto& f : files) {
    const uint64_t n = uint64_t(std::filesystem::file_size(f, ec));
    bytes += n;
    parts += std::filesystem::relative(f, path, ec).string() + ":" + std::to_string(n) + ":" +
             std::to_string(head_tail_hash(f.string(), n)) + ";";
  }
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016zx", std::hash<std::string>{}(parts));
  return std::to_string(files.size()) + " file" + (files.size() == 1 ? "" : "s") + ", " +
         std::to_string(bytes) + " bytes, first and last 4 KiB hash " + digest;
}

void check_same_contents(Communicator& world, const std::string& flag,
                         const std::vector<std::string>& paths) {
  if (world.size() < 2 || paths.empty()) return;
  nlohmann::json mine = nlohmann::json::array();
  for (const std::string& p : paths) {
    mine.push_back(contents_identity(data_entry_path(p)));
  }
  const std::vector<std::string> all = all_gather_strings(world, mine.dump());
  const size_t r = first_differing(all);
  if (r == 0) return;
  const nlohmann::json theirs = nlohmann::json::parse(all[r]),
                       first = nlohmann::json::parse(all[0]);
  for (size_t k = 0; k < paths.size(); ++k)
    if (theirs[k] != first[k])
      throw InputError(flag + " " + paths[k] + ": rank " + std::to_string(r) +
                       " reads other contents under that path (" + theirs[k].get<std::string>() +
                       ") than rank 0 (" + first[k].get<std::string>() +
                       "): every rank must read the same files, from one file system every "
                       "rank sees or identical copies");
}

}  // namespace detail

using detail::agree_on_checkpoint;

namespace {

// --init-from: this rank's stages from the Hugging Face directory, one reader for all of
// them (each file opened once, only the blocks of its parameters read).
void init_from_hf(RankEngine& e, const std::string& dir, bool lead) {
  stages::HfCheckpoint ckpt(dir);
  for (const auto& [s, st] : e.stages()) stages::load_hf_weights(ckpt, *st);
  std::string files;
  for (const std::string& f : ckpt.opened()) files += (files.empty() ? "" : ", ") + f;
  spdlog::debug("rank {}: initialised from {}: {} bytes of {}", e.rank(), dir, ckpt.bytes_read(),
                files);
  if (lead) spdlog::info("initialised from {} (each rank its own blocks)", dir);
}

// ---- timelines ----

void write_trace(Communicator& world, const std::vector<schedule::TimelineEvent>& events,
                 double origin, int64_t steps, const ResolvedPlan& r, const std::string& path) {
  // An event of no action travels with its label's index k in schedule::event_labels()
  // as its stage, -2 - k (its own stage, when it has one, is not kept).
  const std::vector<std::string>& labels = schedule::event_labels();
  std::vector<double> flat;
  for (const auto& e : events) {
    int stage = e.stage;
    if (!e.label.empty()) {
      auto it = std::find(labels.begin(), labels.end(), e.label);
      if (it == labels.end()) throw std::logic_error("timeline: unknown event label " + e.label);
      stage = -2 - int(it - labels.begin());
    }
    flat.insert(flat.end(),
                {double(e.rank), double(e.lane), double(int(e.kind)), double(e.micro_batch),
                 double(stage), double(e.peer), e.start - origin, e.end - origin});
  }
  const int n = world.size();
  std::vector<int64_t> counts = all_gather_int(world, int64_t(flat.size()));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  // Host memory outside the cap and the peak the summary reports (a diagnostic, not
  // training), and the whole job's events on rank 0 alone: every rank had allocated them,
  // which doubled the measured peaks and ran a plan that fits its cap out of memory.
  const bool root = world.rank() == 0;
  Tensor in = Tensor::staging({int64_t(flat.size())}, memory::DType::f64);
  if (!flat.empty()) std::memcpy(in.raw_data(), flat.data(), flat.size() * sizeof(double));
  Tensor out = Tensor::staging({root ? std::max<int64_t>(total, 1) : 1}, memory::DType::f64);
  Tensor out_view = out.narrow(0, 0, root ? total : 0);
  world.gather(in, out_view, 0, counts)->wait();
  if (!root) return;
  std::vector<double> all = out_view.to_vector<double>();
  schedule::Timeline t;
  t.name = "measured: " + r.schedule.name + " (" + std::to_string(steps) + " step" +
           (steps > 1 ? "s" : "") + ")";
  t.num_ranks = n;
  t.seconds_per_unit = 1.0;
  for (size_t i = 0; i + 8 <= all.size(); i += 8) {
    schedule::TimelineEvent e;
    e.rank = int(all[i]);
    e.lane = int(all[i + 1]);
    e.kind = schedule::ActionKind(int(all[i + 2]));
    e.micro_batch = int(all[i + 3]);
    e.stage = int(all[i + 4]);
    if (e.stage <= -2) {
      e.label = labels.at(size_t(-2 - e.stage));
      e.stage = -1;
    }
    e.peer = int(all[i + 5]);
    e.start = all[i + 6];
    e.end = all[i + 7];
    t.events.push_back(e);
  }
  memory::write_file_durably(path, schedule::to_chrome_trace(t));
  spdlog::info("timeline of {} step(s) written to {}", steps, path);
}

}  // namespace

namespace {

// What `baton plan --check` estimates for each rank, with this run's buffer settings and,
// where the plan names no optimizer, this run's (a plan without one is estimated with
// AdamW's two states: an sgd run had been refused for memory it never used).
partitioner::PlanEstimate estimate_of(const ResolvedPlan& r, const PlanTrainOptions& o) {
  partitioner::CostModel model(r.graph, partitioner::Machine{});
  partitioner::EvaluateOptions eval;
  eval.bucket_bytes = o.bucket_bytes;
  eval.recv_ahead = o.recv_ahead;
  const std::string mine = plan_optimizer_name(o);
  if (r.plan.optimizer_stated || r.plan.optimizer == mine)
    return partitioner::evaluate_plan(r, model, eval);
  ResolvedPlan run = r;
  run.plan.optimizer = mine;
  return partitioner::evaluate_plan(run, model, eval);
}

// A plan whose estimate exceeds the device's cap (its device_memory, or --device-memory)
// is refused before anything runs, as `baton plan --check` refuses it: the estimate is
// never more than 3% below a rank's measured peak, and otherwise the run fails with an
// out-of-memory error in its first step, after minutes of loading on a large model. Every
// rank computes the same estimate, so every rank stops at once.
void check_capacity(const ResolvedPlan& r, const PlanTrainOptions& o) {
  const size_t cap = memory::allocator_for(o.device).stats().capacity;
  if (cap == 0) return;
  const partitioner::PlanEstimate e = estimate_of(r, o);
  std::string over;
  for (size_t k = 0; k < e.ranks.size(); ++k)
    if (e.ranks[k].peak > int64_t(cap))
      over += std::string(over.empty() ? "" : ", ") + "rank " + std::to_string(k) + " " +
              memory::format_bytes(double(e.ranks[k].peak));
  if (over.empty()) return;
  const std::string cap_text = memory::format_bytes(double(cap));
  if (o.schedule_path.empty())
    throw InputError(
        r.plan.source + ": the plan does not fit in " + cap_text +
        " per device (estimated peaks over it: " + over + "; `baton plan --check " + r.plan.source +
        (r.plan.optimizer_stated ? std::string() : " --optimizer " + plan_optimizer_name(o)) +
        // The cap --device-memory gave, which --check takes alike (its bytes, exactly).
        (int64_t(cap) == r.plan.device_memory ? std::string()
                                              : " --device-memory " + std::to_string(cap)) +
        "` shows every rank): re-plan, or raise its device_memory or "
        "--device-memory");
  // `baton plan --check` estimates the generator's schedule (and refuses --schedule): the
  // message gives every rank's estimate under the file itself.
  std::string all;
  for (size_t k = 0; k < e.ranks.size(); ++k)
    all += std::string(k ? ", " : "") + "rank " + std::to_string(k) + " " +
           memory::format_bytes(double(e.ranks[k].peak)) +
           (e.ranks[k].peak > int64_t(cap) ? " (over)" : "");
  throw InputError(r.plan.source + ": the plan does not fit in " + cap_text +
                   " per device under --schedule " + o.schedule_path + " (estimated peaks: " + all +
                   "; `baton simulate --file " + o.schedule_path +
                   "` shows the micro-batches each rank holds): re-plan, hold fewer "
                   "micro-batches in flight, or raise its device_memory or --device-memory");
}

}  // namespace

TrainSummary train_plan(const PlanTrainOptions& o, transport::CommPtr world,
                        const std::function<void(const StepRecord&)>& on_step) {
  Plan plan = partitioner::read_plan(o.plan_path);
  stages::LoadOptions lo;
  lo.float_dtype = kernels::compute_dtype(o.precision);  // 16-bit under mixed precision
  auto graph = partitioner::load_plan_model(plan, lo);
  // A schedule file is resolved with the plan, not after it: a plan valid only under the
  // file's placement (its pipeline_ranks, a tied parameter's degrees) had been refused by
  // the generator's first.
  std::optional<schedule::Schedule> own;
  if (!o.schedule_path.empty()) own = schedule::load_schedule_to_run(o.schedule_path);
  auto r = std::make_shared<ResolvedPlan>(
      partitioner::resolve_plan(plan, graph, own ? &*own : nullptr, o.schedule_path));
  if (own) {
    // Said, not refused: the losses are the one-process run's (docs/stages.md).
    if (const std::string w = partitioner::forward_order_note(*r); !w.empty() && world->rank() == 0)
      spdlog::warn("{}: {}", o.schedule_path, w);
  }
  check_capacity(*r, o);
  return train_plan(r, o, std::move(world), on_step);
}

namespace {
TrainSummary train(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o,
                   transport::CommPtr world, const std::function<void(const StepRecord&)>& on_step);
}

TrainSummary train_plan(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o,
                        transport::CommPtr world,
                        const std::function<void(const StepRecord&)>& on_step) {
  try {
    return train(std::move(rp), o, world, on_step);
  } catch (const transport::PeerError& e) {
    // This rank's operation names the peer in its own scope (often one that gave up
    // because of an earlier failure); name the first failure the process learnt of.
    auto first = world->first_failure();
    if (first && first->first != e.peer())
      throw transport::PeerError(first->first, "rank " + std::to_string(first->first) +
                                                   " failed: " + first->second +
                                                   "; this rank stopped at: " + e.what());
    throw;
  }
}

namespace {

// "2", or "2,1" when the pipeline ranks' spatial degrees differ.
std::string spatial_degrees(const partitioner::Plan& p) {
  std::string out;
  bool same = true;
  for (int s : p.spatial) same = same && s == p.spatial.front();
  if (same) return std::to_string(p.spatial.front());
  for (size_t i = 0; i < p.spatial.size(); ++i)
    out += (i ? "," : "") + std::to_string(p.spatial[i]);
  return out;
}

// An extra parameter-server rank's run: the steps' loop around ParamServer (the same
// losses and norms as the replicas'), the evaluations' sums, the peaks' gather.
TrainSummary serve(const ResolvedPlan& r, const PlanTrainOptions& o, transport::CommPtr world,
                   bool evaluates, const std::function<void(const StepRecord&)>& on_step) {
  auto& alloc = memory::allocator_for(o.device);
  alloc.reset_peak();
  std::unique_ptr<kernels::LossScaler> scaler = make_loss_scaler(o);
  detail::ParamServer server(r, world, {o.optimizer, o.grad_clip, o.bucket_bytes, scaler.get()});
  // The replicas' resume, at the same point of the collectives (after the groups' split).
  const int64_t found = o.resume ? agree_on_checkpoint(*world, o.checkpoint_dir) : -1;
  int64_t start = 0;
  nlohmann::json resumed_pending;
  if (found >= 0) {
    const std::string dir = stages::checkpoint_dir(o.checkpoint_dir, found);
    stages::Manifest m = stages::read_manifest(dir);
    check_resume(m, dir, model_json_of(r.plan), r.plan.where("$.model"), o.seed);
    load_server(server, r, world->rank(), int64_t(o.bucket_bytes), dir, m);
    restore_loss_scale(m, scaler.get());
    start = m.step;
    resumed_pending = pending_step_of(m);
  }
  // --trace: the replicas' window of steps and time origin (write_trace gathers every
  // rank's events, the servers' among them).
  const int64_t trace_from = o.trace_path.empty()
                                 ? o.steps
                                 : std::max(start, o.steps - std::max<int64_t>(1, o.trace_steps));
  double trace_origin = 0;
  LoopSteps steps;
  steps.resumed_pending = resumed_pending;
  steps.max_over_ranks = max_over_ranks(world);
  steps.step = [&](int64_t step) {
    if (step == trace_from) {
      trace_origin = host_trace_origin(*world);  // the server's clock is steady_clock's
      server.clear_events();
      server.set_recording(true);
    }
    auto t0 = std::chrono::steady_clock::now();
    StepStats st = server.step(step);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepRecord rec{step + 1, st.loss, st.grad_norm, secs};
    rec.loss_scale = st.loss_scale;
    rec.skipped = st.skipped;
    return rec;
  };
  steps.set_lr = [&](double lr) { server.set_lr(lr); };
  if (evaluates)
    steps.evaluate = [&] {
      double sum = 0;
      for (int64_t k = 0; k < o.eval_batches; ++k) sum += server.evaluate_batch();
      return sum / double(o.eval_batches);
    };
  steps.checkpoint = [&](int64_t done, const nlohmann::json&) {  // the replicas' manifest
    return save_files(*world, o, stages::Manifest{}, done, [&](const std::string& dir) {
      return write_server_files(server, world->rank(), dir);
    });
  };
  TrainSummary summary = run_loop(o, start, 0, false, steps, on_step);
  summary.peak_bytes = alloc.stats().peak;
  // The loop's last step (a stop signal may have ended it early, on every rank alike).
  const int64_t last = summary.first_step + summary.steps_run;
  if (!o.trace_path.empty() && trace_from < last) {
    server.set_recording(false);
    write_trace(*world, server.events(), trace_origin, last - trace_from, r, o.trace_path);
  }
  all_gather_int(*world, int64_t(summary.peak_bytes));
  return summary;
}

TrainSummary train(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o,
                   transport::CommPtr world,
                   const std::function<void(const StepRecord&)>& on_step) {
  const ResolvedPlan& r = *rp;
  check_ranks_agree(*world, o, r);
  check_same_inputs(*world, o);
  // Before check_loop_options, which would ask image data for held-out data it cannot have.
  const bool image_input = image_data(o);
  check_loop_options(o);
  check_output_path(o.trace_path, "--trace");
  {
    // Every rank's outputs against its inputs: --trace over the plan, its model, a blend's
    // file or the held-out data had replaced them, exit 0.
    std::vector<std::pair<std::string, std::string>> files = {{"--trace", o.trace_path},
                                                              {"--summary", o.summary_path},
                                                              {"--loss-log", o.loss_log},
                                                              {"--plan", o.plan_path},
                                                              {"--schedule", o.schedule_path}};
    if (!r.plan.model_path_resolved.empty())
      files.emplace_back("the plan's model", r.plan.model_path_resolved);
    for (auto& f : data_files(o)) files.push_back(std::move(f));
    check_distinct_files(files, 3);
  }
  prepare_device(o);
  const stages::Graph& lg = *r.graph;
  // A micro-batch, or with sync_batchnorm every replica's together.
  const int64_t bn_samples = batchnorm_samples(
      lg, r.plan.micro_batch_size * (r.plan.sync_batchnorm ? int64_t(r.plan.dp) : 1));
  // The model file the plan names, or the model embedded at its $.model: messages about the
  // model's fields name that file's paths ("tg.json: $.n_head", not the plan's).
  const std::string model_source =
      r.plan.model_path_resolved.empty() ? r.plan.where("$.model") : r.plan.model_path_resolved;
  if (o.steps > 0) stages::check_loss_trains(lg, model_source);
  // A directory with images.npy is image data (images + labels, as the one-process
  // trainer reads it); otherwise the token dataset (and held-out data), checked against
  // the logical model's vocabulary.
  std::shared_ptr<const stages::ImageDataset> images;
  stages::TrainData data;
  if (image_input) {
    auto d = std::make_shared<stages::ImageDataset>(o.data_path);
    d->check_model(lg, model_source);
    images = d;
  } else {
    expect_token_model(lg, o);
    data = stages::open_train_data(data_flags(o), lg, model_source);
  }
  const stages::ValueType& tok_type = lg.value(images ? "images" : "tokens").type;
  const stages::ValueType& tgt_type = lg.value(images ? "labels" : "targets").type;
  const int64_t T = images ? 1 : tok_type.shape[0];
  const bool per_position = !images && !tgt_type.shape.empty();
  const bool lead = world->rank() == 0;
  // The plan's model must be the one --init-from's weights were made for, and the weights
  // of this rank's layers must be there in its shapes, checked from the headers before the
  // stages allocate them (every rank reads the same files, so all fail together, before
  // any collective). --resume over written checkpoints does not read the directory: the
  // newest complete one replaces its weights, or none is usable and the run is refused.
  const nlohmann::json model_json = model_json_of(r.plan);
  auto check_init_from = [&] {
    stages::check_hf_model_matches(model_json, model_source, o.init_from);
    std::set<int> mine;
    for (const partitioner::RankStage& s : partitioner::rank_view(r, world->rank()).stages)
      for (int p : lg.params_used(s.first_layer, s.last_layer)) mine.insert(p);
    stages::check_hf_weights(o.init_from, lg, {mine.begin(), mine.end()});
  };
  const bool init_from_checked = !o.init_from.empty() && !r.is_server(world->rank()) &&
                                 !(o.resume && stages::newest_written_checkpoint(o.checkpoint_dir));
  if (init_from_checked) check_init_from();
  prepare_checkpoint_dir(o);  // the model and data are good: no directory left on bad input
  if (lead) warn_if_checkpoint_room_short(o, lg);  // every rank's shards, in one directory
  detail::check_checkpoint_dir_shared(*world, o.checkpoint_dir);
  std::optional<stages::CheckpointRootLock> held;  // the job's: its lead rank holds it
  if (lead && !o.checkpoint_dir.empty()) held.emplace(o.checkpoint_dir);
  check_world_size(r, world->size());
  if (r.is_server(world->rank())) return serve(r, o, world, data.eval != nullptr, on_step);
  auto& alloc = memory::allocator_for(o.device);
  alloc.reset_peak();

  std::unique_ptr<kernels::LossScaler> scaler = make_loss_scaler(o);
  RankEngineOptions eo;
  eo.seed = o.seed;
  eo.device = o.device;
  if (lg.float_dtype != memory::DType::f32) eo.master_dtype = memory::DType::f32;
  eo.loss_scaler = scaler.get();
  eo.device_world = o.device_world;
  eo.split_p2p_pair = o.split_p2p_pair;
  eo.input_staging = o.input_staging;
  eo.optimizer = o.optimizer;
  eo.grad_clip = o.grad_clip;
  eo.bucket_bytes = o.bucket_bytes;
  eo.recv_ahead = o.recv_ahead;
  eo.profile = o.profile;
  // Sample i of step s (of evaluation batch k: "step" k under the evaluation seed).
  auto inputs_of = [T, per_position, tok_type, tgt_type](stages::DatasetPtr d,
                                                         uint64_t seed) -> InputFn {
    return [d, seed, T, per_position, tok_type, tgt_type](const stages::MicroBatch& mb,
                                                          const std::vector<std::string>& names,
                                                          stages::TensorMap& out) {
      Tensor tokens = Tensor::empty({mb.samples, T}, tok_type.dtype);
      Tensor targets = per_position ? Tensor::empty({mb.samples, T}, tgt_type.dtype)
                                    : Tensor::empty({mb.samples}, tgt_type.dtype);
      d->fill(seed, mb.step, mb.sample_offset, mb.samples, tokens, targets);
      for (const std::string& n : names) out[n] = n == "tokens" ? tokens : targets;
    };
  };
  if (images) {
    // Only what the rank reads (a last stage: the labels), and on a tile only its rows:
    // the memory estimate counts the loader's micro-batches so (partitioner/evaluate.cpp).
    eo.inputs_tiled = true;
    eo.inputs = [images, seed = o.seed, tok_type, tgt_type, tile = input_tile(r, world->rank())](
                    const stages::MicroBatch& mb, const std::vector<std::string>& names,
                    stages::TensorMap& out) {
      for (const std::string& n : names)
        if (n == "images") {
          memory::Shape shape = tok_type.with_batch(mb.samples);
          int64_t first_row = 0;
          if (tile.names.count(n)) {
            shape[2] /= tile.of;
            first_row = tile.index * shape[2];
          }
          Tensor x = Tensor::empty(shape, tok_type.dtype);
          images->fill_images(seed, mb.step, mb.sample_offset, mb.samples, x, first_row);
          out[n] = x;
        } else {
          Tensor y = Tensor::empty({mb.samples}, tgt_type.dtype);
          images->fill_labels(seed, mb.step, mb.sample_offset, mb.samples, y);
          out[n] = y;
        }
    };
  } else {
    eo.inputs = inputs_of(data.train, o.seed);
  }
  if (data.eval) {
    // The windows every evaluation reads, in memory from the start (stages/data.h).
    data.eval = stages::hold_evaluation_windows(
        data.eval, o.seed, o.eval_batches,
        int64_t(r.plan.dp) * r.plan.micro_batches * r.plan.micro_batch_size, T);
    eo.eval_inputs = inputs_of(data.eval, stages::evaluation_seed(o.seed));
  }
  RankEngine engine(rp, world, eo);

  // ---- resume, or start from --init-from's weights (a checkpoint found replaces them)
  const int64_t found = o.resume ? agree_on_checkpoint(*world, o.checkpoint_dir) : -1;
  // The stop ids (generation_config.json's) kept in each checkpoint for generate and
  // export: --init-from's, or a resumed checkpoint's (its directory is not read then).
  std::optional<std::vector<int32_t>> stop_ids;
  if (!o.init_from.empty() && found < 0) {
    if (!init_from_checked) check_init_from();  // the checkpoints went away meanwhile
    init_from_hf(engine, o.init_from, lead);
    stop_ids = stages::hf_eos_token_ids(o.init_from);
  }
  int64_t start = 0;
  nlohmann::json resumed_pending;
  if (o.resume) {
    std::optional<std::string> dir;
    if (found >= 0) {
      dir = stages::checkpoint_dir(o.checkpoint_dir, found);
      stages::Manifest m = stages::read_manifest(*dir);
      check_resume(m, *dir, model_json, model_source, o.seed);
      stop_ids = stages::checkpoint_eos_token_ids(m, *dir + "/manifest.json");
      // A plan that names its optimizer was checked for that optimizer's state, which a
      // checkpoint of another kind would replace.
      const std::string kind = m.optimizer.kind == stages::OptimizerConfig::Kind::adamw ? "adamw"
                               : m.optimizer.sgd.momentum > 0 ? "sgd-momentum"
                                                              : "sgd";
      if (r.plan.optimizer_stated && kind != r.plan.optimizer)
        throw InputError(*dir + "/manifest.json: $.optimizer: the checkpoint continues with \"" +
                         kind + "\" and its state, but the plan trains with \"" + r.plan.optimizer +
                         "\" (" + r.plan.where("$.optimizer") +
                         "), whose memory it was checked for: resume under a plan naming \"" +
                         kind + "\", or none");
      if (lead) {
        warn_resume_changes(m, *dir,
                            images ? data_manifest(*images, m.step) : data_manifest(data, m.step),
                            o, engine.executor().config().global_batch, bn_samples);
        warn_unused_dp_state(m, *dir, r.plan.dp_sync.independent(),
                             r.plan.dp_sync.parameter_server() && r.plan.dp_sync.max_staleness > 0);
      }
      for (const auto& [s, st] : engine.stages())
        stages::load_stage(*dir, m, *st, true);  // the loop sets each step's rate
      if (r.plan.dp_sync.independent()) load_local_sgd(engine, *dir, m, lead);
      if (r.plan.dp_sync.parameter_server() && r.plan.dp_sync.max_staleness > 0)
        load_parameter_server(engine, *dir, m, int64_t(o.bucket_bytes), lead);
      start = m.step;
      resumed_pending = pending_step_of(m);
      restore_loss_scale(m, scaler.get());
    }
    if (lead) log_resume(dir, start, o.checkpoint_dir);
  }

  if (lead)
    spdlog::info(
        "plan {}: {} ranks (dp {} x pp {} x tp {}{}), schedule {}, {} micro-batches of {}; model "
        "{} "
        "({:.3f} M parameters); {} steps",
        r.plan.source.empty() ? "<memory>" : r.plan.source, r.world(), r.plan.dp, r.plan.pp,
        r.plan.uniform_tp() ? std::to_string(r.plan.tp[0]) : std::string("mixed"),
        r.plan.has_spatial() ? " x spatial " + spatial_degrees(r.plan) : std::string(),
        r.schedule.name, r.plan.micro_batches, r.plan.micro_batch_size, lg.name,
        double(lg.num_parameters()) / 1e6, o.steps);
  if (lead) {
    spdlog::info("data {}", images
                                ? o.data_path + " (" + std::to_string(images->size()) + " images)"
                                : data.train->describe());
    if (data.eval) spdlog::info("held-out data {}", data.eval->describe());
    if (!images) log_data_opened(data);
  }

  stages::Manifest base;
  base.seed = o.seed;
  base.model = model_json;
  base.data = images ? data_manifest(*images, 0) : data_manifest(data, 0);
  base.train = {{"batch", engine.executor().config().global_batch},
                {"micro_batches", int64_t(r.plan.dp) * r.plan.micro_batches},
                {"grad_clip", o.grad_clip},
                {"steps", o.steps},
                {"plan", r.plan.source},
                {"lr_schedule", lr_schedule_of(o).to_json()}};
  if (stop_ids) base.train["eos_token_ids"] = *stop_ids;
  if (!images && data.eval) base.train["eval_batches"] = o.eval_batches;
  if (bn_samples > 0) base.train["batchnorm_samples"] = bn_samples;
  if (r.plan.dp_sync.independent()) base.train["local_sgd"] = own_state_layout(r, 0);
  if (r.plan.dp_sync.parameter_server() && r.plan.dp_sync.max_staleness > 0)
    base.train["parameter_server"] = own_state_layout(r, int64_t(o.bucket_bytes));

  const int64_t trace_from = o.trace_path.empty()
                                 ? o.steps
                                 : std::max(start, o.steps - std::max<int64_t>(1, o.trace_steps));
  double trace_origin = 0;
  LoopSteps steps;
  steps.resumed_pending = resumed_pending;
  steps.max_over_ranks = max_over_ranks(world);
  if (images) steps.rate_unit = "img/s";
  steps.step = [&](int64_t step) {
    if (step == trace_from) {
      // The executor's clock is steady_clock's less its own start.
      const double origin = host_trace_origin(*world);
      trace_origin = engine.executor().now() - (detail::ParamServer::now() - origin);
      engine.executor().clear_events();
      engine.executor().set_recording(true);
    }
    auto t0 = std::chrono::steady_clock::now();
    StepStats st = engine.step(step, step + 1 < o.steps ? step + 1 : -1);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepRecord rec{step + 1, st.loss, st.grad_norm, secs};
    rec.loss_scale = st.loss_scale;
    rec.skipped = st.skipped;
    return rec;
  };
  steps.checkpoint = [&](int64_t done, const nlohmann::json& pending) {
    stages::Manifest m = base;
    if (!pending.is_null()) m.train["pending_step"] = pending;
    save_loss_scale(m, scaler.get());  // the same on every rank
    return save(engine, o, m, done);
  };
  steps.set_lr = [&](double lr) {
    for (const auto& [s, st] : engine.stages()) st->optimizer().set_lr(lr);
  };
  if (data.eval) steps.evaluate = [&] { return engine.evaluate(o.eval_batches); };
  steps.data_check = data.check.get();
  const int64_t tokens_per_step = engine.executor().config().global_batch * T;
  TrainSummary summary = run_loop(o, start, tokens_per_step, lead, steps, on_step);
  summary.peak_bytes = alloc.stats().peak;
  // The loop's last step (a stop signal may have ended it early, on every rank alike): a
  // stop before the window traced nothing, and one inside it fewer steps.
  const int64_t last = summary.first_step + summary.steps_run;
  if (!o.trace_path.empty() && trace_from < last) {
    engine.executor().set_recording(false);
    write_trace(*world, engine.executor().events(), trace_origin, last - trace_from, r,
                o.trace_path);
  } else if (!o.trace_path.empty() && lead) {
    // Said also when no step ran (--steps 0, a resume at the last step): it had been
    // silently not written.
    spdlog::warn(
        "--trace {}: not written: {}", o.trace_path,
        summary.stopped_by != 0
            ? fmt::format("the run stopped before step {}, the first traced", trace_from + 1)
            : fmt::format("no step ran (the run ended at step {})", last));
  }
  // Every rank's peak (one process per rank: its allocator's), for comparison with the
  // partitioner's estimate (`baton plan --check`).
  std::vector<int64_t> peaks = all_gather_int(*world, int64_t(summary.peak_bytes));
  if (lead) {
    std::string list;
    for (int64_t b : peaks) list += (list.empty() ? "" : " ") + std::to_string(b);
    spdlog::info("peak device memory of rank 0: {}; every rank's peak in bytes: {}",
                 memory::format_bytes(double(summary.peak_bytes)), list);
  }
  if (lead && !o.summary_path.empty()) {
    const partitioner::PlanEstimate estimate = estimate_of(r, o);
    std::vector<RankPeak> ranks;
    for (int k = 0; k < world->size(); ++k)
      ranks.push_back({k, peaks[size_t(k)], estimate.ranks[size_t(k)].peak});
    write_summary(o.summary_path,
                  summary_json(o, summary, tokens_per_step, ranks, r.schedule.name, r.plan.source));
  }
  return summary;
}

}  // namespace

}  // namespace baton::engine
