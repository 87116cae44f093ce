#include "partitioner/fusion.h"

#include <string>
#include <vector>

#include "memory/error.h"
#include "partitioner/detail/graph_builder.h"

namespace baton::partitioner {

using stages::Graph;
using stages::Node;

namespace {

bool is_model_output(const Graph& g, int v) {
  return v == g.loss;
}

// The LayerNorm of n's layer that reads n's (an add's) output, or -1.
int layernorm_reader(const Graph& g, const Node& n) {
  if (n.op != "add" || n.outputs.size() != 1) return -1;
  for (int c : g.values[size_t(n.outputs[0])].consumers) {
    const Node& m = g.nodes[size_t(c)];
    if (m.op == "layernorm" && m.layer == n.layer && m.inputs.size() == 1) return c;
  }
  return -1;
}

// The GELU of n's layer that alone reads n's (a linear with a bias) output, or -1.
int gelu_reader(const Graph& g, const Node& n) {
  if (n.op != "linear" || n.params.size() < 2 || n.params[1] < 0 || n.outputs.size() != 1)
    return -1;
  const int v = n.outputs[0];
  const auto& readers = g.values[size_t(v)].consumers;
  if (readers.size() != 1 || is_model_output(g, v)) return -1;
  const Node& m = g.nodes[size_t(readers[0])];
  return m.op == "gelu" && m.layer == n.layer ? readers[0] : -1;
}

}  // namespace

std::shared_ptr<Graph> fuse_kernels(const Graph& g, FusionCount* count) {
  auto out = std::make_shared<Graph>();
  out->name = g.name;
  out->source = g.source;
  out->float_dtype = g.float_dtype;
  out->config = g.config;
  for (stages::Param p : g.params) {  // same ids; users and layers come with the nodes
    p.users.clear();
    p.layers.clear();
    out->add_param(std::move(p));
  }
  // Each value's id in the new graph (ids shift after each bias_gelu's new value h).
  std::vector<int> new_id(g.values.size(), -1);
  for (int v : g.inputs)
    new_id[size_t(v)] = out->add_value(g.values[size_t(v)].name, g.values[size_t(v)].type, -1);
  auto value_of = [&](int v) { return new_id[size_t(v)]; };
  // Records the new ids of `old` values, the outputs of new node `node` in order.
  auto map_outputs = [&](int node, const std::vector<int>& old) {
    for (size_t i = 0; i < old.size(); ++i)
      new_id[size_t(old[i])] = out->nodes[size_t(node)].outputs[i];
  };
  auto inputs_of = [&](const Node& n) {
    std::vector<int> in;
    for (int v : n.inputs) in.push_back(value_of(v));
    return in;
  };
  auto names_of = [&](const std::vector<int>& vs) {
    std::vector<std::string> names;
    for (int v : vs) names.push_back(g.values[size_t(v)].name);
    return names;
  };
  // h's name: `<gelu node>.pre`, numbered (.pre.2, .pre.3, ...) past the model's own values.
  auto new_name = [&](const std::string& node) {
    const std::string base = node + ".pre";
    std::string name = base;
    for (int k = 2; g.find_value(name) >= 0 || out->find_value(name) >= 0; ++k)
      name = base + "." + std::to_string(k);
    return name;
  };
  FusionCount fused;
  std::vector<bool> absorbed(g.nodes.size(), false);
  for (int l = 0; l < g.num_layers(); ++l) {
    out->add_layer(g.layers[size_t(l)].name);
    for (int id : g.layers[size_t(l)].nodes) {
      if (absorbed[size_t(id)]) continue;
      const Node& n = g.nodes[size_t(id)];
      if (int ln = layernorm_reader(g, n); ln >= 0) {
        const Node& m = g.nodes[size_t(ln)];
        nlohmann::json attrs = nlohmann::json::object();
        if (m.attrs.is_object() && m.attrs.contains("eps")) attrs["eps"] = m.attrs["eps"];
        map_outputs(detail::add_node(*out, m.name, "add_layernorm", attrs, inputs_of(n), m.params,
                                     names_of({n.outputs[0], m.outputs[0]}), l, m.json_path),
                    {n.outputs[0], m.outputs[0]});
        absorbed[size_t(ln)] = true;
        ++fused.add_layernorm;
        continue;
      }
      if (int ge = gelu_reader(g, n); ge >= 0) {
        const Node& m = g.nodes[size_t(ge)];
        std::vector<int> params = n.params;
        params[1] = -1;
        map_outputs(detail::add_node(*out, n.name, n.op, n.attrs, inputs_of(n), params,
                                     names_of(n.outputs), l, n.json_path),
                    n.outputs);
        // h = x + bias, a new value (kept for B in x's memory); y keeps the GELU's name.
        map_outputs(detail::add_node(*out, m.name, "bias_gelu", nlohmann::json::object(),
                                     {value_of(n.outputs[0])}, {n.params[1]},
                                     {g.values[size_t(m.outputs[0])].name, new_name(m.name)}, l,
                                     m.json_path),
                    {m.outputs[0]});
        absorbed[size_t(ge)] = true;
        ++fused.bias_gelu;
        continue;
      }
      // Unchanged: the node as it is (its op is shared), on the new graph's values.
      Node copy = n;
      copy.inputs = inputs_of(n);
      copy.outputs.clear();
      const int node_id = int(out->nodes.size());
      for (int v : n.outputs)
        copy.outputs.push_back(new_id[size_t(v)] = out->add_value(
                                   g.values[size_t(v)].name, g.values[size_t(v)].type, node_id));
      out->add_node(std::move(copy));
    }
  }
  out->loss = g.loss >= 0 ? value_of(g.loss) : -1;
  BATON_CHECK(out->values.size() == g.values.size() + size_t(fused.bias_gelu),
              "fuse_kernels: values lost or duplicated");
  if (count) *count = fused;
  return out;
}

}  // namespace baton::partitioner
