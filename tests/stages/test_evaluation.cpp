// One-process evaluation: the same batches every time (a pure function of the seed), the
// parameters untouched, micro-batching not changing the mean, and equal to the mean of
// hand-made forwards over the same samples.
#include <gtest/gtest.h>

#include "stages/data.h"
#include "stages/evaluation.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

TEST(Evaluation, SameBatchesEveryTimeAndSplitIndependent) {
  auto g =
      testing::tiny_gpt(DType::f64, 2, 2, 8, 5, 11, /*pdrop=*/0.1);  // dropout is off in evaluation
  Stage stage(g, 0, g->num_layers(), StageOptions{});
  std::string text;
  for (int i = 0; i < 400; ++i) text.push_back(char(i * 7 % 11));
  ByteDataset data(text, "eleven.txt", 5);
  EvalSpec e;
  e.batches = 3;
  e.batch = 4;
  e.seed = 9;
  const double a = evaluate_loss(stage, data, e);
  EXPECT_EQ(a, evaluate_loss(stage, data, e));  // bit for bit: same samples, nothing kept
  EXPECT_EQ(stage.stashed(), 0u);
  e.micro_batches = 4;
  EXPECT_NEAR(evaluate_loss(stage, data, e), a, 1e-12);

  // By hand: each batch's mean over its 4 x 5 targets, then the mean over the 3 batches.
  double sum = 0;
  for (int64_t k = 0; k < 3; ++k) {
    Tensor tok = Tensor::empty({4, 5}, DType::i32), tgt = Tensor::empty({4, 5}, DType::i32);
    data.fill(evaluation_seed(9), k, 0, 4, tok, tgt);
    MicroBatch mb{0, 0, 4, 4, 20.0, k};
    sum +=
        testing::value_of(stage.forward(mb, {{"tokens", tok}, {"targets", tgt}}, false).at("loss"));
  }
  EXPECT_NEAR(a, sum / 3, 1e-14);
  e.seed = 10;  // another run's seed: other samples
  EXPECT_NE(evaluate_loss(stage, data, e), a);
}

}  // namespace
}  // namespace baton::stages
