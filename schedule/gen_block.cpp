// Schedules built from a repeated building block (Qi et al. 2024, "Pipeline Parallelism
// with Controllable Memory"): the block says, per rank, in which time slot of a period
// each of its chunks' F, B (and optionally W) of one micro-batch runs; micro-batch k's
// actions run k periods later. Micro-batches outside [0, m) do not exist, which gives
// the warm-up and the cool-down; W's without a slot fill the free slots after their B.
// Each rank's list is its actions in slot order, so when the block is a valid timetable
// for unit-time actions (every dependency in an earlier slot), the schedule is valid
// for any costs. V-Min and V-Half are two such blocks on the V placement.
#include <algorithm>
#include <deque>

#include "memory/error.h"
#include "schedule/generators.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

struct Slotted {
  long long slot;
  int order;  // ties: F before B before W
  Action a;
};

}  // namespace

Schedule block_schedule(const std::string& name, int p, int m, const BuildingBlock& block) {
  const int v = int(block.chunk_stage.empty() ? 0 : block.chunk_stage[0].size());
  check_common(name, p, m, std::max(v, 1));
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
    if (kind == "v-min") {
      const int L = lag(0);
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
      throw InputError("building block '" + kind + "': expected v-min or v-half");
    }
    b.forward[size_t(r)] = {f0, f1};
    b.backward[size_t(r)] = {b0, b1};
  }
  return b;
}

Schedule v_min(int p, int m) {
  return block_schedule("v-min", p, m, v_block("v-min", p));
}
Schedule v_half(int p, int m) {
  return block_schedule("v-half", p, m, v_block("v-half", p));
}

}  // namespace baton::schedule
