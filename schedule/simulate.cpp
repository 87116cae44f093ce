#include "schedule/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>

#include "memory/error.h"
#include "schedule/dependencies.h"
#include "schedule/forward_only.h"
#include "schedule/validate.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

std::shared_ptr<const Schedule> checked(std::shared_ptr<const Schedule> s,
                                        const std::string& source) {
  if (!s) throw InputError(source + ": no schedule");
  check_header(*s, source);
  return s;
}

}  // namespace

Simulator::Simulator(Schedule s, const std::string& source)
    : Simulator(std::make_shared<const Schedule>(std::move(s)), source) {}

Simulator::Simulator(std::shared_ptr<const Schedule> s, const std::string& source)
    : s_(checked(std::move(s), source)) {
  Progress progress;
  int n = 0;
  {
    DependencyGraph graph(*s_);
    ValidationReport report = validate(*s_, graph, &progress);
    if (!report.ok) throw InputError(source + ": invalid schedule: " + report.to_string());
    chunks_ = chunks_per_rank(*s_);
    n = graph.num_nodes();
    offset_.resize(size_t(s_->num_ranks) + 1);
    for (int r = 0; r <= s_->num_ranks; ++r)
      offset_[size_t(r)] = r < s_->num_ranks ? graph.node(r, 0) : n;

    // Everything run() touches is laid out in execution order (positions).
    node_at_ = std::move(progress.order);
    pos_of_.resize(size_t(n));
    for (int i = 0; i < n; ++i) pos_of_[size_t(node_at_[size_t(i)])] = i;
    rank_.resize(size_t(n));
    stage_.resize(size_t(n));
    kind_.resize(size_t(n));
    composite_.assign(size_t(n), 0);
    link_.assign(size_t(n), -1);
    dep_begin_.resize(size_t(n) + 1);
    size_t edges = 0;
    for (int node = 0; node < n; ++node) edges += graph.dependencies(node).size();
    deps_.resize(edges);
    std::unordered_map<long long, int> links;
    const bool lowered = graph.lowered();
    size_t k = 0;
    for (int i = 0; i < n; ++i) {
      const int node = node_at_[size_t(i)];
      const ActionRef ref = graph.ref(node);
      const Action& a = graph.action(node);
      rank_[size_t(i)] = ref.rank;
      stage_[size_t(i)] = a.stage;
      kind_[size_t(i)] = a.kind;
      if (is_composite(s_->ranks[size_t(ref.rank)], size_t(ref.index))) {
        // run_in_order issues the two halves one after the other.
        composite_[size_t(i)] = 1;
        composite_[size_t(i) + 1] = 2;
      }
      dep_begin_[size_t(i)] = int(k);
      for (int d : graph.dependencies(node)) {
        const bool far =
            graph.ref(d).rank != ref.rank || graph.action(d).kind == K::reduce_gradients;
        deps_[k++] = (pos_of_[size_t(d)] << 1) | (far ? 1 : 0);
      }
      // The message this action puts on a link, if any: a send; in a compute-only
      // schedule, the compute whose output goes to another rank.
      int to_stage = -1;
      if (lowered) {
        if (a.kind == K::send_activation) to_stage = next_stage(*s_, a.stage);
        if (a.kind == K::send_gradient) to_stage = prev_stage(*s_, a.stage);
      } else if (a.kind == K::forward) {
        to_stage = next_stage(*s_, a.stage);
      } else if (a.kind == K::backward_input || a.kind == K::full_backward) {
        to_stage = prev_stage(*s_, a.stage);
      }
      if (to_stage >= 0 && s_->placement[size_t(to_stage)] != ref.rank) {
        const int dst = s_->placement[size_t(to_stage)];
        auto [it, fresh] =
            links.try_emplace(1LL * ref.rank * s_->num_ranks + dst, int(links.size()));
        if (fresh) link_dst_.push_back(dst);
        link_[size_t(i)] = it->second;
      }
    }
    dep_begin_[size_t(n)] = int(k);
    // A STEP is its rank's last action (the validator's rule).
    for (int r = 0; r < s_->num_ranks; ++r) {
      const auto& list = s_->ranks[size_t(r)];
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].kind == K::optimizer_step)
          step_pos_.push_back(pos_of_[size_t(offset_[size_t(r)] + int(i))]);
    }
    for (int i = 0; i < n; ++i)
      if (kind_[size_t(i)] == K::reduce_gradients) reduce_pos_.push_back(i);
  }
  start_.resize(size_t(n));
  end_.resize(size_t(n));
  avail_.resize(size_t(n));
  arrived_.resize(size_t(n));
  free_.resize(size_t(s_->num_ranks));
  mem_.resize(size_t(s_->num_ranks));
  live_.resize(size_t(s_->num_ranks));
  link_free_.resize(link_dst_.size());
  result_.ranks.resize(size_t(s_->num_ranks));
}

const Action& Simulator::action_at(size_t pos) const {
  const int node = node_at_[pos], r = rank_[pos];
  return s_->ranks[size_t(r)][size_t(node - offset_[size_t(r)])];
}

double Simulator::composite_duration(size_t f) const {
  const int st = stage_[f];
  if (!costs_.overlap_f_b.empty()) return scale_[f] * costs_.overlap_f_b[size_t(st)];
  const int sb = stage_[f + 1];
  double b = costs_.backward_input[size_t(sb)];
  if (kind_[f + 1] == K::full_backward) b += costs_.backward_weight[size_t(sb)];
  return scale_[f] * (costs_.forward[size_t(st)] + b);
}

double Simulator::duration(size_t pos) const {
  if (composite_[pos] == 1) return composite_duration(pos);
  if (composite_[pos] == 2) return composite_duration(pos - 1);
  const int st = stage_[pos];
  switch (kind_[pos]) {
    case K::forward:
      return scale_[pos] * costs_.forward[size_t(st)];
    case K::backward_input:
      return scale_[pos] * costs_.backward_input[size_t(st)];
    case K::backward_weight:
      return scale_[pos] * costs_.backward_weight[size_t(st)];
    case K::full_backward:
      return scale_[pos] * (costs_.backward_input[size_t(st)] + costs_.backward_weight[size_t(st)]);
    case K::optimizer_step:
      return scale_[pos] * costs_.step_time(rank_[pos]);
    default:
      return 0.0;
  }
}

double Simulator::start_time(int rank, int index) const {
  return start_[position(rank, index)];
}

void Simulator::action_times(double* start, double* end) const {
  // Nodes are numbered rank by rank in list order, so node k is the k-th action.
  const size_t n = pos_of_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t u = size_t(pos_of_[k]);
    end[k] = end_[u];
    start[k] = start_[u];
  }
}

const SimResult& Simulator::run(const Costs& c) {
  c.check(s_->num_stages(), s_->num_ranks);
  costs_ = c;  // reuses its vectors' capacity after the first run
  scale_.assign(rank_.size(), 1.0);
  if (c.core_ranks.empty()) return sweep();
  // Start from every process busy all the time (what a fixed slowdown assumes).
  const int R = s_->num_ranks;
  for (size_t u = 0; u < scale_.size(); ++u) {
    double full = 1.0;
    for (const std::vector<double>& core : c.core_ranks)
      if (core[size_t(rank_[u])] > 0) {
        double all = 0.0;
        for (int q = 0; q < R; ++q) all += core[size_t(q)];
        full = std::max(full, all);
      }
    scale_[u] = full;
  }
  constexpr int kMaxSweeps = 100;
  for (int i = 0; i < kMaxSweeps; ++i) {
    sweep();
    if (rescale() < 1e-3) break;
  }
  return sweep();
}

double Simulator::rescale() {
  const int R = s_->num_ranks;
  busy_start_.resize(size_t(R));
  busy_end_.resize(size_t(R));
  busy_sum_.resize(size_t(R));
  for (int r = 0; r < R; ++r) {
    busy_start_[size_t(r)].clear();
    busy_end_[size_t(r)].clear();
    busy_sum_[size_t(r)].assign(1, 0.0);
  }
  // A rank's positions come in its list order, so its intervals come sorted.
  auto busy = [&](size_t u) {
    return composite_[u] != 2 && (is_compute(kind_[u]) || kind_[u] == K::optimizer_step);
  };
  for (size_t u = 0; u < rank_.size(); ++u) {
    if (!busy(u)) continue;
    const size_t r = size_t(rank_[u]);
    const double len = duration(u);
    busy_start_[r].push_back(start_[u]);
    busy_end_[r].push_back(end_[u]);
    busy_sum_[r].push_back(busy_sum_[r].back() + len);
  }
  // Rank q's busy time within [a, b].
  auto overlap = [&](int q, double a, double b) {
    const std::vector<double>& st = busy_start_[size_t(q)];
    const std::vector<double>& en = busy_end_[size_t(q)];
    const std::vector<double>& sum = busy_sum_[size_t(q)];
    // Intervals [i, j) end after a and start before b.
    const size_t i = size_t(std::upper_bound(en.begin(), en.end(), a) - en.begin());
    const size_t j = size_t(std::lower_bound(st.begin(), st.end(), b) - st.begin());
    if (i >= j) return 0.0;
    return sum[j] - sum[i] - std::max(0.0, a - st[i]) - std::max(0.0, en[j - 1] - b);
  };
  double moved = 0.0;
  for (size_t u = 0; u < rank_.size(); ++u) {
    if (!busy(u)) continue;
    const double len = duration(u);
    if (!(len > 0)) continue;
    const double a = start_[u], b = end_[u];
    double load = 1.0;
    for (const std::vector<double>& core : costs_.core_ranks) {
      if (!(core[size_t(rank_[u])] > 0)) continue;
      double here = 0.0;
      for (int q = 0; q < R; ++q)
        if (core[size_t(q)] > 0) here += core[size_t(q)] * (q == rank_[u] ? len : overlap(q, a, b));
      load = std::max(load, here / len);
    }
    moved = std::max(moved, std::abs(load - scale_[u]) / scale_[u]);
    scale_[u] = 0.5 * (scale_[u] + load);
  }
  return moved;
}

const SimResult& Simulator::sweep() {
  const Costs& c = costs_;
  const double* fwd = c.forward.data();
  const double* bin = c.backward_input.data();
  const double* bwt = c.backward_weight.data();
  const double* act = c.activation_bytes.empty() ? nullptr : c.activation_bytes.data();
  const double* act_b =
      c.activation_bytes_after_b.empty() ? act : c.activation_bytes_after_b.data();
  const double* msg = c.message_bytes.empty() ? nullptr : c.message_bytes.data();
  const double* red = c.reduce.empty() ? nullptr : c.reduce.data();
  const double inv_bw = c.bandwidth > 0 ? 1.0 / c.bandwidth : 0.0;

  std::fill(free_.begin(), free_.end(), 0.0);
  std::fill(mem_.begin(), mem_.end(), 0.0);
  std::fill(live_.begin(), live_.end(), 0);
  std::fill(link_free_.begin(), link_free_.end(), 0.0);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (RankStats& r : result_.ranks) {
    r = RankStats{};
    r.start = kInf;
  }
  double makespan = 0.0;
  // An evaluation schedule's forwards keep nothing. (A training schedule's first backward
  // comes a few positions in, so this look costs next to nothing.)
  const bool forward_only = std::none_of(kind_.begin(), kind_.end(), [](K k) {
    return k == K::backward_input || k == K::backward_weight || k == K::full_backward;
  });
  const double* const times[2] = {end_.data(), avail_.data()};
  const double* ovl = c.overlap_f_b.empty() ? nullptr : c.overlap_f_b.data();
  double composite_start = 0.0;  // of the composite whose backward half comes next

  const size_t n = rank_.size();
  for (size_t u = 0; u < n; ++u) {
    const int r = rank_[u], st = stage_[u];
    double t = free_[size_t(r)];
    arrived_[u] = t;
    for (int k = dep_begin_[u]; k < dep_begin_[u + 1]; ++k) {
      const int d = deps_[size_t(k)];
      const double ready = times[d & 1][d >> 1];
      t = ready > t ? ready : t;
    }
    const uint8_t comp = composite_[u];
    if (comp == 1) {  // both halves' inputs must be there
      for (int k = dep_begin_[u + 1]; k < dep_begin_[u + 2]; ++k) {
        const int d = deps_[size_t(k)];
        const double ready = times[d & 1][d >> 1];
        t = ready > t ? ready : t;
      }
      composite_start = t;
    } else if (comp == 2) {
      t = composite_start;
    }
    double dur = 0.0;
    RankStats& rs = result_.ranks[size_t(r)];
    const K kind = kind_[u];
    switch (kind) {
      case K::forward:
        dur = fwd[st];
        if (act) {
          rs.peak_bytes = std::max(rs.peak_bytes, mem_[size_t(r)] + act[st]);
          if (!forward_only) mem_[size_t(r)] += act[st];
        }
        rs.peak_micro_batches = std::max(rs.peak_micro_batches, double(live_[size_t(r)] + 1));
        if (!forward_only) ++live_[size_t(r)];  // an evaluation forward keeps nothing
        break;
      case K::backward_input:
        dur = bin[st];
        if (act) mem_[size_t(r)] -= act[st] - act_b[st];
        break;
      case K::backward_weight:
        dur = bwt[st];
        if (act) mem_[size_t(r)] -= act_b[st];
        --live_[size_t(r)];
        break;
      case K::full_backward:
        dur = bin[st] + bwt[st];
        if (act) mem_[size_t(r)] -= act[st];
        --live_[size_t(r)];
        break;
      case K::optimizer_step:
        dur = c.step_time(r);
        break;
      default:
        break;
    }
    dur *= scale_[u];
    if (comp == 1) {
      const int sb = stage_[u + 1];
      dur =
          scale_[u] *
          (ovl ? ovl[st] : fwd[st] + bin[sb] + (kind_[u + 1] == K::full_backward ? bwt[sb] : 0.0));
    } else if (comp == 2) {
      dur = end_[u - 1] - t;  // ends with its forward half; its time is counted there
      rs.start = std::min(rs.start, t);
    }
    const double e = t + dur;
    start_[u] = t;
    end_[u] = e;
    free_[size_t(r)] = e;
    if (comp == 2) {
      // busy already holds the composite's time
    } else if (dur > 0 || is_compute(kind) || kind == K::optimizer_step) {
      rs.busy += dur;
      rs.start = std::min(rs.start, t);
      rs.end = std::max(rs.end, e);
    }
    double avail = e;
    if (kind == K::reduce_gradients && red) avail = e + red[st];
    const int l = link_[u];
    if (l >= 0) {
      // Activations cross the boundary after their stage, gradients the one before.
      const bool activation = kind == K::forward || kind == K::send_activation;
      const double bytes = msg ? msg[activation ? st : st - 1] : 0.0;
      const double leave = std::max(e, link_free_[size_t(l)]);
      link_free_[size_t(l)] = leave + bytes * inv_bw;
      avail = link_free_[size_t(l)] + c.latency;
    }
    avail_[u] = avail;
    makespan = std::max(makespan, kind == K::reduce_gradients ? avail : e);
  }

  if (!step_pos_.empty()) {
    // A reduction shared with other pipeline ranks starts when the last of its group has
    // issued its REDUCE (every REDUCE is swept by now; only STEP, each rank's last
    // action, waits for a reduction).
    if (!c.reduce_group.empty()) {
      group_last_.assign(size_t(s_->num_stages()), 0.0);
      for (int u : reduce_pos_)
        if (const int g = c.reduce_group[size_t(stage_[size_t(u)])]; g >= 0)
          group_last_[size_t(g)] = std::max(group_last_[size_t(g)], end_[size_t(u)]);
      for (int u : reduce_pos_)
        if (const int g = c.reduce_group[size_t(stage_[size_t(u)])]; g >= 0) {
          const double done = group_last_[size_t(g)] + (red ? red[stage_[size_t(u)]] : 0.0);
          avail_[size_t(u)] = std::max(avail_[size_t(u)], done);
          makespan = std::max(makespan, avail_[size_t(u)]);
        }
    }
    // The global norm: its all-reduce completes one latency after the last rank is ready
    // to step (its reductions done). A synchronous STEP starts then; a post-validated one
    // starts when its own rank is ready, and the step ends no earlier than the validation.
    double reached = 0.0;
    for (int u : step_pos_) {
      double t = arrived_[size_t(u)];
      for (int k = dep_begin_[size_t(u)]; k < dep_begin_[size_t(u) + 1]; ++k) {
        const int d = deps_[size_t(k)];
        t = std::max(t, times[d & 1][d >> 1]);
      }
      start_[size_t(u)] = t;
      end_[size_t(u)] = t + scale_[size_t(u)] * c.step_time(rank_[size_t(u)]);
      reached = std::max(reached, t);
    }
    // One rank holds every gradient: its norm is known with no message (a one-device plan
    // had taken --p2p-latency into its step).
    const double norm_known = reached + (s_->num_ranks > 1 ? c.latency : 0.0);
    for (int u : step_pos_) {
      if (!c.post_validated_step) start_[size_t(u)] = norm_known;
      const double e = c.post_validated_step
                           ? end_[size_t(u)]
                           : norm_known + scale_[size_t(u)] * c.step_time(rank_[size_t(u)]);
      end_[size_t(u)] = avail_[size_t(u)] = e;
      free_[size_t(rank_[size_t(u)])] = e;
      RankStats& rs = result_.ranks[size_t(rank_[size_t(u)])];
      rs.end = std::max(rs.end, e);
      makespan = std::max(makespan, e);
    }
    makespan = std::max(makespan, norm_known);
  }

  result_.makespan = makespan;
  double bubble_sum = 0.0;
  result_.span_bubble = result_.peak_micro_batches = result_.peak_bytes = 0.0;
  for (RankStats& rs : result_.ranks) {
    if (rs.start == kInf) rs.start = 0.0;
    rs.peak_micro_batches /= chunks_;
    rs.bubble = makespan > 0 ? 1.0 - rs.busy / makespan : 0.0;
    const double span = rs.end - rs.start;
    rs.span_bubble = span > 0 ? 1.0 - rs.busy / span : 0.0;
    bubble_sum += rs.bubble;
    result_.span_bubble = std::max(result_.span_bubble, rs.span_bubble);
    result_.peak_micro_batches = std::max(result_.peak_micro_batches, rs.peak_micro_batches);
    result_.peak_bytes = std::max(result_.peak_bytes, rs.peak_bytes);
  }
  result_.bubble = bubble_sum / s_->num_ranks;
  return result_;
}

Timeline Simulator::timeline(double seconds_per_unit) const {
  Timeline t;
  t.name = s_->name;
  t.num_ranks = s_->num_ranks;
  t.seconds_per_unit = seconds_per_unit;
  t.events.reserve(rank_.size());
  const double inv_bw = costs_.bandwidth > 0 ? 1.0 / costs_.bandwidth : 0.0;
  for (size_t r = 0; r < s_->ranks.size(); ++r)
    for (size_t i = 0; i < s_->ranks[r].size(); ++i) {
      const size_t u = position(int(r), int(i));
      const Action& a = s_->ranks[r][i];
      TimelineEvent ev;
      ev.rank = int(r);
      ev.kind = a.kind;
      ev.micro_batch = a.micro_batch;
      ev.stage = a.stage;
      if (is_compute(a.kind) || a.kind == K::optimizer_step) {
        ev.start = a.kind == K::optimizer_step ? arrived_[u] : start_[u];
        ev.end = end_[u];
        t.events.push_back(ev);
      } else if (a.kind == K::reduce_gradients && avail_[u] > end_[u]) {
        ev.lane = 1;
        ev.start = end_[u];
        ev.end = avail_[u];
        t.events.push_back(ev);
      }
      if (link_[u] >= 0 && avail_[u] > end_[u]) {  // the message on its way
        const bool activation = a.kind == K::forward || a.kind == K::send_activation;
        const double bytes = costs_.message_bytes.empty()
                                 ? 0.0
                                 : costs_.message_bytes[size_t(activation ? a.stage : a.stage - 1)];
        ev.lane = 1;
        ev.kind = activation ? K::send_activation : K::send_gradient;
        ev.peer = link_dst_[size_t(link_[u])];
        ev.end = avail_[u];
        ev.start = avail_[u] - costs_.latency - bytes * inv_bw;  // when it left
        t.events.push_back(ev);
      }
    }
  return t;
}

SimResult simulate(const Schedule& s, const Costs& c) {
  Simulator sim(s);
  return sim.run(c);
}

}  // namespace baton::schedule
