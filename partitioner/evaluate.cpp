#include "partitioner/evaluate.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "memory/error.h"
#include "memory/units.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "stages/model.h"

namespace baton::partitioner {

using stages::Graph;

std::vector<int> ResolvedPlan::stages_of(int pp) const {
  return schedule::stages_of_rank(schedule, pp);
}

std::set<int> ResolvedPlan::recompute_layers() const {
  std::set<int> out;
  for (const auto& s : recompute) out.insert(s.begin(), s.end());
  return out;
}

int64_t PlanEstimate::max_peak() const {
  int64_t m = 0;
  for (const RankEstimate& r : ranks) m = std::max(m, r.peak);
  return m;
}

std::shared_ptr<const Graph> load_plan_model(const Plan& plan) {
  try {
    if (!plan.model_path.empty())
      return std::make_shared<const Graph>(stages::load_model(plan.model_path_resolved));
    return std::make_shared<const Graph>(
        stages::load_model_json(plan.model_json, plan.where("$.model")));
  } catch (const InputError& e) {
    if (!plan.model_path.empty()) throw InputError(plan.where("$.model") + ": " + e.what());
    throw;
  }
}

namespace {

std::string layer_ref(const Graph& g, int l) {
  return "layer " + std::to_string(l) + " ('" + g.layers[size_t(l)].name + "')";
}

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void resolve_layers(const Plan& p, const Graph& g, ResolvedPlan& r) {
  const int L = g.num_layers();
  std::vector<int> owner(size_t(L), -1);
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const PlanStage& st = p.stages[k];
    std::vector<int> layers;
    if (st.first_layer >= 0) {
      if (st.last_layer > L)
        throw InputError(st.json_path + ".layers: expected layer indices within the model's " +
                         std::to_string(L) + " layers (last <= " + std::to_string(L) +
                         "), found [" + std::to_string(st.first_layer) + ", " +
                         std::to_string(st.last_layer) + "]");
      for (int l = st.first_layer; l < st.last_layer; ++l) layers.push_back(l);
    } else {
      for (size_t i = 0; i < st.layer_names.size(); ++i) {
        int l = g.find_layer(st.layer_names[i]);
        if (l < 0)
          throw InputError(st.json_path + ".layers[" + std::to_string(i) + "]: no layer named '" +
                           st.layer_names[i] + "' in the model");
        layers.push_back(l);
      }
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      int l = layers[i];
      if (owner[size_t(l)] >= 0)
        throw InputError(
            st.json_path + ".layers: " + layer_ref(g, l) + " is placed twice (also in " +
            p.stages[size_t(owner[size_t(l)])].json_path.substr(p.where("").size()) + ")");
      owner[size_t(l)] = int(k);
      if (i > 0 && l != layers[i - 1] + 1)
        throw InputError(st.json_path +
                         ".layers: a stage holds consecutive layers in model order; " +
                         layer_ref(g, l) + " does not follow " + layer_ref(g, layers[i - 1]));
    }
    r.chunk_first.push_back(layers.front());
    r.chunk_last.push_back(layers.back() + 1);
  }
  for (int l = 0; l < L; ++l)
    if (owner[size_t(l)] < 0)
      throw InputError(p.where("$.stages") + ": " + layer_ref(g, l) + " is in no stage");
  for (int l = 1; l < L; ++l)
    if (owner[size_t(l)] < owner[size_t(l - 1)])
      throw InputError(p.stages[size_t(owner[size_t(l)])].json_path +
                       ".layers: stages hold the model's layers in order, but " + layer_ref(g, l) +
                       " comes after " + layer_ref(g, l - 1) + " of a later stage");
}

void resolve_recompute(const Plan& p, const Graph& g, ResolvedPlan& r) {
  r.recompute.assign(p.stages.size(), {});
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const PlanStage& st = p.stages[k];
    if (st.recompute_all)
      for (int l = r.chunk_first[k]; l < r.chunk_last[k]; ++l) r.recompute[k].insert(l);
    for (size_t i = 0; i < st.recompute_names.size(); ++i) {
      int l = g.find_layer(st.recompute_names[i]);
      if (l < r.chunk_first[k] || l >= r.chunk_last[k])
        throw InputError(st.json_path + ".recompute[" + std::to_string(i) +
                         "]: expected a layer of this stage (" +
                         g.layers[size_t(r.chunk_first[k])].name + " .. " +
                         g.layers[size_t(r.chunk_last[k] - 1)].name + "), found '" +
                         st.recompute_names[i] + "'");
      r.recompute[k].insert(l);
    }
  }
}

}  // namespace

ResolvedPlan resolve_plan(const Plan& p, std::shared_ptr<const Graph> graph) {
  ResolvedPlan r;
  r.plan = p;
  r.graph = graph;
  const Graph& g = *graph;
  r.layout = Layout(p.dp, p.tp);
  std::string name;
  try {
    name = schedule::canonical_schedule_name(p.schedule);
  } catch (const InputError& e) {
    throw InputError(p.where("$.schedule.name") + ": " + e.what());
  }
  try {
    r.schedule = schedule::generate(name, p.pp, p.micro_batches, p.chunks);
  } catch (const InputError& e) {
    throw InputError(p.where("$.schedule") + ": " + e.what());
  }
  const int S = r.schedule.stages_per_direction();
  if (int(p.stages.size()) != S)
    throw InputError(p.where("$.stages") + ": expected " + std::to_string(S) +
                     " stages (schedule " + name + " on " + std::to_string(p.pp) +
                     " pipeline ranks holds " + std::to_string(S) + " model chunks), found " +
                     std::to_string(p.stages.size()));
  if (S > g.num_layers())
    throw InputError(p.where("$.stages") + ": " + std::to_string(S) + " stages for a model of " +
                     std::to_string(g.num_layers()) + " layers");
  resolve_layers(p, g, r);

  // Placement: which pipeline ranks hold each chunk, and the degree of its layers.
  std::vector<std::set<int>> holders(static_cast<size_t>(S));
  for (int s = 0; s < r.schedule.num_stages(); ++s) {
    int k = schedule::stage_chunk(r.schedule, s);
    r.chunk_of_stage.push_back(k);
    holders[size_t(k)].insert(r.schedule.placement[size_t(s)]);
  }
  r.layer_tp.assign(size_t(g.num_layers()), 1);
  for (int k = 0; k < S; ++k) {
    std::vector<int> expect(holders[size_t(k)].begin(), holders[size_t(k)].end());
    const PlanStage& st = p.stages[size_t(k)];
    if (!st.pipeline_ranks.empty() && st.pipeline_ranks != expect)
      throw InputError(st.json_path + ".pipeline_ranks: expected " + list_str(expect) + " (the " +
                       name + " placement of model chunk " + std::to_string(k) + "), found " +
                       list_str(st.pipeline_ranks));
    r.plan.stages[size_t(k)].pipeline_ranks = expect;
    std::set<int> degrees;
    for (int pp : expect) degrees.insert(p.tp[size_t(pp)]);
    if (degrees.size() > 1)
      throw InputError(p.where("$.parallel.tp") + ": model chunk " + std::to_string(k) +
                       " runs on pipeline ranks " + list_str(expect) +
                       " with different tensor-parallel degrees; a chunk needs one degree");
    for (int l = r.chunk_first[size_t(k)]; l < r.chunk_last[size_t(k)]; ++l)
      r.layer_tp[size_t(l)] = *degrees.begin();
  }
  // A parameter several pipeline ranks hold (tied embeddings) needs the same split there.
  for (const stages::Param& prm : g.params) {
    std::set<int> degrees;
    for (int l : prm.layers) degrees.insert(r.layer_tp[size_t(l)]);
    if (degrees.size() > 1)
      throw InputError(p.where("$.parallel.tp") + ": parameter '" + prm.name + "' is used by " +
                       layer_ref(g, prm.layers.front()) + " and " +
                       layer_ref(g, prm.layers.back()) +
                       " on pipeline ranks of different tensor-parallel degrees; a tied parameter "
                       "needs one degree");
  }
  if (!p.boundaries.is_null()) {
    nlohmann::json want = derive_boundaries(r.plan);
    for (size_t i = 0; i < std::max(want.size(), p.boundaries.size()); ++i)
      if (i >= want.size() || i >= p.boundaries.size() || want[i] != p.boundaries[i])
        throw InputError(
            p.boundaries_path + "[" + std::to_string(i) + "]: expected " +
            (i < want.size() ? want[i].dump() : std::string("no entry")) +
            " (from the degrees and the placement), found " +
            (i < p.boundaries.size() ? p.boundaries[i].dump() : std::string("no entry")));
  }
  resolve_recompute(p, g, r);
  SplitOverrides ov{p.splits, p.split_paths};
  r.sharding = plan_sharding(g, r.layer_tp, ov, p.where("$.parallel.tp"));
  return r;
}

std::shared_ptr<stages::Graph> physical_graph(const ResolvedPlan& r, int rank) {
  RankCoord c = r.layout.coord(rank);
  std::vector<int> index(size_t(r.graph->num_layers()));
  for (int l = 0; l < r.graph->num_layers(); ++l) index[size_t(l)] = c.tp % r.layer_tp[size_t(l)];
  return build_physical(*r.graph, r.sharding, index);
}

schedule::Costs schedule_costs(const ResolvedPlan& r, const CostTable& t, const Machine& m,
                               const std::vector<StageMemory>& stage_mem) {
  const int n = r.schedule.num_stages();
  schedule::Costs c;
  c.forward.assign(size_t(n), 0);
  c.backward_input = c.backward_weight = c.activation_bytes = c.activation_bytes_after_b =
      c.message_bytes = c.reduce = c.forward;
  const int opt = optimizer_states(r.plan.optimizer);
  double max_state = 0;
  std::map<int, double> rank_state;
  for (int s = 0; s < n; ++s) {
    int k = r.chunk_of_stage[size_t(s)];
    int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
    const std::set<int>& rc = r.recompute[size_t(k)];
    c.forward[size_t(s)] = t.pf[size_t(b)] - t.pf[size_t(a)];
    c.backward_input[size_t(s)] = t.pb[size_t(b)] - t.pb[size_t(a)];
    c.backward_weight[size_t(s)] = t.pw[size_t(b)] - t.pw[size_t(a)];
    for (int l : rc)
      c.backward_input[size_t(s)] += t.layers[size_t(l)].f;  // recompute runs F again
    if (!stage_mem.empty()) {
      c.activation_bytes[size_t(s)] = double(stage_mem[size_t(s)].mb.stash);
      c.activation_bytes_after_b[size_t(s)] = double(stage_mem[size_t(s)].mb.w_stash);
    }
    c.message_bytes[size_t(s)] = t.cut_bytes[size_t(b)];
    // Gradient reduction: over the data-parallel replicas, and over the other pipeline
    // ranks holding a tied parameter.
    double grads = double(t.param_bytes(a, b)), reduce = 0;
    for (const ParamUse& u : t.shared_params) {
      bool here = false, elsewhere = false;
      for (int l : u.layers) (l >= a && l < b ? here : elsewhere) = true;
      if (here && elsewhere)
        reduce += all_reduce_time(double(u.bytes), 2 * r.plan.dp, m.dp_bandwidth, m.dp_latency);
    }
    reduce += all_reduce_time(grads, r.plan.dp, m.dp_bandwidth, m.dp_latency);
    c.reduce[size_t(s)] = reduce;
    rank_state[r.schedule.placement[size_t(s)]] += grads * (2 + 2 * opt + 1);
  }
  for (const auto& [rank, bytes] : rank_state) max_state = std::max(max_state, bytes);
  c.optimizer_step = max_state / m.memory_bandwidth;
  c.latency = m.p2p_latency;
  c.bandwidth = m.p2p_bandwidth;
  return c;
}

PlanEstimate evaluate_plan(const ResolvedPlan& r, CostModel& model,
                           const EvaluateOptions& options) {
  const Graph& g = *r.graph;
  const Plan& p = r.plan;
  CostTable table = model.table_for(r.sharding, p.micro_batch_size);
  const int opt = optimizer_states(p.optimizer);
  const int K = r.num_chunks();

  // Memory per model chunk (the same on every rank holding it, whatever its TP index).
  std::vector<StageMemory> chunk_mem(static_cast<size_t>(K));
  std::shared_ptr<Graph> pg;
  if (options.exact_memory)
    pg = build_physical(g, r.sharding, std::vector<int>(size_t(g.num_layers()), 0));
  for (int k = 0; k < K; ++k) {
    int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
    chunk_mem[size_t(k)] =
        options.exact_memory
            ? stage_memory(*pg, a, b, r.recompute[size_t(k)], p.micro_batch_size, opt)
            : compose_stage_memory(table, a, b, r.recompute[size_t(k)], opt);
  }
  std::vector<StageMemory> stage_mem;
  for (int s = 0; s < r.schedule.num_stages(); ++s)
    stage_mem.push_back(chunk_mem[size_t(r.chunk_of_stage[size_t(s)])]);

  // The step: the schedule with its gradient reductions and optimizer step.
  schedule::Costs costs = schedule_costs(r, table, model.machine(), stage_mem);
  schedule::LowerOptions lo;
  lo.transfers = false;
  schedule::Schedule lowered = schedule::lower(r.schedule, lo);
  schedule::SimResult sim = schedule::simulate(lowered, costs);

  PlanEstimate e;
  e.step_time = sim.makespan;
  e.bubble = sim.bubble;
  const stages::Value& tokens = g.values[size_t(g.inputs.front())];
  e.tokens_per_step = p.global_batch * std::max<int64_t>(1, memory::shape_numel(tokens.type.shape));
  e.tokens_per_second = e.step_time > 0 ? double(e.tokens_per_step) / e.step_time : 0;

  for (int rank = 0; rank < r.layout.world(); ++rank) {
    RankEstimate re;
    re.rank = rank;
    re.coord = r.layout.coord(rank);
    re.stages = r.stages_of(re.coord.pp);
    std::set<int> params;
    for (int s : re.stages) {
      int k = r.chunk_of_stage[size_t(s)];
      int a = r.chunk_first[size_t(k)], b = r.chunk_last[size_t(k)];
      if (!re.layers.empty()) re.layers += ", ";
      re.layers +=
          g.layers[size_t(a)].name + (b - a > 1 ? " .. " + g.layers[size_t(b - 1)].name : "");
      for (int id : g.params_used(a, b)) params.insert(id);
      const StageMemory& m = chunk_mem[size_t(k)];
      re.param_bytes += m.params;
      re.grad_bytes += m.grads;
      re.optimizer_bytes += m.optimizer;
      re.compute_time += p.micro_batches / r.schedule.num_directions *
                         (costs.forward[size_t(s)] + costs.backward_input[size_t(s)] +
                          costs.backward_weight[size_t(s)]);
    }
    for (int id : params) {
      const stages::Param& prm = g.params[size_t(id)];
      int64_t n = memory::shape_numel(prm.logical_shape);
      const ParamShard& sh = r.sharding.params[size_t(id)];
      if (sh.dim >= 0 && sh.t > 1)
        n = n / prm.logical_shape[size_t(sh.dim)] * sh.pattern.local_size(sh.t);
      re.parameters += n;
    }
    re.peak = rank_peak(r.schedule, re.coord.pp, stage_mem);
    re.activation_peak = re.peak - re.param_bytes - re.grad_bytes - re.optimizer_bytes;
    re.busy_fraction = e.step_time > 0 ? re.compute_time / e.step_time : 0;
    if (p.device_memory > 0 && re.peak > p.device_memory && re.coord.dp == 0 && re.coord.tp == 0)
      e.problems.push_back("rank " + std::to_string(rank) + " (pp " + std::to_string(re.coord.pp) +
                           ", " + re.layers + ") needs " + memory::format_bytes(double(re.peak)) +
                           ", over its capacity of " +
                           memory::format_bytes(double(p.device_memory)) + " by " +
                           memory::format_bytes(double(re.peak - p.device_memory)) +
                           (p.tp[size_t(re.coord.pp)] > 1 || p.dp > 1
                                ? " (as do its tensor- and data-parallel peers)"
                                : ""));
    e.ranks.push_back(re);
  }
  return e;
}

std::string format_estimate(const ResolvedPlan& r, const PlanEstimate& e) {
  const Plan& p = r.plan;
  const Graph& g = *r.graph;
  std::string out;
  char line[512];
  std::string tp = std::to_string(p.tp.front());
  if (!p.uniform_tp()) {
    tp.clear();
    for (size_t i = 0; i < p.tp.size(); ++i) tp += (i ? "," : "") + std::to_string(p.tp[i]);
  }
  std::snprintf(
      line, sizeof line,
      "%s (%d layers, %.3g M parameters) on %d devices: dp %d x pp %d x tp %s; schedule %s, %d "
      "micro-batches of %lld samples (global batch %lld); optimizer %s\n",
      g.name.c_str(), g.num_layers(), double(g.num_parameters()) / 1e6, p.devices, p.dp, p.pp,
      tp.c_str(), r.schedule.name.c_str(), p.micro_batches, (long long)p.micro_batch_size,
      (long long)p.global_batch, p.optimizer.c_str());
  out += line;
  std::snprintf(line, sizeof line, "%-5s %-3s %-3s %-3s %-24s %12s %12s %12s %12s %12s %10s %6s\n",
                "rank", "dp", "pp", "tp", "layers", "parameters", "weights", "grads+optim",
                "activations", "peak", "compute", "busy");
  out += line;
  for (const RankEstimate& re : e.ranks) {
    std::string layers = re.layers.size() > 24 ? re.layers.substr(0, 21) + "..." : re.layers;
    bool over = p.device_memory > 0 && re.peak > p.device_memory;
    std::snprintf(line, sizeof line,
                  "%-5d %-3d %-3d %-3d %-24s %12lld %12s %12s %12s %12s %8.2fms %5.1f%%%s\n",
                  re.rank, re.coord.dp, re.coord.pp, re.coord.tp, layers.c_str(),
                  (long long)re.parameters, memory::format_bytes(double(re.param_bytes)).c_str(),
                  memory::format_bytes(double(re.grad_bytes + re.optimizer_bytes)).c_str(),
                  memory::format_bytes(double(re.activation_peak)).c_str(),
                  memory::format_bytes(double(re.peak)).c_str(), 1e3 * re.compute_time,
                  100 * re.busy_fraction, over ? "  OVER CAPACITY" : "");
    out += line;
  }
  for (const auto& b : derive_boundaries(p)) {
    if (b["pattern"] == "one-to-one" || b["pattern"] == "in-memory") continue;
    std::snprintf(line, sizeof line,
                  "boundary after stage %d: pipeline rank %d (tp %d) -> %d (tp %d): %s\n",
                  b["after_stage"].get<int>(), b["from_pipeline_rank"].get<int>(),
                  b["from_tp"].get<int>(), b["to_pipeline_rank"].get<int>(), b["to_tp"].get<int>(),
                  b["pattern"].get<std::string>().c_str());
    out += line;
  }
  std::snprintf(
      line, sizeof line,
      "predicted step time %.3f ms (bubble %.1f%%), %.0f tokens/s; peak memory %s of %s per "
      "device\n",
      1e3 * e.step_time, 100 * e.bubble, e.tokens_per_second,
      memory::format_bytes(double(e.max_peak())).c_str(),
      p.device_memory > 0 ? memory::format_bytes(double(p.device_memory)).c_str() : "unlimited");
  out += line;
  return out;
}

}  // namespace baton::partitioner
