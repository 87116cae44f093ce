// The interface of an op type: what the graph loader asks of it (validate attributes,
// infer output shapes, name errors by JSON path), what a Stage asks of it (forward,
// backward_input = B, backward_weight = W, what to keep for backward), and what the
// partitioner's cost model asks of it (FLOPs of F, B and W, bytes saved per micro-batch).
//
// Shapes of activations are PER SAMPLE: every batched value has an implicit leading
// micro-batch dimension that is bound at run time. Parameter shapes are whole shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "memory/tensor.h"
#include "stages/json_reader.h"
#include "stages/micro_batch.h"

namespace baton::transport {
class Communicator;
}

namespace baton::stages {

using memory::DType;
using memory::Shape;
using memory::Tensor;

// The type of a value: per-sample shape and dtype; `batched` = false for values that exist
// once per micro-batch (the loss, a scalar).
struct ValueType {
  Shape shape;
  DType dtype = DType::f32;
  bool batched = true;
  // The run-time shape for a micro-batch of `batch` samples.
  Shape with_batch(int64_t batch) const;
  int64_t bytes(int64_t batch) const;
  bool operator==(const ValueType&) const = default;
};
std::string type_str(const ValueType& t);  // "f32[batch, 64, 128]"

struct ParamSlot {
  std::string name;
  bool optional = false;
};

// The fixed signature of an op type.
struct OpSchema {
  std::string type;
  std::vector<std::string> inputs;   // positional inputs, by role ("x", "qkv", ...)
  std::vector<std::string> outputs;  // positional outputs
  std::vector<ParamSlot> params;     // named parameter slots
  std::vector<std::string> attrs;    // allowed attribute names
  std::string summary;               // one line for docs and errors
};

// What the loader hands an op type to validate and build a node.
struct OpSpec {
  std::string node_name;
  JsonReader node;   // the node's JSON (for errors about its inputs and params)
  JsonReader attrs;  // the node's "attrs" object ({} when absent)
  std::vector<ValueType> inputs;
  std::vector<std::optional<Shape>> params;  // by slot; nullopt for an absent optional slot
  DType float_dtype = DType::f32;            // the dtype of the model's floating values
};

// FLOPs of one micro-batch and the bytes an op itself adds to the activation stash
// (tensors it creates only for backward, like layernorm's mean and rstd); values it keeps
// (saves_input/saves_output) are counted once per value by the graph.
struct OpCost {
  double forward_flops = 0;
  double backward_input_flops = 0;
  double backward_weight_flops = 0;
  int64_t extra_saved_bytes = 0;
  // Payload of the communication a communication op does per rank (all-reduce, gather).
  int64_t forward_comm_bytes = 0;
  int64_t backward_comm_bytes = 0;
};

// Run-time context shared by every op of a stage for one micro-batch.
struct OpContext {
  MicroBatch mb;
  bool training = true;    // false: no dropout, no loss gradient
  bool recompute = false;  // a layer's forward run again before its B: update no buffers
  uint64_t seed = 0;       // the run's seed; dropout streams mix in the step and node name
  memory::Device device = memory::Device::cpu();
  transport::Communicator* tp = nullptr;  // the tensor-parallel group (communication ops)
  // The spatial group (halo exchanges, batch-norm statistics over the tiles of an image).
  transport::Communicator* spatial = nullptr;
  // Whom batchnorm2d with "spatial": true reduces its statistics over (null: `spatial`):
  // the spatial group and, with sync_batchnorm, the data-parallel replicas.
  transport::Communicator* batchnorm = nullptr;
  int64_t batch() const { return mb.samples; }
};

// The gradient of one op input during B. Several consumers of a value add into one
// buffer; the first may hand its tensor over without a copy (give), later ones accumulate.
class GradSlot {
 public:
  struct Entry {
    Tensor tensor;
    bool owned = false;  // false: borrowed (aliases another tensor), copy before adding
  };
  GradSlot() = default;  // not needed
  GradSlot(Entry* entry, Shape shape, DType dtype, memory::Device device)
      : entry_(entry), shape_(std::move(shape)), dtype_(dtype), device_(device) {}

  bool needed() const { return entry_ != nullptr; }
  // The buffer to write this contribution into, and whether the kernel must add to it.
  struct Target {
    Tensor tensor;
    bool accumulate;
  };
  Target target();
  // Hands over a finished gradient: kept as is (no copy) when it is the first one.
  void give(const Tensor& g);
  const Shape& shape() const { return shape_; }

 private:
  Entry* entry_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  memory::Device device_;
};

// The gradient buffer of one parameter during W.
struct ParamGrad {
  Tensor tensor;    // undefined: not needed (absent optional slot)
  bool accumulate;  // false: the first contribution since zero_grad, overwrite
};

struct ForwardCall {
  const OpContext& ctx;
  std::span<const Tensor> inputs;
  std::span<const Tensor> params;  // undefined for absent optional slots
  std::span<Tensor> outputs;       // the op sets them
  std::vector<Tensor>& saved;      // extra tensors the op keeps for backward
  uint32_t overwritable = 0;       // bit i: input i has no other reader, the op may reuse it
  Tensor alloc(const Shape& shape, DType dtype) const {
    return Tensor::empty(shape, dtype, ctx.device);
  }
  bool may_overwrite(size_t i) const { return (overwritable >> i) & 1u; }
};

struct BackwardCall {
  const OpContext& ctx;
  std::span<const Tensor> inputs;   // those the op saves; others undefined
  std::span<const Tensor> outputs;  // those the op saves; others undefined
  std::span<const Tensor> params;
  std::span<const Tensor> saved;
  std::span<const Tensor> grad_outputs;  // undefined: no gradient reached that output
  std::span<GradSlot> grad_inputs;
  Tensor alloc(const Shape& shape, DType dtype) const {
    return Tensor::empty(shape, dtype, ctx.device);
  }
};

struct WeightCall {
  const OpContext& ctx;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  std::span<const Tensor> params;
  std::span<const Tensor> saved;
  std::span<const Tensor> grad_outputs;
  std::span<ParamGrad> grad_params;
};

class Op {
 public:
  virtual ~Op() = default;
  virtual const OpSchema& schema() const = 0;
  virtual const std::vector<ValueType>& output_types() const = 0;

  // What the op keeps from forward to backward (B and W).
  virtual bool saves_input(size_t) const { return false; }
  virtual bool saves_output(size_t) const { return false; }
  // What W still needs after B: which inputs (of those saved) and whether the output
  // gradients must be kept. Ops without parameters need nothing.
  virtual bool weight_needs_input(size_t) const { return false; }
  virtual bool weight_needs_grad_outputs() const { return false; }
  virtual bool weight_needs_saved() const { return false; }
  bool has_weights() const { return !schema().params.empty(); }
  // The input whose memory output j shares while training (a view: reshape, dropout with
  // p = 0, tp_copy), or -1 when the op allocates it. The cost model counts it once.
  virtual int output_alias(size_t) const { return -1; }

  virtual void forward(ForwardCall& call) const = 0;
  virtual void backward_input(BackwardCall& call) const = 0;
  virtual void backward_weight(WeightCall&) const {}

  // FLOPs of one micro-batch of `batch` samples (exact for baton's CPU kernels).
  virtual OpCost cost(int64_t batch) const = 0;
};

using OpFactory = std::function<std::unique_ptr<Op>(const OpSpec&)>;

struct OpType {
  OpSchema schema;
  OpFactory make;
};

// Every op type baton knows, by name.
const std::vector<OpType>& op_types();
const OpType* find_op_type(const std::string& type);

// Random streams of an op: a per-step seed mixed from the run seed and the step, and a
// stream id from the node's name, so masks do not depend on the micro-batch split.
uint64_t step_seed(uint64_t seed, int64_t step);

}  // namespace baton::stages
