#include "engine/executor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "engine/detail/gossip.h"
#include "engine/detail/grad_reducer.h"
#include "engine/detail/input_loader.h"
#include "engine/detail/local_sgd.h"
#include "engine/loop.h"
#include "kernels/ops.h"
#include "memory/error.h"
#include "schedule/forward_only.h"
#include "schedule/validate.h"
#include "stages/param_owner.h"

namespace baton::engine {

using memory::Tensor;
using schedule::Action;
using schedule::ActionKind;
using schedule::Schedule;
using schedule::TimelineEvent;
using schedule::Transfer;
using stages::TensorMap;
using K = ActionKind;

namespace {

constexpr uint64_t kMaxTag = (uint64_t(1) << 27) - 1;  // the transport's user tags

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using Key = std::pair<int, int>;  // (stage, micro-batch)

// A micro-batch's loss (an f64 scalar on its stage's device) on the host.
double loss_value(const Tensor& loss) {
  return loss.to(memory::Device::cpu()).to(memory::DType::f64).to_vector<double>()[0];
}

// Fault injection for the hang tests (tests/engine/test_processes.cpp; docs/engine.md,
// "Failures"): BATON_TEST_STOP="<rank>:<point>:<step>" makes the process whose BATON_RANK
// is <rank> stop itself (SIGSTOP: alive but silent) once, in step <step> (from 0), at
// <point>: "forward" just before its first forward of the step (its tensor-parallel
// peers wait inside the first TP collective of their forward), "reduce" just after its
// first gradient reduction of the step is posted (the others wait inside that
// collective), "optimizer" inside the optimizer step (the loss and norm reduced, no
// parameter updated yet). Unset (always, outside those tests): nothing happens.
void stop_here_if_asked(const char* point, int64_t step) {
  struct Stop {
    int rank = -1;
    char point[16] = {};
    long long step = -1;
  };
  static const Stop want = [] {
    Stop w;
    const char* v = std::getenv("BATON_TEST_STOP");
    const char* r = std::getenv("BATON_RANK");
    if (v == nullptr || r == nullptr || std::atoi(r) < 0) return w;
    if (std::sscanf(v, "%d:%15[a-z]:%lld", &w.rank, w.point, &w.step) != 3 ||
        w.rank != std::atoi(r))
      w.rank = -1;
    return w;
  }();
  static bool done = false;
  if (want.rank < 0 || done || want.step != step || std::string(want.point) != point) return;
  done = true;
  ::raise(SIGSTOP);
}

}  // namespace

// What is in flight or handed over between actions of one step.
struct Executor::Pending {
  struct Recv {
    TensorMap tensors;
    std::vector<transport::WorkPtr> works;
    // Blocks of rows of a re-tiled image, received apart and copied into place.
    struct Rows {
      std::string value;
      int64_t at = 0;
      Tensor block;
    };
    std::vector<Rows> rows;
    bool posted = false;
    int peer = -1;  // world rank of the first sender (the timeline's peer)
  };
  struct Send {
    transport::WorkPtr work;
    Tensor keep;  // the buffer must outlive the send
    Action action;
    double start = 0;
  };
  std::map<size_t, Recv> recvs;  // by action index
  size_t next_post = 0;          // index into recv_positions_
  size_t first_open = 0;         // first RECV not yet executed (index into recv_positions_)
  std::map<Key, TensorMap> act_in, grad_in;    // waiting for the F / B that consumes them
  std::map<Key, TensorMap> act_out, grad_out;  // waiting for their SEND
  std::vector<Send> sends;
  std::map<int, double> reduce_start;  // stage -> when its REDUCE ran
  void clear() {
    recvs.clear();
    next_post = first_open = 0;
    act_in.clear();
    grad_in.clear();
    act_out.clear();
    grad_out.clear();
    reduce_start.clear();
  }
};

Executor::Executor(ExecutorConfig config)
    : cfg_(std::move(config)), pending_(std::make_unique<Pending>()) {
  t_origin_ = steady_ns();
  const Schedule& s = cfg_.schedule;
  check_valid(s, "executor schedule");
  if (!has_transfers(s) && s.num_ranks > 1)
    for (const auto& r : s.ranks)
      for (const Action& a : r)
        if (is_compute(a.kind)) {
          // A compute-only schedule of several ranks cannot move activations: lower it.
          bool cross = false;
          int prev = prev_stage(s, a.stage), next = next_stage(s, a.stage);
          cross |= prev >= 0 && s.placement[size_t(prev)] != s.placement[size_t(a.stage)];
          cross |= next >= 0 && s.placement[size_t(next)] != s.placement[size_t(a.stage)];
          if (cross)
            throw InputError(
                "executor schedule: not lowered (no SEND/RECV actions); call lower() first");
        }
  if (cfg_.rank < 0 || cfg_.rank >= s.num_ranks)
    throw InputError("executor: rank " + std::to_string(cfg_.rank) + " outside the schedule's " +
                     std::to_string(s.num_ranks) + " ranks");
  actions_ = s.ranks[size_t(cfg_.rank)];
  bool has_step = false;
  for (const Action& a : actions_) has_step |= a.kind == K::optimizer_step;
  if (cfg_.evaluation) {
    if (!schedule::is_forward_only(s) || !cfg_.grad_groups.empty())
      throw InputError(
          "executor: an evaluation executor runs a forward-only schedule and reduces no gradient");
  } else if (!has_step) {
    throw InputError("executor schedule: rank " + std::to_string(cfg_.rank) +
                     " has no STEP (lower() adds it)");
  }
  const stages::Graph* graph = nullptr;
  for (int st : stages_of_rank(s, cfg_.rank)) {
    auto it = cfg_.stages.find(st);
    if (it == cfg_.stages.end() || !it->second)
      throw InputError("executor: no Stage for schedule stage " + std::to_string(st) + " of rank " +
                       std::to_string(cfg_.rank));
    if (graph && graph != &it->second->graph())
      throw InputError("executor: the stages of a rank must share one graph");
    graph = &it->second->graph();
  }
  if (cfg_.stages.size() != stages_of_rank(s, cfg_.rank).size())
    throw InputError("executor: Stages given for schedule stages the rank does not hold");
  if (cfg_.recv_ahead < 1) cfg_.recv_ahead = 1;
  if (cfg_.loss_slots <= 0) cfg_.loss_slots = cfg_.first_micro_batch + s.num_micro_batches;
  if (cfg_.num_layers <= 0) cfg_.num_layers = graph->num_layers();
  if (cfg_.global_batch <= 0) cfg_.global_batch = cfg_.loss_slots * cfg_.micro_batch_size;
  for (const auto& [b, routes] : cfg_.routes)
    for (const Transfer& r : routes)
      if (r.value_index < 0 || r.value_index >= schedule::kMaxBoundaryValues || r.parts < 1 ||
          r.parts > schedule::kMaxValueParts || r.part < 0 || r.part >= r.parts || !cfg_.p2p ||
          r.peer < 0 || r.peer >= cfg_.p2p->size())
        throw InputError("executor: bad route of boundary " + std::to_string(b) + " for value '" +
                         r.value + "'");
  if (schedule::message_tag_count(s) > kMaxTag)
    throw InputError("executor: " + std::to_string(s.num_micro_batches) + " micro-batches x " +
                     std::to_string(s.num_stages()) +
                     " stages need more message tags than the transport has");

  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (is_recv(a.kind)) recv_positions_.push_back(i);
    if (a.kind == K::backward_weight || a.kind == K::full_backward) last_weight_[a.stage] = i;
  }
  std::set<std::string> names;
  for (const auto& [st, stage] : cfg_.stages)
    for (int v : stage->model_inputs()) names.insert(stage->graph().values[size_t(v)].name);
  input_names_.assign(names.begin(), names.end());
  if (!input_names_.empty()) {
    if (!cfg_.inputs)
      throw InputError("executor: the stages read model inputs but no input function was given");
    loader_ = std::make_unique<detail::InputLoader>(
        cfg_.inputs, input_names_, cfg_.input_ahead, [this] { return now(); }, cfg_.input_staging);
  }
  reducer_ =
      std::make_unique<detail::GradReducer>(cfg_.grad_groups, cfg_.stages, cfg_.bucket_bytes);
  if (!cfg_.evaluation) {
    if (cfg_.dp_sync.max_staleness < 0 || (cfg_.dp_sync.max_staleness > 0 && cfg_.dp_sync.local))
      throw InputError("executor: a parameter server's staleness " +
                       std::to_string(cfg_.dp_sync.max_staleness) + " with local SGD or below 0");
    if (cfg_.dp_sync.max_staleness > 0 && cfg_.post_validated)
      throw InputError("executor: a parameter server's stale pulls with a post-validated step");
    reducer_->set_staleness(cfg_.dp_sync.max_staleness);
  }
  if (cfg_.dp_sync.local && !cfg_.evaluation) {
    if (cfg_.dp_sync.replica < 0 || cfg_.dp_sync.replica >= cfg_.dp_sync.replicas)
      throw InputError("executor: local SGD replica " + std::to_string(cfg_.dp_sync.replica) +
                       " of " + std::to_string(cfg_.dp_sync.replicas));
    if (cfg_.dp_sync.gossip)
      gossip_ = std::make_unique<detail::Gossip>(cfg_.dp_sync, cfg_.stages);
    else
      local_sgd_ = std::make_unique<detail::LocalSgd>(cfg_.dp_sync, cfg_.stages);
  }
}

Executor::~Executor() = default;

bool Executor::optimizer_sharded(int stage, int param) const {
  return reducer_->shard_of(stage, param).has_value();
}

double Executor::now() const {
  return double(steady_ns() - t_origin_) * 1e-9;
}

stages::MicroBatch Executor::micro_batch(int mb, int64_t step) const {
  stages::MicroBatch m;
  m.index = mb;
  m.sample_offset = (cfg_.first_micro_batch + mb) * cfg_.micro_batch_size;
  m.samples = cfg_.micro_batch_size;
  m.global_batch = cfg_.global_batch;
  m.loss_tokens = cfg_.loss_tokens;
  m.step = step;
  if (cfg_.loss_scaler) m.loss_scale = cfg_.loss_scaler->scale();
  return m;
}

void Executor::set_recording(bool on) {
  recording_ = on;
  if (loader_) loader_->set_recording(on);
}

void Executor::record(const Action& a, int lane, double start, double end, int peer) {
  if (!recording_) return;
  TimelineEvent e;
  e.rank = cfg_.timeline_rank;
  e.lane = lane;
  e.kind = a.kind;
  e.micro_batch = a.micro_batch;
  e.stage = a.stage;
  e.peer = peer;
  e.start = start;
  e.end = end;
  events_.push_back(e);
}

// ---- transfers ----

void Executor::post_recv(size_t index, int64_t) {
  const Action& a = actions_[index];
  Pending::Recv& rv = pending_->recvs[index];
  if (rv.posted) return;
  rv.posted = true;
  const schedule::Crossing c = schedule::transfer_crossing(cfg_.schedule, a);
  auto it = cfg_.routes.find(c.boundary);
  if (it == cfg_.routes.end()) return;
  const stages::Stage& st = *cfg_.stages.at(a.stage);
  for (const Transfer& r : it->second) {
    if (r.kind != Transfer::Kind::recv || r.phase != c.phase) continue;
    Tensor& full = rv.tensors[r.value];
    if (!full.defined()) {
      const stages::Value& v = st.graph().value(r.value);
      full = Tensor::empty(v.type.with_batch(cfg_.micro_batch_size), v.type.dtype, st.device());
    }
    Tensor slice;
    if (r.rows > 0 && r.rows < full.size(2)) {
      memory::Shape s = full.shape();
      s[2] = r.rows;
      slice = Tensor::empty(s, full.dtype(), full.device());
      rv.rows.push_back({r.value, r.rows_to, slice});
    } else if (r.rows > 0) {
      slice = full;
    } else {
      auto [b, e] = schedule::part_range(full.numel(), full.size(-1), r.part, r.parts);
      slice = full.view({full.numel()}).narrow(0, b, e - b);
    }
    if (rv.peer < 0) rv.peer = r.peer;
    rv.works.push_back(cfg_.p2p->irecv(slice, r.peer, schedule::message_tag(cfg_.schedule, a, r)));
  }
}

void Executor::wait_recv(size_t index) {
  const Action& a = actions_[index];
  double t0 = now();
  post_recv(index, 0);
  Pending::Recv rv = std::move(pending_->recvs.at(index));
  pending_->recvs.erase(index);
  for (auto& w : rv.works) w->wait();
  for (const auto& b : rv.rows)
    rv.tensors.at(b.value).narrow(2, b.at, b.block.size(2)).copy_from(b.block);
  Key key{a.stage, a.micro_batch};
  TensorMap& dst = a.kind == K::recv_activation ? pending_->act_in[key] : pending_->grad_in[key];
  for (auto& [name, t] : rv.tensors) dst[name] = std::move(t);
  record(a, 1, t0, now(), rv.peer);  // a world rank, like a send's (a.peer is the pipeline rank)
}

void Executor::do_send(const Action& a, double t0) {
  const schedule::Crossing c = schedule::transfer_crossing(cfg_.schedule, a);
  Key key{a.stage, a.micro_batch};
  auto& src_map = a.kind == K::send_activation ? pending_->act_out : pending_->grad_out;
  auto found = src_map.find(key);
  if (found == src_map.end())
    throw std::logic_error("executor: " + to_token(a) + " has nothing to send");
  TensorMap values = std::move(found->second);
  src_map.erase(found);
  auto it = cfg_.routes.find(c.boundary);
  if (it == cfg_.routes.end()) return;
  for (const Transfer& r : it->second) {
    if (r.kind != Transfer::Kind::send || r.phase != c.phase) continue;
    auto v = values.find(r.value);
    if (v == values.end())
      throw std::logic_error("executor: " + to_token(a) + " has no value '" + r.value +
                             "' to send");
    Tensor full = v->second.contiguous();
    Tensor slice;
    if (r.rows > 0) {
      slice = r.rows == full.size(2) ? full : full.narrow(2, r.rows_from, r.rows).contiguous();
    } else {
      auto [b, e] = schedule::part_range(full.numel(), full.size(-1), r.part, r.parts);
      slice = full.view({full.numel()}).narrow(0, b, e - b);
    }
    Pending::Send snd;
    snd.work = cfg_.p2p->isend(slice, r.peer, schedule::message_tag(cfg_.schedule, a, r));
    snd.keep = slice;
    snd.action = a;
    snd.action.peer = r.peer;
    snd.start = t0;
    pending_->sends.push_back(std::move(snd));
  }
}

void Executor::poll_sends() {
  auto& sends = pending_->sends;
  size_t kept = 0;
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].work->test()) {
      record(sends[i].action, 1, sends[i].start, now(), sends[i].action.peer);
      continue;
    }
    if (kept != i) sends[kept] = std::move(sends[i]);
    ++kept;
  }
  sends.resize(kept);
}

// ---- compute ----

void Executor::compute(const Action& a, size_t index, int64_t step) {
  const Schedule& s = cfg_.schedule;
  stages::Stage& st = *cfg_.stages.at(a.stage);
  const int prev = prev_stage(s, a.stage), next = next_stage(s, a.stage);
  const bool last_w = last_weight_.count(a.stage) && last_weight_.at(a.stage) == index;
  const int stage_id = a.stage;
  stages::Stage::ParamReadyFn ready;
  if (last_w) ready = [this, stage_id](int id) { reducer_->ready(stage_id, id); };
  const Key key{a.stage, a.micro_batch};
  switch (a.kind) {
    case K::forward: {
      TensorMap in;
      if (!st.model_inputs().empty()) {
        bool waited = false;
        const double asked = now();
        TensorMap x = loader_->take(step, a.micro_batch, &waited);
        if (waited && recording_) {
          compute_began_ = now();
          TimelineEvent e;
          e.lane = 0;
          e.micro_batch = a.micro_batch;
          e.stage = a.stage;
          e.start = asked;
          e.end = compute_began_;
          e.label = "INPUT_WAIT";
          add_event(std::move(e));
        }
        for (int v : st.model_inputs()) {
          const std::string& name = st.graph().values[size_t(v)].name;
          in[name] = x.at(name);
        }
      }
      if (prev >= 0) {
        auto it = pending_->act_in.find(key);
        if (it == pending_->act_in.end())
          throw std::logic_error("executor: " + to_token(a) + " before its input arrived");
        for (auto& [name, t] : it->second) in[name] = std::move(t);
        pending_->act_in.erase(it);
      }
      TensorMap out = st.forward(micro_batch(a.micro_batch, step), in, !cfg_.evaluation);
      if (next < 0) {
        const stages::Graph& g = st.graph();
        // Kept on the stage's device: read at the step's end, not here (a host wait).
        losses_[size_t(a.micro_batch)] = out.at(g.values[size_t(g.loss)].name);
      } else if (s.placement[size_t(next)] == cfg_.rank) {
        pending_->act_in[{next, a.micro_batch}] = std::move(out);
      } else {
        pending_->act_out[key] = std::move(out);
      }
      return;
    }
    case K::backward_input:
    case K::full_backward: {
      TensorMap grads;
      if (next >= 0) {
        auto it = pending_->grad_in.find(key);
        if (it == pending_->grad_in.end())
          throw std::logic_error("executor: " + to_token(a) +
                                 " before its output gradient arrived");
        grads = std::move(it->second);
        pending_->grad_in.erase(it);
      }
      TensorMap gin;
      if (a.kind == K::backward_input)
        gin = st.backward_input(a.micro_batch, grads);
      else if (ready)
        gin = st.backward(a.micro_batch, grads, ready);
      else
        gin = st.backward(a.micro_batch, grads);
      if (prev >= 0) {
        if (s.placement[size_t(prev)] == cfg_.rank)
          pending_->grad_in[{prev, a.micro_batch}] = std::move(gin);
        else
          pending_->grad_out[key] = std::move(gin);
      }
      return;
    }
    case K::backward_weight:
      if (ready)
        st.backward_weight(a.micro_batch, ready);
      else
        st.backward_weight(a.micro_batch);
      return;
    default:
      throw std::logic_error("executor: not a compute action: " + to_token(a));
  }
}

// ---- the step ----

StepStats Executor::run_step(int64_t step, int64_t next_step) {
  const double t0 = now();
  const Schedule& s = cfg_.schedule;
  pending_->clear();
  if (!cfg_.evaluation) {
    for (auto& [id, st] : cfg_.stages) st->zero_grad();
    reducer_->begin_step();
    if (local_sgd_) local_sgd_->begin_step();
  }
  losses_.assign(size_t(s.num_micro_batches), Tensor());

  if (loader_) {
    // The micro-batches in the order this rank's forwards read them, with their counts.
    auto queue = [&](int64_t st) {
      std::vector<int> order;
      std::map<int, int> uses;
      for (const Action& a : actions_)
        if (a.kind == K::forward && !cfg_.stages.at(a.stage)->model_inputs().empty())
          if (uses[a.micro_batch]++ == 0) order.push_back(a.micro_batch);
      for (int mb : order) loader_->enqueue(micro_batch(mb, st), uses[mb]);
    };
    if (step != queued_step_) queue(step);
    queued_step_ = step;
    if (next_step >= 0 && next_step != step) {
      queue(next_step);
      queued_step_ = next_step;
    }
  }

  StepStats stats;
  stats.step = step;
  for (size_t i = 0; i < actions_.size(); ++i) {
    // Receives: the next recv_ahead ones are posted before anything else runs.
    auto& P = *pending_;
    while (P.first_open < recv_positions_.size() && recv_positions_[P.first_open] < i)
      ++P.first_open;
    while (P.next_post < recv_positions_.size() &&
           P.next_post < P.first_open + size_t(cfg_.recv_ahead))
      post_recv(recv_positions_[P.next_post++], step);

    const Action& a = actions_[i];
    const double ta = now();
    if (is_compute(a.kind)) {
      if (a.kind == K::forward) stop_here_if_asked("forward", step);
      compute_began_ = ta;
      reducer_->hold(true);
      compute(a, i, step);
      reducer_->hold(false);
      record(a, 0, compute_began_, now());
    } else if (is_recv(a.kind)) {
      wait_recv(i);
    } else if (is_send(a.kind)) {
      do_send(a, ta);
    } else if (a.kind == K::reduce_gradients) {
      reducer_->start_ready();
      pending_->reduce_start[a.stage] = ta;
      stop_here_if_asked("reduce", step);
    } else if (a.kind == K::optimizer_step) {
      finish_step(stats, ta);
    }
    poll_sends();
  }
  if (cfg_.evaluation) finish_evaluation(stats);
  if (next_step < 0) queued_step_ = -1;  // this step's inputs are consumed: none queued
  if (recording_ && loader_)
    for (const detail::InputLoader::Made& m : loader_->drain_made()) {
      TimelineEvent e;
      e.lane = 2;
      e.micro_batch = int(m.index);
      e.start = m.start;
      e.end = m.end;
      e.label = "LOAD";
      add_event(std::move(e));
    }
  stats.seconds = now() - t0;
  return stats;
}

void Executor::finish_evaluation(StepStats& stats) {
  // The micro-batches' losses, one contributor each, summed over the job in order (as
  // finish_step does, without the norm).
  const Schedule& s = cfg_.schedule;
  std::vector<double> v(size_t(cfg_.loss_slots), 0.0);
  if (cfg_.contribute_loss)
    for (int mb = 0; mb < s.num_micro_batches; ++mb)
      if (losses_[size_t(mb)].defined())
        v[size_t(cfg_.first_micro_batch + mb)] = loss_value(losses_[size_t(mb)]);
  // Freed now: kept until this executor's next run, the next evaluation, they would stay
  // allocated through the training steps between, beyond what the estimate counts.
  losses_.assign(losses_.size(), Tensor());
  if (cfg_.step_comm && cfg_.step_comm->size() > 1) {
    Tensor t = Tensor::from_vector(v, {int64_t(v.size())});
    cfg_.step_comm->all_reduce(t, transport::ReduceOp::sum)->wait();
    v = t.to_vector<double>();
  }
  stats.loss = 0;
  for (double x : v) stats.loss += x;
  stats.micro_batch_losses = v;
  stats.grad_norm = 0;
  for (auto& snd : pending_->sends) snd.work->wait();
  pending_->sends.clear();
}

// What an optimizer update overwrites on one stage: the elements of every trainable
// parameter it updates (its shard under ZeRO), their optimizer state and the stage's
// step count (AdamW's bias correction).
struct Executor::Backup {
  stages::Stage* stage = nullptr;
  int64_t steps = 0;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (the live tensor or slice, its copy)
};

std::vector<Executor::Backup> Executor::save_update_point() {
  std::vector<Backup> out;
  for (auto& [id, st] : cfg_.stages) {
    st->set_optimizer(st->optimizer());  // allocates missing state now; keeps what exists
    Backup b;
    b.stage = st;
    b.steps = st->optimizer_steps();
    for (int p : st->param_ids()) {
      if (!st->graph().params[size_t(p)].trainable) continue;
      const auto [begin, end] = st->optimizer_shard(p);
      if (end <= begin) continue;
      Tensor& value = st->param(p);
      Tensor live = value.view({value.numel()}).narrow(0, begin, end - begin);
      b.copies.emplace_back(live, live.clone());
      for (auto& [name, t] : st->optimizer_state(p)) b.copies.emplace_back(t, t.clone());
    }
    out.push_back(std::move(b));
  }
  return out;
}

void Executor::restore_update_point(std::vector<Backup>& saved) {
  for (Backup& b : saved) {
    for (auto& [live, copy] : b.copies) live.copy_from(copy);
    b.stage->set_optimizer_steps(b.steps);
    // Under mixed precision step() wrote the rejected update into the working copies too;
    // the next forward casts them again from the restored masters.
    b.stage->mark_working_stale();
  }
}

void Executor::update(double scale, double start, bool post_validated) {
  for (auto& [id, st] : cfg_.stages) st->step(scale);
  if (post_validated) record(make_action(K::optimizer_step, -1, -1), 0, start, now());
}

void Executor::finish_step(StepStats& stats, double t0) {
  const Schedule& s = cfg_.schedule;
  reducer_->finish();
  const double reduced = now();
  for (const auto& [stage, start] : pending_->reduce_start)
    record(make_action(K::reduce_gradients, -1, stage), 1, start, reduced);
  if (before_optimizer_) before_optimizer_(stats.step);

  // Norm pieces per graph layer (a parameter counts in the first layer using it, on the
  // stage holding that layer: Stage::grad_sum_squares_by_layer's rule) and the losses.
  // Local SGD: every replica its own block of norm pieces (its own norm clips it).
  const size_t L = size_t(cfg_.num_layers);
  const bool local = local_sgd_ != nullptr || gossip_ != nullptr;
  const size_t blocks = local ? size_t(cfg_.dp_sync.replicas) : 1;
  const size_t mine = local ? size_t(cfg_.dp_sync.replica) * L : 0;
  std::vector<double> v(L * blocks + size_t(cfg_.loss_slots), 0.0);
  // A sharded parameter (ZeRO) counts on every replica, each with the part it reduced.
  // The pieces are summed on the device together (one wait), then added in order.
  std::vector<Tensor> pieces;
  std::vector<size_t> slot;
  for (const auto& [stage, st] : cfg_.stages) {
    if (stage_direction(s, stage) != 0) continue;  // a DualPipe replica: counted once
    const stages::Graph& g = st->graph();
    for (int id : st->param_ids()) {
      if (!stages::owns_param(*st, id)) continue;
      if (cfg_.norm_counts && !cfg_.norm_counts(id)) continue;
      const size_t owner = size_t(stages::owner_layer(g.params[size_t(id)]));
      if (auto part = reducer_->shard_of(stage, id)) {
        if (part->second > part->first) {
          const Tensor& gr = st->grad(id);
          pieces.push_back(
              st->grad_sharded(id)
                  ? gr
                  : gr.view({gr.numel()}).narrow(0, part->first, part->second - part->first));
          slot.push_back(mine + owner);
        }
      } else if (cfg_.contribute_norm || local) {
        pieces.push_back(st->grad(id));
        slot.push_back(mine + owner);
      }
    }
  }
  const std::vector<double> each = kernels::sum_squares_each(pieces);
  for (size_t k = 0; k < each.size(); ++k) v[slot[k]] += each[k];
  if (cfg_.contribute_loss)
    for (int mb = 0; mb < s.num_micro_batches; ++mb)
      if (losses_[size_t(mb)].defined())
        v[L * blocks + size_t(cfg_.first_micro_batch + mb)] = loss_value(losses_[size_t(mb)]);
  Tensor combined;
  transport::WorkPtr combining;
  if (cfg_.step_comm && cfg_.step_comm->size() > 1) {
    combined = Tensor::from_vector(v, {int64_t(v.size())});
    combining = cfg_.step_comm->all_reduce(combined, transport::ReduceOp::sum);
  }
  // Post-validated: update now, unclipped, while the other ranks' pieces are on their way.
  // With loss scaling the early update unscales by the scale the gradients carry (what
  // decide_update gives when the clip does not trigger).
  std::vector<Backup> saved;
  const double early = cfg_.loss_scaler ? 1.0 / cfg_.loss_scaler->scale() : 1.0;
  if (cfg_.post_validated) {
    saved = save_update_point();
    update(early, t0, true);
  }
  if (combining) {
    combining->wait();
    v = combined.to_vector<double>();
  }
  double norm2 = 0, loss = 0, all2 = 0;
  for (size_t l = 0; l < L; ++l) norm2 += v[mine + l];
  for (size_t l = 0; l < L * blocks; ++l) all2 += v[l];
  for (size_t k = L * blocks; k < v.size(); ++k) loss += v[k];
  stats.micro_batch_losses.assign(v.begin() + std::ptrdiff_t(L * blocks), v.end());
  // Local SGD: the replica's gradient is the mean over its own samples, `replicas` times
  // what the loss (over the whole job's targets) gave it; its own norm clips it, and the
  // step reports the root mean square of the replicas' norms (the same on every rank).
  const double local_scale = local ? double(cfg_.dp_sync.replicas) : 1.0;
  stats.loss = loss;
  // An overflow on any replica (all2) skips the step everywhere, so scalers stay equal.
  const double own2 = local && !std::isfinite(all2) ? all2 : norm2 * local_scale * local_scale;
  const UpdateDecision d = decide_update(own2, cfg_.grad_clip, cfg_.loss_scaler);
  const double unscale = d.loss_scale > 0 ? d.loss_scale : 1.0;
  stats.grad_norm = local ? std::sqrt(all2 / double(blocks)) * local_scale / unscale : d.grad_norm;
  stats.loss_scale = d.loss_scale;
  stats.skipped = !d.apply;
  stop_here_if_asked("optimizer", stats.step);
  reducer_->install_masters();  // a parameter server's latest parts (staleness > 0)
  if (cfg_.post_validated) {    // (only with allreduce: local_scale is 1)
    // Validation: the update stands unless the global norm asks for another one.
    if (!d.apply || d.grad_scale != early) {
      const double tr = now();
      restore_update_point(saved);
      stats.rolled_back = true;
      if (d.apply) update(d.grad_scale, tr, true);
    }
    saved.clear();
  } else if (d.apply) {
    update(d.grad_scale * local_scale, t0, false);
  }
  reducer_->gather_params();
  if (local_sgd_) local_sgd_->after_step(stats.step);
  if (gossip_) gossip_->after_step(stats.step);
  // Every send of the step completes before the next one reuses anything.
  for (auto& snd : pending_->sends) {
    snd.work->wait();
    record(snd.action, 1, snd.start, now(), snd.action.peer);
  }
  pending_->sends.clear();
  if (!cfg_.post_validated) record(make_action(K::optimizer_step, -1, -1), 0, t0, now());
}

}  // namespace baton::engine
