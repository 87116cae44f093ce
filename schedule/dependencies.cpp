#include "schedule/dependencies.h"

#include <algorithm>

namespace baton::schedule {

namespace {

using K = ActionKind;

// Kinds indexed per (stage, micro-batch) pair: F, B, W, BW and the four transfers.
constexpr int kPairKinds = 8;

}  // namespace

bool DependencyGraph::in_range(const Action& a) const {
  if (static_cast<int>(a.kind) >= kNumActionKinds) return false;
  if (a.kind == ActionKind::optimizer_step) return true;
  if (a.stage < 0 || a.stage >= num_stages_) return false;
  if (!has_micro_batch(a.kind)) return true;
  if (a.micro_batch < 0 || a.micro_batch >= s_->num_micro_batches) return false;
  return s_->num_directions == 1 ||
         a.micro_batch / mb_per_direction_ == a.stage / stages_per_direction_;
}

void required_actions(const Schedule& s, int rank, const Action& a, bool lowered, bool has_reduce,
                      std::vector<Action>& out) {
  const int b = a.micro_batch, st = a.stage;
  auto add = [&](K k, int mb, int stage) { out.push_back(make_action(k, mb, stage)); };
  auto crosses = [&](int other) {
    return lowered && s.placement[size_t(other)] != s.placement[size_t(st)];
  };
  auto all_weight_grads = [&](int stage) {
    const int per = s.micro_batches_per_direction(), d = stage_direction(s, stage);
    for (int mb = d * per; mb < (d + 1) * per; ++mb) add(K::backward_weight, mb, stage);
  };
  if (a.kind == K::optimizer_step) {
    for (int stage = 0; stage < s.num_stages(); ++stage) {
      if (s.placement[size_t(stage)] != rank) continue;
      if (has_reduce)
        add(K::reduce_gradients, -1, stage);
      else
        all_weight_grads(stage);
    }
    return;
  }
  if (st < 0 || st >= s.num_stages()) return;
  const int prev = prev_stage(s, st), next = next_stage(s, st);
  switch (a.kind) {
    case K::forward:
      if (prev >= 0) crosses(prev) ? add(K::recv_activation, b, st) : add(K::forward, b, prev);
      break;
    case K::backward_input:
    case K::full_backward:
      add(K::forward, b, st);
      if (next >= 0) crosses(next) ? add(K::recv_gradient, b, st) : add(K::backward_input, b, next);
      break;
    case K::backward_weight:
      add(K::backward_input, b, st);
      break;
    case K::send_activation:
      add(K::forward, b, st);
      break;
    case K::recv_activation:
      if (prev >= 0) add(K::send_activation, b, prev);
      break;
    case K::send_gradient:
      add(K::backward_input, b, st);
      break;
    case K::recv_gradient:
      if (next >= 0) add(K::send_gradient, b, next);
      break;
    case K::reduce_gradients:
      all_weight_grads(st);
      break;
    case K::optimizer_step:
      break;
  }
}

int DependencyGraph::slot(ActionKind k, int mb, int stage) const {
  return (stage * s_->num_micro_batches + mb) * kPairKinds + static_cast<int>(k);
}

const Action& DependencyGraph::action(int node) const {
  ActionRef r = ref(node);
  return s_->ranks[size_t(r.rank)][size_t(r.index)];
}

int DependencyGraph::find(const Action& key, bool exact) const {
  if (key.kind == ActionKind::optimizer_step) return -1;  // per rank: see step_index_
  if (!in_range(key)) return -1;
  if (key.kind == ActionKind::reduce_gradients) return reduce_index_[size_t(key.stage)];
  int n = pair_index_[size_t(slot(key.kind, key.micro_batch, key.stage))];
  if (n < 0 && !exact &&
      (key.kind == ActionKind::backward_input || key.kind == ActionKind::backward_weight))
    n = pair_index_[size_t(slot(ActionKind::full_backward, key.micro_batch, key.stage))];
  return n;
}

DependencyGraph::DependencyGraph(const Schedule& s) : s_(&s) {
  check_header(s, "schedule");
  num_stages_ = s.num_stages();
  stages_per_direction_ = s.stages_per_direction();
  mb_per_direction_ = s.micro_batches_per_direction();
  const int p = s.num_ranks;
  offset_.assign(size_t(p) + 1, 0);
  for (int r = 0; r < p; ++r)
    offset_[size_t(r) + 1] = offset_[size_t(r)] + int(s.ranks[size_t(r)].size());
  const int n = offset_.back();
  rank_of_.resize(size_t(n));
  pair_index_.assign(size_t(s.num_stages()) * size_t(s.num_micro_batches) * kPairKinds, -1);
  reduce_index_.assign(size_t(s.num_stages()), -1);
  step_index_.assign(size_t(p), -1);

  for (int r = 0; r < p; ++r) {
    const auto& list = s.ranks[size_t(r)];
    for (int i = 0; i < int(list.size()); ++i) {
      const int node_id = offset_[size_t(r)] + i;
      rank_of_[size_t(node_id)] = r;
      const Action& a = list[size_t(i)];
      lowered_ = lowered_ || is_transfer(a.kind);
      has_reduce_ = has_reduce_ || a.kind == ActionKind::reduce_gradients;
      if (!in_range(a)) continue;
      int* cell = a.kind == ActionKind::optimizer_step ? &step_index_[size_t(r)]
                  : a.kind == ActionKind::reduce_gradients
                      ? &reduce_index_[size_t(a.stage)]
                      : &pair_index_[size_t(slot(a.kind, a.micro_batch, a.stage))];
      if (*cell >= 0)
        duplicates_.emplace_back(*cell, node_id);
      else
        *cell = node_id;
    }
  }

  dep_begin_.resize(size_t(n) + 1);
  deps_.reserve(size_t(n) * 2);
  std::vector<Action> keys;
  for (int node_id = 0; node_id < n; ++node_id) {
    dep_begin_[size_t(node_id)] = int(deps_.size());
    const int r = rank_of_[size_t(node_id)];
    const Action& a = s.ranks[size_t(r)][size_t(node_id - offset_[size_t(r)])];
    if (!in_range(a)) continue;
    keys.clear();
    required_actions(s, r, a, lowered_, has_reduce_, keys);
    for (const Action& k : keys) {
      int d = find(k);
      if (d >= 0) deps_.push_back(d);
    }
  }
  dep_begin_[size_t(n)] = int(deps_.size());
}

Progress run_in_order(const DependencyGraph& g) {
  const Schedule& s = g.schedule();
  const int p = s.num_ranks, n = g.num_nodes();
  Progress out;
  out.position.assign(size_t(p), 0);
  out.waiting_for.assign(size_t(p), -1);
  out.order.reserve(size_t(n));
  std::vector<char> done(size_t(n), 0);
  // Each waiting rank sits in a singly linked list headed at the node it waits for.
  std::vector<int> wait_head(size_t(n), -1), next_waiter(size_t(p), -1);
  std::vector<int> work(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) work[size_t(r)] = p - 1 - r;  // pop rank 0 first
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    out.waiting_for[size_t(r)] = -1;
    const int size = int(s.ranks[size_t(r)].size());
    int& pos = out.position[size_t(r)];
    while (pos < size) {
      const int node_id = g.node(r, pos);
      // A composite (an overlapped F and the backward after it) starts as one: it waits
      // until both halves' inputs are there.
      const int width = is_composite(s.ranks[size_t(r)], size_t(pos)) ? 2 : 1;
      int blocker = -1;
      for (int k = 0; k < width && blocker < 0; ++k)
        for (int d : g.dependencies(node_id + k))
          if (!done[size_t(d)] && d != node_id) {
            blocker = d;
            break;
          }
      if (blocker >= 0) {
        out.waiting_for[size_t(r)] = blocker;
        next_waiter[size_t(r)] = wait_head[size_t(blocker)];
        wait_head[size_t(blocker)] = r;
        break;
      }
      for (int k = 0; k < width; ++k) {
        const int done_id = node_id + k;
        done[size_t(done_id)] = 1;
        out.order.push_back(done_id);
        ++pos;
        for (int w = wait_head[size_t(done_id)]; w >= 0; w = next_waiter[size_t(w)])
          work.push_back(w);
        wait_head[size_t(done_id)] = -1;
      }
    }
  }
  out.complete = int(out.order.size()) == n;
  return out;
}

}  // namespace baton::schedule
