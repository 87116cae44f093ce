// Schedules built from a repeated building block (Qi et al. 2024, "Pipeline Parallelism
// with Controllable Memory"): the block says, per rank, in which time slot of a period
// each of its chunks' F, B (and optionally W) of one micro-batch runs; micro-batch k's
// actions run k periods later. Micro-batches outside [0, m) do not exist, which gives
// the warm-up and the cool-down; W's without a slot fill the free slots after their B.
// Each rank's list is its actions in slot order, so when the block is a valid timetable
// for unit-time actions (every dependency in an earlier slot), the schedule is valid
// for any costs. V-Min and V-Half are two such blocks on the V placement. A block with
// a memory limit is laid out by the reorder pass instead (the paper's squeeze and
// reorder), which V-ZB uses; v_shape_within runs it timed with real costs.
#include <algorithm>
#include <deque>
#include <limits>

#include "memory/error.h"
#include "schedule/detail/util.h"
#include "schedule/generators.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

struct Slotted {
  long long slot;
  int order;  // ties: F before B before W
  Action a;
};

// The reorder pass (the paper's "squeeze" and "reorder" of the warm-up and cool-down):
// the block's actions run as soon as they can under `costs` (F, B, W per stage; a
// message between ranks takes `latency`), each rank, whenever it is free, taking among
// its F's and B's whose inputs are there the one of the earliest block slot (an F only
// if the rank's chunk activations stay within `cap`), and a W (oldest first) only when
// no F or B can start. Each rank's list is the order it ran them in: its peak activation
// memory depends on that order alone, so it holds for any costs, and an order the pass
// completed has no cycle, so it is valid for any costs. With `reserve`, a micro-batch
// entering a rank also needs room for its later chunks there, which makes the pass
// deadlock-free (F's then enter every rank in micro-batch order, so the oldest
// unfinished micro-batch always finds room); without it the pass may stall, and returns
// false. A rank's chunks are in increasing stage order (checked by the caller).
// `makespan`: when the last action ends.
bool reorder_pass(int p, int m, const BuildingBlock& block, const Costs& costs, int cap,
                  bool reserve, std::vector<std::vector<Action>>& out, double* makespan) {
  const int v = int(block.chunk_stage[0].size());
  const int S = p * v;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  auto idx = [&](int stage, int k) { return size_t(stage) * size_t(m) + size_t(k); };
  // When each F / B ends (kNever: not run yet).
  std::vector<double> f_end(size_t(S) * size_t(m), kNever), b_end(size_t(S) * size_t(m), kNever);
  struct Pending {
    Action w;
    double ready;
  };
  struct RankState {
    std::vector<int> next_f, next_b;  // per chunk: the next micro-batch
    std::deque<Pending> ws;           // B run, W not (oldest first)
    int live = 0;                     // chunk activations held (F run, W not)
    double free = 0;                  // when the rank is next free
  };
  std::vector<RankState> st(static_cast<size_t>(p));
  for (auto& rs : st) {
    rs.next_f.assign(size_t(v), 0);
    rs.next_b.assign(size_t(v), 0);
  }
  std::vector<int> owner(static_cast<size_t>(S), -1);
  for (int r = 0; r < p; ++r)
    for (int stage : block.chunk_stage[size_t(r)]) owner[size_t(stage)] = r;
  auto arrival = [&](double end, int from_stage, int to_stage) {
    if (end == kNever) return kNever;
    return owner[size_t(from_stage)] != owner[size_t(to_stage)] ? end + costs.latency : end;
  };
  out.assign(size_t(p), {});
  for (auto& list : out) list.reserve(size_t(3 * v * m));
  const long long total = 3LL * S * m;
  long long done = 0;
  double t = 0, last_end = 0;
  while (done < total) {
    double next_t = kNever;
    for (int r = 0; r < p; ++r) {
      RankState& rs = st[size_t(r)];
      if (rs.free > t) {
        next_t = std::min(next_t, rs.free);
        continue;
      }
      const auto& stages = block.chunk_stage[size_t(r)];
      long long best = -1;
      int best_c = -1;
      bool best_f = false;
      for (int c = 0; c < v; ++c) {
        const int stage = stages[size_t(c)];
        if (int k = rs.next_f[size_t(c)]; k < m) {
          const double ready = stage == 0 ? 0 : arrival(f_end[idx(stage - 1, k)], stage - 1, stage);
          // Room for this chunk, and with `reserve` for the later chunks of every
          // micro-batch that has entered the rank (this one included).
          int need = rs.live + 1;
          if (reserve)
            for (int c2 = 1; c2 < v; ++c2)
              need += rs.next_f[0] + (c == 0) - rs.next_f[size_t(c2)] - (c2 == c);
          const long long key = 1LL * k * block.period + block.forward[size_t(r)][size_t(c)];
          if (ready <= t && need <= cap && (best < 0 || key < best))
            best = key, best_c = c, best_f = true;
          else if (ready > t && ready < kNever)
            next_t = std::min(next_t, ready);
        }
        if (int k = rs.next_b[size_t(c)]; k < m) {
          const double ready =
              std::max(f_end[idx(stage, k)],
                       stage + 1 == S ? 0.0 : arrival(b_end[idx(stage + 1, k)], stage + 1, stage));
          const long long key = 1LL * k * block.period + block.backward[size_t(r)][size_t(c)];
          if (ready <= t && (best < 0 || key < best))
            best = key, best_c = c, best_f = false;
          else if (ready > t && ready < kNever)
            next_t = std::min(next_t, ready);
        }
      }
      auto& list = out[size_t(r)];
      if (best_c >= 0) {
        const int stage = stages[size_t(best_c)];
        if (best_f) {
          const int k = rs.next_f[size_t(best_c)]++;
          ++rs.live;
          list.push_back(make_action(K::forward, k, stage));
          rs.free = f_end[idx(stage, k)] = t + costs.forward[size_t(stage)];
        } else {
          const int k = rs.next_b[size_t(best_c)]++;
          list.push_back(make_action(K::backward_input, k, stage));
          rs.free = b_end[idx(stage, k)] = t + costs.backward_input[size_t(stage)];
          rs.ws.push_back({make_action(K::backward_weight, k, stage), rs.free});
        }
      } else if (!rs.ws.empty() && rs.ws.front().ready <= t) {
        const Action w = rs.ws.front().w;
        rs.ws.pop_front();
        list.push_back(w);
        --rs.live;
        rs.free = t + costs.backward_weight[size_t(w.stage)];
      } else {
        if (!rs.ws.empty()) next_t = std::min(next_t, rs.ws.front().ready);
        continue;
      }
      ++done;
      last_end = std::max(last_end, rs.free);
      next_t = std::min(next_t, rs.free);
    }
    if (done < total && next_t == kNever) return false;  // stalled: every rank waits on memory
    // Zero-cost actions end when they start: look again at the same time.
    t = std::max(t, next_t);
  }
  if (makespan) *makespan = last_end;
  return true;
}

// Unit time per action (F = B = W = 1 per stage, free messages): the block's own clock.
Costs unit_costs(int stages) {
  return Costs::uniform(stages, 1, 1, 1);
}
}  // namespace

Schedule block_schedule(const std::string& name, int p, int m, const BuildingBlock& block,
                        const Costs* costs) {
  const int v = int(block.chunk_stage.empty() ? 0 : block.chunk_stage[0].size());
  check_common(name, p, m, std::max(v, 1));
  check_name(name, "name");
  auto bad = [&](const std::string& why) { throw InputError(name + ": building block: " + why); };
  if (block.period < 1) bad("period: expected at least 1, found " + std::to_string(block.period));
  if (int(block.chunk_stage.size()) != p || int(block.forward.size()) != p ||
      int(block.backward.size()) != p)
    bad("expected one entry per rank (" + std::to_string(p) +
        ") in chunk_stage, forward and "
        "backward");
  if (!block.weight.empty() && int(block.weight.size()) != p)
    bad("weight: expected one entry per rank or none");
  Schedule s;
  s.name = name;
  s.num_ranks = p;
  s.num_micro_batches = m;
  s.placement.assign(size_t(p) * size_t(v), -1);
  for (int r = 0; r < p; ++r) {
    if (int(block.chunk_stage[size_t(r)].size()) != v ||
        int(block.forward[size_t(r)].size()) != v || int(block.backward[size_t(r)].size()) != v ||
        (!block.weight.empty() && int(block.weight[size_t(r)].size()) != v))
      bad("rank " + std::to_string(r) + ": expected " + std::to_string(v) + " chunks");
    for (int st : block.chunk_stage[size_t(r)]) {
      if (st < 0 || st >= p * v || s.placement[size_t(st)] >= 0)
        bad("rank " + std::to_string(r) + ": stage " + std::to_string(st) +
            " is out of range or held twice");
      s.placement[size_t(st)] = r;
    }
  }
  s.ranks.resize(size_t(p));
  if (!(block.memory_limit >= 0))
    bad("memory_limit: expected 0 (none) or micro-batches > 0, found " +
        detail::number(block.memory_limit));
  if (block.memory_limit > 0) {
    // A rank never holds more than its m x v chunk activations: a larger limit (inf
    // too) is that one, and the int conversion stays in range.
    const int cap = int(std::min(block.memory_limit, double(m)) * v + 1e-9);
    if (cap < v)
      bad("memory_limit: expected at least 1 micro-batch (one activation per chunk), found " +
          detail::number(block.memory_limit));
    for (int r = 0; r < p; ++r)
      if (!std::is_sorted(block.chunk_stage[size_t(r)].begin(), block.chunk_stage[size_t(r)].end()))
        bad("rank " + std::to_string(r) +
            ": with a memory_limit, chunks in increasing stage order");
    const Costs unit = unit_costs(p * v);
    const Costs& use = costs ? *costs : unit;
    if (costs) use.check(p * v, p);
    if (!reorder_pass(p, m, block, use, cap, false, s.ranks, nullptr) &&
        !reorder_pass(p, m, block, use, cap, true, s.ranks, nullptr))
      throw std::logic_error(name + ": the reorder pass stalled with reservations");
    return s;
  }
  std::vector<Slotted> items;
  for (int r = 0; r < p; ++r) {
    items.clear();
    for (int c = 0; c < v; ++c) {
      const int st = block.chunk_stage[size_t(r)][size_t(c)];
      for (int k = 0; k < m; ++k) {
        const long long base = 1LL * k * block.period;
        items.push_back(
            {base + block.forward[size_t(r)][size_t(c)], 0, make_action(K::forward, k, st)});
        items.push_back({base + block.backward[size_t(r)][size_t(c)], 1,
                         make_action(K::backward_input, k, st)});
        if (!block.weight.empty())
          items.push_back({base + block.weight[size_t(r)][size_t(c)], 2,
                           make_action(K::backward_weight, k, st)});
      }
    }
    std::stable_sort(items.begin(), items.end(), [](const Slotted& x, const Slotted& y) {
      return x.slot != y.slot ? x.slot < y.slot : x.order < y.order;
    });
    auto& list = s.ranks[size_t(r)];
    list.reserve(items.size() * (block.weight.empty() ? 3 : 2) / 2);
    if (!block.weight.empty()) {
      for (const Slotted& it : items) list.push_back(it.a);
      continue;
    }
    // W's fill the free slots, oldest B first; the rest follow the last slot.
    std::deque<Action> pending;
    long long slot = items.empty() ? 0 : items.front().slot;
    size_t i = 0;
    while (i < items.size()) {
      if (items[i].slot == slot) {
        for (; i < items.size() && items[i].slot == slot; ++i) {
          list.push_back(items[i].a);
          if (items[i].a.kind == K::backward_input)
            pending.push_back(
                make_action(K::backward_weight, items[i].a.micro_batch, items[i].a.stage));
        }
      } else if (!pending.empty()) {
        list.push_back(pending.front());
        pending.pop_front();
      }
      ++slot;
    }
    for (const Action& w : pending) list.push_back(w);
  }
  return s;
}

// The blocks: period 6 (two chunks' F, B, W per rank), rank r holding stage r (chunk 0,
// on the way down) and 2p-1-r (chunk 1, on the way back up). Within a period, rank r's
// F of chunk 0 is `r` slots after rank 0's (one slot per hop down), its chunk-1 F comes
// back up, then the backward of chunk 1 goes down and that of chunk 0 up. The blocks
// differ in how long each micro-batch's activations live (the gap from a chunk's F to
// its B), which sets the memory: about 1/3 (V-Min) or 1/2 (V-Half) of 1F1B's p
// micro-batches.
BuildingBlock v_block(const std::string& kind, int p) {
  if (kind != "v-min" && kind != "v-half" && kind != "v-zb")
    throw InputError("building block '" + kind + "': expected v-min, v-half or v-zb");
  check_common(kind, p, 1, 2);  // the ranks generate() takes
  BuildingBlock b;
  b.period = 6;
  b.chunk_stage.resize(size_t(p));
  b.forward.resize(size_t(p));
  b.backward.resize(size_t(p));
  for (int r = 0; r < p; ++r) {
    b.chunk_stage[size_t(r)] = {r, 2 * p - 1 - r};
    // One slot per hop (V-Min): F of chunk 0 in slot r, back up through chunk 1,
    // then after a lag L the backward of chunk 1 down and of chunk 0 up. Rank 0's chunk 0
    // lives about 4p + L slots and its chunk 1 L: (4p + 2L) / 12 micro-batches. L is even
    // with p + L/2 not a multiple of 3, so the four slots differ modulo the period.
    auto lag = [&](int want) {
      int L = want + (want % 2);
      while ((p + L / 2) % 3 == 0) L += 2;
      return L;
    };
    int f0, f1, b1, b0;
    if (kind == "v-min" || kind == "v-zb") {
      // V-ZB: the same shape with a lag of about 4p, so that a micro-batch lives 12p
      // slots on rank 0 (p micro-batches, 1F1B's), laid out by the reorder pass at that
      // limit: the long lag ranks the warm-up's forwards before the first backwards,
      // and the pass fills the warm-up with them and the cool-down with W's.
      const int L = lag(kind == "v-zb" ? 4 * p : 0);
      f0 = r;
      f1 = 2 * p - 1 - r;
      b1 = 2 * p + L + r;
      b0 = 4 * p + L - 1 - r;
    } else if (kind == "v-half") {
      // Two slots per hop on the way down: chunk 0 lives about 6p slots on rank 0, chunk
      // 1 about 3r: p/2 micro-batches.
      const int gap = p % 2 == 0 ? 3 : 0;
      f0 = 2 * r;
      f1 = 3 * p - 2 - r;
      b1 = 3 * p + gap - 1 + 2 * r;
      b0 = 6 * p + gap - 2 - r;
    } else {
      throw InputError("building block '" + kind + "': expected v-min, v-half or v-zb");
    }
    b.forward[size_t(r)] = {f0, f1};
    b.backward[size_t(r)] = {b0, b1};
  }
  if (kind == "v-zb") b.memory_limit = p;
  return b;
}

Schedule v_min(int p, int m) {
  return block_schedule("v-min", p, m, v_block("v-min", p));
}
Schedule v_half(int p, int m) {
  return block_schedule("v-half", p, m, v_block("v-half", p));
}
// V-ZB: the reorder pass at p micro-batches over V-Min's shape for a few lags, keeping
// the order that finishes first (ties: the longest lag, the block whose lifetimes are
// 1F1B's). The lag sets how long forwards outrank the first backwards; at m between p
// and 2p the best one varies (tests/schedule/test_blocks.cpp).
Schedule v_zb(int p, int m) {
  return v_shape_within("v-zb", p, m, Costs::uniform(2 * p, 1, 1, 1), p);
}

Schedule v_shape_within(const std::string& name, int p, int m, const Costs& costs,
                        double memory_limit) {
  check_common(name, p, m, 2);
  costs.check(2 * p, p);
  // As block_schedule's: at most the m micro-batches there are (NaN: refused below).
  const int cap = memory_limit >= 1 ? int(std::min(memory_limit, double(m)) * 2 + 1e-9) : 0;
  if (cap < 2)
    throw InputError(name + ": memory limit: expected at least 1 micro-batch, found " +
                     detail::number(memory_limit));
  BuildingBlock best;
  double best_time = -1;
  int last_lag = -1;
  for (int want : {4 * p, 3 * p, 2 * p, p, p / 2, 2, 0}) {
    int L = want + want % 2;
    while ((p + L / 2) % 3 == 0) L += 2;
    if (L == last_lag) continue;
    last_lag = L;
    BuildingBlock b = v_block("v-zb", p);
    b.memory_limit = cap / 2.0;
    for (int r = 0; r < p; ++r) {
      b.backward[size_t(r)][1] = 2 * p + L + r;
      b.backward[size_t(r)][0] = 4 * p + L - 1 - r;
    }
    std::vector<std::vector<Action>> ranks;
    double time = 0;
    if (!reorder_pass(p, m, b, costs, cap, false, ranks, &time)) continue;
    if (best_time < 0 || time < best_time * (1 - 1e-12)) {
      best_time = time;
      best = b;
    }
  }
  if (best_time < 0) {  // every lag stalled without reservations: the pass with them
    best = v_block("v-zb", p);
    best.memory_limit = cap / 2.0;
  }
  return block_schedule(name, p, m, best, &costs);
}

}  // namespace baton::schedule
