// GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, and the generate() dispatcher.
#include "schedule/generators.h"

#include <algorithm>

#include "memory/error.h"
#include "schedule/detail/util.h"
#include "schedule/forward_only.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

constexpr int kMaxRanks = 4096;

void check_range(const std::string& name, const char* what, int value, int lo, int hi,
                 const std::string& why = "") {
  if (value < lo || value > hi)
    throw InputError(name + ": " + what + ": expected " +
                     (hi >= (1 << 30) ? "at least " + std::to_string(lo)
                                      : std::to_string(lo) + " to " + std::to_string(hi)) +
                     (why.empty() ? "" : " (" + why + ")") + ", found " + std::to_string(value));
}

}  // namespace

void check_common(const std::string& name, int p, int m, int v) {
  check_range(name, "ranks", p, 1, kMaxRanks);
  check_range(name, "micro-batches", m, 1, kMaxGeneratedMicroBatches);
  const long long pairs = 1LL * p * v * m;
  if (pairs > (1LL << 22))
    throw InputError(name + ": stages x micro-batches = " + std::to_string(pairs) +
                     " is beyond the supported " + std::to_string(1LL << 22));
}

namespace {

// One rank of a schedule with one stage per rank, written as the "expansion" of its
// steady state: step x runs F(x), then the backward of micro-batch x - lag_b, then
// W(x - lag_w), each only when its micro-batch exists. 1F1B is lag_b = p-1-r with BW;
// ZB-H1 adds W with lag_w = p-1; ZB-H2 doubles both lags.
void expand_rank(std::vector<Action>& out, int m, int stage, int lag_b, int lag_w, bool split) {
  const int last = m - 1 + std::max(lag_b, split ? lag_w : 0);
  for (int x = 0; x <= last; ++x) {
    if (x < m) out.push_back(make_action(K::forward, x, stage));
    const int b = x - lag_b;
    if (b >= 0 && b < m)
      out.push_back(make_action(split ? K::backward_input : K::full_backward, b, stage));
    const int w = x - lag_w;
    if (split && w >= 0 && w < m) out.push_back(make_action(K::backward_weight, w, stage));
  }
}

}  // namespace

void truncate_micro_batches(Schedule& s, int m) {
  for (auto& list : s.ranks)
    std::erase_if(list,
                  [&](const Action& a) { return has_micro_batch(a.kind) && a.micro_batch >= m; });
  s.num_micro_batches = m;
}

Schedule gpipe(int p, int m) {
  check_common("gpipe", p, m, 1);
  Schedule s = detail::skeleton("gpipe", p, m, loop_placement(p, 1));
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[size_t(r)];
    for (int b = 0; b < m; ++b) list.push_back(make_action(K::forward, b, r));
    for (int b = 0; b < m; ++b) list.push_back(make_action(K::full_backward, b, r));
  }
  return s;
}

Schedule one_f_one_b(int p, int m) {
  check_common("1f1b", p, m, 1);
  Schedule s = detail::skeleton("1f1b", p, m, loop_placement(p, 1));
  for (int r = 0; r < p; ++r) expand_rank(s.ranks[size_t(r)], m, r, p - 1 - r, 0, false);
  return s;
}

Schedule zb_h1(int p, int m) {
  check_common("zb-h1", p, m, 1);
  Schedule s = detail::skeleton("zb-h1", p, m, loop_placement(p, 1));
  for (int r = 0; r < p; ++r) expand_rank(s.ranks[size_t(r)], m, r, p - 1 - r, p - 1, true);
  return s;
}

Schedule zb_h2(int p, int m) {
  check_common("zb-h2", p, m, 1);
  Schedule s = detail::skeleton("zb-h2", p, m, loop_placement(p, 1));
  for (int r = 0; r < p; ++r)
    expand_rank(s.ranks[size_t(r)], m, r, 2 * (p - 1 - r), 2 * (p - 1), true);
  return s;
}

bool is_forward_only(const Schedule& s) {
  bool forward = false;
  for (const auto& list : s.ranks)
    for (const Action& a : list) {
      if (a.kind == K::forward) forward = true;
      if (a.kind == K::backward_input || a.kind == K::backward_weight ||
          a.kind == K::full_backward || a.kind == K::reduce_gradients ||
          a.kind == K::optimizer_step)
        return false;
    }
  return forward;
}

Schedule forward_only_like(const Schedule& t) {
  Schedule s = detail::skeleton("forward-only", t.num_ranks, t.num_micro_batches, t.placement);
  s.num_directions = t.num_directions;
  const int per = s.micro_batches_per_direction();
  for (int r = 0; r < s.num_ranks; ++r)
    for (int stage : stages_of_rank(s, r)) {
      const int d = stage_direction(s, stage);
      for (int b = d * per; b < (d + 1) * per; ++b)
        s.ranks[size_t(r)].push_back(make_action(K::forward, b, stage));
    }
  return s;
}

Schedule forward_only(int p, int m) {
  check_common("forward-only", p, m, 1);
  Schedule s = detail::skeleton("forward-only", p, m, loop_placement(p, 1));
  for (int r = 0; r < p; ++r)
    for (int b = 0; b < m; ++b) s.ranks[size_t(r)].push_back(make_action(K::forward, b, r));
  return s;
}

Schedule interleaved_1f1b(int p, int m, int v) {
  const std::string name = "interleaved-1f1b";
  check_range(name, "chunks", v, 1, 64);
  check_range(name, "micro-batches", m, 1, kMaxGeneratedMicroBatches);
  check_range(name, "ranks", p, 1, kMaxRanks);
  // The limits on what was asked: the whole groups built below are cut back to m (the
  // rounded count had been refused, naming numbers nobody typed).
  check_common(name, p, m, v);
  // One chunk is 1F1B, as Megatron then runs its plain schedule: the formula's warm-up
  // below would hold twice 1F1B's micro-batches for the same step.
  const int m_full = v == 1 ? m : (m + p - 1) / p * p;  // whole groups of p micro-batches
  Schedule s = detail::skeleton(name, p, m_full, loop_placement(p, v));
  // Virtual step i of a rank works on micro-batch (i / (p v)) p + i % p of chunk
  // (i / p) % v; backward walks the chunks in reverse.
  const int total = m_full * v;
  auto mb_of = [&](int i) { return i / (p * v) * p + i % p; };
  auto chunk_of = [&](int i, bool backward) {
    int k = (i / p) % v;
    return backward ? v - 1 - k : k;
  };
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[size_t(r)];
    const int warmup = std::min(total, v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p);
    auto fwd = [&](int i) {
      list.push_back(make_action(K::forward, mb_of(i), chunk_of(i, false) * p + r));
    };
    auto bwd = [&](int i) {
      list.push_back(make_action(K::full_backward, mb_of(i), chunk_of(i, true) * p + r));
    };
    for (int i = 0; i < warmup; ++i) fwd(i);
    for (int i = 0; i < total - warmup; ++i) {
      fwd(warmup + i);
      bwd(i);
    }
    for (int i = total - warmup; i < total; ++i) bwd(i);
  }
  if (m_full != m) truncate_micro_batches(s, m);
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
                                                 "zb-h2", "zb-v", "dualpipev",        "dualpipe"};
  return names;
}

const std::vector<std::string>& all_schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = schedule_names();
    for (const char* n : {"v-min", "v-half", "v-zb"}) all.push_back(n);
    return all;
  }();
  return names;
}

namespace {
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

namespace {
// The canonical name, or "" when name_in is none; forward-only included.
std::string known_schedule_name(const std::string& name_in) {
  std::string name = name_in;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (name == "interleaved") name = "interleaved-1f1b";
  if (name == "dualpipe-v") name = "dualpipev";
  if (name == "forward-only") return name;
  for (const auto& n : all_schedule_names())
    if (n == name) return name;
  return "";
}
}  // namespace

std::string canonical_schedule_name(const std::string& name_in) {
  std::string name = known_schedule_name(name_in);
  if (name.empty())
    throw InputError("unknown schedule '" + name_in + "' (expected one of " +
                     joined(all_schedule_names()) + ", forward-only (evaluation))");
  return name;
}

std::string canonical_training_schedule_name(const std::string& name_in) {
  const std::string name = known_schedule_name(name_in);
  if (name.empty())
    throw InputError("unknown schedule '" + name_in + "' (expected one of " +
                     joined(all_schedule_names()) + ")");
  if (name == "forward-only")
    throw InputError(
        "forward-only evaluates (no backward, no optimizer step); a training schedule is one of " +
        joined(all_schedule_names()));
  return name;
}

Schedule generate(const std::string& name_in, int p, int m, int v) {
  const std::string name = canonical_schedule_name(name_in);
  auto only = [&](int allowed) {
    if (v != 0 && v != allowed)
      throw InputError(name + ": chunks: expected " + std::to_string(allowed) +
                       " (the schedule's own), found " + std::to_string(v));
  };
  if (name == "interleaved-1f1b") return interleaved_1f1b(p, m, v == 0 ? 2 : v);
  if (name == "forward-only") {
    only(1);
    return forward_only(p, m);
  }
  using Gen = Schedule (*)(int, int);
  struct Entry {
    const char* name;
    int chunks;
    Gen gen;
  };
  static constexpr Entry entries[] = {{"gpipe", 1, gpipe},       {"1f1b", 1, one_f_one_b},
                                      {"zb-h1", 1, zb_h1},       {"zb-h2", 1, zb_h2},
                                      {"zb-v", 2, zb_v},         {"dualpipev", 2, dualpipe_v},
                                      {"dualpipe", 2, dualpipe}, {"v-min", 2, v_min},
                                      {"v-half", 2, v_half},     {"v-zb", 2, v_zb}};
  for (const Entry& e : entries)
    if (name == e.name) {
      only(e.chunks);
      return e.gen(p, m);
    }
  throw std::logic_error("generate: no generator for " + name);
}

}  // namespace baton::schedule
