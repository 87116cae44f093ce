#include "partitioner/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <map>

#include "memory/error.h"
#include "partitioner/detail/graph_builder.h"

namespace baton::partitioner {

using stages::Graph;
using stages::Node;

int64_t SplitPattern::local_size(int t) const {
  int64_t n = 0;
  for (const auto& b : blocks) n += part(b.second, t);
  for (const auto& b : kept) n += b.second;
  return n;
}

namespace {

// The op types the pass treats specially, looked up once per node.
enum class OpKind : uint8_t {
  other,
  linear,
  attention,
  embedding,
  cross_entropy,
  add,
  unary,
  dropout,
  gate,    // swiglu: two inputs of one split
  rotary,  // q, k, v -> qkv
  conv,    // conv2d
  bnorm,   // batchnorm2d: per-channel, passes a channel split
  pool,    // maxpool2d, avgpool2d: pass a channel split
  gpool,   // global_avgpool: a channel split [C/t, H, W] -> [C/t]
  comm
};

OpKind kind_of(const std::string& op) {
  static const std::map<std::string, OpKind, std::less<>> table = {
      {"linear", OpKind::linear},
      {"attention", OpKind::attention},
      {"embedding", OpKind::embedding},
      {"cross_entropy", OpKind::cross_entropy},
      {"add", OpKind::add},
      {"gelu", OpKind::unary},
      {"relu", OpKind::unary},
      {"silu", OpKind::unary},
      {"swiglu", OpKind::gate},
      {"rotary", OpKind::rotary},
      {"dropout", OpKind::dropout},
      {"conv2d", OpKind::conv},
      {"batchnorm2d", OpKind::bnorm},
      {"maxpool2d", OpKind::pool},
      {"avgpool2d", OpKind::pool},
      {"global_avgpool", OpKind::gpool},
      {"tp_copy", OpKind::comm},
      {"tp_reduce", OpKind::comm},
      {"tp_gather", OpKind::comm},
      {"vocab_parallel_cross_entropy", OpKind::comm}};
  auto it = table.find(op);
  return it == table.end() ? OpKind::other : it->second;
}

double attr_double(const Node& n, const char* key, double dflt) {
  auto it = n.attrs.find(key);
  return it == n.attrs.end() ? dflt : it->get<double>();
}
int64_t attr_int(const Node& n, const char* key, int64_t dflt) {
  auto it = n.attrs.find(key);
  return it == n.attrs.end() ? dflt : it->get<int64_t>();
}
bool linear_in_out(const Node& n) {
  auto it = n.attrs.find("layout");
  return it != n.attrs.end() && it->get<std::string>() == "in_out";
}
// Ops that pass a split last dimension through unchanged.
bool passes_split(const Node& n, OpKind k) {
  if (k == OpKind::unary) return true;
  return k == OpKind::dropout && attr_double(n, "p", 0.0) == 0.0;
}

// An attention's attributes on rank r of a heads split over t ranks: the model's own
// (head_offset, global_heads, kv_group, kv_offset: a model may place its heads with them,
// docs/formats/model.md) composed with the rank's slice of the query and key/value heads.
struct LocalHeads {
  int64_t heads = 1, kv_heads = 1;  // n_head, n_kv_head held locally
  int64_t head_offset = 0, global_heads = 1, group = 1, kv_offset = 0;
  int64_t model_kv_offset = 0;  // the unsplit node's kv_offset (explicit or its default)
};
LocalHeads local_heads(const Node& n, int t, int r, bool kv_replicated) {
  const int64_t h = attr_int(n, "n_head", 1), kv = attr_int(n, "n_kv_head", h);
  const int64_t offset = attr_int(n, "head_offset", 0);
  LocalHeads l;
  l.heads = h / t;
  l.kv_heads = kv_replicated ? kv : kv / t;
  l.head_offset = offset + int64_t(r) * l.heads;
  l.global_heads = attr_int(n, "global_heads", h);
  l.group = std::max<int64_t>(1, attr_int(n, "kv_group", h / kv));
  // The attention op's default: the key/value heads of its first query head.
  l.model_kv_offset = attr_int(n, "kv_offset", offset / l.group);
  l.kv_offset = l.model_kv_offset + (kv_replicated ? 0 : int64_t(r) * l.kv_heads);
  return l;
}

class ShardingPass {
 public:
  ShardingPass(const Graph& g, const std::vector<int>& layer_tp, const SplitOverrides& ov,
               std::string where)
      : g_(g), ov_(ov), where_(std::move(where)) {
    s_.layer_tp = layer_tp;
    s_.nodes.resize(g.nodes.size());
    s_.values.resize(g.values.size());
    s_.params.resize(g.params.size());
    kinds_.reserve(g.nodes.size());
    for (const Node& n : g.nodes) kinds_.push_back(kind_of(n.op));
  }

  Sharding run() {
    check_overrides();
    for (size_t n = 0; n < g_.nodes.size(); ++n) visit(int(n));
    mark_cuts();
    return std::move(s_);
  }

 private:
  int tp_of(int node) const { return s_.layer_tp[size_t(g_.nodes[size_t(node)].layer)]; }
  const std::string& layer_name(int node) const {
    return g_.layers[size_t(g_.nodes[size_t(node)].layer)].name;
  }
  std::string node_ref(int node) const {
    const Node& n = g_.nodes[size_t(node)];
    return n.op + " node '" + n.name + "' (layer " + layer_name(node) + ")";
  }
  const SplitKind* override_of(int node) const {
    if (ov_.kinds.empty()) return nullptr;
    auto it = ov_.kinds.find(g_.nodes[size_t(node)].name);
    return it == ov_.kinds.end() ? nullptr : &it->second;
  }
  std::string override_where(int node) const {
    auto it = ov_.where.find(g_.nodes[size_t(node)].name);
    return it == ov_.where.end() ? where_ : it->second;
  }
  // The override that split `value` (the nearest one up its producers that pass or make
  // the split), as its path; empty when the default policy split it.
  std::string split_origin(int value, int depth = 0) const {
    int p = g_.values[size_t(value)].producer;
    if (p < 0 || depth > 64 || !s_.values[size_t(value)].split) return {};
    const SplitKind* o = override_of(p);
    if (o != nullptr && *o != SplitKind::none) return override_where(p);
    for (int in : g_.nodes[size_t(p)].inputs)
      if (std::string w = split_origin(in, depth + 1); !w.empty()) return w;
    return {};
  }
  // The override nearest up `value`'s chain of first inputs (a projection, then the reshapes
  // and rotary between it and its user), split or not, as its path; empty when none.
  std::string override_behind(int value) const {
    for (int depth = 0; depth < 8; ++depth) {
      const int p = g_.values[size_t(value)].producer;
      if (p < 0) return {};
      if (override_of(p) != nullptr) return override_where(p);
      if (g_.nodes[size_t(p)].inputs.empty()) return {};
      value = g_.nodes[size_t(p)].inputs[0];
    }
    return {};
  }
  // Where a split of `node` comes from: its own override, else the override that split
  // one of `inputs`, else the degree (`where_`).
  std::string split_where(int node, std::initializer_list<int> inputs = {}) const {
    const SplitKind* o = override_of(node);
    if (o != nullptr) return override_where(node);
    for (int slot : inputs)
      if (std::string w = split_origin(g_.nodes[size_t(node)].inputs[size_t(slot)]); !w.empty())
        return w;
    return where_;
  }
  // `at`: the plan path to name (split_where); the degree's path by default.
  [[noreturn]] void divide_error(int node, int t, const std::string& what, int64_t n,
                                 const std::string& at = {}) const {
    throw InputError((at.empty() ? where_ : at) + ": tensor-parallel degree " + std::to_string(t) +
                     " does not divide " + what + " = " + std::to_string(n) + " of " +
                     node_ref(node));
  }
  [[noreturn]] void override_error(int node, const std::string& msg) const {
    throw InputError(override_where(node) + ": " + msg);
  }

  // Says what the nodes are called: a name missing its prefix ("layers.0.mlp.fc" of a
  // LLaMA's "model.layers.0.mlp.fc") is completed, others get examples of the names.
  std::string unknown_node(const std::string& name) const {
    std::string msg = "no node named '" + brief(name) + "' in the model";
    std::vector<std::string> near, examples;
    for (const Node& n : g_.nodes) {
      if (n.name.size() > name.size() + 1 && n.name.ends_with("." + name)) near.push_back(n.name);
      if (examples.size() < 3 &&
          (n.op == "linear" || n.op == "embedding" || n.op == "attention" || n.op == "conv2d"))
        examples.push_back("'" + n.name + "'");
    }
    if (near.size() == 1) return msg + "; did you mean '" + near[0] + "'?";
    if (near.size() > 1) {  // one per layer: the first few, and how many
      msg += "; nodes of that name: ";
      for (size_t i = 0; i < std::min<size_t>(near.size(), 3); ++i)
        msg += (i ? ", '" : "'") + near[i] + "'";
      if (near.size() > 3) msg += ", … (" + std::to_string(near.size()) + ")";
      return msg + " (one override per node)";
    }
    if (!examples.empty()) {
      msg += " (its splittable nodes are named like ";
      for (size_t i = 0; i < examples.size(); ++i) msg += (i ? ", " : "") + examples[i];
      msg += "; a cost file of `baton profile` lists every node)";
    }
    return msg;
  }

  void check_overrides() const {
    for (const auto& [name, kind] : ov_.kinds) {
      std::string w = ov_.where.count(name) ? ov_.where.at(name) : where_;
      const Node* found = nullptr;
      for (const Node& n : g_.nodes)
        if (n.name == name) found = &n;
      if (found == nullptr) throw InputError(w + ": " + unknown_node(name));
      const std::string& op = found->op;
      bool ok = kind == SplitKind::none ||
                ((op == "linear" || op == "conv2d") &&
                 (kind == SplitKind::column || kind == SplitKind::row)) ||
                (op == "embedding" && kind == SplitKind::vocab) ||
                (op == "attention" && kind == SplitKind::heads) ||
                (op == "cross_entropy" && kind == SplitKind::vocab);
      if (!ok) {
        std::string allowed = op == "linear" || op == "conv2d" ? "\"column\", \"row\" or \"none\""
                              : op == "embedding"              ? "\"vocab\" or \"none\""
                              : op == "attention"              ? "\"heads\" or \"none\""
                              : op == "cross_entropy"          ? "\"vocab\" or \"none\""
                                                               : "";
        if (allowed.empty())
          throw InputError(w + ": node '" + name + "' (op " + op +
                           ") cannot be split; only linear, conv2d, embedding, attention and "
                           "cross_entropy nodes take a split");
        throw InputError(w + ": expected " + allowed + " for " + op + " node '" + name +
                         "', found \"" + std::string(split_name(kind)) + "\"");
      }
    }
  }

  // Can a split value (of a node in a layer of degree t) feed every consumer usefully?
  // `channels`: the value is an image split along its channels (dimension 0), else along
  // its last dimension.
  bool accepts_split(int value, int t, bool channels = false, int depth = 0) const {
    const auto& cons = g_.values[size_t(value)].consumers;
    if (cons.empty() || depth > 64) return false;
    for (int c : cons) {
      const Node& n = g_.nodes[size_t(c)];
      if (tp_of(c) != t) return false;
      const SplitKind* o = override_of(c);
      bool ok = false;
      const OpKind k = kinds_[size_t(c)];
      if (k == OpKind::linear)
        ok = !channels && n.inputs[0] == value && (o == nullptr || *o == SplitKind::row);
      else if (k == OpKind::cross_entropy)
        ok = !channels && n.inputs[0] == value && (o == nullptr || *o == SplitKind::vocab);
      else if (k == OpKind::conv && attr_int(n, "groups", 1) == 1)
        ok = channels && (o == nullptr || *o == SplitKind::row);
      else if (k == OpKind::conv)  // grouped: by whole groups, the output split like the input
        ok = channels && (o == nullptr || *o == SplitKind::column) &&
             attr_int(n, "groups", 1) % t == 0 && accepts_split(n.outputs[0], t, true, depth + 1);
      else if (o != nullptr)  // "none" on an op that would pass the split on
        ok = false;
      else if (k == OpKind::bnorm || k == OpKind::pool)
        ok = channels && accepts_split(n.outputs[0], t, true, depth + 1);
      else if (k == OpKind::gpool)
        ok = channels && accepts_split(n.outputs[0], t, false, depth + 1);
      else if (passes_split(n, k) || k == OpKind::gate)
        ok = accepts_split(n.outputs[0], t, channels, depth + 1);
      if (!ok) return false;
    }
    return true;
  }
  // Does `value` reach only vocabulary-parallel losses of degree t (directly or through
  // ops that pass a split on)? Those mask a padded part of the vocabulary.
  bool feeds_loss_only(int value, int t, int depth = 0) const {
    const auto& cons = g_.values[size_t(value)].consumers;
    if (cons.empty() || depth > 64) return false;
    for (int c : cons) {
      const Node& n = g_.nodes[size_t(c)];
      const SplitKind* o = override_of(c);
      const OpKind k = kinds_[size_t(c)];
      if (tp_of(c) != t) return false;
      if (k == OpKind::cross_entropy) {
        if (n.inputs[0] != value || (o != nullptr && *o != SplitKind::vocab)) return false;
      } else if (o != nullptr || !passes_split(n, k) ||
                 !feeds_loss_only(n.outputs[0], t, depth + 1)) {
        return false;
      }
    }
    return true;
  }
  // Padded parts of ceil(n / t): every rank must hold at least one real element.
  void check_padded_parts(int node, int t, int64_t n, const std::string& what) const {
    auto fits = [n](int64_t d) { return (n + d - 1) / d * (d - 1) < n; };
    if (fits(t)) return;
    std::string degrees;  // those up to 2t that do
    const int64_t upto = std::min<int64_t>(n, 2 * int64_t(t));
    for (int64_t d = 2; d <= upto; ++d)
      if (fits(d)) degrees += (degrees.empty() ? "" : ", ") + std::to_string(d);
    // The nodes sharing the parameter (a tied LM head) must be kept whole with it.
    std::string nodes;
    const int param = g_.nodes[size_t(node)].params[0];
    for (int user : g_.params[size_t(param)].users)
      nodes += (nodes.empty() ? "\"" : ", \"") + g_.nodes[size_t(user)].name + "\": \"none\"";
    throw InputError(
        split_where(node) + ": tensor-parallel degree " + std::to_string(t) + " over the " + what +
        " = " + std::to_string(n) + " of " + node_ref(node) +
        " leaves the last ranks no part (parts of " + std::to_string((n + t - 1) / t) + "); " +
        (degrees.empty() ? std::string()
                         : "degrees up to " + std::to_string(upto) +
                               " that leave every rank part of this table: " + degrees + "; ") +
        "or keep it whole with the plan field \"splits\": {" + nodes + "}");
  }
  bool feeds_attention(int value, int t) const {
    const auto& cons = g_.values[size_t(value)].consumers;
    if (cons.empty()) return false;
    for (int c : cons) {
      const SplitKind* o = override_of(c);
      if (kinds_[size_t(c)] != OpKind::attention || tp_of(c) != t ||
          (o != nullptr && *o == SplitKind::none))
        return false;
    }
    return true;
  }

  // The rotary node (slot) that is the only consumer of `value`, when that rotary feeds
  // attention in a group of degree t; -1 otherwise.
  int feeds_rotary(int value, int t, int* slot) const {
    const auto& cons = g_.values[size_t(value)].consumers;
    if (cons.size() != 1) return -1;
    int c = cons[0];
    if (kinds_[size_t(c)] != OpKind::rotary || tp_of(c) != t) return -1;
    const Node& n = g_.nodes[size_t(c)];
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] == value) *slot = int(i);
    if (std::count(n.inputs.begin(), n.inputs.end(), value) != 1) return -1;
    if (!feeds_attention(n.outputs[0], t)) return -1;
    return c;
  }
  // The query and key/value column blocks of a rotary / attention qkv [(H + 2 KV) D].
  static SplitPattern qkv_pattern(int64_t h, int64_t kv, int64_t d, bool kv_replicated) {
    SplitPattern p;
    if (kv_replicated) {
      p.blocks = {{0, h * d}};
      p.kept = {{h * d, 2 * kv * d}};
    } else {
      p.blocks = {{0, h * d}, {h * d, kv * d}, {(h + kv) * d, kv * d}};
    }
    return p;
  }

  // The input in `slot` is split over this node's group (along any dimension)?
  bool split_in_group(int node, int slot) const {
    const ValueShard& v = s_.values[size_t(g_.nodes[size_t(node)].inputs[size_t(slot)])];
    return v.split && v.t == tp_of(node);
  }
  // ... along its last dimension (what linears, attention and the cross-entropy take)?
  bool split_here(int node, int slot) const {
    int v = g_.nodes[size_t(node)].inputs[size_t(slot)];
    const ValueShard& vs = s_.values[size_t(v)];
    const auto& shape = g_.values[size_t(v)].type.shape;
    return split_in_group(node, slot) && vs.dim_index(shape) + 1 == shape.size();
  }
  // ... along the channels of an image [C, H, W]?
  bool split_channels(int node, int slot) const {
    int v = g_.nodes[size_t(node)].inputs[size_t(slot)];
    const auto& shape = g_.values[size_t(v)].type.shape;
    return split_in_group(node, slot) && shape.size() == 3 &&
           s_.values[size_t(v)].dim_index(shape) == 0;
  }
  // The input in `slot` must be whole: gather it when it is split.
  void need_whole(int node, int slot) {
    const Node& n = g_.nodes[size_t(node)];
    int v = n.inputs[size_t(slot)];
    const ValueShard& vs = s_.values[size_t(v)];
    if (!vs.split) return;
    const stages::Value& val = g_.values[size_t(v)];
    if (vs.t != tp_of(node))
      throw InputError(where_ + ": value '" + val.name +
                       "' is split over a tensor-parallel group of " + std::to_string(vs.t) +
                       " ranks and consumed by " + node_ref(node) + " in a group of " +
                       std::to_string(tp_of(node)) +
                       ": where the degree changes between pipeline stages, the values crossing "
                       "the cut must be replicated (cut elsewhere)");
    if (!vs.pattern.whole(val.type.shape[vs.dim_index(val.type.shape)]))
      throw InputError(override_where(node) + ": value '" + val.name +
                       "' is split in several blocks (by heads) and " + node_ref(node) +
                       " needs it whole; it cannot be gathered (keep its producer unsplit)");
    // Padded parts are made only for values that reach vocabulary-parallel losses alone.
    BATON_CHECK(!vs.pattern.padded, "padded value '" + val.name + "' gathered");
    auto& g = s_.nodes[size_t(node)].gather_inputs;
    if (std::find(g.begin(), g.end(), slot) == g.end()) g.push_back(slot);
  }
  void set_param(int node, int slot, int dim, int t, const SplitPattern& pattern) {
    int p = g_.nodes[size_t(node)].params[size_t(slot)];
    if (p < 0) return;
    ParamShard& current = s_.params[size_t(p)];
    if (dim < 0 && current.first_user < 0) {  // the common case: a replicated first use
      current.first_user = node;
      return;
    }
    ParamShard want;
    want.dim = dim;
    want.t = dim < 0 ? 1 : t;
    want.pattern = pattern;
    ParamShard& have = s_.params[size_t(p)];
    if (have.first_user < 0) {
      want.first_user = node;
      have = want;
      return;
    }
    if (have.dim != want.dim || have.t != want.t || !(have.pattern == want.pattern)) {
      auto desc = [](const ParamShard& s) {
        return s.dim < 0 ? std::string("replicated")
                         : "split along dimension " + std::to_string(s.dim) + " over " +
                               std::to_string(s.t) + " ranks";
      };
      // One side whole (an override made it so, maybe downstream: "loss": "none" keeps a
      // tied LM head whole): the way out is both whole.
      const std::string both =
          have.dim < 0 || want.dim < 0
              ? " (keep both whole: \"splits\": {\"" + g_.nodes[size_t(have.first_user)].name +
                    "\": \"none\", \"" + g_.nodes[size_t(node)].name + "\": \"none\"})"
              : std::string();
      throw InputError(
          where_ + ": parameter '" + g_.params[size_t(p)].name + "' is " + desc(have) + " by " +
          node_ref(have.first_user) + " but " + desc(want) + " by " + node_ref(node) +
          "; nodes sharing a parameter need the same split (and the same degree)" + both);
    }
  }
  void replicate_params(int node) {
    const Node& n = g_.nodes[size_t(node)];
    for (size_t k = 0; k < n.params.size(); ++k) set_param(node, int(k), -1, 1, {});
  }
  void out_replicated(int node) {
    // Values start replicated; only a value already marked split needs resetting.
    for (int v : g_.nodes[size_t(node)].outputs)
      if (s_.values[size_t(v)].split) s_.values[size_t(v)] = ValueShard{};
  }
  // A row split's output: partial sums all-reduced, the bias (whole) added after.
  void row_split_output(int node) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    ns.kind = SplitKind::row;
    ns.reduce_output = true;
    ns.bias_after_reduce = n.params.size() > 1 && n.params[1] >= 0;
    if (ns.bias_after_reduce) set_param(node, 1, -1, 1, {});
    out_replicated(node);
  }
  // Not split: the whole input, replicated parameters and output.
  void keep_whole(int node) {
    need_whole(node, 0);
    replicate_params(node);
    out_replicated(node);
  }
  void out_split(int node, int t, SplitPattern p, int dim = -1) {
    for (int v : g_.nodes[size_t(node)].outputs) s_.values[size_t(v)] = ValueShard{true, t, p, dim};
  }

  void visit(int node) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    int t = tp_of(node);
    ns.t = t;
    const OpKind k = kinds_[size_t(node)];
    if (k == OpKind::comm)
      throw InputError(where_ + ": " + node_ref(node) +
                       " is a communication op: the partitioner takes a logical graph");
    if (t == 1) {
      for (size_t i = 0; i < n.inputs.size(); ++i) need_whole(node, int(i));
      replicate_params(node);
      out_replicated(node);
      return;
    }
    const SplitKind* o = override_of(node);
    if (k == OpKind::linear) return visit_linear(node, o);
    if (k == OpKind::attention) return visit_attention(node, o);
    if (k == OpKind::embedding) return visit_embedding(node, o);
    if (k == OpKind::cross_entropy) return visit_cross_entropy(node, o);
    if (k == OpKind::conv) return visit_conv(node, o);
    if (o != nullptr) {  // "none" (the only override of the other ops): run on whole inputs
      for (size_t i = 0; i < n.inputs.size(); ++i) need_whole(node, int(i));
      replicate_params(node);
      out_replicated(node);
      return;
    }
    if ((k == OpKind::bnorm || k == OpKind::pool) && split_channels(node, 0)) {
      // Per-channel: the channel split passes on; batchnorm2d's vectors split with it.
      const ValueShard in = s_.values[size_t(n.inputs[0])];
      for (size_t p = 0; p < n.params.size(); ++p) set_param(node, int(p), 0, t, in.pattern);
      out_split(node, t, in.pattern, 0);
      return;
    }
    if (k == OpKind::gpool && split_channels(node, 0)) {
      out_split(node, t, s_.values[size_t(n.inputs[0])].pattern);  // [C/t]: the last dimension
      return;
    }
    if (passes_split(n, k) && split_in_group(node, 0)) {
      const ValueShard in = s_.values[size_t(n.inputs[0])];
      for (int v : n.outputs) s_.values[size_t(v)] = in;
      return;
    }
    if (k == OpKind::rotary) return visit_rotary(node, o);
    if ((k == OpKind::add || k == OpKind::gate) && split_in_group(node, 0) &&
        split_in_group(node, 1) &&
        s_.values[size_t(n.inputs[0])] == s_.values[size_t(n.inputs[1])]) {
      const ValueShard in = s_.values[size_t(n.inputs[0])];
      for (int v : n.outputs) s_.values[size_t(v)] = in;
      return;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) need_whole(node, int(i));
    replicate_params(node);
    out_replicated(node);
  }

  void visit_linear(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    int t = ns.t;
    const auto& wshape = g_.params[size_t(n.params[0])].shape;
    bool in_out = linear_in_out(n);
    int64_t out_features = in_out ? wshape[1] : wshape[0];
    bool in_split = split_here(node, 0);
    SplitKind kind;
    if (o != nullptr) {
      kind = *o;
    } else if (in_split) {
      kind = SplitKind::row;
    } else if (feeds_attention(n.outputs[0], t) || accepts_split(n.outputs[0], t)) {
      kind = SplitKind::column;
    } else if (int slot = -1, rot = feeds_rotary(n.outputs[0], t, &slot); rot >= 0) {
      // q is split by heads; k and v too when the degree divides their heads, else they
      // stay whole (replicated).
      const Node& rn = g_.nodes[size_t(rot)];
      const int64_t heads = attr_int(rn, "n_head", 1), kv = attr_int(rn, "n_kv_head", heads);
      if (slot == 0 && heads % t != 0) divide_error(rot, t, "n_head", heads);
      const SplitKind* ro = override_of(rot);
      kind = (ro != nullptr && *ro == SplitKind::none) || (slot > 0 && kv % t != 0)
                 ? SplitKind::none
                 : SplitKind::column;
    } else {
      kind = SplitKind::none;
    }
    const std::string& in_name = g_.values[size_t(n.inputs[0])].name;
    if (kind == SplitKind::row) {
      if (!in_split) {
        // Name what made the input whole: back through the ops a split passes through,
        // a linear left unsplit, or the node that gathered a split (a dropout with p > 0
        // between the two linears) or never had one (a norm).
        int from = g_.values[size_t(n.inputs[0])].producer;
        while (from >= 0 && g_.nodes[size_t(from)].op != "linear" &&
               passes_split(g_.nodes[size_t(from)], kind_of(g_.nodes[size_t(from)].op)) &&
               !split_here(from, 0))
          from = g_.values[size_t(g_.nodes[size_t(from)].inputs[0])].producer;
        const std::string fix =
            from < 0 ? "it is a model input"
            : g_.nodes[size_t(from)].op == "linear" && !split_here(from, 0) &&
                    s_.nodes[size_t(from)].kind != SplitKind::column
                ? "split " + node_ref(from) + " by columns"
                : "it comes whole out of " + node_ref(from) +
                      ": a split passes only through the ops docs/partitioner.md lists";
        override_error(node, "row split of " + node_ref(node) +
                                 " needs its input split over the last dimension, but '" + in_name +
                                 "' is replicated (" + fix + ")");
      }
      // Key/value heads replicated beside split query heads (rotary's kept block) are on
      // every rank: a row split would add their part once per rank, and its weight shard
      // holds no piece of them.
      if (!s_.values[size_t(n.inputs[0])].pattern.kept.empty())
        throw InputError(split_where(node, {0}) + ": row split of " + node_ref(node) + " reads '" +
                         in_name +
                         "', split by heads with its key/value heads replicated on every rank "
                         "(the degree does not divide n_kv_head, or k and v are not split): a "
                         "row split cannot take the replicated columns. Split the key and value "
                         "linears by columns too (when the degree divides n_kv_head), or keep the "
                         "query linear unsplit (\"none\") so that '" +
                         in_name + "' stays whole");
      set_param(node, 0, in_out ? 0 : 1, t, s_.values[size_t(n.inputs[0])].pattern);
      row_split_output(node);
      return;
    }
    if (kind == SplitKind::column) {
      if (in_split)
        override_error(node, "column split of " + node_ref(node) +
                                 " needs a replicated input, but '" + in_name +
                                 "' is split (split this linear by rows)");
      SplitPattern p;
      if (feeds_attention(n.outputs[0], t)) {
        // Split by heads: the local queries, keys and values of the rank's heads.
        int64_t heads =
            attr_int(g_.nodes[size_t(g_.values[size_t(n.outputs[0])].consumers[0])], "n_head", 1);
        if (heads % t != 0)
          divide_error(g_.values[size_t(n.outputs[0])].consumers[0], t, "n_head", heads,
                       split_where(node));
        int64_t c = out_features / 3;
        p.blocks = {{0, c}, {c, c}, {2 * c, c}};
      } else {
        p.blocks = {{0, out_features}};
        if (out_features % t != 0) {
          // Logits over a vocabulary the degree does not divide: padded parts, masked by
          // the loss. Elsewhere a padded part would reach an op that cannot mask it.
          if (!feeds_loss_only(n.outputs[0], t))
            divide_error(node, t, "the output features", out_features, split_where(node));
          p.padded = true;
          check_padded_parts(node, t, out_features, "output features");
        }
      }
      ns.kind = SplitKind::column;
      ns.copy_inputs.push_back(0);
      set_param(node, 0, in_out ? 1 : 0, t, p);
      set_param(node, 1, 0, t, p);
      out_split(node, t, p);
      return;
    }
    keep_whole(node);
  }

  // conv2d: by output channels (column) from a replicated input, by input channels (row)
  // from a channel-split one, a grouped convolution by whole groups from a channel-split
  // input; the default pairs them as the linears: column when the output reaches a row.
  void visit_conv(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    const int t = ns.t;
    const int64_t groups = attr_int(n, "groups", 1);
    const int64_t out_ch = g_.params[size_t(n.params[0])].shape[0];
    const bool in_split = split_channels(node, 0);
    const int in_v = n.inputs[0];
    const std::string& in_name = g_.values[size_t(in_v)].name;
    SplitKind kind;
    if (o != nullptr)
      kind = *o;
    else if (in_split)
      kind = groups == 1 ? SplitKind::row : SplitKind::column;
    else if (groups == 1 && accepts_split(n.outputs[0], t, true))
      kind = SplitKind::column;
    else
      kind = SplitKind::none;
    if (kind == SplitKind::row) {
      if (groups != 1)
        override_error(node, "row split of " + node_ref(node) +
                                 " with groups = " + std::to_string(groups) +
                                 ": a grouped convolution splits by whole groups (\"column\", "
                                 "with its input split by channels)");
      if (!in_split)
        override_error(node, "row split of " + node_ref(node) +
                                 " needs its input split by channels, but '" + in_name +
                                 "' is not (split the convolution before it by columns)");
      set_param(node, 0, 1, t, s_.values[size_t(in_v)].pattern);
      row_split_output(node);
      return;
    }
    if (kind == SplitKind::column) {
      SplitPattern p;
      p.blocks = {{0, out_ch}};
      if (groups > 1) {
        if (!in_split)
          override_error(node, "column split of " + node_ref(node) +
                                   " with groups = " + std::to_string(groups) +
                                   " needs its input split by channels (whole groups per rank), "
                                   "but '" +
                                   in_name + "' is not");
        const ValueShard& in = s_.values[size_t(in_v)];
        if (!in.pattern.whole(g_.values[size_t(in_v)].type.shape[0]))
          override_error(node, "column split of grouped " + node_ref(node) +
                                   " needs its input split in one contiguous block of channels");
        if (groups % t != 0) divide_error(node, t, "the groups", groups, split_where(node, {0}));
      } else {
        if (in_split)
          override_error(node, "column split of " + node_ref(node) +
                                   " needs a replicated input, but '" + in_name +
                                   "' is split by channels (split this convolution by rows)");
        if (out_ch % t != 0)
          divide_error(node, t, "the output channels", out_ch, split_where(node));
        ns.copy_inputs.push_back(0);
      }
      ns.kind = SplitKind::column;
      set_param(node, 0, 0, t, p);
      set_param(node, 1, 0, t, p);
      out_split(node, t, p, 0);
      return;
    }
    keep_whole(node);
  }

  void visit_attention(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    int t = ns.t;
    int64_t heads = attr_int(n, "n_head", 1), kv = attr_int(n, "n_kv_head", heads);
    const stages::ValueType& qkv = g_.values[size_t(n.inputs[0])].type;
    const int64_t d = qkv.shape.back() / (heads + 2 * kv);
    const SplitPattern& in = s_.values[size_t(n.inputs[0])].pattern;
    const bool kv_rep = split_here(node, 0) && in == qkv_pattern(heads, kv, d, true);
    bool heads_in = split_here(node, 0) && (in == qkv_pattern(heads, kv, d, false) || kv_rep);
    ns.kv_replicated = kv_rep;
    if (o != nullptr && *o == SplitKind::heads && !heads_in)
      override_error(node, "heads split of " + node_ref(node) +
                               " needs its qkv input split by heads (split the linear before it "
                               "by columns)");
    if (heads_in) {
      if (o != nullptr && *o == SplitKind::none)
        override_error(node, node_ref(node) +
                                 " cannot run unsplit: its qkv input is split by heads "
                                 "(set the split of the linear before it to \"none\")");
      if (heads % t != 0) divide_error(node, t, "n_head", heads, split_where(node, {0}));
      if (!kv_rep && kv % t != 0) divide_error(node, t, "n_kv_head", kv, split_where(node, {0}));
      check_local_heads(node, kv_rep);
      ns.kind = SplitKind::heads;
      SplitPattern p;
      p.blocks = {{0, heads * d}};
      out_split(node, t, p);
      return;
    }
    need_whole(node, 0);
    out_replicated(node);
  }

  // The query heads of every rank must read key/value heads the rank holds (its slice of
  // them, or all when replicated): with a model's own kv_group or offsets they may not.
  void check_local_heads(int node, bool kv_replicated) const {
    const Node& n = g_.nodes[size_t(node)];
    const int t = tp_of(node);
    for (int r = 0; r < t; ++r) {
      const LocalHeads l = local_heads(n, t, r, kv_replicated);
      // Key/value heads numbered as the model's attention node numbers them.
      const int64_t first = l.head_offset / l.group - l.model_kv_offset;
      const int64_t last = (l.head_offset + l.heads - 1) / l.group - l.model_kv_offset;
      const int64_t held = l.kv_offset - l.model_kv_offset;
      if (first >= held && last < held + l.kv_heads) continue;
      std::string attrs;
      for (const char* a : {"head_offset", "kv_group", "kv_offset"})
        if (n.attrs.contains(a))
          attrs += (attrs.empty() ? "" : ", ") + std::string(a) + " = " + n.attrs.at(a).dump();
      throw InputError(split_where(node, {0}) + ": " + node_ref(node) + " is split by heads over " +
                       std::to_string(t) + " ranks, but its attributes in the model (" + attrs +
                       "; " + n.json_path + ") make rank " + std::to_string(r) +
                       "'s query heads read key/value heads " + std::to_string(first) + ".." +
                       std::to_string(last) + " and it holds " + std::to_string(held) + ".." +
                       std::to_string(held + l.kv_heads - 1) +
                       ". Replicate the key/value heads (\"none\" for the key and value "
                       "linears before rotary), keep the attention unsplit (\"none\" for the "
                       "linear before it), or drop those attributes");
    }
  }

  // rotary(q, k, v): split by heads when q is (column split of q_proj); k and v split
  // with it or replicated.
  void visit_rotary(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    const int t = ns.t;
    const int64_t heads = attr_int(n, "n_head", 1), kv = attr_int(n, "n_kv_head", heads);
    const int64_t d = g_.values[size_t(n.inputs[0])].type.shape.back() / heads;
    const bool q_split = split_here(node, 0), k_split = split_here(node, 1),
               v_split = split_here(node, 2);
    if (o != nullptr && *o == SplitKind::heads && !q_split)
      override_error(node,
                     "heads split of " + node_ref(node) + " needs its q input split by columns");
    if (!q_split || (o != nullptr && *o == SplitKind::none)) {
      for (size_t i = 0; i < n.inputs.size(); ++i) need_whole(node, int(i));
      out_replicated(node);
      return;
    }
    if (k_split != v_split) {
      // Only an override makes one differ: name it (the degree's path had been named).
      std::string at = override_behind(n.inputs[1]);
      if (at.empty()) at = override_behind(n.inputs[2]);
      throw InputError((at.empty() ? where_ : at) + ": " + node_ref(node) + " has its " +
                       (k_split ? "k" : "v") + " input split by heads and its " +
                       (k_split ? "v" : "k") + " input not; split both or neither");
    }
    ns.kind = SplitKind::heads;
    ns.kv_replicated = !k_split;
    if (ns.kv_replicated) {
      // Each rank's k and v gradients come from its query heads only: tp_copy sums them.
      ns.copy_inputs = {1, 2};
    } else if (kv % t != 0) {
      divide_error(node, t, "n_kv_head", kv, split_where(node, {1, 2}));
    }
    out_split(node, t, qkv_pattern(heads, kv, d, ns.kv_replicated));
  }

  void visit_embedding(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    int t = ns.t;
    if (o != nullptr && *o == SplitKind::none) {
      replicate_params(node);
      out_replicated(node);
      return;
    }
    int64_t rows = g_.params[size_t(n.params[0])].shape[0];
    SplitPattern p;
    p.blocks = {{0, rows}};
    // A degree that does not divide the vocabulary (GPT-2's 50257): parts of ceil(rows / t)
    // rows, the last ones padded with zero rows no id selects.
    p.padded = rows % t != 0;
    if (p.padded) check_padded_parts(node, t, rows, "vocabulary (table rows)");
    ns.kind = SplitKind::vocab;
    ns.reduce_output = true;
    set_param(node, 0, 0, t, p);
    out_replicated(node);
  }

  void visit_cross_entropy(int node, const SplitKind* o) {
    const Node& n = g_.nodes[size_t(node)];
    NodeShard& ns = s_.nodes[size_t(node)];
    const stages::ValueType& logits = g_.values[size_t(n.inputs[0])].type;
    bool vocab_in =
        split_here(node, 0) && s_.values[size_t(n.inputs[0])].pattern.whole(logits.shape.back());
    if (o != nullptr && *o == SplitKind::vocab && !vocab_in)
      override_error(node, "vocabulary-parallel " + node_ref(node) +
                               " needs logits split over the vocabulary (split the LM head by "
                               "columns)");
    if (vocab_in && !(o != nullptr && *o == SplitKind::none)) {
      ns.kind = SplitKind::vocab;
      out_replicated(node);
      return;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) need_whole(node, int(i));
    out_replicated(node);
  }

  void mark_cuts() {
    int L = g_.num_layers();
    s_.replicated_cut.assign(size_t(L + 1), true);
    for (size_t v = 0; v < g_.values.size(); ++v) {
      if (!s_.values[v].split) continue;
      const stages::Value& val = g_.values[v];
      if (val.is_input()) continue;
      int a = g_.nodes[size_t(val.producer)].layer;
      int b = a;
      for (int c : val.consumers) b = std::max(b, g_.nodes[size_t(c)].layer);
      for (int c = a + 1; c <= b; ++c) s_.replicated_cut[size_t(c)] = false;
    }
  }

  const Graph& g_;
  const SplitOverrides& ov_;
  std::string where_;
  Sharding s_;
  std::vector<OpKind> kinds_;
};

// ---- building physical graphs ----

stages::ValueType local_type(const stages::ValueType& logical, const ValueShard& s) {
  stages::ValueType t = logical;
  if (s.split) t.shape[s.dim_index(t.shape)] = s.pattern.local_size(s.t);
  return t;
}

class PhysicalBuilder {
 public:
  PhysicalBuilder(const Graph& lg, const Sharding& s, std::vector<int> tp_index)
      : lg_(lg), s_(s), r_(std::move(tp_index)) {
    g_ = std::make_shared<Graph>();
    g_->name = lg.name;
    g_->source = lg.source;
    g_->float_dtype = lg.float_dtype;
    g_->config = lg.config;
    vmap_.assign(lg.values.size(), -1);
    pmap_.assign(lg.params.size(), -1);
  }

  // The whole model: inputs, every parameter (in logical order), every layer.
  std::shared_ptr<Graph> whole() {
    for (int v : lg_.inputs)
      vmap_[size_t(v)] = g_->add_value(lg_.values[size_t(v)].name, lg_.values[size_t(v)].type, -1);
    for (size_t p = 0; p < lg_.params.size(); ++p) {
      const stages::Param& lp = lg_.params[p];
      int r = lp.users.empty() ? 0 : r_[size_t(lg_.nodes[size_t(lp.users.front())].layer)];
      pmap_[p] = g_->add_param(shard_param(lp, s_.params[p], r));
    }
    for (int l = 0; l < lg_.num_layers(); ++l) layer(l);
    g_->loss = lg_.loss >= 0 ? vmap_[size_t(lg_.loss)] : -1;
    return g_;
  }

  LayerGraph one_layer(int l) {
    standalone_ = true;
    layer(l);
    LayerGraph out;
    for (int v : g_->inputs) {
      const stages::ValueType& t = g_->values[size_t(v)].type;
      if (memory::is_floating(t.dtype) && t.batched) out.boundary_in.push_back(v);
    }
    for (int n : lg_.layers[size_t(l)].nodes)
      for (int v : lg_.nodes[size_t(n)].outputs) {
        const stages::Value& val = lg_.values[size_t(v)];
        bool later = int(v) == lg_.loss;
        for (int c : val.consumers) later = later || lg_.nodes[size_t(c)].layer > l;
        if (later) out.boundary_out.push_back(vmap_[size_t(v)]);
      }
    if (lg_.loss >= 0 && vmap_[size_t(lg_.loss)] >= 0) g_->loss = vmap_[size_t(lg_.loss)];
    out.graph = g_;
    return out;
  }

 private:
  int value_of(int v) {
    if (vmap_[size_t(v)] >= 0) return vmap_[size_t(v)];
    BATON_CHECK(standalone_, "value used before it is produced: " + lg_.values[size_t(v)].name);
    const stages::Value& val = lg_.values[size_t(v)];
    vmap_[size_t(v)] = g_->add_value(val.name, local_type(val.type, s_.values[size_t(v)]), -1);
    return vmap_[size_t(v)];
  }
  int param_of(int p) {
    if (p < 0) return -1;
    if (pmap_[size_t(p)] < 0) {
      BATON_CHECK(standalone_, "parameter missing: " + lg_.params[size_t(p)].name);
      pmap_[size_t(p)] =
          g_->add_param(shard_param(lg_.params[size_t(p)], s_.params[size_t(p)], r_now_));
    }
    return pmap_[size_t(p)];
  }
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int i = 2; g_->find_value(name) >= 0; ++i) name = base + "." + std::to_string(i);
    return name;
  }
  int emit(const std::string& name, const std::string& op, const nlohmann::json& attrs,
           const std::vector<int>& inputs, const std::vector<int>& params, const std::string& out,
           int layer, const std::string& path) {
    int id = detail::add_node(*g_, name, op, attrs, inputs, params, {out}, layer, path);
    return g_->nodes[size_t(id)].outputs[0];
  }

  void layer(int l) {
    int layer_id = g_->add_layer(lg_.layers[size_t(l)].name);
    r_now_ = r_[size_t(l)];
    copies_.clear();
    gathers_.clear();
    for (int n : lg_.layers[size_t(l)].nodes) node(n, layer_id);
  }

  void node(int id, int layer) {
    const Node& n = lg_.nodes[size_t(id)];
    const NodeShard& ns = s_.nodes[size_t(id)];
    const int t = ns.t, r = r_now_;
    std::vector<int> ins;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      int local = value_of(v);
      const std::string& vname = lg_.values[size_t(v)].name;
      if (std::count(ns.copy_inputs.begin(), ns.copy_inputs.end(), int(i))) {
        auto it = copies_.find(v);
        if (it == copies_.end()) {
          std::string name = fresh(vname + ".tp_copy");
          it = copies_
                   .emplace(v, emit(name, "tp_copy", nlohmann::json::object(), {local}, {}, name,
                                    layer, n.json_path))
                   .first;
        }
        local = it->second;
      } else if (std::count(ns.gather_inputs.begin(), ns.gather_inputs.end(), int(i))) {
        auto it = gathers_.find(v);
        if (it == gathers_.end()) {
          std::string name = fresh(vname + ".tp_gather");
          const ValueShard& vs = s_.values[size_t(v)];
          nlohmann::json ga = {{"parts", vs.t}};
          const auto& shape = lg_.values[size_t(v)].type.shape;
          if (vs.dim_index(shape) + 1 != shape.size()) ga["dim"] = int64_t(vs.dim_index(shape));
          it = gathers_
                   .emplace(v, emit(name, "tp_gather", ga, {local}, {}, name, layer, n.json_path))
                   .first;
        }
        local = it->second;
      }
      ins.push_back(local);
    }
    std::vector<int> ps;
    for (int p : n.params) ps.push_back(param_of(p));
    nlohmann::json attrs = n.attrs.is_null() ? nlohmann::json::object() : n.attrs;
    std::string op = n.op;
    if (ns.kind == SplitKind::heads) {
      int64_t heads = attrs.at("n_head").get<int64_t>();
      const bool has_kv = attrs.contains("n_kv_head");
      const int64_t kv = has_kv ? attrs.at("n_kv_head").get<int64_t>() : heads;
      attrs["n_head"] = heads / t;
      if (has_kv) attrs["n_kv_head"] = ns.kv_replicated ? kv : kv / t;
      if (n.op == "attention") {
        const LocalHeads l = local_heads(n, t, r, ns.kv_replicated);
        attrs["head_offset"] = l.head_offset;
        attrs["global_heads"] = l.global_heads;
        if (has_kv || attrs.contains("kv_group") || attrs.contains("kv_offset")) {
          attrs["kv_group"] = l.group;
          attrs["kv_offset"] = l.kv_offset;
        }
      }
    } else if (ns.kind == SplitKind::vocab && n.op == "embedding") {
      // The model's own offset (the ids its table starts at) plus the rank's rows.
      const ParamShard& sh = s_.params[size_t(n.params[0])];
      const int64_t rows = lg_.params[size_t(n.params[0])].shape[0];
      attrs["vocab_offset"] = attr_int(n, "vocab_offset", 0) + sh.pattern.part_offset(rows, t, r);
    } else if (ns.kind == SplitKind::column && n.op == "conv2d" && attrs.contains("groups") &&
               attrs.at("groups").get<int64_t>() > 1) {
      attrs["groups"] = attrs.at("groups").get<int64_t>() / t;  // whole groups per rank
    } else if (ns.kind == SplitKind::vocab && n.op == "cross_entropy") {
      int64_t v = lg_.values[size_t(n.inputs[0])].type.shape.back();
      op = "vocab_parallel_cross_entropy";
      const SplitPattern& p = s_.values[size_t(n.inputs[0])].pattern;
      attrs = {{"vocab_offset", p.part_offset(v, t, r)}, {"vocab_size", v}};
    }
    int bias = -1;
    if (ns.bias_after_reduce) {
      bias = ps[1];
      ps[1] = -1;
    }
    BATON_CHECK(n.outputs.size() == 1 || !ns.reduce_output, "reduced node with several outputs");
    std::vector<std::string> outs;
    for (int v : n.outputs) outs.push_back(lg_.values[size_t(v)].name);
    if (!ns.reduce_output) {
      int nid = detail::add_node(*g_, n.name, op, attrs, ins, ps, outs, layer, n.json_path);
      for (size_t j = 0; j < n.outputs.size(); ++j)
        vmap_[size_t(n.outputs[j])] = g_->nodes[size_t(nid)].outputs[j];
      return;
    }
    // Partial sums: reduce over the group, then add the bias once.
    const std::string& out = outs[0];
    int partial = emit(n.name, op, attrs, ins, ps, out + ".partial", layer, n.json_path);
    int reduced = emit(out + ".tp_reduce", "tp_reduce", nlohmann::json::object(), {partial}, {},
                       bias >= 0 ? out + ".reduced" : out, layer, n.json_path);
    if (bias >= 0) {
      // A convolution's bias is per channel: dimension 0 of [O, H, W].
      nlohmann::json ba = n.op == "conv2d" ? nlohmann::json{{"dim", 0}} : nlohmann::json::object();
      reduced = emit(out + ".bias_add", "bias_add", ba, {reduced}, {bias}, out, layer, n.json_path);
    }
    vmap_[size_t(n.outputs[0])] = reduced;
  }

  const Graph& lg_;
  const Sharding& s_;
  std::vector<int> r_;
  std::shared_ptr<Graph> g_;
  std::vector<int> vmap_, pmap_;
  std::map<int, int> copies_, gathers_;  // per layer: logical value -> local copy / gather
  int r_now_ = 0;
  bool standalone_ = false;
};

}  // namespace

stages::Param shard_param(const stages::Param& lp, const ParamShard& sh, int r) {
  stages::Param p;
  p.name = lp.name;
  p.logical_shape = lp.logical_shape;
  p.shape = lp.logical_shape;
  p.dtype = lp.dtype;
  p.init = lp.init;
  p.weight_decay = lp.weight_decay;
  p.trainable = lp.trainable;
  if (sh.dim < 0 || sh.t <= 1) return p;
  // Kept blocks have no pieces here: the pass refuses parameters split with them.
  BATON_CHECK(sh.pattern.kept.empty(), "parameter '" + lp.name + "' split with kept blocks");
  size_t d = size_t(sh.dim);
  p.shape[d] = sh.pattern.local_size(sh.t);
  int64_t local = 0;
  for (const auto& [off, len] : sh.pattern.blocks) {
    stages::ParamPiece piece;
    piece.local_offsets.assign(p.shape.size(), 0);
    piece.global_offsets.assign(p.shape.size(), 0);
    piece.shape = p.shape;
    // A padded part's piece is its real rows only: checkpoints, exports and the
    // initialisation never see the padding.
    piece.shape[d] = sh.pattern.part_real(len, sh.t, r);
    piece.local_offsets[d] = local;
    piece.global_offsets[d] = off + sh.pattern.part_offset(len, sh.t, r);
    local += sh.pattern.part(len, sh.t);
    p.pieces.push_back(piece);
  }
  return p;
}

Sharding plan_sharding(const Graph& g, const std::vector<int>& layer_tp,
                       const SplitOverrides& overrides, const std::string& where) {
  BATON_CHECK(int(layer_tp.size()) == g.num_layers(), "one degree per layer");
  return ShardingPass(g, layer_tp, overrides, where).run();
}

std::shared_ptr<Graph> build_physical(const Graph& logical, const Sharding& s,
                                      const std::vector<int>& tp_index) {
  BATON_CHECK(int(tp_index.size()) == logical.num_layers(), "one tp index per layer");
  return PhysicalBuilder(logical, s, tp_index).whole();
}

LayerGraph build_layer(const Graph& logical, const Sharding& s, int layer, int tp_index) {
  std::vector<int> idx(size_t(logical.num_layers()), tp_index);
  return PhysicalBuilder(logical, s, idx).one_layer(layer);
}

}  // namespace baton::partitioner
