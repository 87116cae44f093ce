#include "partitioner/cost_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "memory/allocator.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "partitioner/fusion.h"
#include "schedule/schedule_io.h"
#include "stages/json_reader.h"

namespace baton::partitioner {

using stages::Graph;

double all_reduce_time(double bytes, int ranks, double bandwidth, double latency) {
  if (ranks <= 1 || bytes <= 0) return 0;
  double steps = 2.0 * (ranks - 1);
  return steps * latency + 2.0 * (ranks - 1) / ranks * bytes / bandwidth;
}

double all_gather_time(double bytes_out, int ranks, double bandwidth, double latency) {
  if (ranks <= 1 || bytes_out <= 0) return 0;
  return (ranks - 1) * latency + double(ranks - 1) / ranks * bytes_out / bandwidth;
}

double dp_bytes_per_step(const DpSync& s, double bytes, int replicas) {
  if (replicas <= 1 || bytes <= 0) return 0;
  if (s.mode == DpSync::Mode::gossip) return double(std::min(s.peers, replicas - 1)) * bytes;
  // Extra server ranks: a replica pushes its gradients once; the servers send the pull.
  if (s.parameter_server() && s.ps_ranks > 0) return bytes;
  const double ring = 2.0 * (replicas - 1) / replicas * bytes;
  return s.local() ? ring / s.sync_every : ring;
}

double ps_pull_exposed(const DpSync& s, double pull, double compute) {
  if (!s.parameter_server()) return pull;
  return std::max(0.0, pull - double(s.max_staleness) * std::max(0.0, compute));
}

ServerTimes ps_server_times(const DpSync& s, double bytes, double served, int replicas,
                            const Machine& m, int optimizer_states, double compute) {
  ServerTimes t;
  if (!s.parameter_server() || s.ps_ranks <= 0 || replicas <= 1 || served <= 0) return t;
  const double n = s.ps_ranks;
  // The busier end of a link: the replica's own sends, or a server's share of them all.
  const double link = std::max(bytes, double(replicas) * served / n);
  t.push = m.dp_latency + link / m.dp_bandwidth;
  t.pull = t.push;
  t.update = (3.0 + 2.0 * optimizer_states) * served / n / m.memory_bandwidth;
  t.exposed = ps_pull_exposed(s, t.update + t.pull, compute);
  return t;
}

double dp_time_per_step(const DpSync& s, double bytes, int replicas, double bandwidth,
                        double latency, double compute) {
  if (replicas <= 1 || bytes <= 0) return 0;
  if (s.parameter_server() && s.ps_ranks > 0) {
    Machine m;
    m.dp_bandwidth = bandwidth;
    m.dp_latency = latency;
    const ServerTimes t = ps_server_times(s, bytes, bytes, replicas, m, 0, 0);
    return t.push + ps_pull_exposed(s, t.pull, compute);
  }
  if (s.parameter_server()) {
    const double half = all_gather_time(bytes, replicas, bandwidth, latency);
    return half + ps_pull_exposed(s, half, compute);
  }
  if (s.mode == DpSync::Mode::gossip)  // one exchange with a partner per round
    return double(std::min(s.peers, replicas - 1)) * (latency + bytes / bandwidth);
  const double t = all_reduce_time(bytes, replicas, bandwidth, latency);
  return s.local() ? t / s.sync_every : t;
}

// ---- the cost file ----

namespace {
// The longest an op may take in a cost file, and once scaled to another batch or shard by
// its FLOPs: beyond it the step times mean nothing (and their sums overflow to inf).
constexpr double kMaxOpSeconds = 1e9;

std::string g_text(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// A key of `obj` that counts something (ranks, a degree): an integer from 2 to 65536,
// written as write_measured_costs writes it. std::stoi had read "02", " 2" and "+2" as 2,
// so two spellings of one count collapsed into one entry without a word.
int count_key(const stages::JsonReader& obj, const std::string& key, const char* what) {
  int n = 0;
  bool canonical = !key.empty() && key.size() <= 5 && key[0] != '0';
  for (char ch : key) {
    canonical = canonical && ch >= '0' && ch <= '9';
    if (canonical) n = n * 10 + (ch - '0');
  }
  if (!canonical || n < 2 || n > 1 << 16)
    obj.at(key).fail(std::string(what) +
                         " as a key: an integer from 2 to 65536 in decimal digits (no sign, "
                         "spaces or leading zeros)",
                     "the key " + stages::json_brief(nlohmann::json(key)));
  return n;
}
}  // namespace

// 2: the fields version 1 gained without a new version (in_step, memory_bandwidth,
// colocated, cores, more_batches, ...); version 1 files are read alike. Raised with every
// field added, since a reader refuses fields it does not know: an older baton then names a
// newer file by its version.
constexpr int64_t kCostFileVersion = 2;

MeasuredCosts read_measured_costs(const std::string& path) {
  nlohmann::json j = stages::read_json_file(path);
  stages::JsonReader r(j, path);
  r.expect_object();
  // A schedule's cost file (forward, backward_input, ... per stage) is the other kind.
  if (!r.has("version") && !r.has("kind") &&
      (r.has("forward") || r.has("backward_input") || r.has("backward_weight")))
    r.fail_message(
        "a schedule cost file (per-stage action times: `baton simulate --costs`, "
        "docs/schedules.md), where op times measured by `baton profile --out` were expected");
  r.check_version("the cost file", 1, kCostFileVersion);
  r.expect_only({"version", "kind", "model", "batch", "threads", "machine", "colocated", "cores",
                 "in_step", "memory_bandwidth", "ops", "tp_ops", "tp_collective",
                 "spatial_exchange", "more_batches"});
  if (r.at("kind").as_string() != "op_times") r.at("kind").fail("\"op_times\"");
  MeasuredCosts c;
  c.model = r.get_string("model", "");
  c.batch = r.at("batch").as_int(1, INT64_MAX);
  c.threads = int(r.get_int("threads", 1, 1, 1 << 16));
  if (auto m = r.get("machine")) m->expect_object();
  if (auto k = r.get("colocated")) {
    k->expect_object();
    for (const std::string& ranks : k->keys())
      c.colocated[count_key(*k, ranks, "ranks per host")] = k->at(ranks).as_double(0.01, 1e6);
  }
  c.cores = int(r.get_int("cores", 0, 1, 1 << 20));
  c.in_step = r.get_double("in_step", 1, MeasuredCosts::kInStepMin, MeasuredCosts::kInStepMax);
  if (r.get("memory_bandwidth"))
    c.memory_bandwidth = r.get_double("memory_bandwidth", 0, MeasuredCosts::kBandwidthMin,
                                      MeasuredCosts::kBandwidthMax);
  auto read_ops = [](const stages::JsonReader& ops, std::map<std::string, MeasuredCosts::Op>& out) {
    ops.expect_object();
    for (const std::string& name : ops.keys()) {
      stages::JsonReader o = ops.at(name);
      o.expect_only({"op", "forward", "backward_input", "backward_weight", "flops"});
      MeasuredCosts::Op op;
      op.op = o.at("op").as_string();
      op.forward = o.at("forward").as_double(0, kMaxOpSeconds);
      op.backward_input = o.at("backward_input").as_double(0, kMaxOpSeconds);
      op.backward_weight = o.at("backward_weight").as_double(0, kMaxOpSeconds);
      // A count under 1 FLOP (1e-300) is no op's: the times scaled by it had become
      // 300-digit step times, or inf.
      op.flops = o.get_double("flops", 0, 0, 1e30);
      if (op.flops > 0 && op.flops < 1)
        o.at("flops").fail("0 (not counted) or a FLOP count from 1 to 1e30");
      op.where = o.where();
      out[name] = op;
    }
  };
  auto read_tp_ops = [&](const stages::JsonReader& at,
                         std::map<int, std::map<std::string, MeasuredCosts::Op>>& out) {
    if (auto k = at.get("tp_ops")) {
      k->expect_object();
      for (const std::string& degree : k->keys())
        read_ops(k->at(degree), out[count_key(*k, degree, "a tensor-parallel degree")]);
    }
  };
  read_ops(r.at("ops"), c.ops);
  read_tp_ops(r, c.tp_ops);
  if (auto k = r.get("more_batches")) {
    for (size_t i = 0; i < k->size(); ++i) {
      const stages::JsonReader at = k->at(i);
      at.expect_only({"batch", "in_step", "ops", "tp_ops"});
      MeasuredCosts::AtBatch b;
      b.batch = at.at("batch").as_int(1, INT64_MAX);
      const std::vector<int64_t> seen = c.batches();
      if (std::find(seen.begin(), seen.end(), b.batch) != seen.end())
        at.at("batch").fail("a micro-batch size not timed already");
      b.in_step = at.get_double("in_step", 1, MeasuredCosts::kInStepMin, MeasuredCosts::kInStepMax);
      read_ops(at.at("ops"), b.ops);
      read_tp_ops(at, b.tp_ops);
      c.more_batches.push_back(std::move(b));
    }
    std::sort(c.more_batches.begin(), c.more_batches.end(),
              [](const auto& a, const auto& b) { return a.batch < b.batch; });
  }
  // Seconds by degree, by ranks per host.
  auto read_extras = [&](const char* key, const char* degree_is,
                         std::map<int, std::map<int, double>>& into) {
    auto k = r.get(key);
    if (!k) return;
    k->expect_object();
    for (const std::string& degree : k->keys()) {
      const stages::JsonReader by_ranks = k->at(degree);
      by_ranks.expect_object();
      auto& out = into[count_key(*k, degree, degree_is)];
      for (const std::string& ranks : by_ranks.keys())
        out[count_key(by_ranks, ranks, "ranks per host")] = by_ranks.at(ranks).as_double(0, 1);
    }
  };
  read_extras("tp_collective", "a tensor-parallel degree", c.tp_collective);
  read_extras("spatial_exchange", "a spatial degree", c.spatial_exchange);
  return c;
}

std::vector<int64_t> MeasuredCosts::batches() const {
  std::vector<int64_t> b = {batch};
  for (const AtBatch& m : more_batches) b.push_back(m.batch);
  std::sort(b.begin(), b.end());
  return b;
}

void write_measured_costs(const MeasuredCosts& c, const std::string& path) {
  auto ops_json = [](const std::map<std::string, MeasuredCosts::Op>& m) {
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [name, o] : m)
      ops[name] = {{"op", o.op},
                   {"forward", o.forward},
                   {"backward_input", o.backward_input},
                   {"backward_weight", o.backward_weight},
                   {"flops", o.flops}};
    return ops;
  };
  const nlohmann::json ops = ops_json(c.ops);
  nlohmann::json j = {
      {"version", kCostFileVersion}, {"kind", "op_times"},   {"model", c.model}, {"batch", c.batch},
      {"threads", c.threads},        {"in_step", c.in_step}, {"ops", ops}};
  if (c.memory_bandwidth > 0) j["memory_bandwidth"] = c.memory_bandwidth;
  if (c.cores > 0) j["cores"] = c.cores;
  if (!c.colocated.empty()) {
    nlohmann::json k = nlohmann::json::object();
    for (const auto& [ranks, factor] : c.colocated) k[std::to_string(ranks)] = factor;
    j["colocated"] = k;
  }
  auto write_tp_ops = [&](const std::map<int, std::map<std::string, MeasuredCosts::Op>>& tp_ops,
                          nlohmann::json& at) {
    if (tp_ops.empty()) return;
    nlohmann::json k = nlohmann::json::object();
    for (const auto& [degree, ops_of] : tp_ops) k[std::to_string(degree)] = ops_json(ops_of);
    at["tp_ops"] = k;
  };
  write_tp_ops(c.tp_ops, j);
  for (const MeasuredCosts::AtBatch& b : c.more_batches) {
    nlohmann::json at = {{"batch", b.batch}, {"in_step", b.in_step}, {"ops", ops_json(b.ops)}};
    write_tp_ops(b.tp_ops, at);
    j["more_batches"].push_back(at);
  }
  auto write_extras = [&](const char* key, const std::map<int, std::map<int, double>>& from) {
    if (from.empty()) return;
    nlohmann::json k = nlohmann::json::object();
    for (const auto& [degree, by_ranks] : from)
      for (const auto& [ranks, seconds] : by_ranks)
        k[std::to_string(degree)][std::to_string(ranks)] = seconds;
    j[key] = k;
  };
  write_extras("tp_collective", c.tp_collective);
  write_extras("spatial_exchange", c.spatial_exchange);
  memory::write_file_durably(path, j.dump(1) + "\n");
}

// ---- tables ----

double CostTable::total_time(bool recompute) const {
  return pf.back() + pb.back() + pw.back() + (recompute ? pf.back() : 0);
}

int64_t CostTable::param_bytes(int first, int last) const {
  int64_t b = pparams[size_t(last)] - pparams[size_t(first)];
  for (const ParamUse& u : shared_params)
    for (int l : u.layers)
      if (l >= first && l < last) {
        b += u.bytes;
        break;
      }
  return b;
}

StageMemory compose_stage_memory(const CostTable& t, int first, int last,
                                 const std::set<int>& recompute, int optimizer_states) {
  StageMemory m;
  for (int l = first; l < last; ++l) {
    int64_t b = t.own_param_bytes[size_t(l)];
    m.params += b;
    m.grads += b;
    m.optimizer += b * optimizer_states;
  }
  for (const ParamUse& u : t.shared_params) {
    int64_t n = 0;
    for (int l : u.layers) n += l >= first && l < last ? 1 : 0;
    if (n == 0) continue;
    m.params += u.bytes;
    m.grads += u.bytes * (n + (n > 1 ? 1 : 0));
    m.optimizer += u.bytes * optimizer_states;
  }
  // Forward: S(first, l) + forward peak of l. Backward, which runs the layers in reverse:
  // S(first, l) + (W + held-through-backward)(l + 1, last) + backward peak of l. B and W
  // as one action: the same without the later layers' W stash, which their W consumed.
  int64_t s = 0, h_total = 0, w_total = 0;
  auto of = [&](int l) -> const MicroBatchMemory& {
    return recompute.count(l) ? t.layers[size_t(l)].mem_recompute : t.layers[size_t(l)].mem;
  };
  for (int l = first; l < last; ++l) {
    h_total += of(l).held_through_backward;
    w_total += of(l).w_stash;
  }
  int64_t h_before = 0, w_before = 0;
  for (int l = first; l < last; ++l) {
    const MicroBatchMemory& x = of(l);
    m.mb.forward_peak = std::max(m.mb.forward_peak, s + x.forward_peak);
    h_before += x.held_through_backward;
    w_before += x.w_stash;
    const int64_t held_after = h_total - h_before;
    m.mb.backward_peak =
        std::max(m.mb.backward_peak, s + held_after + (w_total - w_before) + x.backward_peak);
    m.mb.fused_peak = std::max(m.mb.fused_peak, s + held_after + x.fused_peak);
    s += x.stash;
  }
  m.mb.held_through_backward = h_total;
  // The caller holds every model input of the stage through its F (counted once more for
  // the layer that reads it: an upper bound).
  for (int l = first; l < last; ++l) m.mb.forward_peak += t.input_bytes[size_t(l)];
  m.mb.stash = s;
  m.mb.w_stash = w_total;
  m.mb.weight_peak = w_total;
  return m;
}

double colocation_slowdown(const Machine& m, int ranks) {
  double k0 = 1, f0 = 1;  // the measured point below `ranks`
  for (const auto& [k, f] : m.colocated) {
    if (k == ranks) return f;
    if (k > ranks) return f0 + (f - f0) * (ranks - k0) / (k - k0);
    k0 = k;
    f0 = f;
  }
  return ranks <= 1 ? 1.0 : f0;
}

void check_machine(const Machine& m, const std::function<std::string(const char*)>& name) {
  for (auto [field, v] : {std::pair{"flops", m.flops},
                          {"memory_bandwidth", m.memory_bandwidth},
                          {"tp_bandwidth", m.tp_bandwidth},
                          {"p2p_bandwidth", m.p2p_bandwidth},
                          {"dp_bandwidth", m.dp_bandwidth}})
    if (!(v > 0 && std::isfinite(v)))
      throw InputError(name(field) + ": expected a positive rate, found " + g_text(v));
  for (auto [field, v] : {std::pair{"tp_latency", m.tp_latency},
                          {"p2p_latency", m.p2p_latency},
                          {"dp_latency", m.dp_latency}})
    if (!(v >= 0 && std::isfinite(v)))
      throw InputError(name(field) + ": expected seconds (0 or more), found " + g_text(v));
  if (m.cores_per_host < 0)
    throw InputError(name("cores_per_host") + ": expected 0 (the cost file's) or more, found " +
                     std::to_string(m.cores_per_host));
  if (m.ranks_per_host < 0)
    throw InputError(name("ranks_per_host") +
                     ": expected 0 (all of the plan's ranks) or more, found " +
                     std::to_string(m.ranks_per_host));
}

namespace {
// Seconds by degree, then by ranks per host: linear between the measured counts.
double by_degree_and_ranks(const std::map<int, std::map<int, double>>& m, int degree, int ranks) {
  auto d = m.find(degree);
  if (d == m.end() || d->second.empty()) return 0;
  const std::map<int, double>& by = d->second;
  auto hi = by.lower_bound(ranks);
  if (hi == by.end()) return std::prev(hi)->second;
  if (hi->first == ranks || hi == by.begin()) return hi->second;
  auto lo = std::prev(hi);
  return lo->second + (hi->second - lo->second) * (ranks - lo->first) / (hi->first - lo->first);
}
}  // namespace

double tp_collective_extra(const Machine& m, int t, int ranks) {
  return by_degree_and_ranks(m.tp_collective, t, ranks);
}

double spatial_exchange_extra(const Machine& m, int s, int ranks) {
  return by_degree_and_ranks(m.spatial_exchange, s, ranks);
}

std::vector<std::vector<double>> core_ranks(const Layout& layout, const Machine& m) {
  const int world = layout.world(), cores = m.cores_per_host;
  const int per_host = m.ranks_per_host > 0 ? std::min(m.ranks_per_host, world) : world;
  if (cores <= 0 || per_host <= cores) return {};
  // Each host's ranks (rank w on host w / per_host) share that host's cores, dealt in
  // the layout's order among them: a core per row, the hosts' rows one after another.
  const int hosts = (world + per_host - 1) / per_host;
  std::vector<std::vector<double>> out(size_t(hosts) * size_t(cores),
                                       std::vector<double>(size_t(layout.pp())));
  const std::vector<int> place = layout.core_deal_order();
  std::vector<int> by_place(static_cast<size_t>(world));
  for (int w = 0; w < world; ++w) by_place[size_t(place[size_t(w)])] = w;
  std::vector<int> dealt(size_t(hosts), 0);
  for (int w : by_place) {
    const int host = w / per_host;
    const int core = dealt[size_t(host)]++ % cores;
    out[size_t(host) * size_t(cores) + size_t(core)][size_t(layout.coord(w).pp)] += 1;
  }
  return out;
}

CostModel::CostModel(std::shared_ptr<const Graph> logical, Machine machine,
                     const MeasuredCosts* measured)
    : g_(std::move(logical)), machine_(machine), measured_(measured) {
  if (measured_ != nullptr && machine_.colocated.empty()) machine_.colocated = measured_->colocated;
  if (measured_ != nullptr && machine_.tp_collective.empty())
    machine_.tp_collective = measured_->tp_collective;
  if (measured_ != nullptr && machine_.spatial_exchange.empty())
    machine_.spatial_exchange = measured_->spatial_exchange;
  if (measured_ != nullptr && machine_.cores_per_host == 0)
    machine_.cores_per_host = measured_->cores;
  if (measured_ != nullptr && measured_->memory_bandwidth > 0)
    machine_.memory_bandwidth = measured_->memory_bandwidth;
  if (measured_ != nullptr) warn_foreign_costs();
  // Layers of one structure share an id; the per-sharding signatures build on it.
  std::map<std::string, int> ids;
  for (int l = 0; l < g_->num_layers(); ++l)
    static_id_.push_back(ids.emplace(static_signature(l), int(ids.size())).first->second);
}

// A cost file profiled for another model, or without some of this model's ops, had been
// used without a word: the ops it lacks are timed by FLOPs at machine.flops, and the
// others may be another model's.
void CostModel::warn_foreign_costs() const {
  if (!measured_->model.empty() && !g_->name.empty() && measured_->model != g_->name)
    spdlog::warn("the cost file was profiled for model '{}', and this model is '{}'",
                 measured_->model, g_->name);
  // The model's ops absent from `ops` (or there with another op), the first three named;
  // with `among`, only those that it holds.
  auto has = [](const std::map<std::string, MeasuredCosts::Op>& ops, const stages::Node& n) {
    auto it = ops.find(n.name);
    return it != ops.end() && it->second.op == n.op;
  };
  auto lacking = [&](const std::map<std::string, MeasuredCosts::Op>& ops,
                     const std::map<std::string, MeasuredCosts::Op>* among = nullptr) {
    std::vector<std::string> missing;
    for (const stages::Node& n : g_->nodes)
      if (!has(ops, n) && (among == nullptr || has(*among, n))) missing.push_back(n.name);
    std::string first;
    for (size_t i = 0; i < missing.size() && i < 3; ++i)
      first += (first.empty() ? "" : ", ") + missing[i];
    return std::pair{missing.size(), first + (missing.size() > 3 ? ", ..." : "")};
  };
  // Ops of the file's names whose FLOPs at its micro-batch are not the file's: a model of
  // another width or context under the same names (it had been used without a word, its
  // times scaled by the FLOPs: 186 ms predicted where the model's own profile said 259).
  std::vector<std::string> other;
  std::string example;
  for (const stages::Node& n : g_->nodes) {
    auto it = measured_->ops.find(n.name);
    if (it == measured_->ops.end() || it->second.op != n.op || it->second.flops <= 0 || !n.impl)
      continue;
    const stages::OpCost c = n.impl->cost(measured_->batch);
    const double now = c.forward_flops + c.backward_input_flops + c.backward_weight_flops;
    if (std::abs(now - it->second.flops) <= 1e-6 * std::max(now, it->second.flops)) continue;
    if (other.empty())
      example = fmt::format("{}: {:.4g} FLOPs in the file, {:.4g} in this model", n.name,
                            it->second.flops, now);
    other.push_back(n.name);
  }
  if (!other.empty())
    spdlog::warn(
        "{} of the model's {} ops have other FLOPs at the cost file's micro-batch {} than it "
        "records ({}): a model of another shape under the same names; their times are the "
        "file's scaled by the FLOPs, an estimate: profile this model for measured ones",
        other.size(), g_->nodes.size(), measured_->batch, example);
  if (const auto [n, names] = lacking(measured_->ops); n > 0)
    spdlog::warn(
        "{} of the model's {} ops are not in the cost file (with their op) ({}): they are "
        "timed by their FLOPs at the nominal rate (--flops)",
        n, g_->nodes.size(), names);
  // A size's gap had been filled from the other sizes' times without a word (an op lacking
  // at every size is in the warning above).
  for (const MeasuredCosts::AtBatch& at : measured_->more_batches)
    if (const auto [n, names] = lacking(at.ops, &measured_->ops); n > 0)
      spdlog::warn(
          "{} of the model's {} ops are not in the cost file's more_batches entry for batch {} "
          "(with their op) ({}): at that size they take the other sizes' times scaled by their "
          "FLOPs",
          n, g_->nodes.size(), at.batch, names);
}

// A default profile times the ops at 1 thread, and a one-rank plan trains with every
// core: the prediction had been off by that without a word.
void CostModel::warn_threads(int world, const std::string& device) {
  if (measured_ == nullptr || threads_warned_ || world < 1 || device == "cuda") return;
  threads_warned_ = true;
  const int local = machine_.ranks_per_host > 0 ? std::min(machine_.ranks_per_host, world) : world;
  const int cores = int(std::max(1U, std::thread::hardware_concurrency()));
  const int each = std::max(1, cores / local);
  if (each == measured_->threads) return;
  spdlog::warn(
      "the cost file timed the ops at {} thread(s), and each of the plan's {} rank(s) per host "
      "computes with {} on this host's {} cores by default (baton train --threads 0: the cores "
      "divided among local ranks): train with --threads {}, or profile with --threads {}",
      measured_->threads, local, each, cores, measured_->threads, each);
}

std::string CostModel::static_signature(int layer) const {
  const Graph& g = *g_;
  std::string sig;
  const auto& nodes = g.layers[size_t(layer)].nodes;
  for (int n : nodes) {
    const stages::Node& node = g.nodes[size_t(n)];
    sig += node.op;
    sig += node.attrs.dump();
    for (int v : node.inputs) {
      const stages::Value& val = g.values[size_t(v)];
      int prod = val.producer;
      if (prod >= 0 && g.nodes[size_t(prod)].layer == layer)
        sig += "<" + std::to_string(prod - nodes.front());  // within the layer: by position
      else
        sig += "<x" + stages::type_str(val.type);
    }
    for (int p : node.params)
      sig += p < 0 ? std::string("p-") : "p" + memory::shape_str(g.params[size_t(p)].shape);
    for (int v : node.outputs) {
      const stages::Value& val = g.values[size_t(v)];
      bool later = v == g.loss;
      for (int c : val.consumers) later = later || g.nodes[size_t(c)].layer > layer;
      sig += later ? ">o" : ">";
    }
    sig += ";";
  }
  return sig;
}

void CostModel::signature(const Sharding& s, int layer, std::vector<int64_t>& key) const {
  // The layer's structure (computed once) and how this sharding splits it, as numbers.
  const Graph& g = *g_;
  key.clear();
  key.push_back(static_id_[size_t(layer)]);
  auto pattern = [&](const SplitPattern& p) {
    key.push_back(int64_t(p.blocks.size()));
    for (const auto& b : p.blocks) {
      key.push_back(b.first);
      key.push_back(b.second);
    }
    key.push_back(int64_t(p.kept.size()) * 2 + int64_t(p.padded));
    for (const auto& b : p.kept) {
      key.push_back(b.first);
      key.push_back(b.second);
    }
  };
  for (int n : g.layers[size_t(layer)].nodes) {
    const stages::Node& node = g.nodes[size_t(n)];
    const NodeShard& ns = s.nodes[size_t(n)];
    key.push_back(-1);
    key.push_back(int(ns.kind) * 1000000 + ns.t * 4 + ns.reduce_output * 2 + ns.bias_after_reduce);
    for (int c : ns.copy_inputs) key.push_back(100 + c);
    for (int c : ns.gather_inputs) key.push_back(200 + c);
    for (int v : node.inputs) {
      int prod = g.values[size_t(v)].producer;
      if (prod >= 0 && g.nodes[size_t(prod)].layer == layer) continue;
      const ValueShard& vs = s.values[size_t(v)];
      key.push_back(-2 - vs.t * int(vs.split));
      if (vs.split) {
        key.push_back(vs.dim);
        pattern(vs.pattern);
      }
    }
    for (int p : node.params) {
      if (p < 0) continue;
      const ParamShard& ps = s.params[size_t(p)];
      key.push_back(-3 - (ps.dim + 1) * 1000 - ps.t);
      if (ps.dim >= 0) pattern(ps.pattern);
    }
  }
}

std::optional<CostModel::OpTimes> CostModel::measured_op(const stages::Node& node, int t,
                                                         int64_t batch, double flops) const {
  if (measured_ == nullptr) return std::nullopt;
  // Each micro-batch size the profile timed the node at, as times at this batch: the
  // shard's own measurement where the profile has one for this degree, else the whole
  // op's, scaled by the FLOPs (this batch, and a split op's share of the logical op's).
  struct Point {
    int64_t batch;
    OpTimes at;
  };
  std::vector<Point> points;
  auto add = [&](int64_t b, double in_step, const std::map<std::string, MeasuredCosts::Op>& ops,
                 const std::map<int, std::map<std::string, MeasuredCosts::Op>>& tp_ops) {
    const MeasuredCosts::Op* m = nullptr;
    auto find = [&](const std::map<std::string, MeasuredCosts::Op>& of) {
      auto mi = of.find(node.name);
      if (mi != of.end() && mi->second.op == node.op) m = &mi->second;
    };
    if (auto d = tp_ops.find(t); t > 1 && d != tp_ops.end()) find(d->second);
    if (m == nullptr) find(ops);
    if (m == nullptr) return;
    const double scale = (m->flops > 0 ? flops / m->flops : double(batch) / double(b)) * in_step;
    const OpTimes at{m->forward * scale, m->backward_input * scale, m->backward_weight * scale};
    // Scaled past what a cost file may hold for an op, the step times are meaningless (and
    // their sums inf): the flops the file gives are not this op's.
    if (const double most = std::max({at.f, at.b, at.w}); !(most <= kMaxOpSeconds)) {
      const std::string where = m->where.empty() ? "costs: $.ops." + node.name : m->where;
      const std::string beyond = " s, beyond " + g_text(kMaxOpSeconds) + " s an op";
      if (m->flops > 0)
        throw InputError(where + ".flops: " + g_text(m->flops) + " FLOPs at micro-batch " +
                         std::to_string(b) + " scale the op's times to " + g_text(most) +
                         " s for its " + g_text(flops) + " FLOPs at micro-batch " +
                         std::to_string(batch) + beyond +
                         "; expected the op's FLOP count as baton profile writes it");
      throw InputError(where + ": the op's times at micro-batch " + std::to_string(b) +
                       " scaled to micro-batch " + std::to_string(batch) + " reach " +
                       g_text(most) + beyond);
    }
    points.push_back({b, at});
  };
  add(measured_->batch, measured_->in_step, measured_->ops, measured_->tp_ops);
  for (const MeasuredCosts::AtBatch& m : measured_->more_batches)
    add(m.batch, m.in_step, m.ops, m.tp_ops);
  if (points.empty()) return std::nullopt;
  std::sort(points.begin(), points.end(),
            [](const Point& a, const Point& b) { return a.batch < b.batch; });
  // Outside the measured sizes, the nearest one scaled; between two, the line through
  // their own times (each point's times at its own batch are `at` x its batch / batch).
  auto hi = std::lower_bound(points.begin(), points.end(), batch,
                             [](const Point& p, int64_t b) { return p.batch < b; });
  if (hi == points.end()) return points.back().at;
  if (hi == points.begin() || hi->batch == batch) return hi->at;
  const Point& lo = *(hi - 1);
  const double x = double(batch - lo.batch) / double(hi->batch - lo.batch);
  auto line = [&](double a, double b) {
    const double ta = a * double(lo.batch) / double(batch),
                 tb = b * double(hi->batch) / double(batch);
    return ta + (tb - ta) * x;
  };
  return OpTimes{line(lo.at.f, hi->at.f), line(lo.at.b, hi->at.b), line(lo.at.w, hi->at.w)};
}

LayerCost CostModel::layer_cost(const Sharding& s, int layer, const std::string& sig,
                                int64_t batch) {
  std::string key = std::to_string(batch) + "#" + sig;
  auto it = layer_cache_.find(key);
  if (it != layer_cache_.end()) return it->second;

  LayerGraph lg = build_layer(*g_, s, layer, 0);
  const Graph& pg = *lg.graph;
  LayerCost c;
  for (const stages::Node& node : pg.nodes) {
    stages::OpCost k = node.impl->cost(batch);
    c.f_flops += k.forward_flops;
    c.b_flops += k.backward_input_flops;
    c.w_flops += k.backward_weight_flops;
    int t = s.nodes.empty() ? 1 : s.layer_tp[size_t(layer)];
    double tf = 0, tb = 0;
    if (node.op == "tp_gather")
      tf = all_gather_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth,
                           machine_.tp_latency);
    else if (node.op == "vocab_parallel_cross_entropy")
      // Two all-reduces (row maxima, then sums and target logits).
      tf = all_reduce_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth,
                           machine_.tp_latency) +
           2.0 * (t - 1) * machine_.tp_latency;
    else
      tf = all_reduce_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth,
                           machine_.tp_latency);
    tb = all_reduce_time(double(k.backward_comm_bytes), t, machine_.tp_bandwidth,
                         machine_.tp_latency);
    c.tp_forward_bytes += double(k.forward_comm_bytes);
    c.tp_backward_bytes += double(k.backward_comm_bytes);
    c.tp = t;
    c.tp_forward_collectives += k.forward_comm_bytes > 0;
    c.tp_backward_collectives += k.backward_comm_bytes > 0;
    const double flops = k.forward_flops + k.backward_input_flops + k.backward_weight_flops;
    if (const std::optional<OpTimes> m = measured_op(node, t, batch, flops)) {
      c.f += m->f + tf;
      c.b += m->b + tb;
      c.w += m->w;
    } else {
      c.f += k.forward_flops / machine_.flops + tf;
      c.b += k.backward_input_flops / machine_.flops + tb;
      c.w += k.backward_weight_flops / machine_.flops;
    }
  }
  // Memory as the ranks run the layer: with its fused kernels (partitioner/fusion.h).
  // (Its values keep their names, not their ids: h of a bias_gelu is a new value.)
  const std::shared_ptr<const Graph> fused = fuse_kernels(pg);
  auto fused_id = [&](int v) { return fused->find_value(pg.values[size_t(v)].name); };
  WalkSpec w;
  w.graph = fused.get();
  w.first = 0;
  w.last = 1;
  for (int v : lg.boundary_in) w.boundary_in.push_back(fused_id(v));
  for (int v : lg.boundary_out) w.boundary_out.push_back(fused_id(v));
  for (int v : pg.inputs)
    if (std::find(lg.boundary_in.begin(), lg.boundary_in.end(), v) == lg.boundary_in.end())
      w.model_in.push_back(fused_id(v));
  w.batch = batch;
  c.mem = walk_micro_batch(w);
  w.recompute = {0};
  c.mem_recompute = walk_micro_batch(w);
  layer_cache_.emplace(key, c);
  return c;
}

CostModel::Classes CostModel::classify(const Sharding& s) const {
  const Graph& g = *g_;
  const int L = g.num_layers();
  Classes c;
  std::map<std::vector<int64_t>, int> ids;
  std::vector<int64_t> key;
  for (int l = 0; l < L; ++l) {
    signature(s, l, key);
    auto it = ids.find(key);
    if (it == ids.end()) {
      it = ids.emplace(key, int(c.representative.size())).first;
      c.representative.push_back(l);
      // The cache key of its per-batch costs: the structure's text and these numbers.
      std::string text = static_signature(l) + "#";
      for (int64_t x : key) text += std::to_string(x) + ",";
      c.key.push_back(std::move(text));
    }
    c.of_layer.push_back(it->second);
  }
  c.own_param_bytes.assign(size_t(L), 0);
  for (size_t p = 0; p < g.params.size(); ++p) {
    const stages::Param& lp = g.params[p];
    int64_t n = memory::shape_numel(lp.logical_shape);
    const ParamShard& ps = s.params[p];
    if (ps.dim >= 0 && ps.t > 1)
      n = n / lp.logical_shape[size_t(ps.dim)] * ps.pattern.local_size(ps.t);
    int64_t bytes = int64_t(memory::Allocator::rounded(size_t(n) * memory::dtype_size(lp.dtype)));
    if (lp.layers.size() == 1)
      c.own_param_bytes[size_t(lp.layers[0])] += bytes;
    else if (lp.layers.size() > 1)
      c.shared_params.push_back({int(p), bytes, lp.layers});
  }
  // Bytes crossing each cut: a value produced in layer a and last read in layer b crosses
  // the cuts a+1 .. b (the loss crosses every later cut: the last stage hands it on).
  std::vector<double> diff(size_t(L + 2), 0.0);
  c.inputs_per_sample.assign(size_t(L), {});
  for (size_t v = 0; v < g.values.size(); ++v) {
    const stages::Value& val = g.values[v];
    int64_t numel = memory::shape_numel(val.type.shape);
    const ValueShard& vs = s.values[v];
    if (vs.split)
      numel = numel / val.type.shape[vs.dim_index(val.type.shape)] * vs.pattern.local_size(vs.t);
    double bytes = double(numel) * double(memory::dtype_size(val.type.dtype));
    if (val.is_input()) {
      if (!val.consumers.empty())
        c.inputs_per_sample[size_t(g.nodes[size_t(val.consumers.front())].layer)].push_back(
            int64_t(bytes));
      continue;
    }
    int a = g.nodes[size_t(val.producer)].layer, e = a;
    for (int n : val.consumers) e = std::max(e, g.nodes[size_t(n)].layer);
    if (int(v) == g.loss) e = L;
    if (e <= a || !val.type.batched) continue;
    diff[size_t(a + 1)] += bytes;
    diff[size_t(e + 1)] -= bytes;
  }
  c.cut_bytes_per_sample.assign(size_t(L + 1), 0.0);
  double run = 0;
  for (int k = 0; k <= L; ++k) {
    run += diff[size_t(k)];
    c.cut_bytes_per_sample[size_t(k)] = run;
  }
  return c;
}

CostTable CostModel::table_for(const Sharding& s, int64_t batch) {
  return build_table(s, classify(s), batch);
}

CostTable CostModel::build_table(const Sharding& s, const Classes& classes, int64_t batch) {
  const int L = g_->num_layers();
  CostTable t;
  t.tp = s.layer_tp.empty() ? 1 : s.layer_tp.front();
  t.batch = batch;
  t.replicated_cut = s.replicated_cut;
  std::vector<LayerCost> per_class;
  for (size_t k = 0; k < classes.representative.size(); ++k)
    per_class.push_back(layer_cost(s, classes.representative[k], classes.key[k], batch));
  t.layers.reserve(size_t(L));
  for (int l = 0; l < L; ++l) t.layers.push_back(per_class[size_t(classes.of_layer[size_t(l)])]);
  t.own_param_bytes = classes.own_param_bytes;
  t.shared_params = classes.shared_params;
  t.cut_bytes.resize(classes.cut_bytes_per_sample.size());
  for (size_t k = 0; k < t.cut_bytes.size(); ++k)
    t.cut_bytes[k] = classes.cut_bytes_per_sample[k] * double(batch);
  t.input_bytes.assign(size_t(L), 0);
  for (int l = 0; l < L; ++l)
    for (int64_t b : classes.inputs_per_sample[size_t(l)])
      t.input_bytes[size_t(l)] += int64_t(memory::Allocator::rounded(size_t(b * batch)));
  t.pf.assign(size_t(L + 1), 0.0);
  t.pb = t.pw = t.pf;
  t.pparams.assign(size_t(L + 1), 0);
  for (int l = 0; l < L; ++l) {
    t.pf[size_t(l + 1)] = t.pf[size_t(l)] + t.layers[size_t(l)].f;
    t.pb[size_t(l + 1)] = t.pb[size_t(l)] + t.layers[size_t(l)].b;
    t.pw[size_t(l + 1)] = t.pw[size_t(l)] + t.layers[size_t(l)].w;
    t.pparams[size_t(l + 1)] = t.pparams[size_t(l)] + t.own_param_bytes[size_t(l)];
  }
  return t;
}

std::string CostModel::key(int tp, int64_t batch, const SplitOverrides& overrides) const {
  std::string k = std::to_string(tp) + "/" + std::to_string(batch);
  for (const auto& [n, v] : overrides.kinds) k += "/" + n + "=" + std::string(split_name(v));
  return k;
}

const Sharding& CostModel::sharding(int tp, int64_t, const SplitOverrides& overrides,
                                    const std::string& where) {
  std::string k = key(tp, 0, overrides);
  auto it = shardings_.find(k);
  if (it != shardings_.end()) return *it->second;
  std::vector<int> layer_tp(size_t(g_->num_layers()), tp);
  auto s = std::make_unique<Sharding>(plan_sharding(*g_, layer_tp, overrides, where));
  return *shardings_.emplace(k, std::move(s)).first->second;
}

const CostTable& CostModel::table(int tp, int64_t batch, const SplitOverrides& overrides,
                                  const std::string& where) {
  std::string k = key(tp, batch, overrides);
  auto it = tables_.find(k);
  if (it != tables_.end()) return *it->second;
  const Sharding& s = sharding(tp, batch, overrides, where);
  std::string ck = key(tp, 0, overrides);
  auto ci = classes_.find(ck);
  if (ci == classes_.end()) ci = classes_.emplace(ck, classify(s)).first;
  auto t = std::make_unique<CostTable>(build_table(s, ci->second, batch));
  return *tables_.emplace(k, std::move(t)).first->second;
}

}  // namespace baton::partitioner
