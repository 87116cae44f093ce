// Precision and loss scaling in the training loops, on the CPU: dynamic loss scaling with a
// power-of-two scale changes no bit of an f32 run (one process and a PP=2 x DP=2 plan);
// an overflowing scale skips the step (parameters and optimizer state untouched), backs
// off, and the skipped steps are reported (records, loss log, summary; a skip without a
// scaler too, and only that one warned of); the scale grows
// after its interval of clean steps and survives a checkpoint and resume; a Stage with
// master weights of another dtype (f64 masters beside f32 working copies: the CPU's
// stand-in for f32 masters beside bf16 ones) updates the masters, casts the working
// copies from them, and sees a master written through param() in the next forward.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "engine/trainer.h"
#include "engine_harness.h"
#include "stages/model.h"
#include "stages/stage.h"

namespace baton::engine_testing {
namespace {

using memory::Tensor;

const std::string kPrecisionCorpus = std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";

std::string precision_scratch(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "-" + std::to_string(getpid());
}

engine::TrainOptions precision_one_process(const std::string& model_path, int64_t steps) {
  engine::TrainOptions o;
  o.model_path = model_path;
  o.data_path = kPrecisionCorpus;
  o.steps = steps;
  o.batch = 8;
  o.micro_batches = 2;
  o.optimizer.adamw.lr = 5e-3;
  o.seed = 11;
  o.log_every = 0;
  return o;
}

std::string tiny_model(const std::string& name) {
  std::string path = precision_scratch(name);
  std::ofstream(path) << tiny_gpt_json(2).dump();
  return path;
}

kernels::LossScaler::Options scaling(double init, int64_t growth_interval = 1000) {
  kernels::LossScaler::Options s;
  s.init_scale = init;
  s.growth_interval = growth_interval;
  return s;
}

TEST(LossScaling, PowerOfTwoScaleChangesNoBitOfAnF32Run) {
  kernels::set_num_threads(1);
  const std::string model = tiny_model("ls-exact.json");
  engine::TrainOptions plain = precision_one_process(model, 4);
  engine::TrainOptions scaled = plain;
  scaled.loss_scaling = scaling(65536.0);
  auto want = engine::run_training(plain).records;
  auto got = engine::run_training(scaled).records;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].loss, want[i].loss) << "step " << i + 1;
    EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << i + 1;
    EXPECT_EQ(got[i].loss_scale, 65536.0);
    EXPECT_FALSE(got[i].skipped);
    EXPECT_EQ(want[i].loss_scale, 0.0);  // no scaler: none reported
  }
}

TEST(LossScaling, OverflowSkipsTheStepBacksOffAndIsReported) {
  kernels::set_num_threads(1);
  const std::string model = tiny_model("ls-overflow.json");
  engine::TrainOptions o = precision_one_process(model, 5);
  // Above f32's largest value (3.4e38): the loss gradient itself is inf, whatever the
  // data; the back-off then lands far below any overflow.
  kernels::LossScaler::Options sc = scaling(4e39);
  sc.backoff_factor = std::ldexp(1.0, -100);
  o.loss_scaling = sc;
  o.loss_log = precision_scratch("ls-overflow.jsonl");
  o.summary_path = precision_scratch("ls-overflow-summary.json");
  std::vector<engine::StepRecord> r = engine::run_training(o).records;
  ASSERT_EQ(r.size(), 5u);
  EXPECT_TRUE(r[0].skipped);
  EXPECT_EQ(r[0].loss_scale, 4e39);
  EXPECT_FALSE(std::isfinite(r[0].grad_norm));
  for (size_t i = 1; i < r.size(); ++i) {
    EXPECT_FALSE(r[i].skipped) << "step " << i + 1;
    EXPECT_EQ(r[i].loss_scale, 4e39 * sc.backoff_factor) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(r[i].grad_norm)) << "step " << i + 1;
  }
  // The skipped step left the model untouched: steps 1 and 2 see the untrained model,
  // as a run whose updates are far below f32's resolution does (same batches).
  engine::TrainOptions frozen = precision_one_process(model, 3);
  frozen.optimizer.adamw.lr = 1e-30;
  std::vector<engine::StepRecord> f = engine::run_training(frozen).records;
  EXPECT_EQ(r[0].loss, f[0].loss);
  EXPECT_EQ(r[1].loss, f[1].loss);
  EXPECT_NE(r[2].loss, f[2].loss);  // step 2's update was applied

  // The loss log and the summary report it.
  std::ifstream log(o.loss_log);
  std::string line;
  int logged_skips = 0, lines = 0;
  while (std::getline(log, line)) {
    ++lines;
    nlohmann::json j = nlohmann::json::parse(line);  // valid JSON, also when skipped
    EXPECT_TRUE(j.contains("loss_scale")) << line;
    EXPECT_EQ(j["grad_norm"].is_null(), j["skipped"].get<bool>()) << line;
    if (line.find("\"skipped\": true") != std::string::npos) ++logged_skips;
  }
  EXPECT_EQ(lines, 5);
  EXPECT_EQ(logged_skips, 1);
  std::ifstream sj(o.summary_path);
  nlohmann::json summary = nlohmann::json::parse(sj);
  EXPECT_EQ(summary["skipped_steps"], 1);
  EXPECT_EQ(summary["precision"], "f32");
  EXPECT_EQ(summary["device"], "cpu");
}

// Every trainer's skipped steps go through run_loop: each is counted and has "skipped":
// true in the loss log, in any precision; only one without a loss scaler (a non-finite
// gradient) is warned of, a scaler's overflows being its routine.
TEST(LossScaling, SkippedStepsAreLoggedCountedAndWarnedOfOnlyWithoutAScaler) {
  engine::LoopOptions o;
  o.steps = 4;
  o.log_every = 0;
  o.loss_log = precision_scratch("skips.jsonl");
  engine::LoopSteps steps;
  steps.step = [](int64_t step) {
    engine::StepRecord r{step + 1, 2.5, 1.25, 0.01};
    if (step == 1 || step == 3) {  // a non-finite norm: step 2 without a scaler, step 4 with
      r.skipped = true;
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
    }
    if (step >= 2) r.loss_scale = 1024;
    return r;
  };
  std::ostringstream text;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
  spdlog::default_logger()->sinks().push_back(sink);
  const engine::TrainSummary sum = engine::run_loop(o, 0, 1, true, steps, nullptr);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(sum.skipped_steps, 2);
  const std::string warned = text.str();
  EXPECT_NE(warned.find("step 2: the gradient norm is nan; the optimizer step is skipped"),
            std::string::npos)
      << warned;
  EXPECT_EQ(warned.find("step 4"), std::string::npos) << warned;
  std::ifstream log(o.loss_log);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_FALSE(lines[0].contains("skipped"));  // no scaler: only a skipped step says it
  EXPECT_EQ(lines[1].value("skipped", false), true) << lines[1];
  EXPECT_TRUE(lines[1]["grad_norm"].is_null());
  EXPECT_EQ(lines[2].value("skipped", true), false) << lines[2];
  EXPECT_EQ(lines[3].value("skipped", false), true) << lines[3];
}

TEST(LossScaling, GrowsAfterItsIntervalAndResumesFromACheckpoint) {
  kernels::set_num_threads(1);
  const std::string model = tiny_model("ls-grow.json");
  engine::TrainOptions o = precision_one_process(model, 6);
  o.loss_scaling = scaling(1024.0, 2);
  std::vector<engine::StepRecord> whole = engine::run_training(o).records;
  const double want[] = {1024, 1024, 2048, 2048, 4096, 4096};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(whole[i].loss_scale, want[i]) << "step " << i + 1;
    EXPECT_FALSE(whole[i].skipped);
  }
  // Stopped after 3 steps (one clean step into the 2048 interval) and resumed: the same
  // scales and losses as the uninterrupted run.
  const std::string dir = precision_scratch("ls-grow-ckpt");
  std::filesystem::remove_all(dir);
  engine::TrainOptions first = o;
  first.steps = 3;
  first.checkpoint_dir = dir;
  engine::run_training(first);
  engine::TrainOptions rest = o;
  rest.checkpoint_dir = dir;
  rest.resume = true;
  std::vector<engine::StepRecord> resumed = engine::run_training(rest).records;
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i].loss_scale, whole[i + 3].loss_scale) << "step " << i + 4;
    EXPECT_EQ(resumed[i].loss, whole[i + 3].loss) << "step " << i + 4;
  }
  std::filesystem::remove_all(dir);
}

TEST(LossScaling, APlanScalesAsOneProcessDoes) {
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {1, 1};
  p.dp = 2;
  p.micro_batches = 2;
  p.micro_batch_size = 2;
  Workspace ws("precision");
  RunSettings s;
  s.steps = 4;
  s.configure = [](engine::LoopOptions& o) {
    kernels::LossScaler::Options sc = scaling(4e39, 2);
    sc.backoff_factor = std::ldexp(1.0, -100);
    o.loss_scaling = sc;
  };
  auto plan = resolve(p, ws);
  std::vector<engine::StepRecord> want = run_reference(p, ws, s);
  std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].loss_scale, want[i].loss_scale) << "step " << i + 1;
    EXPECT_EQ(got[i].skipped, want[i].skipped) << "step " << i + 1;
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
  }
  EXPECT_TRUE(want[0].skipped);  // 4e39: inf in f32
  EXPECT_FALSE(want[1].skipped);
  EXPECT_FALSE(want[3].skipped);
  EXPECT_EQ(want[3].loss_scale, 2 * want[1].loss_scale);  // grown after two clean steps
}

TEST(MasterWeights, TheOptimizerUpdatesMastersAndTheOpsReadTheirCasts) {
  kernels::set_num_threads(1);
  auto graph = std::make_shared<stages::Graph>(
      stages::load_model_json(tiny_gpt_json(1), "tiny", stages::LoadOptions{}));
  stages::StageOptions so;
  so.seed = 5;
  stages::Stage plain(graph, 0, graph->num_layers(), so);
  so.master_dtype = memory::DType::f64;
  stages::Stage mixed(graph, 0, graph->num_layers(), so);
  stages::OptimizerConfig opt;
  opt.adamw.lr = 1e-2;
  plain.set_optimizer(opt);
  mixed.set_optimizer(opt);
  const int id = mixed.param_ids().front();
  EXPECT_EQ(mixed.param(id).dtype(), memory::DType::f64);
  EXPECT_EQ(mixed.working_param(id).dtype(), memory::DType::f32);
  // The same initial values (the master initialised as the f32 parameter, then cast).
  EXPECT_EQ(mixed.working_param(id).to_vector<float>(), plain.param(id).to_vector<float>());

  const stages::ValueType& tt = graph->value("tokens").type;
  std::vector<int64_t> ids(size_t(2 * tt.shape[0])), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int64_t(i * 7 % 256);
    next[i] = int64_t((i * 7 + 1) % 256);
  }
  Tensor tokens = Tensor::from_vector(ids, {2, tt.shape[0]}).to(tt.dtype);
  Tensor targets = Tensor::from_vector(next, {2, tt.shape[0]}).to(tt.dtype);
  auto run_step = [&](stages::Stage& st) {
    st.zero_grad();
    stages::MicroBatch mb{0, 0, 2, 2, double(targets.numel()), 0};
    double loss = st.forward(mb, {{"tokens", tokens}, {"targets", targets}})
                      .at("loss")
                      .to_vector<double>()[0];
    st.backward(0);
    st.step(1.0);
    return loss;
  };
  for (int k = 0; k < 3; ++k) {
    const double a = run_step(plain), b = run_step(mixed);
    EXPECT_NEAR(a, b, 1e-5 * std::abs(a)) << "step " << k;  // f32 vs f64 updates
  }
  // The state is in the master's dtype; the working copy is the master's cast.
  for (const auto& [name, t] : mixed.optimizer_state(id)) EXPECT_EQ(t.dtype(), memory::DType::f64);
  EXPECT_EQ(mixed.working_param(id).to_vector<float>(),
            mixed.param(id).to(memory::DType::f32).to_vector<float>());
  // Writing the master (a checkpoint load, a ZeRO gather) reaches the next forward.
  for (int pid : mixed.param_ids())
    mixed.param(pid).copy_from(plain.param(pid).to(mixed.param(pid).dtype()));
  stages::MicroBatch mb{0, 0, 2, 2, double(targets.numel()), 1};
  const double want = plain.forward(mb, {{"tokens", tokens}, {"targets", targets}}, false)
                          .at("loss")
                          .to_vector<double>()[0];
  const double got = mixed.forward(mb, {{"tokens", tokens}, {"targets", targets}}, false)
                         .at("loss")
                         .to_vector<double>()[0];
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace baton::engine_testing
