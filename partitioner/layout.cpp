#include "partitioner/layout.h"

#include <stdexcept>

#include "memory/error.h"

namespace baton::partitioner {

Layout::Layout(int dp, std::vector<int> tp_per_pp) : dp_(dp), tp_(std::move(tp_per_pp)) {
  BATON_CHECK(dp >= 1 && !tp_.empty(), "a layout needs dp >= 1 and at least one pipeline rank");
  replica_ = 0;
  for (int t : tp_) {
    BATON_CHECK(t >= 1, "tensor-parallel degrees are >= 1");
    offset_.push_back(replica_);
    replica_ += t;
  }
}

int Layout::rank(int dp, int pp, int tp) const {
  BATON_CHECK(dp >= 0 && dp < dp_ && pp >= 0 && pp < this->pp() && tp >= 0 && tp < tp_[size_t(pp)],
              "rank coordinates out of range");
  return dp * replica_ + offset_[size_t(pp)] + tp;
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
  c.tp = in - offset_[size_t(p)];
  return c;
}

std::string Layout::rule() const {
  bool uniform = true;
  for (int t : tp_) uniform = uniform && t == tp_.front();
  if (uniform) return "rank = (dp * PP + pp) * TP + tp";
  return "rank = dp * R + (tp_0 + ... + tp_{pp-1}) + tp with R = " + std::to_string(replica_) +
         " ranks per replica";
}

std::vector<int> Layout::stage_ranks(int dp, int pp) const {
  std::vector<int> out;
  for (int t = 0; t < tp_[size_t(pp)]; ++t) out.push_back(rank(dp, pp, t));
  return out;
}

std::vector<int> Layout::tp_group(int r) const {
  RankCoord c = coord(r);
  return stage_ranks(c.dp, c.pp);
}

std::vector<int> Layout::dp_group(int r) const {
  RankCoord c = coord(r);
  std::vector<int> out;
  for (int d = 0; d < dp_; ++d) out.push_back(rank(d, c.pp, c.tp));
  return out;
}

std::vector<int> Layout::replica_ranks(int dp) const {
  std::vector<int> out;
  for (int i = 0; i < replica_; ++i) out.push_back(dp * replica_ + i);
  return out;
}

}  // namespace baton::partitioner
