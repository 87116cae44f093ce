// Token datasets, learning-rate schedules and evaluation in both training loops: a run
// interrupted mid-warm-up or mid-decay and resumed gives the uninterrupted run's loss, rate
// and held-out loss curve bit for bit (and its loss log); a Megatron-format dataset with
// held-out documents trains under plans of the equivalence grid (PP2 with 1F1B, ZB-V
// and DualPipe, TP2xDP2, PP2xTP2xDP2, each rank a thread) with the one-process loss curve, the same
// rates, and the held-out loss of a forward-only pass through the pipeline within 1e-6 of one
// process's; a plan's run resumed mid-decay repeats its last steps bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "engine_harness.h"
#include "kernels/ops.h"
#include "memory/error.h"
#include "stages/checkpoint.h"
#include "stages/token_store.h"
#include "transport/local.h"

namespace baton::engine_testing {
namespace {

// The shipped corpus as a Megatron dataset (uint16 byte values), one document per
// paragraph (blank-line separated), written by the tests' own writer.
std::string write_corpus_dataset(const Workspace& ws) {
  std::ifstream in(std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string prefix = ws.path("corpus");
  stages::IndexedDatasetWriter w(prefix, stages::TokenType::u16);
  std::vector<int64_t> doc;
  for (size_t i = 0; i < text.size(); ++i) {
    doc.push_back(static_cast<unsigned char>(text[i]));
    const bool paragraph_end = text[i] == '\n' && i + 1 < text.size() && text[i + 1] == '\n';
    if (paragraph_end || i + 1 == text.size()) {
      w.add_document(doc);
      doc.clear();
    }
  }
  w.finish();
  return prefix;
}

// The two-layer tiny GPT at PP2 x DP2, two micro-batches of one sample.
PlanSpec pp2_dp2() {
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {1, 1};
  p.dp = 2;
  p.micro_batches = 2;
  p.micro_batch_size = 1;
  return p;
}

// The run's data, schedule and evaluation.
void token_run(engine::LoopOptions& o, const std::string& prefix) {
  o.data_path = prefix;
  o.data.eval_fraction = 0.1;
  o.data.cross_documents = false;
  o.lr_schedule.kind = stages::LrSchedule::Kind::cosine;
  o.lr_schedule.warmup = 4;
  o.lr_schedule.min_lr = 1e-4;
  o.eval_every = 3;
  o.eval_batches = 2;
}

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One process, 12 steps (warm-up 1..4, cosine decay 5..12), a checkpoint every 3 steps;
// `crash_at` > 0: the run stops after that step (its newest checkpoint is older).
std::vector<engine::StepRecord> data_loop_one_process(const Workspace& ws,
                                                      const std::string& prefix,
                                                      const std::string& ckpt, bool resume,
                                                      int64_t crash_at) {
  RunSettings s;
  s.steps = 12;
  s.configure = [&](engine::LoopOptions& o) { token_run(o, prefix); };
  kernels::set_num_threads(1);
  engine::TrainOptions o = one_process_options(ws, s, 4, 2);
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 3;
  o.resume = resume;
  o.loss_log = ckpt + ".jsonl";
  return engine::run_training(o,
                              [crash_at](const engine::StepRecord& r) {
                                if (r.step == crash_at) throw Interrupted();
                              })
      .records;
}

void data_loop_expect_same(const std::vector<engine::StepRecord>& got,
                           const std::vector<engine::StepRecord>& whole) {
  ASSERT_LE(got.size(), whole.size());
  const size_t off = whole.size() - got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const engine::StepRecord& w = whole[off + i];
    EXPECT_EQ(got[i].step, w.step);
    EXPECT_EQ(got[i].loss, w.loss) << "step " << w.step;
    EXPECT_EQ(got[i].grad_norm, w.grad_norm) << "step " << w.step;
    EXPECT_EQ(got[i].lr, w.lr) << "step " << w.step;
    ASSERT_EQ(got[i].eval_loss.has_value(), w.eval_loss.has_value()) << "step " << w.step;
    if (w.eval_loss) {
      EXPECT_EQ(*got[i].eval_loss, *w.eval_loss) << "step " << w.step;
    }
  }
}

TEST(DataLoop, ResumeMidWarmupAndMidDecayContinuesTheCurve) {
  Workspace ws("data_loop_resume");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  plan_json(p, ws);  // writes model.json
  const std::string prefix = write_corpus_dataset(ws);

  std::vector<engine::StepRecord> whole =
      data_loop_one_process(ws, prefix, ws.path("whole"), false, 0);
  ASSERT_EQ(whole.size(), 12u);
  // The schedule's rates: warm-up lr·s/W, then cosine from lr to min_lr over 8 steps.
  const double lr = 3e-3, min_lr = 1e-4;
  for (int64_t s = 1; s <= 12; ++s) {
    const double want = s <= 4
                            ? lr * double(s) / 4
                            : min_lr + (lr - min_lr) * (1 + std::cos(M_PI * double(s - 4) / 8)) / 2;
    EXPECT_NEAR(whole[size_t(s - 1)].lr, want, 1e-15) << "step " << s;
  }
  for (int64_t s : {3, 6, 9, 12}) EXPECT_TRUE(whole[size_t(s - 1)].eval_loss.has_value()) << s;
  EXPECT_FALSE(whole[0].eval_loss.has_value());
  EXPECT_LT(*whole[11].eval_loss, *whole[2].eval_loss);  // the held-out loss falls

  // Stopped after step 5 (checkpoint at 3: mid-warm-up) and after step 8 (checkpoint at 6:
  // mid-decay), then resumed.
  for (int64_t crash : {5, 8}) {
    SCOPED_TRACE("interrupted after step " + std::to_string(crash));
    const std::string ckpt = ws.path("crash" + std::to_string(crash));
    EXPECT_THROW(data_loop_one_process(ws, prefix, ckpt, false, crash), Interrupted);
    std::vector<engine::StepRecord> rest = data_loop_one_process(ws, prefix, ckpt, true, 0);
    EXPECT_EQ(rest.size(), size_t(12 - (crash / 3) * 3));
    data_loop_expect_same(rest, whole);
    // The loss log is the uninterrupted run's, line for line.
    EXPECT_EQ(read_text(ckpt + ".jsonl"), read_text(ws.path("whole") + ".jsonl"));
  }
}

void data_loop_expect_close(const std::vector<engine::StepRecord>& got,
                            const std::vector<engine::StepRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  double worst_eval = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
        << "step " << i + 1;
    EXPECT_EQ(got[i].lr, want[i].lr) << "step " << i + 1;
    ASSERT_EQ(got[i].eval_loss.has_value(), want[i].eval_loss.has_value()) << "step " << i + 1;
    if (want[i].eval_loss) {
      EXPECT_NEAR(*got[i].eval_loss, *want[i].eval_loss, 1e-6) << "step " << i + 1;
      worst_eval = std::max(worst_eval, std::abs(*got[i].eval_loss - *want[i].eval_loss));
    }
  }
  std::printf("  worst held-out loss difference: %.2e\n", worst_eval);
}

TEST(DataLoop, TokenDatasetUnderPlansMatchesOneProcess) {
  Workspace ws("data_loop_plans");
  const std::string prefix = write_corpus_dataset(ws);
  struct Case {
    int pp, tp, dp;
    std::string schedule;
  };
  for (const Case& c : {Case{2, 1, 1, "1f1b"}, Case{2, 1, 1, "zb-v"}, Case{2, 1, 1, "dualpipe"},
                        Case{1, 2, 2, "gpipe"}, Case{2, 2, 2, "1f1b"}}) {
    PlanSpec p;
    p.model = tiny_gpt_json(2);
    p.tp.assign(size_t(c.pp), c.tp);
    p.dp = c.dp;
    p.schedule = c.schedule;
    p.micro_batches = c.schedule == "dualpipe" ? 4 : 2;  // DualPipe: both directions
    p.micro_batch_size = 4 / (p.micro_batches * c.dp);
    SCOPED_TRACE(p.describe());
    std::printf("%s\n", p.describe().c_str());
    RunSettings s;
    s.steps = 4;
    s.configure = [&](engine::LoopOptions& o) {
      token_run(o, prefix);
      o.lr_schedule.warmup = 2;  // steps 3 and 4 decay
      o.eval_every = 1;
    };
    auto plan = resolve(p, ws);
    std::vector<engine::StepRecord> want = run_reference(p, ws, s);
    std::vector<engine::StepRecord> got = run_threads(plan, train_options(ws, s));
    data_loop_expect_close(got, want);
  }
}

// Under a plan (PP2 x DP2): the newest checkpoint of a finished run removed, the run
// resumes mid-decay from the one before and repeats the last steps bit for bit.
TEST(DataLoop, PlanResumesMidDecay) {
  Workspace ws("data_loop_plan_resume");
  const std::string prefix = write_corpus_dataset(ws);
  PlanSpec p = pp2_dp2();
  RunSettings s;
  s.steps = 6;
  s.configure = [&](engine::LoopOptions& o) {
    token_run(o, prefix);
    o.lr_schedule.warmup = 2;
    o.eval_every = 2;
  };
  auto plan = resolve(p, ws);
  engine::PlanTrainOptions o = train_options(ws, s);
  o.checkpoint_dir = ws.path("ckpt");
  o.checkpoint_every = 2;
  o.loss_log = ws.path("loss.jsonl");
  std::vector<engine::StepRecord> whole = run_threads(plan, o);
  const std::string log = read_text(o.loss_log);
  std::filesystem::remove_all(stages::checkpoint_dir(o.checkpoint_dir, 6));
  o.resume = true;
  std::vector<engine::StepRecord> rest = run_threads(plan, o);
  ASSERT_EQ(rest.size(), 2u);
  data_loop_expect_same(rest, whole);
  EXPECT_EQ(read_text(o.loss_log), log);
}

// A due checkpoint is written before that step's evaluation: an evaluation that failed
// (the held-out data gone under the run, a peer killed) had lost it, at the end of a run
// its last. The step's loss-log line is not written then: the resume from the checkpoint
// evaluates again and writes it whole (a line without its held-out loss had been written,
// and the loss lost for good). A checkpoint of a step without evaluation still follows the step's
// line (a run killed between the two resumes with the line). A log that ends before the resumed
// checkpoint's step (a run killed during that evaluation) is said.
// A run of no steps with held-out data evaluates the initial weights, as step 0 of the
// summary's evaluations, and writes them as step 0 (it had evaluated nothing, silently).
TEST(DataLoop, NoStepsEvaluatesTheInitialWeights) {
  Workspace ws("data_loop_no_steps");
  engine::LoopOptions o;
  o.steps = 0;
  o.checkpoint_dir = ws.path("ckpt");
  o.log_every = 0;
  engine::LoopSteps steps;
  int trained = 0, evaluations = 0;
  std::vector<int64_t> saved;
  steps.step = [&](int64_t step) {
    ++trained;
    return engine::StepRecord{step + 1, 1, 1, 1};
  };
  steps.checkpoint = [&](int64_t done, const nlohmann::json&) {
    saved.push_back(done);
    return ws.path("ckpt/step-0");
  };
  steps.evaluate = [&] {
    ++evaluations;
    return 6.25;
  };
  const engine::TrainSummary s = engine::run_loop(o, 0, 1, true, steps, {});
  EXPECT_EQ(trained, 0);
  EXPECT_EQ(evaluations, 1);
  ASSERT_EQ(s.evaluations.size(), 1u);
  EXPECT_EQ(s.evaluations[0], (std::pair<int64_t, double>{0, 6.25}));
  EXPECT_EQ(saved, std::vector<int64_t>{0});
}

TEST(DataLoop, FailedEvaluationKeepsTheStepsCheckpoint) {
  Workspace ws("data_loop_eval_fails");
  engine::LoopOptions o;
  o.steps = 6;
  o.eval_every = 4;
  o.checkpoint_dir = ws.path("ckpt");  // named only: the steps below write nothing there
  o.checkpoint_every = 2;
  o.log_every = 0;
  o.loss_log = ws.path("loss.jsonl");
  auto lines = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream log(read_text(o.loss_log));
    for (std::string line; std::getline(log, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  std::vector<std::pair<int64_t, size_t>> written;  // (step, loss-log lines then)
  std::map<int64_t, nlohmann::json> pending;        // what each checkpoint's manifest holds
  int evaluations = 0;
  engine::LoopSteps steps;
  steps.step = [](int64_t step) { return engine::StepRecord{step + 1, 5.0 - double(step), 1, 1}; };
  steps.checkpoint = [&](int64_t done, const nlohmann::json& p) {
    written.emplace_back(done, lines().size());
    pending[done] = p;
    return ws.path("ckpt/step-" + std::to_string(done));
  };
  steps.evaluate = [&]() -> double {
    if (++evaluations == 2) throw RuntimeError("held-out data gone");
    return 7.5;
  };
  EXPECT_THROW(engine::run_loop(o, 0, 1, true, steps, {}), RuntimeError);
  // Step 2 after its line, step 4 before its evaluation and line, step 6 before its
  // evaluation (the last step's), which failed.
  EXPECT_EQ(written, (std::vector<std::pair<int64_t, size_t>>{{2, 2}, {4, 3}, {6, 5}}));
  ASSERT_EQ(lines().size(), 5u);
  // The resume from step 6's checkpoint evaluates it again and writes its line whole.
  ASSERT_TRUE(pending.at(6).is_object());
  steps.resumed_pending = pending.at(6);
  engine::run_loop(o, 6, 1, true, steps, {});
  steps.resumed_pending = nullptr;
  const std::vector<nlohmann::json> log = lines();
  ASSERT_EQ(log.size(), 6u);
  EXPECT_EQ(log[3]["eval_loss"], 7.5);
  EXPECT_EQ(log[5]["step"], 6);
  EXPECT_EQ(log[5]["eval_loss"], 7.5);
  // A checkpoint before its step's line holds the step's record; one after it none.
  EXPECT_TRUE(pending.at(2).is_null());
  ASSERT_TRUE(pending.at(4).is_object());
  EXPECT_EQ(engine::step_record_from_json(pending.at(4)).step, 4);
  EXPECT_EQ(engine::step_record_from_json(pending.at(4)).loss, 2.0);

  // Killed during step 4's evaluation (its checkpoint written, its line not): the resumed
  // run evaluates the checkpoint again and writes the line as the run would have, then
  // goes on. The log equals an uninterrupted run's.
  {
    const std::vector<nlohmann::json> whole = lines();
    std::string cut;
    for (size_t i = 0; i < 3; ++i) cut += whole[i].dump() + "\n";
    std::ofstream(o.loss_log, std::ios::trunc) << cut;
    evaluations = 10;  // no more failures
    steps.resumed_pending = pending.at(4);
    std::ostringstream said;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(said);
    spdlog::default_logger()->sinks().push_back(sink);
    engine::run_loop(o, 4, 1, true, steps, {});
    spdlog::default_logger()->sinks().pop_back();
    EXPECT_EQ(said.str().find("the loss log ends at step"), std::string::npos) << said.str();
    const std::vector<nlohmann::json> resumed = lines();
    ASSERT_EQ(resumed.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed[i]["step"], int64_t(i + 1));
    EXPECT_EQ(resumed[3], whole[3]);  // the lost line, its held-out loss evaluated again
    EXPECT_EQ(resumed[3]["eval_loss"], 7.5);
    // With the line there (a resume that extends a finished run), nothing is evaluated
    // again and nothing written twice.
    const int before = evaluations;
    o.steps = 4;
    engine::run_loop(o, 4, 1, true, steps, {});
    EXPECT_EQ(evaluations, before);
    EXPECT_EQ(lines().size(), 4u);
    std::string all;
    for (const nlohmann::json& l : whole) all += l.dump() + "\n";
    std::ofstream(o.loss_log, std::ios::trunc) << all;
    o.steps = 6;
    steps.resumed_pending = nullptr;
  }

  // A log cut short of the checkpoint's step: kept, and the gap said.
  std::ostringstream said;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(said);
  spdlog::default_logger()->sinks().push_back(sink);
  { engine::LossLog resumed(o.loss_log, 8); }
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(lines().size(), 6u);
  EXPECT_NE(said.str().find("the loss log ends at step 6, before the checkpoint's step 8"),
            std::string::npos)
      << said.str();

  // A line that is no record, not the last: the resume stops, the log untouched (it had
  // been dropped without a word; a file that is no loss log had been emptied).
  const std::vector<nlohmann::json> six = lines();
  std::string text;
  for (size_t i = 0; i < six.size(); ++i)
    text += (i == 1 ? "{\"step\": 2, \"loss\": ," : six[i].dump()) + "\n";
  std::ofstream(o.loss_log, std::ios::trunc) << text;
  try {
    engine::LossLog resumed(o.loss_log, 4);
    ADD_FAILURE() << "a damaged line dropped";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(o.loss_log + ":2: not a loss-log line", 0), 0u)
        << e.what();
  }
  std::ifstream again(o.loss_log);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(again), {}), text);
  // The last line cut short (a kill while it was written): dropped, and said.
  text.clear();
  for (size_t i = 0; i < 4; ++i) text += six[i].dump() + "\n";
  text += "{\"step\": 5, \"lo";
  std::ofstream(o.loss_log, std::ios::trunc) << text;
  said.str("");
  spdlog::default_logger()->sinks().push_back(sink);
  { engine::LossLog resumed(o.loss_log, 5); }
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(lines().size(), 4u);
  EXPECT_NE(said.str().find(":5: the loss log's last line is no step's record"), std::string::npos)
      << said.str();
  EXPECT_NE(said.str().find("(its last line cut short): the log goes on without steps 5..5"),
            std::string::npos)
      << said.str();
  // An empty log at a checkpoint's step: the gap said too (it had been silent).
  std::ofstream(o.loss_log, std::ios::trunc).flush();
  said.str("");
  spdlog::default_logger()->sinks().push_back(sink);
  { engine::LossLog resumed(o.loss_log, 3); }
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_NE(said.str().find("the loss log has no step, before the checkpoint's step 3 (an empty "
                            "log, or another run's): the log goes on without steps 1..3"),
            std::string::npos)
      << said.str();
}

// stop_on_signal under watch_stop_signals(), as `baton train` sets it up, in a child
// process (one thread after fork, as main is): a SIGTERM sent twice at once during step 3
// ends the run after it with a checkpoint of it (one was not due) and stopped_by says
// which; a SIGTERM a second later, outside a loop, ends the process by its default action.
TEST(DataLoop, StopSignalEndsTheRunAfterTheStepWithACheckpoint) {
  Workspace ws("data_loop_stop");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    engine::watch_stop_signals();
    engine::LoopOptions o;
    o.steps = 10;
    o.checkpoint_dir = ws.path("ckpt");  // named only
    o.checkpoint_every = 100;
    o.log_every = 0;
    o.stop_on_signal = true;
    std::vector<int64_t> saved;
    engine::LoopSteps steps;
    steps.step = [](int64_t step) {
      if (step == 2) {
        ::kill(::getpid(), SIGTERM);
        ::kill(::getpid(), SIGTERM);  // at once again: a launcher signals the rank and its group
        for (int i = 0; i < 5000 && engine::stop_signal_received() == 0; ++i) ::usleep(1000);
      }
      return engine::StepRecord{step + 1, 1.0, 1, 1};
    };
    steps.checkpoint = [&](int64_t done, const nlohmann::json&) {
      saved.push_back(done);
      return ws.path("ckpt/step-" + std::to_string(done));
    };
    const engine::TrainSummary s = engine::run_loop(o, 0, 1, false, steps, {});
    const bool ok = s.stopped_by == SIGTERM && s.steps_run == 3 && saved == std::vector<int64_t>{3};
    if (!ok) ::_exit(1);
    std::ofstream(ws.path("stopped")) << "after step 3\n";  // the parent's proof of the stop
    ::usleep(1200000);            // past the second within which a repeat is the same one
    ::kill(::getpid(), SIGTERM);  // no loop runs: the default action
    ::sleep(10);
    ::_exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Without the watcher the first SIGTERM would end the child the same way: the marker
  // says the loop stopped first.
  EXPECT_TRUE(std::filesystem::exists(ws.path("stopped")))
      << "the loop did not stop after step 3 with its checkpoint";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
      << (WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status))
                            : "signal " + std::to_string(WTERMSIG(status)))
      << " (1: the loop did not stop after step 3 with its checkpoint; 2: SIGTERM outside a "
         "loop did not end the process)";
}

// The held-out file truncated in place after the first step (a tool rewriting it with
// "wb"): the evaluation at the end had died of SIGBUS (no message, no last checkpoint);
// it reads the windows held in memory since the start, and its loss is the whole file's.
// One process, and PP2 x DP2 with each rank a thread.
TEST(DataLoop, HeldOutFileTruncatedUnderTheRun) {
  Workspace ws("data_loop_truncated");
  PlanSpec p = pp2_dp2();
  plan_json(p, ws);  // writes model.json
  // Text on both sides: no background scan of the file (a scan reads it too).
  const std::string corpus = std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";
  const std::string held = ws.path("held.txt");
  RunSettings s;
  s.steps = 3;
  s.configure = [&](engine::LoopOptions& o) {
    o.data.eval_data = {held};
    o.eval_batches = 2;
  };
  auto restore = [&] {
    std::filesystem::copy_file(corpus, held, std::filesystem::copy_options::overwrite_existing);
  };
  auto truncate_after_first = [&](const engine::StepRecord& r) {
    if (r.step == 1) std::filesystem::resize_file(held, 0);
  };
  kernels::set_num_threads(1);
  engine::TrainOptions one = one_process_options(ws, s, 4, 2);
  restore();
  const std::optional<double> want = engine::run_training(one).records.back().eval_loss;
  ASSERT_TRUE(want.has_value());
  restore();
  EXPECT_EQ(engine::run_training(one, truncate_after_first).records.back().eval_loss, want);
  EXPECT_EQ(std::filesystem::file_size(held), 0u);

  restore();
  auto plan = resolve(p, ws);
  const engine::PlanTrainOptions o = train_options(ws, s);
  std::vector<engine::StepRecord> whole = run_threads(plan, o);
  restore();
  std::vector<transport::CommPtr> world = transport::make_local_world(plan->world());
  std::vector<std::optional<double>> got(size_t(plan->world()));
  std::vector<std::thread> threads;
  for (int r = 0; r < plan->world(); ++r)
    threads.emplace_back([&, r] {
      const auto on_step =
          r == 0 ? std::function<void(const engine::StepRecord&)>(truncate_after_first)
                 : std::function<void(const engine::StepRecord&)>();
      got[size_t(r)] =
          engine::train_plan(plan, o, world[size_t(r)], on_step).records.back().eval_loss;
    });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(whole.back().eval_loss.has_value());
  for (int r = 0; r < plan->world(); ++r)
    EXPECT_EQ(got[size_t(r)], whole.back().eval_loss) << "rank " << r;
}

}  // namespace
}  // namespace baton::engine_testing
