// Learning-rate schedules against the formulas at every step of a run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

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

// A constant rate's JSON (the summary's and the manifest's) has no decay and no floor.
TEST(LrSchedule, ConstantJsonSaysNoDecay) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::constant;
  s.lr = 0.01;
  s.warmup = 3;
  s.total = 10;
  const nlohmann::json j = s.to_json();
  EXPECT_FALSE(j.contains("decay")) << j.dump();
  EXPECT_FALSE(j.contains("min_lr")) << j.dump();
  EXPECT_EQ(j["warmup"], 3);
  s.kind = LrSchedule::Kind::cosine;
  EXPECT_EQ(s.to_json()["decay"], 7);
}

// The default decay is the last decay_fraction of the steps, rounded up: a product that
// binary floating point puts just above a whole number (0.07 * 100 = 7.000000000000001)
// is that number, not one step more; one truly above it still rounds up.
TEST(LrSchedule, WsdDefaultDecayIsTheWholeNumberOfSteps) {
  const std::vector<std::tuple<double, int64_t, int64_t>> cases = {
      {0.07, 100, 7},      {0.14, 100, 14},     {0.28, 100, 28},     {0.55, 100, 55},
      {0.56, 100, 56},     {0.17, 300, 51},     {0.34, 300, 102},    {0.68, 300, 204},
      {0.81, 300, 243},    {0.17, 5000, 850},   {0.34, 5000, 1700},  {0.68, 5000, 3400},
      {0.81, 5000, 4050},  {0.17, 10000, 1700}, {0.34, 10000, 3400}, {0.68, 10000, 6800},
      {0.81, 10000, 8100}, {0.071, 100, 8},     {0.1, 7, 1},         {0.5, 3, 2},
      {1.0, 100, 100},     {0.001, 10, 1}};
  for (const auto& [fraction, total, want] : cases) {
    LrSchedule s;
    s.kind = LrSchedule::Kind::wsd;
    s.decay_fraction = fraction;
    s.total = total;
    EXPECT_EQ(s.decay_steps(), want) << fraction << " of " << total;
    // A warm-up that fills the rest of the run fits exactly.
    s.warmup = total - want;
    EXPECT_NO_THROW(s.validate()) << fraction << " of " << total;
  }
}

// Warm-up and decay near INT64_MAX: their sum had overflowed, and the run had been accepted.
TEST(LrSchedule, WsdHugeDecayIsRefused) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::wsd;
  s.total = 3;
  s.warmup = 1;
  s.decay = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(s.validate(), InputError);
  s.warmup = std::numeric_limits<int64_t>::max();
  s.decay = 1;
  EXPECT_THROW(s.validate(), InputError);
  s.warmup = 1;
  s.decay = 2;
  EXPECT_NO_THROW(s.validate());
}

// The message of the refused value.
std::string refusal(const LrSchedule& s) {
  try {
    s.validate();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

// A value just outside its range is shown as given: %f had printed 1e-7 as 0.000000 and
// 1.0000001 as 1.000000, inside the range the message states. --min-lr's names --lr's.
TEST(LrSchedule, MessagesShowTheValues) {
  LrSchedule s;
  s.total = 2;
  s.lr = 1e-8;
  s.min_lr = 1e-7;
  EXPECT_EQ(refusal(s), "--min-lr: expected a rate in [0, --lr] = [0, 1e-08], found 1e-07");
  s.lr = 0.001;
  s.min_lr = 0.0010000001;
  EXPECT_EQ(refusal(s), "--min-lr: expected a rate in [0, --lr] = [0, 0.001], found 0.0010000001");
  s.min_lr = 0;
  s.kind = LrSchedule::Kind::wsd;
  s.decay_fraction = 1.0000001;
  EXPECT_EQ(refusal(s), "--decay-fraction: expected a fraction in (0, 1], found 1.0000001");
  s.decay_fraction = -1e-9;
  EXPECT_EQ(refusal(s), "--decay-fraction: expected a fraction in (0, 1], found -1e-09");
}

// Cosine and linear decay after the warm-up: a warm-up to the end of the run (or past it)
// never decays, and is refused as wsd's is; a constant schedule's never holds --lr (it had
// been accepted).
TEST(LrSchedule, WarmupToTheEndIsRefused) {
  for (auto k : {LrSchedule::Kind::cosine, LrSchedule::Kind::linear}) {
    LrSchedule s;
    s.kind = k;
    s.total = 3;
    s.warmup = 5;
    EXPECT_EQ(refusal(s), "--warmup-steps 5: expected fewer than --steps 3, for the " +
                              lr_schedule_name(k) + " decay to follow the warm-up");
    s.warmup = 3;
    EXPECT_THROW(s.validate(), InputError);
    s.warmup = 2;
    EXPECT_NO_THROW(s.validate());
  }
  LrSchedule c;
  c.total = 3;
  c.warmup = 5;
  EXPECT_EQ(refusal(c),
            "--warmup-steps 5: expected fewer than --steps 3, for the constant rate --lr to "
            "follow the warm-up");
  c.warmup = 3;
  EXPECT_THROW(c.validate(), InputError);
  c.warmup = 2;
  EXPECT_NO_THROW(c.validate());
}

// The last step of a decay runs at --min-lr: a decay to 0 over one step trained nothing
// (exit 0, its checkpoint the initial weights).
TEST(LrSchedule, ADecayToZeroOverOneStepIsRefused) {
  for (auto k : {LrSchedule::Kind::cosine, LrSchedule::Kind::linear, LrSchedule::Kind::wsd}) {
    LrSchedule s;
    s.kind = k;
    s.total = 1;
    EXPECT_EQ(s.at(1), 0.0);
    EXPECT_NE(refusal(s).find("--steps 1 with --lr-schedule " + lr_schedule_name(k) +
                              ": its decay ends at --min-lr 0 on its only step"),
              std::string::npos)
        << refusal(s);
    s.min_lr = 1e-5;
    EXPECT_NO_THROW(s.validate());
    s.min_lr = 0;
    s.total = 2;
    EXPECT_GT(s.at(1), 0.0);
    EXPECT_NO_THROW(s.validate());
  }
  LrSchedule c;  // constant
  c.total = 1;
  EXPECT_NO_THROW(c.validate());
}

}  // namespace
}  // namespace baton::stages
