#include "stages/lr_schedule.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "memory/error.h"

namespace baton::stages {

namespace {

// A rate or fraction as a message shows it: the shortest text that reads back as the same
// number (std::to_string's %f had printed 1e-7 as 0.000000 and 1.0000001 as 1.000000,
// values inside the range the message states).
std::string number(double v) {
  return fmt::format("{}", v);
}

}  // namespace

int64_t LrSchedule::decay_steps() const {
  if (decay > 0) return decay;
  if (kind == Kind::wsd) {
    // The product in binary can land a few units in the last place above a whole number
    // (0.07 * 100 is 7.000000000000001), which ceil took to the next step: within those
    // units it is that number.
    const double steps = decay_fraction * double(total);
    const double whole = std::round(steps);
    const double d = std::abs(steps - whole) <= 4 * std::numeric_limits<double>::epsilon() * steps
                         ? whole
                         : std::ceil(steps);
    if (d >= double(total))
      return std::max<int64_t>(1, total);  // a fraction of 1 (no cast past INT64_MAX)
    return std::max<int64_t>(1, int64_t(d));
  }
  return std::max<int64_t>(1, total - warmup);
}

double LrSchedule::at(int64_t s) const {
  if (warmup > 0 && s <= warmup) return lr * double(s) / double(warmup);
  const double D = double(decay_steps());
  switch (kind) {
    case Kind::constant:
      return lr;
    case Kind::cosine: {
      const double x = std::min(1.0, double(s - warmup) / D);
      return min_lr + (lr - min_lr) * (1 + std::cos(std::numbers::pi * x)) / 2;
    }
    case Kind::linear: {
      const double x = std::min(1.0, double(s - warmup) / D);
      return min_lr + (lr - min_lr) * (1 - x);
    }
    case Kind::wsd: {
      const double start = double(total) - D;  // the decay's steps: (start, total]
      if (double(s) <= start) return lr;
      const double x = std::min(1.0, (double(s) - start) / D);
      return min_lr + (lr - min_lr) * (1 - x);
    }
  }
  return lr;
}

void LrSchedule::validate() const {
  if (!(lr > 0)) throw InputError("--lr: expected a positive number");
  if (warmup < 0)
    throw InputError("--warmup-steps: expected >= 0, found " + std::to_string(warmup));
  if (decay < 0) throw InputError("--decay-steps: expected >= 0, found " + std::to_string(decay));
  if (!(min_lr >= 0) || min_lr > lr)
    throw InputError("--min-lr: expected a rate in [0, --lr] = [0, " + number(lr) + "], found " +
                     number(min_lr));
  if (!(decay_fraction > 0 && decay_fraction <= 1))
    throw InputError("--decay-fraction: expected a fraction in (0, 1], found " +
                     number(decay_fraction));
  // A warm-up to the end of the run never reaches --lr before it, nor decays (nor holds
  // the constant rate: a constant schedule's had been accepted, its peak never run).
  if ((kind == Kind::cosine || kind == Kind::linear) && total > 0 && warmup >= total)
    throw InputError("--warmup-steps " + std::to_string(warmup) + ": expected fewer than --steps " +
                     std::to_string(total) + ", for the " + lr_schedule_name(kind) +
                     " decay to follow the warm-up");
  if (kind == Kind::constant && total > 0 && warmup >= total)
    throw InputError("--warmup-steps " + std::to_string(warmup) + ": expected fewer than --steps " +
                     std::to_string(total) + ", for the constant rate --lr to follow the warm-up");
  // A decay to 0 over the one step of the run sets that step's rate to 0: it trained
  // nothing, exit 0, its checkpoint the initial weights.
  if (kind != Kind::constant && total == 1 && warmup == 0 && min_lr == 0)
    throw InputError("--steps 1 with --lr-schedule " + std::string(lr_schedule_name(kind)) +
                     ": its decay ends at --min-lr 0 on its only step, which would train nothing "
                     "(the last step of a decay runs at --min-lr); give more steps, --min-lr "
                     "above 0, or --lr-schedule constant");
  // Both may be near INT64_MAX: compared without their sum, which overflowed.
  if (kind == Kind::wsd && total > 0 && (warmup > total || decay_steps() > total - warmup))
    throw InputError("--lr-schedule wsd: warm-up (" + std::to_string(warmup) + ") and decay (" +
                     std::to_string(decay_steps()) + ") steps exceed the run's " +
                     std::to_string(total) + " steps");
}

nlohmann::json LrSchedule::to_json() const {
  // A constant rate neither decays nor has a floor: no fields that say it does.
  if (kind == Kind::constant)
    return {{"kind", lr_schedule_name(kind)}, {"lr", lr}, {"warmup", warmup}, {"total", total}};
  return {{"kind", lr_schedule_name(kind)}, {"lr", lr},      {"min_lr", min_lr}, {"warmup", warmup},
          {"decay", decay_steps()},         {"total", total}};
}

std::string lr_schedule_name(LrSchedule::Kind k) {
  switch (k) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::cosine:
      return "cosine";
    case LrSchedule::Kind::linear:
      return "linear";
    case LrSchedule::Kind::wsd:
      return "wsd";
  }
  return "?";
}

LrSchedule::Kind parse_lr_schedule(const std::string& name) {
  for (auto k : {LrSchedule::Kind::constant, LrSchedule::Kind::cosine, LrSchedule::Kind::linear,
                 LrSchedule::Kind::wsd})
    if (lr_schedule_name(k) == name) return k;
  throw InputError("--lr-schedule: expected constant, cosine, linear or wsd, found '" + name + "'");
}

}  // namespace baton::stages
