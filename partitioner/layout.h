// The rank layout: which global rank is which (data-parallel replica, pipeline rank,
// tensor-parallel index, spatial tile), and the groups the engine makes
// sub-communicators from.
//
// Tensor-parallel peers are neighbours (they talk most), then the tiles of a spatial
// group, then pipeline ranks, then data-parallel replicas. With tp_p tensor-parallel
// ranks and s_p spatial tiles at pipeline rank p (w_p = tp_p * s_p ranks), a replica has
// R = sum_p w_p ranks and
//     rank(dp, pp, tp, sp) = dp * R + (w_0 + ... + w_{pp-1}) + sp * tp_pp + tp,
// which is (dp * PP + pp) * TP + tp when every pipeline rank has TP ranks and no tiles.
#pragma once

#include <string>
#include <vector>

namespace baton::partitioner {

struct RankCoord {
  int dp = 0, pp = 0, tp = 0;
  int sp = 0;  // the tile of a spatial group (0 without the spatial split)
  bool operator==(const RankCoord&) const = default;
};

// The most ranks a world may have: plans refuse more (naming $.devices or $.parallel),
// so a world's rank numbers fit an int with room.
inline constexpr int kMaxWorld = 1 << 20;

class Layout {
 public:
  Layout() = default;
  // `spatial_per_pp` empty: no spatial split (every degree 1).
  Layout(int dp, std::vector<int> tp_per_pp, std::vector<int> spatial_per_pp = {});

  int world() const { return dp_ * replica_; }
  int dp() const { return dp_; }
  int pp() const { return int(tp_.size()); }
  int tp(int pp) const { return tp_[size_t(pp)]; }
  const std::vector<int>& tp_degrees() const { return tp_; }
  int spatial(int pp) const { return sp_[size_t(pp)]; }
  int width(int pp) const { return tp_[size_t(pp)] * sp_[size_t(pp)]; }  // ranks of a pp
  bool has_spatial() const;

  int rank(int dp, int pp, int tp, int sp = 0) const;
  int rank(const RankCoord& c) const { return rank(c.dp, c.pp, c.tp, c.sp); }
  // The rank at position `index` (sp * tp_pp + tp) among pipeline rank pp's ranks.
  int rank_at(int dp, int pp, int index) const;
  RankCoord coord(int rank) const;  // throws std::out_of_range outside [0, world)
  std::string rule() const;         // the formula above, for messages

  // The tensor-parallel group of a rank: its tile's ranks in its replica, in tp order.
  std::vector<int> tp_group(int rank) const;
  // The spatial group: the same (dp, pp, tp) in every tile, in tile order.
  std::vector<int> spatial_group(int rank) const;
  // The data-parallel group: the same (pp, tp, sp) in every replica, in dp order.
  std::vector<int> dp_group(int rank) const;
  // Every rank of one pipeline rank in one replica (= tp_group of any of them without
  // tiles).
  std::vector<int> stage_ranks(int dp, int pp) const;
  // Every rank of one replica, in rank order.
  std::vector<int> replica_ranks(int dp) const;

  // Each rank's place when the ranks of one host are dealt round its cores, more ranks
  // than cores (place i to core i mod C): pipeline rank by pipeline rank, then replica,
  // then index, so that every core holds ranks of every pipeline rank (one's bubble is
  // another's compute) and a tensor-parallel group spreads over the cores.
  std::vector<int> core_deal_order() const;

 private:
  int dp_ = 1;
  int replica_ = 1;
  std::vector<int> tp_, sp_, offset_;
};

}  // namespace baton::partitioner
