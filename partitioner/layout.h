// The rank layout: which global rank is which (data-parallel replica, pipeline rank,
// tensor-parallel index), and the groups the engine makes sub-communicators from.
//
// Tensor-parallel peers are neighbours (they talk most), then pipeline ranks, then
// data-parallel replicas. With tp_p ranks at pipeline rank p, a replica has
// R = sum_p tp_p ranks and
//     rank(dp, pp, tp) = dp * R + (tp_0 + ... + tp_{pp-1}) + tp,
// which is (dp * PP + pp) * TP + tp when every pipeline rank has TP ranks.
#pragma once

#include <string>
#include <vector>

namespace baton::partitioner {

struct RankCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const RankCoord&) const = default;
};

class Layout {
 public:
  Layout() = default;
  Layout(int dp, std::vector<int> tp_per_pp);

  int world() const { return dp_ * replica_; }
  int dp() const { return dp_; }
  int pp() const { return int(tp_.size()); }
  int tp(int pp) const { return tp_[size_t(pp)]; }
  const std::vector<int>& tp_degrees() const { return tp_; }

  int rank(int dp, int pp, int tp) const;
  int rank(const RankCoord& c) const { return rank(c.dp, c.pp, c.tp); }
  RankCoord coord(int rank) const;  // throws std::out_of_range outside [0, world)
  std::string rule() const;         // the formula above, for messages

  // The tensor-parallel group of a rank: its pipeline rank's ranks in its replica, in tp order.
  std::vector<int> tp_group(int rank) const;
  // The data-parallel group: the same (pp, tp) in every replica, in dp order.
  std::vector<int> dp_group(int rank) const;
  // Every rank of one pipeline rank in one replica (= tp_group of any of them).
  std::vector<int> stage_ranks(int dp, int pp) const;
  // Every rank of one replica, in rank order.
  std::vector<int> replica_ranks(int dp) const;

 private:
  int dp_ = 1;
  int replica_ = 1;
  std::vector<int> tp_, offset_;
};

}  // namespace baton::partitioner
