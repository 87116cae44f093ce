#include "schedule/simulate.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "memory/error.h"
#include "schedule/validate.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

Schedule checked(Schedule s, const std::string& source) {
  check_header(s, source);
  return s;
}

}  // namespace

Simulator::Simulator(Schedule s, const std::string& source)
    : s_(checked(std::move(s), source)), graph_(s_) {
  Progress progress;
  ValidationReport report = validate(s_, graph_, &progress);
  if (!report.ok) throw InputError(source + ": invalid schedule: " + report.to_string());
  chunks_ = chunks_per_rank(s_);

  // Everything run() touches is laid out in execution order (positions), so one run is
  // a sequential sweep whose dependencies point a short way back.
  const std::vector<int>& order = progress.order;
  const int n = graph_.num_nodes();
  pos_of_.resize(size_t(n));
  for (int i = 0; i < n; ++i) pos_of_[size_t(order[size_t(i)])] = i;
  rank_.resize(size_t(n));
  stage_.resize(size_t(n));
  kind_.resize(size_t(n));
  link_.assign(size_t(n), -1);
  msg_stage_.assign(size_t(n), -1);
  dep_begin_.resize(size_t(n) + 1);
  deps_.clear();
  std::unordered_map<long long, int> links;
  auto link_id = [&](int src, int dst) {
    auto [it, fresh] = links.try_emplace(1LL * src * s_.num_ranks + dst, int(links.size()));
    if (fresh) {
      link_src_.push_back(src);
      link_dst_.push_back(dst);
    }
    return it->second;
  };
  const bool lowered = graph_.lowered();
  for (int i = 0; i < n; ++i) {
    const int node = order[size_t(i)];
    const ActionRef ref = graph_.ref(node);
    const Action& a = graph_.action(node);
    rank_[size_t(i)] = ref.rank;
    stage_[size_t(i)] = a.stage;
    kind_[size_t(i)] = a.kind;
    dep_begin_[size_t(i)] = int(deps_.size());
    for (int d : graph_.dependencies(node)) deps_.push_back(pos_of_[size_t(d)]);
    // The message this action puts on a link, if any: a send; in a compute-only
    // schedule, the compute whose output goes to another rank.
    int to_stage = -1, bytes_stage = -1;
    if (lowered) {
      if (a.kind == K::send_activation) to_stage = next_stage(s_, a.stage), bytes_stage = a.stage;
      if (a.kind == K::send_gradient) to_stage = prev_stage(s_, a.stage), bytes_stage = to_stage;
    } else if (a.kind == K::forward) {
      to_stage = next_stage(s_, a.stage), bytes_stage = a.stage;
    } else if (a.kind == K::backward_input || a.kind == K::full_backward) {
      to_stage = prev_stage(s_, a.stage), bytes_stage = to_stage;
    }
    if (to_stage >= 0 && s_.placement[size_t(to_stage)] != ref.rank) {
      link_[size_t(i)] = link_id(ref.rank, s_.placement[size_t(to_stage)]);
      msg_stage_[size_t(i)] = bytes_stage;
    }
  }
  dep_begin_[size_t(n)] = int(deps_.size());
  start_.resize(size_t(n));
  end_.resize(size_t(n));
  done_.resize(size_t(n));
  avail_.resize(size_t(n));
  sent_.resize(size_t(n));
  free_.resize(size_t(s_.num_ranks));
  mem_.resize(size_t(s_.num_ranks));
  live_.resize(size_t(s_.num_ranks));
  link_free_.resize(link_src_.size());
  result_.ranks.resize(size_t(s_.num_ranks));
}

const SimResult& Simulator::run(const Costs& c) {
  const int S = s_.num_stages();
  c.check(S);
  const double* fwd = c.forward.data();
  const double* bin = c.backward_input.data();
  const double* bwt = c.backward_weight.data();
  const double* act = c.activation_bytes.empty() ? nullptr : c.activation_bytes.data();
  const double* act_b = c.activation_bytes_after_b.empty() ? act : c.activation_bytes_after_b.data();
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

  const int n = int(rank_.size());
  for (int i = 0; i < n; ++i) {
    const size_t u = size_t(i);
    const int r = rank_[u], st = stage_[u];
    double t = free_[size_t(r)];
    for (int k = dep_begin_[u]; k < dep_begin_[u + 1]; ++k) {
      const size_t d = size_t(deps_[size_t(k)]);
      const double ready = rank_[d] == r ? done_[d] : avail_[d];
      t = ready > t ? ready : t;
    }
    double dur = 0.0;
    RankStats& rs = result_.ranks[size_t(r)];
    switch (kind_[u]) {
      case K::forward:
        dur = fwd[st];
        if (act) {
          mem_[size_t(r)] += act[st];
          rs.peak_bytes = std::max(rs.peak_bytes, mem_[size_t(r)]);
        }
        ++live_[size_t(r)];
        rs.peak_micro_batches = std::max(rs.peak_micro_batches, double(live_[size_t(r)]));
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
        dur = c.optimizer_step;
        break;
      default:
        break;
    }
    const double e = t + dur;
    start_[u] = t;
    end_[u] = e;
    free_[size_t(r)] = e;
    if (is_compute(kind_[u]) || kind_[u] == K::optimizer_step) {
      rs.busy += dur;
      rs.start = std::min(rs.start, t);
      rs.end = std::max(rs.end, e);
    }
    done_[u] = kind_[u] == K::reduce_gradients && red ? e + red[st] : e;
    makespan = std::max(makespan, done_[u]);
    const int l = link_[u];
    if (l >= 0) {
      const double bytes = msg ? msg[msg_stage_[u]] : 0.0;
      const double leave = std::max(e, link_free_[size_t(l)]);
      link_free_[size_t(l)] = leave + bytes * inv_bw;
      sent_[u] = leave;
      avail_[u] = link_free_[size_t(l)] + c.latency;
    } else {
      avail_[u] = done_[u];
    }
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
  result_.bubble = bubble_sum / s_.num_ranks;
  return result_;
}

Timeline Simulator::timeline(double seconds_per_unit) const {
  Timeline t;
  t.name = s_.name;
  t.num_ranks = s_.num_ranks;
  t.seconds_per_unit = seconds_per_unit;
  t.events.reserve(rank_.size());
  for (int node = 0; node < graph_.num_nodes(); ++node) {
    const size_t u = size_t(pos_of_[size_t(node)]);
    const Action& a = graph_.action(node);
    TimelineEvent ev;
    ev.rank = rank_[u];
    ev.kind = a.kind;
    ev.micro_batch = a.micro_batch;
    ev.stage = a.stage;
    if (is_compute(a.kind) || a.kind == K::optimizer_step) {
      ev.start = start_[u];
      ev.end = end_[u];
      t.events.push_back(ev);
    } else if (a.kind == K::reduce_gradients && done_[u] > end_[u]) {
      ev.lane = 1;
      ev.start = end_[u];
      ev.end = done_[u];
      t.events.push_back(ev);
    }
    if (link_[u] >= 0 && avail_[u] > end_[u]) {  // the message on its way
      ev.lane = 1;
      ev.kind = a.kind == K::forward || a.kind == K::send_activation ? K::send_activation : K::send_gradient;
      ev.peer = link_dst_[size_t(link_[u])];
      ev.start = sent_[u];
      ev.end = avail_[u];
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
