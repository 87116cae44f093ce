// The graph IR: values (named activations with per-sample shapes), parameters (named,
// with an init rule, possibly a shard of a larger logical parameter), nodes (an op with
// inputs, outputs, parameters and attributes) and LAYERS, the units a pipeline cut falls
// between. The same types hold the LOGICAL graph a model JSON describes and the
// PHYSICAL graph of one rank the partitioner makes from it (shards, local attributes,
// communication nodes).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/ops.h"
#include "stages/op.h"

namespace baton::stages {

struct Value {
  std::string name;
  ValueType type;
  int producer = -1;           // node index; -1: a model input
  std::vector<int> consumers;  // node indices, in graph order
  bool is_input() const { return producer < 0; }
};

// How a parameter starts. Values come from (seed, parameter name, element index in the
// LOGICAL parameter) alone, so every shard of any partition starts from identical values.
struct InitRule {
  enum class Kind { normal, zeros, ones, constant };
  Kind kind = Kind::zeros;
  double mean = 0, std = 0, value = 0;
  nlohmann::json to_json() const;
};

// A rectangular part of a local parameter tensor that is a block of the logical one. An
// unsplit parameter has no pieces; a column split has one piece; the qkv weight of a
// head-split attention has three (its query, key and value columns).
struct ParamPiece {
  Shape local_offsets;   // where the piece sits in the local tensor
  Shape shape;           // the piece's shape
  Shape global_offsets;  // where it sits in the logical parameter
};

struct Param {
  std::string name;     // logical name (Hugging Face's for GPT-2)
  Shape shape;          // local shape
  Shape logical_shape;  // the whole parameter (= shape when unsplit)
  DType dtype = DType::f32;
  InitRule init;
  bool weight_decay = true;  // AdamW/SGD decay applies (matrices, not biases/norms)
  // false: a buffer an op updates itself (batch norm's running statistics): no gradient,
  // no optimizer step, saved in checkpoints like any parameter.
  bool trainable = true;
  std::vector<ParamPiece> pieces;  // empty: the whole logical parameter
  std::vector<int> layers;         // layers whose nodes use it, ascending
  std::vector<int> users;          // nodes that use it
  bool is_shard() const { return !pieces.empty(); }
};

struct Node {
  std::string name;
  std::string op;        // op type
  nlohmann::json attrs;  // as given
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<int> params;  // by the op's slots; -1 for an absent optional slot
  int layer = -1;
  std::string json_path;  // where it came from, for messages
  std::shared_ptr<const Op> impl;
};

struct Layer {
  std::string name;
  std::vector<int> nodes;  // in execution order
};

class Graph {
 public:
  Graph() = default;
  std::string name;
  std::string source;  // the file it was loaded from (messages)
  DType float_dtype = DType::f32;
  nlohmann::json config;  // the model JSON as given (checkpoints record it)

  std::vector<Value> values;
  std::vector<Param> params;
  std::vector<Node> nodes;  // in execution order: layer by layer
  std::vector<Layer> layers;
  std::vector<int> inputs;  // model inputs (value ids)
  int loss = -1;            // the loss value (a scalar, unbatched)

  int find_value(const std::string& name) const;  // -1 when absent
  int find_param(const std::string& name) const;
  int find_layer(const std::string& name) const;
  const Value& value(const std::string& name) const;  // throws when absent

  int num_layers() const { return int(layers.size()); }
  // Values produced before layer `cut` (in layers < cut) and consumed at or after it: what
  // a pipeline cut there must send. Model inputs are not included (the data loader gives
  // them to every stage that needs them).
  std::vector<int> cut_values(int cut) const;
  // Model inputs used by nodes of layers [first, last).
  std::vector<int> inputs_used(int first, int last) const;
  // Parameters used by nodes of layers [first, last), ascending.
  std::vector<int> params_used(int first, int last) const;
  // Total elements of the trainable logical parameters (each counted once).
  int64_t num_parameters() const;

  // Building (the JSON loader and the partitioner use these; names must be new).
  int add_value(const std::string& name, const ValueType& type, int producer);
  int add_param(Param p);
  int add_layer(const std::string& name);
  // Appends a node whose op is built and whose outputs were added; records consumers,
  // parameter users and layers.
  int add_node(Node n);

 private:
  std::unordered_map<std::string, int> value_index_, param_index_, layer_index_;
};

}  // namespace baton::stages
