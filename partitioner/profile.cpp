#include "partitioner/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "kernels/ops.h"
#include "memory/cuda_device.h"
#include "memory/error.h"
#include "partitioner/spatial.h"
#include "partitioner/tensor_parallel.h"
#include "stages/stage.h"
#include "transport/communicator.h"

namespace baton::partitioner {

using stages::Graph;
using stages::Node;
using stages::Tensor;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The host waits for what was queued on the device (nothing to wait for on the CPU).
void finish(memory::Device device) {
  if (device.is_cuda()) memory::cuda::synchronize(device.index);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

std::string signature(const Graph& g, const Node& n) {
  std::string s = n.op + n.attrs.dump();
  for (int v : n.inputs) s += "<" + stages::type_str(g.values[size_t(v)].type);
  for (int p : n.params)
    s += p < 0 ? std::string("p-") : "p" + memory::shape_str(g.params[size_t(p)].shape);
  return s;
}

// The largest id an integer input of a node may take: rows of an embedding table, the
// vocabulary of a cross-entropy's logits.
int64_t id_bound(const Graph& g, const Node& n) {
  if (n.op == "embedding") return g.params[size_t(n.params[0])].shape[0];
  if (n.op == "cross_entropy") return g.values[size_t(n.inputs[0])].type.shape.back();
  return 1;
}

// Floats drawn where they live (a GPU draws its 16-bit types itself); ids on the host.
Tensor random_tensor(const memory::Shape& shape, memory::DType dtype, double stddev, int64_t bound,
                     uint64_t seed, memory::Device device) {
  if (memory::is_floating(dtype)) {
    Tensor x = Tensor::empty(shape, dtype, device);
    kernels::random_normal(x, 0.0, stddev, seed, 1, {});
    return x;
  }
  std::mt19937_64 rng(seed);
  Tensor x = Tensor::empty(shape, memory::DType::i64);
  for (int64_t& v : x.span<int64_t>()) v = int64_t(rng() % uint64_t(std::max<int64_t>(bound, 1)));
  return x.to(dtype).to(device);
}

Tensor random_tensor(const stages::ValueType& t, int64_t batch, int64_t bound, uint64_t seed,
                     memory::Device device) {
  return random_tensor(t.with_batch(batch), t.dtype, 1.0, bound, seed, device);
}

struct Times {
  std::vector<double> f, b, w;
};

// One F, B and W of a node on random inputs, each timed.
void run_once(const Graph& g, const Node& n, int64_t batch, uint64_t seed, memory::Device dev,
              Times& times, bool record) {
  const stages::Op& op = *n.impl;
  stages::OpContext ctx;
  ctx.mb.samples = batch;
  ctx.mb.global_batch = batch;
  ctx.mb.loss_tokens = 1;
  ctx.training = true;
  ctx.device = dev;
  std::vector<Tensor> ins, params, outs(n.outputs.size()), saved;
  for (int v : n.inputs)
    ins.push_back(random_tensor(g.values[size_t(v)].type, batch, id_bound(g, n), seed++, dev));
  for (int p : n.params) {
    if (p < 0) {
      params.emplace_back();
      continue;
    }
    const stages::Param& pp = g.params[size_t(p)];
    params.push_back(random_tensor(pp.shape, pp.dtype, 0.02, 1, seed++, dev));
  }
  // No input may be overwritten: they are reused below.
  stages::ForwardCall fc{ctx, ins, params, outs, saved, 0};
  finish(dev);
  auto t0 = Clock::now();
  op.forward(fc);
  finish(dev);
  if (record) times.f.push_back(seconds_since(t0));

  std::vector<Tensor> gouts;
  for (size_t j = 0; j < n.outputs.size(); ++j) {
    const stages::ValueType& t = g.values[size_t(n.outputs[j])].type;
    gouts.push_back(t.batched && memory::is_floating(t.dtype)
                        ? random_tensor(t, batch, 1, seed++, dev)
                        : Tensor());
  }
  std::vector<stages::GradSlot::Entry> entries(n.inputs.size());
  std::vector<stages::GradSlot> slots(n.inputs.size());
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const stages::ValueType& t = g.values[size_t(n.inputs[i])].type;
    if (t.batched && memory::is_floating(t.dtype))
      slots[i] = stages::GradSlot(&entries[i], t.with_batch(batch), t.dtype, dev);
  }
  std::vector<Tensor> in_saved(ins.size()), out_saved(outs.size());
  for (size_t i = 0; i < ins.size(); ++i)
    if (op.saves_input(i)) in_saved[i] = ins[i];
  for (size_t j = 0; j < outs.size(); ++j)
    if (op.saves_output(j)) out_saved[j] = outs[j];
  stages::BackwardCall bc{ctx, in_saved, out_saved, params, saved, gouts, slots};
  finish(dev);
  t0 = Clock::now();
  op.backward_input(bc);
  finish(dev);
  if (record) times.b.push_back(seconds_since(t0));

  if (!op.has_weights()) return;
  std::vector<stages::ParamGrad> pg;
  for (const Tensor& p : params)
    pg.push_back({p.defined() ? Tensor::empty(p.shape(), p.dtype(), dev) : Tensor(), false});
  std::vector<Tensor> w_ins(ins.size());
  for (size_t i = 0; i < ins.size(); ++i)
    if (op.weight_needs_input(i)) w_ins[i] = ins[i];
  stages::WeightCall wc{ctx, w_ins, out_saved, params, saved, gouts, pg};
  finish(dev);
  t0 = Clock::now();
  op.backward_weight(wc);
  finish(dev);
  if (record) times.w.push_back(seconds_since(t0));
}

// The largest id a model input may take: that of the first node reading it.
int64_t input_bound(const Graph& g, int value) {
  const std::vector<int>& readers = g.values[size_t(value)].consumers;
  return readers.empty() ? 1 : id_bound(g, g.nodes[size_t(readers.front())]);
}

// `mine` as the group's rank 0 has it, on every rank of the group.
bool rank0_says(transport::Communicator& group, bool mine) {
  memory::Tensor flag = memory::Tensor::full({1}, mine ? 1.0 : 0.0);
  group.broadcast(flag, 0)->wait();
  return flag.data<float>()[0] != 0;
}

}  // namespace

PassTimes time_passes(const Graph& g, const ProfileOptions& o, int micro_batches) {
  if (micro_batches < 1)
    throw InputError("micro-batches per pass: expected at least 1, found " +
                     std::to_string(micro_batches));
  int previous_threads = kernels::num_threads();
  if (o.threads > 0) kernels::set_num_threads(o.threads);
  auto graph = std::make_shared<const Graph>(g);
  stages::StageOptions so;
  so.device = o.device;
  so.tp = o.tp;
  so.spatial = o.spatial;
  // A 16-bit graph trains with f32 masters, as baton train runs it (the AdamW update and
  // its working copies are part of the pass).
  for (const stages::Param& p : g.params)
    if (p.dtype == memory::DType::bf16 || p.dtype == memory::DType::f16)
      so.master_dtype = memory::DType::f32;
  stages::Stage stage(graph, 0, graph->num_layers(), so);
  stage.init_params(1);  // as trained: no uninitialised memory (denormals, NaNs) in the ops
  stage.set_optimizer(stages::OptimizerConfig{});  // AdamW, as baton train's default
  std::vector<stages::TensorMap> inputs(static_cast<size_t>(micro_batches));
  for (int k = 0; k < micro_batches; ++k)
    for (int v : stage.model_inputs()) {
      const stages::Value& val = g.values[size_t(v)];
      inputs[size_t(k)][val.name] =
          random_tensor(val.type, o.batch, input_bound(g, v), 300 + uint64_t(k), o.device);
    }
  std::vector<double> times, computes, forwards, steps;
  double timed = 0;
  for (int pass = 0; pass < o.warmup + o.repeats; ++pass) {
    bool stop = o.pass_seconds > 0 && times.size() >= 2 && timed >= o.pass_seconds;
    if (o.pass_group != nullptr) stop = rank0_says(*o.pass_group, stop);
    if (stop) break;
    finish(o.device);
    const auto t0 = Clock::now();
    stage.zero_grad();
    double forward = 0;
    // F then B and W of each micro-batch, as one stage runs 1F1B on its own.
    for (int k = 0; k < micro_batches; ++k) {
      stages::MicroBatch mb;
      mb.index = k;
      mb.samples = mb.global_batch = o.batch;
      mb.loss_tokens = 1;
      const auto f0 = Clock::now();
      stage.forward(mb, inputs[size_t(k)]);
      finish(o.device);
      forward += seconds_since(f0);
      stage.backward(k);
    }
    stage.finish_grads();
    finish(o.device);
    const double compute = seconds_since(t0);
    // The optimizer's sweep over the parameters and their state evicts the weights from
    // the caches the ranks share, as every training step does.
    const auto s0 = Clock::now();
    stage.step(1.0);
    finish(o.device);
    if (pass >= o.warmup) {
      times.push_back(seconds_since(t0));
      timed += times.back();
      computes.push_back(compute);
      forwards.push_back(forward);
      steps.push_back(seconds_since(s0));
    }
  }
  kernels::set_num_threads(previous_threads);
  auto keep = [&](const std::vector<double>& v) { return o.mean ? mean(v) : median(v); };
  int64_t param_bytes = 0;
  for (const stages::Param& p : g.params)
    if (p.trainable)
      param_bytes += memory::shape_numel(p.shape) *
                     int64_t(memory::dtype_size(so.master_dtype.value_or(p.dtype)));
  return {keep(times), keep(computes), keep(forwards), keep(steps), param_bytes, int(times.size())};
}

namespace {

// Every node's F, B and W (those `skip` leaves) at o.batch, by node name; nodes of one
// signature timed once. Returns how many were timed.
int profile_ops(const Graph& g, const ProfileOptions& o,
                const std::function<bool(const Node&)>& skip,
                std::map<std::string, MeasuredCosts::Op>& out) {
  std::map<std::string, MeasuredCosts::Op> done;
  int timed = 0;
  for (const Node& n : g.nodes) {
    if (skip && skip(n)) continue;
    std::string sig = signature(g, n);
    auto it = done.find(sig);
    if (it == done.end()) {
      Times times;
      for (int k = 0; k < o.warmup; ++k)
        run_once(g, n, o.batch, 100 + uint64_t(k), o.device, times, false);
      for (int k = 0; k < o.repeats; ++k)
        run_once(g, n, o.batch, 200 + uint64_t(k), o.device, times, true);
      MeasuredCosts::Op m;
      m.op = n.op;
      auto keep = [&](const std::vector<double>& v) { return o.mean ? mean(v) : median(v); };
      m.forward = keep(times.f);
      m.backward_input = keep(times.b);
      m.backward_weight = keep(times.w);
      stages::OpCost c = n.impl->cost(o.batch);
      m.flops = c.forward_flops + c.backward_input_flops + c.backward_weight_flops;
      it = done.emplace(sig, m).first;
      ++timed;
    }
    out[n.name] = it->second;
  }
  return timed;
}

}  // namespace

void check_profile_options(const ProfileOptions& o) {
  if (o.batch < 1)
    throw InputError("--batch: expected at least 1 sample, found " + std::to_string(o.batch));
  if (o.repeats < 1)
    throw InputError("--repeats: expected at least 1, found " + std::to_string(o.repeats));
  if (o.warmup < 0)
    throw InputError("--warmup: expected 0 or more untimed runs, found " +
                     std::to_string(o.warmup));
}

MeasuredCosts profile_model(const Graph& g, const ProfileOptions& o, ProfileSummary* summary) {
  check_profile_options(o);
  auto start = Clock::now();
  int previous_threads = kernels::num_threads();
  if (o.threads > 0) kernels::set_num_threads(o.threads);
  MeasuredCosts out;
  out.model = g.name;
  out.batch = o.batch;
  out.threads = kernels::num_threads();
  const int timed = profile_ops(g, o, nullptr, out.ops);
  kernels::set_num_threads(previous_threads);
  if (o.in_step && o.warmup > 0) {
    // One by one on fresh inputs each op finds its data in the cache, and the stage's own
    // work between the ops (stashing, gradient slots, accumulation) is not timed: config
    // A's one-process step ran 1-6% above the sum of its ops, by a different amount each
    // profile (docs/benchmarks.md, "Step-time prediction"). A whole pass of the same
    // micro-batches measures both, in one figure steadier than the ops' sum.
    double ops = 0;
    for (const Node& n : g.nodes) {
      const MeasuredCosts::Op& m = out.ops.at(n.name);
      ops += m.forward + m.backward_input + m.backward_weight;
    }
    ProfileOptions whole = o;
    whole.warmup = 1;
    whole.pass_seconds = kPassSeconds;
    const PassTimes t = time_passes(g, whole, kPassMicroBatches);
    if (ops > 0) out.in_step = t.compute / (kPassMicroBatches * ops);
    // AdamW streams the parameters (read, write), their gradients (read) and its two
    // moments (read, write): the bytes the cost model's optimizer step counts.
    if (t.step > 0 && t.param_bytes > 0)
      out.memory_bandwidth = std::clamp((3.0 + 2.0 * 2) * double(t.param_bytes) / t.step,
                                        MeasuredCosts::kBandwidthMin, MeasuredCosts::kBandwidthMax);
    // Never a file the reader refuses: a ratio this far off means the op times and the
    // passes saw different machines (a load that came or went meanwhile).
    if (!(out.in_step >= MeasuredCosts::kInStepMin && out.in_step <= MeasuredCosts::kInStepMax)) {
      char m[200];
      std::snprintf(m, sizeof m,
                    "profile: in whole passes the ops took %.4gx their time one by one (expected "
                    "%g to %g): the machine's load changed while profiling; profile again",
                    out.in_step, MeasuredCosts::kInStepMin, MeasuredCosts::kInStepMax);
      throw RuntimeError(m);
    }
  }
  if (summary != nullptr) {
    summary->distinct_ops = timed;
    summary->seconds = seconds_since(start);
  }
  return out;
}

std::shared_ptr<Graph> tensor_parallel_shard(const Graph& g, int t, int index) {
  const std::vector<int> degrees(size_t(g.num_layers()), t);
  const Sharding s = plan_sharding(g, degrees, {}, "--tp " + std::to_string(t));
  return build_physical(g, s, std::vector<int>(degrees.size(), index));
}

double tp_collective_from_pass(const Graph& g, const MeasuredCosts& costs, int t, double shard,
                               double whole) {
  CostModel model(std::make_shared<const Graph>(g), Machine{}, &costs);
  const CostTable& split = model.table(t, costs.batch);
  int collectives = 0;
  for (const LayerCost& l : split.layers)
    collectives += l.tp_forward_collectives + l.tp_backward_collectives;
  if (collectives == 0 || whole <= 0) return 0;
  // F, B and W of each micro-batch as the cost model has them (the analytic collectives
  // included); the measured passes of the whole model say how much slower the ops ran.
  const double slowdown =
      whole / (kPassMicroBatches * model.table(1, costs.batch).total_time(false));
  const double modelled = kPassMicroBatches * split.total_time(false);
  return std::max(0.0, (shard / slowdown - modelled) / (kPassMicroBatches * collectives));
}

std::shared_ptr<Graph> spatial_tile(const Graph& g, int s) {
  return build_spatial(g, plan_spatial(g, s, "--spatial " + std::to_string(s)), 0);
}

double spatial_exchange_from_pass(const Graph& g, const MeasuredCosts& costs, int s, double tile,
                                  double whole) {
  const SpatialSplit split = plan_spatial(g, s, "--spatial " + std::to_string(s));
  const SpatialExchanges ex = spatial_exchanges(g, split, 0, g.num_layers());
  if (ex.forward + ex.backward == 0 || whole <= 0) return 0;
  CostModel model(std::make_shared<const Graph>(g), Machine{}, &costs);
  const CostTable& t = model.table(1, costs.batch);
  const double slowdown = whole / (kPassMicroBatches * t.total_time(false));
  // A tile's F, B and W as the cost model has them (schedule_costs' spatial stage).
  const double halo =
      spatial_halo_bytes(g, split, 0, g.num_layers(), costs.batch) / model.machine().tp_bandwidth;
  const double modelled = t.total_time(false) / s + 2 * halo;
  return std::max(0.0, (tile / slowdown - kPassMicroBatches * modelled) /
                           (kPassMicroBatches * (ex.forward + ex.backward)));
}

void profile_tensor_parallel(const Graph& g, const ProfileOptions& o, int t, MeasuredCosts& costs) {
  check_profile_options(o);
  if (t < 2)
    throw InputError("--tp: expected a tensor-parallel degree of at least 2, found " +
                     std::to_string(t));
  const std::shared_ptr<Graph> shard = tensor_parallel_shard(g, t, 0);
  int previous_threads = kernels::num_threads();
  if (o.threads > 0) kernels::set_num_threads(o.threads);
  // An op that communicates needs its group: it is not timed here.
  const auto communicates = [](const Node& n) {
    const stages::OpCost c = n.impl->cost(1);
    return c.forward_comm_bytes > 0 || c.backward_comm_bytes > 0;
  };
  // Twice, each op's lower median kept. The shard's ops have no passes of their own to
  // calibrate them (they take the whole model's in_step), and a burst of other work on
  // the host during the one timing put config A's shard 30% above its passes (in one
  // profile of eleven; docs/formats/costs.md, tp_collective).
  std::map<std::string, MeasuredCosts::Op>& ops = costs.tp_ops[t];
  std::map<std::string, MeasuredCosts::Op> again;
  profile_ops(*shard, o, communicates, ops);
  profile_ops(*shard, o, communicates, again);
  for (auto& [name, op] : ops) {
    const MeasuredCosts::Op& other = again.at(name);
    op.forward = std::min(op.forward, other.forward);
    op.backward_input = std::min(op.backward_input, other.backward_input);
    op.backward_weight = std::min(op.backward_weight, other.backward_weight);
  }
  kernels::set_num_threads(previous_threads);
}

}  // namespace baton::partitioner
