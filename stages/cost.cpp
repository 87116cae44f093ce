#include "stages/cost.h"

#include <algorithm>

#include "memory/allocator.h"
#include "stages/stash_plan.h"

namespace baton::stages {

namespace {

int64_t rounded(int64_t bytes) {
  return int64_t(memory::Allocator::rounded(size_t(bytes)));
}

// The value whose memory v shares (following views), so shared memory counts once.
int root_of(const Graph& g, int v) {
  while (true) {
    const Value& val = g.values[size_t(v)];
    if (val.is_input()) return v;
    const Node& n = g.nodes[size_t(val.producer)];
    size_t j = size_t(std::find(n.outputs.begin(), n.outputs.end(), v) - n.outputs.begin());
    int a = n.impl->output_alias(j);
    if (a < 0) return v;
    v = n.inputs[size_t(a)];
  }
}

}  // namespace

StageCost estimate_stage(const Graph& g, int first, int last, int64_t batch,
                         const std::set<int>& recompute_layers, int optimizer_states) {
  StageCost c;
  StashPlan plan = plan_stash(g, first, last, recompute_layers);
  for (int id : g.params_used(first, last)) {
    const Param& p = g.params[size_t(id)];
    int64_t b = rounded(memory::shape_numel(p.shape) * int64_t(memory::dtype_size(p.dtype)));
    int uses = 0;
    for (int l : p.layers) uses += (l >= first && l < last) ? 1 : 0;
    c.param_bytes += b;
    c.grad_bytes += b * (uses + (uses > 1 ? 1 : 0));
    if (p.trainable) c.optimizer_bytes += b * optimizer_states;  // a buffer has no state
  }
  std::vector<bool> enters(g.values.size(), false);
  for (int v : plan.boundary_in) enters[size_t(v)] = true;
  for (int v : plan.model_in) enters[size_t(v)] = true;
  std::set<int> stash_roots, weight_roots;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (plan.kept[v]) stash_roots.insert(root_of(g, int(v)));
  for (int r : stash_roots) {
    int64_t b = rounded(g.values[size_t(r)].type.bytes(batch));
    (enters[size_t(r)] ? c.kept_input_bytes : c.stash_bytes) += b;
  }
  for (int n : plan.nodes) {
    const Node& node = g.nodes[size_t(n)];
    const Op& op = *node.impl;
    OpCost k = op.cost(batch);
    c.forward_flops += k.forward_flops;
    c.backward_input_flops += k.backward_input_flops;
    c.backward_weight_flops += k.backward_weight_flops;
    c.forward_comm_bytes += k.forward_comm_bytes;
    c.backward_comm_bytes += k.backward_comm_bytes;
    if (!plan.recompute_node[size_t(n)]) c.stash_bytes += k.extra_saved_bytes;
    if (!op.has_weights()) continue;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (op.weight_needs_input(i)) weight_roots.insert(root_of(g, node.inputs[i]));
    if (op.weight_needs_grad_outputs())
      for (int v : node.outputs)
        c.weight_stash_bytes += rounded(g.values[size_t(v)].type.bytes(batch));
    if (op.weight_needs_saved()) c.weight_stash_bytes += k.extra_saved_bytes;
  }
  for (int r : weight_roots) c.weight_stash_bytes += rounded(g.values[size_t(r)].type.bytes(batch));
  for (int v : plan.boundary_in) c.boundary_in_bytes += g.values[size_t(v)].type.bytes(batch);
  for (int v : plan.boundary_out) c.boundary_out_bytes += g.values[size_t(v)].type.bytes(batch);
  return c;
}

}  // namespace baton::stages
