#include "partitioner/routing.h"

#include <algorithm>

#include "memory/error.h"

namespace baton::partitioner {

namespace {

struct Route {
  int from, to, part, parts;  // indices in the two groups
};

// Who sends what to whom between a group of `a` ranks holding a replicated value and a
// group of `b` ranks that each need all of it.
std::vector<Route> replicated_routes(int a, int b) {
  std::vector<Route> out;
  if (a == b) {
    for (int i = 0; i < a; ++i) out.push_back({i, i, 0, 1});
  } else if (a < b) {
    for (int j = 0; j < b; ++j) out.push_back({j % a, j, 0, 1});
  } else {
    for (int j = 0; j < b; ++j) {
      std::vector<int> from;
      for (int i = j; i < a; i += b) from.push_back(i);
      for (size_t k = 0; k < from.size(); ++k)
        out.push_back({from[k], j, int(k), int(from.size())});
    }
  }
  return out;
}

// An image value between stages of different spatial degrees (re-tiled): the sending
// side holds it as `sa` tiles of H / sa rows, `ta` tensor-parallel ranks each (flat
// index sp * ta + tp, the layout's), the receiving side needs `sb` tiles of H / sb rows
// on each of its `tb` ranks. Each receiver gets every block where its rows meet a
// sender's tile, from that tile's tensor-parallel rank tp mod ta.
struct RowRoute {
  int from, to, part, parts;
  int64_t rows, rows_from, rows_to;
};
std::vector<RowRoute> retile_routes(int64_t height, int sa, int ta, int sb, int tb) {
  std::vector<RowRoute> out;
  const int64_t ha = height / sa, hb = height / sb;
  for (int j = 0; j < sb; ++j)
    for (int tj = 0; tj < tb; ++tj) {
      std::vector<RowRoute> mine;
      for (int i = 0; i < sa; ++i) {
        const int64_t lo = std::max(i * ha, j * hb), hi = std::min((i + 1) * ha, (j + 1) * hb);
        if (lo >= hi) continue;
        mine.push_back({i * ta + tj % ta, j * tb + tj, 0, 0, hi - lo, lo - i * ha, lo - j * hb});
      }
      for (size_t k = 0; k < mine.size(); ++k) {
        mine[k].part = int(k);
        mine[k].parts = int(mine.size());
        out.push_back(mine[k]);
      }
    }
  return out;
}

}  // namespace

std::vector<schedule::Transfer> boundary_transfers(const ResolvedPlan& r, int rank, int stage) {
  const schedule::Schedule& s = r.schedule;
  std::vector<schedule::Transfer> out;
  if (stage < 0 || stage >= s.num_stages() || schedule::next_stage(s, stage) < 0) return out;
  const int next = stage + 1;
  const int pa = s.placement[size_t(stage)], pb = s.placement[size_t(next)];
  if (pa == pb) return out;
  const RankCoord me = r.layout.coord(rank);
  if (me.pp != pa && me.pp != pb) return out;
  // Group widths: tensor-parallel ranks times spatial tiles.
  const int t = r.layout.width(pa), u = r.layout.width(pb);
  const stages::Graph& g = *r.graph;
  const int cut = r.chunk_last[size_t(r.chunk_of_stage[size_t(stage)])];
  const std::vector<int> cut_values = g.cut_values(cut);
  for (size_t vi = 0; vi < cut_values.size(); ++vi) {
    const int v = cut_values[vi];
    const stages::Value& val = g.values[size_t(v)];
    // Tiles between equal degrees (spatial and tensor-parallel) go one to one as shards
    // do; otherwise by blocks of rows (whole tiles where only the tensor-parallel degree
    // changes: the tile's rows from one rank of the sending tile).
    const bool tile = r.tiled(pa, v) || r.tiled(pb, v);
    const bool retile = tile && (r.spatial_of(pa) != r.spatial_of(pb) ||
                                 r.plan.tp[size_t(pa)] != r.plan.tp[size_t(pb)]);
    const bool split = r.sharding.values[size_t(v)].split || tile;
    BATON_CHECK(!split || t == u || retile,
                "a split value crosses a change of tensor-parallel degree");
    const bool grad = memory::is_floating(val.type.dtype) && val.type.batched;
    for (int phase = 0; phase < (grad ? 2 : 1); ++phase) {
      // Activations go from stage `stage` (pa) to `next` (pb); gradients back.
      const int from_pp = phase == 0 ? pa : pb, to_pp = phase == 0 ? pb : pa;
      const int a = phase == 0 ? t : u, b = phase == 0 ? u : t;
      std::vector<RowRoute> routes;
      if (retile) {
        routes = retile_routes(val.type.shape[1], r.spatial_of(from_pp), r.plan.tp[size_t(from_pp)],
                               r.spatial_of(to_pp), r.plan.tp[size_t(to_pp)]);
      } else {
        for (const Route& rt : replicated_routes(a, b))
          routes.push_back({rt.from, rt.to, rt.part, rt.parts, 0, 0, 0});
      }
      for (const RowRoute& rt : routes) {
        int src = r.layout.rank_at(me.dp, from_pp, rt.from),
            dst = r.layout.rank_at(me.dp, to_pp, rt.to);
        schedule::Transfer x;
        x.phase = phase == 0 ? schedule::Transfer::Phase::activation
                             : schedule::Transfer::Phase::gradient;
        x.value = val.name;
        x.value_index = int(vi);
        x.part = rt.part;
        x.parts = rt.parts;
        x.rows = rt.rows;
        x.rows_from = rt.rows_from;
        x.rows_to = rt.rows_to;
        if (src == rank) {
          x.kind = schedule::Transfer::Kind::send;
          x.peer = dst;
          out.push_back(x);
        } else if (dst == rank) {
          x.kind = schedule::Transfer::Kind::recv;
          x.peer = src;
          out.push_back(x);
        }
      }
    }
  }
  return out;
}

}  // namespace baton::partitioner
