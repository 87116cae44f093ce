#include "partitioner/layout.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "memory/error.h"

namespace baton::partitioner {

Layout::Layout(int dp, std::vector<int> tp_per_pp, std::vector<int> spatial_per_pp)
    : dp_(dp), tp_(std::move(tp_per_pp)), sp_(std::move(spatial_per_pp)) {
  BATON_CHECK(dp >= 1 && !tp_.empty(), "a layout needs dp >= 1 and at least one pipeline rank");
  if (sp_.empty()) sp_.assign(tp_.size(), 1);
  BATON_CHECK(sp_.size() == tp_.size(), "one spatial degree per pipeline rank");
  int64_t replica = 0;
  for (size_t p = 0; p < tp_.size(); ++p) {
    BATON_CHECK(tp_[p] >= 1 && sp_[p] >= 1, "tensor-parallel and spatial degrees are >= 1");
    offset_.push_back(int(std::min<int64_t>(replica, kMaxWorld)));
    replica += int64_t(tp_[p]) * sp_[p];
  }
  // In int64: the degrees' product must not wrap to a small world that passes.
  BATON_CHECK(replica * dp <= kMaxWorld, "a world of at most 2^20 ranks");
  replica_ = int(replica);
}

bool Layout::has_spatial() const {
  for (int s : sp_)
    if (s > 1) return true;
  return false;
}

int Layout::rank(int dp, int pp, int tp, int sp) const {
  BATON_CHECK(dp >= 0 && dp < dp_ && pp >= 0 && pp < this->pp() && tp >= 0 &&
                  tp < tp_[size_t(pp)] && sp >= 0 && sp < sp_[size_t(pp)],
              "rank coordinates out of range");
  return dp * replica_ + offset_[size_t(pp)] + sp * tp_[size_t(pp)] + tp;
}

int Layout::rank_at(int dp, int pp, int index) const {
  BATON_CHECK(index >= 0 && index < width(pp), "rank index out of range");
  return rank(dp, pp, index % tp_[size_t(pp)], index / tp_[size_t(pp)]);
}

RankCoord Layout::coord(int rank) const {
  if (rank < 0 || rank >= world())
    throw std::out_of_range("rank " + std::to_string(rank) + " outside a world of " +
                            std::to_string(world()));
  RankCoord c;
  c.dp = rank / replica_;
  int in = rank % replica_;
  int p = pp() - 1;
  while (offset_[size_t(p)] > in) --p;
  c.pp = p;
  c.tp = (in - offset_[size_t(p)]) % tp_[size_t(p)];
  c.sp = (in - offset_[size_t(p)]) / tp_[size_t(p)];
  return c;
}

std::string Layout::rule() const {
  if (has_spatial())
    return "rank = dp * R + (w_0 + ... + w_{pp-1}) + sp * tp_pp + tp with w_p = tp_p * "
           "spatial_p and R = " +
           std::to_string(replica_) + " ranks per replica";
  bool uniform = true;
  for (int t : tp_) uniform = uniform && t == tp_.front();
  if (uniform) return "rank = (dp * PP + pp) * TP + tp";
  return "rank = dp * R + (tp_0 + ... + tp_{pp-1}) + tp with R = " + std::to_string(replica_) +
         " ranks per replica";
}

std::vector<int> Layout::core_deal_order() const {
  std::vector<int> place(static_cast<size_t>(world()));
  int next = 0;
  for (int p = 0; p < pp(); ++p)
    for (int d = 0; d < dp_; ++d)
      for (int r : stage_ranks(d, p)) place[size_t(r)] = next++;
  return place;
}

std::vector<int> Layout::stage_ranks(int dp, int pp) const {
  std::vector<int> out;
  for (int i = 0; i < width(pp); ++i) out.push_back(rank_at(dp, pp, i));
  return out;
}

std::vector<int> Layout::tp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> out;
  for (int t = 0; t < tp_[size_t(c.pp)]; ++t) out.push_back(rank(c.dp, c.pp, t, c.sp));
  return out;
}

std::vector<int> Layout::spatial_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> out;
  for (int s = 0; s < sp_[size_t(c.pp)]; ++s) out.push_back(rank(c.dp, c.pp, c.tp, s));
  return out;
}

std::vector<int> Layout::dp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> out;
  for (int d = 0; d < dp_; ++d) out.push_back(rank(d, c.pp, c.tp, c.sp));
  return out;
}

std::vector<int> Layout::replica_ranks(int dp) const {
  std::vector<int> out;
  for (int i = 0; i < replica_; ++i) out.push_back(dp * replica_ + i);
  return out;
}

}  // namespace baton::partitioner
