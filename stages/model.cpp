#include "stages/model.h"

#include <set>

#include "stages/json_reader.h"
#include "stages/resnet.h"
#include "stages/shorthands.h"

namespace baton::stages {

using nlohmann::json;

namespace {

InitRule parse_init(const JsonReader& r) {
  InitRule rule;
  std::string type = r.at("type").as_string();
  if (type == "normal") {
    r.expect_only({"type", "mean", "std"});
    rule.kind = InitRule::Kind::normal;
    rule.mean = r.get_double("mean", 0.0, -1e6, 1e6);
    rule.std = r.at("std").as_double(0.0, 1e6);
  } else if (type == "zeros") {
    r.expect_only({"type"});
    rule.kind = InitRule::Kind::zeros;
  } else if (type == "ones") {
    r.expect_only({"type"});
    rule.kind = InitRule::Kind::ones;
  } else if (type == "constant") {
    r.expect_only({"type", "value"});
    rule.kind = InitRule::Kind::constant;
    rule.value = r.at("value").as_double();
  } else {
    r.at("type").fail("\"normal\", \"zeros\", \"ones\" or \"constant\"");
  }
  return rule;
}

// The most elements a parameter or a per-sample input may have: 2^40 (4 TiB of f32) is far
// beyond any real tensor, and its bytes (or a batch of such samples) stay within int64.
constexpr int64_t kMaxShapeElements = int64_t(1) << 40;

Shape parse_shape(const JsonReader& r, bool allow_empty) {
  Shape s = r.as_int_list();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] <= 0) r.at(i).fail("a positive dimension");
  if (s.empty() && !allow_empty) r.fail("a non-empty shape");
  int64_t n = 1;
  for (int64_t d : s) {
    if (d > kMaxShapeElements / n)
      r.fail("a shape of at most 2^40 (" + std::to_string(kMaxShapeElements) + ") elements",
             memory::shape_str(s));
    n *= d;
  }
  return s;
}

// The partitioner's ops talk through a stage's communicators, which the physical graphs it
// makes have and a model (run on one process, or split by a plan) does not.
bool is_physical_op(const std::string& op) {
  static const std::set<std::string, std::less<>> ops = {
      "tp_copy", "tp_reduce", "tp_gather", "spatial_mean", "vocab_parallel_cross_entropy"};
  return ops.count(op) != 0;
}

std::string known_ops() {
  std::string s;
  for (const OpType& t : op_types())
    if (!is_physical_op(t.schema.type)) s += (s.empty() ? "" : ", ") + t.schema.type;
  return s;
}

void check_name(const JsonReader& r, const std::string& name) {
  if (name.empty()) r.fail("a non-empty name", "\"\"");
}

void load_inputs(Graph& g, const JsonReader& list, DType float_dtype) {
  for (const JsonReader& in : list.items()) {
    in.expect_only({"name", "shape", "dtype"});
    std::string name = in.at("name").as_string();
    check_name(in.at("name"), name);
    if (g.find_value(name) >= 0) in.at("name").fail("a new value name", "'" + name + "' again");
    ValueType t;
    t.shape = parse_shape(in.at("shape"), true);
    DType d = DType::f32;
    const std::string spelled = in.at("dtype").as_string();
    try {
      d = memory::parse_dtype(spelled);
    } catch (const InputError&) {
      in.at("dtype").fail("one of i32, i64, f32, f64", "'" + spelled + "'");
    }
    // 16-bit inputs had been taken (and run as the model's float type): not what is said.
    if (d != DType::i32 && d != DType::i64 && d != DType::f32 && d != DType::f64)
      in.at("dtype").fail("one of i32, i64, f32, f64", "'" + spelled + "'");
    t.dtype = memory::is_floating(d) ? float_dtype : d;
    g.add_value(name, t, -1);
  }
}

void load_params(Graph& g, const JsonReader& list, DType float_dtype) {
  for (const JsonReader& p : list.items()) {
    p.expect_only({"name", "shape", "init", "weight_decay", "trainable"});
    Param param;
    param.name = p.at("name").as_string();
    check_name(p.at("name"), param.name);
    if (g.find_param(param.name) >= 0)
      p.at("name").fail("a new parameter name", "'" + param.name + "' again");
    param.shape = parse_shape(p.at("shape"), false);
    param.logical_shape = param.shape;
    param.dtype = float_dtype;
    param.init = parse_init(p.at("init"));
    param.trainable = p.get_bool("trainable", true);
    param.weight_decay = p.get_bool("weight_decay", param.shape.size() >= 2 && param.trainable);
    g.add_param(std::move(param));
  }
}

void load_node(Graph& g, int layer, const JsonReader& n, size_t index, DType float_dtype,
               std::set<std::string>& node_names) {
  n.expect_only({"name", "op", "inputs", "outputs", "params", "attrs"});
  std::string op = n.at("op").as_string();
  const OpType* type = find_op_type(op);
  if (type == nullptr) n.at("op").fail("a known op (" + known_ops() + ")", "\"" + op + "\"");
  const OpSchema& schema = type->schema;
  if (is_physical_op(op))
    n.at("op").fail("an op of a model (" + op +
                        " is a communication op the partitioner puts in its physical graphs)",
                    "\"" + op + "\"");

  Node node;
  node.op = op;
  node.layer = layer;
  node.json_path = n.where();
  node.name =
      n.get_string("name", g.layers[size_t(layer)].name + "." + op + "." + std::to_string(index));
  if (!node_names.insert(node.name).second)
    n.at("name").fail("a new node name", "'" + node.name + "' again");

  OpSpec spec{node.name, n, n, {}, {}, float_dtype};
  static const json empty_object = json::object();
  JsonReader attrs =
      n.has("attrs") ? n.at("attrs") : JsonReader(empty_object, n.file(), n.path() + ".attrs");
  attrs.expect_object();
  for (const std::string& k : attrs.keys()) {
    bool ok = false;
    for (const std::string& a : schema.attrs) ok = ok || a == k;
    if (!ok) {
      std::string list;
      for (const std::string& a : schema.attrs) list += (list.empty() ? "" : ", ") + a;
      attrs.at(k).fail_message("unknown attribute '" + k + "' of op " + op +
                               " (allowed: " + (list.empty() ? "none" : list) + ")");
    }
  }
  // Likewise a spatial tile's attributes: the partitioner's spatial split sets them.
  if (attrs.has("halo"))
    attrs.at("halo").fail_message(
        "'halo' is set by the spatial split on the tiles of its physical graphs (they take "
        "their border rows from the neighbouring tiles), not in a model file");
  if (op == "batchnorm2d" && attrs.get_bool("spatial", false))
    attrs.at("spatial").fail_message(
        "\"spatial\": true is set by the spatial split on the tiles of its physical graphs "
        "(their statistics span the spatial group), not in a model file");
  spec.attrs = attrs;
  node.attrs = attrs.raw();

  JsonReader inputs = n.at("inputs");
  if (inputs.size() != schema.inputs.size())
    inputs.fail(
        std::to_string(schema.inputs.size()) + " input(s) for op " + op + " (" +
            [&] {
              std::string s;
              for (const auto& i : schema.inputs) s += (s.empty() ? "" : ", ") + i;
              return s;
            }() +
            ")",
        std::to_string(inputs.size()));
  for (const JsonReader& in : inputs.items()) {
    std::string name = in.as_string();
    int v = g.find_value(name);
    if (v < 0)
      in.fail("the name of a model input or of an output of an earlier node", "'" + name + "'");
    node.inputs.push_back(v);
    spec.inputs.push_back(g.values[size_t(v)].type);
  }

  std::optional<JsonReader> params = n.get("params");
  if (params) {
    params->expect_object();
    for (const std::string& k : params->keys()) {
      bool ok = false;
      for (const ParamSlot& s : schema.params) ok = ok || s.name == k;
      if (!ok) params->at(k).fail_message("unknown parameter slot '" + k + "' of op " + op);
    }
  }
  for (const ParamSlot& slot : schema.params) {
    std::optional<JsonReader> p = params ? params->get(slot.name) : std::nullopt;
    if (!p) {
      if (!slot.optional)
        (params ? *params : n)
            .fail_message("op " + op + " needs parameter slot '" + slot.name + "'");
      node.params.push_back(-1);
      spec.params.push_back(std::nullopt);
      continue;
    }
    std::string pname = p->as_string();
    int pid = g.find_param(pname);
    if (pid < 0) p->fail("the name of a parameter declared in $.params", "'" + pname + "'");
    node.params.push_back(pid);
    spec.params.push_back(g.params[size_t(pid)].shape);
  }

  std::unique_ptr<Op> impl = type->make(spec);
  JsonReader outputs = n.at("outputs");
  const auto& types = impl->output_types();
  if (outputs.size() != types.size())
    outputs.fail(std::to_string(types.size()) + " output name(s) for op " + op,
                 std::to_string(outputs.size()));
  int id = int(g.nodes.size());
  for (size_t i = 0; i < types.size(); ++i) {
    JsonReader o = outputs.at(i);
    std::string name = o.as_string();
    check_name(o, name);
    if (g.find_value(name) >= 0) o.fail("a new value name", "'" + name + "', defined before");
    node.outputs.push_back(g.add_value(name, types[i], id));
  }
  node.impl = std::move(impl);
  g.add_node(std::move(node));
}

Graph load_graph(const JsonReader& r, const LoadOptions& opt) {
  r.expect_only({"type", "name", "inputs", "params", "layers", "loss"});
  Graph g;
  g.name = r.get_string("name", "model");
  g.source = r.file();
  g.float_dtype = opt.float_dtype;
  load_inputs(g, r.at("inputs"), opt.float_dtype);
  load_params(g, r.at("params"), opt.float_dtype);
  JsonReader layers = r.at("layers");
  if (layers.size() == 0) layers.fail("at least one layer", "an empty array");
  std::set<std::string> node_names;
  for (const JsonReader& l : layers.items()) {
    l.expect_only({"name", "nodes"});
    std::string name = l.at("name").as_string();
    check_name(l.at("name"), name);
    if (g.find_layer(name) >= 0) l.at("name").fail("a new layer name", "'" + name + "' again");
    int layer = g.add_layer(name);
    JsonReader nodes = l.at("nodes");
    if (nodes.size() == 0) nodes.fail("at least one node", "an empty array");
    size_t i = 0;
    for (const JsonReader& n : nodes.items())
      load_node(g, layer, n, i++, opt.float_dtype, node_names);
  }
  JsonReader loss = r.at("loss");
  std::string lname = loss.as_string();
  int lv = g.find_value(lname);
  if (lv < 0) loss.fail("the name of a value", "'" + lname + "'");
  const Value& lval = g.values[size_t(lv)];
  if (lval.is_input() || lval.type.batched || !lval.type.shape.empty())
    loss.fail("a scalar loss (the output of cross_entropy)",
              "'" + lname + "' of type " + type_str(lval.type));
  if (!lval.consumers.empty())
    loss.fail("a value no node consumes", "'" + lname + "' used by a node");
  // A cross_entropy's backward hands on the logits' gradient of a loss whose own gradient is
  // 1, whatever reads its output: a second one would add its gradient to the loss's.
  for (int l = 0; l < g.num_layers(); ++l) {
    const std::vector<int>& ids = g.layers[size_t(l)].nodes;
    for (size_t k = 0; k < ids.size(); ++k) {
      const Node& n = g.nodes[size_t(ids[k])];
      if (n.op == "cross_entropy" && n.outputs[0] != lv)
        layers.at(size_t(l)).at("nodes").at(k).at("outputs").at(0).fail(
            "the loss '" + lname + "' (a model has one cross_entropy, its loss)",
            "'" + g.values[size_t(n.outputs[0])].name + "'");
    }
  }
  g.loss = lv;
  // Layers after the loss's reach nothing the loss depends on, and a plan's stages after
  // the loss's chunk carried no loss (the run had logged 0): the loss's layer is the last.
  const int loss_layer = g.nodes[size_t(lval.producer)].layer;
  if (loss_layer + 1 < g.num_layers())
    layers.at(size_t(loss_layer + 1))
        .at("name")
        .fail_message("layer '" + g.layers[size_t(loss_layer + 1)].name + "' comes after layer '" +
                      g.layers[size_t(loss_layer)].name + "', which computes the loss '" + lname +
                      "': nothing after it reaches the loss (a model ends with the loss's "
                      "layer)");
  for (size_t p = 0; p < g.params.size(); ++p)
    if (g.params[p].users.empty())
      r.at("params").at(p).fail_message("parameter '" + g.params[p].name +
                                        "' is not used by any node");
  return g;
}

}  // namespace

void check_loss_trains(const Graph& g, const std::string& source) {
  // Nodes off the loss's way are allowed (their outputs unread, their parameters without
  // gradient); a loss none of whose way uses a trainable parameter trains nothing (one
  // reading the raw input had left every layer dead without a word).
  std::vector<char> seen(g.nodes.size(), 0);
  std::vector<int> todo = {g.values[size_t(g.loss)].producer};
  while (!todo.empty()) {
    const int n = todo.back();
    todo.pop_back();
    if (n < 0 || seen[size_t(n)]) continue;
    seen[size_t(n)] = 1;
    for (int p : g.nodes[size_t(n)].params)
      if (p >= 0 && g.params[size_t(p)].trainable) return;
    for (int in : g.nodes[size_t(n)].inputs) todo.push_back(g.values[size_t(in)].producer);
  }
  throw InputError(json_where(source, "$.loss") + ": the loss '" + g.values[size_t(g.loss)].name +
                   "' depends on no trainable parameter (no node on its way uses one): "
                   "training would change nothing");
}

json expand_model_json(const json& model, const std::string& source) {
  JsonReader r(model, source);
  r.expect_object();
  if (r.has("model_type")) {
    const std::string mt = r.at("model_type").as_string();
    if (mt == "gpt2") return gpt2_graph_json(parse_hf_gpt2_config(r));
    if (mt == "llama" || mt == "mistral" || mt == "qwen2")
      return llama_graph_json(parse_hf_llama_config(r));
    r.at("model_type")
        .fail(
            "a Hugging Face model_type baton reads: \"gpt2\", \"llama\", \"mistral\" or "
            "\"qwen2\"",
            "\"" + mt + "\"");
  }
  std::string type = r.at("type").as_string();
  if (type == "graph") return model;
  if (type == "gpt2") return gpt2_graph_json(parse_gpt2_shorthand(r));
  if (type == "llama") return llama_graph_json(parse_llama_shorthand(r));
  if (type == "mlp") return mlp_graph_json(parse_mlp_shorthand(r));
  if (type == "resnet") return resnet_graph_json(parse_resnet_shorthand(r));
  r.at("type").fail("\"graph\", \"gpt2\", \"llama\", \"mlp\" or \"resnet\"");
}

Graph load_model_json(const json& model, const std::string& source, const LoadOptions& opt) {
  json expanded = expand_model_json(model, source);
  bool shorthand = &expanded != &model && expanded != model;
  // Errors inside an expanded shorthand point into the expansion, so they say so.
  std::string where =
      shorthand ? source + " (expanded " +
                      JsonReader(model, source)
                          .get_string("type",
                                      JsonReader(model, source).get_string("model_type", "gpt2")) +
                      " shorthand)"
                : source;
  Graph g = load_graph(JsonReader(expanded, where), opt);
  g.source = source;
  g.config = model;
  return g;
}

Graph load_model(const std::string& path, const LoadOptions& opt) {
  return load_model_json(read_json_file(path), path, opt);
}

}  // namespace baton::stages
