#include "partitioner/cut.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "memory/error.h"

namespace baton::partitioner {

int64_t to_ticks(double seconds, double ticks_per_second) {
  return int64_t(std::llround(std::max(0.0, seconds) * ticks_per_second));
}

Cutter::Cutter(std::vector<LayerCosts> costs, std::vector<CutStage> stages, std::vector<bool> allowed)
    : costs_(std::move(costs)), stages_(std::move(stages)), allowed_(std::move(allowed)) {
  BATON_CHECK(!costs_.empty() && !stages_.empty(), "a cut needs costs and stages");
  L_ = int(costs_[0].time.size());
  if (allowed_.empty()) allowed_.assign(size_t(L_ + 1), true);
  BATON_CHECK(int(allowed_.size()) == L_ + 1, "one allowed flag per cut position");
  for (const LayerCosts& c : costs_) {
    BATON_CHECK(int(c.time.size()) == L_ && int(c.mem.size()) == L_ && int(c.own_bytes.size()) == L_,
                "per-layer costs of one length");
    Tables t;
    t.pt.assign(size_t(L_ + 1), 0);
    t.ps = t.pw = t.pown = t.pt;
    for (int l = 0; l < L_; ++l) {
      t.pt[size_t(l + 1)] = t.pt[size_t(l)] + c.time[size_t(l)];
      t.ps[size_t(l + 1)] = t.ps[size_t(l)] + c.mem[size_t(l)].stash;
      t.pw[size_t(l + 1)] = t.pw[size_t(l)] + c.mem[size_t(l)].w_stash;
      t.pown[size_t(l + 1)] = t.pown[size_t(l)] + c.own_bytes[size_t(l)];
    }
    // A[l] = S(0, l) + forward peak of l; Bq[l] = S(0, l) - W(0, l + 1) + backward peak of l.
    auto a = std::vector<int64_t>(size_t(L_)), b = std::vector<int64_t>(size_t(L_));
    for (int l = 0; l < L_; ++l) {
      a[size_t(l)] = t.ps[size_t(l)] + c.mem[size_t(l)].forward_peak;
      b[size_t(l)] = t.ps[size_t(l)] - t.pw[size_t(l + 1)] + c.mem[size_t(l)].backward_peak;
    }
    for (auto* pair : {&a, &b}) {
      std::vector<std::vector<int64_t>> st;
      st.push_back(*pair);
      for (int w = 1; 2 * w <= L_; w *= 2) {
        const auto& prev = st.back();
        std::vector<int64_t> next(size_t(L_ - 2 * w + 1));
        for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + size_t(w)]);
        st.push_back(std::move(next));
      }
      (pair == &a ? t.fmax : t.bmax) = std::move(st);
    }
    tables_.push_back(std::move(t));
  }
}

int64_t Cutter::range_max(const std::vector<std::vector<int64_t>>& st, int i, int j) const {
  int len = j - i;
  int k = std::bit_width(unsigned(len)) - 1;
  return std::max(st[size_t(k)][size_t(i)], st[size_t(k)][size_t(j - (1 << k))]);
}

int64_t Cutter::time(int k, int i, int j) const {
  const Tables& t = tables_[size_t(stages_[size_t(k)].costs)];
  return t.pt[size_t(j)] - t.pt[size_t(i)];
}

MicroBatchMemory Cutter::micro_batch(int k, int i, int j) const {
  const Tables& t = tables_[size_t(stages_[size_t(k)].costs)];
  MicroBatchMemory m;
  m.stash = t.ps[size_t(j)] - t.ps[size_t(i)];
  m.w_stash = t.pw[size_t(j)] - t.pw[size_t(i)];
  m.forward_peak = range_max(t.fmax, i, j) - t.ps[size_t(i)];
  m.backward_peak = range_max(t.bmax, i, j) + t.pw[size_t(j)] - t.ps[size_t(i)];
  m.weight_peak = m.w_stash;
  return m;
}

int64_t Cutter::persistent(int k, int i, int j) const {
  const LayerCosts& c = costs_[size_t(stages_[size_t(k)].costs)];
  const Tables& t = tables_[size_t(stages_[size_t(k)].costs)];
  int64_t b = t.pown[size_t(j)] - t.pown[size_t(i)];
  for (const LayerCosts::Shared& s : c.shared) {
    int64_t n = 0;
    for (int l : s.layers) n += l >= i && l < j ? 1 : 0;
    if (n > 0) b += s.bytes * (1 + n + (n > 1 ? 1 : 0) + c.optimizer_states);
  }
  return b;
}

int64_t Cutter::memory(int k, int i, int j) const {
  return persistent(k, i, j) + eval_peak(stages_[size_t(k)].terms, micro_batch(k, i, j));
}

bool Cutter::fits_memory(int k, int i, int j) const {
  int64_t cap = stages_[size_t(k)].capacity;
  return cap <= 0 || memory(k, i, j) <= cap;
}

int64_t Cutter::bottleneck(const std::vector<int>& bounds) const {
  int64_t b = 0;
  for (int k = 0; k + 1 < int(bounds.size()); ++k) b = std::max(b, time(k, bounds[size_t(k)], bounds[size_t(k + 1)]));
  return b;
}

bool Cutter::feasible(int64_t bound, const std::vector<std::vector<int>>& mem_reach,
                      std::vector<int>* bounds) const {
  const int K = stages();
  thread_local std::vector<char> reach, next;
  thread_local std::vector<int> pred_flat;
  reach.assign(size_t(L_ + 1), 0);
  next.assign(size_t(L_ + 1), 0);
  pred_flat.resize(size_t(K) * size_t(L_ + 1));
  auto pred = [&](int k, int j) -> int& { return pred_flat[size_t(k) * size_t(L_ + 1) + size_t(j)]; };
  reach[0] = 1;
  for (int k = 0; k < K; ++k) {
    const Tables& t = tables_[size_t(stages_[size_t(k)].costs)];
    const int fixed = stages_[size_t(k)].fixed_layers;
    const int max_end = L_ - (K - 1 - k);  // later stages need a layer each
    std::fill(next.begin(), next.end(), 0);
    if (fixed > 0) {
      for (int i = 0; i + fixed <= max_end; ++i) {
        int j = i + fixed;
        if (!reach[size_t(i)] || (j < L_ && !allowed_[size_t(j)]) || (k == K - 1 && j != L_)) continue;
        if (t.pt[size_t(j)] - t.pt[size_t(i)] > bound || mem_reach[size_t(k)][size_t(i)] < j) continue;
        next[size_t(j)] = 1;
        pred(k, j) = i;
      }
    } else {
      // For each end j, the latest reachable start i* < j reaches furthest (reach is
      // monotone in the start), so j is reachable iff i* reaches it.
      int last = -1, treach = -1;
      for (int j = 1; j <= max_end; ++j) {
        if (reach[size_t(j - 1)]) {
          last = j - 1;
          // Furthest end from `last` within the time bound: two pointers on the prefix sums.
          treach = std::max(treach, last);
          while (treach < L_ && t.pt[size_t(treach + 1)] - t.pt[size_t(last)] <= bound) ++treach;
        }
        if (last < 0) continue;
        if (j > std::min(treach, mem_reach[size_t(k)][size_t(last)])) continue;
        if (j < L_ && !allowed_[size_t(j)]) continue;
        if (k == K - 1 && j != L_) continue;
        next[size_t(j)] = 1;
        pred(k, j) = last;
      }
    }
    reach.swap(next);
  }
  if (!reach[size_t(L_)]) return false;
  if (bounds != nullptr) {
    bounds->assign(size_t(K + 1), 0);
    int j = L_;
    for (int k = K - 1; k >= 0; --k) {
      (*bounds)[size_t(k + 1)] = j;
      j = pred(k, j);
    }
    (*bounds)[0] = 0;
  }
  return true;
}

CutResult Cutter::solve() const {
  const int K = stages();
  CutResult r;
  if (K > L_) {
    r.reason = std::to_string(K) + " stages for " + std::to_string(L_) +
               " layers: every stage needs at least one layer";
    return r;
  }
  int fixed_sum = 0, fixed_n = 0;
  for (const CutStage& s : stages_)
    if (s.fixed_layers > 0) {
      fixed_sum += s.fixed_layers;
      ++fixed_n;
    }
  if (fixed_n == K && fixed_sum != L_) {
    r.reason = "the layer counts per stage add up to " + std::to_string(fixed_sum) + ", the model has " +
               std::to_string(L_) + " layers";
    return r;
  }
  if (fixed_sum + (K - fixed_n) > L_) {
    r.reason = "the fixed layer counts leave fewer layers than stages";
    return r;
  }
  // Furthest end per stage and start under the memory capacity alone (two pointers: the
  // reach is monotone in the start). Independent of the time bound, so computed once.
  std::vector<std::vector<int>> mem_reach(size_t(K), std::vector<int>(size_t(L_ + 1), L_));
  for (int k = 0; k < K; ++k) {
    if (stages_[size_t(k)].capacity <= 0) continue;
    int j = 0;
    for (int i = 0; i < L_; ++i) {
      j = std::max(j, i);
      while (j < L_ && fits_memory(k, i, j + 1)) ++j;
      mem_reach[size_t(k)][size_t(i)] = j;
    }
  }
  std::vector<int> bounds;
  if (!feasible(std::numeric_limits<int64_t>::max() / 4, mem_reach, &bounds)) {
    r.reason = "no cut into " + std::to_string(K) + " stages fits the memory capacity";
    for (int k = 0; k < K; ++k)
      if (stages_[size_t(k)].capacity > 0 && stages_[size_t(k)].fixed_layers == 0) {
        bool any = false;
        for (int i = 0; i < L_ && !any; ++i) any = mem_reach[size_t(k)][size_t(i)] > i;
        if (!any) r.reason += " (stage " + std::to_string(k) + " cannot hold even one layer)";
      }
    return r;
  }
  int64_t hi = bottleneck(bounds), lo = -1;
  // A lower bound to start from: some stage takes at least its share of the total and
  // the heaviest layer (each layer at its cheapest kind of stage).
  {
    int64_t total = 0, heaviest = 0;
    for (int l = 0; l < L_; ++l) {
      int64_t cheapest = INT64_MAX;
      for (const Tables& t : tables_) cheapest = std::min(cheapest, t.pt[size_t(l + 1)] - t.pt[size_t(l)]);
      heaviest = std::max(heaviest, cheapest);
      total += cheapest;
    }
    lo = std::max(lo, std::max((total + K - 1) / K, heaviest) - 1);
    if (lo >= hi) lo = hi - 1;
  }
  // Every candidate lies in (lo, hi]: infeasible at lo, achieved at hi.
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    std::vector<int> b;
    if (feasible(mid, mem_reach, &b)) {
      hi = bottleneck(b);
      bounds = std::move(b);
    } else {
      lo = mid;
    }
  }
  r.feasible = true;
  r.bounds = bounds;
  r.bottleneck = hi;
  return r;
}

}  // namespace baton::partitioner
