// The spatial split: every tile of a spatial group a thread over the local transport,
// halo exchanges for convolutions and pooling, batch-norm statistics reduced over the
// tiles; the loss, the (summed) gradients and the running statistics equal the unsplit
// graph's. Halo edge cases (kernel 1, 3, 5, stride 2, dilation 2, tiles of one row, an
// empty interior, max and average pooling with and without an interior) and the tiny
// ResNet at spatial 2 and 4; refusals name the node.
#include <gtest/gtest.h>

#include "partitioner/spatial.h"
#include "stages/model.h"
#include "tp_harness.h"

namespace baton::partitioner {
namespace {

using nlohmann::json;
using stages::DType;
using stages::Graph;
using namespace testing;

std::shared_ptr<Graph> spatial_load(const json& m, DType dtype) {
  stages::LoadOptions o;
  o.float_dtype = dtype;
  return std::make_shared<Graph>(stages::load_model_json(m, "model.json", o));
}

struct Layer {
  std::string op;                                     // conv2d, maxpool2d, avgpool2d
  int64_t k = 3, stride = 1, dilation = 1, pad = -1;  // pad -1: dilation (k - 1) / 2
  bool bn = false;                                    // batchnorm2d + relu after it
};

// images [2, H, 5] -> the layers -> relu -> global_avgpool -> linear (3 classes).
json chain(int64_t height, const std::vector<Layer>& layers) {
  json params = json::array(), nodes = json::array();
  std::string x = "images";
  int64_t ch = 2;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const std::string n = "n" + std::to_string(i);
    const int64_t pad = l.pad >= 0 ? l.pad : l.dilation * (l.k - 1) / 2;
    if (l.op == "conv2d") {
      params.push_back({{"name", n + ".weight"},
                        {"shape", {3, ch, l.k, l.k}},
                        {"init", {{"type", "normal"}, {"std", 0.4}}}});
      // No bias before batch norm (its gradient would be zero up to round-off).
      json prm = {{"weight", n + ".weight"}};
      if (!l.bn) {
        params.push_back(
            {{"name", n + ".bias"}, {"shape", {3}}, {"init", {{"type", "normal"}, {"std", 0.4}}}});
        prm["bias"] = n + ".bias";
      }
      nodes.push_back(
          {{"name", n},
           {"op", "conv2d"},
           {"inputs", {x}},
           {"outputs", {n}},
           {"params", prm},
           {"attrs", {{"stride", l.stride}, {"padding", pad}, {"dilation", l.dilation}}}});
      ch = 3;
    } else {
      nodes.push_back({{"name", n},
                       {"op", l.op},
                       {"inputs", {x}},
                       {"outputs", {n}},
                       {"attrs", {{"kernel", l.k}, {"stride", l.stride}, {"padding", pad}}}});
    }
    x = n;
    if (l.bn) {
      for (std::string p : {"weight", "bias"})
        params.push_back({{"name", n + ".bn." + p},
                          {"shape", {ch}},
                          {"init", {{"type", "normal"}, {"std", 0.5}}}});
      params.push_back({{"name", n + ".bn.running_mean"},
                        {"shape", {ch}},
                        {"init", {{"type", "zeros"}}},
                        {"trainable", false}});
      params.push_back({{"name", n + ".bn.running_var"},
                        {"shape", {ch}},
                        {"init", {{"type", "ones"}}},
                        {"trainable", false}});
      nodes.push_back({{"name", n + ".bn"},
                       {"op", "batchnorm2d"},
                       {"inputs", {x}},
                       {"outputs", {n + ".bn"}},
                       {"params",
                        {{"weight", n + ".bn.weight"},
                         {"bias", n + ".bn.bias"},
                         {"running_mean", n + ".bn.running_mean"},
                         {"running_var", n + ".bn.running_var"}}}});
      x = n + ".bn";
    }
    nodes.push_back(
        {{"name", n + ".relu"}, {"op", "relu"}, {"inputs", {x}}, {"outputs", {n + ".relu"}}});
    x = n + ".relu";
  }
  params.push_back(
      {{"name", "fc.weight"}, {"shape", {3, ch}}, {"init", {{"type", "normal"}, {"std", 0.5}}}});
  params.push_back({{"name", "fc.bias"}, {"shape", {3}}, {"init", {{"type", "zeros"}}}});
  nodes.push_back(
      {{"name", "gap"}, {"op", "global_avgpool"}, {"inputs", {x}}, {"outputs", {"gap"}}});
  nodes.push_back({{"name", "fc"},
                   {"op", "linear"},
                   {"inputs", {"gap"}},
                   {"outputs", {"fc"}},
                   {"params", {{"weight", "fc.weight"}, {"bias", "fc.bias"}}}});
  nodes.push_back({{"name", "loss"},
                   {"op", "cross_entropy"},
                   {"inputs", {"fc", "labels"}},
                   {"outputs", {"loss"}}});
  return {
      {"type", "graph"},
      {"name", "chain"},
      {"inputs", json::array({{{"name", "images"}, {"shape", {2, height, 5}}, {"dtype", "f32"}},
                              {{"name", "labels"}, {"shape", json::array()}, {"dtype", "i32"}}})},
      {"params", params},
      {"layers", json::array({{{"name", "all"}, {"nodes", nodes}}})},
      {"loss", "loss"}};
}

void spatial_expect_same(const RunOutput& want, const RunOutput& got, double tol) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::abs(want.losses[i]))
        << "micro-batch " << i;
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    EXPECT_EQ(rel_diff(got.params.at(name), t), 0.0) << "initial " << name;
    EXPECT_LE(rel_diff(got.grads.at(name), want.grads.at(name)), tol) << "gradient of " << name;
    EXPECT_LE(rel_diff(got.final_params.at(name), want.final_params.at(name)), tol)
        << "final " << name;
  }
  EXPECT_LE(got.replica_mismatch, tol);
}

void spatial_check(const json& model, int degree) {
  for (DType d : {DType::f64, DType::f32}) {
    SCOPED_TRACE("spatial " + std::to_string(degree) + " " + std::string(memory::dtype_name(d)));
    auto g = spatial_load(model, d);
    RunSpec spec;
    spatial_expect_same(run_logical(g, spec), run_spatial(g, degree, spec),
                        d == DType::f64 ? 1e-11 : 1e-5);
  }
}

TEST(SpatialHalo, Kernel1) {
  spatial_check(chain(8, {{"conv2d", 1}}), 2);
}
TEST(SpatialHalo, Kernel3TilesOfOneRow) {
  spatial_check(chain(4, {{"conv2d", 3}}), 4);
}
TEST(SpatialHalo, Kernel5) {
  spatial_check(chain(8, {{"conv2d", 5}}), 4);
}  // halo 2 = the tile
TEST(SpatialHalo, Stride2) {
  spatial_check(chain(8, {{"conv2d", 3, 2}, {"conv2d", 1, 2}}), 2);  // then a 1x1 stride-2: no halo
}
TEST(SpatialHalo, Dilation2) {
  spatial_check(chain(8, {{"conv2d", 3, 1, 2}}), 2);
}
// The convolution computes its interior while the halo is in flight, then the border:
// here the interior is empty (every row reads a halo) and the halos are uneven.
TEST(SpatialHalo, Stride2Kernel5NoInterior) {
  spatial_check(chain(8, {{"conv2d", 5, 2}}), 4);  // top 2, bottom 1 on tiles of 2 rows
}
TEST(SpatialHalo, Dilation2NoInterior) {
  spatial_check(chain(8, {{"conv2d", 3, 1, 2}}), 4);  // halos of 2 on tiles of 2
}
TEST(SpatialHalo, PoolingAndBatchNorm) {
  // Max pooling pads with -inf, average pooling (count_include_pad) with zeros.
  spatial_check(chain(16, {{"conv2d", 3, 1, 1, -1, true},
                           {"maxpool2d", 3, 2},
                           {"avgpool2d", 3, 1},
                           {"avgpool2d", 2, 2, 1, 0}}),
                4);
}

// Tiled batch norm with eps far above the batch's variance: each tile's variance had been
// rebuilt from its rstd as 1 / rstd^2 - eps, losing eps / var of float's precision (the
// running variance off by percents where var << eps); the kernel's own variance is exact.
TEST(SpatialHalo, BatchNormVarianceFarBelowEps) {
  json model = chain(8, {{"conv2d", 3, 1, 1, -1, true}});
  for (json& p : model["params"])
    if (p["name"] == "n0.weight") p["init"]["std"] = 1e-3;  // a variance about 1e-6
  for (json& layer : model["layers"])
    for (json& node : layer["nodes"])
      if (node["op"] == "batchnorm2d") node["attrs"] = {{"eps", 1.0}, {"momentum", 1.0}};
  spatial_check(model, 2);
}

// Pooling computes its interior while the halo is in flight too, then the border rows
// from the halo (max pooling's argmax re-based onto the tile): halos on both sides, a
// stride-2 window reading only the top halo, tiles of one row (no interior). A 1x1
// convolution first, so the gradients go through every pooling (and its relu gives max
// pooling ties).
TEST(SpatialHalo, PoolingInteriorAndBorder) {
  spatial_check(
      chain(8, {{"conv2d", 1}, {"maxpool2d", 3, 1}, {"avgpool2d", 3, 1}, {"maxpool2d", 3, 2}}), 2);
}
TEST(SpatialHalo, PoolingTilesOfOneRow) {
  spatial_check(chain(4, {{"conv2d", 1}, {"maxpool2d", 3, 1}, {"avgpool2d", 3, 1}}), 4);
}

json resnet16() {
  return {{"type", "resnet"},   {"in_channels", 2}, {"image_size", 16}, {"classes", 4},
          {"stem_channels", 4}, {"stem_kernel", 3}, {"stem_stride", 1}, {"widths", {4, 8}},
          {"depths", {1, 1}},   {"strides", {1, 2}}};
}

TEST(SpatialResnet, Degree2) {
  auto g = spatial_load(resnet16(), DType::f32);
  RunSpec spec;
  spatial_expect_same(run_logical(g, spec), run_spatial(g, 2, spec), 1e-5);
}

TEST(SpatialResnet, Degree4) {
  auto g = spatial_load(resnet16(), DType::f32);
  RunSpec spec;
  spatial_expect_same(run_logical(g, spec), run_spatial(g, 4, spec), 1e-5);
}

std::string spatial_error_of(const json& model, int degree) {
  auto g = spatial_load(model, DType::f32);
  try {
    plan_spatial(*g, degree, "plan.json: $.stages[0].spatial");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SpatialSplitRefuses, WithTheReason) {
  std::string e = spatial_error_of(chain(8, {{"conv2d", 3}}), 3);
  EXPECT_NE(e.find("does not divide the height 8 of input 'images'"), std::string::npos) << e;
  EXPECT_NE(e.find("plan.json: $.stages[0].spatial"), std::string::npos) << e;
  // 16 rows over 8 tiles: the stem's pooling (stride 2) leaves 1 row, layer2's stride 2
  // cannot split it.
  e = spatial_error_of(resnet16(), 8);
  EXPECT_NE(e.find("stride 2 along the height, which does not divide the tile's 1 rows"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("layer2.0.conv1"), std::string::npos) << e;
  // A 5x5 kernel on tiles of one row: its halo of 2 rows would need two neighbours.
  e = spatial_error_of(chain(4, {{"conv2d", 5}}), 4);
  EXPECT_NE(e.find("needs a halo of 2 rows, more than a tile's 1"), std::string::npos) << e;
  // Padding that is not "same": the tiles' outputs would not line up.
  e = spatial_error_of(chain(8, {{"conv2d", 3, 1, 1, 0}}), 2);
  EXPECT_NE(e.find("maps the height 8 to 6"), std::string::npos) << e;
  // A conv bias tied to the classifier's: its gradient is summed over the tiles, and the
  // classifier's part, whole and the same on every tile, had been summed with it.
  e = spatial_error_of(json::parse(R"({"type": "graph", "name": "tied",
    "inputs": [{"name": "images", "shape": [2, 8, 4], "dtype": "f32"},
               {"name": "labels", "shape": [], "dtype": "i64"}],
    "params": [{"name": "cw", "shape": [5, 2, 3, 3], "init": {"type": "normal", "std": 0.5}},
               {"name": "b", "shape": [5], "init": {"type": "zeros"}},
               {"name": "fw", "shape": [5, 5], "init": {"type": "normal", "std": 0.5}}],
    "layers": [{"name": "body", "nodes": [
      {"name": "conv", "op": "conv2d", "inputs": ["images"], "outputs": ["c"],
       "params": {"weight": "cw", "bias": "b"}, "attrs": {"padding": 1}}]},
     {"name": "head", "nodes": [
      {"name": "gap", "op": "global_avgpool", "inputs": ["c"], "outputs": ["p"]},
      {"name": "fc", "op": "linear", "inputs": ["p"], "outputs": ["logits"],
       "params": {"weight": "fw", "bias": "b"}},
      {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "labels"], "outputs": ["loss"]}]}],
    "loss": "loss"})"),
                       2);
  EXPECT_NE(e.find("parameter 'b' is used both on the tiles and by linear node 'fc' (layer head) "
                   "after them"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace baton::partitioner
