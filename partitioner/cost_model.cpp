#include "partitioner/cost_model.h"

#include <algorithm>
#include <cmath>

#include "memory/allocator.h"
#include "memory/error.h"
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

// ---- the cost file ----

MeasuredCosts read_measured_costs(const std::string& path) {
  nlohmann::json j = stages::read_json_file(path);
  stages::JsonReader r(j, path);
  r.expect_only({"version", "kind", "model", "batch", "threads", "machine", "ops"});
  if (r.at("version").as_int() != 1) r.at("version").fail("1");
  if (r.at("kind").as_string() != "op_times") r.at("kind").fail("\"op_times\"");
  MeasuredCosts c;
  c.model = r.get_string("model", "");
  c.batch = r.at("batch").as_int(1, INT64_MAX);
  c.threads = int(r.get_int("threads", 1, 1, 1 << 16));
  if (auto m = r.get("machine")) m->expect_object();
  stages::JsonReader ops = r.at("ops");
  ops.expect_object();
  for (const std::string& name : ops.keys()) {
    stages::JsonReader o = ops.at(name);
    o.expect_only({"op", "forward", "backward_input", "backward_weight", "flops"});
    MeasuredCosts::Op op;
    op.op = o.at("op").as_string();
    op.forward = o.at("forward").as_double(0, 1e9);
    op.backward_input = o.at("backward_input").as_double(0, 1e9);
    op.backward_weight = o.at("backward_weight").as_double(0, 1e9);
    op.flops = o.get_double("flops", 0, 0, 1e30);
    c.ops[name] = op;
  }
  return c;
}

void write_measured_costs(const MeasuredCosts& c, const std::string& path) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [name, o] : c.ops)
    ops[name] = {{"op", o.op},
                 {"forward", o.forward},
                 {"backward_input", o.backward_input},
                 {"backward_weight", o.backward_weight},
                 {"flops", o.flops}};
  nlohmann::json j = {{"version", 1}, {"kind", "op_times"}, {"model", c.model},
                      {"batch", c.batch}, {"threads", c.threads}, {"ops", ops}};
  schedule::write_file_atomically(path, j.dump(1) + "\n");
}

// ---- tables ----

double CostTable::total_time(bool recompute) const {
  double t = 0;
  for (const LayerCost& l : layers) t += l.f + l.b + l.w + (recompute ? l.f : 0);
  return t;
}

StageMemory compose_stage_memory(const CostTable& t, int first, int last, const std::set<int>& recompute,
                                 int optimizer_states) {
  StageMemory m;
  for (const ParamUse& u : t.params) {
    int64_t n = 0;
    for (int l : u.layers) n += l >= first && l < last ? 1 : 0;
    if (n == 0) continue;
    m.params += u.bytes;
    m.grads += u.bytes * (n + (n > 1 ? 1 : 0));
    m.optimizer += u.bytes * optimizer_states;
  }
  // Forward: S(first, l) + forward peak of l. Backward, which runs the layers in reverse:
  // S(first, l) + (W + held-through-backward)(l + 1, last) + backward peak of l.
  int64_t s = 0, after_total = 0;
  auto of = [&](int l) -> const MicroBatchMemory& {
    return recompute.count(l) ? t.layers[size_t(l)].mem_recompute : t.layers[size_t(l)].mem;
  };
  for (int l = first; l < last; ++l) after_total += of(l).w_stash + of(l).held_through_backward;
  int64_t after_before = 0, w_total = 0;
  for (int l = first; l < last; ++l) {
    const MicroBatchMemory& x = of(l);
    m.mb.forward_peak = std::max(m.mb.forward_peak, s + x.forward_peak);
    after_before += x.w_stash + x.held_through_backward;
    m.mb.backward_peak = std::max(m.mb.backward_peak, s + (after_total - after_before) + x.backward_peak);
    s += x.stash;
    w_total += x.w_stash;
    m.mb.held_through_backward += x.held_through_backward;
  }
  // The caller holds every model input of the stage through its F (counted once more for
  // the layer that reads it: an upper bound).
  for (int l = first; l < last; ++l) m.mb.forward_peak += t.input_bytes[size_t(l)];
  m.mb.stash = s;
  m.mb.w_stash = w_total;
  m.mb.weight_peak = w_total;
  return m;
}

CostModel::CostModel(std::shared_ptr<const Graph> logical, Machine machine, const MeasuredCosts* measured)
    : g_(std::move(logical)), machine_(machine), measured_(measured) {}

std::string CostModel::signature(const Sharding& s, int layer) const {
  const Graph& g = *g_;
  std::string sig;
  sig.reserve(512);
  const auto& nodes = g.layers[size_t(layer)].nodes;
  auto pattern = [&](const SplitPattern& p) {
    for (const auto& b : p.blocks) sig += std::to_string(b.first) + "+" + std::to_string(b.second) + ",";
  };
  for (int n : nodes) {
    const stages::Node& node = g.nodes[size_t(n)];
    const NodeShard& ns = s.nodes[size_t(n)];
    sig += node.op;
    sig += node.attrs.dump();
    sig += "|" + std::to_string(int(ns.kind)) + "," + std::to_string(ns.t) + "," +
           std::to_string(ns.reduce_output) + std::to_string(ns.bias_after_reduce);
    for (int c : ns.copy_inputs) sig += "c" + std::to_string(c);
    for (int c : ns.gather_inputs) sig += "g" + std::to_string(c);
    for (int v : node.inputs) {
      const stages::Value& val = g.values[size_t(v)];
      int prod = val.producer;
      if (prod >= 0 && g.nodes[size_t(prod)].layer == layer) {
        // Within the layer: by position of the producer.
        sig += "<" + std::to_string(prod - nodes.front());
      } else {
        sig += "<x" + stages::type_str(val.type);
        const ValueShard& vs = s.values[size_t(v)];
        if (vs.split) {
          sig += "s" + std::to_string(vs.t);
          pattern(vs.pattern);
        }
      }
    }
    for (int p : node.params) {
      if (p < 0) {
        sig += "p-";
        continue;
      }
      sig += "p" + memory::shape_str(g.params[size_t(p)].shape);
      const ParamShard& ps = s.params[size_t(p)];
      sig += std::to_string(ps.dim) + "/" + std::to_string(ps.t);
      pattern(ps.pattern);
    }
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

LayerCost CostModel::layer_cost(const Sharding& s, int layer, int64_t batch) {
  std::string key = std::to_string(batch) + "#" + signature(s, layer);
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
      tf = all_gather_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth, machine_.tp_latency);
    else if (node.op == "vocab_parallel_cross_entropy")
      // Two all-reduces (row maxima, then sums and target logits).
      tf = all_reduce_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth, machine_.tp_latency) +
           2.0 * (t - 1) * machine_.tp_latency;
    else
      tf = all_reduce_time(double(k.forward_comm_bytes), t, machine_.tp_bandwidth, machine_.tp_latency);
    tb = all_reduce_time(double(k.backward_comm_bytes), t, machine_.tp_bandwidth, machine_.tp_latency);
    c.tp_forward_bytes += double(k.forward_comm_bytes);
    c.tp_backward_bytes += double(k.backward_comm_bytes);
    double flops = k.forward_flops + k.backward_input_flops + k.backward_weight_flops;
    const MeasuredCosts::Op* m = nullptr;
    if (measured_ != nullptr) {
      auto mi = measured_->ops.find(node.name);
      if (mi != measured_->ops.end() && mi->second.op == node.op) m = &mi->second;
    }
    if (m != nullptr) {
      // The measured op at the profile's batch, scaled to this batch and, for a split op,
      // by its share of the logical op's FLOPs.
      double scale = m->flops > 0 ? flops / m->flops : double(batch) / double(measured_->batch);
      c.f += m->forward * scale + tf;
      c.b += m->backward_input * scale + tb;
      c.w += m->backward_weight * scale;
    } else {
      c.f += k.forward_flops / machine_.flops + tf;
      c.b += k.backward_input_flops / machine_.flops + tb;
      c.w += k.backward_weight_flops / machine_.flops;
    }
  }
  WalkSpec w;
  w.graph = &pg;
  w.first = 0;
  w.last = 1;
  w.boundary_in = lg.boundary_in;
  w.boundary_out = lg.boundary_out;
  for (int v : pg.inputs)
    if (std::find(lg.boundary_in.begin(), lg.boundary_in.end(), v) == lg.boundary_in.end())
      w.model_in.push_back(v);
  w.batch = batch;
  c.mem = walk_micro_batch(w);
  w.recompute = {0};
  c.mem_recompute = walk_micro_batch(w);
  layer_cache_.emplace(key, c);
  return c;
}

CostTable CostModel::table_for(const Sharding& s, int64_t batch) {
  const Graph& g = *g_;
  const int L = g.num_layers();
  CostTable t;
  t.tp = s.layer_tp.empty() ? 1 : s.layer_tp.front();
  t.batch = batch;
  t.replicated_cut = s.replicated_cut;
  for (int l = 0; l < L; ++l) t.layers.push_back(layer_cost(s, l, batch));
  for (size_t p = 0; p < g.params.size(); ++p) {
    const stages::Param& lp = g.params[p];
    ParamUse u;
    u.layers = lp.layers;
    int64_t n = memory::shape_numel(lp.logical_shape);
    const ParamShard& ps = s.params[p];
    if (ps.dim >= 0 && ps.t > 1) n = n / lp.logical_shape[size_t(ps.dim)] * ps.pattern.local_size(ps.t);
    u.bytes = int64_t(memory::Allocator::rounded(size_t(n) * memory::dtype_size(lp.dtype)));
    t.params.push_back(u);
  }
  // Bytes crossing each cut: a value produced in layer a and last read in layer b crosses
  // the cuts a+1 .. b (the loss crosses every later cut: the last stage hands it on).
  std::vector<double> diff(size_t(L + 2), 0.0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const stages::Value& val = g.values[v];
    if (val.is_input()) continue;
    int a = g.nodes[size_t(val.producer)].layer, b = a;
    for (int c : val.consumers) b = std::max(b, g.nodes[size_t(c)].layer);
    if (int(v) == g.loss) b = L;
    if (b <= a) continue;
    stages::ValueType type = val.type;
    const ValueShard& vs = s.values[v];
    if (vs.split) type.shape.back() = vs.pattern.local_size(vs.t);
    double bytes = double(type.bytes(batch));
    diff[size_t(a + 1)] += bytes;
    diff[size_t(b + 1)] -= bytes;
  }
  t.input_bytes.assign(size_t(L), 0);
  for (int v : g.inputs) {
    const stages::Value& val = g.values[size_t(v)];
    if (val.consumers.empty()) continue;
    int first = g.nodes[size_t(val.consumers.front())].layer;
    t.input_bytes[size_t(first)] += int64_t(memory::Allocator::rounded(size_t(val.type.bytes(batch))));
  }
  t.cut_bytes.assign(size_t(L + 1), 0.0);
  double run = 0;
  for (int c = 0; c <= L; ++c) {
    run += diff[size_t(c)];
    t.cut_bytes[size_t(c)] = run;
  }
  return t;
}

std::string CostModel::key(int tp, int64_t batch, const SplitOverrides& overrides) const {
  std::string k = std::to_string(tp) + "/" + std::to_string(batch);
  for (const auto& [n, v] : overrides.kinds) k += "/" + n + "=" + std::string(split_name(v));
  return k;
}

const Sharding& CostModel::sharding(int tp, int64_t, const SplitOverrides& overrides, const std::string& where) {
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
  auto t = std::make_unique<CostTable>(table_for(s, batch));
  return *tables_.emplace(k, std::move(t)).first->second;
}

}  // namespace baton::partitioner
