#include "schedule/lower.h"

#include "memory/error.h"
#include "schedule/forward_only.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

// A copy of `s` with empty action lists, to be filled by a pass.
Schedule empty_like(const Schedule& s) {
  Schedule out = s;
  for (auto& list : out.ranks) list.clear();
  return out;
}

bool contains(const Schedule& s, bool (*pred)(ActionKind)) {
  for (const auto& list : s.ranks)
    for (const Action& a : list)
      if (pred(a.kind)) return true;
  return false;
}

bool is_reduce(ActionKind k) {
  return k == K::reduce_gradients;
}
bool is_step(ActionKind k) {
  return k == K::optimizer_step;
}

}  // namespace

Schedule add_transfers(const Schedule& s) {
  if (has_transfers(s))
    throw InputError("add_transfers: the schedule already has transfers (SEND/RECV actions)");
  Schedule out = empty_like(s);
  auto crosses = [&](int from, int to) {
    return to >= 0 && s.placement[size_t(to)] != s.placement[size_t(from)];
  };
  // The receive a compute action needs before it and the send it makes after it.
  auto recv_of = [&](const Action& a, std::vector<Action>& dst) {
    if (a.stage < 0 || a.stage >= s.num_stages()) return;
    if (a.kind == K::forward && crosses(a.stage, prev_stage(s, a.stage)))
      dst.push_back(make_action(K::recv_activation, a.micro_batch, a.stage));
    if ((a.kind == K::backward_input || a.kind == K::full_backward) &&
        crosses(a.stage, next_stage(s, a.stage)))
      dst.push_back(make_action(K::recv_gradient, a.micro_batch, a.stage));
  };
  auto send_of = [&](const Action& a, std::vector<Action>& dst) {
    if (a.stage < 0 || a.stage >= s.num_stages()) return;
    if (a.kind == K::forward && crosses(a.stage, next_stage(s, a.stage)))
      dst.push_back(make_action(K::send_activation, a.micro_batch, a.stage));
    if ((a.kind == K::backward_input || a.kind == K::full_backward) &&
        crosses(a.stage, prev_stage(s, a.stage)))
      dst.push_back(make_action(K::send_gradient, a.micro_batch, a.stage));
  };
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    auto& dst = out.ranks[r];
    const auto& src = s.ranks[r];
    dst.reserve(src.size() * 2);
    for (size_t i = 0; i < src.size(); ++i) {
      const Action& a = src[i];
      if (a.overlap && i + 1 < src.size()) {
        // A composite stays adjacent: both receives before it, both sends after it.
        const Action& b = src[i + 1];
        recv_of(a, dst);
        recv_of(b, dst);
        dst.push_back(a);
        dst.push_back(b);
        send_of(a, dst);
        send_of(b, dst);
        ++i;
        continue;
      }
      recv_of(a, dst);
      dst.push_back(a);
      send_of(a, dst);
    }
  }
  assign_peers(out);
  return out;
}

Schedule add_gradient_reduction(const Schedule& s, bool step) {
  if (contains(s, is_reduce) || contains(s, is_step))
    throw InputError("add_gradient_reduction: the schedule already has REDUCE or STEP actions");
  Schedule out = empty_like(s);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const auto& src = s.ranks[r];
    // The last weight gradient of each stage on this rank: its REDUCE goes right after.
    std::vector<int> last(size_t(s.num_stages()), -1);
    for (int i = 0; i < int(src.size()); ++i) {
      const Action& a = src[size_t(i)];
      if ((a.kind == K::backward_weight || a.kind == K::full_backward) && a.stage >= 0 &&
          a.stage < s.num_stages())
        last[size_t(a.stage)] = i;
    }
    auto& dst = out.ranks[r];
    dst.reserve(src.size() + 4);
    for (int i = 0; i < int(src.size()); ++i) {
      const Action& a = src[size_t(i)];
      dst.push_back(a);
      if ((a.kind == K::backward_weight || a.kind == K::full_backward) && a.stage >= 0 &&
          a.stage < s.num_stages() && last[size_t(a.stage)] == i)
        dst.push_back(make_action(K::reduce_gradients, -1, a.stage));
    }
    if (step) dst.push_back(Action{K::optimizer_step, -1, -1, -1});
  }
  return out;
}

Schedule split_backward(const Schedule& s) {
  Schedule out = empty_like(s);
  for (size_t r = 0; r < s.ranks.size(); ++r)
    for (const Action& a : s.ranks[r]) {
      if (a.kind != K::full_backward) {
        out.ranks[r].push_back(a);
        continue;
      }
      out.ranks[r].push_back(make_action(K::backward_input, a.micro_batch, a.stage));
      out.ranks[r].push_back(make_action(K::backward_weight, a.micro_batch, a.stage));
    }
  return out;
}

Schedule merge_backward(const Schedule& s) {
  Schedule out = empty_like(s);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const auto& src = s.ranks[r];
    for (size_t i = 0; i < src.size(); ++i) {
      const Action& a = src[i];
      if (a.kind == K::backward_input && i + 1 < src.size() &&
          src[i + 1].kind == K::backward_weight && src[i + 1].micro_batch == a.micro_batch &&
          src[i + 1].stage == a.stage) {
        out.ranks[r].push_back(make_action(K::full_backward, a.micro_batch, a.stage));
        ++i;
        continue;
      }
      out.ranks[r].push_back(a);
    }
  }
  return out;
}

Schedule compute_only(const Schedule& s) {
  Schedule out = empty_like(s);
  for (size_t r = 0; r < s.ranks.size(); ++r)
    for (const Action& a : s.ranks[r])
      if (is_compute(a.kind)) out.ranks[r].push_back(a);
  return out;
}

Schedule lower(const Schedule& s, const LowerOptions& o) {
  Schedule out = o.merge_backward ? merge_backward(s) : s;
  if (o.transfers && !has_transfers(out)) out = add_transfers(out);
  // An evaluation pass has no gradients to reduce and no optimizer step.
  const bool eval = is_forward_only(out);
  const bool want_reduce = o.reduce && !eval && !contains(out, is_reduce);
  const bool want_step = o.step && !eval && !contains(out, is_step);
  if (want_reduce) {
    // A STEP already there is its rank's last action (the validator's rule): taken out,
    // it comes back after the reductions.
    const bool had_step = contains(out, is_step);
    for (auto& list : out.ranks)
      std::erase_if(list, [](const Action& a) { return is_step(a.kind); });
    out = add_gradient_reduction(out, want_step || had_step);
  } else if (want_step) {
    for (auto& list : out.ranks) list.push_back(Action{K::optimizer_step, -1, -1, -1});
  }
  return out;
}

}  // namespace baton::schedule
