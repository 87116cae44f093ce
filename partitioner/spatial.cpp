#include "partitioner/spatial.h"

#include <algorithm>
#include <array>

#include "memory/error.h"
#include "partitioner/detail/graph_builder.h"
#include "partitioner/tensor_parallel.h"

namespace baton::partitioner {

using stages::Graph;
using stages::Node;

namespace {

// An attribute that is one integer or [h, w]: the height's.
int64_t attr_h(const Node& n, const char* key, int64_t dflt) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return dflt;
  return it->is_array() ? it->at(0).get<int64_t>() : it->get<int64_t>();
}
// The same attribute with the height's part set to v.
nlohmann::json with_h(const nlohmann::json& a, int64_t v) {
  if (a.is_array()) return nlohmann::json::array({v, a.at(1)});
  return nlohmann::json::array({v, a});
}

std::string node_ref(const Graph& g, const Node& n) {
  return n.op + " node '" + n.name + "' (layer " + g.layers[size_t(n.layer)].name + ")";
}

}  // namespace

SpatialSplit plan_spatial(const Graph& g, int degree, const std::string& where) {
  SpatialSplit s;
  s.degree = degree;
  s.tiled.assign(g.values.size(), false);
  s.halos.assign(g.nodes.size(), {});
  s.partial_grad.assign(g.params.size(), false);
  auto fail = [&](const Node& n, const std::string& why) {
    throw InputError(where + ": spatial degree " + std::to_string(degree) + ": " + node_ref(g, n) +
                     " " + why);
  };
  for (int v : g.inputs) {
    const stages::Value& val = g.values[size_t(v)];
    if (!memory::is_floating(val.type.dtype) || val.type.shape.size() != 3) continue;
    if (val.type.shape[1] % degree != 0)
      throw InputError(where + ": spatial degree " + std::to_string(degree) +
                       " does not divide the height " + std::to_string(val.type.shape[1]) +
                       " of input '" + val.name + "'");
    s.tiled[size_t(v)] = true;
  }
  // A node on whole values using each parameter (-1: none), to refuse one also used on tiles.
  std::vector<int> whole_user(g.params.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    bool any = false, all = !n.inputs.empty();
    for (int v : n.inputs) {
      any = any || s.tiled[size_t(v)];
      all = all && s.tiled[size_t(v)];
    }
    if (!any) {
      for (int p : n.params)
        if (p >= 0 && whole_user[size_t(p)] < 0) whole_user[size_t(p)] = int(i);
      continue;
    }
    for (int p : n.params)
      if (p >= 0) s.partial_grad[size_t(p)] = true;
    const std::string& op = n.op;
    auto out_tiled = [&] {
      for (int v : n.outputs) s.tiled[size_t(v)] = true;
    };
    // A tensor-parallel graph's communication and its bias after a reduce (the tile
    // graph over channel shards) act along the channels, or row by row.
    const bool along_height = (op == "tp_gather" || op == "bias_add") && n.attrs.is_object() &&
                              n.attrs.value("dim", -1) == 1;
    if (op == "relu" || op == "gelu" || op == "silu" || op == "batchnorm2d" ||
        (op == "dropout" && n.attrs.value("p", 0.0) == 0.0) || (op == "add" && all) ||
        op == "tp_copy" || op == "tp_reduce" ||
        ((op == "tp_gather" || op == "bias_add") && !along_height)) {
      out_tiled();
      continue;
    }
    if (op == "global_avgpool") continue;  // then spatial_mean: replicated
    if (op != "conv2d" && op != "maxpool2d" && op != "avgpool2d")
      fail(n,
           "needs whole images, but its input is split by rows (tiles); keep such ops "
           "after global_avgpool or use no spatial split");
    const stages::ValueType& in = g.values[size_t(n.inputs[0])].type;
    const stages::ValueType& out = g.values[size_t(n.outputs[0])].type;
    const int64_t H = in.shape[1], h = H / degree;
    int64_t k = 0, stride = 0, pad = 0, dil = 1;
    if (op == "conv2d") {
      k = g.params[size_t(n.params[0])].shape[2];
      stride = attr_h(n, "stride", 1);
      pad = attr_h(n, "padding", 0);
      dil = attr_h(n, "dilation", 1);
    } else {
      k = attr_h(n, "kernel", 1);
      stride = attr_h(n, "stride", k);
      pad = attr_h(n, "padding", 0);
      if (op == "avgpool2d" && pad > 0 && !n.attrs.value("count_include_pad", true))
        fail(n,
             "pads the height and excludes the padding from its mean "
             "(count_include_pad = false): a tile cannot tell padding from halo");
    }
    const int64_t extent = dil * (k - 1);
    if (h % stride != 0)
      fail(n, "has stride " + std::to_string(stride) + " along the height, which does not " +
                  "divide the tile's " + std::to_string(h) + " rows (height " + std::to_string(H) +
                  " over " + std::to_string(degree) +
                  " tiles): every tile's rows must be a multiple of the strides below it");
    if (out.shape[1] * stride != H)
      fail(n, "maps the height " + std::to_string(H) + " to " + std::to_string(out.shape[1]) +
                  ", not " + std::to_string(H) + " / " + std::to_string(stride) +
                  " (\"same\" padding): the tiles' outputs would not line up");
    SpatialHalo halo;
    halo.top = pad;
    halo.bottom = std::max<int64_t>(0, extent - pad - stride + 1);
    const int64_t local = (h + halo.top + halo.bottom - extent - 1) / stride + 1;
    if (local != h / stride || halo.bottom > pad)
      fail(n, "with kernel " + std::to_string(k) + ", dilation " + std::to_string(dil) +
                  ", padding " + std::to_string(pad) + " and stride " + std::to_string(stride) +
                  " along the height gives tiles that do not line up");
    if (halo.top > h || halo.bottom > h)
      fail(n, "needs a halo of " + std::to_string(std::max(halo.top, halo.bottom)) +
                  " rows, more than a tile's " + std::to_string(h) +
                  " (halos come from the neighbouring tiles only)");
    s.halos[i] = halo;
    out_tiled();
  }
  // A parameter's gradient is summed over the tiles where it is used on tiles: its part
  // from a use on whole values (after the pooling), the same on every tile, would be summed
  // too, s times over (a conv bias tied to the classifier's had its gradient multiplied).
  for (size_t p = 0; p < g.params.size(); ++p)
    if (s.partial_grad[p] && whole_user[p] >= 0)
      throw InputError(where + ": spatial degree " + std::to_string(degree) + ": parameter '" +
                       g.params[p].name + "' is used both on the tiles and by " +
                       node_ref(g, g.nodes[size_t(whole_user[p])]) +
                       " after them, on whole values: its gradient would be summed over the "
                       "tiles twice over; give the two uses their own parameters, or use no "
                       "spatial split");
  return s;
}

std::shared_ptr<Graph> build_spatial(const Graph& lg, const SpatialSplit& s, int index) {
  (void)index;  // every tile's graph is the same; the rank decides the neighbours
  auto g = std::make_shared<Graph>();
  g->name = lg.name;
  g->source = lg.source;
  g->float_dtype = lg.float_dtype;
  g->config = lg.config;
  std::vector<int> vmap(lg.values.size(), -1), pmap(lg.params.size(), -1);
  auto local_type = [&](int v) {
    stages::ValueType t = lg.values[size_t(v)].type;
    if (s.tiled[size_t(v)]) t.shape[1] /= s.degree;
    return t;
  };
  for (int v : lg.inputs)
    vmap[size_t(v)] = g->add_value(lg.values[size_t(v)].name, local_type(v), -1);
  for (size_t p = 0; p < lg.params.size(); ++p) pmap[p] = g->add_param(lg.params[p]);
  for (int l = 0; l < lg.num_layers(); ++l) {
    const int layer = g->add_layer(lg.layers[size_t(l)].name);
    for (int id : lg.layers[size_t(l)].nodes) {
      const Node& n = lg.nodes[size_t(id)];
      std::vector<int> ins;
      for (int v : n.inputs) ins.push_back(vmap[size_t(v)]);
      std::vector<int> ps;
      for (int p : n.params) ps.push_back(p < 0 ? -1 : pmap[size_t(p)]);
      nlohmann::json attrs = n.attrs.is_null() ? nlohmann::json::object() : n.attrs;
      const bool tiled_in = !n.inputs.empty() && s.tiled[size_t(n.inputs[0])];
      std::vector<std::string> outs;
      for (int v : n.outputs) outs.push_back(lg.values[size_t(v)].name);
      auto finish = [&](int nid) {
        for (size_t j = 0; j < n.outputs.size(); ++j)
          vmap[size_t(n.outputs[j])] = g->nodes[size_t(nid)].outputs[j];
      };
      if (tiled_in && (n.op == "conv2d" || n.op == "maxpool2d" || n.op == "avgpool2d")) {
        // The op exchanges its halo itself, computing the interior meanwhile.
        const SpatialHalo& h = s.halos[size_t(id)];
        if (h.top + h.bottom > 0) attrs["halo"] = nlohmann::json::array({h.top, h.bottom});
        attrs["padding"] = with_h(attrs.value("padding", nlohmann::json(0)), 0);
        finish(detail::add_node(*g, n.name, n.op, attrs, ins, ps, outs, layer, n.json_path));
        continue;
      }
      if (tiled_in && n.op == "batchnorm2d") attrs["spatial"] = true;
      if (tiled_in && n.op == "global_avgpool") {
        const std::string tile = outs[0] + ".tile";
        int gp = detail::add_node(*g, n.name, n.op, attrs, ins, ps, {tile}, layer, n.json_path);
        finish(detail::add_node(*g, outs[0] + ".spatial_mean", "spatial_mean",
                                nlohmann::json::object(), {g->nodes[size_t(gp)].outputs[0]}, {},
                                outs, layer, n.json_path));
        continue;
      }
      finish(detail::add_node(*g, n.name, n.op, attrs, ins, ps, outs, layer, n.json_path));
    }
  }
  g->loss = lg.loss >= 0 ? vmap[size_t(lg.loss)] : -1;
  return g;
}

double spatial_halo_bytes(const Graph& g, const SpatialSplit& s, int first, int last, int64_t batch,
                          const Sharding* tp) {
  double bytes = 0;
  for (int l = first; l < last; ++l)
    for (int id : g.layers[size_t(l)].nodes) {
      const SpatialHalo& h = s.halos[size_t(id)];
      if (h.top + h.bottom == 0) continue;
      const int v = g.nodes[size_t(id)].inputs[0];
      const stages::ValueType& in = g.values[size_t(v)].type;
      double channels = double(in.shape[0]);
      if (tp && tp->values[size_t(v)].split) {
        const std::vector<int>& gathered = tp->nodes[size_t(id)].gather_inputs;
        if (std::find(gathered.begin(), gathered.end(), 0) == gathered.end())
          channels /= tp->values[size_t(v)].t;
      }
      bytes += double(batch) * double(h.top + h.bottom) * channels * double(in.shape[2]) *
               double(memory::dtype_size(in.dtype));
    }
  return bytes;
}

SpatialExchanges spatial_exchanges(const Graph& g, const SpatialSplit& s, int first, int last) {
  SpatialExchanges e;
  for (int l = first; l < last; ++l)
    for (int id : g.layers[size_t(l)].nodes) {
      const Node& n = g.nodes[size_t(id)];
      if (n.inputs.empty() || !s.tiled[size_t(n.inputs[0])]) continue;
      const SpatialHalo& h = s.halos[size_t(id)];
      if (h.top + h.bottom > 0) {
        e.forward++;
        e.backward++;
      } else if (n.op == "batchnorm2d") {
        e.forward += 2;
        e.backward++;
      } else if (n.op == "global_avgpool") {
        e.forward++;
      }
    }
  return e;
}

void sync_batchnorm(Graph& g) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.op != "batchnorm2d") continue;
    if (n.attrs.is_null()) n.attrs = nlohmann::json::object();
    n.attrs["spatial"] = true;
    detail::remake_op(g, int(i));
  }
}

}  // namespace baton::partitioner
