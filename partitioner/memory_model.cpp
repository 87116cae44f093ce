#include "partitioner/memory_model.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "memory/allocator.h"
#include "memory/error.h"
#include "stages/stash_plan.h"
#include "transport/collective_memory.h"

namespace baton::partitioner {

using stages::Graph;
using stages::Node;

namespace {

int64_t rounded(int64_t bytes) {
  return int64_t(memory::Allocator::rounded(size_t(bytes == 0 ? 1 : bytes)));
}

double attr_p(const Node& n) {
  auto it = n.attrs.find("p");
  return it == n.attrs.end() ? 0.0 : it->get<double>();
}

// Storages with reference counts: a tensor is the id of its storage; every holder (the
// stash, an op's input list, a gradient slot, the caller) holds one reference, as
// shared_ptr<Storage> does in memory::Tensor.
class Heap {
 public:
  int alloc(int64_t bytes) {
    int64_t b = rounded(bytes);
    bufs_.push_back({b, 1});
    live_ += b;
    peak_ = std::max(peak_, live_);
    return int(bufs_.size()) - 1;
  }
  int ref(int id) {
    if (id >= 0) ++bufs_[size_t(id)].refs;
    return id;
  }
  void unref(int& id) {
    if (id < 0) return;
    Buf& b = bufs_[size_t(id)];
    BATON_CHECK(b.refs > 0, "memory model: released a storage twice");
    if (--b.refs == 0) live_ -= b.bytes;
    id = -1;
  }
  int refs(int id) const { return id < 0 ? 0 : bufs_[size_t(id)].refs; }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_; }

 private:
  struct Buf {
    int64_t bytes;
    int refs;
  };
  std::vector<Buf> bufs_;
  int64_t live_ = 0, peak_ = 0;
};

// Holds references and releases them when it goes out of scope (an op's argument lists).
class Holder {
 public:
  explicit Holder(Heap& h) : h_(h) {}
  ~Holder() {
    for (int& id : ids_) h_.unref(id);
  }
  int add(int id) {
    ids_.push_back(h_.ref(id));
    return id;
  }
  int take(int id) {  // takes over a reference already counted
    ids_.push_back(id);
    return id;
  }

 private:
  Heap& h_;
  std::vector<int> ids_;
};

class Walker {
 public:
  explicit Walker(const WalkSpec& w) : w_(w), g_(*w.graph) { setup(); }

  MicroBatchMemory run() {
    MicroBatchMemory m;
    forward();
    m.forward_peak = heap_.peak();
    m.stash = heap_.live();
    heap_.reset_peak();
    {
      // B and W as one action (Stage::backward), walked on a copy from the same point.
      Walker fused = *this;
      fused.backward(true);
      m.fused_peak = fused.heap_.peak();
    }
    backward(false);
    m.backward_peak = heap_.peak();
    m.held_through_backward = held_through_backward_;
    m.w_stash = heap_.live();
    heap_.reset_peak();
    weight();
    m.weight_peak = heap_.peak();
    return m;
  }

 private:
  int64_t bytes(int v) const { return g_.values[size_t(v)].type.bytes(w_.batch); }
  int64_t rows(int v) const {  // rows of a value viewed as [rows, last]
    const auto& t = g_.values[size_t(v)].type;
    int64_t n = w_.batch;
    for (size_t i = 0; i + 1 < t.shape.size(); ++i) n *= t.shape[i];
    return n;
  }
  int64_t dsize() const { return int64_t(memory::dtype_size(g_.float_dtype)); }
  bool is_out(int v) const { return out_set_.count(v) > 0; }
  int64_t numel(int v) const {
    return bytes(v) / int64_t(memory::dtype_size(g_.values[size_t(v)].type.dtype));
  }
  // A convolution or pooling with the spatial split's halo ("halo": [top, bottom]): the
  // rows it exchanges and the output row ranges that read a halo (stages/ops/vision.cpp,
  // TileHaloRows), each with the extended input rows it reads, in bytes per row of the
  // micro-batch (out_idx: a row of max pooling's i32 argmax).
  struct TileHalo {
    int64_t top = 0, bottom = 0, in_row = 0, out_row = 0, out_idx = 0;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // (output rows, input rows)
  };
  static bool has_halo(const Node& node) {
    return (node.op == "conv2d" || node.op == "maxpool2d" || node.op == "avgpool2d") &&
           node.attrs.contains("halo");
  }
  TileHalo tile_halo(const Node& node) const {
    TileHalo c;
    const nlohmann::json& a = node.attrs.at("halo");
    c.top = a.at(0).get<int64_t>();
    c.bottom = a.at(1).get<int64_t>();
    const auto& in = g_.values[size_t(node.inputs[0])].type.shape;
    const auto& out = g_.values[size_t(node.outputs[0])].type.shape;
    c.in_row = w_.batch * in[0] * in[2] * dsize();
    c.out_row = w_.batch * out[0] * out[2] * dsize();
    c.out_idx = node.op == "maxpool2d" ? w_.batch * out[0] * out[2] * 4 : 0;
    auto h_of = [&](const char* key, int64_t dflt) {
      auto it = node.attrs.find(key);
      if (it == node.attrs.end()) return dflt;
      return it->is_array() ? it->at(0).get<int64_t>() : it->get<int64_t>();
    };
    const int64_t stride = h_of("stride", node.op == "conv2d" ? 1 : h_of("kernel", 1)),
                  dil = h_of("dilation", 1);
    const int64_t kernel =
        node.op == "conv2d" ? g_.params[size_t(node.params[0])].shape[2] : h_of("kernel", 1);
    const int64_t extent = dil * (kernel - 1);
    const int64_t h = in[1], oh = out[1];
    const int64_t top_end = std::min(oh, (c.top + stride - 1) / stride);
    const int64_t last = c.top + h - 1 - extent;
    const int64_t bottom_begin = c.bottom == 0 ? oh
                                 : last < 0    ? 0
                                               : std::min(oh, last / stride + 1);
    auto add = [&](int64_t a0, int64_t a1) {
      if (a0 < a1) c.ranges.push_back({a1 - a0, (a1 - 1 - a0) * stride + extent + 1});
    };
    if (bottom_begin <= top_end) {
      add(0, oh);
    } else {
      add(0, top_end);
      add(bottom_begin, oh);
    }
    return c;
  }

  // A collective of the tensor-parallel group: its scratch, live while it runs.
  void collective(transport::Collective c, int64_t count) {
    int64_t b =
        int64_t(transport::collective_scratch_bytes(c, size_t(count), size_t(dsize()), w_.tp));
    if (b == 0) return;
    int id = heap_.alloc(b);
    heap_.unref(id);
  }

  // ---- what Stage's constructor works out: the same StashPlan it runs by ----
  void setup() {
    stages::StashPlan plan = stages::plan_stash(g_, w_.first, w_.last, w_.recompute);
    nodes_ = std::move(plan.nodes);
    kept_ = std::move(plan.kept);
    recompute_node_ = std::move(plan.recompute_node);
    last_use_ = std::move(plan.last_forward_use);
    last_layer_use_ = std::move(plan.last_layer_use);
    users_ = std::move(plan.backward_users);
    // Gradients: a walk may name its own boundary (a one-layer graph whose entering
    // values are model inputs), so they follow the walk's boundary, as the Stage's do
    // the cut's.
    std::vector<bool> in_stage(g_.nodes.size(), false);
    for (int n : nodes_) in_stage[size_t(n)] = true;
    std::set<int> in_set(w_.boundary_in.begin(), w_.boundary_in.end());
    needs_grad_.assign(g_.values.size(), false);
    for (size_t v = 0; v < g_.values.size(); ++v) {
      const stages::Value& val = g_.values[v];
      bool floating = memory::is_floating(val.type.dtype) && val.type.batched;
      bool here = !val.is_input() && in_stage[size_t(val.producer)];
      needs_grad_[v] = floating && (here || in_set.count(int(v)) > 0);
    }
    for (int v : w_.boundary_out) out_set_.insert(v);
    values_.assign(g_.values.size(), -1);
    saved_.assign(g_.nodes.size(), {});
  }

  // ---- forward of one op: its outputs and saved tensors, as the op allocates them ----
  void op_forward(int n, const std::vector<int>& ins, uint32_t overwritable, std::vector<int>& outs,
                  std::vector<int>& saved) {
    const Node& node = g_.nodes[size_t(n)];
    const std::string& op = node.op;
    int out = node.outputs.empty() ? -1 : node.outputs[0];
    auto may = [&](size_t i) { return ((overwritable >> i) & 1u) != 0; };
    auto fresh = [&] { outs.push_back(heap_.alloc(bytes(out))); };
    auto alias = [&](size_t i) { outs.push_back(heap_.ref(ins[i])); };
    if (op == "layernorm") {
      fresh();
      saved.push_back(heap_.alloc(rows(node.inputs[0]) * dsize()));
      saved.push_back(heap_.alloc(rows(node.inputs[0]) * dsize()));
    } else if (op == "attention") {
      fresh();
      // lse [batch, local heads, T]
      int64_t heads = node.attrs.at("n_head").get<int64_t>();
      int64_t t = g_.values[size_t(node.inputs[0])].type.shape[0];
      saved.push_back(heap_.alloc(w_.batch * heads * t * dsize()));
    } else if (op == "dropout") {
      if (attr_p(node) > 0)
        fresh();
      else
        alias(0);
    } else if (op == "reshape" || op == "tp_copy") {
      alias(0);
    } else if (op == "tp_reduce" || op == "bias_add") {
      if (may(0))
        alias(0);
      else
        fresh();
      if (op == "tp_reduce") collective(transport::Collective::all_reduce, numel(out));
    } else if (op == "tp_gather") {
      int parts = heap_.alloc(bytes(out));
      collective(transport::Collective::all_gather, numel(out));
      fresh();
      heap_.unref(parts);
    } else if (op == "cross_entropy" || op == "vocab_parallel_cross_entropy") {
      int logits = node.inputs[0];
      int64_t n_rows = rows(logits);
      std::vector<int> tmp;
      if (op == "cross_entropy") {
        for (int k = 0; k < 4; ++k) tmp.push_back(heap_.alloc(n_rows * dsize()));
      } else {
        tmp.push_back(heap_.alloc(n_rows * dsize()));               // row_max
        tmp.push_back(heap_.alloc(n_rows * dsize()));               // losses
        tmp.push_back(heap_.alloc(2 * n_rows * dsize()));           // sum_exp, target_logit
        tmp.push_back(heap_.alloc(2 * n_rows * dsize()));           // local max and sum (CPU path)
        collective(transport::Collective::all_reduce, n_rows);      // row_max
        collective(transport::Collective::all_reduce, 2 * n_rows);  // sum_exp, target_logit
      }
      saved.push_back(may(0) ? heap_.ref(ins[0]) : heap_.alloc(bytes(logits)));  // dlogits
      // sum_losses: the scalar (kernels::loss_sum reads the losses where they are).
      outs.push_back(heap_.alloc(8));
      for (int& t : tmp) heap_.unref(t);
    } else if (has_halo(node)) {
      // The spatial split's convolution or pooling (stages/ops/vision.cpp, forward_halo):
      // the rows it sends (a tile with neighbours on both sides) live until the halo is
      // there, the received halo rows (a convolution saves them for W), the output; then
      // each border range's strip of rows and its output rows, one range at a time (max
      // pooling: the strip's argmax saved, its re-based copy freed).
      const TileHalo h = tile_halo(node);
      const bool conv = op == "conv2d";
      std::vector<int> tmp;
      // Sent up (its first `bottom` rows) where a tile is above, down (its last `top`
      // rows) where one is below (stages/ops/spatial.cpp, HaloTransfer::forward).
      for (int64_t r : {w_.tile_above ? h.bottom : 0, w_.tile_below ? h.top : 0})
        if (r > 0) tmp.push_back(heap_.alloc(r * h.in_row));
      std::vector<int> received;
      for (int64_t r : {h.top, h.bottom})
        if (r > 0) (conv ? saved : received).push_back(heap_.alloc(r * h.in_row));
      outs.push_back(heap_.alloc(bytes(out)));
      if (h.out_idx > 0) saved.push_back(heap_.alloc(numel(out) * 4));  // the tile's argmax
      for (int& id : tmp) heap_.unref(id);
      for (const auto& [rows, ext] : h.ranges) {
        int strip = heap_.alloc(ext * h.in_row), part = heap_.alloc(rows * h.out_row);
        if (h.out_idx > 0) {
          saved.push_back(heap_.alloc(rows * h.out_idx));
          int idx = heap_.alloc(rows * h.out_idx);
          heap_.unref(idx);
        }
        heap_.unref(strip);
        heap_.unref(part);
      }
      for (int& id : received) heap_.unref(id);
    } else if (op == "bias_gelu") {
      // y, and h in x's memory when nothing else reads x; the bias gradient B leaves for
      // W (stages/ops/fused.cpp).
      fresh();
      outs.push_back(may(0) ? heap_.ref(ins[0]) : heap_.alloc(bytes(node.outputs[1])));
      saved.push_back(
          heap_.alloc(memory::shape_numel(g_.params[size_t(node.params[0])].shape) * dsize()));
    } else {
      // embedding, position_embedding, linear, matmul, gelu, relu, add, softmax, conv2d,
      // pooling, batchnorm2d: a new output each; the ops below also keep statistics or
      // buffers for their backward (left out, a ResNet's estimate was under its measured
      // peak by the argmax and the statistics, 17 KiB a 64 x 64 image).
      for (size_t j = 0; j < node.outputs.size(); ++j)
        outs.push_back(heap_.alloc(bytes(node.outputs[j])));
      if (op == "add_layernorm") {  // the sum s, and the rows' mean and rstd (stages/ops/fused.cpp)
        saved.push_back(heap_.ref(outs[0]));
        saved.push_back(heap_.alloc(rows(node.inputs[0]) * dsize()));
        saved.push_back(heap_.alloc(rows(node.inputs[0]) * dsize()));
      } else if (op == "rmsnorm") {  // the rows' rstd (stages/ops/llama.cpp)
        saved.push_back(heap_.alloc(rows(node.inputs[0]) * dsize()));
      } else if (op == "maxpool2d") {  // the argmax, i32 (stages/ops/vision.cpp)
        saved.push_back(heap_.alloc(numel(out) * 4));
      } else if (op == "batchnorm2d") {  // the channels' mean and rstd, kept for W
        const int64_t channels = g_.values[size_t(out)].type.shape[0];
        for (int k = 0; k < 2; ++k) saved.push_back(heap_.alloc(channels * dsize()));
      }
    }
  }

  void run_node_forward(int n) {
    const Node& node = g_.nodes[size_t(n)];
    Holder ins_h(heap_);
    std::vector<int> ins;
    for (int v : node.inputs) ins.push_back(ins_h.add(values_[size_t(v)]));
    for (int v : node.inputs)
      if (last_use_[size_t(v)] == n && !kept_[size_t(v)] && !is_out(v))
        heap_.unref(values_[size_t(v)]);
    uint32_t overwritable = 0;
    for (size_t i = 0; i < ins.size() && i < 32; ++i)
      if (ins[i] >= 0 && heap_.refs(ins[i]) == 1) overwritable |= 1u << i;
    std::vector<int> outs, saved;
    op_forward(n, ins, overwritable, outs, saved);
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      int v = node.outputs[j];
      heap_.unref(values_[size_t(v)]);
      values_[size_t(v)] = outs[j];
      if (last_use_[size_t(v)] < 0 && !is_out(v) && !kept_[size_t(v)])
        heap_.unref(values_[size_t(v)]);
    }
    if (!recompute_node_[size_t(n)]) {
      saved_[size_t(n)] = saved;
    } else {
      for (int& s : saved) heap_.unref(s);
    }
  }

  void forward() {
    // The caller's tensors: what enters the stage and the token ids.
    for (int v : w_.boundary_in) caller_.push_back(values_[size_t(v)] = heap_.alloc(bytes(v)));
    for (int v : w_.model_in) caller_.push_back(values_[size_t(v)] = heap_.alloc(bytes(v)));
    for (int id : caller_) heap_.ref(id);
    for (int n : nodes_) run_node_forward(n);
    std::vector<int> outputs;
    for (int v : w_.boundary_out) {
      outputs.push_back(heap_.ref(values_[size_t(v)]));
      if (!kept_[size_t(v)]) heap_.unref(values_[size_t(v)]);
    }
    for (size_t v = 0; v < values_.size(); ++v)
      if (!kept_[v]) heap_.unref(values_[v]);
    // The caller sends the outputs and drops its inputs after F.
    for (int& id : outputs) heap_.unref(id);
    for (int& id : caller_) heap_.unref(id);
    caller_.clear();
  }

  // ---- B ----
  struct Entry {
    int id = -1;
    bool owned = false;
  };
  // GradSlot::target(): a new buffer, or a private copy of a borrowed one.
  void target(int v) {
    Entry& e = grads_[size_t(v)];
    if (e.id < 0) {
      e.id = heap_.alloc(bytes(v));
      e.owned = true;
    } else if (!e.owned) {
      int copy = heap_.alloc(bytes(v));
      heap_.unref(e.id);
      e.id = copy;
      e.owned = true;
    }
  }
  // GradSlot::give(t): borrow t when first, else add into a target.
  void give(int v, int id) {
    Entry& e = grads_[size_t(v)];
    if (e.id < 0) {
      e.id = heap_.ref(id);
      e.owned = false;
    } else {
      target(v);
    }
  }

  void op_backward(int n, const std::vector<int>& gouts) {
    const Node& node = g_.nodes[size_t(n)];
    const std::string& op = node.op;
    auto needed = [&](size_t i) { return needs_grad_[size_t(node.inputs[i])]; };
    bool have = !gouts.empty() && gouts[0] >= 0;
    if (op == "embedding") return;
    if (op == "cross_entropy" || op == "vocab_parallel_cross_entropy") {
      if (needed(0) && !saved_[size_t(n)].empty()) give(node.inputs[0], saved_[size_t(n)][0]);
      return;
    }
    if (!have) return;
    if (op == "add") {
      for (size_t i = 0; i < 2; ++i)
        if (needed(i)) give(node.inputs[i], gouts[0]);
    } else if (op == "reshape" || op == "position_embedding" || op == "tp_reduce" ||
               op == "bias_add" || (op == "dropout" && attr_p(node) == 0)) {
      if (needed(0)) give(node.inputs[0], gouts[0]);
    } else if (op == "tp_copy" || op == "tp_gather") {
      if (needed(0)) {
        int g = heap_.alloc(bytes(node.inputs[0]));
        if (op == "tp_copy") collective(transport::Collective::all_reduce, numel(node.inputs[0]));
        give(node.inputs[0], g);
        heap_.unref(g);
      }
    } else if (op == "matmul") {
      for (size_t i = 0; i < 2; ++i)
        if (needed(i)) target(node.inputs[i]);
    } else if (has_halo(node) && needed(0)) {
      // backward_input_halo: each border range's rows of dy (a copy, freed at once) and its
      // input gradient's strip (kept: the halo rows sent are views of it), the messages
      // (the rows sent, copied; the rows received), then the tile's gradient; after the
      // wait each received block is added through a copy of the rows it lands on.
      const TileHalo h = tile_halo(node);
      std::vector<int> tmp;
      for (const auto& [rows, ext] : h.ranges) {
        int dys = heap_.alloc(rows * h.out_row);
        tmp.push_back(heap_.alloc(ext * h.in_row));
        heap_.unref(dys);
      }
      // HaloTransfer::backward: the gradients sent up (top rows) and down (bottom rows),
      // and received from below (top rows) and above (bottom rows), each where that
      // neighbour is; the wait drops the rows sent, then each received block is added
      // through a copy (counted with the sends held, every tile of a ResNet's second stage
      // at spatial 4 had been a row over, 1.3%).
      const int64_t up = w_.tile_above ? 1 : 0, down = w_.tile_below ? 1 : 0;
      std::vector<int> sent;
      for (int64_t r : {up * h.top, down * h.bottom})
        if (r > 0) sent.push_back(heap_.alloc(r * h.in_row));
      for (int64_t r : {down * h.top, up * h.bottom})
        if (r > 0) tmp.push_back(heap_.alloc(r * h.in_row));
      target(node.inputs[0]);
      for (int& id : sent) heap_.unref(id);
      for (int64_t r : {down * h.top, up * h.bottom})
        if (r > 0) {
          int part = heap_.alloc(r * h.in_row);
          heap_.unref(part);
        }
      for (int& id : tmp) heap_.unref(id);
    } else if (op == "add_layernorm") {
      // One gradient for both inputs of the add, given to each (stages/ops/fused.cpp).
      if (needed(0) || needed(1)) {
        int dx = heap_.alloc(bytes(node.inputs[0]));
        for (size_t i = 0; i < 2; ++i)
          if (needed(i)) give(node.inputs[i], dx);
        heap_.unref(dx);
      }
    } else if (op == "rotary") {
      // q and k into targets, v's columns of the gradient copied out and given
      // (stages/ops/llama.cpp).
      for (size_t i = 0; i < 2; ++i)
        if (needed(i)) target(node.inputs[i]);
      if (needed(2)) {
        int dv = heap_.alloc(bytes(node.inputs[2]));
        give(node.inputs[2], dv);
        heap_.unref(dv);
      }
    } else {
      // linear, layernorm, rmsnorm, attention, gelu, relu, silu, softmax, active dropout,
      // swiglu (gate and up): each input's gradient into a target.
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (needed(i)) target(node.inputs[i]);
    }
  }

  void recompute_layer(int layer) {
    // A value goes after its last reader in the layer unless a B still reads it.
    auto drop = [&](int v, int at) {
      if (last_layer_use_[size_t(v)] == at && pending_[size_t(v)] == 0)
        heap_.unref(values_[size_t(v)]);
    };
    for (int n : g_.layers[size_t(layer)].nodes) {
      const Node& node = g_.nodes[size_t(n)];
      Holder ins_h(heap_);
      std::vector<int> ins;
      for (int v : node.inputs) ins.push_back(ins_h.add(values_[size_t(v)]));
      std::vector<int> outs, saved;
      op_forward(n, ins, 0, outs, saved);
      for (int v : node.inputs) drop(v, n);
      for (size_t j = 0; j < node.outputs.size(); ++j) {
        heap_.unref(values_[size_t(node.outputs[j])]);
        values_[size_t(node.outputs[j])] = outs[j];
        drop(node.outputs[j], -1);  // no reader in the layer
      }
      for (int& s : saved_[size_t(n)]) heap_.unref(s);
      saved_[size_t(n)] = saved;
    }
  }

  void release_after_backward(int n) {
    const Node& node = g_.nodes[size_t(n)];
    for (int& s : saved_[size_t(n)]) heap_.unref(s);
    saved_[size_t(n)].clear();
    auto done = [&](int v) {
      const auto& u = users_[size_t(v)];
      if (std::find(u.begin(), u.end(), n) == u.end()) return;
      if (--pending_[size_t(v)] == 0) heap_.unref(values_[size_t(v)]);
    };
    for (int v : node.inputs) done(v);
    for (int v : node.outputs) done(v);
  }

  // B as Stage::run_backward runs it; `fused`: each node's W right after its B.
  void backward(bool fused) {
    if (fused) begin_weight();
    grads_.assign(g_.values.size(), Entry{});
    for (int v : w_.boundary_out) {
      if (v == g_.loss) continue;
      int id = heap_.alloc(bytes(v));  // the gradient received from the next stage
      caller_.push_back(id);
      grads_[size_t(v)] = {heap_.ref(id), false};
    }
    pending_.assign(g_.values.size(), 0);
    for (size_t v = 0; v < g_.values.size(); ++v) pending_[v] = int(users_[v].size());
    for (int l = w_.last - 1; l >= w_.first; --l) {
      if (w_.recompute.count(l)) recompute_layer(l);
      const auto& ln = g_.layers[size_t(l)].nodes;
      for (auto it = ln.rbegin(); it != ln.rend(); ++it) {
        int n = *it;
        const Node& node = g_.nodes[size_t(n)];
        const stages::Op& op = *node.impl;
        Holder args(heap_);
        std::vector<int> ins, outs, gouts;
        for (int v : node.inputs) ins.push_back(args.add(values_[size_t(v)]));
        for (int v : node.outputs) {
          outs.push_back(args.add(values_[size_t(v)]));
          gouts.push_back(args.add(grads_[size_t(v)].id));
        }
        op_backward(n, gouts);
        if (op.has_weights()) {
          std::vector<int>& ws = w_stash_[n];
          for (size_t i = 0; i < ins.size(); ++i)
            if (op.weight_needs_input(i)) ws.push_back(heap_.ref(ins[i]));
          if (op.weight_needs_saved())
            for (int s : saved_[size_t(n)]) ws.push_back(heap_.ref(s));
          if (op.weight_needs_grad_outputs())
            for (int gid : gouts) ws.push_back(heap_.ref(gid));
          if (fused) weight_node(n);
        }
        for (int v : node.outputs) heap_.unref(grads_[size_t(v)].id);
        release_after_backward(n);
      }
    }
    std::vector<int> result;
    for (int v : w_.boundary_in) {
      if (!needs_grad_[size_t(v)]) continue;
      result.push_back(grads_[size_t(v)].id >= 0 ? heap_.ref(grads_[size_t(v)].id)
                                                 : heap_.alloc(bytes(v)));
    }
    int64_t before_clear = heap_.live();
    for (int& id : values_) heap_.unref(id);
    for (auto& s : saved_)
      for (int& id : s) heap_.unref(id);
    held_through_backward_ = before_clear - heap_.live();
    if (fused) end_weight();
    for (Entry& e : grads_) heap_.unref(e.id);
    // The caller sends the input gradients and drops what it received.
    for (int& id : result) heap_.unref(id);
    for (int& id : caller_) heap_.unref(id);
    caller_.clear();
  }

  // W as Stage::backward_weight runs it: each node's W stash goes after its op. zero2's
  // sharded gradients (w_.sharded_grads) live inside it: a buffer per layer made at the
  // parameter's first W node, handed to the reducer after its last (several layers:
  // summed into a new tensor, the layers' buffers dropped), and once a bucket has all its
  // gradients it is reduce-scattered and dropped (GradReducer::reduce_micro: several
  // parameters packed into a flat copy first, their gradients dropped before it runs).
  // With w_.started_in_w, the step's last W: each bucket of whole gradients starts its
  // reduction once its last parameter is final, holding its flat copy and scratch to
  // the W's end.
  void weight() {
    begin_weight();
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) weight_node(*it);
    end_weight();
  }

  // What W tracks across its nodes (Stage::WeightPass): zero2's buffers and buckets, and
  // the reductions started.
  struct WeightPass {
    std::map<int, size_t> bucket_of;
    std::map<int, std::map<int, int>> layer_grads;  // parameter -> layer -> buffer
    std::vector<std::vector<int>> handed;
    std::set<int> done;  // parameters whose last W node ran
    std::vector<bool> started;
    std::vector<int> reducing;     // the started reductions' buffers
    std::map<int, int> last_user;  // a parameter's last W node: the first that uses it
  };

  void begin_weight() {
    wp_ = WeightPass{};
    for (size_t k = 0; k < w_.sharded_grads.size(); ++k)
      for (int id : w_.sharded_grads[k].params) wp_.bucket_of[id] = k;
    wp_.handed.resize(w_.sharded_grads.size());
    wp_.started.assign(w_.started_in_w.size(), false);
    if (!wp_.bucket_of.empty() || !wp_.started.empty())
      for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it)
        for (int id : g_.nodes[size_t(*it)].params)
          if (id >= 0) wp_.last_user[id] = *it;
  }

  int64_t param_bytes(int id) const {
    const stages::Param& p = g_.params[size_t(id)];
    return memory::shape_numel(p.shape) * int64_t(memory::dtype_size(p.dtype));
  }

  void start_ready() {
    for (size_t k = 0; k < wp_.started.size(); ++k) {
      const GradBucket& bk = w_.started_in_w[k];
      if (wp_.started[k] || !std::all_of(bk.params.begin(), bk.params.end(),
                                         [&](int id) { return wp_.done.count(id) > 0; }))
        continue;
      wp_.started[k] = true;
      if (bk.params.size() > 1) {
        int64_t b = 0;
        for (int p : bk.params) b += param_bytes(p);
        wp_.reducing.push_back(heap_.alloc(b));
      }
      if (bk.scratch > 0) wp_.reducing.push_back(heap_.alloc(bk.scratch));
    }
  }

  void hand(int id) {
    auto bit = wp_.bucket_of.find(id);
    if (bit == wp_.bucket_of.end()) return;
    std::map<int, int>& bufs = wp_.layer_grads[id];
    int layers = 0;
    for (int l : g_.params[size_t(id)].layers) layers += l >= w_.first && l < w_.last ? 1 : 0;
    int total;
    if (layers == 1 && !bufs.empty()) {
      total = bufs.begin()->second;  // the layer's buffer itself
    } else {
      total = heap_.alloc(param_bytes(id));  // the sum (or zeros when no node ran)
      for (auto& [l, buf] : bufs) heap_.unref(buf);
    }
    bufs.clear();
    const GradBucket& bucket = w_.sharded_grads[bit->second];
    std::vector<int>& in = wp_.handed[bit->second];
    in.push_back(total);
    if (in.size() < bucket.params.size()) return;
    if (in.size() > 1) {
      int64_t b = 0;
      for (int p : bucket.params) b += param_bytes(p);
      const int flat = heap_.alloc(b);
      for (int& t : in) heap_.unref(t);
      in = {flat};
    }
    if (bucket.scratch > 0) {
      int scratch = heap_.alloc(bucket.scratch);
      heap_.unref(scratch);
    }
    heap_.unref(in[0]);
    in.clear();
  }

  // One node's W: its stash goes after its op.
  void weight_node(int n) {
    auto ws = w_stash_.find(n);
    if (ws == w_stash_.end()) return;
    const Node& node = g_.nodes[size_t(n)];
    for (int id : node.params)
      if (id >= 0 && wp_.bucket_of.count(id) && !wp_.layer_grads[id].count(node.layer))
        wp_.layer_grads[id][node.layer] = heap_.alloc(param_bytes(id));
    for (int& id : ws->second) heap_.unref(id);
    w_stash_.erase(ws);
    for (const auto& [id, last] : wp_.last_user)
      if (last == n && wp_.done.insert(id).second) hand(id);
    start_ready();
  }

  void end_weight() {
    // Parameters whose last user has no W (none in practice): after the micro-batch.
    for (const auto& [id, k] : wp_.bucket_of)
      if (wp_.done.insert(id).second) hand(id);
    for (const GradBucket& bk : w_.started_in_w)
      wp_.done.insert(bk.params.begin(), bk.params.end());
    start_ready();
    for (int& id : wp_.reducing) heap_.unref(id);
  }

  const WalkSpec& w_;
  const Graph& g_;
  Heap heap_;
  std::vector<int> nodes_;
  std::set<int> out_set_;
  std::vector<bool> kept_, needs_grad_, recompute_node_;
  std::vector<int> last_use_, last_layer_use_;
  std::vector<std::vector<int>> users_;
  std::vector<int> values_;
  std::vector<std::vector<int>> saved_;
  std::vector<int> caller_;
  std::vector<Entry> grads_;
  std::vector<int> pending_;
  std::map<int, std::vector<int>> w_stash_;
  WeightPass wp_;
  int64_t held_through_backward_ = 0;
};

}  // namespace

WalkSpec stage_walk_spec(const Graph& g, int first, int last, const std::set<int>& recompute,
                         int64_t batch, int tp) {
  WalkSpec w;
  w.graph = &g;
  w.first = first;
  w.last = last;
  w.boundary_in = g.cut_values(first);
  w.boundary_out = g.cut_values(last);
  w.model_in = g.inputs_used(first, last);
  w.recompute = recompute;
  w.batch = batch;
  w.tp = tp;
  return w;
}

MicroBatchMemory walk_micro_batch(const WalkSpec& spec) {
  return Walker(spec).run();
}

void persistent_memory(const Graph& g, int first, int last, int optimizer_states,
                       StageMemory& out) {
  out.params = out.grads = out.optimizer = 0;
  for (int id : g.params_used(first, last)) {
    const stages::Param& p = g.params[size_t(id)];
    int64_t b = rounded(memory::shape_numel(p.shape) * int64_t(memory::dtype_size(p.dtype)));
    int64_t layers = 0;
    for (int l : p.layers) layers += l >= first && l < last ? 1 : 0;
    out.params += b;
    out.grads += b * (layers + (layers > 1 ? 1 : 0));
    if (p.trainable) out.optimizer += b * optimizer_states;  // a buffer has no state
  }
}

double micro_batch_bytes_bound(const Graph& g, int64_t batch) {
  double bytes = 0;
  for (const stages::Value& v : g.values) {
    double n = v.type.batched ? double(batch) : 1.0;
    for (int64_t d : v.type.shape) n *= double(d);
    bytes += n * double(memory::dtype_size(v.type.dtype)) + 64;  // rounded up per tensor
  }
  return 2 * bytes;
}

bool micro_batches_countable(const Graph& g, int64_t batch, int64_t micro_batches) {
  return micro_batch_bytes_bound(g, batch) * double(micro_batches + 1) <= kCountableBytes;
}

int64_t sharded_optimizer_bytes(int64_t numel, int dtype_size, int dp, int optimizer_states) {
  if (dp <= 1) return rounded(numel * dtype_size) * optimizer_states;
  const int64_t part = (numel + dp - 1) / dp;
  return part == 0 ? 0 : rounded(part * dtype_size) * optimizer_states;
}

int64_t zero_optimizer_saving(int64_t numel, int dtype_size, int dp, int optimizer_states) {
  return rounded(numel * dtype_size) * optimizer_states -
         sharded_optimizer_bytes(numel, dtype_size, dp, optimizer_states);
}

std::vector<std::vector<int>> gradient_buckets(const Graph& g, std::vector<int> ids,
                                               size_t bucket_bytes,
                                               const std::map<int, int>* stage_of) {
  std::sort(ids.rbegin(), ids.rend());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<std::vector<int>> out;
  int64_t bytes = 0;
  for (int id : ids) {
    const stages::Param& p = g.params[size_t(id)];
    const int64_t nb = memory::shape_numel(p.shape) * int64_t(memory::dtype_size(p.dtype));
    if (!out.empty()) {
      const int first = out.back().front();
      if (bytes + nb > int64_t(bucket_bytes) || p.dtype != g.params[size_t(first)].dtype ||
          (stage_of && stage_of->at(id) != stage_of->at(first))) {
        out.emplace_back();
        bytes = 0;
      }
    }
    if (out.empty()) out.emplace_back();
    out.back().push_back(id);
    bytes += nb;
  }
  return out;
}

std::map<int, int64_t> shard_parts(const Graph& g, std::vector<int> ids, size_t bucket_bytes,
                                   int members, int me, const std::map<int, int>* stage_of) {
  std::map<int, int64_t> out;
  for (const std::vector<int>& bucket :
       gradient_buckets(g, std::move(ids), bucket_bytes, stage_of)) {
    std::vector<int64_t> numel;
    int64_t elements = 0;
    for (int id : bucket) {
      numel.push_back(memory::shape_numel(g.params[size_t(id)].shape));
      elements += numel.back();
    }
    // The all-reduce's equal parts (engine/detail/grad_reducer.cpp, bucket_parts).
    int64_t begin = 0;
    for (int q = 0; q < me; ++q) begin += elements / members + (q < elements % members ? 1 : 0);
    const int64_t end = begin + elements / members + (me < elements % members ? 1 : 0);
    int64_t first = 0;  // the parameter's first element in the bucket
    for (size_t j = 0; j < bucket.size(); ++j) {
      const int64_t lo = std::clamp(begin - first, int64_t(0), numel[j]);
      out[bucket[j]] = std::clamp(end - first, lo, numel[j]) - lo;
      first += numel[j];
    }
  }
  return out;
}

ZeroGradMemory zero2_grad_memory(const Graph& g, int first, int last, std::vector<int> ids, int dp,
                                 size_t bucket_bytes, const std::map<int, int64_t>* parts) {
  ZeroGradMemory z;
  int64_t largest = 0;  // the largest bucket's flat copy and scratch
  for (std::vector<int>& ids_of : gradient_buckets(g, std::move(ids), bucket_bytes)) {
    int64_t elements = 0;
    for (int id : ids_of) {
      const stages::Param& p = g.params[size_t(id)];
      const int64_t n = memory::shape_numel(p.shape), es = int64_t(memory::dtype_size(p.dtype));
      const int64_t b = rounded(n * es);
      int64_t layers = 0;
      for (int l : p.layers) layers += l >= first && l < last ? 1 : 0;
      int64_t held = (n + dp - 1) / dp;
      if (parts && parts->count(id)) held = parts->at(id);
      z.saved += b * (layers + (layers > 1 ? 1 : 0)) - rounded(held * es);
      z.held_bound += b * (layers + (layers > 1 ? 1 : 0));
      elements += n;
    }
    const size_t es = memory::dtype_size(g.params[size_t(ids_of.front())].dtype);
    GradBucket bk{std::move(ids_of), 0};
    bk.scratch = int64_t(transport::collective_scratch_bytes(
        transport::Collective::reduce_scatter, size_t(elements), es, dp,
        size_t((elements + dp - 1) / dp), /*in_place=*/true));
    largest = std::max(largest,
                       (bk.params.size() > 1 ? rounded(elements * int64_t(es)) : 0) + bk.scratch);
    z.buckets.push_back(std::move(bk));
  }
  z.held_bound += largest;
  return z;
}

StageMemory stage_memory(const Graph& g, int first, int last, const std::set<int>& recompute,
                         int64_t batch, int optimizer_states, int tp, int tiles) {
  StageMemory m;
  persistent_memory(g, first, last, optimizer_states, m);
  WalkSpec spec = stage_walk_spec(g, first, last, recompute, batch, tp);
  if (tiles <= 1) {
    m.mb = walk_micro_batch(spec);
    return m;
  }
  // A tile at the image's top edge, one at its bottom, one between (s > 2): the most
  // each figure reaches on any of them (an edge sends and receives on one side only).
  bool first_pos = true;
  for (const auto& [above, below] :
       std::vector<std::pair<bool, bool>>{{false, true}, {true, false}, {true, true}}) {
    if (above && below && tiles < 3) continue;
    spec.tile_above = above;
    spec.tile_below = below;
    const MicroBatchMemory t = walk_micro_batch(spec);
    if (first_pos) {
      m.mb = t;
      first_pos = false;
      continue;
    }
    MicroBatchMemory& b = m.mb;
    b.stash = std::max(b.stash, t.stash);
    b.w_stash = std::max(b.w_stash, t.w_stash);
    b.forward_peak = std::max(b.forward_peak, t.forward_peak);
    b.backward_peak = std::max(b.backward_peak, t.backward_peak);
    b.weight_peak = std::max(b.weight_peak, t.weight_peak);
    b.held_through_backward = std::max(b.held_through_backward, t.held_through_backward);
    b.fused_peak = std::max(b.fused_peak, t.fused_peak);
    b.last_weight_peak = std::max(b.last_weight_peak, t.last_weight_peak);
    b.last_fused_peak = std::max(b.last_fused_peak, t.last_fused_peak);
  }
  return m;
}

// ---- a rank over a schedule ----

namespace {

// Walks a rank's compute actions, calling visit(pos, stage, kind, held_by_stage) at each
// (pos: the action's position in s.ranks[rank]; kind as PeakTerm's). held[k] =
// {micro-batches between F and B, between B and W} of stage k.
template <class Visit>
void walk_rank_at(const schedule::Schedule& s, int rank, Visit visit_at) {
  using schedule::ActionKind;
  std::map<int, std::pair<int, int>> held;
  for (int k : schedule::stages_of_rank(s, rank)) held[k] = {0, 0};
  const auto& actions = s.ranks[size_t(rank)];
  for (size_t pos = 0; pos < actions.size(); ++pos) {
    const schedule::Action& a = actions[pos];
    auto visit = [&](int stage, int kind, const std::map<int, std::pair<int, int>>& h) {
      visit_at(pos, stage, kind, h);
    };
    auto& h = held[a.stage];
    switch (a.kind) {
      case ActionKind::forward:
        visit(a.stage, 0, held);
        h.first++;
        break;
      case ActionKind::backward_input:
        h.first--;
        visit(a.stage, 1, held);
        h.second++;
        break;
      case ActionKind::backward_weight:
        h.second--;
        visit(a.stage, 2, held);
        break;
      case ActionKind::full_backward:
        h.first--;
        visit(a.stage, 3, held);
        break;
      default:
        break;
    }
  }
}

// The same without the position.
template <class Visit>
void walk_rank(const schedule::Schedule& s, int rank, Visit visit) {
  walk_rank_at(s, rank,
               [&](size_t, int stage, int kind, const std::map<int, std::pair<int, int>>& held) {
                 visit(stage, kind, held);
               });
}

}  // namespace

std::vector<int> loader_micro_batches_at(const schedule::Schedule& s, int rank,
                                         const std::vector<bool>& reads, int input_ahead,
                                         bool staged) {
  const int ahead = std::max(1, input_ahead);
  const auto& actions = s.ranks[size_t(rank)];
  auto takes = [&](const schedule::Action& a) {
    return a.kind == schedule::ActionKind::forward && a.stage < int(reads.size()) &&
           reads[size_t(a.stage)];
  };
  // Each micro-batch's first and last forward reading inputs: the loader keeps it between.
  std::map<int, std::pair<size_t, size_t>> span;
  for (size_t i = 0; i < actions.size(); ++i)
    if (takes(actions[i])) {
      auto [it, fresh] = span.try_emplace(actions[i].micro_batch, i, i);
      if (!fresh) it->second.second = i;
    }
  std::vector<int> out(actions.size() + 1, 0);
  if (span.empty()) return out;
  // Queued (Executor::run_step): the step's micro-batches the rank reads and the next
  // step's, less those taken so far, the one the running action takes included (its
  // stage holds that). Before the rank's first take the stages hold nothing, but an
  // action before it (a stage reading no inputs) runs beside every queued one.
  // Counted from each span's ends in one pass: a search walks ranks of thousands of
  // micro-batches, where a scan of every span per action costs seconds.
  const int n = int(span.size());
  std::vector<int> firsts(out.size(), 0), opens(out.size(), 0), closes(out.size(), 0);
  for (const auto& [mb, fl] : span) {
    firsts[fl.first]++;
    if (fl.first < fl.second) {
      opens[fl.first]++;
      closes[fl.second]++;
    }
  }
  int taken = 0, kept = 0;  // kept: the spans with first <= i < second
  for (size_t i = 0; i < out.size(); ++i) {
    taken += firsts[i];
    kept += opens[i] - closes[i];
    out[i] = (staged ? ahead + 1 : std::min(ahead, 2 * n - taken)) + kept;
  }
  return out;
}

int loader_micro_batches(const schedule::Schedule& s, int rank, const std::vector<bool>& reads,
                         int input_ahead, bool staged) {
  const std::vector<int> at = loader_micro_batches_at(s, rank, reads, input_ahead, staged);
  return *std::max_element(at.begin(), at.end());
}

int64_t rank_peak(const schedule::Schedule& s, int rank, const std::vector<StageMemory>& stages) {
  return rank_peak(s, rank, stages, RankBuffers{});
}

int64_t rank_peak(const schedule::Schedule& s, int rank, const std::vector<StageMemory>& stages,
                  const RankBuffers& buffers) {
  int64_t persistent = 0;
  for (int k : schedule::stages_of_rank(s, rank)) persistent += stages[size_t(k)].persistent();
  int64_t peak = std::max({buffers.reduction, buffers.step, buffers.gather, buffers.start});
  std::map<int, size_t> last_weight;  // each stage's last W (or BW) of the step
  const auto& actions = s.ranks[size_t(rank)];
  for (size_t pos = 0; pos < actions.size(); ++pos)
    if (actions[pos].kind == schedule::ActionKind::backward_weight ||
        actions[pos].kind == schedule::ActionKind::full_backward)
      last_weight[actions[pos].stage] = pos;
  walk_rank_at(
      s, rank,
      [&](size_t pos, int stage, int kind, const std::map<int, std::pair<int, int>>& held) {
        int64_t m = pos < buffers.posted.size() ? buffers.posted[pos] : 0;
        for (const auto& [k, h] : held)
          m += h.first * stages[size_t(k)].mb.stash + h.second * stages[size_t(k)].mb.w_stash;
        const MicroBatchMemory& own = stages[size_t(stage)].mb;
        const bool last = last_weight[stage] == pos;
        if (kind == 2)
          m += last && own.last_weight_peak > 0 ? own.last_weight_peak : own.weight_peak;
        else if (kind == 3)
          m += last && own.last_fused_peak > 0 ? own.last_fused_peak : own.fused_peak;
        else
          m += kind == 0 ? own.forward_peak : own.backward_peak;
        peak = std::max(peak, m);
        // The sends after it: its stage holds the micro-batch's stash after F, its W
        // stash after B, nothing of it after W or BW.
        if (pos < buffers.sending.size() && buffers.sending[pos] > 0) {
          int64_t after = buffers.sending[pos];
          for (const auto& [k, h] : held)
            after += h.first * stages[size_t(k)].mb.stash + h.second * stages[size_t(k)].mb.w_stash;
          after += kind == 0 ? own.stash : kind == 1 ? own.w_stash : 0;
          peak = std::max(peak, after);
        }
      });
  return persistent + buffers.loader + peak;
}

namespace {

std::vector<PeakTerm> terms_of(const schedule::Schedule& s, int rank, int only_stage) {
  std::set<std::tuple<int, int, int>> seen;
  walk_rank(s, rank, [&](int stage, int kind, const std::map<int, std::pair<int, int>>& held) {
    if (only_stage >= 0 && stage != only_stage) return;
    int a = 0, b = 0;
    for (const auto& [k, h] : held) {
      if (only_stage >= 0 && k != only_stage) continue;
      a += h.first;
      b += h.second;
    }
    seen.insert({kind, a, b});
  });
  // Keep the terms no other term of the same kind dominates (another with a2 >= a and
  // b2 >= b): one sweep per kind from the largest a (and b) down, keeping a term whose b
  // passes every b before it. Pairwise, this had made the search quadratic in
  // micro-batches (a minute for one GPipe candidate at 32768).
  std::vector<PeakTerm> out;
  int kind_now = -1, max_b = std::numeric_limits<int>::min();
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    const auto& [kind, a, b] = *it;
    if (kind != kind_now) {
      kind_now = kind;
      max_b = std::numeric_limits<int>::min();
    }
    if (b > max_b) {
      out.push_back({a, b, kind});
      max_b = b;
    }
  }
  std::reverse(out.begin(), out.end());  // ascending (kind, a, b), as the set holds them
  return out;
}

}  // namespace

std::vector<PeakTerm> peak_terms(const schedule::Schedule& s, int rank) {
  return terms_of(s, rank, -1);
}

std::vector<PeakTerm> peak_terms_of_stage(const schedule::Schedule& s, int rank, int stage) {
  return terms_of(s, rank, stage);
}

int64_t eval_peak(const std::vector<PeakTerm>& terms, const MicroBatchMemory& m) {
  int64_t peak = 0;
  for (const PeakTerm& t : terms) {
    int64_t own = t.kind == 0   ? m.forward_peak
                  : t.kind == 1 ? m.backward_peak
                  : t.kind == 2 ? m.weight_peak
                                : m.fused_peak;
    peak = std::max(peak, t.a * m.stash + t.b * m.w_stash + own);
  }
  return peak;
}

}  // namespace baton::partitioner
