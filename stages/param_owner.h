// The rule "a parameter belongs to its first layer", in one place: the first layer that
// uses a parameter owns it. Its gradient counts in that layer's piece of the gradient
// norm, and the stage holding that layer is the one that writes it to checkpoints
// (tied parameters such as GPT-2's wte are held by several stages, owned by one).
#pragma once

#include "stages/graph.h"
#include "stages/stage.h"

namespace baton::stages {

inline int owner_layer(const Param& p) {
  return p.layers.empty() ? 0 : p.layers.front();
}

// Whether parameter `id` of the stage's graph belongs to `stage` (it holds the owner layer).
inline bool owns_param(const Stage& stage, int id) {
  const int l = owner_layer(stage.graph().params[size_t(id)]);
  return l >= stage.first_layer() && l < stage.last_layer();
}

}  // namespace baton::stages
