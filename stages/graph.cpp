#include "stages/graph.h"

#include <algorithm>
#include <set>

namespace baton::stages {

nlohmann::json InitRule::to_json() const {
  switch (kind) {
    case Kind::normal:
      return {{"type", "normal"}, {"mean", mean}, {"std", std}};
    case Kind::zeros:
      return {{"type", "zeros"}};
    case Kind::ones:
      return {{"type", "ones"}};
    case Kind::constant:
      return {{"type", "constant"}, {"value", value}};
  }
  return {};
}

int Graph::find_value(const std::string& n) const {
  auto it = value_index_.find(n);
  return it == value_index_.end() ? -1 : it->second;
}

int Graph::find_param(const std::string& n) const {
  auto it = param_index_.find(n);
  return it == param_index_.end() ? -1 : it->second;
}

int Graph::find_layer(const std::string& n) const {
  auto it = layer_index_.find(n);
  return it == layer_index_.end() ? -1 : it->second;
}

const Value& Graph::value(const std::string& n) const {
  int i = find_value(n);
  BATON_CHECK(i >= 0, "no value named " + n);
  return values[size_t(i)];
}

int Graph::add_value(const std::string& n, const ValueType& type, int producer) {
  BATON_CHECK(find_value(n) < 0, "value defined twice: " + n);
  Value v;
  v.name = n;
  v.type = type;
  v.producer = producer;
  values.push_back(std::move(v));
  int id = int(values.size()) - 1;
  value_index_[n] = id;
  if (producer < 0) inputs.push_back(id);
  return id;
}

int Graph::add_param(Param p) {
  BATON_CHECK(find_param(p.name) < 0, "parameter defined twice: " + p.name);
  if (p.logical_shape.empty()) p.logical_shape = p.shape;
  params.push_back(std::move(p));
  int id = int(params.size()) - 1;
  param_index_[params.back().name] = id;
  return id;
}

int Graph::add_layer(const std::string& n) {
  BATON_CHECK(find_layer(n) < 0, "layer defined twice: " + n);
  layers.push_back(Layer{n, {}});
  int id = int(layers.size()) - 1;
  layer_index_[n] = id;
  return id;
}

int Graph::add_node(Node n) {
  BATON_CHECK(n.layer >= 0 && n.layer < num_layers(), "node without a layer: " + n.name);
  BATON_CHECK(n.layer == num_layers() - 1, "nodes must be added layer by layer: " + n.name);
  int id = int(nodes.size());
  for (int v : n.inputs) values[size_t(v)].consumers.push_back(id);
  for (int p : n.params) {
    if (p < 0) continue;
    Param& param = params[size_t(p)];
    param.users.push_back(id);
    if (std::find(param.layers.begin(), param.layers.end(), n.layer) == param.layers.end())
      param.layers.push_back(n.layer);
  }
  layers[size_t(n.layer)].nodes.push_back(id);
  nodes.push_back(std::move(n));
  return id;
}

std::vector<int> Graph::cut_values(int cut) const {
  std::vector<int> out;
  for (size_t v = 0; v < values.size(); ++v) {
    const Value& val = values[v];
    if (val.is_input()) continue;
    if (nodes[size_t(val.producer)].layer >= cut) continue;
    bool used_after = false;
    for (int c : val.consumers) used_after = used_after || nodes[size_t(c)].layer >= cut;
    // The loss is what the last stage hands on, whoever consumes it.
    if (used_after || (int(v) == loss && cut >= num_layers())) out.push_back(int(v));
  }
  return out;
}

std::vector<int> Graph::inputs_used(int first, int last) const {
  std::vector<int> out;
  for (int v : inputs) {
    for (int c : values[size_t(v)].consumers) {
      int l = nodes[size_t(c)].layer;
      if (l >= first && l < last) {
        out.push_back(v);
        break;
      }
    }
  }
  return out;
}

std::vector<int> Graph::params_used(int first, int last) const {
  std::set<int> s;
  for (int l = first; l < last; ++l)
    for (int n : layers[size_t(l)].nodes)
      for (int p : nodes[size_t(n)].params)
        if (p >= 0) s.insert(p);
  return {s.begin(), s.end()};
}

int64_t Graph::num_parameters() const {
  int64_t n = 0;
  // Running statistics are state, not parameters (no gradient, no optimizer state): as
  // PyTorch counts them.
  for (const Param& p : params)
    if (p.trainable) n += memory::shape_numel(p.logical_shape);
  return n;
}

}  // namespace baton::stages
