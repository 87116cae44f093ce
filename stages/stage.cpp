#include "stages/stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "kernels/grad_scale.h"
#include "kernels/mixed_precision.h"
#include "stages/json_reader.h"
#include "stages/param_owner.h"
#include "stages/stash_plan.h"

namespace baton::stages {

// ---- optimizer config ----

nlohmann::json OptimizerConfig::to_json() const {
  if (kind == Kind::adamw)
    return {{"type", "adamw"},      {"lr", adamw.lr},   {"beta1", adamw.beta1},
            {"beta2", adamw.beta2}, {"eps", adamw.eps}, {"weight_decay", adamw.weight_decay}};
  return {{"type", "sgd"},
          {"lr", sgd.lr},
          {"momentum", sgd.momentum},
          {"weight_decay", sgd.weight_decay},
          {"nesterov", sgd.nesterov}};
}

OptimizerConfig OptimizerConfig::from_json(const nlohmann::json& j, const std::string& source) {
  JsonReader r(j, source);
  OptimizerConfig c;
  std::string type = r.at("type").as_string();
  if (type == "adamw") {
    r.expect_only({"type", "lr", "beta1", "beta2", "eps", "weight_decay"});
    c.kind = Kind::adamw;
    c.adamw.lr = r.at("lr").as_double(0, kMaxOptimizerRate);
    c.adamw.beta1 = r.get_double("beta1", 0.9, 0, 1);
    c.adamw.beta2 = r.get_double("beta2", 0.999, 0, 1);
    c.adamw.eps = r.get_double("eps", 1e-8, 0, 1);
    // As --eps: 0 divides 0 by 0 for a parameter whose gradients were all 0.
    if (!(c.adamw.eps > 0)) r.at("eps").fail("a value in (0, 1]");
    c.adamw.weight_decay = r.get_double("weight_decay", 0, 0, kMaxOptimizerRate);
  } else if (type == "sgd") {
    r.expect_only({"type", "lr", "momentum", "weight_decay", "nesterov"});
    c.kind = Kind::sgd;
    c.sgd.lr = r.at("lr").as_double(0, kMaxOptimizerRate);
    c.sgd.momentum = r.get_double("momentum", 0, 0, 1);
    c.sgd.weight_decay = r.get_double("weight_decay", 0, 0, kMaxOptimizerRate);
    c.sgd.nesterov = r.get_bool("nesterov", false);
    if (c.sgd.nesterov && c.sgd.momentum == 0)
      r.at("nesterov").fail("false without a momentum (Nesterov's look-ahead is of the momentum)");
  } else {
    r.at("type").fail("\"adamw\" or \"sgd\"");
  }
  return c;
}

void OptimizerConfig::set_lr(double lr) {
  adamw.lr = lr;
  sgd.lr = lr;
}

// ---- state ----

struct Stage::ParamState {
  int id = -1;
  Tensor value;
  Tensor master;              // mixed precision: the f32 master (value is cast from it)
  std::vector<int> layers;    // graph layers of this stage that use it, ascending
  std::vector<Tensor> grads;  // one accumulator per such layer
  std::vector<bool> has;      // has that accumulator received a gradient since zero_grad
  Tensor grad;                // the total (grads[0] itself when one layer uses it)
  Tensor m, v;                // optimizer state (AdamW moments or SGD momentum in m)
  int64_t shard_begin = 0, shard_end = -1;  // elements updated; -1: all (not sharded)
  int owner_layer = 0;                      // the first graph layer that uses it (grad norm pieces)
  bool grad_shard = false;  // ZeRO-2: grad is the shard's accumulator, grads live per micro-batch
};

struct Stage::MbState {
  explicit MbState(const OpContext& c) : ctx(c) {}
  OpContext ctx;
  std::vector<Tensor> values;              // by graph value id
  std::vector<std::vector<Tensor>> saved;  // by graph node id
  std::vector<int> pending;                // by value: B readers still to run
  struct WStash {
    std::vector<Tensor> inputs, outputs, saved, grad_outputs;
    // How many of the node's outputs received a gradient in B: an output nothing reads
    // (add_layernorm's normalised value when only its sum is used) gets none.
    size_t outputs_with_grad = 0;
  };
  std::map<int, WStash> w;  // by node, for W
  bool b_done = false;
};

namespace {

// Adds the time since `t0` to a field of a profile entry when profiling.
class Timer {
 public:
  Timer(bool on, double* field) : on_(on), field_(field) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~Timer() {
    if (on_)
      *field_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  bool on_;
  double* field_;
  std::chrono::steady_clock::time_point t0_;
};

void check_input(const Value& v, const Tensor& t, const MicroBatch& mb) {
  Shape expect = v.type.with_batch(mb.samples);
  if (!t.defined() || t.shape() != expect || t.dtype() != v.type.dtype || !t.is_contiguous())
    throw RuntimeError("stage input '" + v.name + "': expected a contiguous " +
                       std::string(memory::dtype_name(v.type.dtype)) + memory::shape_str(expect) +
                       ", got " + (t.defined() ? t.str() : std::string("nothing")));
}

void init_tensor(Tensor& t, const Param& p, uint64_t seed) {
  // A padded shard (a vocabulary the degree does not divide, docs/partitioner.md) holds
  // zeros past its pieces, whatever the rule: finite, so that the masked logits' zero
  // gradient times those rows stays zero.
  int64_t covered = 0;
  for (const ParamPiece& piece : p.pieces) covered += memory::shape_numel(piece.shape);
  const bool padded = p.is_shard() && covered < t.numel();
  if (padded) t.zero_();
  auto fill = [&](double value) {
    if (!padded) return t.fill_(value);
    for (const ParamPiece& piece : p.pieces) {
      Tensor view = t;
      for (size_t d = 0; d < piece.shape.size(); ++d)
        view = view.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
      view.fill_(value);
    }
  };
  switch (p.init.kind) {
    case InitRule::Kind::zeros:
      t.zero_();
      return;
    case InitRule::Kind::ones:
      fill(1.0);
      return;
    case InitRule::Kind::constant:
      fill(p.init.value);
      return;
    case InitRule::Kind::normal:
      break;
  }
  uint64_t stream = kernels::stream_of(p.name);
  if (!p.is_shard()) {
    kernels::random_normal(t, p.init.mean, p.init.std, seed, stream, kernels::Block{});
    return;
  }
  // Each piece gets exactly the values of its block of the logical parameter, drawn in
  // place: a piece narrower than t in dimension k (a column block of a fused qkv) is
  // contiguous in t only for one index of each dimension before k, so it is drawn as those
  // slabs. A temporary of the piece's shape, held beside the weights and gradients, had
  // raised the rank's start-up peak above its estimate.
  for (const ParamPiece& piece : p.pieces) {
    const size_t rank = piece.shape.size();
    size_t k = 0;  // the dimensions before k are iterated, those from k on taken whole
    for (size_t d = rank; d-- > 0;)
      if (piece.shape[d] != t.size(int64_t(d))) {
        k = d;
        break;
      }
    std::vector<int64_t> at(k, 0);  // the slab's index in each dimension before k
    bool empty = false;
    for (int64_t n : piece.shape) empty = empty || n == 0;
    while (!empty) {
      Tensor slab = t;
      std::vector<int64_t> offsets = piece.global_offsets;
      for (size_t d = 0; d < rank; ++d) {
        const bool one = d < k;
        slab = slab.narrow(int64_t(d), piece.local_offsets[d] + (one ? at[d] : 0),
                           one ? 1 : piece.shape[d]);
        if (one) offsets[d] += at[d];
      }
      kernels::random_normal(slab, p.init.mean, p.init.std, seed, stream,
                             kernels::Block{p.logical_shape, offsets});
      size_t d = k;
      while (d > 0 && ++at[d - 1] == piece.shape[d - 1]) at[--d] = 0;
      if (d == 0) break;
    }
  }
}

// The row of an embedding's padding_idx (the node's global id less its vocab_offset, when
// this table holds it) is zero from the start, as torch's nn.Embedding(padding_idx) and
// transformers' init make it: the lookup gives it no gradient, so a random row would stay.
// Every user of the table is looked at, so a tied copy held by another stage matches.
void zero_padding_rows(const Graph& g, int id, Tensor& t) {
  for (int n : g.params[size_t(id)].users) {
    const Node& node = g.nodes[size_t(n)];
    if (node.op != "embedding" || node.params.empty() || node.params[0] != id ||
        !node.attrs.is_object())
      continue;
    const auto pad = node.attrs.find("padding_idx");
    if (pad == node.attrs.end() || !pad->is_number_integer()) continue;
    const int64_t row = pad->get<int64_t>() - node.attrs.value("vocab_offset", int64_t(0));
    if (row >= 0 && row < t.size(0)) t.narrow(0, row, 1).zero_();
  }
}

}  // namespace

// ---- construction ----

Stage::Stage(std::shared_ptr<const Graph> graph, int first_layer, int last_layer,
             StageOptions options)
    : graph_(std::move(graph)),
      first_(first_layer),
      last_(last_layer),
      opt_options_(std::move(options)) {
  const Graph& g = *graph_;
  if (first_ < 0 || last_ > g.num_layers() || first_ >= last_)
    throw InputError("stage layers [" + std::to_string(first_) + ", " + std::to_string(last_) +
                     ") outside the model's " + std::to_string(g.num_layers()) + " layers");
  StashPlan plan = plan_stash(g, first_, last_, opt_options_.recompute_layers);
  nodes_ = std::move(plan.nodes);
  boundary_in_ = std::move(plan.boundary_in);
  boundary_out_ = std::move(plan.boundary_out);
  model_in_ = std::move(plan.model_in);
  kept_ = std::move(plan.kept);
  needs_grad_ = std::move(plan.needs_grad);
  recompute_node_ = std::move(plan.recompute_node);
  last_forward_use_ = std::move(plan.last_forward_use);
  last_layer_use_ = std::move(plan.last_layer_use);
  backward_users_ = std::move(plan.backward_users);
  param_ids_ = g.params_used(first_, last_);

  local_param_.assign(g.params.size(), -1);
  for (int id : param_ids_) {
    const Param& p = g.params[size_t(id)];
    auto ps = std::make_unique<ParamState>();
    ps->id = id;
    ps->owner_layer = stages::owner_layer(p);
    for (int l : p.layers)
      if (l >= first_ && l < last_) ps->layers.push_back(l);
    ps->value = Tensor::empty(p.shape, p.dtype, opt_options_.device);
    if (opt_options_.master_dtype && *opt_options_.master_dtype != p.dtype && p.trainable)
      ps->master = Tensor::empty(p.shape, *opt_options_.master_dtype, opt_options_.device);
    const bool grads = opt_options_.gradients;
    for (size_t k = 0; k < ps->layers.size(); ++k)
      ps->grads.push_back(grads ? Tensor::empty(p.shape, p.dtype, opt_options_.device) : Tensor());
    ps->has.assign(ps->layers.size(), false);
    if (grads)
      ps->grad = ps->grads.size() == 1 ? ps->grads[0]
                                       : Tensor::empty(p.shape, p.dtype, opt_options_.device);
    local_param_[size_t(id)] = int(params_.size());
    params_.push_back(std::move(ps));
  }
  if (opt_options_.init) init_params(opt_options_.seed);
}

Stage::~Stage() = default;

std::vector<int> Stage::shared_params() const {
  std::vector<int> out;
  for (int id : param_ids_) {
    const Param& p = graph_->params[size_t(id)];
    for (int l : p.layers)
      if (l < first_ || l >= last_) {
        out.push_back(id);
        break;
      }
  }
  return out;
}

Stage::ParamState& Stage::state_of(int id) {
  BATON_CHECK(id >= 0 && size_t(id) < local_param_.size() && local_param_[size_t(id)] >= 0,
              "parameter " + std::to_string(id) + " is not held by this stage");
  return *params_[size_t(local_param_[size_t(id)])];
}

const Stage::ParamState& Stage::state_of(int id) const {
  return const_cast<Stage*>(this)->state_of(id);
}

const Tensor& Stage::param(int id) const {
  const ParamState& ps = state_of(id);
  return ps.master.defined() ? ps.master : ps.value;
}
Tensor& Stage::param(int id) {
  ParamState& ps = state_of(id);
  if (!ps.master.defined()) return ps.value;
  working_stale_ = true;
  return ps.master;
}
const Tensor& Stage::working_param(int id) const {
  return state_of(id).value;
}
void Stage::refresh_working() {
  for (auto& ps : params_)
    if (ps->master.defined()) kernels::cast(ps->master, ps->value);
  working_stale_ = false;
}
const Tensor& Stage::param(const std::string& name) const {
  int id = graph_->find_param(name);
  BATON_CHECK(id >= 0, "no parameter named " + name);
  return param(id);
}
const Tensor& Stage::grad(int id) const {
  return state_of(id).grad;
}
Tensor& Stage::grad(int id) {
  return state_of(id).grad;
}

void Stage::init_params(uint64_t seed) {
  // Under mixed precision the master is initialised (the same bits as an f32 run's
  // parameter) and the working copy cast from it.
  for (auto& ps : params_) {
    Tensor& t = ps->master.defined() ? ps->master : ps->value;
    init_tensor(t, graph_->params[size_t(ps->id)], seed);
    zero_padding_rows(*graph_, ps->id, t);
  }
  refresh_working();
}

int64_t Stage::persistent_bytes() const {
  int64_t b = 0;
  for (const auto& ps : params_) {
    if (ps->grad_shard)
      b += int64_t(ps->value.nbytes()) + int64_t(ps->grad.nbytes());
    else
      b += int64_t(ps->value.nbytes()) * int64_t(1 + ps->grads.size() + (ps->grads.size() > 1));
    if (ps->master.defined()) b += int64_t(ps->master.nbytes());
    if (ps->m.defined()) b += int64_t(ps->m.nbytes());
    if (ps->v.defined()) b += int64_t(ps->v.nbytes());
  }
  return b;
}

// ---- forward ----

void Stage::run_node_forward(MbState& s, int n, bool keep_for_backward) {
  const Node& node = graph_->nodes[size_t(n)];
  const Op& op = *node.impl;
  std::vector<Tensor> ins(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) ins[i] = s.values[size_t(node.inputs[i])];
  // Inputs at their last use and not kept leave the stash now, so an op may reuse their
  // memory when nothing else holds it (cross_entropy writes its gradient into the logits).
  for (int v : node.inputs) {
    bool out = std::find(boundary_out_.begin(), boundary_out_.end(), v) != boundary_out_.end();
    if (last_forward_use_[size_t(v)] == n && !(s.ctx.training && kept_[size_t(v)]) && !out)
      s.values[size_t(v)] = Tensor();
  }
  uint32_t overwritable = 0;
  for (size_t i = 0; i < ins.size() && i < 32; ++i)
    if (ins[i].defined() && ins[i].storage().use_count() == 1) overwritable |= 1u << i;
  std::vector<Tensor> ps(node.params.size());
  for (size_t k = 0; k < node.params.size(); ++k)
    if (node.params[k] >= 0) ps[k] = state_of(node.params[k]).value;
  std::vector<Tensor> outs(node.outputs.size());
  std::vector<Tensor> saved;
  ForwardCall call{s.ctx, ins, ps, outs, saved, overwritable};
  {
    OpTimes* t = opt_options_.profile ? &times_[node.op] : nullptr;
    Timer timer(t != nullptr, t ? &t->forward : nullptr);
    if (t) t->calls++;
    op.forward(call);
  }
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    int v = node.outputs[j];
    BATON_CHECK(outs[j].defined(), "op " + node.op + " (" + node.name + ") left an output unset");
    s.values[size_t(v)] = std::move(outs[j]);
    bool out = std::find(boundary_out_.begin(), boundary_out_.end(), v) != boundary_out_.end();
    if (last_forward_use_[size_t(v)] < 0 && !out && !(s.ctx.training && kept_[size_t(v)]))
      s.values[size_t(v)] = Tensor();
  }
  if (keep_for_backward) s.saved[size_t(n)] = std::move(saved);
}

TensorMap Stage::forward(const MicroBatch& mb, const TensorMap& inputs, bool training) {
  const Graph& g = *graph_;
  if (training && stash_.count(mb.index))
    throw RuntimeError("micro-batch " + std::to_string(mb.index) +
                       " is forwarded twice before its backward");
  if (working_stale_) refresh_working();
  OpContext ctx;
  ctx.mb = mb;
  if (ctx.mb.global_batch <= 0) ctx.mb.global_batch = mb.samples;
  ctx.training = training;
  ctx.seed = opt_options_.seed;
  ctx.device = opt_options_.device;
  ctx.tp = opt_options_.tp;
  ctx.spatial = opt_options_.spatial;
  ctx.batchnorm = opt_options_.batchnorm;
  auto s = std::make_unique<MbState>(ctx);
  s->values.resize(g.values.size());
  s->saved.resize(g.nodes.size());
  auto take = [&](int v) {
    const Value& val = g.values[size_t(v)];
    auto it = inputs.find(val.name);
    if (it == inputs.end())
      throw RuntimeError("stage [" + std::to_string(first_) + ", " + std::to_string(last_) +
                         ") needs input '" + val.name + "'");
    check_input(val, it->second, mb);
    // Inputs read on the host (tokens, targets) move to the stage's device.
    const memory::Device dev = opt_options_.device;
    s->values[size_t(v)] = it->second.device() == dev ? it->second : it->second.to(dev);
  };
  for (int v : boundary_in_) take(v);
  for (int v : model_in_) take(v);
  for (int n : nodes_) run_node_forward(*s, n, training && !recompute_node_[size_t(n)]);
  TensorMap out;
  for (int v : boundary_out_) {
    out[g.values[size_t(v)].name] = s->values[size_t(v)];
    if (!(training && kept_[size_t(v)])) s->values[size_t(v)] = Tensor();
  }
  if (training) {
    for (size_t v = 0; v < s->values.size(); ++v)
      if (!kept_[v]) s->values[v] = Tensor();
    stash_[mb.index] = std::move(s);
  }
  return out;
}

// ---- B ----

void Stage::recompute_layer(MbState& s, int layer) {
  const Graph& g = *graph_;
  // Run the layer again from its kept inputs, keeping what its backward reads. Masks are
  // counter-based, so the recomputed values are bit-identical to the first forward. As in
  // forward, a value goes after its last reader in the layer unless a B still reads it.
  auto drop = [&](int v, int at) {
    if (last_layer_use_[size_t(v)] == at && s.pending[size_t(v)] == 0)
      s.values[size_t(v)] = Tensor();
  };
  for (int n : g.layers[size_t(layer)].nodes) {
    const Node& node = g.nodes[size_t(n)];
    std::vector<Tensor> ins(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) ins[i] = s.values[size_t(node.inputs[i])];
    std::vector<Tensor> ps(node.params.size());
    for (size_t k = 0; k < node.params.size(); ++k)
      if (node.params[k] >= 0) ps[k] = state_of(node.params[k]).value;
    std::vector<Tensor> outs(node.outputs.size());
    std::vector<Tensor> saved;
    OpContext rctx = s.ctx;
    rctx.recompute = true;
    ForwardCall call{rctx, ins, ps, outs, saved, 0};
    node.impl->forward(call);
    for (int v : node.inputs) drop(v, n);
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      s.values[size_t(node.outputs[j])] = outs[j];
      drop(node.outputs[j], -1);  // no reader in the layer
    }
    s.saved[size_t(n)] = std::move(saved);
  }
}

void Stage::release_after_backward(MbState& s, int n) {
  const Node& node = graph_->nodes[size_t(n)];
  s.saved[size_t(n)].clear();
  auto done = [&](int v) {
    auto& users = backward_users_[size_t(v)];
    if (std::find(users.begin(), users.end(), n) == users.end()) return;
    if (--s.pending[size_t(v)] == 0) s.values[size_t(v)] = Tensor();
  };
  for (int v : node.inputs) done(v);
  for (int v : node.outputs) done(v);
}

TensorMap Stage::backward_input(int64_t mb_index, const TensorMap& grad_outputs) {
  return run_backward(mb_index, grad_outputs, nullptr);
}

TensorMap Stage::run_backward(int64_t mb_index, const TensorMap& grad_outputs, WeightPass* fused) {
  BATON_CHECK(opt_options_.gradients, "a backward on a stage built without gradients");
  const Graph& g = *graph_;
  auto it = stash_.find(mb_index);
  if (it == stash_.end())
    throw RuntimeError("backward of micro-batch " + std::to_string(mb_index) +
                       " that was not forwarded (or was already through B)");
  MbState& s = *it->second;
  if (s.b_done) throw RuntimeError("B of micro-batch " + std::to_string(mb_index) + " twice");
  const int64_t batch = s.ctx.batch();
  std::vector<GradSlot::Entry> grads(g.values.size());
  for (int v : boundary_out_) {
    if (v == g.loss) continue;
    const Value& val = g.values[size_t(v)];
    auto gi = grad_outputs.find(val.name);
    if (gi == grad_outputs.end()) {
      if (needs_grad_[size_t(v)])
        throw RuntimeError("backward of micro-batch " + std::to_string(mb_index) +
                           " needs the gradient of '" + val.name + "'");
      continue;
    }
    check_input(val, gi->second, s.ctx.mb);
    grads[size_t(v)] = {gi->second, false};
  }
  s.pending.assign(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) s.pending[v] = int(backward_users_[v].size());
  // In a stage, node ids of several users of a value may repeat (add(x, x)); count each.
  for (int l = last_ - 1; l >= first_; --l) {
    if (opt_options_.recompute_layers.count(l)) recompute_layer(s, l);
    const auto& layer_nodes = g.layers[size_t(l)].nodes;
    for (auto nit = layer_nodes.rbegin(); nit != layer_nodes.rend(); ++nit) {
      int n = *nit;
      const Node& node = g.nodes[size_t(n)];
      const Op& op = *node.impl;
      std::vector<Tensor> ins(node.inputs.size()), outs(node.outputs.size()),
          gouts(node.outputs.size()), ps(node.params.size());
      for (size_t i = 0; i < ins.size(); ++i) ins[i] = s.values[size_t(node.inputs[i])];
      for (size_t j = 0; j < outs.size(); ++j) {
        outs[j] = s.values[size_t(node.outputs[j])];
        gouts[j] = grads[size_t(node.outputs[j])].tensor;
      }
      for (size_t k = 0; k < ps.size(); ++k)
        if (node.params[k] >= 0) ps[k] = state_of(node.params[k]).value;
      std::vector<GradSlot> slots(node.inputs.size());
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        int v = node.inputs[i];
        if (needs_grad_[size_t(v)])
          slots[i] = GradSlot(&grads[size_t(v)], g.values[size_t(v)].type.with_batch(batch),
                              g.values[size_t(v)].type.dtype, opt_options_.device);
      }
      BackwardCall call{s.ctx, ins, outs, ps, s.saved[size_t(n)], gouts, slots};
      {
        OpTimes* t = opt_options_.profile ? &times_[node.op] : nullptr;
        Timer timer(t != nullptr, t ? &t->backward_input : nullptr);
        op.backward_input(call);
      }
      if (op.has_weights()) {
        MbState::WStash w;
        for (size_t i = 0; i < ins.size(); ++i)
          w.inputs.push_back(op.weight_needs_input(i) ? ins[i] : Tensor());
        w.outputs.resize(outs.size());
        if (op.weight_needs_saved()) w.saved = s.saved[size_t(n)];
        if (op.weight_needs_grad_outputs()) w.grad_outputs = gouts;
        w.outputs_with_grad = size_t(
            std::count_if(gouts.begin(), gouts.end(), [](const Tensor& t) { return t.defined(); }));
        s.w[n] = std::move(w);
        // Fused: W now, while B's gradients are here, so the stash never builds up.
        if (fused) run_weight(s, n, *fused);
      }
      for (int v : node.outputs) grads[size_t(v)] = GradSlot::Entry{};
      release_after_backward(s, n);
    }
  }
  TensorMap out;
  for (int v : boundary_in_) {
    if (!needs_grad_[size_t(v)]) continue;
    const Value& val = g.values[size_t(v)];
    Tensor t = grads[size_t(v)].tensor;
    if (!t.defined())
      t = Tensor::zeros(val.type.with_batch(batch), val.type.dtype, opt_options_.device);
    out[val.name] = t;
  }
  // Everything W reads is referenced from its W stash; the rest goes now.
  s.values.clear();
  s.saved.clear();
  s.b_done = true;
  if (fused) {
    stash_.erase(it);
    finish_weight(*fused);
  }
  return out;
}

// ---- W ----

void Stage::backward_weight(int64_t mb_index) {
  backward_weight(mb_index, ParamReadyFn{});
}

// What one micro-batch's W tracks across its nodes.
struct Stage::WeightPass {
  ParamReadyFn ready;
  std::map<int, std::vector<int>> done_after;  // the W node after which each parameter is final
  std::set<int> told, handed;
};

Stage::WeightPass Stage::weight_pass(const ParamReadyFn& ready) const {
  const Graph& g = *graph_;
  WeightPass pass;
  pass.ready = ready;
  bool any_shard = false;
  for (const auto& ps : params_) any_shard = any_shard || ps->grad_shard;
  if (ready || any_shard) {
    std::map<int, int> last_user;  // param -> its last node in reverse order
    for (auto nit = nodes_.rbegin(); nit != nodes_.rend(); ++nit)
      for (int id : g.nodes[size_t(*nit)].params)
        if (id >= 0) last_user[id] = *nit;
    for (const auto& [id, n] : last_user) pass.done_after[n].push_back(id);
  }
  return pass;
}

void Stage::run_weight(MbState& s, int n, WeightPass& pass) {
  const Graph& g = *graph_;
  auto wit = s.w.find(n);
  if (wit == s.w.end()) return;
  const Node& node = g.nodes[size_t(n)];
  MbState::WStash& w = wit->second;
  // An op returns from its W without writing when the output gradient its parameters
  // depend on never came (an output nothing reads). Its buffers were then neither
  // written nor zeroed, and the step took whatever memory held (norms of 1e30, training
  // stopped by the clip). No output gradient at all: no contribution, as if the node
  // were not there. Some: the first contribution is added to zeros, not overwritten.
  const bool none_reached = w.outputs_with_grad == 0;
  const bool some_missing = w.outputs_with_grad < node.outputs.size();
  std::vector<Tensor> ps(node.params.size());
  std::vector<ParamGrad> pg(node.params.size(), ParamGrad{Tensor(), false});
  bool wanted = false;  // a parameter of the node takes a gradient (not all frozen)
  for (size_t k = 0; k < node.params.size() && !none_reached; ++k) {
    if (node.params[k] < 0) continue;
    ParamState& st = state_of(node.params[k]);
    ps[k] = st.value;
    if (!g.params[size_t(node.params[k])].trainable) continue;  // a buffer: no gradient
    size_t li =
        size_t(std::find(st.layers.begin(), st.layers.end(), node.layer) - st.layers.begin());
    if (st.grad_shard && !st.grads[li].defined())
      st.grads[li] = Tensor::empty(st.value.shape(), st.value.dtype(), st.value.device());
    if (some_missing && !st.has[li]) st.grads[li].zero_();
    pg[k] = ParamGrad{st.grads[li], bool(st.has[li]) || some_missing};
    st.has[li] = true;
    wanted = true;
  }
  // Every parameter frozen ("trainable": false): no W. The one-parameter ops (embedding,
  // position_embedding, bias, rmsnorm) had written into the undefined gradient and failed.
  if (!none_reached && wanted) {
    WeightCall call{s.ctx, w.inputs, w.outputs, ps, w.saved, w.grad_outputs, pg};
    OpTimes* t = opt_options_.profile ? &times_[node.op] : nullptr;
    Timer timer(t != nullptr, t ? &t->backward_weight : nullptr);
    node.impl->backward_weight(call);
  }
  // Let go of the gradients before zero2 hands them on below: a bucket reduced there
  // would otherwise hold this node's buffers through its reduce-scatter.
  pg.clear();
  s.w.erase(wit);
  if (auto d = pass.done_after.find(n); d != pass.done_after.end())
    for (int id : d->second) {
      ParamState& held = state_of(id);
      if (held.grad_shard) {
        hand_micro_grad(held);
        pass.handed.insert(id);
      }
      if (!pass.ready) continue;
      fold_grad(held);
      pass.told.insert(id);
      pass.ready(id);
    }
}

void Stage::finish_weight(WeightPass& pass) {
  for (auto& ps : params_)
    if (ps->grad_shard && !pass.handed.count(ps->id)) hand_micro_grad(*ps);
  if (pass.ready) {
    // Parameters no W node of this micro-batch touched (none in practice) finish too.
    for (auto& ps : params_)
      if (!pass.told.count(ps->id)) {
        fold_grad(*ps);
        pass.ready(ps->id);
      }
    grads_finished_ = true;
    return;
  }
  grads_finished_ = false;
}

void Stage::backward_weight(int64_t mb_index, const ParamReadyFn& ready) {
  BATON_CHECK(opt_options_.gradients, "a backward on a stage built without gradients");
  WeightPass pass = weight_pass(ready);
  auto it = stash_.find(mb_index);
  if (it == stash_.end() || !it->second->b_done)
    throw RuntimeError("W of micro-batch " + std::to_string(mb_index) + " before its B");
  MbState& s = *it->second;
  for (auto nit = nodes_.rbegin(); nit != nodes_.rend(); ++nit) run_weight(s, *nit, pass);
  stash_.erase(it);
  finish_weight(pass);
}

TensorMap Stage::backward(int64_t mb_index, const TensorMap& grad_outputs) {
  return backward(mb_index, grad_outputs, ParamReadyFn{});
}

TensorMap Stage::backward(int64_t mb_index, const TensorMap& grad_outputs,
                          const ParamReadyFn& ready) {
  WeightPass pass = weight_pass(ready);
  return run_backward(mb_index, grad_outputs, &pass);
}

// ---- step ----

void Stage::zero_grad() {
  grads_finished_ = false;
  for (auto& ps : params_) std::fill(ps->has.begin(), ps->has.end(), false);
}

void Stage::hand_micro_grad(ParamState& ps) {
  // The micro-batch's whole gradient: its layers' buffers added in ascending layer order
  // (fold_grad's order), handed over, then dropped (the receiver keeps what it needs).
  Tensor total;
  for (size_t k = 0; k < ps.grads.size(); ++k) {
    if (!ps.has[k]) continue;
    if (!total.defined()) {
      total = ps.grads.size() == 1 ? ps.grads[k] : ps.grads[k].clone();
    } else {
      kernels::add_inplace(total, ps.grads[k]);
    }
  }
  for (size_t k = 0; k < ps.grads.size(); ++k) {
    ps.grads[k] = Tensor();
    ps.has[k] = false;
  }
  BATON_CHECK(bool(micro_grad_), "a sharded gradient without a receiver (set_micro_grad_fn)");
  micro_grad_(ps.id, std::move(total));
}

void Stage::fold_grad(ParamState& ps) {
  if (ps.grad_shard) return;  // the engine's accumulator
  if (ps.grads.size() == 1) {
    if (!ps.has[0]) ps.grads[0].zero_();
    return;
  }
  bool any = false;
  for (size_t k = 0; k < ps.grads.size(); ++k) {
    if (!ps.has[k]) continue;
    if (!any)
      ps.grad.copy_from(ps.grads[k]);
    else
      kernels::add_inplace(ps.grad, ps.grads[k]);
    any = true;
  }
  if (!any) ps.grad.zero_();
}

void Stage::finish_grads() {
  grads_finished_ = true;
  for (auto& ps : params_) fold_grad(*ps);
}

namespace {
// The gradients a stage's norm counts, each with its layer (from 0 at the stage's first):
// a parameter counts in the first layer that uses it, on the stage holding that layer.
template <class ParamStates>
void norm_pieces(const ParamStates& params, int first, int last, std::vector<Tensor>& grads,
                 std::vector<int>& layer) {
  for (const auto& ps : params) {
    if (ps->owner_layer < first || ps->owner_layer >= last) continue;  // counted elsewhere
    grads.push_back(ps->grad);
    layer.push_back(ps->owner_layer - first);
  }
}
}  // namespace

std::vector<double> Stage::grad_sum_squares_by_layer() const {
  std::vector<double> out(size_t(last_ - first_), 0.0);
  std::vector<Tensor> grads;
  std::vector<int> layer;
  norm_pieces(params_, first_, last_, grads, layer);
  const std::vector<double> each = kernels::sum_squares_each(grads);
  for (size_t k = 0; k < each.size(); ++k) out[size_t(layer[k])] += each[k];
  return out;
}

Tensor Stage::grad_sum_squares_tensor() const {
  std::vector<Tensor> grads;
  std::vector<int> layer;
  norm_pieces(params_, first_, last_, grads, layer);
  if (grads.empty()) return Tensor::zeros({1}, memory::DType::f64, opt_options_.device);
  return kernels::sum_squares_grouped(grads, layer, last_ - first_);
}

double Stage::grad_sum_squares() const {
  return grad_sum_squares_tensor().to(memory::Device::cpu()).to_vector<double>()[0];
}

void Stage::set_optimizer_shard(int id, int64_t begin, int64_t end) {
  ParamState& ps = state_of(id);
  const int64_t n = ps.value.numel();
  BATON_CHECK(0 <= begin && begin <= end && end <= n, "optimizer shard out of range");
  if (begin == 0 && end == n) begin = 0, end = -1;
  if (ps.shard_begin == begin && ps.shard_end == end) return;
  ps.shard_begin = begin;
  ps.shard_end = end;
  ps.m = Tensor();
  ps.v = Tensor();
  if (opt_ready_) set_optimizer(opt_);
}

void Stage::set_grad_shard(int id) {
  ParamState& ps = state_of(id);
  if (ps.grad_shard) return;
  const auto [begin, end] = optimizer_shard(id);
  ps.grad_shard = true;
  for (size_t k = 0; k < ps.grads.size(); ++k) {
    ps.grads[k] = Tensor();
    ps.has[k] = false;
  }
  ps.grad = Tensor::zeros({end - begin}, ps.value.dtype(), opt_options_.device);
}

bool Stage::grad_sharded(int id) const {
  return state_of(id).grad_shard;
}

std::pair<int64_t, int64_t> Stage::optimizer_shard(int id) const {
  const ParamState& ps = state_of(id);
  if (ps.shard_end < 0) return {0, ps.value.numel()};
  return {ps.shard_begin, ps.shard_end};
}

void Stage::set_optimizer(const OptimizerConfig& config) {
  opt_ = config;
  for (auto& ps : params_) {
    const Param& p = graph_->params[size_t(ps->id)];
    bool need_m = config.kind == OptimizerConfig::Kind::adamw || config.sgd.momentum != 0;
    bool need_v = config.kind == OptimizerConfig::Kind::adamw;
    // A buffer its op updates (batch norm's running statistics) takes no step: no state,
    // and none in checkpoints (an older checkpoint's zeros for it are not read).
    if (!p.trainable) need_m = need_v = false;
    Shape shape = p.shape;
    if (ps->shard_end >= 0) {
      shape = {ps->shard_end - ps->shard_begin};
      if (shape[0] == 0) need_m = need_v = false;
    }
    // Under mixed precision the state has the master's dtype (f32).
    const memory::DType dt = ps->master.defined() ? ps->master.dtype() : p.dtype;
    if (need_m && !ps->m.defined()) ps->m = Tensor::zeros(shape, dt, opt_options_.device);
    if (need_v && !ps->v.defined()) ps->v = Tensor::zeros(shape, dt, opt_options_.device);
    if (!need_m) ps->m = Tensor();
    if (!need_v) ps->v = Tensor();
  }
  opt_ready_ = true;
}

namespace {
kernels::ClipDecision host_scale(const kernels::GradScale& s) {
  if (!s.sum_squares.defined()) return {0, s.value, true};
  const double norm2 = s.sum_squares.to(memory::Device::cpu()).to_vector<double>()[0];
  return kernels::clip_decision(norm2, s.grad_clip, s.loss_scale);
}
}  // namespace

void Stage::step(const kernels::GradScale& grad_scale) {
  if (!opt_ready_) set_optimizer(opt_);
  if (!grads_finished_) finish_grads();
  ++opt_steps_;
  OpTimes* t = opt_options_.profile ? &times_["optimizer"] : nullptr;
  Timer timer(t != nullptr, t ? &t->forward : nullptr);
  if (t) t->calls++;
  std::vector<kernels::AdamWTensors> adamw;        // every AdamW update of the step, in one call
  std::optional<kernels::ClipDecision> sgd_scale;  // read on the first SGD update
  // A whole master's working copy is written by the AdamW update itself (one pass, where a
  // cast per parameter cost 148 launches and 0.55 ms of GPT-2 124M's step on the H200).
  const auto update_writes_working = [&](const ParamState& ps) {
    return opt_.kind == OptimizerConfig::Kind::adamw && ps.master.defined() && ps.shard_end < 0 &&
           graph_->params[size_t(ps.id)].trainable;
  };
  for (auto& ps : params_) {
    const Param& p = graph_->params[size_t(ps->id)];
    if (!p.trainable) continue;  // a buffer its op updates
    Tensor value = ps->master.defined() ? ps->master : ps->value, grad = ps->grad;
    // Mixed precision: the update in the master's dtype. The CUDA optimizers read a 16-bit
    // gradient themselves; the CPU's take one dtype.
    if (grad.dtype() != value.dtype() && !grad.device().is_cuda()) {
      Tensor wide = Tensor::empty(grad.shape(), value.dtype(), grad.device());
      kernels::cast(grad, wide);
      grad = wide;
    }
    if (ps->shard_end >= 0) {  // a sharded optimizer: this stage's elements only
      const int64_t len = ps->shard_end - ps->shard_begin;
      if (len == 0) continue;
      value = value.view({value.numel()}).narrow(0, ps->shard_begin, len);
      if (!ps->grad_shard) grad = grad.view({grad.numel()}).narrow(0, ps->shard_begin, len);
    } else if (ps->grad_shard) {  // a part that covers the whole parameter
      grad = grad.view(value.shape());
    }
    if (opt_.kind == OptimizerConfig::Kind::adamw) {
      adamw.push_back({value, grad, ps->m, ps->v, p.weight_decay ? opt_.adamw.weight_decay : 0.0});
      if (update_writes_working(*ps)) adamw.back().working = ps->value;
    } else {
      kernels::Sgd cfg = opt_.sgd;
      if (!p.weight_decay) cfg.weight_decay = 0;
      if (!sgd_scale) sgd_scale = host_scale(grad_scale);
      if (!sgd_scale->apply) break;
      kernels::sgd_step(value, grad, ps->m, cfg, sgd_scale->grad_scale);
    }
  }
  kernels::adamw_step_each(adamw, opt_.adamw, opt_steps_, grad_scale);
  // The other working copies follow their masters (a sharded optimizer's other parts
  // arrive through param() and are cast at the next forward).
  for (auto& ps : params_)
    if (ps->master.defined() && !update_writes_working(*ps)) kernels::cast(ps->master, ps->value);
  working_stale_ = false;
}

std::vector<std::pair<std::string, Tensor>> Stage::optimizer_state(int id) const {
  const ParamState& ps = state_of(id);
  std::vector<std::pair<std::string, Tensor>> out;
  if (opt_.kind == OptimizerConfig::Kind::adamw) {
    if (ps.m.defined()) out.emplace_back("exp_avg", ps.m);
    if (ps.v.defined()) out.emplace_back("exp_avg_sq", ps.v);
  } else if (ps.m.defined()) {
    out.emplace_back("momentum_buffer", ps.m);
  }
  return out;
}

}  // namespace baton::stages

namespace baton::stages {
void Stage::discard(int64_t mb_index) {
  stash_.erase(mb_index);
}
}  // namespace baton::stages
