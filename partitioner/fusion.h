// Kernel fusion as a graph rewrite (docs/kernels.md, "Fused kernels in the model graph"):
// a residual add whose sum a LayerNorm of the same layer reads becomes one add_layernorm
// node, and a linear with a bias whose only reader is a GELU of the same layer becomes a
// bias-free linear followed by one bias_gelu node (stages/ops/fused.cpp). Values,
// parameters (and their ids), layers and boundaries are unchanged; only nodes merge. A
// pair a tensor-parallel split changed (a row-split linear's bias after its all-reduce,
// a norm behind a tp_copy) no longer matches and stays unfused.
#pragma once

#include <memory>

#include "stages/graph.h"

namespace baton::partitioner {

struct FusionCount {
  int add_layernorm = 0;
  int bias_gelu = 0;
};

// The rewritten graph; `count` (optional) says how many pairs were fused.
std::shared_ptr<stages::Graph> fuse_kernels(const stages::Graph& g, FusionCount* count = nullptr);

}  // namespace baton::partitioner
