#include "tp_harness.h"

#include <cmath>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "kernels/ops.h"
#include "transport/local.h"

namespace baton::partitioner::testing {

using memory::Tensor;
using stages::Graph;
using stages::MicroBatch;
using stages::Stage;
using stages::StageOptions;
using stages::TensorMap;

namespace {

// The vocabulary the model's integer inputs index: the last dimension of the logits
// (of the LOGICAL graph: a physical graph's logits may be split).
int64_t vocab_of(const Graph& g) {
  const stages::Node& ce = g.nodes[size_t(g.values[size_t(g.loss)].producer)];
  return g.values[size_t(ce.inputs[0])].type.shape.back();
}

TensorMap make_inputs(const Graph& g, const RunSpec& spec, int mb) {
  TensorMap in;
  std::mt19937_64 rng(spec.data_seed * 1000 + uint64_t(mb));
  int64_t vocab = vocab_of(g);
  for (int v : g.inputs) {
    const stages::Value& val = g.values[size_t(v)];
    memory::Shape shape = val.type.with_batch(spec.samples);
    std::vector<int32_t> ids(size_t(memory::shape_numel(shape)));
    for (auto& x : ids) x = int32_t(rng() % uint64_t(vocab));
    in[val.name] = Tensor::from_vector(ids, shape);
  }
  return in;
}

MicroBatch micro_batch(const RunSpec& spec, int mb, const Graph& g) {
  MicroBatch m;
  m.index = mb;
  m.samples = spec.samples;
  m.sample_offset = mb * spec.samples;
  m.global_batch = spec.samples * spec.micro_batches;
  const stages::Value& targets = g.values[size_t(g.nodes[size_t(g.values[size_t(g.loss)].producer)].inputs[1])];
  m.loss_tokens = double(m.global_batch * memory::shape_numel(targets.type.shape));
  m.step = 3;
  return m;
}

Tensor to_f64(const Tensor& t) { return t.to(memory::DType::f64).contiguous(); }

// Runs the micro-batches (F, B, W each) on a stage; returns the losses.
std::vector<double> train(Stage& st, const Graph& g, const Graph& logical, const RunSpec& spec) {
  std::vector<double> losses;
  st.zero_grad();
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    TensorMap out = st.forward(micro_batch(spec, mb, logical), make_inputs(logical, spec, mb));
    losses.push_back(out.at(g.values[size_t(g.loss)].name).to(memory::DType::f64).to_vector<double>()[0]);
    st.backward(mb);
  }
  st.finish_grads();
  return losses;
}

// Copies a local tensor's pieces into the whole tensor.
void place(Tensor& whole, const stages::Param& p, const Tensor& local) {
  Tensor src = to_f64(local);
  if (!p.is_shard()) {
    whole.copy_from(src);
    return;
  }
  for (const stages::ParamPiece& piece : p.pieces) {
    Tensor dst = whole, s = src;
    for (size_t d = 0; d < piece.shape.size(); ++d) {
      dst = dst.narrow(int64_t(d), piece.global_offsets[d], piece.shape[d]);
      s = s.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
    }
    dst.copy_from(s.contiguous());
  }
}

}  // namespace

double rel_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = to_f64(a).to_vector<double>(), y = to_f64(b).to_vector<double>();
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    d = std::max(d, std::abs(x[i] - y[i]));
    m = std::max(m, std::abs(y[i]));
  }
  return d / m;
}

RunOutput run_logical(std::shared_ptr<const Graph> g, const RunSpec& spec) {
  kernels::set_num_threads(1);
  StageOptions o;
  o.seed = spec.seed;
  o.recompute_layers = spec.recompute_layers;
  Stage st(g, 0, g->num_layers(), o);
  RunOutput out;
  for (int id : st.param_ids()) out.params[g->params[size_t(id)].name] = to_f64(st.param(id));
  out.losses = train(st, *g, *g, spec);
  for (int id : st.param_ids()) out.grads[g->params[size_t(id)].name] = to_f64(st.grad(id));
  return out;
}

RunOutput run_tensor_parallel(std::shared_ptr<const Graph> g, int tp, const SplitOverrides& overrides,
                              const RunSpec& spec) {
  kernels::set_num_threads(1);
  std::vector<int> layer_tp(size_t(g->num_layers()), tp);
  Sharding sh = plan_sharding(*g, layer_tp, overrides, "test");
  std::vector<transport::CommPtr> world = transport::make_local_world(tp);
  RunOutput out;
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::vector<double>> losses{size_t(tp)};
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = build_physical(*g, sh, std::vector<int>(size_t(g->num_layers()), r));
        StageOptions o;
        o.seed = spec.seed;
        o.recompute_layers = spec.recompute_layers;
        o.tp = world[size_t(r)].get();
        Stage st(pg, 0, pg->num_layers(), o);
        std::map<std::string, Tensor> params;
        for (int id : st.param_ids()) params[pg->params[size_t(id)].name] = st.param(id).clone();
        losses[size_t(r)] = train(st, *pg, *g, spec);
        std::lock_guard<std::mutex> lock(mu);
        for (int id : st.param_ids()) {
          const stages::Param& p = pg->params[size_t(id)];
          for (int which = 0; which < 2; ++which) {
            auto& dst = which == 0 ? out.params : out.grads;
            const Tensor& local = which == 0 ? params.at(p.name) : st.grad(id);
            if (!p.is_shard() && dst.count(p.name)) {
              out.replica_mismatch = std::max(out.replica_mismatch, rel_diff(local, dst.at(p.name)));
              continue;
            }
            if (!dst.count(p.name)) dst[p.name] = Tensor::zeros(p.logical_shape, memory::DType::f64);
            place(dst.at(p.name), p, local);
          }
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  for (int r = 1; r < tp; ++r)
    for (size_t i = 0; i < losses[0].size(); ++i)
      out.replica_mismatch = std::max(out.replica_mismatch, std::abs(losses[size_t(r)][i] - losses[0][i]));
  out.losses = losses[0];
  return out;
}

}  // namespace baton::partitioner::testing
