#include "partitioner/cut.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "memory/error.h"

namespace baton::partitioner {

int64_t to_ticks(double seconds, double ticks_per_second) {
  return int64_t(std::llround(std::max(0.0, seconds) * ticks_per_second));
}

// ---- prepared costs ----

PreparedCosts::PreparedCosts(LayerCosts costs) : c_(std::move(costs)) {
  L_ = int(c_.time.size());
  BATON_CHECK(int(c_.mem.size()) == L_ && int(c_.own_bytes.size()) == L_,
              "per-layer costs of one length");
  if (c_.input_bytes.empty()) c_.input_bytes.assign(size_t(L_), 0);
  BATON_CHECK(int(c_.input_bytes.size()) == L_, "per-layer input bytes");
  pt_.assign(size_t(L_ + 1), 0);
  ps_ = pw_ = pown_ = pin_ = ph_ = pt_;
  for (int l = 0; l < L_; ++l) {
    pt_[size_t(l + 1)] = pt_[size_t(l)] + c_.time[size_t(l)];
    ps_[size_t(l + 1)] = ps_[size_t(l)] + c_.mem[size_t(l)].stash;
    pw_[size_t(l + 1)] = pw_[size_t(l)] + c_.mem[size_t(l)].w_stash;
    pown_[size_t(l + 1)] = pown_[size_t(l)] + c_.own_bytes[size_t(l)];
    pin_[size_t(l + 1)] = pin_[size_t(l)] + c_.input_bytes[size_t(l)];
    ph_[size_t(l + 1)] = ph_[size_t(l)] + c_.mem[size_t(l)].held_through_backward;
  }
  // A[l] = S(0, l) + forward peak of l;
  // Bq[l] = S(0, l) - (W + H)(0, l + 1) + backward peak of l, H: held through backward;
  // Fq[l] = S(0, l) - H(0, l + 1) + fused peak of l (B and W as one action: the later
  // layers' W stash is gone).
  auto a = std::vector<int64_t>(size_t(L_)), b = a, f = a;
  for (int l = 0; l < L_; ++l) {
    a[size_t(l)] = ps_[size_t(l)] + c_.mem[size_t(l)].forward_peak;
    b[size_t(l)] =
        ps_[size_t(l)] - pw_[size_t(l + 1)] - ph_[size_t(l + 1)] + c_.mem[size_t(l)].backward_peak;
    f[size_t(l)] = ps_[size_t(l)] - ph_[size_t(l + 1)] + c_.mem[size_t(l)].fused_peak;
  }
  for (auto* src : {&a, &b, &f}) {
    std::vector<std::vector<int64_t>> st;
    st.push_back(*src);
    for (int w = 1; 2 * w <= L_; w *= 2) {
      const auto& prev = st.back();
      std::vector<int64_t> next(prev.size() - size_t(w));
      for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + size_t(w)]);
      st.push_back(std::move(next));
    }
    (src == &a ? fmax_ : src == &b ? bmax_ : fusedmax_) = std::move(st);
  }
}

int64_t PreparedCosts::range_max(const std::vector<std::vector<int64_t>>& st, int i, int j) const {
  int k = std::bit_width(unsigned(j - i)) - 1;
  return std::max(st[size_t(k)][size_t(i)], st[size_t(k)][size_t(j - (1 << k))]);
}

MicroBatchMemory PreparedCosts::micro_batch(int i, int j) const {
  MicroBatchMemory m;
  m.stash = ps_[size_t(j)] - ps_[size_t(i)];
  m.w_stash = pw_[size_t(j)] - pw_[size_t(i)];
  m.forward_peak = range_max(fmax_, i, j) - ps_[size_t(i)] + pin_[size_t(j)] - pin_[size_t(i)];
  m.backward_peak = range_max(bmax_, i, j) + pw_[size_t(j)] + ph_[size_t(j)] - ps_[size_t(i)];
  m.fused_peak = range_max(fusedmax_, i, j) + ph_[size_t(j)] - ps_[size_t(i)];
  m.held_through_backward = ph_[size_t(j)] - ph_[size_t(i)];
  m.weight_peak = m.w_stash;
  return m;
}

int64_t PreparedCosts::persistent(int i, int j) const {
  int64_t b = pown_[size_t(j)] - pown_[size_t(i)];
  for (const LayerCosts::Shared& s : c_.shared) {
    int64_t n = 0;
    for (int l : s.layers) n += l >= i && l < j ? 1 : 0;
    if (n > 0) b += s.bytes * (1 + n + (n > 1 ? 1 : 0) + c_.optimizer_states + c_.shared_extra);
  }
  return b;
}

int PreparedCosts::time_reach(int i, int64_t bound, int limit) const {
  // The last prefix sum <= pt[i] + bound, within [i, limit].
  auto first = pt_.begin() + i, last = pt_.begin() + limit + 1;
  auto it = std::upper_bound(first, last, pt_[size_t(i)] + bound);
  return int(it - pt_.begin()) - 1;
}

MemoryReach::MemoryReach(const PreparedCosts& c, int64_t capacity, std::vector<PeakTerm> terms)
    : c_(c), capacity_(capacity), terms_(std::move(terms)), reach_(size_t(c.layers() + 1), -1) {}

bool MemoryReach::fits(int i, int j) const {
  return c_.memory(i, j, terms_) <= capacity_;
}

int MemoryReach::at(int i) const {
  const int L = c_.layers();
  if (i >= L) return L;
  int& r = reach_[size_t(i)];
  if (r >= 0) return r;
  // [i, j) fits for j in (i, reach]; a later start reaches at least as far.
  int lo = i;  // known to fit (the empty range)
  if (i > 0 && reach_[size_t(i - 1)] > i) lo = reach_[size_t(i - 1)];
  int step = 1;
  while (lo + step <= L && fits(i, lo + step)) {
    lo += step;
    step *= 2;
  }
  int hi = std::min(lo + step, L + 1);  // does not fit (or beyond the end)
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    (fits(i, mid) ? lo : hi) = mid;
  }
  return r = lo;
}

std::shared_ptr<const MemoryReach> PreparedCosts::memory_reach(
    int64_t capacity, const std::vector<PeakTerm>& terms) const {
  std::vector<PeakTerm> sorted = terms;
  std::sort(sorted.begin(), sorted.end(), [](const PeakTerm& x, const PeakTerm& y) {
    return std::tie(x.kind, x.a, x.b) < std::tie(y.kind, y.a, y.b);
  });
  std::string key = std::to_string(capacity);
  for (const PeakTerm& t : sorted)
    key += "/" + std::to_string(t.kind) + "," + std::to_string(t.a) + "," + std::to_string(t.b);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reach_cache_.find(key);
  if (it != reach_cache_.end()) return it->second;
  auto reach = std::make_shared<const MemoryReach>(*this, capacity, std::move(sorted));
  return reach_cache_.emplace(key, std::move(reach)).first->second;
}

int PreparedCosts::time_start(int j, int64_t bound) const {
  // The first prefix sum >= pt[j] - bound, within [0, j].
  auto it = std::lower_bound(pt_.begin(), pt_.begin() + j + 1, pt_[size_t(j)] - bound);
  return int(it - pt_.begin());
}

// ---- the cut ----

Cutter::Cutter(std::vector<LayerCosts> costs, std::vector<CutStage> stages,
               std::vector<bool> allowed)
    : stages_(std::move(stages)), allowed_(std::move(allowed)) {
  for (LayerCosts& c : costs) costs_.push_back(std::make_shared<const PreparedCosts>(std::move(c)));
  BATON_CHECK(!costs_.empty() && !stages_.empty(), "a cut needs costs and stages");
  L_ = costs_[0]->layers();
  if (allowed_.empty()) allowed_.assign(size_t(L_ + 1), true);
  BATON_CHECK(int(allowed_.size()) == L_ + 1, "one allowed flag per cut position");
}

Cutter::Cutter(std::vector<std::shared_ptr<const PreparedCosts>> costs,
               std::vector<CutStage> stages, std::vector<bool> allowed)
    : costs_(std::move(costs)), stages_(std::move(stages)), allowed_(std::move(allowed)) {
  BATON_CHECK(!costs_.empty() && !stages_.empty(), "a cut needs costs and stages");
  L_ = costs_[0]->layers();
  for (const auto& c : costs_) BATON_CHECK(c->layers() == L_, "costs of one model");
  if (allowed_.empty()) allowed_.assign(size_t(L_ + 1), true);
  BATON_CHECK(int(allowed_.size()) == L_ + 1, "one allowed flag per cut position");
}

int64_t Cutter::time(int k, int i, int j) const {
  return of(k).time(i, j);
}
MicroBatchMemory Cutter::micro_batch(int k, int i, int j) const {
  return of(k).micro_batch(i, j);
}
int64_t Cutter::persistent(int k, int i, int j) const {
  return of(k).persistent(i, j);
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
  for (int k = 0; k + 1 < int(bounds.size()); ++k)
    b = std::max(b, time(k, bounds[size_t(k)], bounds[size_t(k + 1)]));
  return b;
}

bool Cutter::simple() const {
  for (const CutStage& s : stages_)
    if (s.costs != stages_[0].costs || s.capacity > 0 || s.fixed_layers > 0) return false;
  for (bool a : allowed_)
    if (!a) return false;
  return true;
}

bool Cutter::feasible_greedy(int64_t bound, std::vector<int>* bounds) const {
  // Each stage takes as many layers as the bound allows, leaving one for each later
  // stage. With every stage alike this is exact: by induction its k-th end is at least
  // that of any feasible cut, so if any cut fits, its last stage holds a superset of ours.
  const int K = stages();
  const PreparedCosts& c = of(0);
  int pos = 0;
  if (bounds != nullptr) bounds->assign(size_t(K + 1), 0);
  for (int k = 0; k < K; ++k) {
    int end = k == K - 1 ? L_ : c.time_reach(pos, bound, L_ - (K - 1 - k));
    if (k == K - 1 && c.time(pos, L_) > bound) return false;
    if (end <= pos) return false;
    pos = end;
    if (bounds != nullptr) (*bounds)[size_t(k + 1)] = pos;
  }
  return true;
}

bool Cutter::feasible(int64_t bound, const Reach& mem_reach, std::vector<int>* bounds) const {
  const int K = stages();
  // Windows: the position after k stages can only lie in [lo[k], hi[k]]. hi: the furthest
  // the stages before can reach under the time bound alone; lo: the earliest the stages
  // after must start to reach the end (a range that fits has sub-ranges that fit, so
  // both are bounds for every feasible cut). Near the optimum the windows are narrow.
  thread_local std::vector<int> lo, hi, pred_flat;
  thread_local std::vector<uint32_t> mark[2];  // positions after an even / odd number of stages
  thread_local uint32_t stamp = 0;
  lo.assign(size_t(K + 1), 0);
  hi.assign(size_t(K + 1), 0);
  for (int k = 0; k < K; ++k) {
    const int fixed = stages_[size_t(k)].fixed_layers, cap = L_ - (K - 1 - k);
    hi[size_t(k + 1)] = fixed > 0 ? std::min(hi[size_t(k)] + fixed, cap)
                                  : (k == K - 1 ? L_ : of(k).time_reach(hi[size_t(k)], bound, cap));
  }
  lo[size_t(K)] = L_;
  for (int k = K - 1; k >= 0; --k) {
    const int fixed = stages_[size_t(k)].fixed_layers;
    int start = fixed > 0 ? lo[size_t(k + 1)] - fixed : of(k).time_start(lo[size_t(k + 1)], bound);
    lo[size_t(k)] = std::max(start, k);
  }
  if (lo[0] > 0 || hi[size_t(K)] < L_) return false;
  for (int k = 0; k <= K; ++k)
    if (lo[size_t(k)] > hi[size_t(k)]) return false;

  if (mark[0].size() != size_t(L_ + 1) || stamp > UINT32_MAX - uint32_t(K + 2)) {
    mark[0].assign(size_t(L_ + 1), 0);
    mark[1].assign(size_t(L_ + 1), 0);
    stamp = 0;
  }
  // mark[k % 2][j] == base + k: position j is reachable after k stages.
  const uint32_t base = stamp + 1;
  stamp += uint32_t(K + 1);
  pred_flat.resize(size_t(K) * size_t(L_ + 1));
  auto pred = [&](int k, int j) -> int& {
    return pred_flat[size_t(k) * size_t(L_ + 1) + size_t(j)];
  };
  auto reachable = [&](int k, int j) { return mark[k % 2][size_t(j)] == base + uint32_t(k); };
  mark[0][0] = base;
  for (int k = 0; k < K; ++k) {
    const PreparedCosts& c = of(k);
    const int fixed = stages_[size_t(k)].fixed_layers;
    const MemoryReach* mr = mem_reach[size_t(k)].get();
    const int ilo = lo[size_t(k)], ihi = hi[size_t(k)], jlo = lo[size_t(k + 1)],
              jhi = hi[size_t(k + 1)];
    bool any = false;
    auto set = [&](int j, int i) {
      mark[(k + 1) % 2][size_t(j)] = base + uint32_t(k + 1);
      pred(k, j) = i;
      any = true;
    };
    if (fixed > 0) {
      for (int i = ilo; i <= ihi; ++i) {
        int j = i + fixed;
        if (!reachable(k, i) || j < jlo || j > jhi) continue;
        if ((j < L_ && !allowed_[size_t(j)]) || c.time(i, j) > bound || (mr && mr->at(i) < j))
          continue;
        set(j, i);
      }
    } else {
      // For each end j, the latest reachable start i* < j reaches furthest (the reach is
      // monotone in the start), so j is reachable iff i* reaches it.
      int i = ilo, last = -1, treach = -1;
      for (int j = std::max(jlo, ilo + 1); j <= jhi; ++j) {
        for (; i < j && i <= ihi; ++i) {
          if (!reachable(k, i)) continue;
          last = i;
          treach = std::max(treach, last);
          while (treach < jhi && c.time(last, treach + 1) <= bound) ++treach;
        }
        if (last < 0 || j > treach || (mr && j > mr->at(last))) continue;
        if (j < L_ && !allowed_[size_t(j)]) continue;
        set(j, last);
      }
    }
    if (!any) return false;
  }
  if (!reachable(K, L_)) return false;
  if (bounds != nullptr) {
    bounds->assign(size_t(K + 1), 0);
    int j = L_;
    for (int k = K - 1; k >= 0; --k) {
      (*bounds)[size_t(k + 1)] = j;
      j = pred(k, j);
    }
  }
  return true;
}

CutResult Cutter::solve(int64_t at_least) const {
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
    r.reason = "the layer counts per stage add up to " + std::to_string(fixed_sum) +
               ", the model has " + std::to_string(L_) + " layers";
    return r;
  }
  if (fixed_sum + (K - fixed_n) > L_) {
    r.reason = "the layer counts per stage leave fewer layers than stages";
    return r;
  }
  const bool greedy = simple();
  // Furthest end per stage and start under the memory capacity alone (two pointers: the
  // reach is monotone in the start). Independent of the time bound, so computed once.
  Reach mem_reach(static_cast<size_t>(K));
  if (!greedy)
    for (int k = 0; k < K; ++k)
      if (stages_[size_t(k)].capacity > 0)
        mem_reach[size_t(k)] =
            of(k).memory_reach(stages_[size_t(k)].capacity, stages_[size_t(k)].terms);
  auto test = [&](int64_t bound, std::vector<int>* b) {
    return greedy ? feasible_greedy(bound, b) : feasible(bound, mem_reach, b);
  };
  std::vector<int> bounds;
  if (!test(std::numeric_limits<int64_t>::max() / 4, &bounds)) {
    r.reason = "no cut into " + std::to_string(K) + " stages fits the memory capacity";
    for (int k = 0; k < K; ++k)
      if (stages_[size_t(k)].capacity > 0 && stages_[size_t(k)].fixed_layers == 0) {
        bool any = false;
        for (int i = 0; i < L_ && !any; ++i) any = mem_reach[size_t(k)]->at(i) > i;
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
      for (const auto& c : costs_) cheapest = std::min(cheapest, c->time(l, l + 1));
      heaviest = std::max(heaviest, cheapest);
      total += cheapest;
    }
    lo = std::min(hi - 1, std::max({(total + K - 1) / K, heaviest, at_least}) - 1);
  }
  // With a known bound the optimum is usually just above it: gallop up from it (the
  // windows of the feasibility test stay narrow near the optimum), then bisect.
  if (at_least >= 0) {
    int64_t step = std::max<int64_t>(1, (lo + 1) >> 12);
    while (lo + 1 < hi) {
      int64_t probe = std::min(hi - 1, lo + step);
      std::vector<int> b;
      if (test(probe, &b)) {
        hi = bottleneck(b);
        bounds = std::move(b);
        break;
      }
      lo = probe;
      step *= 2;
    }
  }
  // Every candidate lies in (lo, hi]: infeasible at lo, achieved at hi.
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    std::vector<int> b;
    if (test(mid, &b)) {
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
