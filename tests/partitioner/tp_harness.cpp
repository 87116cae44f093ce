#include "tp_harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "engine/rank_engine.h"
#include "kernels/ops.h"
#include "stages/model.h"
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
    if (memory::is_floating(val.type.dtype)) {  // images: uniform in [-1, 1)
      std::vector<double> xs(size_t(memory::shape_numel(shape)));
      for (auto& x : xs) x = double(rng() >> 11) * 0x1.0p-52 - 1.0;
      in[val.name] = Tensor::from_vector(xs, shape).to(val.type.dtype);
      continue;
    }
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
  const stages::Value& targets =
      g.values[size_t(g.nodes[size_t(g.values[size_t(g.loss)].producer)].inputs[1])];
  m.loss_tokens = double(m.global_batch * memory::shape_numel(targets.type.shape));
  m.step = 3;
  return m;
}

Tensor to_f64(const Tensor& t) {
  return t.to(memory::DType::f64).contiguous();
}

// Runs the micro-batches (F, B, W each) on a stage; returns the losses.
std::vector<double> train(Stage& st, const Graph& g, const Graph& logical, const RunSpec& spec) {
  std::vector<double> losses;
  st.zero_grad();
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    TensorMap out = st.forward(micro_batch(spec, mb, logical), make_inputs(logical, spec, mb));
    losses.push_back(
        out.at(g.values[size_t(g.loss)].name).to(memory::DType::f64).to_vector<double>()[0]);
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

// max |element| of `local` outside the pieces of `p` (its padding), 0 when there is none.
double padding_max(const stages::Param& p, const Tensor& local) {
  if (!p.is_shard()) return 0;
  Tensor rest = to_f64(local).clone();
  for (const stages::ParamPiece& piece : p.pieces) {
    Tensor view = rest;
    for (size_t d = 0; d < piece.shape.size(); ++d)
      view = view.narrow(int64_t(d), piece.local_offsets[d], piece.shape[d]);
    view.zero_();
  }
  double m = 0;
  for (double x : rest.to_vector<double>()) m = std::max(m, std::isnan(x) ? INFINITY : std::abs(x));
  return m;
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

void expect_same_run(const RunOutput& want, const RunOutput& got, double tol, bool final_params) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::abs(want.losses[i]))
        << "micro-batch " << i;
  ASSERT_EQ(want.params.size(), got.params.size());
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << name;
    EXPECT_EQ(rel_diff(got.params.at(name), t), 0.0) << "initial " << name;
    EXPECT_LE(rel_diff(got.grads.at(name), want.grads.at(name)), tol) << "gradient of " << name;
    if (final_params) {
      EXPECT_LE(rel_diff(got.final_params.at(name), want.final_params.at(name)), tol)
          << "final " << name;
    }
  }
  EXPECT_LE(got.replica_mismatch, tol);
  EXPECT_EQ(got.padding_max, 0.0) << "a shard's padding is not zero";
}

std::shared_ptr<Graph> load_in_dtype(const nlohmann::json& model, memory::DType dtype,
                                     const std::string& name) {
  stages::LoadOptions o;
  o.float_dtype = dtype;
  return std::make_shared<Graph>(stages::load_model_json(model, name, o));
}

RunOutput run_logical(std::shared_ptr<const Graph> g, const RunSpec& spec) {
  kernels::set_num_threads(1);
  StageOptions o;
  o.seed = spec.seed;
  o.recompute_layers = spec.recompute_layers;
  Stage st(g, 0, g->num_layers(), o);
  RunOutput out;
  for (int id : st.param_ids())
    out.params[g->params[size_t(id)].name] = to_f64(st.param(id)).clone();
  out.losses = train(st, *g, *g, spec);
  for (int id : st.param_ids()) {
    out.grads[g->params[size_t(id)].name] = to_f64(st.grad(id));
    out.final_params[g->params[size_t(id)].name] = to_f64(st.param(id)).clone();
  }
  return out;
}

RunOutput run_tensor_parallel(std::shared_ptr<const Graph> g, int tp,
                              const SplitOverrides& overrides, const RunSpec& spec) {
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
          for (int which = 0; which < 3; ++which) {
            auto& dst = which == 0 ? out.params : which == 1 ? out.grads : out.final_params;
            const Tensor& local = which == 0   ? params.at(p.name)
                                  : which == 1 ? st.grad(id)
                                               : st.param(id);
            out.padding_max = std::max(out.padding_max, padding_max(p, local));
            if (!p.is_shard() && dst.count(p.name)) {
              out.replica_mismatch =
                  std::max(out.replica_mismatch, rel_diff(local, dst.at(p.name)));
              continue;
            }
            if (!dst.count(p.name))
              dst[p.name] = Tensor::zeros(p.logical_shape, memory::DType::f64);
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
      out.replica_mismatch =
          std::max(out.replica_mismatch, std::abs(losses[size_t(r)][i] - losses[0][i]));
  out.losses = losses[0];
  return out;
}

RunOutput run_spatial(std::shared_ptr<const Graph> g, int degree, const RunSpec& spec) {
  kernels::set_num_threads(1);
  SpatialSplit split = plan_spatial(*g, degree, "test");
  std::vector<transport::CommPtr> world = transport::make_local_world(degree);
  RunOutput out;
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::vector<double>> losses{size_t(degree)};
  std::vector<std::thread> threads;
  for (int r = 0; r < degree; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = build_spatial(*g, split, r);
        StageOptions o;
        o.seed = spec.seed;
        o.recompute_layers = spec.recompute_layers;
        o.spatial = world[size_t(r)].get();
        Stage st(pg, 0, pg->num_layers(), o);
        std::map<std::string, Tensor> params;
        for (int id : st.param_ids()) params[pg->params[size_t(id)].name] = st.param(id).clone();
        st.zero_grad();
        for (int mb = 0; mb < spec.micro_batches; ++mb) {
          TensorMap in = make_inputs(*g, spec, mb);
          for (int v : g->inputs) {
            if (!split.tiled[size_t(v)]) continue;
            const std::string& name = g->values[size_t(v)].name;
            const int64_t h = in.at(name).size(2) / degree;
            in[name] = in.at(name).narrow(2, int64_t(r) * h, h).contiguous();
          }
          TensorMap res = st.forward(micro_batch(spec, mb, *g), in);
          losses[size_t(r)].push_back(res.at(pg->values[size_t(pg->loss)].name)
                                          .to(memory::DType::f64)
                                          .to_vector<double>()[0]);
          st.backward(mb);
        }
        st.finish_grads();
        std::lock_guard<std::mutex> lock(mu);
        for (int id : st.param_ids()) {
          const stages::Param& p = pg->params[size_t(id)];
          const bool partial = split.partial_grad[size_t(id)];
          for (int which = 0; which < 3; ++which) {
            auto& dst = which == 0 ? out.params : which == 1 ? out.grads : out.final_params;
            Tensor local = to_f64(which == 0   ? params.at(p.name)
                                  : which == 1 ? st.grad(id)
                                               : st.param(id));
            if (!dst.count(p.name)) {
              dst[p.name] = local.clone();
            } else if (which == 1 && partial) {
              Tensor& acc = dst.at(p.name);
              kernels::add_inplace(acc, local);
            } else {
              out.replica_mismatch =
                  std::max(out.replica_mismatch, rel_diff(local, dst.at(p.name)));
            }
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
  for (int r = 1; r < degree; ++r)
    for (size_t i = 0; i < losses[0].size(); ++i)
      out.replica_mismatch =
          std::max(out.replica_mismatch, std::abs(losses[size_t(r)][i] - losses[0][i]));
  out.losses = losses[0];
  return out;
}

// ---- a whole plan, through the engine ----

namespace {

// One rank of the plan: engine::RankEngine (the executor on the plan's lowered schedule)
// runs one step; its parameters are taken before it, its gradients after the reductions
// (before the optimizer changes anything), the micro-batches' losses from the step.
void run_plan_rank(std::shared_ptr<const ResolvedPlan> plan, transport::CommPtr world,
                   const RunSpec& spec, RunOutput& out, std::mutex& mu,
                   std::vector<double>& losses) {
  const ResolvedPlan& r = *plan;
  RunSpec global = spec;
  global.micro_batches = r.plan.micro_batches * r.plan.dp;
  global.samples = r.plan.micro_batch_size;
  engine::RankEngineOptions o;
  o.seed = spec.seed;
  o.inputs = [&r, global](const stages::MicroBatch& mb, const std::vector<std::string>& names,
                          TensorMap& in) {
    TensorMap all = make_inputs(*r.graph, global, int(mb.sample_offset / mb.samples));
    for (const std::string& name : names) in[name] = all.at(name);
  };
  engine::RankEngine engine(plan, std::move(world), o);
  const stages::Graph& pg = engine.graph();
  std::map<std::string, Tensor> params, grads;
  for (const auto& [s, st] : engine.stages())
    for (int id : st->param_ids())
      params[pg.params[size_t(id)].name] = to_f64(st->param(id)).clone();
  engine.executor().set_before_optimizer([&](int64_t) {
    for (const auto& [s, st] : engine.stages())  // every holder has the reduced sum
      for (int id : st->param_ids())
        grads[pg.params[size_t(id)].name] = to_f64(st->grad(id)).clone();
  });
  const engine::StepStats stats = engine.step(3);
  std::lock_guard<std::mutex> lock(mu);
  if (engine.rank() == 0) losses = stats.micro_batch_losses;
  for (const auto& [s, st] : engine.stages())
    for (int id : st->param_ids()) {
      const stages::Param& p = pg.params[size_t(id)];
      for (int which = 0; which < 2; ++which) {
        auto& dst = which == 0 ? out.params : out.grads;
        const Tensor& local = which == 0 ? params.at(p.name) : grads.at(p.name);
        if (!dst.count(p.name)) {
          dst[p.name] = Tensor::zeros(p.logical_shape, memory::DType::f64);
          place(dst.at(p.name), p, local);
          continue;
        }
        // Already placed by another rank or stage: a replicated parameter or another
        // copy of the same block must agree; another block fills its place.
        if (!p.is_shard())
          out.replica_mismatch = std::max(out.replica_mismatch, rel_diff(local, dst.at(p.name)));
        else
          place(dst.at(p.name), p, local);
      }
    }
}

}  // namespace

RunOutput run_plan(const ResolvedPlan& r, const RunSpec& spec) {
  kernels::set_num_threads(1);
  auto plan = std::make_shared<const ResolvedPlan>(r);
  const int world_size = r.layout.world();
  std::vector<transport::CommPtr> world = transport::make_local_world(world_size);
  RunOutput out;
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        run_plan_rank(plan, world[size_t(rank)], spec, out, mu, out.losses);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      world[size_t(rank)].reset();  // a failed rank leaves: the others' waits fail too
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace baton::partitioner::testing
