// Tensor parallelism in the Megatron-LM style: which ops are split and how, and the
// PHYSICAL graph of one tensor-parallel rank with parameter shards, local attributes and
// the communication nodes each split implies.
//
//   linear, column   output features split; its replicated input goes through tp_copy
//                    (Megatron's f: identity forward, all-reduce of the gradient backward)
//   linear, row      input features split (the input is the split output of a column
//                    split); partial outputs summed by tp_reduce (g), then the bias added
//                    once by bias_add
//   attention, heads the qkv linear is split by heads (three column blocks: its queries,
//                    keys and values of the local heads); attention runs its local heads.
//                    The LLaMA family's separate q, k, v linears are split by columns
//                    (whole heads), rotary packs the local heads; key/value heads are
//                    split when the degree divides their number and otherwise replicated
//                    (their linears unsplit, their gradients summed over the group by a
//                    tp_copy before rotary), attention then reads kv_group query heads
//                    per key/value head from the local or replicated ones
//   embedding, vocab rows split over the vocabulary; partial lookups summed by tp_reduce
//   cross_entropy, vocab   after a column-split LM head: vocab_parallel_cross_entropy
//   conv2d, column   output channels split (weight dimension 0, bias); the replicated input
//                    through tp_copy; the output split along the channels (dimension 0 of
//                    [C, H, W]); batchnorm2d (its four per-channel vectors split the same
//                    way), relu, pooling and global_avgpool pass a channel split on
//   conv2d, row      input channels split (weight dimension 1, groups = 1); partial outputs
//                    summed by tp_reduce, then the bias added once by bias_add (dim 0)
//   conv2d, grouped  groups > 1 with a channel-split input: whole groups per rank (groups / t
//                    locally), the output split like the input (kind column, no tp_copy)
// Everything else runs replicated. A split value that an op needs whole is all-gathered
// (tp_gather) when it is one contiguous block. A degree must divide what it splits.
//
// The default policy splits every op that can be split usefully: a linear with a
// replicated input is split by columns when every path from its output reaches an op
// that consumes a split input (a linear, split by rows; attention; the cross-entropy),
// by heads when it feeds attention; a linear with a split input by rows; embeddings by
// vocabulary. A plan may override any node (plan "splits").
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "partitioner/plan.h"
#include "stages/graph.h"

namespace baton::partitioner {

// A split of one logical dimension of size n over t ranks: the dimension is read as
// blocks (offset, length); each block is cut into t equal parts and rank r holds part r
// of every block, in block order. Contiguous split: one block (0, n). Head split of
// GPT-2's qkv [T, 3C]: blocks (0, C), (C, C), (2C, C).
// `kept`: blocks every rank holds whole after its parts of `blocks` (the key and value
// heads of a grouped-query attention whose key/value heads are too few to split: they
// are replicated beside the split query heads).
// `padded`: one block (a vocabulary) that t does not divide, cut into parts of
// ceil(n / t); the last ranks' parts end in padding (zero rows of the table, columns of
// logits the vocabulary-parallel loss masks), which no piece of a parameter covers.
struct SplitPattern {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  std::vector<std::pair<int64_t, int64_t>> kept;
  bool padded = false;
  int64_t local_size(int t) const;
  // Of the part of rank r of block `len`: where it starts in the block, and how many of
  // its local_size elements are real (not padding).
  int64_t part_offset(int64_t len, int t, int r) const { return int64_t(r) * part(len, t); }
  int64_t part_real(int64_t len, int t, int r) const {
    return std::clamp<int64_t>(len - part_offset(len, t, r), 0, part(len, t));
  }
  int64_t part(int64_t len, int t) const { return padded ? (len + t - 1) / t : len / t; }
  bool whole(int64_t n) const {
    return blocks.size() == 1 && blocks[0].first == 0 && blocks[0].second == n && kept.empty();
  }
  bool operator==(const SplitPattern&) const = default;
};

struct ValueShard {
  bool split = false;    // false: replicated on every rank of the group
  int t = 1;             // the group's degree (split values)
  SplitPattern pattern;  // of the split dimension
  // The split dimension of the per-sample shape; -1: the last one (linears, heads,
  // vocabulary). Channel splits of an image [C, H, W] are dimension 0.
  int dim = -1;
  size_t dim_index(const std::vector<int64_t>& shape) const {
    return dim < 0 ? shape.size() - 1 : size_t(dim);
  }
  bool operator==(const ValueShard&) const = default;
};

struct ParamShard {
  int dim = -1;  // split dimension; -1: replicated
  int t = 1;
  SplitPattern pattern;
  int first_user = -1;  // the node that fixed the shard (messages)
};

struct NodeShard {
  SplitKind kind = SplitKind::none;
  int t = 1;                       // degree of the node's layer
  std::vector<int> copy_inputs;    // input slots fed through tp_copy
  std::vector<int> gather_inputs;  // input slots all-gathered first
  bool reduce_output = false;      // partial output: tp_reduce after it
  bool bias_after_reduce = false;  // the bias slot moves to a bias_add after the reduce
  bool kv_replicated = false;      // rotary / attention: key/value heads held whole
};

struct Sharding {
  std::vector<int> layer_tp;       // degree per layer
  std::vector<NodeShard> nodes;    // per logical node
  std::vector<ValueShard> values;  // per logical value, as its producer leaves it
  std::vector<ParamShard> params;  // per logical parameter
  // Per cut position c (0..layers): every value crossing the cut is replicated.
  std::vector<bool> replicated_cut;
};

// Where split overrides come from, for messages: node name -> kind, node name -> path.
struct SplitOverrides {
  std::map<std::string, SplitKind> kinds;
  std::map<std::string, std::string> where;  // "plan.json: $.splits.h.0.mlp.c_fc"
};

// Decides the split of every node for the degrees `layer_tp` (one per layer). Throws
// InputError naming `where` (e.g. "plan.json: $.parallel.tp") when a degree does not divide
// what it must split, and naming the override's path when an override is impossible.
Sharding plan_sharding(const stages::Graph& g, const std::vector<int>& layer_tp,
                       const SplitOverrides& overrides, const std::string& where);

// The physical graph of a tensor-parallel rank: every layer of the model, layer l built
// for rank tp_index[l] of its group (layers of other pipeline ranks are built too so that
// tied parameters and cut values have their local types; a Stage runs only its own).
// Parameters keep their logical names, with local shapes and ParamPieces.
std::shared_ptr<stages::Graph> build_physical(const stages::Graph& logical, const Sharding& s,
                                              const std::vector<int>& tp_index);

// One layer alone, for the cost model: values entering it become inputs (in
// `boundary_in`, floating ones only), values it hands on are listed in `boundary_out`.
struct LayerGraph {
  std::shared_ptr<stages::Graph> graph;
  std::vector<int> boundary_in, boundary_out;  // value ids in `graph`
};
LayerGraph build_layer(const stages::Graph& logical, const Sharding& s, int layer, int tp_index);

// A parameter's shard on rank r: its local shape and pieces (none when replicated).
stages::Param shard_param(const stages::Param& logical, const ParamShard& shard, int r);

}  // namespace baton::partitioner
