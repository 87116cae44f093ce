// What the simulator needs to know about the model and the machine: per-stage compute
// times, activation memory, transfer sizes, point-to-point latency and bandwidth,
// data-parallel reduction and optimizer step times. Costs holds them per stage (the
// simulator's input, what the partitioner fills in); CostSpec is the JSON cost file,
// which may give one number for every stage and is resolved for a given schedule.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedule/schedule.h"

namespace baton::schedule {

// The longest time a cost may give, in seconds (as profile cost files,
// partitioner/cost_model.cpp): the simulator's sums of such times stay finite, so no
// makespan, bubble or trace reads inf or NaN. A cost file's are checked in its time_unit.
inline constexpr double kMaxCostSeconds = 1e9;

// Times in any unit used consistently (seconds unless a cost file says otherwise),
// bytes in bytes. Every vector has one entry per stage of the schedule simulated.
struct Costs {
  std::vector<double> forward;          // F of one micro-batch
  std::vector<double> backward_input;   // B; a BW costs B + W
  std::vector<double> backward_weight;  // W
  // Activation memory of one micro-batch, taken at the start of its F and held until
  // the end of its W (or BW). Empty: 0.
  std::vector<double> activation_bytes;
  // The part still held between the end of B and the end of W (the inputs W needs).
  // Empty: all of activation_bytes.
  std::vector<double> activation_bytes_after_b;
  // The activation stage s sends to stage s+1 (its gradient has the same size). Empty: 0.
  std::vector<double> message_bytes;
  // Data-parallel reduction of the stage's gradients, started by REDUCE. Empty: 0.
  std::vector<double> reduce;
  // Stages whose reductions span pipeline ranks (a tied parameter's all-reduce) share a
  // group id >= 0: each such reduction starts when the last REDUCE of its group has been
  // issued, so a rank's STEP waits for the other ranks' backward. -1 or empty: the
  // reduction starts at its own REDUCE. Applies when STEP is every rank's last action.
  std::vector<int> reduce_group;
  // A composite OVERLAP_F_B whose forward is on this stage (its backward half of the
  // kind it is, B or BW), start to end. Empty: the forward's time plus the backward's
  // (no gain from the overlap).
  std::vector<double> overlap_f_b;
  // Time-slicing: more ranks on a host than cores, each rank bound to one core
  // (transport::bind_dealt). core_ranks[c][r] is how many processes of simulated rank r
  // core c runs (its data-parallel and tensor-parallel peers mirror r's actions). A
  // compute action runs slower by the busy processes of the busiest core among its
  // rank's (their number averaged over the action; at least 1): cores are shared
  // among the ranks computing, not among all. Empty: every rank computes alone.
  std::vector<std::vector<double>> core_ranks;
  double latency = 0.0;    // per point-to-point message
  double bandwidth = 0.0;  // bytes per time unit of one link; 0 means infinite
  double optimizer_step = 0.0;
  // STEP's time on each rank, where ranks differ (each updates its own stages' share).
  // Empty: optimizer_step on every rank.
  std::vector<double> optimizer_step_rank;
  // How STEP meets the global gradient norm (the plan's optimizer_step). Synchronous
  // (false): every rank's STEP starts when the last rank reaches its STEP, plus one
  // latency (the norm's all-reduce). Post-validated (true): each STEP starts when its own
  // rank is ready; the step still ends (makespan) no earlier than that all-reduce, which
  // validates the updates. Applies when STEP is every rank's last action (lower()'s).
  bool post_validated_step = false;

  // The same F, B, W on each of `stages` stages; nothing else costs anything.
  static Costs uniform(int stages, double f, double b, double w);
  double step_time(int rank) const {
    return optimizer_step_rank.empty() ? optimizer_step : optimizer_step_rank[size_t(rank)];
  }
  // Throws InputError naming the field unless each vector has `stages` entries (the
  // optional ones may be empty; each of core_ranks' and optimizer_step_rank's `ranks`
  // entries) and every value is
  // finite and >= 0.
  void check(int stages, int ranks) const;
};

// A cost file (docs/schedules.md, "Costs"). Each per-stage field is either one number,
// the cost of one rank's share of the model in a one-stage-per-rank split (a schedule
// with v stages per rank and direction gets value / v per stage; message sizes are not
// divided), or an array with one value per stage of the schedule.
struct CostSpec {
  struct Field {
    std::vector<double> values;  // one value (a rank's share) or one per stage
    bool per_stage = false;      // given as an array
    bool given = false;
  };
  Field forward, backward_input, backward_weight, activation_bytes, activation_bytes_after_b,
      message_bytes, reduce, overlap_f_b;
  double latency = 0.0, bandwidth = 0.0, optimizer_step = 0.0;
  bool post_validated_step = false;  // "optimizer_step_mode": "post-validated"
  std::vector<int> reduce_group;     // one per stage of the schedule, or empty
  double seconds_per_unit = 1.0;     // from "time_unit": s, ms, us or ns
  std::string comment;

  // F = B = W = 1 per rank share, nothing else: the unit costs of the literature.
  static CostSpec unit();
};

// Errors name the source and the JSON path ("costs.json: forward[3]: expected ...").
CostSpec parse_costs(std::string_view json_text, const std::string& source);
CostSpec load_costs(const std::string& path);

// Per-stage costs for a schedule's stages. Throws InputError when an array's length is
// not the schedule's number of stages.
Costs resolve(const CostSpec& spec, const Schedule& s);
Costs resolve(const CostSpec& spec, int num_ranks, int num_stages, int num_directions);

}  // namespace baton::schedule
