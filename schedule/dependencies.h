// Data dependencies between the actions of a schedule: the rule (what each action
// needs), the graph of a whole schedule (where each needed action sits), and running
// the ranks' lists in order under the communication model. The validator, the
// simulator and the executor share them.
//
// The rule, for micro-batch b and stage s (prev/next: the neighbouring stages of s's
// direction; "B" is met by a B or a BW of the same pair, "W" by a W or a BW):
//   F(b,s)        F(b,prev)                      — nothing at the first stage
//   B(b,s), BW    F(b,s) and "B"(b,next)         — only F(b,s) at the last stage
//   W(b,s)        "B"(b,s)
//   SEND_F(b,s)   F(b,s)          RECV_F(b,s)   SEND_F(b,prev) on prev's rank
//   SEND_B(b,s)   "B"(b,s)        RECV_B(b,s)   SEND_B(b,next) on next's rank
//   REDUCE(s)     "W"(b,s) for every micro-batch b of s's direction
//   STEP          REDUCE(s) for every stage s of its rank, or, in a schedule without
//                 REDUCE actions, "W"(b,s) for every such s and b
// In a schedule with transfers (a lowered one), a neighbour on another rank is reached
// through the transfer instead: F(b,s) needs RECV_F(b,s) on its own rank, B/BW(b,s)
// needs RECV_B(b,s). A compute-only schedule keeps the direct cross-rank dependency
// (its transfers are implicit).
//
// Communication model (the one the executor implements and the validator checks):
// a rank runs its list in order; sends are asynchronous and buffered (issuing a SEND
// never waits for the receiver); a RECV, and in a compute-only schedule an action with
// a cross-rank dependency, waits until the action it depends on has been issued on its
// rank. Posting receives earlier than written (as the executor does) only removes waits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "schedule/schedule.h"

namespace baton::schedule {

struct ActionRef {
  int32_t rank = -1;
  int32_t index = -1;  // position in the rank's list
  friend bool operator==(const ActionRef&, const ActionRef&) = default;
};

// Appends to `out` the actions that `a` requires, as keys (peer unset; B means "B or
// BW", W means "W or BW"). `lowered`: the schedule names its transfers; `has_reduce`:
// it has REDUCE actions. `rank` is the rank `a` runs on (STEP needs it).
void required_actions(const Schedule& s, int rank, const Action& a, bool lowered, bool has_reduce,
                      std::vector<Action>& out);

class DependencyGraph {
 public:
  // Indexes every action. Throws InputError only when the header is wrong
  // (check_header); actions out of range are not indexed and missing requirements are
  // left out, so the validator can report what is wrong. The schedule must outlive the
  // graph.
  explicit DependencyGraph(const Schedule& s);
  DependencyGraph(const DependencyGraph&) = delete;
  DependencyGraph& operator=(const DependencyGraph&) = delete;

  const Schedule& schedule() const { return *s_; }
  bool lowered() const { return lowered_; }
  bool has_reduce() const { return has_reduce_; }

  // Actions are numbered rank by rank: node(r, i) = offset(r) + i.
  int num_nodes() const { return static_cast<int>(rank_of_.size()); }
  int node(int rank, int index) const { return offset_[size_t(rank)] + index; }
  ActionRef ref(int node) const {
    return {rank_of_[size_t(node)], node - offset_[size_t(rank_of_[size_t(node)])]};
  }
  const Action& action(int node) const;

  // The nodes `node` depends on (present in the schedule; missing ones left out).
  std::span<const int> dependencies(int node) const {
    return {deps_.data() + dep_begin_[size_t(node)], deps_.data() + dep_begin_[size_t(node) + 1]};
  }
  std::span<const int> dependencies(int rank, int index) const {
    return dependencies(node(rank, index));
  }

  // The node of the first occurrence of an action key (peer ignored), or -1. A key of
  // kind B (W) resolves to a BW when the schedule has no B (W) for that pair, unless
  // `exact`. STEP keys name no rank: see step_node().
  int find(const Action& key, bool exact = false) const;
  int step_node(int rank) const { return step_index_[size_t(rank)]; }
  // Where a second occurrence of an already indexed key was found: (first, second).
  const std::vector<std::pair<int, int>>& duplicates() const { return duplicates_; }

 private:
  int slot(ActionKind k, int mb, int stage) const;
  bool in_range(const Action& a) const;

  const Schedule* s_;
  bool lowered_ = false, has_reduce_ = false;
  int num_stages_ = 0, stages_per_direction_ = 1, mb_per_direction_ = 1;
  std::vector<int> offset_;            // per rank, and one past the end
  std::vector<int32_t> rank_of_;       // per node
  std::vector<int> pair_index_;        // (stage * m + mb) * 8 + kind -> node or -1
  std::vector<int> reduce_index_;      // stage -> node or -1
  std::vector<int> step_index_;        // rank -> node or -1
  std::vector<int> dep_begin_, deps_;  // CSR
  std::vector<std::pair<int, int>> duplicates_;
};

// True when list[i] is the forward half of a composite OVERLAP_F_B: an F with `overlap`
// set, followed by a B or BW (its backward half). The two start together.
inline bool is_composite(const std::vector<Action>& list, size_t i) {
  return list[i].overlap && list[i].kind == ActionKind::forward && i + 1 < list.size() &&
         (list[i + 1].kind == ActionKind::backward_input ||
          list[i + 1].kind == ActionKind::full_backward);
}

// The result of running the ranks' lists in order under the communication model.
struct Progress {
  bool complete = false;
  std::vector<int> order;        // nodes in an order they can run (a topological order)
  std::vector<int> position;     // per rank: index of the first action that did not run
  std::vector<int> waiting_for;  // per rank: the node that action waits for, or -1
};
Progress run_in_order(const DependencyGraph& g);

}  // namespace baton::schedule
