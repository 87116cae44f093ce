// The round-by-round zero-bubble heuristic (after Qi et al., "Zero Bubble Pipeline
// Parallelism", section 3.1; docs/schedules.md, "Automatic schedule"): one stage per
// rank; a warm-up of as many forwards as the memory limit allows and as fit before the
// first backward arrives, then rounds of one F per stage (top down) and one B per stage
// (bottom up), with W passes put wherever a rank would wait and wherever memory must be
// freed. The heuristic times every action with the costs as it goes, so it knows each
// wait; the knobs (ZbGreedyPolicy) pick between filling a wait or leaving it.
#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include "memory/error.h"
#include "schedule/auto_schedule.h"
#include "schedule/generators.h"

namespace baton::schedule {

namespace {

class ZbGreedyBuilder {
 public:
  ZbGreedyBuilder(int p, int m, const Costs& c, const std::vector<double>& limit, bool bytes,
                  const ZbGreedyPolicy& pol)
      : p_(p), m_(m), c_(c), pol_(pol) {
    c.check(p, p);
    limit_ = limit.size() == 1 ? std::vector<double>(size_t(p), limit[0]) : limit;
    full_.resize(size_t(p));
    after_.resize(size_t(p));
    for (int j = 0; j < p; ++j) {
      if (bytes) {
        full_[size_t(j)] = c.activation_bytes.empty() ? 0.0 : c.activation_bytes[size_t(j)];
        after_[size_t(j)] = c.activation_bytes_after_b.empty()
                                ? full_[size_t(j)]
                                : c.activation_bytes_after_b[size_t(j)];
      } else {
        full_[size_t(j)] = after_[size_t(j)] = 1.0;
      }
      if (full_[size_t(j)] > limit_[size_t(j)] * (1 + 1e-12))
        throw InputError("zero-bubble heuristic: memory limit " +
                         std::to_string(limit_[size_t(j)]) + " of rank " + std::to_string(j) +
                         " is below one micro-batch's activations on it (" +
                         std::to_string(full_[size_t(j)]) + ")");
    }
    const size_t pairs = size_t(p) * size_t(m);
    t_f_.assign(pairs, 0.0);
    t_b_.assign(pairs, 0.0);
    n_.assign(size_t(p), {0, 0, 0});
    end_.assign(size_t(p), 0.0);
    mem_.assign(size_t(p), 0.0);
    idle_.assign(size_t(p), 0.0);
    s_.name = "zb-greedy";
    s_.num_ranks = p;
    s_.num_micro_batches = m;
    s_.placement = loop_placement(p, 1);
    s_.ranks.resize(size_t(p));
  }

  Schedule run() {
    warm_up();
    for (long long round = 0; !done(); ++round) {
      if (round > 4LL * m_ + 4) throw std::logic_error("zero-bubble heuristic: no progress");
      forward_round();
      backward_round();
    }
    for (int j = 0; j < p_; ++j)
      while (n_[size_t(j)][2] < m_) put(j, 2);
    return std::move(s_);
  }

 private:
  enum { kF = 0, kB = 1, kW = 2 };
  size_t at(int j, int i) const { return size_t(j) * size_t(m_) + size_t(i); }
  double cost(int j, int k) const {
    return k == kF ? c_.forward[size_t(j)]
                   : (k == kB ? c_.backward_input[size_t(j)] : c_.backward_weight[size_t(j)]);
  }
  double comm(int j) const {  // between stage j and j + 1, either way
    const double bytes = c_.message_bytes.empty() ? 0.0 : c_.message_bytes[size_t(j)];
    return c_.latency + (c_.bandwidth > 0 ? bytes / c_.bandwidth : 0.0);
  }
  bool done() const {
    for (int j = 0; j < p_; ++j)
      if (n_[size_t(j)][kB] < m_) return false;
    return true;
  }
  double max_idle() const { return *std::max_element(idle_.begin(), idle_.end()); }
  bool w_pending(int j) const { return n_[size_t(j)][kW] < n_[size_t(j)][kB]; }

  // When stage j's next action of kind k could start.
  double ready(int j, int k) const {
    const int i = n_[size_t(j)][size_t(k)];
    double t = end_[size_t(j)];
    if (k == kF && j > 0) t = std::max(t, t_f_[at(j - 1, i)] + comm(j - 1));
    if (k == kB && j < p_ - 1) t = std::max(t, t_b_[at(j + 1, i)] + comm(j));
    return t;
  }

  void put(int j, int k) {
    const int i = n_[size_t(j)][size_t(k)];
    const bool deps = k == kF ? j == 0 || n_[size_t(j - 1)][kF] > i
                      : k == kB
                          ? n_[size_t(j)][kF] > i && (j == p_ - 1 || n_[size_t(j + 1)][kB] > i)
                          : n_[size_t(j)][kB] > i;
    if (!deps || i >= m_)
      throw std::logic_error("zero-bubble heuristic: an action placed before its inputs");
    const double start = ready(j, k);
    if (n_[size_t(j)][kF] > 0) idle_[size_t(j)] += start - end_[size_t(j)];
    const double e = start + cost(j, k);
    end_[size_t(j)] = e;
    static constexpr ActionKind kinds[3] = {ActionKind::forward, ActionKind::backward_input,
                                            ActionKind::backward_weight};
    s_.ranks[size_t(j)].push_back(make_action(kinds[k], i, j));
    if (k == kF) {
      t_f_[at(j, i)] = e;
      mem_[size_t(j)] += full_[size_t(j)];
    } else if (k == kB) {
      t_b_[at(j, i)] = e;
      mem_[size_t(j)] -= full_[size_t(j)] - after_[size_t(j)];
    } else {
      mem_[size_t(j)] -= after_[size_t(j)];
    }
    ++n_[size_t(j)][size_t(k)];
  }

  bool forward_fits(int j) const {
    return mem_[size_t(j)] + full_[size_t(j)] <= limit_[size_t(j)] * (1 + 1e-12);
  }

  // W passes while stage j waits until `arrival`: every W that ends by then, and one
  // more that runs past it unless the wait is small enough to leave idle (the stage is
  // then still below the largest idle time of any stage) and the policy leaves such waits.
  void fill_wait(int j, double arrival) {
    while (w_pending(j) && end_[size_t(j)] + cost(j, kW) <= arrival) put(j, kW);
    if (w_pending(j) && end_[size_t(j)] < arrival) {
      const bool small = arrival - end_[size_t(j)] <= max_idle() - idle_[size_t(j)];
      if (!small || pol_.fill_small_waits) put(j, kW);
    }
  }

  void warm_up() {
    for (int j = 0; j < p_; ++j) put(j, kF);
    // How many more forwards each stage runs before its first B: as many as memory holds
    // and as fit before that B's gradient can arrive, computed from the last stage up.
    std::vector<int> extra(size_t(p_), 0);
    double last = t_f_[at(p_ - 1, 0)] + cost(p_ - 1, kB);
    for (int j = p_ - 2; j >= 0; --j) {
      double mem = mem_[size_t(j)], t = end_[size_t(j)];
      const double arrival = last + comm(j);
      int& k = extra[size_t(j)];
      while (1 + k < m_ && mem + full_[size_t(j)] <= limit_[size_t(j)] * (1 + 1e-12)) {
        const double f = cost(j, kF);
        if (pol_.forwards_fit_before_first_b ? t + f > arrival : t >= arrival) break;
        mem += full_[size_t(j)];
        t += f;
        ++k;
      }
      k = std::max(0, k + pol_.warm_up_delta);
      while (k > 0 && (1 + k > m_ ||
                       mem_[size_t(j)] + k * full_[size_t(j)] > limit_[size_t(j)] * (1 + 1e-12)))
        --k;
      t = end_[size_t(j)] + k * cost(j, kF);
      last = std::max(t, arrival) + cost(j, kB);
    }
    // A stage runs no more warm-up forwards than the one above it (it needs their
    // outputs), and fewer unless that one has run them all.
    for (int j = 1; j < p_; ++j) {
      int& k = extra[size_t(j)];
      const int above = extra[size_t(j - 1)];
      while (k > 0 && (k > above || (k == above && 1 + k < m_))) --k;
    }
    for (int j = 0; j < p_; ++j)
      for (int k = 0; k < extra[size_t(j)]; ++k) put(j, kF);
    for (int j = p_ - 1; j >= 0; --j) put(j, kB);
  }

  void forward_round() {
    for (int j = 0; j < p_; ++j) {
      const int i = n_[size_t(j)][kF];
      if (i >= m_ || (j > 0 && i >= n_[size_t(j - 1)][kF])) continue;
      while (!forward_fits(j) && w_pending(j)) put(j, kW);
      if (!forward_fits(j)) continue;
      if (j > 0) fill_wait(j, t_f_[at(j - 1, i)] + comm(j - 1));
      put(j, kF);
    }
  }

  void backward_round() {
    for (int j = p_ - 1; j >= 0; --j) {
      const int i = n_[size_t(j)][kB];
      if (i >= n_[size_t(j)][kF] || (j < p_ - 1 && i >= n_[size_t(j + 1)][kB])) continue;
      if (j < p_ - 1) fill_wait(j, t_b_[at(j + 1, i)] + comm(j));
      if (j == 0 && pol_.first_stage_drains_w && n_[0][kF] == m_)
        while (w_pending(0)) put(0, kW);
      put(j, kB);
    }
  }

  int p_, m_;
  const Costs& c_;
  ZbGreedyPolicy pol_;
  Schedule s_;
  std::vector<double> limit_, full_, after_, t_f_, t_b_, end_, mem_, idle_;
  std::vector<std::array<int, 3>> n_;  // per stage: F, B, W done
};

}  // namespace

Schedule zb_greedy_schedule(int ranks, int micro_batches, const Costs& costs,
                            const std::vector<double>& limit, bool limit_in_bytes,
                            const ZbGreedyPolicy& policy) {
  check_common("zb-greedy", ranks, micro_batches, 1);
  if (limit.size() != 1 && limit.size() != size_t(ranks))
    throw InputError("memory limit: expected one value or one per rank (" + std::to_string(ranks) +
                     "), found " + std::to_string(limit.size()));
  return ZbGreedyBuilder(ranks, micro_batches, costs, limit, limit_in_bytes, policy).run();
}

}  // namespace baton::schedule
