// Convolutional networks under a plan: a tiny ResNet on the digits images, tensor
// parallelism (convolutions split by channels) alone and with pipeline stages, 20 steps
// within 1e-5 of the one-process trainer (same global batch and micro-batches, so batch
// norm sees the same samples).
#include <gtest/gtest.h>

#include <cmath>

#include "engine_harness.h"

namespace baton::engine_testing {
namespace {

json tiny_resnet() {
  return {{"type", "resnet"},   {"in_channels", 1}, {"image_size", 8},  {"classes", 10},
          {"stem_channels", 4}, {"stem_kernel", 3}, {"stem_stride", 1}, {"stem_pool", false},
          {"widths", {4, 8}},   {"depths", {1, 1}}, {"strides", {1, 2}}};
}

void run_case(const PlanSpec& p) {
  SCOPED_TRACE(p.describe());
  Workspace ws("conv");
  RunSettings s;
  s.data = std::string(BATON_SOURCE_DIR) + "/examples/data/digits";
  auto plan = resolve(p, ws);
  std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 20u);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
        << "step " << i + 1;
  }
}

TEST(ConvPlans, TensorParallel2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2};
  run_case(p);
}

TEST(ConvPlans, Pipeline2TensorParallel2) {
  PlanSpec p;
  p.model = tiny_resnet();
  p.tp = {2, 2};  // stem, layer1.0 | layer2.0, head
  run_case(p);
}

}  // namespace
}  // namespace baton::engine_testing
