// Shared by the engine tests: tiny models and plans built in memory, a run of a plan with
// every rank a thread over the local transport (train_plan on each), and the reference
// run of the one-process trainer with the same model, seed, data and global batch.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/plan_trainer.h"
#include "engine/rank_engine.h"
#include "engine/trainer.h"
#include "partitioner/evaluate.h"

namespace baton::engine_testing {

using nlohmann::json;

// A GPT small enough for dozens of 20-step runs: n_layer blocks of width 32 (4 heads),
// context 16, vocabulary 256 (byte data): n_layer + 2 layers (embed, blocks, head).
json tiny_gpt_json(int n_layer = 6, double dropout = 0.0);
// The MLP shorthand: context 8, embedding 16, hidden layers of the given widths.
json tiny_mlp_json(std::vector<int> hidden = {64, 64, 64, 64, 64, 64});

// A scratch directory (removed at exit) with the model written to model.json.
struct Workspace {
  explicit Workspace(const std::string& name);
  ~Workspace();
  std::string dir;
  std::string path(const std::string& file) const { return dir + "/" + file; }
};

struct PlanSpec {
  json model;
  int dp = 1;
  std::vector<int> tp = {1};  // one per pipeline rank
  std::string schedule = "1f1b";
  int micro_batches = 4;  // per replica
  int64_t micro_batch_size = 2;
  int chunks = 0;
  std::vector<int> layers_per_stage;  // empty: as even as possible
  std::string optimizer_sharding;     // empty: not written (none)
  json dp_sync;                       // null: not written (allreduce)
  std::string describe() const;
};

// One plan of the equivalence grid (test_parallel.cpp; test_memory_grid.cpp measures some
// of its kinds): the tiny GPT or MLP at PP x TP x DP under a schedule.
struct GridCase {
  std::string model;  // gpt, mlp
  int pp = 1, tp = 1, dp = 1;
  std::string schedule;
};
// Its test name: letters, digits and _ only, as gtest requires.
std::string grid_case_name(const GridCase& c);
// Its plan: 8 samples a step in 4 micro-batches (8 at PP 4).
PlanSpec grid_plan(const GridCase& c);

// The plan JSON (model embedded as a file path in `ws`).
json plan_json(const PlanSpec& p, const Workspace& ws);
std::shared_ptr<const partitioner::ResolvedPlan> resolve(const PlanSpec& p, const Workspace& ws);

// The settings both runs share.
struct RunSettings {
  int64_t steps = 20;
  uint64_t seed = 3;
  double lr = 3e-3;
  double grad_clip = 1.0;
  std::string data;  // default: examples/data/licenses.txt
  // Further changes to both runs' loop options (data flags, schedule, evaluation).
  std::function<void(engine::LoopOptions&)> configure;
};

// The loop options of both runs (no logging).
engine::LoopOptions loop_options(const RunSettings& s);
// The one-process trainer's options: the model written in `ws`, `batch` samples a step
// in `micro_batches` micro-batches.
engine::TrainOptions one_process_options(const Workspace& ws, const RunSettings& s, int64_t batch,
                                         int64_t micro_batches);
std::vector<engine::StepRecord> run_reference(const PlanSpec& p, const Workspace& ws,
                                              const RunSettings& s);
// Runs every rank as a thread; returns rank 0's records and checks every rank reported
// the same ones (EXPECT).
std::vector<engine::StepRecord> run_threads(std::shared_ptr<const partitioner::ResolvedPlan> plan,
                                            const engine::PlanTrainOptions& o);
engine::PlanTrainOptions train_options(const Workspace& ws, const RunSettings& s);
// Builds every rank's RankEngine of `plan` (local transport, no inputs), each on a thread
// of its own since their constructors talk to each other, and calls f(rank, engine) for
// each, one at a time: to look at what each rank holds before any step.
void inspect_rank_engines(const std::shared_ptr<const partitioner::ResolvedPlan>& plan,
                          const std::function<void(int, engine::RankEngine&)>& f);

// A plan's step records against the one-process run's: loss and gradient norm equal bit
// for bit, or within 1e-5 relative (EXPECT, naming the step).
void expect_steps_match(const std::vector<engine::StepRecord>& got,
                        const std::vector<engine::StepRecord>& want, bool bitwise);

// True when every stage of the schedule runs its weight gradients in ascending
// micro-batch order and each chunk has one replica: the accumulation order of the
// one-process trainer, so pure pipeline parallelism must match it bit for bit.
bool same_accumulation_order(const schedule::Schedule& s);

}  // namespace baton::engine_testing
