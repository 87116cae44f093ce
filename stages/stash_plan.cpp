#include "stages/stash_plan.h"

#include <algorithm>

namespace baton::stages {

StashPlan plan_stash(const Graph& g, int first, int last, const std::set<int>& recompute_layers) {
  StashPlan p;
  p.first = first;
  p.last = last;
  for (int l = first; l < last; ++l)
    for (int n : g.layers[size_t(l)].nodes) p.nodes.push_back(n);
  p.boundary_in = g.cut_values(first);
  p.boundary_out = g.cut_values(last);
  p.model_in = g.inputs_used(first, last);
  size_t nv = g.values.size();
  p.kept.assign(nv, false);
  p.needs_grad.assign(nv, false);
  p.last_forward_use.assign(nv, -1);
  p.last_layer_use.assign(nv, -1);
  p.backward_users.assign(nv, {});
  p.recompute_node.assign(g.nodes.size(), false);
  std::vector<bool> in_stage(g.nodes.size(), false);
  for (int n : p.nodes) in_stage[size_t(n)] = true;
  for (int n : p.nodes) {
    const Node& node = g.nodes[size_t(n)];
    bool rc = recompute_layers.count(node.layer) > 0;
    p.recompute_node[size_t(n)] = rc;
    const Op& op = *node.impl;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      p.last_forward_use[size_t(v)] = n;
      if (op.saves_input(i)) p.backward_users[size_t(v)].push_back(n);
      if (op.saves_input(i) && !rc) p.kept[size_t(v)] = true;
      // A recomputed layer keeps only what enters it.
      int prod = g.values[size_t(v)].producer;
      if (prod >= 0 && g.nodes[size_t(prod)].layer == node.layer) p.last_layer_use[size_t(v)] = n;
      if (rc && (prod < 0 || g.nodes[size_t(prod)].layer != node.layer)) p.kept[size_t(v)] = true;
    }
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      int v = node.outputs[j];
      if (op.saves_output(j)) {
        p.backward_users[size_t(v)].push_back(n);
        if (!rc) p.kept[size_t(v)] = true;
      }
    }
  }
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = g.values[v];
    bool floating = memory::is_floating(val.type.dtype) && val.type.batched;
    bool produced_here = !val.is_input() && in_stage[size_t(val.producer)];
    bool enters =
        std::find(p.boundary_in.begin(), p.boundary_in.end(), int(v)) != p.boundary_in.end();
    p.needs_grad[v] = floating && (produced_here || enters);
  }
  return p;
}

}  // namespace baton::stages
