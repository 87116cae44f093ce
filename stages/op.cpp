#include "stages/op.h"

#include <mutex>

#include "stages/ops/registry.h"

namespace baton::stages {

Shape ValueType::with_batch(int64_t batch) const {
  if (!batched) return shape;
  Shape s{batch};
  s.insert(s.end(), shape.begin(), shape.end());
  return s;
}

int64_t ValueType::bytes(int64_t batch) const {
  return memory::shape_numel(with_batch(batch)) * int64_t(memory::dtype_size(dtype));
}

std::string type_str(const ValueType& t) {
  std::string s = std::string(memory::dtype_name(t.dtype)) + "[";
  bool first = true;
  if (t.batched) {
    s += "batch";
    first = false;
  }
  for (int64_t d : t.shape) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

GradSlot::Target GradSlot::target() {
  BATON_CHECK(entry_ != nullptr, "target() of a gradient nobody needs");
  if (!entry_->tensor.defined()) {
    entry_->tensor = Tensor::empty(shape_, dtype_, device_);
    entry_->owned = true;
    return {entry_->tensor, false};
  }
  if (!entry_->owned) {
    // A borrowed gradient aliases a tensor others may still read (another input's
    // gradient, a W stash): add into a copy, never into it.
    entry_->tensor = entry_->tensor.clone();
    entry_->owned = true;
  }
  return {entry_->tensor, true};
}

void GradSlot::give(const Tensor& g) {
  BATON_CHECK(entry_ != nullptr, "give() to a gradient nobody needs");
  BATON_CHECK(g.shape() == shape_, "gradient of shape " + memory::shape_str(g.shape()) +
                                       " for a value of shape " + memory::shape_str(shape_));
  if (!entry_->tensor.defined()) {
    entry_->tensor = g;
    entry_->owned = false;
    return;
  }
  Target t = target();
  kernels::add_inplace(t.tensor, g);
}

uint64_t step_seed(uint64_t seed, int64_t step) {
  // splitmix64 of the pair: nearby steps give unrelated seeds.
  uint64_t z = seed ^ (uint64_t(step) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const std::vector<OpType>& op_types() {
  static const std::vector<OpType> table = [] {
    std::vector<OpType> t;
    ops::add_embedding_ops(t);
    ops::add_norm_ops(t);
    ops::add_linear_ops(t);
    ops::add_attention_ops(t);
    ops::add_elementwise_ops(t);
    ops::add_loss_ops(t);
    ops::add_comm_ops(t);
    ops::add_bias_ops(t);
    ops::add_vision_ops(t);
    ops::add_spatial_ops(t);
    ops::add_llama_ops(t);
    ops::add_fused_ops(t);
    return t;
  }();
  return table;
}

const OpType* find_op_type(const std::string& type) {
  for (const OpType& t : op_types())
    if (t.schema.type == type) return &t;
  return nullptr;
}

}  // namespace baton::stages
