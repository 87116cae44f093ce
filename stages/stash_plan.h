// What a Stage keeps of one micro-batch, decided once from the graph: which values
// forward keeps for backward (respecting recompute), when each value can be released,
// which ops' backward read which values, and which values need gradients. Stage runs by
// it and the cost model (stages/cost.h) counts bytes by it, so the estimate and the
// measured peak agree.
#pragma once

#include <set>
#include <vector>

#include "stages/graph.h"

namespace baton::stages {

struct StashPlan {
  int first = 0, last = 0;                       // layers [first, last)
  std::vector<int> nodes;                        // the stage's nodes, in order
  std::vector<int> boundary_in, boundary_out;    // values crossing the first and last cut
  std::vector<int> model_in;                     // model inputs read
  std::vector<bool> kept;                        // by value: kept from F to B
  std::vector<bool> needs_grad;                  // by value: B computes its gradient
  std::vector<bool> recompute_node;              // by node
  std::vector<int> last_forward_use;             // by value: last reading node in the stage
  std::vector<std::vector<int>> backward_users;  // by value: nodes whose B reads it
  // By value: the last node of its producer's layer that reads it (-1: none), after which
  // a recomputed layer frees it unless a backward still reads it.
  std::vector<int> last_layer_use;
};

StashPlan plan_stash(const Graph& g, int first, int last, const std::set<int>& recompute_layers);

}  // namespace baton::stages
