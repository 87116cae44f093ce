// Appending nodes to a Graph through the op factories, as the model loader does, for
// graphs the partitioner makes (physical graphs, one-layer graphs for the cost model).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/graph.h"

namespace baton::partitioner::detail {

// Adds a node of op type `op` to the last layer of `g` (its index must be `layer`):
// builds the op from the input value types and parameter shapes (`params` by slot, -1 for
// an absent optional one), adds its outputs under `outputs` and returns the node id.
// `json_path` names the logical node it came from in messages.
int add_node(stages::Graph& g, const std::string& name, const std::string& op,
             const nlohmann::json& attrs, const std::vector<int>& inputs,
             const std::vector<int>& params, const std::vector<std::string>& outputs, int layer,
             const std::string& json_path);

// Rebuilds node `node`'s op from its attributes, after a pass changed them.
void remake_op(stages::Graph& g, int node);

}  // namespace baton::partitioner::detail
