// Convolutions under tensor parallelism: a tiny ResNet (the `resnet` shorthand) and a
// general graph with biases, a grouped convolution and pooling, at TP = 2 and 4, each rank
// a thread over the local transport, give the logical graph's losses and (gathered)
// gradients; the default policy pairs the convolutions of a basic block (columns, rows);
// impossible splits are refused naming the node.
#include <gtest/gtest.h>

#include "partitioner/tensor_parallel.h"
#include "stages/model.h"
#include "stages/resnet.h"
#include "tp_harness.h"

namespace baton::partitioner {
namespace {

using nlohmann::json;
using stages::DType;
using stages::Graph;
using namespace testing;

// Stem 3x3 (stride 1) + max pooling, two stages of one basic block (the second with a
// stride-2 downsample), 4 classes, 2-channel 8x8 images.
json tiny_resnet() {
  return {{"type", "resnet"},   {"in_channels", 2}, {"image_size", 8},  {"classes", 4},
          {"stem_channels", 4}, {"stem_kernel", 3}, {"stem_stride", 1}, {"widths", {4, 8}},
          {"depths", {1, 1}},   {"strides", {1, 2}}};
}

// conv (bias) -> relu -> grouped conv (bias, 4 groups, dilation 2) -> relu -> batchnorm -> avgpool
// -> conv (bias) -> maxpool -> global_avgpool -> linear -> cross-entropy, in two layers.
json general() {
  auto p = [](const std::string& n, std::vector<int64_t> shape, json init) {
    return json{{"name", n}, {"shape", shape}, {"init", init}};
  };
  json normal = {{"type", "normal"}, {"std", 0.3}};
  json params = json::array({p("a.weight", {8, 2, 3, 3}, normal), p("a.bias", {8}, normal),
                             p("g.weight", {8, 2, 3, 3}, normal), p("g.bias", {8}, normal),
                             p("bn.weight", {8}, normal), p("bn.bias", {8}, normal),
                             json{{"name", "bn.running_mean"},
                                  {"shape", {8}},
                                  {"init", {{"type", "zeros"}}},
                                  {"trainable", false}},
                             json{{"name", "bn.running_var"},
                                  {"shape", {8}},
                                  {"init", {{"type", "ones"}}},
                                  {"trainable", false}},
                             p("b.weight", {4, 8, 3, 3}, normal), p("b.bias", {4}, normal),
                             p("fc.weight", {4, 4}, normal), p("fc.bias", {4}, normal)});
  auto node = [](const std::string& n, const std::string& op, std::vector<std::string> in, json prm,
                 json attrs) {
    json j = {{"name", n}, {"op", op}, {"inputs", in}, {"outputs", {n}}};
    if (!prm.empty()) j["params"] = prm;
    if (!attrs.empty()) j["attrs"] = attrs;
    return j;
  };
  json l0 = json::array({node("a", "conv2d", {"images"},
                              {{"weight", "a.weight"}, {"bias", "a.bias"}}, {{"padding", 1}}),
                         node("relu", "relu", {"a"}, json::object(), json::object()),
                         node("g", "conv2d", {"relu"}, {{"weight", "g.weight"}, {"bias", "g.bias"}},
                              {{"padding", 2}, {"dilation", 2}, {"groups", 4}}),
                         node("relu2", "relu", {"g"}, json::object(), json::object()),
                         node("bn", "batchnorm2d", {"relu2"},
                              {{"weight", "bn.weight"},
                               {"bias", "bn.bias"},
                               {"running_mean", "bn.running_mean"},
                               {"running_var", "bn.running_var"}},
                              json::object()),
                         node("pool", "avgpool2d", {"bn"}, json::object(), {{"kernel", 2}})});
  json l1 = json::array(
      {node("b", "conv2d", {"pool"}, {{"weight", "b.weight"}, {"bias", "b.bias"}},
            {{"padding", 1}, {"stride", 2}}),
       node("mp", "maxpool2d", {"b"}, json::object(), {{"kernel", 2}, {"padding", 1}}),
       node("gap", "global_avgpool", {"mp"}, json::object(), json::object()),
       node("fc", "linear", {"gap"}, {{"weight", "fc.weight"}, {"bias", "fc.bias"}},
            json::object()),
       node("loss", "cross_entropy", {"fc", "labels"}, json::object(), json::object())});
  return {
      {"type", "graph"},
      {"name", "convs"},
      {"inputs", json::array({{{"name", "images"}, {"shape", {2, 8, 8}}, {"dtype", "f32"}},
                              {{"name", "labels"}, {"shape", json::array()}, {"dtype", "i32"}}})},
      {"params", params},
      {"layers", json::array({{{"name", "l0"}, {"nodes", l0}}, {{"name", "l1"}, {"nodes", l1}}})},
      {"loss", "loss"}};
}

SplitKind kind_of(const Graph& g, const Sharding& s, const std::string& node) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == node) return s.nodes[i].kind;
  ADD_FAILURE() << "no node " << node;
  return SplitKind::none;
}

std::string conv_split_error_of(const Graph& g, int tp, const SplitOverrides& ov) {
  try {
    plan_sharding(g, std::vector<int>(size_t(g.num_layers()), tp), ov, "plan.json: $.parallel.tp");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

class ConvSplit : public ::testing::TestWithParam<std::tuple<int, DType, int>> {};

TEST_P(ConvSplit, MatchesLogicalGraph) {
  auto [which, dtype, tp] = GetParam();
  auto g = load_in_dtype(which == 0 ? tiny_resnet() : general(), dtype);
  SCOPED_TRACE(std::string(which == 0 ? "resnet" : "general") + " tp=" + std::to_string(tp) + " " +
               std::string(memory::dtype_name(dtype)));
  RunSpec spec;
  RunOutput want = run_logical(g, spec);
  RunOutput got = run_tensor_parallel(g, tp, {}, spec);
  expect_same_run(want, got, dtype == DType::f64 ? 1e-11 : 1e-5, true);
}

INSTANTIATE_TEST_SUITE_P(Models, ConvSplit,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(DType::f32, DType::f64),
                                            ::testing::Values(2, 4)));

// A basic block: conv1 by columns, bn1 and relu1 on the channel split, conv2 by rows
// (then tp_reduce); the stem and the downsample feed a residual add and stay whole; the
// classifier takes global_avgpool's channel split by rows.
TEST(ConvSplit, PairsABasicBlockLikeTheMlp) {
  auto g = load_in_dtype(tiny_resnet(), DType::f32);
  Sharding s = plan_sharding(*g, std::vector<int>(size_t(g->num_layers()), 2), {}, "test");
  EXPECT_EQ(kind_of(*g, s, "conv1"), SplitKind::none);
  for (std::string b : {"layer1.0.", "layer2.0."}) {
    EXPECT_EQ(kind_of(*g, s, b + "conv1"), SplitKind::column) << b;
    EXPECT_EQ(kind_of(*g, s, b + "conv2"), SplitKind::row) << b;
  }
  EXPECT_EQ(kind_of(*g, s, "layer2.0.downsample.0"), SplitKind::none);
  // The classifier by columns, the cross-entropy vocabulary-parallel (as an MLP head).
  EXPECT_EQ(kind_of(*g, s, "fc"), SplitKind::column);
  auto pg = build_physical(*g, s, std::vector<int>(size_t(g->num_layers()), 1));
  int reduces = 0, copies = 0;
  for (const auto& n : pg->nodes) {
    reduces += n.op == "tp_reduce";
    copies += n.op == "tp_copy";
  }
  EXPECT_EQ(reduces, 2);
  EXPECT_EQ(copies, 3);
  const stages::Param& w = pg->params[size_t(pg->find_param("layer1.0.conv2.weight"))];
  EXPECT_EQ(w.shape, (std::vector<int64_t>{4, 2, 3, 3}));
  const stages::Param& rm = pg->params[size_t(pg->find_param("layer1.0.bn1.running_mean"))];
  EXPECT_EQ(rm.shape, (std::vector<int64_t>{2}));

  // The general graph: a by columns, g by whole groups, b by rows (bias after the reduce).
  auto h = load_in_dtype(general(), DType::f32);
  Sharding t = plan_sharding(*h, std::vector<int>(size_t(h->num_layers()), 2), {}, "test");
  EXPECT_EQ(kind_of(*h, t, "a"), SplitKind::column);
  EXPECT_EQ(kind_of(*h, t, "g"), SplitKind::column);
  EXPECT_EQ(kind_of(*h, t, "b"), SplitKind::row);
  EXPECT_EQ(kind_of(*h, t, "fc"), SplitKind::column);
}

// Overrides: the block kept whole, a channel split gathered (tp_gather along the channels),
// the classifier by rows after a channel-split global_avgpool.
TEST(ConvSplit, OverridesMatchLogicalGraph) {
  auto g = load_in_dtype(tiny_resnet(), DType::f64);
  RunSpec spec;
  RunOutput want = run_logical(g, spec);
  SplitOverrides ov;
  ov.kinds["layer1.0.conv1"] = SplitKind::none;  // then conv2 runs whole too
  ov.kinds["layer2.0.conv2"] = SplitKind::none;  // conv1's channel split gathered
  expect_same_run(want, run_tensor_parallel(g, 2, ov, spec), 1e-11, true);

  auto h = load_in_dtype(general(), DType::f64);
  RunOutput want_h = run_logical(h, spec);
  SplitOverrides ov2;
  ov2.kinds["b"] = SplitKind::none;  // the grouped conv's split gathered before b
  expect_same_run(want_h, run_tensor_parallel(h, 2, ov2, spec), 1e-11, true);
  SplitOverrides ov3;
  ov3.kinds["a"] = SplitKind::none;
  ov3.kinds["b"] = SplitKind::column;  // b's split passes maxpool and global_avgpool: fc by rows
  Sharding s3 = plan_sharding(*h, {2, 2}, ov3, "test");
  EXPECT_EQ(kind_of(*h, s3, "fc"), SplitKind::row);
  expect_same_run(want_h, run_tensor_parallel(h, 2, ov3, spec), 1e-11, true);
}

TEST(ConvSplit, RefusesImpossibleSplits) {
  auto g = load_in_dtype(tiny_resnet(), DType::f32);
  SplitOverrides ov;
  ov.kinds["conv1"] = SplitKind::row;
  ov.where["conv1"] = "plan.json: $.splits.conv1";
  std::string e = conv_split_error_of(*g, 2, ov);
  EXPECT_NE(e.find("plan.json: $.splits.conv1"), std::string::npos) << e;
  EXPECT_NE(e.find("needs its input split by channels"), std::string::npos) << e;

  ov.kinds = {{"layer1.0.bn1", SplitKind::column}};
  ov.where = {{"layer1.0.bn1", "plan.json: $.splits['layer1.0.bn1']"}};
  e = conv_split_error_of(*g, 2, ov);
  EXPECT_NE(e.find("cannot be split"), std::string::npos) << e;

  ov.kinds = {{"layer1.0.conv1", SplitKind::vocab}};
  ov.where = {{"layer1.0.conv1", "plan.json: $.splits['layer1.0.conv1']"}};
  e = conv_split_error_of(*g, 2, ov);
  EXPECT_NE(e.find("expected \"column\", \"row\" or \"none\" for conv2d"), std::string::npos) << e;

  // TP 3 does not divide the block's 4 output channels.
  e = conv_split_error_of(*g, 3, {});
  EXPECT_NE(e.find("does not divide the output channels = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("layer1.0.conv1"), std::string::npos) << e;

  // The grouped conv: no row split; TP 8 does not divide its 4 groups.
  auto h = load_in_dtype(general(), DType::f32);
  ov.kinds = {{"g", SplitKind::row}};
  ov.where = {{"g", "plan.json: $.splits.g"}};
  e = conv_split_error_of(*h, 2, ov);
  EXPECT_NE(e.find("splits by whole groups"), std::string::npos) << e;
  ov.kinds = {{"a", SplitKind::column}};
  e = conv_split_error_of(*h, 8, ov);
  EXPECT_NE(e.find("does not divide the groups = 4"), std::string::npos) << e;
}

}  // namespace
}  // namespace baton::partitioner
