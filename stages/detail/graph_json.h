// Pieces of the general graph form that the model shorthands (stages/shorthands.cpp,
// stages/resnet.cpp) write (not part of stages/' interface).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace baton::stages::detail {

// A parameter entry: {"name", "shape", "init"} and "trainable": false when it is not.
inline nlohmann::json graph_param(const std::string& name, const std::vector<int64_t>& shape,
                                  nlohmann::json init, bool trainable = true) {
  nlohmann::json p = {{"name", name}, {"shape", shape}, {"init", std::move(init)}};
  if (!trainable) p["trainable"] = false;
  return p;
}

// A node whose one output is named after it; "params" and "attrs" only when not empty.
inline nlohmann::json graph_node(const std::string& name, const std::string& op,
                                 const std::vector<std::string>& inputs,
                                 nlohmann::json params = nlohmann::json::object(),
                                 nlohmann::json attrs = nlohmann::json::object()) {
  nlohmann::json n = {{"name", name}, {"op", op}, {"inputs", inputs}, {"outputs", {name}}};
  if (!params.empty()) n["params"] = std::move(params);
  if (!attrs.empty()) n["attrs"] = std::move(attrs);
  return n;
}

}  // namespace baton::stages::detail
