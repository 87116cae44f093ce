// Learning-rate schedules: the rate of each training step (steps count from 1, as the loss
// log does), a pure function of the step so that every rank, and a resumed run, use the
// same rate. Warm-up gives lr·s/W for s <= W; then
//   constant  lr
//   cosine    min + (lr − min)·(1 + cos(π·(s − W)/D))/2
//   linear    min + (lr − min)·(1 − (s − W)/D)
//   wsd       lr until the last D steps (warm-up, stable), then linear decay to min
// with D the decay steps (default: the steps after warm-up; for wsd: the last
// decay_fraction of all steps, rounded up to a whole step) and min after the decay ends.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace baton::stages {

struct LrSchedule {
  enum class Kind { constant, cosine, linear, wsd };
  Kind kind = Kind::constant;
  double lr = 1e-3;             // the peak rate
  double min_lr = 0;            // the rate the decay ends at
  int64_t warmup = 0;           // W
  int64_t decay = 0;            // D; 0: the default of the kind
  double decay_fraction = 0.1;  // wsd without an explicit D
  int64_t total = 0;            // the run's total steps (for the default D)

  // The rate of step s (1-based).
  double at(int64_t s) const;
  // D as resolved for this run.
  int64_t decay_steps() const;
  // Throws InputError naming the flag for a schedule that does not fit: min_lr above lr, a
  // fraction outside (0, 1], for cosine and linear a warm-up to the end of the run (W >=
  // total: no decay would follow it), for wsd warm-up and decay longer than the run. A
  // constant rate's warm-up may outlast the run (the rate then never reaches lr).
  void validate() const;

  nlohmann::json to_json() const;
  bool operator==(const LrSchedule& o) const = default;
};

std::string lr_schedule_name(LrSchedule::Kind k);
LrSchedule::Kind parse_lr_schedule(const std::string& name);  // InputError naming --lr-schedule

}  // namespace baton::stages
