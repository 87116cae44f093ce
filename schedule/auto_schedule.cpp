#include "schedule/auto_schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "memory/error.h"
#include "schedule/generators.h"
#include "schedule/lower.h"

namespace baton::schedule {

namespace {

using K = ActionKind;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The list scheduler's state and its one decision rule (see list_schedule in the header).
class ListScheduler {
 public:
  ListScheduler(int p, int m, const Costs& c, const std::vector<double>& limit, bool bytes,
                const GreedyPolicy& pol);
  Schedule run();

 private:
  struct Choice {
    double start = kInf;
    K kind = K::forward;
    int stage = -1, mb = -1;
  };
  struct PendingW {
    int stage, mb;
    double ready;
  };
  Choice decide(int r) const;
  void execute(int r, const Choice& ch);
  double comm(int from, int to) const;
  size_t at(int stage, int mb) const { return size_t(stage) * size_t(m_) + size_t(mb); }

  int p_, m_, S_;
  double v_;
  const Costs& c_;
  GreedyPolicy pol_;
  Schedule s_;
  std::vector<double> limit_, cap_;
  std::vector<double> w_full_, w_after_, need_;  // per stage, in the limit's unit
  std::vector<std::vector<int>> local_;          // per rank, its stages, deepest first
  std::vector<int> first_local_;                 // per rank, the stage a micro-batch enters by
  std::vector<double> in_ready_, grad_ready_, f_end_;
  std::vector<int> next_f_, next_b_;
  std::vector<std::deque<PendingW>> w_queue_;
  std::vector<double> free_, mem_, reserved_, units_;
  std::vector<char> dirty_;
};

ListScheduler::ListScheduler(int p, int m, const Costs& c, const std::vector<double>& limit,
                             bool bytes, const GreedyPolicy& pol)
    : p_(p), m_(m), S_(p * pol.chunks), v_(pol.chunks), c_(c), pol_(pol) {
  if (pol.placement != "loop" && pol.placement != "v")
    throw InputError("list scheduler: placement: expected \"loop\" or \"v\", found \"" +
                     pol.placement + "\"");
  if (pol.chunks < 1 || (pol.placement == "v" && pol.chunks % 2 != 0))
    throw InputError("list scheduler: chunks: expected >= 1 (even for the V placement), found " +
                     std::to_string(pol.chunks));
  c.check(S_, p);
  s_.name = "auto";
  s_.num_ranks = p;
  s_.num_micro_batches = m;
  s_.placement = pol.placement == "v" ? v_placement(p, pol.chunks) : loop_placement(p, pol.chunks);
  s_.ranks.resize(size_t(p));
  limit_ = limit.size() == 1 ? std::vector<double>(size_t(p), limit[0]) : limit;
  cap_ = pol.cap.empty() ? std::vector<double>(size_t(p), kInf) : pol.cap;
  for (double& cap : cap_) cap = std::max(cap, 1.0);  // one micro-batch always fits the cap
  w_full_.resize(size_t(S_));
  w_after_.resize(size_t(S_));
  for (int st = 0; st < S_; ++st) {
    if (bytes) {
      w_full_[size_t(st)] = c.activation_bytes.empty() ? 0.0 : c.activation_bytes[size_t(st)];
      w_after_[size_t(st)] = c.activation_bytes_after_b.empty()
                                 ? w_full_[size_t(st)]
                                 : c.activation_bytes_after_b[size_t(st)];
    } else {
      w_full_[size_t(st)] = w_after_[size_t(st)] = 1.0 / v_;
    }
  }
  local_.resize(size_t(p));
  first_local_.resize(size_t(p));
  for (int r = 0; r < p; ++r) {
    local_[size_t(r)] = stages_of_rank(s_, r);
    first_local_[size_t(r)] = local_[size_t(r)].front();
    std::reverse(local_[size_t(r)].begin(), local_[size_t(r)].end());
  }
  // What admitting a micro-batch at a rank's first stage commits: its activations at
  // every stage of the rank, so the later ones can never be blocked by memory.
  need_.assign(size_t(p), 0.0);
  for (int st = 0; st < S_; ++st) need_[size_t(s_.placement[size_t(st)])] += w_full_[size_t(st)];
  for (int r = 0; r < p; ++r)
    if (need_[size_t(r)] > limit_[size_t(r)] * (1 + 1e-12))
      throw InputError("memory limit " + std::to_string(limit_[size_t(r)]) + " of rank " +
                       std::to_string(r) + " is below one micro-batch's activations on it (" +
                       std::to_string(need_[size_t(r)]) + ")");
  const size_t pairs = size_t(S_) * size_t(m);
  in_ready_.assign(pairs, kInf);
  grad_ready_.assign(pairs, kInf);
  f_end_.assign(pairs, kInf);
  for (int b = 0; b < m; ++b) in_ready_[at(0, b)] = 0.0;
  next_f_.assign(size_t(S_), 0);
  next_b_.assign(size_t(S_), 0);
  w_queue_.resize(size_t(p));
  free_.assign(size_t(p), 0.0);
  mem_.assign(size_t(p), 0.0);
  reserved_.assign(size_t(p), 0.0);
  units_.assign(size_t(p), 0.0);
  dirty_.assign(size_t(p), 1);
}

double ListScheduler::comm(int from, int to) const {
  if (s_.placement[size_t(from)] == s_.placement[size_t(to)]) return 0.0;
  const double bytes =
      c_.message_bytes.empty() ? 0.0 : c_.message_bytes[size_t(std::min(from, to))];
  return c_.latency + (c_.bandwidth > 0 ? bytes / c_.bandwidth : 0.0);
}

ListScheduler::Choice ListScheduler::decide(int r) const {
  const double t0 = free_[size_t(r)];
  Choice best_b, best_f;
  bool memory_blocked = false;
  for (int st : local_[size_t(r)]) {  // deepest stage first: it finishes work in flight
    const int b = next_b_[size_t(st)];
    if (b < next_f_[size_t(st)]) {
      const double ready = std::max({t0, f_end_[at(st, b)], grad_ready_[at(st, b)]});
      if (ready < best_b.start) best_b = {ready, K::backward_input, st, b};
    }
    const int f = next_f_[size_t(st)];
    if (f < m_) {
      const double ready = std::max(t0, in_ready_[at(st, f)]);
      bool admissible = true;
      if (st == first_local_[size_t(r)]) {
        admissible = mem_[size_t(r)] + reserved_[size_t(r)] + need_[size_t(r)] <=
                         limit_[size_t(r)] * (1 + 1e-12) &&
                     units_[size_t(r)] + 1.0 <= cap_[size_t(r)] + 1e-9;
        if (!admissible && ready < kInf) memory_blocked = true;
      }
      if (admissible && ready < best_f.start) best_f = {ready, K::forward, st, f};
    }
  }
  Choice best_w;
  if (!w_queue_[size_t(r)].empty()) {
    const PendingW& w = w_queue_[size_t(r)].front();
    best_w = {std::max(t0, w.ready), K::backward_weight, w.stage, w.mb};
  }
  // B before F at equal times (the critical path), unless forward-first and under the cap.
  Choice bf = best_b;
  if (best_f.start < best_b.start || (best_f.start == best_b.start && pol_.forward_first))
    bf = best_f;
  if (best_w.start < bf.start) {
    const double gap = bf.start - best_w.start;
    const double w_cost = c_.backward_weight[size_t(best_w.stage)];
    if (bf.start == kInf || memory_blocked || gap >= pol_.w_gap * w_cost) return best_w;
  }
  if (bf.start < kInf) return bf;
  return best_w;
}

void ListScheduler::execute(int r, const Choice& ch) {
  const int st = ch.stage, b = ch.mb;
  s_.ranks[size_t(r)].push_back(make_action(ch.kind, b, st));
  dirty_[size_t(r)] = 1;
  auto notify = [&](int stage) { dirty_[size_t(s_.placement[size_t(stage)])] = 1; };
  double e = ch.start;
  switch (ch.kind) {
    case K::forward: {
      e += c_.forward[size_t(st)];
      f_end_[at(st, b)] = e;
      ++next_f_[size_t(st)];
      if (st == first_local_[size_t(r)]) {
        reserved_[size_t(r)] += need_[size_t(r)];
        units_[size_t(r)] += 1.0;
      }
      reserved_[size_t(r)] -= w_full_[size_t(st)];
      mem_[size_t(r)] += w_full_[size_t(st)];
      const int n = next_stage(s_, st);
      if (n >= 0) {
        in_ready_[at(n, b)] = e + comm(st, n);
        notify(n);
      } else {
        grad_ready_[at(st, b)] = e;
      }
      break;
    }
    case K::backward_input: {
      e += c_.backward_input[size_t(st)];
      ++next_b_[size_t(st)];
      mem_[size_t(r)] -= w_full_[size_t(st)] - w_after_[size_t(st)];
      w_queue_[size_t(r)].push_back({st, b, e});
      const int pv = prev_stage(s_, st);
      if (pv >= 0) {
        grad_ready_[at(pv, b)] = e + comm(st, pv);
        notify(pv);
      }
      break;
    }
    case K::backward_weight:
      e += c_.backward_weight[size_t(st)];
      w_queue_[size_t(r)].pop_front();
      mem_[size_t(r)] -= w_after_[size_t(st)];
      units_[size_t(r)] -= 1.0 / v_;
      break;
    default:
      break;
  }
  free_[size_t(r)] = e;
}

Schedule ListScheduler::run() {
  const long long total = 3LL * S_ * m_;
  std::vector<Choice> cache(static_cast<size_t>(p_));
  for (long long step = 0; step < total; ++step) {
    int who = -1;
    for (int r = 0; r < p_; ++r) {
      if (dirty_[size_t(r)]) {
        cache[size_t(r)] = decide(r);
        dirty_[size_t(r)] = 0;
      }
      if (cache[size_t(r)].start < kInf &&
          (who < 0 || cache[size_t(r)].start < cache[size_t(who)].start))
        who = r;
    }
    if (who < 0)
      throw std::logic_error(
          "list scheduler: no rank can act (a bug: admitted work always completes)");
    execute(who, cache[size_t(who)]);
  }
  return std::move(s_);
}

// A light re-simulation for the local search: compute-only schedules, no link
// contention, scratch buffers reused between calls. Returns false when the lists
// deadlock or a rank's peak memory exceeds its limit.
class QuickEval {
 public:
  QuickEval(const Schedule& s, const Costs& c, const std::vector<double>& limit, bool bytes)
      : s_(s), c_(c), bytes_(bytes), m_(s.num_micro_batches), v_(chunks_per_rank(s)) {
    const size_t p = size_t(s.num_ranks), pairs = size_t(s.num_stages()) * size_t(m_);
    limit_ = limit.size() == 1 ? std::vector<double>(p, limit[0]) : limit;
    fend_.resize(pairs);
    bend_.resize(pairs);
    pos_.resize(p);
    free_.resize(p);
    mem_.resize(p);
  }
  bool run(const Schedule& s, double& makespan, double& end_sum) {
    std::fill(fend_.begin(), fend_.end(), -1.0);
    std::fill(bend_.begin(), bend_.end(), -1.0);
    std::fill(pos_.begin(), pos_.end(), 0);
    std::fill(free_.begin(), free_.end(), 0.0);
    std::fill(mem_.begin(), mem_.end(), 0.0);
    size_t remaining = s.num_actions();
    critical_sum_ = 0;
    for (bool moved = true; moved && remaining > 0;) {
      moved = false;
      for (int r = 0; r < s.num_ranks; ++r) {
        const auto& list = s.ranks[size_t(r)];
        int& pos = pos_[size_t(r)];
        while (pos < int(list.size())) {
          const Action& a = list[size_t(pos)];
          const size_t at = size_t(a.stage) * size_t(m_) + size_t(a.micro_batch);
          double t = free_[size_t(r)], dur = 0, dmem = 0;
          if (a.kind == K::forward) {
            const int pv = prev_stage(s_, a.stage);
            if (pv >= 0) {
              const double in = fend_[size_t(pv) * size_t(m_) + size_t(a.micro_batch)];
              if (in < 0) break;
              t = std::max(t, in + comm(pv, a.stage));
            }
            dur = c_.forward[size_t(a.stage)];
            dmem = full(a.stage);
          } else if (a.kind == K::backward_input || a.kind == K::full_backward) {
            if (fend_[at] < 0) break;
            t = std::max(t, fend_[at]);
            const int nx = next_stage(s_, a.stage);
            if (nx >= 0) {
              const double g = bend_[size_t(nx) * size_t(m_) + size_t(a.micro_batch)];
              if (g < 0) break;
              t = std::max(t, g + comm(nx, a.stage));
            }
            dur = c_.backward_input[size_t(a.stage)];
            if (a.kind == K::full_backward)
              dur += c_.backward_weight[size_t(a.stage)], dmem = -full(a.stage);
            else
              dmem = after(a.stage) - full(a.stage);
          } else {  // W
            if (bend_[at] < 0) break;
            t = std::max(t, bend_[at]);
            dur = c_.backward_weight[size_t(a.stage)];
            dmem = -after(a.stage);
          }
          if (dmem > 0 && mem_[size_t(r)] + dmem > limit_[size_t(r)] * (1 + 1e-9) + 1e-12)
            return false;
          mem_[size_t(r)] += dmem;
          const double e = t + dur;
          free_[size_t(r)] = e;
          if (a.kind == K::forward)
            fend_[at] = e;
          else if (a.kind != K::backward_weight)
            bend_[at] = e;
          if (a.kind != K::backward_weight) critical_sum_ += e;
          ++pos;
          --remaining;
          moved = true;
        }
      }
    }
    if (remaining > 0) return false;
    makespan = 0;
    for (double f : free_) makespan = std::max(makespan, f);
    end_sum = critical_sum_;
    return true;
  }

 private:
  double full(int st) const {
    if (!bytes_) return 1.0 / v_;
    return c_.activation_bytes.empty() ? 0.0 : c_.activation_bytes[size_t(st)];
  }
  double after(int st) const {
    if (!bytes_ || c_.activation_bytes_after_b.empty()) return full(st);
    return c_.activation_bytes_after_b[size_t(st)];
  }
  double comm(int from, int to) const {
    if (s_.placement[size_t(from)] == s_.placement[size_t(to)]) return 0.0;
    const double bytes =
        c_.message_bytes.empty() ? 0.0 : c_.message_bytes[size_t(std::min(from, to))];
    return c_.latency + (c_.bandwidth > 0 ? bytes / c_.bandwidth : 0.0);
  }
  const Schedule& s_;
  const Costs& c_;
  bool bytes_;
  int m_;
  double v_;
  std::vector<double> limit_, fend_, bend_, free_, mem_;
  std::vector<int> pos_;
  double critical_sum_ = 0;
};

// Hill climbing on adjacent swaps within a rank's list: a swap is kept when the
// makespan drops, or stays and the ranks finish earlier on the whole (which moves
// work off the critical path and opens the next improvement). At most `budget` tries.
}  // namespace

Schedule refine_schedule(Schedule s, const Costs& c, const std::vector<double>& limit, bool bytes,
                         long long budget, const std::function<void()>& poll) {
  QuickEval q(s, c, limit, bytes);
  double best_m = 0, best_e = 0;
  if (!q.run(s, best_m, best_e)) return s;
  const double eps = 1e-9 * std::max(1.0, best_m);
  // Moves: take one action of a rank and put it up to kWindow places earlier or later.
  constexpr int kWindow = 6;
  for (bool improved = true; improved && budget > 0;) {
    improved = false;
    for (int r = 0; r < s.num_ranks && budget > 0; ++r) {
      auto& list = s.ranks[size_t(r)];
      const int size = int(list.size());
      for (int i = 0; i < size && budget > 0; ++i)
        for (int j = std::max(0, i - kWindow); j <= std::min(size - 1, i + kWindow) && budget > 0;
             ++j) {
          if (j == i) continue;
          if (poll) poll();
          auto move = [&](int from, int to) {
            if (from < to)
              std::rotate(list.begin() + from, list.begin() + from + 1, list.begin() + to + 1);
            else
              std::rotate(list.begin() + to, list.begin() + from, list.begin() + from + 1);
          };
          move(i, j);
          --budget;
          double mk = 0, es = 0;
          if (q.run(s, mk, es) &&
              (mk < best_m - eps || (mk <= best_m + eps && es < best_e - eps))) {
            best_m = mk;
            best_e = es;
            improved = true;
            break;  // the action at i changed; go on with the next one
          }
          move(j, i);
        }
    }
  }
  return s;
}

namespace {

bool fits(const SimResult& r, const std::vector<double>& limit, bool bytes) {
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const double lim = limit.size() == 1 ? limit[0] : limit[i];
    const double peak = bytes ? r.ranks[i].peak_bytes : r.ranks[i].peak_micro_batches;
    if (peak > lim * (1 + 1e-9) + 1e-12) return false;
  }
  return true;
}

AutoCandidate describe(const std::string& name, const SimResult& r, bool fit) {
  AutoCandidate c;
  c.name = name;
  c.fits = fit;
  c.makespan = r.makespan;
  c.bubble = r.bubble;
  c.span_bubble = r.span_bubble;
  c.peak_micro_batches = r.peak_micro_batches;
  c.peak_bytes = r.peak_bytes;
  return c;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Schedule list_schedule(int ranks, int micro_batches, const Costs& costs,
                       const std::vector<double>& limit, bool limit_in_bytes,
                       const GreedyPolicy& policy) {
  check_common("auto", ranks, micro_batches, std::max(1, policy.chunks));
  if (limit.size() != 1 && limit.size() != size_t(ranks))
    throw InputError("memory limit: expected one value or one per rank (" + std::to_string(ranks) +
                     "), found " + std::to_string(limit.size()));
  if (!policy.cap.empty() && policy.cap.size() != size_t(ranks))
    throw InputError("list scheduler: cap: expected one value per rank");
  return ListScheduler(ranks, micro_batches, costs, limit, limit_in_bytes, policy).run();
}

double objective_value(const SimResult& r, AutoOptions::Objective objective) {
  if (objective == AutoOptions::Objective::makespan) return r.makespan;
  double span = 0;
  for (const RankStats& rs : r.ranks) span = std::max(span, rs.end - rs.start);
  return span;
}

AutoOptions::Objective parse_objective(const std::string& text, const std::string& where) {
  if (text == "makespan") return AutoOptions::Objective::makespan;
  if (text == "span") return AutoOptions::Objective::span;
  throw InputError(where + ": expected makespan or span, found '" + text + "'");
}

AutoResult auto_schedule(const CostSpec& spec, const AutoOptions& o) {
  const int p = o.num_ranks, m = o.num_micro_batches;
  check_common("auto", p, m, 2);
  if (o.memory_limit.size() != 1 && o.memory_limit.size() != size_t(p))
    throw InputError("auto: memory limit: expected one value or one per rank (" +
                     std::to_string(p) + "), found " + std::to_string(o.memory_limit.size()));
  for (double l : o.memory_limit)
    if (!(l > 0)) throw InputError("auto: memory limit: expected a value > 0, found " + number(l));

  AutoResult out;
  bool have = false;
  // A cost file that fits no candidate's stage count (per-stage values for another p) is
  // the error to report, not the memory limit: the first such error (or a generator's),
  // raised when no candidate could be simulated at all.
  std::string first_error;
  int simulated = 0;
  auto costs_for = [&](auto&&... shape) {
    try {
      return resolve(spec, shape...);
    } catch (const InputError& e) {
      throw InputError(o.costs_source.empty() ? e.what() : o.costs_source + ": " + e.what());
    }
  };
  auto note_error = [&](const InputError& e) {
    if (first_error.empty()) first_error = e.what();
  };
  auto value = [&](const SimResult& r) { return objective_value(r, o.objective); };
  auto consider = [&](Schedule s, const SimResult& r, const std::string& name) {
    if (o.poll) o.poll();
    if (!fits(r, o.memory_limit, o.limit_in_bytes)) return;
    const double v = value(r), best = have ? value(out.sim) : 0;
    const bool better = !have || v < best * (1 - 1e-12) ||
                        (v <= best * (1 + 1e-12) &&
                         (o.limit_in_bytes ? r.peak_bytes < out.sim.peak_bytes
                                           : r.peak_micro_batches < out.sim.peak_micro_batches));
    if (!better) return;
    have = true;
    out.schedule = std::move(s);
    out.schedule.name = "auto";
    out.sim = r;
    out.chosen = name;
  };

  if (o.include_fixed) {
    for (const std::string name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v",
                                   "dualpipev", "v-min", "v-half", "v-zb"}) {
      AutoCandidate cand;
      cand.name = name;
      try {
        Schedule s = split_backward(generate(name, p, m));
        const Costs costs = costs_for(s);
        Simulator sim(s, name);
        const SimResult& r = sim.run(costs);
        ++simulated;
        cand = describe(name, r, fits(r, o.memory_limit, o.limit_in_bytes));
        consider(std::move(s), r, name);
      } catch (const InputError& e) {
        cand.defined = false;
        cand.note = e.what();
        note_error(e);
      }
      out.fixed.push_back(cand);
    }
  }

  // The V block under the reorder pass timed with the real costs, at the limit (and at
  // 1F1B's p when the limit is larger: the pass fills up to its limit, which is not
  // always faster): V-ZB's construction for these costs.
  if (!o.limit_in_bytes) {
    double lim = kInf;
    for (double l : o.memory_limit) lim = std::min(lim, l);
    std::vector<double> withins = {std::min(lim, 4.0 * p)};
    if (withins[0] > p) withins.push_back(p);
    for (double within : withins) {
      if (within < 1) break;
      Costs costs;
      try {
        costs = costs_for(p, 2 * p, 1);
      } catch (const InputError& e) {
        note_error(e);
        break;  // per-stage costs for another stage count
      }
      const std::string name = "v-block within " + number(std::floor(within * 2) / 2);
      Schedule s = v_shape_within(name, p, m, costs, within);
      Simulator sim(s, name);
      consider(std::move(s), sim.run(costs), name);
      ++simulated;
    }
  }

  // The list scheduler's grid, thinned for big problems (each run is linear in actions).
  struct Shape {
    const char* placement;
    int chunks;
  };
  std::vector<GreedyPolicy> grid;
  for (Shape sh : {Shape{"loop", 1}, Shape{"v", 2}, Shape{"loop", 2}}) {
    std::vector<std::pair<std::string, std::vector<double>>> caps = {{"none", {}}};
    auto per_rank = [&](const std::string& label, auto f) {
      std::vector<double> v(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) v[size_t(r)] = f(r);
      caps.emplace_back(label, v);
    };
    per_rank("p-r", [&](int r) { return double(p - r); });
    per_rank("p", [&](int) { return double(p); });
    per_rank("1.5p-r", [&](int r) { return std::ceil(1.5 * p) - r; });
    per_rank("2p-1-r", [&](int r) { return double(2 * p - 1 - r); });
    per_rank("2p-1", [&](int) { return double(2 * p - 1); });
    for (auto& [label, cap] : caps)
      for (double gap : {0.0, 0.5, 1.0})
        for (bool ff : {false, true}) {
          GreedyPolicy pol;
          pol.placement = sh.placement;
          pol.chunks = sh.chunks;
          pol.cap = cap;
          pol.w_gap = gap;
          pol.forward_first = ff;
          grid.push_back(pol);
        }
  }
  const double actions = 3.0 * p * 2 * m;
  const int budget = std::max(6, std::min(o.max_greedy_runs, int(4e7 / std::max(actions, 1.0))));
  const size_t stride = std::max<size_t>(1, (grid.size() + size_t(budget) - 1) / size_t(budget));
  double best_greedy = kInf;
  for (size_t i = 0; i < grid.size(); i += stride) {
    const GreedyPolicy& pol = grid[i];
    Costs costs;
    try {
      costs = costs_for(p, p * pol.chunks, 1);
    } catch (const InputError& e) {
      note_error(e);
      continue;  // per-stage costs for another stage count
    }
    std::string name =
        std::string("list ") + pol.placement + (pol.chunks > 1 ? std::to_string(pol.chunks) : "") +
        " cap=" +
        (pol.cap.empty() ? "none"
                         : number(pol.cap[0]) + (p > 1 && pol.cap[1] != pol.cap[0] ? "-r" : "")) +
        " w-gap=" + number(pol.w_gap) + (pol.forward_first ? " F-first" : " B-first");
    Schedule s;
    try {
      s = list_schedule(p, m, costs, o.memory_limit, o.limit_in_bytes, pol);
    } catch (const InputError&) {
      continue;  // the limit cannot hold a micro-batch on this placement
    }
    ++out.greedy_runs;
    ++simulated;
    Simulator sim(s, name);
    const SimResult& r = sim.run(costs);
    const bool fit = fits(r, o.memory_limit, o.limit_in_bytes);
    if (fit && value(r) < best_greedy) {
      best_greedy = value(r);
      out.best_greedy = describe(name, r, fit);
    }
    consider(std::move(s), r, name);
  }
  // The round-by-round zero-bubble heuristic (one stage per rank) over its knobs: the
  // paper's automatic schedule, timed with the real costs.
  {
    Costs costs;
    bool have_costs = true;
    try {
      costs = costs_for(p, p, 1);
    } catch (const InputError& e) {
      note_error(e);
      have_costs = false;  // per-stage costs for another stage count
    }
    for (int knobs = 0; have_costs && knobs < 8; ++knobs)
      for (int delta = -2; delta <= 2; ++delta) {
        ZbGreedyPolicy pol;
        pol.forwards_fit_before_first_b = knobs & 1;
        pol.fill_small_waits = knobs & 2;
        pol.first_stage_drains_w = knobs & 4;
        pol.warm_up_delta = delta;
        Schedule s;
        try {
          s = zb_greedy_schedule(p, m, costs, o.memory_limit, o.limit_in_bytes, pol);
        } catch (const InputError&) {
          have_costs = false;  // the limit cannot hold a micro-batch
          break;
        }
        const std::string name =
            std::string("zb-greedy") + (pol.forwards_fit_before_first_b ? " fit" : "") +
            (pol.fill_small_waits ? "" : " leave-small") +
            (pol.first_stage_drains_w ? "" : " no-drain") +
            (delta != 0 ? " warm-up" + std::string(delta > 0 ? "+" : "") + std::to_string(delta)
                        : "");
        Simulator sim(s, name);
        consider(std::move(s), sim.run(costs), name);
        ++simulated;
      }
  }
  // Local search from the best candidate, kept only if the full simulator agrees.
  if (have && o.refine) {
    const long long work = std::max<long long>(1, (long long)out.schedule.num_actions());
    const long long tries = std::max<long long>(
        200, (long long)(3e7 / double(work) / std::max(1.0, double(work) / 2000)));
    Costs costs = resolve(spec, out.schedule);
    Schedule refined =
        refine_schedule(out.schedule, costs, o.memory_limit, o.limit_in_bytes, tries, o.poll);
    if (!(refined == out.schedule)) {
      Simulator sim(refined, "refined");
      const SimResult& r = sim.run(costs);
      const std::string name = out.chosen + " + local search";
      if (fits(r, o.memory_limit, o.limit_in_bytes) && value(r) < value(out.sim) * (1 - 1e-12)) {
        out.schedule = std::move(refined);
        out.schedule.name = "auto";
        out.sim = r;
        out.chosen = name;
      }
    }
  }
  if (!have && simulated == 0 && !first_error.empty()) throw InputError(first_error);
  if (!have) {
    double least = kInf;
    for (const AutoCandidate& c : out.fixed)
      if (c.defined)
        least = std::min(least, o.limit_in_bytes ? c.peak_bytes : c.peak_micro_batches);
    throw InputError("auto: no schedule fits the memory limit of " + number(o.memory_limit[0]) +
                     (o.limit_in_bytes ? " bytes" : " micro-batches") + " per rank" +
                     (least < kInf
                          ? " (the least any fixed schedule needs is " + number(least) +
                                (o.limit_in_bytes ? std::string()
                                                  : "; the searched ones fit any limit from 1: "
                                                    "every schedule holds a micro-batch's "
                                                    "activations from its F to its W") +
                                ")"
                          : ""));
  }
  return out;
}

}  // namespace baton::schedule
