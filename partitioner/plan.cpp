#include "partitioner/plan.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/units.h"
#include "partitioner/layout.h"
#include "schedule/generators.h"
#include "schedule/schedule_io.h"
#include "stages/json_reader.h"

namespace baton::partitioner {

using nlohmann::json;
using stages::JsonReader;
namespace fs = std::filesystem;

std::string_view split_name(SplitKind k) {
  switch (k) {
    case SplitKind::none:
      return "none";
    case SplitKind::column:
      return "column";
    case SplitKind::row:
      return "row";
    case SplitKind::vocab:
      return "vocab";
    case SplitKind::heads:
      return "heads";
  }
  return "?";
}

SplitKind parse_split(std::string_view name, const std::string& where) {
  for (SplitKind k :
       {SplitKind::none, SplitKind::column, SplitKind::row, SplitKind::vocab, SplitKind::heads})
    if (split_name(k) == name) return k;
  throw InputError(where +
                   ": expected \"none\", \"column\", \"row\", \"vocab\" or \"heads\", found \"" +
                   brief(name) + "\"");
}

std::string_view sharding_name(OptimizerSharding s) {
  switch (s) {
    case OptimizerSharding::none:
      return "none";
    case OptimizerSharding::zero1:
      return "zero1";
    case OptimizerSharding::zero2:
      return "zero2";
  }
  return "?";
}

std::string_view dp_sync_name(DpSync::Mode m) {
  switch (m) {
    case DpSync::Mode::allreduce:
      return "allreduce";
    case DpSync::Mode::local_sgd:
      return "local-sgd";
    case DpSync::Mode::gossip:
      return "gossip";
    case DpSync::Mode::parameter_server:
      return "parameter-server";
  }
  return "?";
}

std::string_view outer_optimizer_name(DpSync::Outer o) {
  return o == DpSync::Outer::nesterov ? "nesterov" : "average";
}

json dp_sync_to_json(const DpSync& s) {
  if (s.mode == DpSync::Mode::gossip)
    return {{"mode", "gossip"}, {"peers", s.peers}, {"seed", s.seed}};
  if (s.parameter_server())
    return {
        {"mode", "parameter-server"}, {"max_staleness", s.max_staleness}, {"ps_ranks", s.ps_ranks}};
  if (!s.local()) return std::string(dp_sync_name(s.mode));
  json j = {{"mode", std::string(dp_sync_name(s.mode))},
            {"sync_every", s.sync_every},
            {"outer_optimizer", std::string(outer_optimizer_name(s.outer))}};
  if (s.outer == DpSync::Outer::nesterov) {
    j["outer_lr"] = s.outer_lr;
    j["outer_momentum"] = s.outer_momentum;
  }
  return j;
}

bool Plan::uniform_tp() const {
  for (int t : tp)
    if (t != tp.front()) return false;
  return true;
}

int64_t Plan::replica_size() const {
  int64_t n = 0;
  for (size_t i = 0; i < tp.size(); ++i) n += int64_t(tp[i]) * spatial_of(int(i));
  return n;
}

bool Plan::has_spatial() const {
  for (int s : spatial)
    if (s > 1) return true;
  return false;
}

Layout plan_layout(const Plan& p) {
  return Layout(p.dp, p.tp, p.spatial);
}

std::string Plan::where(const std::string& json_path) const {
  return (source.empty() ? std::string("plan") : source) + ": " + json_path;
}

void check_dp_sync(const Plan& p) {
  const DpSync& s = p.dp_sync;
  const std::string mode = "\"" + std::string(dp_sync_name(s.mode)) + "\"";
  // One replica has none to average with: such a plan had been taken, charged an anchor
  // copy (local SGD) or gossip messages in its estimates, and trained as without them.
  if (s.independent() && p.dp < 2)
    throw InputError(p.where("$.dp_sync") + ": " + mode +
                     " synchronises data-parallel replicas; expected dp >= 2, found dp " +
                     std::to_string(p.dp));
  // Each replica steps on its own gradients: no reduce-scatter to shard the state over.
  if (s.mode == DpSync::Mode::gossip && s.peers > p.dp - 1)
    throw InputError(p.where("$.dp_sync.peers") + ": expected at most dp - 1 = " +
                     std::to_string(p.dp - 1) + " peers, found " + std::to_string(s.peers));
  // The servers' parts are zero1's, which DualPipe (each chunk on two pipeline ranks)
  // does not shard.
  if (s.parameter_server() && p.schedule == "dualpipe")
    throw InputError(p.where("$.dp_sync.mode") +
                     ": \"parameter-server\" needs a schedule whose chunks live on one pipeline "
                     "rank each; expected a schedule other than \"dualpipe\", found \"dualpipe\"");
  // Extra server ranks serve the parts the replicas' data-parallel group shards (none at
  // dp 1) and run on the host: their messages travel the world's transport.
  if (s.ps_ranks > 0 && p.dp < 2)
    throw InputError(p.where("$.dp_sync.ps_ranks") +
                     ": extra server ranks serve the parameters of several data-parallel "
                     "replicas; expected dp >= 2 with ps_ranks " +
                     std::to_string(s.ps_ranks) + ", found dp " + std::to_string(p.dp));
  if (s.ps_ranks > 0 && p.device != "cpu")
    throw InputError(p.where("$.dp_sync.ps_ranks") +
                     ": extra server ranks run on the CPU; expected device \"cpu\" with "
                     "ps_ranks > 0, found \"" +
                     p.device + "\"");
  if (s.parameter_server() && p.optimizer_sharding != OptimizerSharding::none)
    throw InputError(p.where("$.dp_sync") +
                     ": \"parameter-server\" shards the optimizer state over its servers "
                     "itself; expected optimizer_sharding \"none\" (or absent), found \"" +
                     std::string(sharding_name(p.optimizer_sharding)) + "\"");
  if (s.independent() && p.optimizer_sharding != OptimizerSharding::none)
    throw InputError(p.where("$.dp_sync") + ": " + mode +
                     " keeps a whole optimizer per replica; it cannot be combined with "
                     "optimizer_sharding \"" +
                     std::string(sharding_name(p.optimizer_sharding)) + "\"");
  // The early update of a post-validated step assumes the summed gradient of allreduce.
  if (p.post_validated_step && s.mode != DpSync::Mode::allreduce)
    throw InputError(p.where("$.optimizer_step") + ": \"post-validated\" cannot be combined " +
                     "with dp_sync " + mode + " (only with \"allreduce\")");
}

std::string_view boundary_pattern(int t, int u) {
  return t == u ? "one-to-one" : t < u ? "broadcast" : "gather";
}

json derive_boundaries(const Plan& p) {
  json out = json::array();
  for (size_t k = 0; k + 1 < p.stages.size(); ++k) {
    if (p.stages[k].pipeline_ranks.empty() || p.stages[k + 1].pipeline_ranks.empty()) return json();
    int a = p.stages[k].pipeline_ranks.front(), b = p.stages[k + 1].pipeline_ranks.front();
    int t = p.tp[size_t(a)], u = p.tp[size_t(b)];
    const int sa = p.spatial_of(a), sb = p.spatial_of(b);
    json e = {{"after_stage", k},
              {"from_pipeline_rank", a},
              {"to_pipeline_rank", b},
              {"from_tp", t},
              {"to_tp", u}};
    if (p.has_spatial()) {
      e["from_spatial"] = sa;
      e["to_spatial"] = sb;
    }
    // Tiles go one to one (equal degrees); replicated values by the groups' widths.
    e["pattern"] =
        a == b ? std::string("in-memory") : std::string(boundary_pattern(t * sa, u * sb));
    out.push_back(e);
  }
  return out;
}

void check_stage_count(const Plan& p, int chunks, const std::string& schedule_name) {
  const std::string expected = "expected " + std::to_string(chunks) + " stages (schedule " +
                               schedule_name + " on " + std::to_string(p.pp) +
                               " pipeline ranks holds " + std::to_string(chunks) +
                               " model chunks), found ";
  const bool every_layer = p.stages.size() == 1 && p.stages[0].every_layer;
  if (every_layer && chunks != 1)
    throw InputError(p.where("$.stages") + ": " + expected +
                     "none: only a plan of one model chunk may leave them out");
  if (int(p.stages.size()) != chunks)
    throw InputError(p.where("$.stages") + ": " + expected + std::to_string(p.stages.size()));
}

int optimizer_states(const std::string& optimizer) {
  if (optimizer == "adamw") return 2;
  if (optimizer == "sgd-momentum") return 1;
  if (optimizer == "sgd") return 0;
  throw InputError("optimizer: expected \"adamw\", \"sgd\" or \"sgd-momentum\", found \"" +
                   optimizer + "\"");
}

namespace {

constexpr int64_t kMaxCount = kMaxPlanCount;

int64_t parse_memory(const JsonReader& r) {
  if (r.raw().is_null()) return 0;
  if (r.is_string()) {
    try {
      return int64_t(memory::parse_bytes(r.as_string()));
    } catch (const InputError& e) {
      r.fail_message(e.what());  // what is wrong: not a size, or one beyond int64 or under a byte
    }
  }
  if (!r.raw().is_number()) r.fail("a number of bytes or a size string such as \"64MiB\"");
  return r.as_int(0, INT64_MAX);
}

void parse_parallel(Plan& p, const JsonReader& r) {
  r.expect_only({"dp", "pp", "tp"});
  p.dp = int(r.get_int("dp", 1, 1, kMaxCount));
  p.pp = int(r.get_int("pp", 1, 1, kMaxCount));
  p.tp.clear();
  if (auto t = r.get("tp")) {
    if (t->is_array()) {
      if (int(t->size()) != p.pp)
        t->fail("one tensor-parallel degree per pipeline rank (pp = " + std::to_string(p.pp) + ")",
                std::to_string(t->size()) + " values");
      for (size_t i = 0; i < t->size(); ++i) p.tp.push_back(int(t->at(i).as_int(1, kMaxCount)));
    } else {
      p.tp.assign(size_t(p.pp), int(t->as_int(1, kMaxCount)));
    }
  } else {
    p.tp.assign(size_t(p.pp), 1);
  }
  // Each degree alone is bounded; their product, the world, is what the ranks number.
  const int64_t world = int64_t(p.dp) * p.replica_size();
  if (world > kMaxWorld)
    r.fail("degrees whose world dp x (sum of tp over the pipeline ranks) is at most " +
               std::to_string(kMaxWorld) + " ranks",
           std::to_string(p.dp) + " x " + std::to_string(p.replica_size()) + " = " +
               std::to_string(world));
}

void parse_stage(PlanStage& s, const JsonReader& r, int pp) {
  r.expect_only({"layers", "pipeline_ranks", "recompute", "spatial"});
  s.spatial = int(r.get_int("spatial", 1, 1, kMaxCount));
  s.json_path = r.where();
  JsonReader layers = r.at("layers");
  layers.expect_array();
  if (layers.size() == 0) layers.fail("[first, last) layer indices or a list of layer names", "[]");
  if (layers.at(size_t(0)).is_string()) {
    for (const JsonReader& n : layers.items()) s.layer_names.push_back(n.as_string());
  } else {
    if (layers.size() != 2)
      layers.fail("[first, last): two layer indices (or a list of layer names)",
                  "an array of " + std::to_string(layers.size()));
    s.first_layer = int(layers.at(size_t(0)).as_int(0, kMaxCount));
    s.last_layer = int(layers.at(size_t(1)).as_int(0, kMaxCount));
    if (s.last_layer <= s.first_layer)
      layers.fail("first < last (a stage holds at least one layer)",
                  "[" + std::to_string(s.first_layer) + ", " + std::to_string(s.last_layer) + "]");
  }
  if (auto pr = r.get("pipeline_ranks")) {
    pr->expect_array();
    // Empty would read as absent and go unchecked.
    if (pr->size() == 0) pr->fail("the pipeline ranks holding the chunk (at least one)", "[]");
    for (const JsonReader& x : pr->items()) s.pipeline_ranks.push_back(int(x.as_int(0, pp - 1)));
  }
  if (auto rc = r.get("recompute")) {
    if (rc->raw().is_boolean()) {
      s.recompute_all = rc->as_bool();
    } else {
      if (!rc->raw().is_array())
        rc->fail("true, false or an array of layer names", stages::json_brief(rc->raw()));
      for (const JsonReader& x : rc->items()) {
        const std::string name = x.as_string();
        const auto seen = std::find(s.recompute_names.begin(), s.recompute_names.end(), name);
        if (seen != s.recompute_names.end())
          x.fail("each layer once", "\"" + name + "\" again (also at recompute[" +
                                        std::to_string(seen - s.recompute_names.begin()) + "])");
        s.recompute_names.push_back(name);
      }
    }
  }
}

void check_ranks_table(const Plan& p, const JsonReader& r) {
  r.expect_array();
  Layout layout = plan_layout(p);
  if (int(r.size()) != layout.world())
    r.fail(std::to_string(layout.world()) + " entries (one per rank)", std::to_string(r.size()));
  for (size_t i = 0; i < r.size(); ++i) {
    JsonReader e = r.at(i);
    e.expect_only({"rank", "dp", "pp", "tp", "sp"});
    RankCoord c = layout.coord(int(i));
    int64_t rank = e.at("rank").as_int(0, kMaxCount), dp = e.at("dp").as_int(0, kMaxCount),
            pp = e.at("pp").as_int(0, kMaxCount), tp = e.at("tp").as_int(0, kMaxCount),
            sp = e.get_int("sp", 0, 0, kMaxCount);
    auto sp_str = [&](int64_t v) {
      return layout.has_spatial() || v != 0 ? ", sp " + std::to_string(v) : std::string();
    };
    if (rank != int64_t(i) || dp != c.dp || pp != c.pp || tp != c.tp || sp != c.sp)
      e.fail("{rank " + std::to_string(i) + ", dp " + std::to_string(c.dp) + ", pp " +
                 std::to_string(c.pp) + ", tp " + std::to_string(c.tp) + sp_str(c.sp) + "} (" +
                 layout.rule() + ")",
             "{rank " + std::to_string(rank) + ", dp " + std::to_string(dp) + ", pp " +
                 std::to_string(pp) + ", tp " + std::to_string(tp) + sp_str(sp) + "}");
  }
}

// dp_sync: "allreduce", or {"mode": ..., its parameters}.
DpSync read_dp_sync(const JsonReader& r) {
  DpSync s;
  s.json_path = r.where();
  const std::string modes = "\"allreduce\", \"local-sgd\", \"gossip\" or \"parameter-server\"";
  auto mode_of = [&](const JsonReader& m) {
    if (!m.is_string()) m.fail(modes, stages::json_brief(m.raw()));
    const std::string name = m.as_string();
    for (DpSync::Mode x : {DpSync::Mode::allreduce, DpSync::Mode::local_sgd, DpSync::Mode::gossip,
                           DpSync::Mode::parameter_server})
      if (dp_sync_name(x) == name) return x;
    m.fail(modes, "\"" + name + "\"");
  };
  if (r.is_string()) {
    s.mode = mode_of(r);
    if (s.local())
      r.fail("an object {\"mode\": \"local-sgd\", \"sync_every\": H} (local-sgd needs H)",
             "\"local-sgd\"");
    if (s.parameter_server())
      r.fail(
          "an object {\"mode\": \"parameter-server\", \"max_staleness\": s} (parameter-server "
          "needs its staleness bound)",
          "\"parameter-server\"");
    return s;
  }
  if (!r.is_object())
    r.fail(modes + ", or an object with \"mode\" and its parameters", stages::json_brief(r.raw()));
  s.mode = mode_of(r.at("mode"));
  if (s.mode == DpSync::Mode::gossip) {
    r.expect_only({"mode", "peers", "seed"});
    s.peers = int(r.get_int("peers", 1, 1, kMaxCount));
    s.seed = r.has("seed") ? r.at("seed").as_uint64() : 1;  // as --seed
    return s;
  }
  if (s.parameter_server()) {
    r.expect_only({"mode", "max_staleness", "ps_ranks"});
    s.max_staleness = int(r.at("max_staleness").as_int(0, 64));
    s.ps_ranks = int(r.get_int("ps_ranks", 0, 0, 64));
    return s;
  }
  if (!s.local()) {
    r.expect_only({"mode"});
    return s;
  }
  r.expect_only({"mode", "sync_every", "outer_optimizer", "outer_lr", "outer_momentum"});
  s.sync_every = int(r.at("sync_every").as_int(1, kMaxCount));
  if (auto o = r.get("outer_optimizer")) {
    const std::string outers = "\"average\" or \"nesterov\"";
    if (!o->is_string()) o->fail(outers, stages::json_brief(o->raw()));
    const std::string name = o->as_string();
    if (name == "average")
      s.outer = DpSync::Outer::average;
    else if (name == "nesterov")
      s.outer = DpSync::Outer::nesterov;
    else
      o->fail(outers, "\"" + name + "\"");
  }
  for (const char* key : {"outer_lr", "outer_momentum"})
    if (r.has(key) && s.outer != DpSync::Outer::nesterov)
      r.at(key).fail_message(std::string(key) +
                             " is a parameter of outer_optimizer \"nesterov\" (the outer "
                             "optimizer here is \"average\")");
  s.outer_lr = r.get_double("outer_lr", s.outer_lr, 1e-12, 1e6);
  s.outer_momentum = r.get_double("outer_momentum", s.outer_momentum, 0.0, 0.999999);
  return s;
}

// The stages' spatial degrees per pipeline rank (through the schedule's placement, which
// resolve_plan checks again); InputError naming the stage when a pipeline rank would get
// two degrees.
void plan_spatial_degrees(Plan& p) {
  bool any = false;
  for (const PlanStage& s : p.stages) any = any || s.spatial > 1;
  if (!any) return;
  schedule::Schedule sched;
  try {
    sched = schedule::generate(schedule::canonical_training_schedule_name(p.schedule), p.pp,
                               p.micro_batches, p.chunks);
  } catch (const InputError& e) {
    throw InputError(p.where("$.schedule") + ": " + e.what());
  }
  // The chunks' degrees count the devices: a wrong stage count had been reported as a
  // device count the stages' degrees could not have set.
  check_stage_count(p, sched.stages_per_direction(),
                    schedule::canonical_training_schedule_name(p.schedule));
  p.spatial.assign(size_t(p.pp), 0);
  std::vector<int> by(size_t(p.pp), -1);  // the stage that set the degree
  for (int st = 0; st < sched.num_stages(); ++st) {
    const int k = schedule::stage_chunk(sched, st), pp = sched.placement[size_t(st)];
    const PlanStage& s = p.stages[size_t(k)];
    int& d = p.spatial[size_t(pp)];
    if (d != 0 && d != s.spatial)
      throw InputError(s.json_path + ".spatial: " + std::to_string(s.spatial) +
                       ", but pipeline rank " + std::to_string(pp) + " also holds " +
                       p.stages[size_t(by[size_t(pp)])].json_path.substr(p.where("").size()) +
                       " with spatial " + std::to_string(d) +
                       "; the chunks of one pipeline rank share its spatial degree");
    d = s.spatial;
    by[size_t(pp)] = k;
  }
}

std::string file_dir(const std::string& path) {
  fs::path d = fs::path(path).parent_path();
  return d.empty() ? "." : d.string();
}

}  // namespace

Plan parse_plan(const json& j, const std::string& source, const std::string& base_dir) {
  JsonReader r(j, source);
  r.expect_object();
  r.check_version("the plan", Plan::kVersion, Plan::kVersion);
  r.expect_only({"version", "model", "devices", "device_memory", "device", "transport", "parallel",
                 "batch", "schedule", "optimizer", "optimizer_sharding", "optimizer_step",
                 "dp_sync", "sync_batchnorm", "stages", "splits", "ranks", "boundaries",
                 "predicted"});
  Plan p;
  p.source = source;
  JsonReader model = r.at("model");
  if (model.is_string()) {
    p.model_path = model.as_string();
    if (p.model_path.empty()) model.fail("a model file path or an embedded model object", "\"\"");
    fs::path mp(p.model_path);
    p.model_path_resolved =
        mp.is_absolute() ? mp.string() : (fs::path(base_dir) / mp).lexically_normal().string();
  } else if (model.is_object()) {
    p.model_json = model.raw();
  } else {
    model.fail("a model file path (string) or an embedded model JSON (object)",
               stages::json_brief(model.raw()));
  }

  if (auto par = r.get("parallel"))
    parse_parallel(p, *par);
  else
    p.tp.assign(1, 1);
  JsonReader devices = r.at("devices");
  p.devices = int(devices.as_int(1, kMaxWorld));
  // With a spatial split the pipeline ranks' widths need the stages (checked below).
  bool spatial_written = false;
  if (j.contains("stages") && j["stages"].is_array())
    for (const json& st : j["stages"])
      spatial_written = spatial_written || (st.is_object() && st.contains("spatial"));
  // Extra parameter-server ranks are no devices (they hold no model), but the job's ranks.
  const bool servers =
      j.contains("dp_sync") && j["dp_sync"].is_object() && j["dp_sync"].contains("ps_ranks");
  if (!spatial_written && p.devices != p.dp * p.replica_size())
    devices.fail("dp x (sum of tp over the pipeline ranks) = " + std::to_string(p.dp) + " x " +
                     std::to_string(p.replica_size()) + " = " +
                     std::to_string(p.dp * p.replica_size()) + " devices" +
                     (servers ? " (the training ranks: $.dp_sync.ps_ranks are not counted here, "
                                "but `baton launch -n` counts them)"
                              : ""),
                 std::to_string(p.devices));
  if (auto m = r.get("device_memory")) p.device_memory = parse_memory(*m);
  if (auto d = r.get("device")) {
    if (!d->is_string() || (d->as_string() != "cpu" && d->as_string() != "cuda"))
      d->fail("\"cpu\" or \"cuda\" (each rank takes the GPU of its local rank)",
              stages::json_brief(d->raw()));
    p.device = d->as_string();
  }
  if (auto t = r.get("transport")) {
    if (!t->is_string() || (t->as_string() != "ucx" && t->as_string() != "nccl"))
      t->fail("\"ucx\" or \"nccl\"", stages::json_brief(t->raw()));
    p.transport = t->as_string();
    if (p.transport == "nccl" && p.device != "cuda")
      t->fail("\"ucx\" (NCCL moves CUDA tensors only: \"nccl\" needs \"device\": \"cuda\")",
              "\"nccl\" with \"device\": \"" + p.device + "\"");
  }

  JsonReader sched = r.at("schedule");
  sched.expect_only({"name", "micro_batches", "chunks"});
  p.schedule = sched.at("name").as_string();
  // Every generator's bound, so the range said is the one that holds.
  p.micro_batches = int(sched.at("micro_batches").as_int(1, schedule::kMaxGeneratedMicroBatches));
  // 0 stands for "not given" (the schedule's own count): a 0 written in the file had
  // passed, and meant interleaved-1f1b's default 2.
  if (auto c = sched.get("chunks")) p.chunks = int(c->as_int(1, kMaxCount));

  // Each count is within kMaxCount, their product not always within int64: a wrapped
  // product had made a plan of 2^63 samples "valid" with a global batch below 0.
  auto global_of = [&p](const JsonReader& at) {
    const std::string product = std::to_string(p.dp) + " x " + std::to_string(p.micro_batches) +
                                " x " + std::to_string(p.micro_batch_size);
    int64_t n = 0;
    if (__builtin_mul_overflow(int64_t(p.dp), int64_t(p.micro_batches), &n) ||
        __builtin_mul_overflow(n, p.micro_batch_size, &n))
      at.fail("a global batch dp x micro_batches x micro_batch_size of at most 2^63 - 1", product);
    return std::pair{
        n, "dp x micro_batches x micro_batch_size = " + product + " = " + std::to_string(n)};
  };
  if (auto b = r.get("batch")) {
    b->expect_only({"micro_batch_size", "global"});
    p.micro_batch_size = b->get_int("micro_batch_size", 1, 1, kMaxCount);
    const auto [expect, formula] = global_of(*b);
    p.global_batch = b->get_int("global", expect, 1, INT64_MAX);
    if (p.global_batch != expect) b->at("global").fail(formula, std::to_string(p.global_batch));
  } else {
    p.global_batch = global_of(r).first;
  }

  if (auto o = r.get("optimizer")) {
    p.optimizer = o->as_string();
    p.optimizer_stated = true;
    if (p.optimizer != "adamw" && p.optimizer != "sgd" && p.optimizer != "sgd-momentum")
      o->fail("\"adamw\", \"sgd\" or \"sgd-momentum\"", "\"" + p.optimizer + "\"");
  }
  if (auto z = r.get("optimizer_sharding")) {
    if (!z->is_string()) z->fail("\"none\", \"zero1\" or \"zero2\"", stages::json_brief(z->raw()));
    const std::string name = z->as_string();
    bool known = false;
    for (OptimizerSharding s :
         {OptimizerSharding::none, OptimizerSharding::zero1, OptimizerSharding::zero2})
      if (sharding_name(s) == name) {
        p.optimizer_sharding = s;
        known = true;
      }
    if (!known) z->fail("\"none\", \"zero1\" or \"zero2\"", "\"" + name + "\"");
  }

  if (auto os = r.get("optimizer_step")) {
    const std::string name = os->is_string() ? os->as_string() : std::string();
    if (name != "synchronous" && name != "post-validated")
      os->fail("\"synchronous\" or \"post-validated\"",
               os->is_string() ? "\"" + name + "\"" : stages::json_brief(os->raw()));
    p.post_validated_step = name == "post-validated";
  }

  if (auto sb = r.get("sync_batchnorm")) p.sync_batchnorm = sb->as_bool();
  if (auto d = r.get("dp_sync")) p.dp_sync = read_dp_sync(*d);
  check_dp_sync(p);

  if (auto st = r.get("stages")) {
    st->expect_array();
    if (st->size() == 0) st->fail("at least one stage", "[]");
    for (const JsonReader& s : st->items()) {
      PlanStage ps;
      parse_stage(ps, s, p.pp);
      p.stages.push_back(std::move(ps));
    }
  } else {
    // One chunk of every layer: all a plan of one pipeline rank has to say.
    PlanStage ps;
    ps.every_layer = true;
    ps.json_path = p.where("$.stages");
    p.stages.push_back(std::move(ps));
  }
  plan_spatial_degrees(p);
  if (spatial_written && int64_t(p.dp) * p.replica_size() > kMaxWorld)
    r.at("stages").fail(
        "spatial degrees whose world dp x (sum of tp x spatial over the pipeline "
        "ranks) is at most " +
            std::to_string(kMaxWorld) + " ranks",
        std::to_string(p.dp) + " x " + std::to_string(p.replica_size()) + " = " +
            std::to_string(int64_t(p.dp) * p.replica_size()));
  if (spatial_written && p.devices != p.dp * p.replica_size())
    devices.fail("dp x (sum of tp x spatial over the pipeline ranks) = " + std::to_string(p.dp) +
                     " x " + std::to_string(p.replica_size()) + " = " +
                     std::to_string(p.dp * p.replica_size()) + " devices",
                 std::to_string(p.devices));

  if (auto sp = r.get("splits")) {
    sp->expect_object();
    for (const std::string& k : sp->keys()) {
      JsonReader v = sp->at(k);
      p.splits[k] = parse_split(v.as_string(), v.where());
      p.split_paths[k] = v.where();
    }
  }
  if (auto ranks = r.get("ranks")) check_ranks_table(p, *ranks);
  if (auto b = r.get("boundaries")) {
    b->expect_array();
    for (const stages::JsonReader& e : b->items())
      e.expect_only({"after_stage", "from_pipeline_rank", "to_pipeline_rank", "from_tp", "to_tp",
                     "from_spatial", "to_spatial", "pattern"});
    p.boundaries = b->raw();
    p.boundaries_path = b->where();
  }
  if (auto pr = r.get("predicted")) {
    pr->expect_only({"step_time_s", "bubble", "memory_bytes", "time_model", "tokens_per_s"});
    // Informational (--check recomputes it), but typed as `baton plan` writes it.
    for (const char* key : {"step_time_s", "tokens_per_s"})
      if (auto x = pr->get(key); x && x->as_double() < 0) x->fail("a number >= 0");
    if (auto x = pr->get("bubble")) x->as_double(0, 1);
    if (auto x = pr->get("memory_bytes")) {
      x->expect_array();
      for (const JsonReader& b : x->items())
        if (b.as_int() < 0) b.fail("a byte count >= 0");
    }
    if (auto x = pr->get("time_model")) {
      const std::string m = x->as_string();
      if (m != "measured" && m != "analytic") x->fail("\"measured\" or \"analytic\"");
    }
    p.predicted = pr->raw();
  }
  return p;
}

DpSync parse_dp_sync(const json& j, const std::string& source) {
  return read_dp_sync(JsonReader(j, source));
}

Plan read_plan(const std::string& path) {
  return parse_plan(stages::read_json_file(path), path, file_dir(path));
}

json plan_to_json(const Plan& p, const std::string& base_dir) {
  json j;
  j["version"] = Plan::kVersion;
  if (!p.model_path.empty()) {
    std::string mp = p.model_path_resolved.empty() ? p.model_path : p.model_path_resolved;
    if (!base_dir.empty() && !fs::path(p.model_path).is_absolute()) {
      std::error_code ec;
      fs::path rel = fs::relative(fs::absolute(mp), fs::absolute(base_dir), ec);
      if (!ec && !rel.empty()) mp = rel.string();
    }
    j["model"] = mp;
  } else {
    j["model"] = p.model_json;
  }
  j["devices"] = p.devices;
  if (p.device_memory > 0) {
    // As people write sizes where that reads back as the same bytes ("64.00 MiB"), else
    // the bytes: a cap rounded down would refuse the plan written for it.
    // (A size that rounds up past 2^63 - 1 fails to read back: the bytes too.)
    const std::string size = memory::format_bytes(double(p.device_memory));
    bool same = false;
    try {
      same = int64_t(memory::parse_bytes(size)) == p.device_memory;
    } catch (const InputError&) {
    }
    if (same)
      j["device_memory"] = size;
    else
      j["device_memory"] = p.device_memory;
  }
  if (p.device != "cpu") j["device"] = p.device;
  if (!p.transport.empty()) j["transport"] = p.transport;
  json par = {{"dp", p.dp}, {"pp", p.pp}};
  if (p.uniform_tp())
    par["tp"] = p.tp.front();
  else
    par["tp"] = p.tp;
  j["parallel"] = par;
  j["batch"] = {{"micro_batch_size", p.micro_batch_size}, {"global", p.global_batch}};
  json sched = {{"name", p.schedule}, {"micro_batches", p.micro_batches}};
  if (p.chunks > 0) sched["chunks"] = p.chunks;
  j["schedule"] = sched;
  j["optimizer"] = p.optimizer;
  if (p.optimizer_sharding != OptimizerSharding::none)
    j["optimizer_sharding"] = std::string(sharding_name(p.optimizer_sharding));
  if (p.post_validated_step) j["optimizer_step"] = "post-validated";
  if (p.dp_sync.mode != DpSync::Mode::allreduce) j["dp_sync"] = dp_sync_to_json(p.dp_sync);
  if (p.sync_batchnorm) j["sync_batchnorm"] = true;
  json stages = json::array();
  for (const PlanStage& s : p.stages) {
    json e;
    if (s.first_layer >= 0)
      e["layers"] = {s.first_layer, s.last_layer};
    else
      e["layers"] = s.layer_names;
    if (!s.pipeline_ranks.empty()) e["pipeline_ranks"] = s.pipeline_ranks;
    if (s.recompute_all)
      e["recompute"] = true;
    else if (!s.recompute_names.empty())
      e["recompute"] = s.recompute_names;
    else
      e["recompute"] = false;
    if (s.spatial > 1) e["spatial"] = s.spatial;
    stages.push_back(e);
  }
  // A plan read without its stages (one chunk of every layer) is written without them.
  if (p.stages.size() != 1 || !p.stages[0].every_layer) j["stages"] = stages;
  if (!p.splits.empty()) {
    json sp = json::object();
    for (const auto& [k, v] : p.splits) sp[k] = std::string(split_name(v));
    j["splits"] = sp;
  }
  Layout layout = plan_layout(p);
  json ranks = json::array();
  for (int r = 0; r < layout.world(); ++r) {
    RankCoord c = layout.coord(r);
    json e = {{"rank", r}, {"dp", c.dp}, {"pp", c.pp}, {"tp", c.tp}};
    if (layout.has_spatial()) e["sp"] = c.sp;
    ranks.push_back(e);
  }
  j["ranks"] = ranks;
  json boundaries = derive_boundaries(p);
  if (!boundaries.is_null()) j["boundaries"] = boundaries;
  if (!p.predicted.is_null()) j["predicted"] = p.predicted;
  return j;
}

void write_plan(const Plan& p, const std::string& path) {
  memory::write_file_durably(path, plan_to_json(p, file_dir(path)).dump(2) + "\n");
}

}  // namespace baton::partitioner
