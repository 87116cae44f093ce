// Learning-rate schedules against the formulas at every step of a run.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "memory/error.h"
#include "stages/lr_schedule.h"

namespace baton::stages {
namespace {

constexpr double kPi = std::numbers::pi;

LrSchedule make(LrSchedule::Kind k, int64_t total, int64_t warmup, int64_t decay = 0,
                double min_lr = 1e-5) {
  LrSchedule s;
  s.kind = k;
  s.lr = 3e-3;
  s.min_lr = min_lr;
  s.warmup = warmup;
  s.decay = decay;
  s.total = total;
  s.validate();
  return s;
}

TEST(LrSchedule, WarmupThenCosine) {
  const double lr = 3e-3, mn = 1e-5;
  for (int64_t W : {0, 1, 10}) {
    LrSchedule s = make(LrSchedule::Kind::cosine, 100, W);
    const double D = double(100 - W);
    for (int64_t t = 1; t <= 100; ++t) {
      double want = t <= W ? lr * double(t) / double(W)
                           : mn + (lr - mn) * (1 + std::cos(kPi * double(t - W) / D)) / 2;
      EXPECT_NEAR(s.at(t), want, 1e-18) << "W " << W << " step " << t;
    }
    EXPECT_NEAR(s.at(100), mn, 1e-18);
  }
  // An explicit D shorter than the run: min after it.
  LrSchedule s = make(LrSchedule::Kind::cosine, 100, 10, 50);
  for (int64_t t = 11; t <= 60; ++t)
    EXPECT_NEAR(s.at(t), mn + (lr - mn) * (1 + std::cos(kPi * double(t - 10) / 50)) / 2, 1e-18)
        << t;
  for (int64_t t = 61; t <= 100; ++t) EXPECT_NEAR(s.at(t), mn, 1e-18) << t;
}

TEST(LrSchedule, WarmupThenLinear) {
  const double lr = 3e-3, mn = 1e-5;
  LrSchedule s = make(LrSchedule::Kind::linear, 80, 8);
  for (int64_t t = 1; t <= 80; ++t) {
    double want = t <= 8 ? lr * double(t) / 8 : mn + (lr - mn) * (1 - double(t - 8) / 72);
    EXPECT_NEAR(s.at(t), want, 1e-18) << t;
  }
}

TEST(LrSchedule, ConstantWithWarmup) {
  LrSchedule s = make(LrSchedule::Kind::constant, 30, 5);
  for (int64_t t = 1; t <= 30; ++t)
    EXPECT_DOUBLE_EQ(s.at(t), t <= 5 ? 3e-3 * double(t) / 5 : 3e-3) << t;
}

TEST(LrSchedule, WarmupStableDecay) {
  const double lr = 3e-3, mn = 1e-5;
  LrSchedule s = make(LrSchedule::Kind::wsd, 100, 10);
  s.decay_fraction = 0.2;  // the last 20 steps decay
  s.validate();
  EXPECT_EQ(s.decay_steps(), 20);
  for (int64_t t = 1; t <= 100; ++t) {
    double want = t <= 10   ? lr * double(t) / 10
                  : t <= 80 ? lr
                            : mn + (lr - mn) * (1 - double(t - 80) / 20);
    EXPECT_NEAR(s.at(t), want, 1e-18) << t;
  }
  EXPECT_NEAR(s.at(100), mn, 1e-18);
}

TEST(LrSchedule, BadFlags) {
  LrSchedule s;
  s.total = 10;
  s.min_lr = 1;  // above lr
  EXPECT_THROW(s.validate(), InputError);
  s.min_lr = 0;
  s.kind = LrSchedule::Kind::wsd;
  s.warmup = 8;
  s.decay_fraction = 0.5;
  EXPECT_THROW(s.validate(), InputError);
  EXPECT_THROW(parse_lr_schedule("step"), InputError);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrSchedule::Kind::cosine);
}

}  // namespace
}  // namespace baton::stages
