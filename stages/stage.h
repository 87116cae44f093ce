// Stage: the part of a graph one rank holds for one pipeline chunk, a contiguous range of
// layers [first, last), with its parameters, their gradients (accumulated over micro-
// batches) and the optimizer state. It runs, per micro-batch:
//   forward(mb, inputs)            -> the values crossing the stage's last cut (or the loss)
//   backward_input(mb, grads)      B: gradients of the values that entered the stage
//   backward_weight(mb)            W: parameter gradients (may be deferred; frees the stash)
// with a per-micro-batch activation stash, optional recompute per layer, and then
// zero_grad / grad norm pieces / step once per training step. The whole model on one
// process is one Stage with every layer.
//
// Every tensor (parameters, gradients, optimizer state, activations) comes from the
// device's allocator, so a capacity on it caps the stage and its peak is measurable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "stages/graph.h"
#include "stages/micro_batch.h"

namespace baton::stages {

using TensorMap = std::map<std::string, Tensor>;

// The largest learning rate and weight decay a checkpoint's manifest holds (from_json);
// baton train refuses more up front (a run had trained and then written checkpoints that
// neither --resume nor export would read).
inline constexpr double kMaxOptimizerRate = 1e6;

struct OptimizerConfig {
  enum class Kind { adamw, sgd };
  Kind kind = Kind::adamw;
  kernels::AdamW adamw;
  kernels::Sgd sgd;
  nlohmann::json to_json() const;
  static OptimizerConfig from_json(const nlohmann::json& j, const std::string& source);
  double lr() const { return kind == Kind::adamw ? adamw.lr : sgd.lr; }
  void set_lr(double lr);
};

struct StageOptions {
  memory::Device device = memory::Device::cpu();
  uint64_t seed = 0;                      // parameter init and dropout
  std::set<int> recompute_layers;         // graph layer indices whose activations are recomputed
  transport::Communicator* tp = nullptr;  // tensor-parallel group (communication ops)
  transport::Communicator* spatial = nullptr;  // spatial group (halos, tiled batch norm)
  // Batch-norm statistics' group when it is more than `spatial` (sync_batchnorm).
  transport::Communicator* batchnorm = nullptr;
  bool profile = false;  // time every node (op_times()); costs a clock read per node
  // Mixed precision: when set and different from a trainable parameter's dtype (the
  // graph's 16-bit float dtype), the stage keeps a master copy of it in this dtype (f32),
  // with the optimizer state in it too; the optimizer updates the master and the ops
  // read a working copy cast from it after every update. param() is the master, so
  // checkpoints hold it and a run resumes in another precision.
  std::optional<memory::DType> master_dtype;
  // false: the parameters are left as allocated, for a caller that loads every one of them
  // at once (generation and export from weights): initialising a model only to overwrite
  // it had been most of `baton generate`'s start-up (sampling 124 M normals: seconds).
  bool init = true;
  // false: no gradient buffers (a stage that only runs forwards: generation, export), and
  // a backward is refused. Each parameter's had been allocated beside it, doubling the
  // memory a model to sample from takes on a device.
  bool gradients = true;
};

// Seconds spent per op type (with profile on), summed over calls.
struct OpTimes {
  double forward = 0, backward_input = 0, backward_weight = 0;
  int64_t calls = 0;
};

class Stage {
 public:
  // The stage of `graph` holding layers [first_layer, last_layer). Parameters are
  // allocated and initialised from (seed, name) at once.
  Stage(std::shared_ptr<const Graph> graph, int first_layer, int last_layer,
        StageOptions options = {});
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // ---- structure ----
  const Graph& graph() const { return *graph_; }
  int first_layer() const { return first_; }
  memory::Device device() const { return opt_options_.device; }  // where its tensors live
  int last_layer() const { return last_; }
  bool is_first() const { return first_ == 0; }
  bool is_last() const { return last_ == graph_->num_layers(); }
  // Values that enter the stage from the previous one (empty for the first stage).
  const std::vector<int>& boundary_inputs() const { return boundary_in_; }
  // Values the stage hands on: those crossing its last cut, or the loss for the last stage.
  const std::vector<int>& boundary_outputs() const { return boundary_out_; }
  // Model inputs (tokens, targets) the stage reads; the data loader gives them.
  const std::vector<int>& model_inputs() const { return model_in_; }
  // Parameter ids the stage holds, ascending.
  const std::vector<int>& param_ids() const { return param_ids_; }
  // Parameters also held by another stage (tied, like GPT-2's wte): the engine sums their
  // gradients across the stages holding them after finish_grads().
  std::vector<int> shared_params() const;

  // ---- parameters, gradients, optimizer state ----
  // The parameter as the optimizer and checkpoints see it: its master copy under mixed
  // precision (StageOptions::master_dtype), else the tensor the ops read. Writing
  // through the non-const form (loading, gathering) is seen by the next forward, which
  // casts the masters into the working copies again.
  const Tensor& param(int id) const;
  Tensor& param(int id);
  // The tensor the ops read (the 16-bit working copy under mixed precision).
  const Tensor& working_param(int id) const;
  // The masters were written behind the stage's back (through a tensor taken from param()
  // earlier, like a post-validated step's rollback): the next forward casts them again.
  void mark_working_stale() { working_stale_ = true; }
  const Tensor& param(const std::string& name) const;
  // The gradient accumulated since zero_grad (valid after finish_grads()).
  const Tensor& grad(int id) const;
  Tensor& grad(int id);
  // Re-initialises every parameter from (seed, name).
  void init_params(uint64_t seed);

  // ---- one micro-batch ----
  // `inputs` maps value names to tensors: boundary_inputs() and model_inputs(). Returns
  // boundary_outputs() by name. With training = false nothing is stashed.
  TensorMap forward(const MicroBatch& mb, const TensorMap& inputs, bool training = true);
  // B. `grad_outputs` maps boundary_outputs() names to their gradients (none for the
  // loss). Returns the gradients of the floating boundary_inputs() by name.
  TensorMap backward_input(int64_t mb_index, const TensorMap& grad_outputs = {});
  // W: accumulates parameter gradients and frees the micro-batch's stash.
  void backward_weight(int64_t mb_index);
  // B and W as one pass: each node's W right after its B, so no W stash builds up (the
  // gradients are the same bits as backward_input then backward_weight).
  TensorMap backward(int64_t mb_index, const TensorMap& grad_outputs = {});
  // The step's LAST W of this stage (or its last B+W), for an engine that reduces
  // gradients while backward still runs: each parameter's gradient is finished (as by
  // finish_grads()) as soon as its last user's W is done, and `ready(id)` is called with
  // the gradient final, in the order the parameters complete (reverse node order). The
  // stage then counts as finished: step() does not fold again, so grad(id) may be
  // reduced in place from the callback on.
  using ParamReadyFn = std::function<void(int param_id)>;
  void backward_weight(int64_t mb_index, const ParamReadyFn& ready);
  TensorMap backward(int64_t mb_index, const TensorMap& grad_outputs, const ParamReadyFn& ready);
  // Drops a forwarded micro-batch's stash without backward (evaluation, probing).
  void discard(int64_t mb_index);
  // Micro-batches forwarded and not yet through W.
  size_t stashed() const { return stash_.size(); }

  // ---- once per step ----
  void zero_grad();
  // Adds up gradients of parameters used by several layers of this stage (in ascending
  // layer order) and zeroes those that got none. Call after the last W of a step.
  void finish_grads();
  // Sum of squares of the gradients, per layer of the graph (a parameter counts in the
  // first layer that uses it), for this stage's layers. A process adds the pieces of all
  // stages in layer order, so the norm has the same bits for any pipeline cut.
  std::vector<double> grad_sum_squares_by_layer() const;
  double grad_sum_squares() const;  // the pieces above, added in layer order
  // The same sum as one f64 element on the stage's device, queued without a wait: what a
  // GradScale derives the step's scale from on the device.
  Tensor grad_sum_squares_tensor() const;
  void set_optimizer(const OptimizerConfig& config);  // allocates its state
  // A sharded optimizer (ZeRO, engine/detail/grad_reducer.h): the stage updates only the
  // elements [begin, end) of the flattened parameter `id` and holds optimizer state for
  // them alone (none when begin == end); the rest of the parameter is written by others.
  // Call before set_optimizer(), or its state for `id` is reallocated (zeroed).
  void set_optimizer_shard(int id, int64_t begin, int64_t end);
  // The elements of `id` this stage updates: [0, numel) unless sharded.
  std::pair<int64_t, int64_t> optimizer_shard(int id) const;
  // ZeRO-2 (engine/detail/grad_reducer.h): the stage keeps no whole gradient of `id`
  // across micro-batches. grad(id) becomes a 1-D accumulator of the shard's elements
  // (optimizer_shard(id), set first), written by the engine; each micro-batch's W writes
  // the whole gradient into buffers allocated for it, hands it to the MicroGradFn right
  // after the parameter's last user in the stage ran, and drops them.
  void set_grad_shard(int id);
  bool grad_sharded(int id) const;
  // (param id, the micro-batch's whole gradient of it; undefined when no W touched it).
  // Handed over: the stage keeps no reference, so the receiver may drop it at once.
  using MicroGradFn = std::function<void(int param_id, Tensor grad)>;
  void set_micro_grad_fn(MicroGradFn fn) { micro_grad_ = std::move(fn); }
  const OptimizerConfig& optimizer() const { return opt_; }
  OptimizerConfig& optimizer() { return opt_; }
  // One optimizer step on grad * grad_scale (grad_scale folds in clipping). Runs
  // finish_grads() first if the caller did not. A scale derived from a squared norm
  // (kernels::GradScale) queues AdamW without waiting for it; SGD reads it on the host.
  // A norm that is not finite changes nothing, but counts the step: the caller, who
  // learns it from the norm, takes it back (set_optimizer_steps).
  void step(const kernels::GradScale& grad_scale = 1.0);
  int64_t optimizer_steps() const { return opt_steps_; }
  void set_optimizer_steps(int64_t n) { opt_steps_ = n; }
  // Optimizer state tensors of a parameter: AdamW {exp_avg, exp_avg_sq}, SGD with
  // momentum {momentum_buffer}; names are torch's. Sharded: 1-D tensors of the shard's
  // elements (optimizer_shard()); none for an empty shard.
  std::vector<std::pair<std::string, Tensor>> optimizer_state(int id) const;

  // Time per op type ("optimizer" for step()) since the last reset (profile on).
  const std::map<std::string, OpTimes>& op_times() const { return times_; }
  void reset_op_times() { times_.clear(); }

  // Bytes of parameters, gradients and optimizer state this stage holds.
  int64_t persistent_bytes() const;

 private:
  struct ParamState;
  struct MbState;
  struct WeightPass;
  void run_node_forward(MbState& s, int node, bool keep_for_backward);
  void recompute_layer(MbState& s, int layer);
  void release_after_backward(MbState& s, int node);
  // B over the stage's nodes in reverse; with `fused`, each node's W runs right after its
  // B and the micro-batch is done at the end.
  TensorMap run_backward(int64_t mb_index, const TensorMap& grad_outputs, WeightPass* fused);
  // One micro-batch's W: the pass's bookkeeping, a node's W (from its stash, which it
  // drops) and the parameters finished after the last node.
  WeightPass weight_pass(const ParamReadyFn& ready) const;
  void run_weight(MbState& s, int node, WeightPass& pass);
  void finish_weight(WeightPass& pass);
  void fold_grad(ParamState& ps);
  ParamState& state_of(int id);
  const ParamState& state_of(int id) const;

  std::shared_ptr<const Graph> graph_;
  int first_ = 0, last_ = 0;
  StageOptions opt_options_;
  std::vector<int> boundary_in_, boundary_out_, model_in_, param_ids_, nodes_;
  std::vector<int> local_param_;  // graph param id -> index in params_ (-1: not held)
  std::vector<std::unique_ptr<ParamState>> params_;
  // Per value: does forward keep it for backward (outside recomputed layers); per node:
  // is its layer recomputed; per value: the nodes whose B reads it.
  std::vector<bool> kept_, recompute_node_, needs_grad_;
  std::vector<int> last_forward_use_;             // last consumer node in the stage
  std::vector<int> last_layer_use_;               // last consumer in its producer's layer
  std::vector<std::vector<int>> backward_users_;  // nodes whose B reads the value
  std::map<int64_t, std::unique_ptr<MbState>> stash_;
  OptimizerConfig opt_;
  bool opt_ready_ = false;
  int64_t opt_steps_ = 0;
  std::map<std::string, OpTimes> times_;
  bool grads_finished_ = false;  // finish_grads() ran since the last W
  MicroGradFn micro_grad_;       // ZeRO-2: where each micro-batch's sharded gradients go
  void hand_micro_grad(ParamState& ps);
  bool working_stale_ = false;  // a master may have changed since the last cast
  void refresh_working();       // working copies = masters (mixed precision)
};

}  // namespace baton::stages
