#include "stages/resnet.h"

#include <cmath>

#include "kernels/vision.h"
#include "stages/detail/graph_json.h"

namespace baton::stages {

using detail::graph_node;
using detail::graph_param;
using nlohmann::json;

namespace {

constexpr int64_t kBig = int64_t(1) << 20;

// Builds the graph while tracking the current value, its channels and spatial size.
struct Builder {
  const ResnetConfig& c;
  json params = json::array();
  json layers = json::array();
  json nodes = json::array();
  std::string x = "images";
  int64_t ch = 0, h = 0, w = 0;

  // conv (no bias: batch norm follows) + batch norm, optionally relu; returns the output.
  std::string conv_bn(const std::string& conv, const std::string& bn, const std::string& in,
                      int64_t in_ch, int64_t out_ch, int64_t k, int64_t stride, bool relu,
                      const std::string& relu_name, int64_t& hh, int64_t& ww) {
    // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu").
    const double std = std::sqrt(2.0 / double(out_ch * k * k));
    params.push_back(
        graph_param(conv + ".weight", {out_ch, in_ch, k, k}, {{"type", "normal"}, {"std", std}}));
    nodes.push_back(graph_node(conv, "conv2d", {in}, {{"weight", conv + ".weight"}},
                               {{"stride", stride}, {"padding", k / 2}}));
    hh = kernels::conv_output_size(hh, k, stride, k / 2, k / 2, 1);
    ww = kernels::conv_output_size(ww, k, stride, k / 2, k / 2, 1);
    params.push_back(graph_param(bn + ".weight", {out_ch}, {{"type", "ones"}}));
    params.push_back(graph_param(bn + ".bias", {out_ch}, {{"type", "zeros"}}));
    params.push_back(graph_param(bn + ".running_mean", {out_ch}, {{"type", "zeros"}}, false));
    params.push_back(graph_param(bn + ".running_var", {out_ch}, {{"type", "ones"}}, false));
    nodes.push_back(graph_node(bn, "batchnorm2d", {conv},
                               {{"weight", bn + ".weight"},
                                {"bias", bn + ".bias"},
                                {"running_mean", bn + ".running_mean"},
                                {"running_var", bn + ".running_var"}},
                               {{"eps", c.bn_eps}, {"momentum", c.bn_momentum}}));
    if (!relu) return bn;
    nodes.push_back(graph_node(relu_name, "relu", {bn}));
    return relu_name;
  }

  void end_layer(const std::string& name) {
    layers.push_back({{"name", name}, {"nodes", nodes}});
    nodes = json::array();
  }

  void block(const std::string& p, int64_t width, int64_t stride) {
    const int64_t out_ch = width * c.expansion();
    int64_t hh = h, ww = w;
    std::string y;
    if (c.block == "basic") {
      y = conv_bn(p + "conv1", p + "bn1", x, ch, width, 3, stride, true, p + "relu1", hh, ww);
      y = conv_bn(p + "conv2", p + "bn2", y, width, width, 3, 1, false, "", hh, ww);
    } else {
      // torchvision's ResNet v1.5: the stride sits on the 3x3 convolution.
      y = conv_bn(p + "conv1", p + "bn1", x, ch, width, 1, 1, true, p + "relu1", hh, ww);
      y = conv_bn(p + "conv2", p + "bn2", y, width, width, 3, stride, true, p + "relu2", hh, ww);
      y = conv_bn(p + "conv3", p + "bn3", y, width, out_ch, 1, 1, false, "", hh, ww);
    }
    std::string shortcut = x;
    if (stride != 1 || ch != out_ch) {
      int64_t sh = h, sw = w;
      shortcut = conv_bn(p + "downsample.0", p + "downsample.1", x, ch, out_ch, 1, stride, false,
                         "", sh, sw);
    }
    nodes.push_back(graph_node(p + "add", "add", {y, shortcut}));
    nodes.push_back(graph_node(p + "relu", "relu", {p + "add"}));
    x = p + "relu";
    ch = out_ch;
    h = hh;
    w = ww;
  }
};

}  // namespace

ResnetConfig parse_resnet_shorthand(const JsonReader& r) {
  r.expect_only({"type", "name", "in_channels", "image_size", "classes", "stem_channels",
                 "stem_kernel", "stem_stride", "stem_pool", "block", "widths", "depths", "strides",
                 "bn_eps", "bn_momentum"});
  ResnetConfig c;
  c.name = r.get_string("name", "resnet");
  c.in_channels = r.at("in_channels").as_int(1, kBig);
  JsonReader size = r.at("image_size");
  if (size.is_array()) {
    if (size.size() != 2) size.fail("an integer or [height, width]", json_brief(size.raw()));
    c.height = size.at(size_t(0)).as_int(1, kBig);
    c.width = size.at(size_t(1)).as_int(1, kBig);
  } else {
    c.height = c.width = size.as_int(1, kBig);
  }
  c.classes = r.at("classes").as_int(1, kBig);
  c.stem_channels = r.get_int("stem_channels", 64, 1, kBig);
  c.stem_kernel = r.get_int("stem_kernel", 7, 1, 15);
  if (c.stem_kernel % 2 == 0)
    r.at("stem_kernel").fail("an odd kernel size", std::to_string(c.stem_kernel));
  c.stem_stride = r.get_int("stem_stride", 2, 1, 8);
  c.stem_pool = r.get_bool("stem_pool", true);
  c.block = r.get_string("block", "basic");
  if (c.block != "basic" && c.block != "bottleneck")
    r.at("block").fail("\"basic\" or \"bottleneck\"", "\"" + c.block + "\"");
  for (const JsonReader& v : r.at("widths").items()) c.widths.push_back(v.as_int(1, kBig));
  for (const JsonReader& v : r.at("depths").items()) c.depths.push_back(v.as_int(1, 1024));
  if (c.widths.empty()) r.at("widths").fail("at least one stage");
  if (c.depths.size() != c.widths.size())
    r.at("depths").fail("one depth per width (" + std::to_string(c.widths.size()) + ")",
                        std::to_string(c.depths.size()) + " depth(s)");
  if (auto s = r.get("strides")) {
    for (const JsonReader& v : s->items()) c.strides.push_back(v.as_int(1, 8));
    if (c.strides.size() != c.widths.size())
      s->fail("one stride per width (" + std::to_string(c.widths.size()) + ")",
              std::to_string(c.strides.size()) + " stride(s)");
  } else {
    for (size_t i = 0; i < c.widths.size(); ++i) c.strides.push_back(i == 0 ? 1 : 2);
  }
  c.bn_eps = r.get_double("bn_eps", 1e-5, 1e-12, 1.0);
  c.bn_momentum = r.get_double("bn_momentum", 0.1, 0.0, 1.0);
  return c;
}

json resnet_graph_json(const ResnetConfig& c) {
  Builder b{c};
  b.ch = c.in_channels;
  b.h = c.height;
  b.w = c.width;
  int64_t hh = b.h, ww = b.w;
  b.x = b.conv_bn("conv1", "bn1", "images", c.in_channels, c.stem_channels, c.stem_kernel,
                  c.stem_stride, true, "relu", hh, ww);
  b.ch = c.stem_channels;
  b.h = hh;
  b.w = ww;
  if (c.stem_pool) {
    b.nodes.push_back(graph_node("maxpool", "maxpool2d", {b.x}, json::object(),
                                 {{"kernel", 3}, {"stride", 2}, {"padding", 1}}));
    b.x = "maxpool";
    b.h = kernels::conv_output_size(b.h, 3, 2, 1, 1, 1);
    b.w = kernels::conv_output_size(b.w, 3, 2, 1, 1, 1);
  }
  b.end_layer("stem");
  for (size_t s = 0; s < c.widths.size(); ++s)
    for (int64_t i = 0; i < c.depths[s]; ++i) {
      const std::string name = "layer" + std::to_string(s + 1) + "." + std::to_string(i);
      b.block(name + ".", c.widths[s], i == 0 ? c.strides[s] : 1);
      b.end_layer(name);
    }
  b.nodes.push_back(graph_node("avgpool", "global_avgpool", {b.x}));
  // torch.nn.Linear's default init is uniform(+-1/sqrt(in)); a normal of the same variance.
  const double fc_std = 1.0 / std::sqrt(3.0 * double(b.ch));
  b.params.push_back(
      graph_param("fc.weight", {c.classes, b.ch}, {{"type", "normal"}, {"std", fc_std}}));
  b.params.push_back(graph_param("fc.bias", {c.classes}, {{"type", "zeros"}}));
  b.nodes.push_back(
      graph_node("fc", "linear", {"avgpool"}, {{"weight", "fc.weight"}, {"bias", "fc.bias"}}));
  b.nodes.push_back(graph_node("loss", "cross_entropy", {"fc", "labels"}));
  b.end_layer("head");
  return {
      {"type", "graph"},
      {"name", c.name},
      {"inputs",
       json::array(
           {{{"name", "images"}, {"shape", {c.in_channels, c.height, c.width}}, {"dtype", "f32"}},
            {{"name", "labels"}, {"shape", json::array()}, {"dtype", "i32"}}})},
      {"params", b.params},
      {"layers", b.layers},
      {"loss", "loss"}};
}

}  // namespace baton::stages
