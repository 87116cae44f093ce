// The vision ops through the graph and the Stage: f64 gradients of a general graph using
// every vision op and of the resnet shorthand (basic and bottleneck blocks) against finite
// differences; batch norm's running statistics (the update, once per training forward,
// not again on recompute, untouched by the optimizer, used in evaluation, saved and loaded
// by checkpoints); shape inference and its errors.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>

#include "engine/trainer.h"
#include "memory/file_io.h"
#include "stages/checkpoint.h"
#include "stages/image_data.h"
#include "stages/resnet.h"
#include "tests/fifo_read.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

using testing::gradients_and_loss;
using testing::random_like;
using testing::value_of;

constexpr double kVisionStep = 1e-5;

// ||a - n|| / max(||a||, ||n||) over sampled elements of x.
void check_grad(const std::string& what, Tensor x, const Tensor& grad,
                const std::function<double()>& loss, int samples, uint64_t seed) {
  ASSERT_EQ(x.dtype(), DType::f64);
  double* p = x.data<double>();
  std::vector<double> g = grad.to_vector<double>();
  std::mt19937_64 rng(seed);
  double num = 0, da = 0, dn = 0;
  const int64_t n = x.numel();
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    const int64_t i = samples >= n ? s : int64_t(rng() % uint64_t(n));
    const double orig = p[i];
    p[i] = orig + kVisionStep;
    const double lp = loss();
    p[i] = orig - kVisionStep;
    const double lm = loss();
    p[i] = orig;
    const double f = (lp - lm) / (2 * kVisionStep);
    num += (g[size_t(i)] - f) * (g[size_t(i)] - f);
    da += g[size_t(i)] * g[size_t(i)];
    dn += f * f;
  }
  const double den = std::sqrt(std::max(da, dn));
  EXPECT_LT(den == 0 ? 0 : std::sqrt(num) / den, 1e-6) << what;
  EXPECT_GT(dn, 0.0) << what << ": every sampled gradient is zero; the check proves nothing";
}

Tensor labels(std::vector<int32_t> v) {
  const int64_t n = int64_t(v.size());
  return Tensor::from_vector(v, {n});
}

// Every trainable parameter's gradient of the whole model against finite differences;
// the running statistics get none (zero) and are not checked.
void check_model(const std::shared_ptr<Graph>& g, const TensorMap& in, int64_t batch, uint64_t seed,
                 int samples) {
  StageOptions so;
  so.seed = seed;
  Stage st(g, 0, g->num_layers(), so);
  for (int id : st.param_ids()) {
    const Param& p = g->params[size_t(id)];
    if (!p.trainable) continue;
    // Scales and shifts around their usual values, the rest small and random.
    const bool bn_scale = p.name.find("bn") != std::string::npos && p.name.ends_with(".weight");
    kernels::random_normal(st.param(id), bn_scale ? 1.0 : 0.0, 0.4, seed, uint64_t(id) + 1,
                           kernels::Block{});
  }
  const auto loss = gradients_and_loss(st, MicroBatch{0, 0, batch, batch, double(batch), 2}, in);
  int checked = 0;
  for (int id : st.param_ids()) {
    const Param& p = g->params[size_t(id)];
    if (!p.trainable) {
      EXPECT_EQ(kernels::sum_squares(st.grad(id)), 0.0) << p.name;
      continue;
    }
    check_grad(p.name, st.param(id), st.grad(id).clone(), loss, samples, seed + uint64_t(id));
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

std::shared_ptr<Graph> load_f64(const nlohmann::json& m, const std::string& name) {
  LoadOptions lo;
  lo.float_dtype = DType::f64;
  return std::make_shared<Graph>(load_model_json(m, name, lo));
}

// conv2d (stride [2, 1], dilation [1, 2]; groups 2; 1x1 with bias), batchnorm2d, relu,
// maxpool2d, add, avgpool2d without counting padding, global_avgpool, linear, loss. (A
// bias right before a batch norm would have a zero gradient: the norm removes it.)
const char* kVisionGraph = R"({
  "type": "graph", "name": "vision-ops",
  "inputs": [{"name": "images", "shape": [3, 9, 8], "dtype": "f32"},
             {"name": "labels", "shape": [], "dtype": "i64"}],
  "params": [{"name": "c1.w", "shape": [6, 3, 3, 3], "init": {"type": "normal", "std": 0.3}},
             {"name": "c3.b", "shape": [4], "init": {"type": "zeros"}},
             {"name": "bn.w", "shape": [6], "init": {"type": "ones"}},
             {"name": "bn.b", "shape": [6], "init": {"type": "zeros"}},
             {"name": "bn.rm", "shape": [6], "init": {"type": "zeros"}, "trainable": false},
             {"name": "bn.rv", "shape": [6], "init": {"type": "ones"}, "trainable": false},
             {"name": "c2.w", "shape": [4, 3, 3, 3], "init": {"type": "normal", "std": 0.3}},
             {"name": "c3.w", "shape": [4, 6, 1, 1], "init": {"type": "normal", "std": 0.3}},
             {"name": "fc.w", "shape": [5, 4], "init": {"type": "normal", "std": 0.3}},
             {"name": "fc.b", "shape": [5], "init": {"type": "zeros"}}],
  "layers": [
    {"name": "a", "nodes": [
      {"name": "c1", "op": "conv2d", "inputs": ["images"], "outputs": ["h1"],
       "params": {"weight": "c1.w"},
       "attrs": {"stride": [2, 1], "padding": 1, "dilation": [1, 2]}},
      {"name": "bn", "op": "batchnorm2d", "inputs": ["h1"], "outputs": ["n1"],
       "params": {"weight": "bn.w", "bias": "bn.b", "running_mean": "bn.rm", "running_var": "bn.rv"}},
      {"name": "r1", "op": "relu", "inputs": ["n1"], "outputs": ["a1"]},
      {"name": "mp", "op": "maxpool2d", "inputs": ["a1"], "outputs": ["p1"],
       "attrs": {"kernel": 3, "stride": 2, "padding": 1}}]},
    {"name": "b", "nodes": [
      {"name": "c2", "op": "conv2d", "inputs": ["p1"], "outputs": ["h2"],
       "params": {"weight": "c2.w"}, "attrs": {"padding": 1, "groups": 2}},
      {"name": "c3", "op": "conv2d", "inputs": ["p1"], "outputs": ["h3"],
       "params": {"weight": "c3.w", "bias": "c3.b"}},
      {"name": "sum", "op": "add", "inputs": ["h2", "h3"], "outputs": ["s"]},
      {"name": "ap", "op": "avgpool2d", "inputs": ["s"], "outputs": ["q"],
       "attrs": {"kernel": 3, "stride": 1, "padding": 1, "count_include_pad": false}},
      {"name": "gap", "op": "global_avgpool", "inputs": ["q"], "outputs": ["v"]},
      {"name": "fc", "op": "linear", "inputs": ["v"], "outputs": ["logits"],
       "params": {"weight": "fc.w", "bias": "fc.b"}},
      {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "labels"], "outputs": ["loss"]}]}
  ],
  "loss": "loss"})";

TEST(VisionGraph, ShapesAreInferred) {
  auto g = load_f64(nlohmann::json::parse(kVisionGraph), "vision.json");
  EXPECT_EQ(g->value("h1").type.shape, (Shape{6, 5, 6}));
  EXPECT_EQ(g->value("p1").type.shape, (Shape{6, 3, 3}));
  EXPECT_EQ(g->value("h2").type.shape, (Shape{4, 3, 3}));
  EXPECT_EQ(g->value("v").type.shape, (Shape{4}));
  EXPECT_FALSE(g->params[size_t(g->find_param("bn.rm"))].trainable);
  EXPECT_FALSE(g->params[size_t(g->find_param("bn.rm"))].weight_decay);
}

TEST(VisionGradCheck, GeneralGraphF64) {
  auto g = load_f64(nlohmann::json::parse(kVisionGraph), "vision.json");
  TensorMap in{{"images", random_like({3, 3, 9, 8}, DType::f64, 1.0, 21)},
               {"labels", Tensor::from_vector(std::vector<int64_t>{0, 4, 2}, {3})}};
  check_model(g, in, 3, 21, 14);
}

nlohmann::json tiny_resnet(const std::string& block, std::vector<int64_t> widths) {
  return {{"type", "resnet"},
          {"in_channels", 2},
          {"image_size", {6, 5}},
          {"classes", 3},
          {"stem_channels", 4},
          {"stem_kernel", 3},
          {"stem_stride", 1},
          {"stem_pool", true},
          {"block", block},
          {"widths", widths},
          {"depths", std::vector<int64_t>(widths.size(), 1)}};
}

TEST(VisionGradCheck, ResnetBasicF64) {
  auto g = load_f64(tiny_resnet("basic", {4, 6}), "resnet.json");
  // Stem 4 channels; layer1.0 keeps them (no downsample); layer2.0 strides and widens.
  EXPECT_GE(g->find_param("layer2.0.downsample.0.weight"), 0);
  EXPECT_LT(g->find_param("layer1.0.downsample.0.weight"), 0);
  EXPECT_EQ(g->value("layer2.0.relu").type.shape, (Shape{6, 2, 2}));
  TensorMap in{{"images", random_like({2, 2, 6, 5}, DType::f64, 1.0, 22)},
               {"labels", labels({2, 0})}};
  check_model(g, in, 2, 22, 5);
}

TEST(VisionGradCheck, ResnetBottleneckF64) {
  auto g = load_f64(tiny_resnet("bottleneck", {2}), "resnet.json");
  EXPECT_EQ(g->value("layer1.0.relu").type.shape, (Shape{8, 3, 3}));  // expansion 4
  EXPECT_GE(g->find_param("layer1.0.conv3.weight"), 0);
  TensorMap in{{"images", random_like({2, 2, 6, 5}, DType::f64, 1.0, 23)},
               {"labels", labels({1, 2})}};
  check_model(g, in, 2, 23, 5);
}

// One batch norm in its own layer, so a Stage of that layer returns its output.
const char* kBnGraph = R"({
  "type": "graph",
  "inputs": [{"name": "images", "shape": [2, 3, 3], "dtype": "f32"},
             {"name": "labels", "shape": [], "dtype": "i32"}],
  "params": [{"name": "bn.weight", "shape": [2], "init": {"type": "ones"}},
             {"name": "bn.bias", "shape": [2], "init": {"type": "zeros"}},
             {"name": "bn.running_mean", "shape": [2], "init": {"type": "zeros"}, "trainable": false},
             {"name": "bn.running_var", "shape": [2], "init": {"type": "ones"}, "trainable": false},
             {"name": "fc.weight", "shape": [3, 2], "init": {"type": "normal", "std": 0.5}}],
  "layers": [
    {"name": "norm", "nodes": [
      {"name": "bn", "op": "batchnorm2d", "inputs": ["images"], "outputs": ["y"],
       "params": {"weight": "bn.weight", "bias": "bn.bias",
                  "running_mean": "bn.running_mean", "running_var": "bn.running_var"},
       "attrs": {"momentum": 0.25}}]},
    {"name": "head", "nodes": [
      {"name": "gap", "op": "global_avgpool", "inputs": ["y"], "outputs": ["v"]},
      {"name": "fc", "op": "linear", "inputs": ["v"], "outputs": ["logits"], "params": {"weight": "fc.weight"}},
      {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "labels"], "outputs": ["loss"]}]}
  ],
  "loss": "loss"})";

// Per channel mean and unbiased variance of [N, C, H, W] images.
std::pair<std::vector<double>, std::vector<double>> channel_stats(const Tensor& x) {
  std::vector<double> v = x.to_vector<double>(), mean(2, 0), var(2, 0);
  const int64_t n = x.size(0), plane = 9;
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < plane; ++k) mean[size_t(c)] += v[size_t((i * 2 + c) * plane + k)];
    mean[size_t(c)] /= double(n * plane);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < plane; ++k)
        var[size_t(c)] += std::pow(v[size_t((i * 2 + c) * plane + k)] - mean[size_t(c)], 2);
    var[size_t(c)] /= double(n * plane - 1);
  }
  return {mean, var};
}

// One value per channel (one sample of a 1 x 1 map) has variance 0: refused while
// training, naming the node in its file (PyTorch refuses it too); evaluation with running
// statistics and two samples are fine.
TEST(BatchNormStage, OneValuePerChannelIsRefusedInTraining) {
  nlohmann::json j = nlohmann::json::parse(kBnGraph);
  j["inputs"][0]["shape"] = {2, 1, 1};
  auto g = load_f64(j, "bn.json");
  Stage st(g, 0, g->num_layers());
  auto run = [&](int64_t n, bool training) {
    Tensor x = random_like({n, 2, 1, 1}, DType::f64, 1.0, 5);
    TensorMap in{{"images", x}, {"labels", labels(std::vector<int32_t>(size_t(n), 1))}};
    MicroBatch mb{0, 0, n, n, double(n), 0};
    st.forward(mb, in, training);
    st.discard(0);
  };
  try {
    run(1, true);
    FAIL() << "a batch norm over one value per channel trained";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "bn.json: $.layers[0].nodes[0]: node 'bn' (batchnorm2d) normalises 1 value "
                  "per channel"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(run(1, false));
  EXPECT_NO_THROW(run(2, true));
}

TEST(BatchNormStage, RunningStatisticsRecomputeEvalAndCheckpoint) {
  auto g = load_f64(nlohmann::json::parse(kBnGraph), "bn.json");
  Tensor x = random_like({4, 2, 3, 3}, DType::f64, 2.0, 31);
  kernels::add_inplace(x, Tensor::full({4, 2, 3, 3}, 0.5, DType::f64));
  TensorMap in{{"images", x}, {"labels", labels({0, 1, 2, 1})}};
  const auto [mu, var] = channel_stats(x);
  MicroBatch mb{0, 0, 4, 4, 4.0, 0};
  const int rm = g->find_param("bn.running_mean"), rv = g->find_param("bn.running_var");

  // One training step, once plainly and once with the batch norm's layer recomputed: the
  // running statistics move once (momentum 0.25) and the optimizer (AdamW with weight
  // decay) leaves them alone.
  std::vector<std::vector<double>> means;
  for (bool recompute : {false, true}) {
    StageOptions so;
    if (recompute) so.recompute_layers = {0};
    Stage st(g, 0, g->num_layers(), so);
    OptimizerConfig oc;
    oc.adamw.weight_decay = 0.1;
    st.set_optimizer(oc);
    st.zero_grad();
    st.forward(mb, in);
    st.backward(0);
    st.step();
    std::vector<double> m = st.param(rm).to_vector<double>(), v = st.param(rv).to_vector<double>();
    for (size_t c = 0; c < 2; ++c) {
      EXPECT_NEAR(m[c], 0.25 * mu[c], 1e-12) << "recompute " << recompute;
      EXPECT_NEAR(v[c], 0.75 + 0.25 * var[c], 1e-12) << "recompute " << recompute;
    }
    means.push_back(m);
  }

  // Evaluation normalises with the running statistics; training with the batch's.
  Stage norm(g, 0, 1);
  norm.zero_grad();
  norm.forward(mb, in);  // moves the running statistics once
  norm.discard(0);
  const std::vector<double> m = norm.param(rm).to_vector<double>(),
                            v = norm.param(rv).to_vector<double>();
  Tensor y_eval = norm.forward(mb, in, false).at("y");
  EXPECT_EQ(norm.param(rm).to_vector<double>(), m) << "evaluation moved the running mean";
  std::vector<double> xs = x.to_vector<double>(), ye = y_eval.to_vector<double>();
  for (size_t i : {size_t(0), size_t(13), size_t(70)}) {
    const size_t c = (i / 9) % 2;
    EXPECT_NEAR(ye[i], (xs[i] - m[c]) / std::sqrt(v[c] + 1e-5), 1e-12);
  }

  // Checkpoints carry the running statistics.
  const std::string root = ::testing::TempDir() + "/vision_bn_ckpt";
  std::filesystem::remove_all(root);
  Manifest man;
  man.step = 1;
  man.model = g->config;
  const std::string dir = save_checkpoint(root, norm, man);
  Stage back(g, 0, 1, StageOptions{memory::Device::cpu(), 5});
  EXPECT_NE(back.param(rm).to_vector<double>(), m);
  load_stage(dir, read_manifest(dir), back, false);
  EXPECT_EQ(back.param(rm).to_vector<double>(), m);
  EXPECT_EQ(back.param(rv).to_vector<double>(), v);
  std::filesystem::remove_all(root);
}

// ---- errors ----

std::string error_of(const nlohmann::json& m) {
  try {
    load_model_json(m, "m.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void vision_expect_error(const nlohmann::json& m, std::initializer_list<std::string> parts) {
  const std::string msg = error_of(m);
  ASSERT_FALSE(msg.empty()) << "loaded: " << m.dump();
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  lacks: " << p;
}

TEST(VisionGraph, Errors) {
  auto base = nlohmann::json::parse(kVisionGraph);
  {
    auto m = base;
    m["params"][6]["shape"] = {4, 6, 3, 3};  // c2 with groups 2 needs 3 input channels
    vision_expect_error(m, {"m.json", "$.layers[1].nodes[0].params.weight", "C / groups = 3",
                            "one of shape [4, 6, 3, 3]"});
  }
  {
    auto m = base;
    m["layers"][1]["nodes"][0]["attrs"]["groups"] = 4;
    vision_expect_error(m,
                        {"$.layers[1].nodes[0].attrs.groups", "a divisor of the input channels 6"});
  }
  {
    auto m = base;
    m["layers"][0]["nodes"][3]["attrs"].erase("kernel");
    vision_expect_error(m, {"$.layers[0].nodes[3].attrs", "\"kernel\""});
  }
  {
    auto m = base;
    m["layers"][0]["nodes"][0]["attrs"]["dilation"] = 5;
    vision_expect_error(m, {"$.layers[0].nodes[0].inputs[0]", "fits in", "f32[batch, 3, 9, 8]"});
  }
  {
    auto m = base;
    m["layers"][0]["nodes"][0]["attrs"]["stride"] = {1, 2, 3};
    vision_expect_error(m, {"$.layers[0].nodes[0].attrs.stride", "[h, w]"});
  }
  {
    auto m = base;
    m["params"][2]["shape"] = {5};
    vision_expect_error(m, {"$.layers[0].nodes[1].params.weight", "shape [6]"});
  }
  vision_expect_error(tiny_resnet("wide", {4}), {"$.block", "\"basic\" or \"bottleneck\""});
  auto strides = tiny_resnet("basic", {4, 8});
  strides["strides"] = {1, 2, 2};
  vision_expect_error(strides, {"$.strides", "one stride per width (2)", "3 stride(s)"});
  auto uneven = tiny_resnet("basic", {4, 8});
  uneven["depths"] = {1};
  vision_expect_error(uneven, {"$.depths", "one depth per width (2)"});
}

// ---- image data ----

std::string digits_dir() {
  return std::string(BATON_SOURCE_DIR) + "/examples/data/digits";
}

TEST(ImageData, DigitsAsNumpyWroteThem) {
  // The committed fixture (numpy.save's files): 1797 images of 8x8, ten classes.
  ImageDataset d(digits_dir());
  EXPECT_EQ(d.size(), 1797);
  EXPECT_EQ(d.image_shape(), (Shape{1, 8, 8}));
  EXPECT_EQ(d.classes(), 10);
  NpyArray raw = read_npy(digits_dir() + "/images.npy");
  EXPECT_EQ(raw.descr, "|u1");
  EXPECT_EQ(raw.shape, (Shape{1797, 1, 8, 8}));
  // sklearn's first digit is a 0 whose second row starts 0, 0, 13 (times 15 in the file).
  EXPECT_EQ(static_cast<unsigned char>(raw.bytes[8 + 2]), 13 * 15);
  Tensor im = Tensor::empty({3, 1, 8, 8}, DType::f32), lb = Tensor::empty({3}, DType::i32);
  d.fill(7, 4, 0, 3, im, lb);
  // Deterministic in (seed, step, index), whatever the split of the batch.
  Tensor im2 = Tensor::empty({2, 1, 8, 8}, DType::f32), lb2 = Tensor::empty({2}, DType::i32);
  d.fill(7, 4, 1, 2, im2, lb2);
  EXPECT_EQ(im.narrow(0, 1, 2).clone().to_vector<float>(), im2.to_vector<float>());
  EXPECT_EQ(lb.to_vector<int32_t>()[2], lb2.to_vector<int32_t>()[1]);
  const int64_t k = d.sample_index(7, 4, 2);
  EXPECT_NE(k, d.sample_index(7, 5, 2));
  EXPECT_NEAR(im.to_vector<float>()[2 * 64 + 10],
              double(static_cast<unsigned char>(raw.bytes[size_t(k * 64 + 10)])) / 255.0, 1e-7);
}

TEST(ImageData, RoundTripAndErrors) {
  const std::string dir = ::testing::TempDir() + "/vision_npy";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Tensor images = random_like({5, 2, 3, 4}, DType::f32, 1.0, 41);
  write_npy(dir + "/images.npy", images);
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 1, 2}, {5}));
  EXPECT_TRUE(is_image_dataset(dir));
  EXPECT_FALSE(is_image_dataset(dir + "/images.npy"));
  ImageDataset d(dir);
  EXPECT_EQ(d.classes(), 4);
  EXPECT_EQ(d.image_shape(), (Shape{2, 3, 4}));
  Tensor im = Tensor::empty({1, 2, 3, 4}, DType::f64), lb = Tensor::empty({1}, DType::i64);
  d.fill(1, 0, 0, 1, im, lb);
  const int64_t k = d.sample_index(1, 0, 0);
  EXPECT_EQ(im.to(DType::f32).to_vector<float>(),
            images.narrow(0, k, 1).clone().to_vector<float>());
  // A spatial tile's rows alone, and the labels alone (what a rank reads, no more).
  Tensor rows = Tensor::empty({2, 2, 2, 4}, DType::f32), labels = Tensor::empty({2}, DType::i32);
  d.fill_images(1, 3, 4, 2, rows, 1);
  d.fill_labels(1, 3, 4, 2, labels);
  Tensor whole = Tensor::empty({2, 2, 3, 4}, DType::f32),
         whole_labels = Tensor::empty({2}, DType::i32);
  d.fill(1, 3, 4, 2, whole, whole_labels);
  EXPECT_EQ(rows.to_vector<float>(), whole.narrow(2, 1, 2).contiguous().to_vector<float>());
  EXPECT_EQ(labels.to_vector<int32_t>(), whole_labels.to_vector<int32_t>());

  auto error_of_dir = [&] {
    try {
      ImageDataset bad(dir);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3}));
  EXPECT_NE(error_of_dir().find("labels.npy: expected labels of shape [5]"), std::string::npos)
      << error_of_dir();
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 1, -2, 0, 1}, {5}));
  EXPECT_NE(error_of_dir().find("is negative"), std::string::npos) << error_of_dir();
  write_npy(dir + "/labels.npy",
            Tensor::from_vector(std::vector<int64_t>{0, 1, int64_t(1) << 40, 0, 1}, {5}));
  EXPECT_NE(error_of_dir().find("labels[2] is 1099511627776, beyond any class id"),
            std::string::npos)
      << error_of_dir();
  // Labels are named and compared exactly as the file holds them, not rounded through a
  // double: 2^53 + 1 as int64, and 2^64 - 1 and 2^63 + 5 as uint64 (numpy's '<u8', retyped
  // from an int64 file since write_npy has no u64).
  auto write_labels = [&](uint64_t label, bool is_unsigned) {
    write_npy(dir + "/labels.npy",
              Tensor::from_vector(std::vector<int64_t>{0, 1, int64_t(label), 0, 1}, {5}));
    if (!is_unsigned) return;
    std::string bytes = memory::read_file(dir + "/labels.npy");
    const size_t at = bytes.find("<i8");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 1] = 'u';
    std::ofstream(dir + "/labels.npy", std::ios::binary) << bytes;
  };
  for (auto [label, is_unsigned, text] :
       {std::tuple{(uint64_t(1) << 53) + 1, false, "9007199254740993"},
        std::tuple{~uint64_t(0), true, "18446744073709551615"},
        std::tuple{(uint64_t(1) << 63) + 5, true, "9223372036854775813"},
        std::tuple{(uint64_t(1) << 53) + 1, true, "9007199254740993"},
        std::tuple{uint64_t(2147483648), true, "2147483648"}}) {
    write_labels(label, is_unsigned);
    EXPECT_NE(error_of_dir().find("labels[2] is " + std::string(text) + ", beyond any class id"),
              std::string::npos)
        << error_of_dir();
  }
  write_labels(2147483647, true);  // the largest class id is read
  EXPECT_EQ(ImageDataset(dir).classes(), int64_t(2147483648));
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 1, 2}, {5}));
  // Half-precision images (numpy's float16) and NaN pixels are refused, naming the file.
  {  // numpy's '<f2' (write_npy has no f16): the f32 file's header retyped, half the bytes
    write_npy(dir + "/images.npy", images);
    std::string bytes = memory::read_file(dir + "/images.npy");
    const size_t at = bytes.find("<f4"), data = bytes.size() - size_t(images.nbytes());
    ASSERT_NE(at, std::string::npos);
    bytes[at + 2] = '2';
    std::ofstream(dir + "/images.npy", std::ios::binary)
        << bytes.substr(0, data + size_t(images.nbytes()) / 2);
  }
  EXPECT_NE(error_of_dir().find("images.npy: expected float32, float64 or uint8 images, found "
                                "dtype '<f2'"),
            std::string::npos)
      << error_of_dir();
  // An object array is no byte-order question; a big-endian one is.
  for (auto [descr, said] : {std::pair{"|O4",
                                       "expected a numeric array (float, int, uint), found "
                                       "dtype '|O4'"},
                             std::pair{">f4", "expected a little-endian array"}}) {
    write_npy(dir + "/images.npy", images);
    std::string bytes = memory::read_file(dir + "/images.npy");
    const size_t at = bytes.find("<f4");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 3, descr);
    std::ofstream(dir + "/images.npy", std::ios::binary) << bytes;
    EXPECT_NE(error_of_dir().find(said), std::string::npos) << error_of_dir();
  }
  {
    Tensor with_nan = images.clone();
    with_nan.data<float>()[2 * 24 + 5] = std::numeric_limits<float>::quiet_NaN();
    write_npy(dir + "/images.npy", with_nan);
  }
  EXPECT_NE(error_of_dir().find("images.npy: image 2 holds nan at element 5"), std::string::npos)
      << error_of_dir();
  {  // a float64 beyond float32's range: said so, the value in %g (not 39 digits)
    Tensor big = images.to(DType::f64);
    big.data<double>()[1 * 24 + 7] = 1e39;
    write_npy(dir + "/images.npy", big);
  }
  EXPECT_NE(error_of_dir().find("images.npy: image 1 holds 1e+39 at element 7, outside float32's "
                                "range"),
            std::string::npos)
      << error_of_dir();
  write_npy(dir + "/images.npy", images);
  {
    std::string bytes = memory::read_file(dir + "/images.npy");
    std::ofstream(dir + "/images.npy", std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  }
  EXPECT_NE(error_of_dir().find("images.npy: expected 480 bytes of data"), std::string::npos)
      << error_of_dir();
  std::ofstream(dir + "/images.npy", std::ios::binary) << "not numpy";
  EXPECT_NE(error_of_dir().find("not a NumPy .npy file"), std::string::npos) << error_of_dir();

  // A model whose input does not match the data.
  write_npy(dir + "/images.npy", images);
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 1, 2}, {5}));
  auto g = load_f64(tiny_resnet("basic", {4}), "resnet.json");
  try {
    ImageDataset(dir).check_model(*g, "resnet.json");
    FAIL() << "a [2, 6, 5] model took [2, 3, 4] images";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("resnet.json: $.inputs[0]: expected images of type "
                                         "f64[batch, 2, 3, 4]"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("(of the resnet shorthand"), std::string::npos)
        << e.what();
  }
  // Channels-last images for a model reading [C, H, W]: said so (the shorthand's remark
  // had come for any model, and no word of the layout).
  write_npy(dir + "/images.npy", Tensor::zeros({5, 3, 4, 2}, DType::f32));
  nlohmann::json chw = tiny_resnet("basic", {4});
  chw["in_channels"] = 2;
  chw["image_size"] = {3, 4};
  try {
    ImageDataset(dir).check_model(*load_f64(chw, "resnet.json"), "resnet.json");
    FAIL() << "[3, 4, 2] images taken for [2, 3, 4]";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the images look channels-last [N, H, W, C]: baton "
                                         "reads [N, C, H, W]"),
              std::string::npos)
        << e.what();
  }
  write_npy(dir + "/images.npy", images);
  // A model of 3 classes for data of 4: the node is named, and the model file once.
  nlohmann::json fits = tiny_resnet("basic", {4});
  fits["image_size"] = {3, 4};
  try {
    ImageDataset(dir).check_model(*load_f64(fits, "resnet.json"), "resnet.json");
    FAIL() << "3 logits took labels of 4 classes";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("resnet.json (expanded resnet shorthand): $.layers[", 0), 0) << what;
    EXPECT_EQ(what.find("resnet.json", 1), std::string::npos) << what;
    EXPECT_NE(what.find("has 4 classes, the logits 3"), std::string::npos) << what;
    EXPECT_NE(what.find("/labels.npy: label 1 is 3, expected below 3)"), std::string::npos) << what;
  }
  std::filesystem::remove_all(dir);
}

// A shape beyond int64, or whose byte count overflows it, is refused naming the file and
// the shape: a dimension of 20 digits had been "stoll" (exit 1), and (2^61, 8, 1, 1)
// bytes had wrapped to 0, passed the size check and failed allocating (exit 1).
TEST(ImageData, ShapesBeyondInt64AreRefused) {
  const std::string path = ::testing::TempDir() + "/vision_npy_shape.npy";
  auto error_of = [&](const std::string& descr, const std::string& shape) {
    std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    h.append((64 - (h.size() + 11) % 64) % 64, ' ');
    h += '\n';
    std::ofstream(path, std::ios::binary)
        << std::string("\x93NUMPY\x01\x00", 8) << char(h.size() & 0xff) << char(h.size() >> 8) << h;
    try {
      read_npy(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = error_of("|u1", "(99999999999999999999, 1, 8, 8)");
  EXPECT_NE(e.find(path + ": dimension 99999999999999999999 of shape"), std::string::npos) << e;
  e = error_of("|u1", "(2305843009213693952, 8, 1, 1)");
  EXPECT_NE(e.find(path + ": shape [2305843009213693952, 8, 1, 1] of '|u1' holds more than 2^63"),
            std::string::npos)
      << e;
  e = error_of("<i8", "(2305843009213693952,)");  // the elements fit, their bytes do not
  EXPECT_NE(e.find("holds more than 2^63 bytes"), std::string::npos) << e;
  std::filesystem::remove(path);
}

// The header dict is read as numpy reads it: the keys descr, fortran_order and shape,
// each once. A repeated 'shape' had been taken at its first (40 images where numpy, taking
// the last, reads 20), and a key numpy refuses had been ignored.
TEST(ImageData, NpyHeaderKeysAreExactlyNumpys) {
  const std::string path = ::testing::TempDir() + "/vision_npy_keys.npy";
  auto error_of = [&](const std::string& dict) {
    std::string h = dict;
    h.append((64 - (h.size() + 11) % 64) % 64, ' ');
    h += '\n';
    std::ofstream(path, std::ios::binary)
        << std::string("\x93NUMPY\x01\x00", 8) << char(h.size() & 0xff) << char(h.size() >> 8) << h
        << std::string(40 * 4, '\0');
    try {
      read_npy(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // What numpy writes, and its other spellings (no trailing comma, double quotes, blanks).
  EXPECT_EQ(error_of("{'descr': '|u1', 'fortran_order': False, 'shape': (40, 4), }"), "");
  EXPECT_EQ(error_of("{\"shape\":(160,),\"descr\":\"|u1\",\"fortran_order\":False}"), "");
  EXPECT_EQ(error_of("{'descr': '<u4', 'fortran_order': False, 'shape': ( 2 , 4 , 5 ) }"), "");
  std::string e =
      error_of("{'descr': '|u1', 'fortran_order': False, 'shape': (40, 4), 'shape': (20, 4), }");
  EXPECT_NE(e.find(path + ": the .npy header has 'shape' twice"), std::string::npos) << e;
  e = error_of("{'descr': '|u1', 'fortran_order': False, 'shape': (40, 4), 'foo': 1, }");
  EXPECT_NE(e.find(path + ": the .npy header has key 'foo', expected only 'descr', "
                          "'fortran_order' and 'shape'"),
            std::string::npos)
      << e;
  e = error_of("{'descr': '|u1', 'shape': (40, 4), }");
  EXPECT_NE(e.find(path + ": the .npy header has no 'fortran_order'"), std::string::npos) << e;
  e = error_of("{'descr': '|u1', 'fortran_order': True, 'shape': (40, 4), }");
  EXPECT_NE(e.find("expected a C-order array"), std::string::npos) << e;
  e = error_of("{'descr': '|u1', 'fortran_order': False, 'shape': (160), }");  // 160, no tuple
  EXPECT_NE(e.find(path + ": malformed shape in the .npy header"), std::string::npos) << e;
  e = error_of("{'descr': '|u1', 'fortran_order': False, 'shape': (40, 4), } x");
  EXPECT_NE(e.find(path + ": malformed .npy header"), std::string::npos) << e;
  e = error_of("{'descr': [('a', '<u4')], 'fortran_order': False, 'shape': (40,), }");
  EXPECT_NE(e.find(path + ": expected a simple dtype string"), std::string::npos) << e;
  std::filesystem::remove(path);
}

// An images.npy or labels.npy that is a FIFO is refused at once (data inspect and train
// had waited for ever for a writer).
TEST(ImageData, AFifoIsRefused) {
  const std::string dir = ::testing::TempDir() + "/vision_npy_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_npy(dir + "/labels.npy", Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}));
  const std::string fifo = dir + "/images.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(is_image_dataset(dir));
  EXPECT_EQ(testing_support::input_error_reading_fifo(fifo, [&] { ImageDataset d(dir); }),
            fifo + ": cannot open file (not a regular file: a FIFO)");
  std::filesystem::remove_all(dir);
}

// `baton train`'s loop on the digits with the example model: the loss falls.
TEST(ImageData, ResnetTinyLearnsDigits) {
  engine::TrainOptions o;
  o.model_path = std::string(BATON_SOURCE_DIR) + "/examples/models/resnet-tiny.json";
  o.data_path = digits_dir();
  o.steps = 30;
  o.batch = 32;
  o.micro_batches = 2;
  o.optimizer.adamw.lr = 0.01;
  o.log_every = 0;
  engine::TrainSummary s = engine::run_training(o);
  ASSERT_EQ(s.records.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += s.records[size_t(i)].loss / 5;
    last += s.records[size_t(25 + i)].loss / 5;
  }
  EXPECT_GT(first, 1.9);         // about ln 10 at the start
  EXPECT_LT(last, 0.6 * first);  // and well below after 30 steps
}

}  // namespace
}  // namespace baton::stages
