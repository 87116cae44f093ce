#include "partitioner/detail/graph_builder.h"

#include "memory/error.h"
#include "stages/json_reader.h"

namespace baton::partitioner::detail {

using nlohmann::json;

namespace {

// The op of a node named `name` of type `op` on `g`'s values and parameters, built by its
// factory from the node as JSON (the factories read their attributes from it and name it
// in errors).
std::unique_ptr<stages::Op> make_op(const stages::Graph& g, const std::string& name,
                                    const std::string& op, const json& attrs,
                                    const std::vector<int>& inputs, const std::vector<int>& params,
                                    const std::string& json_path) {
  const stages::OpType* type = stages::find_op_type(op);
  BATON_CHECK(type != nullptr, "unknown op type " + op);
  const stages::OpSchema& schema = type->schema;
  BATON_CHECK(params.size() == schema.params.size(), "parameter slots of " + name);
  json node = {{"name", name}, {"op", op}, {"attrs", attrs.is_null() ? json::object() : attrs}};
  json in = json::array();
  for (int v : inputs) in.push_back(g.values[size_t(v)].name);
  node["inputs"] = in;
  json ps = json::object();
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k] >= 0) ps[schema.params[k].name] = g.params[size_t(params[k])].name;
  node["params"] = ps;

  std::string origin = json_path.empty() ? g.source : json_path + " (physical node " + name + ")";
  stages::JsonReader nr(node, origin);
  stages::OpSpec spec{name, nr, nr.at("attrs"), {}, {}, g.float_dtype};
  for (int v : inputs) spec.inputs.push_back(g.values[size_t(v)].type);
  for (int p : params)
    spec.params.push_back(p >= 0 ? std::optional<stages::Shape>(g.params[size_t(p)].shape)
                                 : std::nullopt);
  return type->make(spec);
}

}  // namespace

int add_node(stages::Graph& g, const std::string& name, const std::string& op, const json& attrs,
             const std::vector<int>& inputs, const std::vector<int>& params,
             const std::vector<std::string>& outputs, int layer, const std::string& json_path) {
  std::unique_ptr<stages::Op> impl = make_op(g, name, op, attrs, inputs, params, json_path);
  const auto& types = impl->output_types();
  BATON_CHECK(types.size() == outputs.size(), "output names of " + name);

  stages::Node n;
  n.name = name;
  n.op = op;
  n.attrs = attrs.is_null() ? json::object() : attrs;
  n.inputs = inputs;
  n.params = params;
  n.layer = layer;
  n.json_path = json_path;
  int id = int(g.nodes.size());
  for (size_t i = 0; i < types.size(); ++i)
    n.outputs.push_back(g.add_value(outputs[i], types[i], id));
  n.impl = std::move(impl);
  return g.add_node(std::move(n));
}

void remake_op(stages::Graph& g, int node) {
  stages::Node& n = g.nodes[size_t(node)];
  n.impl = make_op(g, n.name, n.op, n.attrs, n.inputs, n.params, n.json_path);
}

}  // namespace baton::partitioner::detail
