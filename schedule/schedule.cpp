#include "schedule/schedule.h"

#include "memory/error.h"

namespace baton::schedule {

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& r : ranks) n += r.size();
  return n;
}

std::vector<int> stages_of_rank(const Schedule& s, int rank) {
  std::vector<int> out;
  for (int st = 0; st < s.num_stages(); ++st)
    if (s.placement[st] == rank) out.push_back(st);
  return out;
}

double chunks_per_rank(const Schedule& s) {
  return s.num_ranks > 0 ? double(s.stages_per_direction()) / s.num_ranks : 1.0;
}

int transfer_peer(const Schedule& s, const Action& a) {
  if (a.stage < 0 || a.stage >= s.num_stages()) return -1;
  int other = -1;
  switch (a.kind) {
    case ActionKind::send_activation:
    case ActionKind::recv_gradient:
      other = next_stage(s, a.stage);
      break;
    case ActionKind::recv_activation:
    case ActionKind::send_gradient:
      other = prev_stage(s, a.stage);
      break;
    default:
      return -1;
  }
  return other < 0 ? -1 : s.placement[other];
}

void assign_peers(Schedule& s) {
  for (auto& list : s.ranks)
    for (Action& a : list) a.peer = is_transfer(a.kind) ? transfer_peer(s, a) : -1;
}

void check_name(const std::string& name, const std::string& what) {
  const size_t at = name.find_first_of("\r\n");
  if (at != std::string::npos)
    throw InputError(what + ": expected a name on one line, found a " +
                     (name[at] == '\n' ? "line feed" : "carriage return") + " at byte " +
                     std::to_string(at));
}

bool has_transfers(const Schedule& s) {
  for (const auto& list : s.ranks)
    for (const Action& a : list)
      if (is_transfer(a.kind)) return true;
  return false;
}

std::vector<int> loop_placement(int num_ranks, int chunks_per_rank) {
  std::vector<int> p(size_t(num_ranks) * chunks_per_rank);
  for (size_t st = 0; st < p.size(); ++st) p[st] = int(st % num_ranks);
  return p;
}

std::vector<int> v_placement(int num_ranks, int chunks_per_rank) {
  std::vector<int> p(size_t(num_ranks) * chunks_per_rank);
  for (size_t st = 0; st < p.size(); ++st) {
    int k = int(st / num_ranks), i = int(st % num_ranks);
    p[st] = k % 2 == 0 ? i : num_ranks - 1 - i;
  }
  return p;
}

std::vector<int> bidirectional_placement(int num_ranks) {
  return v_placement(num_ranks, 2);
}

void check_header(const Schedule& s, const std::string& where,
                  const std::map<std::string, std::string>& fields) {
  // The field is the message's first word ("ranks: ...").
  auto fail = [&](const std::string& what) {
    const auto at = fields.find(what.substr(0, what.find_first_of(":[ ")));
    throw InputError((at == fields.end() ? where : at->second) + ": " + what);
  };
  constexpr int kMaxRanks = 1 << 16;
  constexpr long long kMaxPairs = 1LL << 22;  // stages x micro-batches the tools index
  if (s.num_ranks < 1 || s.num_ranks > kMaxRanks)
    fail("ranks: expected 1 to " + std::to_string(kMaxRanks) + ", found " +
         std::to_string(s.num_ranks));
  if (s.num_directions != 1 && s.num_directions != 2)
    fail("directions: expected 1 or 2, found " + std::to_string(s.num_directions));
  if (s.num_micro_batches < 1)
    fail("micro_batches: expected at least 1, found " + std::to_string(s.num_micro_batches));
  if (s.num_micro_batches % s.num_directions != 0)
    fail("micro_batches: a bidirectional schedule needs an even number, found " +
         std::to_string(s.num_micro_batches));
  if (s.placement.empty()) fail("placement: expected at least one stage, found none");
  if (s.num_stages() % s.num_directions != 0)
    fail("placement: a bidirectional schedule needs an even number of stages, found " +
         std::to_string(s.num_stages()));
  if (static_cast<long long>(s.num_stages()) * s.num_micro_batches > kMaxPairs)
    fail("stages x micro_batches = " +
         std::to_string(static_cast<long long>(s.num_stages()) * s.num_micro_batches) +
         " is beyond the supported " + std::to_string(kMaxPairs));
  std::vector<char> used(size_t(s.num_ranks), 0);
  for (int st = 0; st < s.num_stages(); ++st) {
    int r = s.placement[st];
    if (r < 0 || r >= s.num_ranks)
      fail("placement[" + std::to_string(st) + "]: expected a rank in [0, " +
           std::to_string(s.num_ranks) + "), found " + std::to_string(r));
    used[size_t(r)] = 1;
  }
  for (int r = 0; r < s.num_ranks; ++r)
    if (!used[size_t(r)])
      fail("placement: rank " + std::to_string(r) + " holds no stage (every rank needs one)");
  if (static_cast<int>(s.ranks.size()) != s.num_ranks)
    fail("expected one action list per rank (" + std::to_string(s.num_ranks) + "), found " +
         std::to_string(s.ranks.size()));
}

}  // namespace baton::schedule
