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

}  // namespace baton::partitioner::testing

// ---- a whole plan ----

#include "partitioner/groups.h"
#include "partitioner/routing.h"

namespace baton::partitioner::testing {

namespace {

uint64_t transfer_tag(int64_t mb, int stage, const Transfer& t, int value_index) {
  uint64_t phase = t.phase == Transfer::Phase::activation ? 0 : 1;
  return ((((uint64_t(mb) * 32 + uint64_t(stage)) * 2 + phase) * 8 + uint64_t(value_index)) * 16) +
         uint64_t(t.part);
}

class RankRunner {
 public:
  RankRunner(const ResolvedPlan& r, int rank, transport::Communicator& world, const RunSpec& spec)
      : r_(r), rank_(rank), world_(world), spec_(spec) {}

  void run(RunOutput& out, std::mutex& mu, std::vector<double>& losses) {
    RankView view = rank_view(r_, rank_);
    pg_ = physical_graph(r_, rank_);
    std::shared_ptr<transport::Communicator> tp;
    if (view.tp_degree > 1) tp = world_.split(view.tp_group);
    for (const RankStage& st : view.stages) {
      StageOptions o;
      o.seed = spec_.seed;
      o.recompute_layers = st.recompute;
      o.tp = tp.get();
      stages_[st.stage] = std::make_unique<Stage>(pg_, st.first_layer, st.last_layer, o);
      stages_[st.stage]->zero_grad();
    }
    const int M = r_.plan.micro_batches, d = view.coord.dp;
    RunSpec global = spec_;
    global.micro_batches = M * r_.plan.dp;
    global.samples = r_.plan.micro_batch_size;
    // A bidirectional schedule sends micro-batch i down the stages of its direction only.
    auto runs = [&](int s, int i) {
      return schedule::stage_direction(r_.schedule, s) ==
             schedule::micro_batch_direction(r_.schedule, i);
    };
    for (int i = 0; i < M; ++i) {
      int64_t mb = int64_t(d) * M + i;
      for (auto& [s, st] : stages_)
        if (runs(s, i)) forward(s, *st, mb, global, losses);
    }
    for (int i = 0; i < M; ++i) {
      int64_t mb = int64_t(d) * M + i;
      for (auto it = stages_.rbegin(); it != stages_.rend(); ++it)
        if (runs(it->first, i)) backward(it->first, *it->second, mb);
    }
    for (auto& w : pending_) w->wait();
    pending_.clear();
    keep_.clear();
    for (auto& [s, st] : stages_) st->finish_grads();
    reduce_gradients();
    std::lock_guard<std::mutex> lock(mu);
    collect(out);
  }

 private:
  bool is_mine(int stage) const { return stages_.count(stage) > 0; }
  int next_of(int s) const { return schedule::next_stage(r_.schedule, s); }
  int prev_of(int s) const { return schedule::prev_stage(r_.schedule, s); }

  int value_index(int stage, const std::string& name) const {
    const stages::Graph& g = *r_.graph;
    auto cut = g.cut_values(r_.chunk_last[size_t(r_.chunk_of_stage[size_t(stage)])]);
    for (size_t i = 0; i < cut.size(); ++i)
      if (g.values[size_t(cut[i])].name == name) return int(i);
    return 0;
  }

  // Receives what crosses the boundary after `boundary` in `phase`, assembling parts.
  TensorMap receive(int boundary, Transfer::Phase phase, int64_t mb) {
    TensorMap in;
    std::vector<transport::WorkPtr> works;
    std::vector<Tensor> slices;
    for (const Transfer& t : boundary_transfers(r_, rank_, boundary)) {
      if (t.kind != Transfer::Kind::recv || t.phase != phase) continue;
      if (!in.count(t.value)) {
        const stages::Value& v = pg_->value(t.value);
        in[t.value] = Tensor::empty(v.type.with_batch(r_.plan.micro_batch_size), v.type.dtype);
      }
      Tensor& full = in[t.value];
      auto [b, e] = part_range(full.numel(), full.size(-1), t.part, t.parts);
      slices.push_back(full.view({full.numel()}).narrow(0, b, e - b));
      works.push_back(world_.irecv(slices.back(), t.peer,
                                   transfer_tag(mb, boundary, t, value_index(boundary, t.value))));
    }
    for (auto& w : works) w->wait();
    return in;
  }

  void send(int boundary, Transfer::Phase phase, int64_t mb, const TensorMap& values) {
    for (const Transfer& t : boundary_transfers(r_, rank_, boundary)) {
      if (t.kind != Transfer::Kind::send || t.phase != phase) continue;
      const Tensor& full = values.at(t.value);
      auto [b, e] = part_range(full.numel(), full.size(-1), t.part, t.parts);
      Tensor slice = full.contiguous().view({full.numel()}).narrow(0, b, e - b);
      keep_.push_back(slice);
      pending_.push_back(world_.isend(
          slice, t.peer, transfer_tag(mb, boundary, t, value_index(boundary, t.value))));
    }
  }

  void forward(int s, Stage& st, int64_t mb, const RunSpec& global, std::vector<double>& losses) {
    TensorMap in = make_inputs(*r_.graph, global, int(mb));
    int prev = prev_of(s);
    if (prev >= 0) {
      TensorMap got = is_mine(prev) ? local_out_.at({prev, mb})
                                    : receive(prev, Transfer::Phase::activation, mb);
      in.insert(got.begin(), got.end());
    }
    TensorMap out = st.forward(micro_batch(global, int(mb), *r_.graph), in);
    int next = next_of(s);
    if (next < 0) {
      if (rank_ == r_.layout.rank(r_.layout.coord(rank_).dp, r_.layout.coord(rank_).pp, 0))
        losses[size_t(mb)] = out.at(r_.graph->values[size_t(r_.graph->loss)].name)
                                 .to(memory::DType::f64)
                                 .to_vector<double>()[0];
      return;
    }
    if (is_mine(next))
      local_out_[{s, mb}] = out;
    else
      send(s, Transfer::Phase::activation, mb, out);
  }

  void backward(int s, Stage& st, int64_t mb) {
    TensorMap grads;
    int next = next_of(s);
    if (next >= 0)
      grads = is_mine(next) ? local_grad_.at({s, mb}) : receive(s, Transfer::Phase::gradient, mb);
    TensorMap gin = st.backward(mb, grads);
    int prev = prev_of(s);
    if (prev < 0) return;
    if (is_mine(prev))
      local_grad_[{prev, mb}] = gin;
    else
      send(prev, Transfer::Phase::gradient, mb, gin);
  }

  void reduce_gradients() {
    std::map<std::vector<int>, std::shared_ptr<transport::Communicator>> comms;
    for (const GradientGroup& gg : gradient_groups(r_, rank_)) {
      // The parameter's gradient: summed over this rank's stages holding it first.
      int id = pg_->find_param(gg.name);
      Tensor total;
      for (int s : gg.local_stages) {
        const Tensor& g = stages_.at(s)->grad(id);
        if (!total.defined())
          total = g.clone();
        else
          kernels::add_inplace(total, g);
      }
      if (gg.ranks.size() > 1) {
        auto it = comms.find(gg.ranks);
        if (it == comms.end()) it = comms.emplace(gg.ranks, world_.split(gg.ranks)).first;
        it->second->all_reduce(total, transport::ReduceOp::sum)->wait();
      }
      grads_[gg.name] = total;
    }
  }

  void collect(RunOutput& out) {
    for (auto& [s, st] : stages_)
      for (int id : st->param_ids()) {
        const stages::Param& p = pg_->params[size_t(id)];
        for (int which = 0; which < 2; ++which) {
          auto& dst = which == 0 ? out.params : out.grads;
          const Tensor& local = which == 0 ? st->param(id) : grads_.at(p.name);
          if (!dst.count(p.name)) {
            dst[p.name] = Tensor::zeros(p.logical_shape, memory::DType::f64);
            place(dst.at(p.name), p, local);
            continue;
          }
          // Already placed by another rank: a replicated parameter or another rank's
          // copy of the same block must agree; another block fills its place.
          if (!p.is_shard()) {
            out.replica_mismatch = std::max(out.replica_mismatch, rel_diff(local, dst.at(p.name)));
          } else {
            place(dst.at(p.name), p, local);
          }
        }
      }
  }

  const ResolvedPlan& r_;
  int rank_;
  transport::Communicator& world_;
  const RunSpec& spec_;
  std::shared_ptr<stages::Graph> pg_;
  std::map<int, std::unique_ptr<Stage>> stages_;
  std::map<std::pair<int, int64_t>, TensorMap> local_out_, local_grad_;
  std::vector<transport::WorkPtr> pending_;
  std::vector<Tensor> keep_;
  std::map<std::string, Tensor> grads_;
};

}  // namespace

RunOutput run_plan(const ResolvedPlan& r, const RunSpec& spec) {
  kernels::set_num_threads(1);
  const int world_size = r.layout.world();
  std::vector<transport::CommPtr> world = transport::make_local_world(world_size);
  RunOutput out;
  std::mutex mu;
  std::exception_ptr error;
  std::vector<double> losses(size_t(r.plan.dp * r.plan.micro_batches), 0.0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        RankRunner(r, rank, *world[size_t(rank)], spec).run(out, mu, losses);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  out.losses = losses;
  return out;
}

}  // namespace baton::partitioner::testing
