// The `"type": "resnet"` shorthand: a residual network for image classification (He et
// al., 2015, as torchvision builds it) with a configurable stem, stages of basic or
// bottleneck blocks, widths, strides, classes and input size. It expands to the general
// graph with torchvision's parameter names (conv1.weight, bn1.running_mean,
// layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.weight, ...). Inputs: "images"
// [C, H, W] (floating) and "labels" [] (i32 class indices); the loss is the mean
// cross-entropy over the global batch.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/json_reader.h"

namespace baton::stages {

struct ResnetConfig {
  std::string name = "resnet";
  int64_t in_channels = 3;
  int64_t height = 0, width = 0;  // the input image
  int64_t classes = 0;
  int64_t stem_channels = 64, stem_kernel = 7, stem_stride = 2;
  bool stem_pool = true;         // 3x3 max pooling with stride 2 after the stem
  std::string block = "basic";   // or "bottleneck" (1x1, 3x3, 1x1 with expansion 4)
  std::vector<int64_t> widths;   // per stage: the block width (bottleneck: before expansion)
  std::vector<int64_t> depths;   // per stage: blocks
  std::vector<int64_t> strides;  // per stage: the first block's stride (default 1, then 2)
  double bn_eps = 1e-5, bn_momentum = 0.1;
  int64_t expansion() const { return block == "bottleneck" ? 4 : 1; }
};

// Unknown fields are errors. Every convolution pads k / 2, so a stride s maps a size n to
// ceil(n / s) and any image size fits.
ResnetConfig parse_resnet_shorthand(const JsonReader& r);
nlohmann::json resnet_graph_json(const ResnetConfig& c);

}  // namespace baton::stages
