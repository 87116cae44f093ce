// The schedules with two chunks per rank: ZB-V (Qi et al. 2023), DualPipeV and the
// bidirectional DualPipe (DeepSeek-V3).
#include <deque>

#include "memory/error.h"
#include "schedule/detail/util.h"
#include "schedule/generators.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

// ZB-V for rank r of p, M micro-batches: chunk a (stage r) on the way down, chunk c
// (stage 2p-1-r) on the way up. Warm-up: forwards of a until the first micro-batch
// comes back up, then c's forwards interleaved with a's; steady state F B W of a, then
// of c; cool-down: the remaining B of both, W filling the gaps.
void zb_v_rank(std::vector<Action>& out, int p, int r, int M) {
  const int a = r, c = 2 * p - 1 - r;
  int fa = 0, fc = 0, ba = 0, bc = 0, wa = 0, wc = 0;
  auto F = [&](int st, int& n) { out.push_back(make_action(K::forward, n++, st)); };
  auto B = [&](int st, int& n) { out.push_back(make_action(K::backward_input, n++, st)); };
  auto W = [&](int st, int& n) { out.push_back(make_action(K::backward_weight, n++, st)); };
  for (int i = 0; i < 2 * (p - r) - 1; ++i) F(a, fa);
  for (int i = 0; i < r; ++i) {
    F(c, fc);
    F(a, fa);
  }
  for (int i = 0; i < p - r; ++i) {
    F(c, fc);
    B(c, bc);
    W(c, wc);
  }
  while (fc < fa || fa < M) {
    if (fa < M) F(a, fa);
    B(a, ba);
    W(a, wa);
    F(c, fc);
    B(c, bc);
    W(c, wc);
  }
  for (int i = 0; i < r; ++i) {
    B(a, ba);
    B(c, bc);
  }
  for (int i = 0; i < p - r; ++i) {
    B(a, ba);
    W(a, wa);
  }
  while (wc < bc) W(c, wc);
  while (wa < ba) W(a, wa);
}

// One rank of DualPipe's shape (DeepSeek's reference, steps 1-8), with P ranks in the
// shape, this rank at position h (distance from the end it is fed from), n
// micro-batches per phase. Phase 0 is the chunk whose micro-batches start at this
// rank's end of the shape, phase 1 the chunk whose micro-batches arrive from the other
// end. Backwards are full (BW) where DualPipe overlaps them with a forward, split into
// B and a W queued for later where a W can fill a gap.
struct Phase {
  int stage;
  int mb_base;
};
void dualpipe_rank(std::vector<Action>& out, int P, int h, const Phase (&ph)[2], int n) {
  int f[2] = {0, 0}, b[2] = {0, 0};
  std::deque<Action> weights;
  auto F = [&](int k) {
    out.push_back(make_action(K::forward, ph[k].mb_base + f[k]++, ph[k].stage));
  };
  auto BW = [&](int k) {
    out.push_back(make_action(K::full_backward, ph[k].mb_base + b[k]++, ph[k].stage));
  };
  auto B = [&](int k) {
    const int mb = ph[k].mb_base + b[k]++;
    out.push_back(make_action(K::backward_input, mb, ph[k].stage));
    weights.push_back(make_action(K::backward_weight, mb, ph[k].stage));
  };
  auto backward = [&](int k, bool split) { split ? B(k) : BW(k); };
  auto pop_weight = [&] {
    out.push_back(weights.front());
    weights.pop_front();
  };
  for (int i = 0; i < 2 * (P - h - 1); ++i) F(0);  // 1: nF0
  for (int i = 0; i < h + 1; ++i) {                // 2: nF0F1
    F(0);
    F(1);
  }
  for (int i = 0; i < P - h - 1; ++i) {  // 3: nB1W1F1
    B(1);
    pop_weight();
    F(1);
  }
  for (int i = 0; i < n - 2 * P + h + 1; ++i) {  // 4: nF0B1F1B0, the steady state
    F(0);
    BW(1);
    F(1);
    BW(0);
  }
  for (int i = 0; i < P - h - 1; ++i) {  // 5: nB1F1B0
    BW(1);
    F(1);
    BW(0);
  }
  bool split = false;  // 6: nB1B0, the second half split so that W fills later gaps
  for (int i = 0; i < h + 1; ++i) {
    if (i == (h + 1) / 2 && h % 2 == 1) split = true;
    backward(1, split);
    if (i == (h + 1) / 2 && h % 2 == 0) split = true;
    backward(0, split);
  }
  for (int i = 0; i < P - h - 1; ++i) {  // 7: nWB0
    pop_weight();
    B(0);
  }
  while (!weights.empty()) pop_weight();  // 8: nW
}

}  // namespace

Schedule zb_v(int p, int m) {
  check_common("zb-v", p, m, 2);
  const int M = std::max(m, 2 * p - 1);  // the pattern needs 2p-1; extra ones are dropped
  Schedule s = detail::skeleton("zb-v", p, M, v_placement(p, 2));
  for (int r = 0; r < p; ++r) zb_v_rank(s.ranks[size_t(r)], p, r, M);
  if (M != m) truncate_micro_batches(s, m);
  return s;
}

Schedule dualpipe_v(int p, int m) {
  check_common("dualpipev", p, m, 2);
  if (m < 2 * p)
    throw InputError("dualpipev: micro-batches: expected at least 2 x ranks = " +
                     std::to_string(2 * p) + ", found " + std::to_string(m));
  Schedule s = detail::skeleton("dualpipev", p, m, v_placement(p, 2));
  for (int r = 0; r < p; ++r) {
    const Phase ph[2] = {{r, 0}, {2 * p - 1 - r, 0}};
    dualpipe_rank(s.ranks[size_t(r)], p, r, ph, m);
  }
  return s;
}

Schedule dualpipe(int p, int m) {
  check_common("dualpipe", p, m, 2);
  if (p % 2 != 0)
    throw InputError(
        "dualpipe: ranks: expected an even number (the two halves mirror each other), found " +
        std::to_string(p));
  if (m % 2 != 0 || m < 2 * p)
    throw InputError("dualpipe: micro-batches: expected an even number of at least 2 x ranks = " +
                     std::to_string(2 * p) + ", found " + std::to_string(m));
  // Direction 0: stages 0..p-1 on ranks 0..p-1, micro-batches [0, m/2); direction 1:
  // stages p..2p-1 on ranks p-1..0, micro-batches [m/2, m).
  Schedule s = detail::skeleton("dualpipe", p, m, bidirectional_placement(p), 2);
  const int n = m / 2, half = p / 2;
  for (int r = 0; r < p; ++r) {
    const Phase down{r, 0}, up{2 * p - 1 - r, n};
    const bool first_half = r < half;
    const Phase ph[2] = {first_half ? down : up, first_half ? up : down};
    dualpipe_rank(s.ranks[size_t(r)], half, first_half ? r : p - 1 - r, ph, n);
  }
  return s;
}

}  // namespace baton::schedule
