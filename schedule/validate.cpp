#include "schedule/validate.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "memory/error.h"
#include "schedule/dependencies.h"
#include "schedule/detail/util.h"
#include "schedule/forward_only.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

using detail::str;

class Checker {
 public:
  explicit Checker(const Schedule& s, const DependencyGraph* g = nullptr)
      : s_(s), g_(g), forward_only_(is_forward_only(s)) {}

  ValidationReport run(Progress* progress);

 private:
  ValidationReport fail(int rank, int index, std::string message) const {
    ValidationReport r;
    r.ok = false;
    r.rank = rank;
    r.index = index;
    r.message = std::move(message);
    if (rank >= 0) r.grid = format_grid(s_, rank, index);
    return r;
  }
  // "rank 2, action 7 (2W3)"
  std::string at(int rank, int index) const {
    return "rank " + str(rank) + ", action " + str(index) + " (" +
           to_token(s_.ranks[size_t(rank)][size_t(index)]) + ")";
  }
  std::string at(int node) const {
    ActionRef r = g_->ref(node);
    return at(r.rank, r.index);
  }
  std::string where_stage(int stage) const {
    return "stage " + str(stage) + " (rank " + str(s_.placement[size_t(stage)]) + ")";
  }

  std::optional<ValidationReport> check_actions() const;
  std::optional<ValidationReport> check_duplicates() const;
  std::optional<ValidationReport> check_complete() const;
  std::optional<ValidationReport> check_pair(int rank, int stage, int mb) const;
  std::optional<ValidationReport> check_transfers(int rank, int stage, int mb) const;
  std::optional<ValidationReport> check_transfer(int mb, int from, int to, bool activation) const;
  std::optional<ValidationReport> check_order() const;
  std::optional<ValidationReport> check_deadlock() const;
  std::string order_message(int node, int dep) const;

  const Schedule& s_;
  const DependencyGraph* g_;
  std::unique_ptr<DependencyGraph> owned_;
  bool forward_only_ = false;  // an evaluation schedule: F without backward is complete
  mutable Progress progress_;
};

ValidationReport Checker::run(Progress* progress) {
  try {
    check_header(s_, "header");
  } catch (const InputError& e) {
    return fail(-1, -1, e.what());
  }
  if (auto r = check_actions()) return *r;
  if (!g_) {
    owned_ = std::make_unique<DependencyGraph>(s_);
    g_ = owned_.get();
  }
  if (auto r = check_duplicates()) return *r;
  if (auto r = check_complete()) return *r;
  if (auto r = check_order()) return *r;
  if (auto r = check_deadlock()) return *r;
  if (progress) *progress = std::move(progress_);
  return ValidationReport{};
}

// Each action on its own: an existing stage, a micro-batch of its direction, the rank
// the placement gives, and a transfer only across ranks, with the right peer.
std::optional<ValidationReport> Checker::check_actions() const {
  const int S = s_.num_stages(), M = s_.num_micro_batches;
  for (int r = 0; r < s_.num_ranks; ++r) {
    const auto& list = s_.ranks[size_t(r)];
    for (int i = 0; i < int(list.size()); ++i) {
      const Action& a = list[size_t(i)];
      if (static_cast<int>(a.kind) >= kNumActionKinds)
        return fail(
            r, i,
            "rank " + str(r) + ", action " + str(i) + ": unknown action kind " + str(int(a.kind)));
      if ((a.kind == K::optimizer_step && a.stage != -1) ||
          (!has_micro_batch(a.kind) && a.micro_batch != -1) ||
          (!is_transfer(a.kind) && a.peer != -1))
        return fail(
            r, i,
            at(r, i) +
                ": fields that this kind does not have must be -1 (STEP: stage, micro-batch; "
                "REDUCE: micro-batch; all but transfers: peer)");
      if (a.overlap) {
        const Action* b = i + 1 < int(list.size()) ? &list[size_t(i) + 1] : nullptr;
        if (a.kind != K::forward)
          return fail(r, i,
                      at(r, i) +
                          ": only a forward can be the first half of a composite OVERLAP_F_B "
                          "(expected (F;B) or (F;BW))");
        if (!b || (b->kind != K::backward_input && b->kind != K::full_backward) || b->overlap)
          return fail(r, i,
                      at(r, i) + " is overlapped (OVERLAP_F_B) with " +
                          (b ? "'" + to_token(*b) + "'" : std::string("nothing (end of list)")) +
                          ", expected a B or BW right after it as the second half");
      }
      if (a.kind == K::optimizer_step) continue;
      if (a.stage < 0 || a.stage >= S)
        return fail(r, i,
                    at(r, i) + ": stage " + str(a.stage) + " does not exist (the placement has " +
                        str(S) + " stages, 0 to " + str(S - 1) + ")");
      if (has_micro_batch(a.kind)) {
        if (a.micro_batch < 0 || a.micro_batch >= M)
          return fail(r, i,
                      at(r, i) + ": micro-batch " + str(a.micro_batch) +
                          " is out of range (expected 0 to " + str(M - 1) + ")");
        int d = stage_direction(s_, a.stage), md = micro_batch_direction(s_, a.micro_batch);
        if (d != md)
          return fail(r, i,
                      at(r, i) + ": micro-batch " + str(a.micro_batch) + " flows in direction " +
                          str(md) + " but stage " + str(a.stage) + " belongs to direction " +
                          str(d));
      }
      const int home = s_.placement[size_t(a.stage)];
      if (home != r)
        return fail(r, i,
                    at(r, i) + ": stage " + str(a.stage) + " lives on rank " + str(home) +
                        " (placement), so this action belongs in rank " + str(home) + "'s list");
      if (!is_transfer(a.kind)) continue;
      const bool forward_side = a.kind == K::send_activation || a.kind == K::recv_gradient;
      const int other = forward_side ? next_stage(s_, a.stage) : prev_stage(s_, a.stage);
      if (other < 0)
        return fail(
            r, i,
            at(r, i) + ": stage " + str(a.stage) + " is the " + (forward_side ? "last" : "first") +
                " stage of its direction; there is no " + (forward_side ? "next" : "previous") +
                " stage to " + (is_send(a.kind) ? "send to" : "receive from"));
      const int peer = s_.placement[size_t(other)];
      if (peer == r)
        return fail(r, i,
                    at(r, i) + ": stages " + str(std::min(a.stage, other)) + " and " +
                        str(std::max(a.stage, other)) + " both live on rank " + str(r) +
                        "; the tensor stays in memory and no transfer is needed");
      if (a.peer != peer)
        return fail(r, i,
                    at(r, i) + ": peer " + str(a.peer) + ", but the placement puts stage " +
                        str(other) + " on rank " + str(peer));
    }
  }
  return std::nullopt;
}

std::optional<ValidationReport> Checker::check_duplicates() const {
  if (g_->duplicates().empty()) return std::nullopt;
  auto [first, second] = g_->duplicates().front();
  ActionRef b = g_->ref(second);
  return fail(b.rank, b.index,
              to_token(g_->action(second)) + " appears twice: at " + at(first) + " and at " +
                  at(second) + " (expected exactly once)");
}

std::optional<ValidationReport> Checker::check_complete() const {
  for (int r = 0; r < s_.num_ranks; ++r)
    for (int stage : stages_of_rank(s_, r)) {
      const int per = s_.micro_batches_per_direction(), d = stage_direction(s_, stage);
      for (int mb = d * per; mb < (d + 1) * per; ++mb)
        if (auto rep = check_pair(r, stage, mb)) return rep;
    }
  if (g_->has_reduce())
    for (int stage = 0; stage < s_.num_stages(); ++stage)
      if (g_->find(make_action(K::reduce_gradients, -1, stage)) < 0)
        return fail(s_.placement[size_t(stage)], -1,
                    "missing " + to_token(make_action(K::reduce_gradients, -1, stage)) + ": " +
                        where_stage(stage) +
                        " has no REDUCE, but the schedule reduces other stages' gradients "
                        "(expected one per stage)");
  bool any_step = false;
  for (int r = 0; r < s_.num_ranks; ++r) any_step = any_step || g_->step_node(r) >= 0;
  if (any_step)
    for (int r = 0; r < s_.num_ranks; ++r)
      if (g_->step_node(r) < 0)
        return fail(r, -1,
                    "missing STEP on rank " + str(r) +
                        ": other ranks step their optimizer, so every rank needs one STEP");
  return std::nullopt;
}

// One (micro-batch, stage): exactly one F, one B and one W or one BW; the transfers to
// the next stage when the schedule names them.
std::optional<ValidationReport> Checker::check_pair(int r, int stage, int mb) const {
  auto node = [&](K k) { return g_->find(make_action(k, mb, stage), /*exact=*/true); };
  auto tok = [&](K k) { return to_token(make_action(k, mb, stage)); };
  const int f = node(K::forward), b = node(K::backward_input), w = node(K::backward_weight),
            bw = node(K::full_backward);
  auto index_of = [&](int n) { return n >= 0 ? g_->ref(n).index : -1; };
  if (f >= 0 && ((bw >= 0 && b < 0 && w < 0) || (bw < 0 && b >= 0 && w >= 0)))
    return check_transfers(r, stage, mb);
  // An evaluation schedule: one F per (micro-batch, stage) and the activations' transfers.
  if (f >= 0 && forward_only_) return check_transfers(r, stage, mb);
  const std::string what = "micro-batch " + str(mb) + " of " + where_stage(stage);
  if (f < 0) {
    int near = b >= 0 ? b : bw >= 0 ? bw : w;
    return fail(r, index_of(near),
                "missing " + tok(K::forward) + ": " + what + " has no F (expected exactly one)");
  }
  if (bw >= 0 && (b >= 0 || w >= 0)) {
    int other = b >= 0 ? b : w;
    return fail(r, index_of(other),
                what + " has both a full backward (" + at(bw) + ") and a split one (" + at(other) +
                    "); expected one BW, or one B and one W");
  }
  if (bw < 0) {
    if (b < 0 && w < 0)
      return fail(r, index_of(f),
                  "missing " + tok(K::full_backward) + " (or " + tok(K::backward_input) + " and " +
                      tok(K::backward_weight) + "): " + what + " has no backward");
    if (b < 0)
      return fail(r, index_of(w),
                  "missing " + tok(K::backward_input) + ": " + what + " has a W (" + at(w) +
                      ") but no B (input gradient)");
    if (w < 0)
      return fail(r, index_of(b),
                  "missing " + tok(K::backward_weight) + ": " + what + " has a B (" + at(b) +
                      ") but no W (weight gradient)");
  }
  return check_transfers(r, stage, mb);
}

std::optional<ValidationReport> Checker::check_transfers(int r, int stage, int mb) const {
  if (!g_->lowered()) return std::nullopt;
  const int next = next_stage(s_, stage);
  if (next < 0 || s_.placement[size_t(next)] == r) return std::nullopt;
  if (auto rep = check_transfer(mb, stage, next, true)) return rep;
  if (forward_only_) return std::nullopt;  // no gradients flow back
  return check_transfer(mb, stage, next, false);
}

// The activation (stage `from` -> `to`) or the gradient (`to` -> `from`) of one
// micro-batch: one SEND on the producing rank meets one RECV on the consuming rank.
std::optional<ValidationReport> Checker::check_transfer(int mb, int from, int to,
                                                        bool activation) const {
  const Action send = activation ? make_action(K::send_activation, mb, from)
                                 : make_action(K::send_gradient, mb, to);
  const Action recv = activation ? make_action(K::recv_activation, mb, to)
                                 : make_action(K::recv_gradient, mb, from);
  const int src_rank = s_.placement[size_t(send.stage)],
            dst_rank = s_.placement[size_t(recv.stage)];
  const int sn = g_->find(send, true), rn = g_->find(recv, true);
  const char* what = activation ? "activation" : "gradient";
  if (sn < 0 && rn < 0)
    return fail(src_rank, -1,
                "missing " + to_token(send) + " and " + to_token(recv) + ": the " + what +
                    " of micro-batch " + str(mb) + " from " + where_stage(send.stage) + " to " +
                    where_stage(recv.stage) +
                    " is never transferred (a schedule with transfers names every one)");
  if (rn < 0)
    return fail(src_rank, g_->ref(sn).index,
                at(sn) + " has no matching " + to_token(recv) + " on rank " + str(dst_rank) +
                    ": every send must meet a receive");
  if (sn < 0)
    return fail(dst_rank, g_->ref(rn).index,
                at(rn) + " has no matching " + to_token(send) + " on rank " + str(src_rank) +
                    ": the receive would wait forever");
  return std::nullopt;
}

std::string Checker::order_message(int node, int dep) const {
  const Action& a = g_->action(node);
  const Action& d = g_->action(dep);
  const std::string later =
      ", which comes later on the same rank (action " + str(g_->ref(dep).index) + ")";
  const std::string dt = to_token(d);
  if (a.kind == K::backward_weight) return "W before its B: " + at(node) + " needs " + dt + later;
  if ((a.kind == K::backward_input || a.kind == K::full_backward) && d.kind == K::forward &&
      d.stage == a.stage)
    return "backward before its forward: " + at(node) + " needs " + dt + later;
  if (is_recv(d.kind))
    return "receive after use: " + at(node) + " needs the " +
           (d.kind == K::recv_activation ? "activation" : "gradient") + " that " + dt +
           " receives" + later;
  if (is_send(a.kind))
    return "send before compute: " + at(node) + " sends the result of " + dt + later;
  if (a.kind == K::reduce_gradients)
    return "REDUCE too early: " + at(node) + " needs every weight gradient of its stage, but " +
           dt + later;
  if (a.kind == K::optimizer_step)
    return "STEP too early: " + at(node) + " must follow " + dt + later;
  return at(node) + " needs " + dt + later;
}

std::optional<ValidationReport> Checker::check_order() const {
  for (int n = 0; n < g_->num_nodes(); ++n) {
    const ActionRef me = g_->ref(n);
    const auto& list = s_.ranks[size_t(me.rank)];
    const bool second_half = me.index > 0 && is_composite(list, size_t(me.index) - 1);
    for (int d : g_->dependencies(n)) {
      if (second_half && d == n - 1)
        return fail(me.rank, me.index,
                    "composite " + composite_token(list[size_t(me.index) - 1], g_->action(n)) +
                        " at rank " + str(me.rank) + ", action " + str(me.index - 1) + ": " +
                        to_token(g_->action(n)) + " needs " + to_token(g_->action(d)) +
                        ", so the two halves cannot start together");
      const ActionRef dep = g_->ref(d);
      if (dep.rank == me.rank && dep.index > me.index)
        return fail(me.rank, me.index, order_message(n, d));
    }
  }
  // STEP meets every rank (the global gradient norm's all-reduce): an action after it,
  // always a transfer (its dependencies put all compute before it), would wait on a peer already in
  // that all-reduce, or keep the peer from it.
  for (int r = 0; r < s_.num_ranks; ++r) {
    const auto& list = s_.ranks[size_t(r)];
    for (int i = 0; i + 1 < int(list.size()); ++i)
      if (list[size_t(i)].kind == K::optimizer_step)
        return fail(r, i + 1,
                    at(r, i + 1) + " comes after the rank's STEP (" + at(r, i) +
                        "): STEP meets every rank (the global gradient norm), so it must be "
                        "the rank's last action");
  }
  return std::nullopt;
}

std::optional<ValidationReport> Checker::check_deadlock() const {
  progress_ = run_in_order(*g_);
  const Progress& pr = progress_;
  if (pr.complete) return std::nullopt;
  const int p = s_.num_ranks;
  int start = 0;
  while (start < p && pr.position[size_t(start)] >= int(s_.ranks[size_t(start)].size())) ++start;
  // Follow "rank r waits for an action of rank r'" until a rank repeats: the cycle.
  std::vector<int> seen(size_t(p), -1), chain;
  int r = start;
  while (r >= 0 && seen[size_t(r)] < 0) {
    seen[size_t(r)] = int(chain.size());
    chain.push_back(r);
    int d = pr.waiting_for[size_t(r)];
    r = d >= 0 ? g_->ref(d).rank : -1;
  }
  if (r < 0)  // cannot happen: a stuck rank always waits for an action not yet run
    return fail(start, pr.position[size_t(start)],
                "deadlock: " + at(start, pr.position[size_t(start)]) + " never runs");
  std::vector<int> cycle(chain.begin() + seen[size_t(r)], chain.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string msg = "deadlock: a cycle of waits between rank";
  msg += cycle.size() > 1 ? "s " : " ";
  for (size_t i = 0; i < cycle.size(); ++i) msg += (i ? ", " : "") + str(cycle[i]);
  msg +=
      " (sends are asynchronous, a receive or a cross-rank dependency waits until its action was "
      "issued):";
  for (int q : cycle) {
    int d = pr.waiting_for[size_t(q)];
    ActionRef dr = g_->ref(d);
    const int stuck = pr.position[size_t(dr.rank)];
    msg += "\n  " + at(q, pr.position[size_t(q)]) + " waits for " + to_token(g_->action(d)) +
           " (rank " + str(dr.rank) + ", action " + str(dr.index) + "), which rank " +
           str(dr.rank) +
           (dr.index == stuck ? " cannot run: it waits itself"
                              : " has not reached: it is stuck at action " + str(stuck));
  }
  return fail(cycle.front(), pr.position[size_t(cycle.front())], msg);
}

}  // namespace

ValidationReport validate(const Schedule& s) {
  return Checker(s).run(nullptr);
}

ValidationReport validate(const Schedule& s, const DependencyGraph& g, Progress* progress) {
  return Checker(s, &g).run(progress);
}

void check_valid(const Schedule& s, const std::string& source) {
  ValidationReport r = validate(s);
  if (!r.ok) throw InputError(source + ": invalid schedule: " + r.to_string());
}

std::string format_grid(const Schedule& s, int rank, int index, int rows_around, int ranks_around) {
  if (rank < 0 || rank >= int(s.ranks.size())) return "";
  const int r0 = std::max(0, rank - ranks_around),
            r1 = std::min(int(s.ranks.size()) - 1, rank + ranks_around);
  size_t longest = 0;
  for (int r = r0; r <= r1; ++r) longest = std::max(longest, s.ranks[size_t(r)].size());
  const int centre = index >= 0 ? index : 0;
  const int i0 = std::max(0, centre - rows_around);
  const int i1 = std::min(int(longest) - 1, centre + rows_around);
  size_t width = 8;
  for (int r = r0; r <= r1; ++r)
    for (int i = i0; i <= i1; ++i)
      if (i < int(s.ranks[size_t(r)].size()))
        width = std::max(width, to_token(s.ranks[size_t(r)][size_t(i)]).size() + 4);
  auto pad = [](std::string t, size_t w) {
    if (t.size() < w) t.append(w - t.size(), ' ');
    return t;
  };
  std::string out = pad("  action", 10);
  for (int r = r0; r <= r1; ++r) out += pad("rank " + str(r), width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += "\n";
  if (i0 > 0) out += pad("     ...", 10) + "\n";
  for (int i = i0; i <= i1; ++i) {
    std::string idx = str(i);
    out += pad(std::string(8 - std::min<size_t>(8, idx.size()), ' ') + idx, 10);
    for (int r = r0; r <= r1; ++r) {
      const auto& list = s.ranks[size_t(r)];
      std::string cell =
          i < int(list.size()) ? to_token(list[size_t(i)]) : (i == int(list.size()) ? "(end)" : "");
      if (r == rank && i == index)
        cell = "> " + cell + " <";
      else if (!cell.empty())
        cell = "  " + cell;
      out += pad(cell, width);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  if (i1 + 1 < int(longest)) out += pad("     ...", 10) + "\n";
  return out;
}

}  // namespace baton::schedule
