// Checkpoints under plans, each rank a thread: every rank writes its shards, rank 0 the
// manifest; a run resumed under the same plan continues bit for bit; a checkpoint
// written under one plan (or by one process) resumes under another plan (other PP, TP,
// DP, schedule; or one process) with the one-process loss curve (within 1e-5).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "engine/detail/host_agreement.h"
#include "engine/loop.h"
#include "engine_harness.h"
#include "memory/file_io.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/image_data.h"
#include "tests/child_report.h"
#include "transport/local.h"

namespace baton::engine_testing {
namespace {

PlanSpec checkpoint_gpt_plan(std::vector<int> tp, int dp, const std::string& schedule, int m) {
  PlanSpec p;
  p.model = tiny_gpt_json();
  p.tp = std::move(tp);
  p.dp = dp;
  p.schedule = schedule;
  p.micro_batches = m;
  p.micro_batch_size = 8 / (m * dp);
  return p;
}

// Runs a plan (or, with an empty tp, one process) from `from` (resume) to `to` steps.
std::vector<engine::StepRecord> checkpoint_train(const PlanSpec& p, Workspace& ws,
                                                 const std::string& ckpt, int64_t to, bool resume) {
  RunSettings s;
  s.steps = to;
  if (p.tp.empty()) {
    PlanSpec whole = p;
    whole.tp = {1};
    plan_json(whole, ws);
    engine::TrainOptions o = one_process_options(ws, s, 8, 4);
    o.checkpoint_dir = ckpt;
    o.resume = resume;
    return engine::run_training(o).records;
  }
  engine::PlanTrainOptions o = train_options(ws, s);
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 5;
  o.resume = resume;
  return run_threads(resolve(p, ws), o);
}

// A resumed run's loss log keeps the steps up to its checkpoint on disk from the moment
// it opens the log, and drops those a crashed run wrote after it: a run killed before its
// first step loses nothing (the log was truncated and rewritten through a buffer, and a
// kill right after resuming left it empty).
TEST(Checkpoint, ResumedLossLogKeepsItsStepsBeforeTheFirstNewOne) {
  Workspace ws("loss-log");
  const std::string path = ws.path("loss.jsonl");
  std::string lines;
  for (int s = 1; s <= 7; ++s) lines += "{\"step\": " + std::to_string(s) + ", \"loss\": 1.5}\n";
  memory::write_file_durably(path, lines);
  {
    engine::LossLog log(path, 5);  // resumed from the checkpoint of step 5
    const std::string on_disk = memory::read_file(path);
    EXPECT_EQ(on_disk, lines.substr(0, lines.find("{\"step\": 6")));
    engine::StepRecord r;
    r.step = 6;
    r.loss = 2.5;
    log.write(r);
  }
  const std::string after = memory::read_file(path);
  const std::string kept = lines.substr(0, lines.find("{\"step\": 6"));
  EXPECT_EQ(after.substr(0, kept.size()), kept) << after;
  const std::string next = "{\"step\": 6, \"loss\": 2.5,";
  EXPECT_EQ(after.compare(kept.size(), next.size(), next), 0) << after;
  EXPECT_EQ(std::count(after.begin(), after.end(), '\n'), 6) << after;
  // A fresh run (start 0) starts the log over at its first line; one that ends before
  // any (refused: a bad token in its data) leaves the previous log whole.
  { engine::LossLog fresh(path, 0); }
  EXPECT_EQ(memory::read_file(path), after);
  {
    engine::LossLog fresh(path, 0);
    engine::StepRecord r;
    r.step = 1;
    r.loss = 3.5;
    fresh.write(r);
  }
  const std::string fresh_log = memory::read_file(path);
  EXPECT_EQ(fresh_log.rfind("{\"step\": 1, \"loss\": 3.5,", 0), 0u) << fresh_log;
  EXPECT_EQ(std::count(fresh_log.begin(), fresh_log.end(), '\n'), 1) << fresh_log;
  // A descriptor (--loss-log /dev/stdout > file) is written through itself, where the
  // shell's other output has reached: reopened by name, the lines had overwritten it or
  // been overwritten. A held-out loss that is not finite is null, as JSON has no NaN.
  {
    const std::string shared = ws.path("shared.log");
    const int fd = ::open(shared.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "HEADER\n", 7), 7);
    {
      engine::LossLog log("/dev/fd/" + std::to_string(fd), 0);
      engine::StepRecord r;
      r.step = 1;
      r.loss = 2.5;
      r.eval_loss = std::nan("");
      log.write(r);
    }
    ASSERT_EQ(::write(fd, "FOOTER\n", 7), 7);
    ::close(fd);
    EXPECT_EQ(memory::read_file(shared),
              "HEADER\n{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 0, \"lr\": 0, \"eval_loss\": "
              "null}\nFOOTER\n");
  }
  // A log that cannot take its lines (a full disk: /dev/full) stops the run, naming it.
  engine::LossLog full("/dev/full", 0);
  engine::StepRecord r;
  r.step = 1;
  try {
    for (int i = 0; i < 1000; ++i) full.write(r);  // past the stream's buffer
    ADD_FAILURE() << "a loss log on a full device took every line";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write the loss log"), std::string::npos)
        << e.what();
  }
}

// A resumed run whose loss log is a pipe (`--loss-log /dev/stdout | cat`, a restart of a
// --max-restarts job) appends to it: reading the log back had waited for ever on the
// run's own output.
TEST(Checkpoint, AResumedLossLogOnAPipeIsAppendedToNotReadBack) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    try {
      engine::LossLog log("/dev/fd/" + std::to_string(fds[1]), 5);
      engine::StepRecord r;
      r.step = 6;
      log.write(r);
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  ::close(fds[1]);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    FAIL() << "resuming a loss log on a pipe hung";
  }
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) got.append(buf, size_t(n));
  ::close(fds[0]);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got.rfind("{\"step\": 6,", 0), 0u) << got;
}

// A resumed run whose loss log exists but cannot be read stops, naming it; it had been
// taken as empty and rewritten, its steps lost without a word. Root reads any file, so
// as root the log is opened by a child that has become nobody.
TEST(Checkpoint, AnUnreadableLossLogStopsTheResumedRun) {
  Workspace ws("loss-log-unreadable");
  const std::string path = ws.path("loss.jsonl");
  std::string lines;
  for (int s = 1; s <= 4; ++s) lines += "{\"step\": " + std::to_string(s) + ", \"loss\": 1.5}\n";
  memory::write_file_durably(path, lines);
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  ::chmod(ws.dir.c_str(), 0777);  // nobody may replace it (as the unfixed log did)
  const std::string report = testing_support::report_from_child([&]() -> std::string {
    std::string said = "skip";
    if (::geteuid() != 0 || (::setgid(65534) == 0 && ::setuid(65534) == 0)) {
      try {
        engine::LossLog log(path, 4);
        said = "accepted";
      } catch (const InputError& e) {
        said = e.what();
      }
    }
    return said;
  });
  ::chmod(path.c_str(), 0644);
  if (report == "skip") GTEST_SKIP() << "cannot become nobody";
  EXPECT_NE(report.find(path + ": cannot read the loss log"), std::string::npos) << report;
  EXPECT_NE(report.find("Permission denied"), std::string::npos) << report;
  EXPECT_EQ(memory::read_file(path), lines);
}

// Ranks of one plan started with different training flags (another --lr on one rank) all
// stop before the first step with the same error naming the rank and the flag, where they
// had trained on silently.
TEST(Checkpoint, RanksStartedWithDifferentFlagsAllStopNamingIt) {
  Workspace ws("ranks-agree");
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {1, 1};
  p.dp = 1;
  p.schedule = "1f1b";
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 2;
  const engine::PlanTrainOptions o = train_options(ws, s);
  engine::PlanTrainOptions other = o;
  other.optimizer.set_lr(o.optimizer.lr() * 10);
  std::vector<transport::CommPtr> world = transport::make_local_world(plan->world());
  ASSERT_EQ(world.size(), 2u);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        engine::train_plan(plan, r == 1 ? other : o, world[size_t(r)]);
      } catch (const InputError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    // The first differing flag in the flags' order: the rate, in the schedule.
    EXPECT_EQ(e.rfind("rank 1 was started with the learning-rate schedule (--lr-schedule", 0), 0u)
        << e;
    EXPECT_NE(e.find("\"lr\":0.03,"), std::string::npos) << e;
    EXPECT_NE(e.find("every rank of a plan takes the same training flags"), std::string::npos) << e;
  }
  // The same flags train.
  EXPECT_EQ(run_threads(plan, o).size(), 2u);

  // Another plan under the same flags and path (copies on two hosts, one with other
  // micro-batches): refused by its contents, where the job had hung in its first step.
  Workspace ws2("ranks-agree-plan");
  p.micro_batches = 2;
  p.micro_batch_size = 4;
  auto plan2 = resolve(p, ws2);
  std::vector<transport::CommPtr> world2 = transport::make_local_world(2);
  threads.clear();
  errors.assign(2, "");
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        engine::train_plan(r == 1 ? plan2 : plan, o, world2[size_t(r)]);
      } catch (const InputError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& e : errors)
    EXPECT_EQ(
        e.rfind("rank 1 was started with a plan (--plan's contents and its model's; hash)", 0), 0u)
        << e;
}

// A checkpoint directory with less room than one checkpoint is warned of at the start (a
// full disk had been found only at the first save): a model of 2^40 parameters under AdamW
// needs 12 TiB, which no test machine's temporary directory has; a small one is not warned.
TEST(Checkpoint, ARunWarnsWhenItsDirectoryCannotHoldACheckpoint) {
  engine::LoopOptions o;
  o.checkpoint_dir = ::testing::TempDir();
  stages::Graph huge, small;
  stages::Param w;
  w.name = "w";
  w.shape = w.logical_shape = {int64_t(1) << 20, int64_t(1) << 20};
  huge.params.push_back(w);
  w.shape = w.logical_shape = {4, 4};
  small.params.push_back(w);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  engine::warn_if_checkpoint_room_short(o, small);
  const std::string quiet = log.str();
  engine::warn_if_checkpoint_room_short(o, huge);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(quiet, "");
  EXPECT_NE(log.str().find("where a checkpoint of this model takes about 12.00 TiB (its "
                           "parameters and optimizer state): its first save may fail"),
            std::string::npos)
      << log.str();
}

// Batch norm normalises each micro-batch alone, so other micro-batches change the
// training where for other models they sum to the same gradient: said on resume (it had
// resumed a ResNet under other micro-batches without a word).
TEST(Checkpoint, ResumeSaysWhenBatchNormNormalisesOverOtherSamples) {
  engine::LoopOptions o;
  o.steps = 4;
  stages::Manifest m;
  m.train = {
      {"lr_schedule", engine::lr_schedule_of(o).to_json()}, {"batch", 8}, {"micro_batches", 2}};
  auto warnings = [&](int64_t samples) {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    engine::warn_resume_changes(m, "ck", nlohmann::json::object(), o, 8, samples);
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  // A manifest without the field: batch / micro_batches.
  EXPECT_EQ(warnings(4), "");
  EXPECT_EQ(warnings(0), "");  // no batch norm
  EXPECT_NE(warnings(2).find("ck/manifest.json: $.train: the checkpoint's run normalised each "
                             "batch norm over 4 samples; this run over 2"),
            std::string::npos)
      << warnings(2);
  m.train["batchnorm_samples"] = 8;  // sync_batchnorm over two replicas
  EXPECT_EQ(warnings(8), "");
  EXPECT_NE(warnings(4).find("over 8 samples; this run over 4"), std::string::npos);

  stages::Graph g;
  EXPECT_EQ(engine::batchnorm_samples(g, 4), 0);
  g.nodes.push_back(stages::Node{});
  g.nodes.back().op = "batchnorm2d";
  EXPECT_EQ(engine::batchnorm_samples(g, 4), 4);
}

// A resumed run whose optimizer flags or clipping differ from the checkpoint's says which
// it continues with (the optimizer's settings travel with its state; the clip is the run's).
TEST(Checkpoint, ResumeSaysWhichOptimizerAndClipItContinuesWith) {
  engine::LoopOptions o;
  o.steps = 4;
  o.optimizer.adamw.weight_decay = 0.5;
  o.grad_clip = 0.01;
  stages::Manifest m;
  m.optimizer.adamw.weight_decay = 0.1;
  m.train = {
      {"grad_clip", 1.0}, {"lr_schedule", engine::lr_schedule_of(o).to_json()}, {"batch", 16}};
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  engine::warn_resume_changes(m, "ckpt/step-00000002", nlohmann::json::object(), o, 8, 0);
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  // Another batch changes every step's gradient (a resume had taken it silently).
  EXPECT_NE(text.find("$.train.batch: the checkpoint's run took 16 samples a step; continuing "
                      "with 8"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ckpt/step-00000002/manifest.json: $.optimizer: the checkpoint's optimizer"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"weight_decay\":0.1"), std::string::npos) << text;
  EXPECT_NE(text.find("$.train.grad_clip: the checkpoint's run clipped at 1; continuing with "
                      "--grad-clip 0.01"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("lr_schedule"), std::string::npos) << text;  // the same schedule
  // Another model: the field that differs is named.
  const nlohmann::json gpt = {{"type", "gpt2"},    {"n_layer", 2},     {"n_head", 2},
                              {"n_positions", 16}, {"vocab_size", 64}, {"n_embd", 16}};
  m.model = gpt;
  m.seed = 1;
  nlohmann::json wider = gpt;
  wider["n_embd"] = 32;
  try {
    engine::check_resume(m, "ckpt/step-00000002", wider, "plan.json: $.model", 1);
    ADD_FAILURE() << "another model resumed";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan.json: $.model.n_embd is 32, but ckpt/step-00000002/manifest.json: $.model "
              "has 16 (the checkpoint was written for that model)");
  }
}

// A gpt2 or llama model is compared on resume as --init-from compares it: a documented
// default spelled out or another name is the same model (both were refused as "another
// model"). Other models compare their JSON, and the message says which side has no field.
TEST(Checkpoint, ResumeComparesTheModelByWhatItComputes) {
  stages::Manifest m;
  m.seed = 1;
  m.model = {{"type", "gpt2"}, {"name", "t"},      {"n_layer", 2},    {"n_head", 2},
             {"n_embd", 16},   {"n_positions", 8}, {"vocab_size", 32}};
  nlohmann::json run = m.model;
  run["name"] = "renamed";
  run["layer_norm_epsilon"] = 1e-5;
  EXPECT_NO_THROW(engine::check_resume(m, "ck", run, "model.json", 1));
  m.model = {{"type", "mlp"}, {"hidden", 16}};
  try {
    engine::check_resume(m, "ck", {{"type", "mlp"}}, "model.json", 1);
    ADD_FAILURE() << "another model resumed";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "ck/manifest.json: $.model: the checkpoint was written for another model than "
              "model.json (hidden: the checkpoint's model has 16, the run's has no such field)");
  }
}

// The training data is known by its contents: a file replaced under the same name and
// size is warned about (it had resumed silently), the same file under another name is
// not (it had warned). A manifest written before the fingerprint compares names.
TEST(Checkpoint, ResumeComparesTheDataByItsContents) {
  Workspace ws("resume-data");
  const std::string file = ws.path("tok.txt");
  memory::write_file_durably(file, std::string(64, 'a'));
  std::filesystem::create_symlink(file, ws.path("link.txt"));
  engine::LoopOptions o;
  o.steps = 4;
  stages::Manifest m;
  m.step = 2;
  m.train = {{"lr_schedule", engine::lr_schedule_of(o).to_json()}};
  stages::TrainData d;
  d.train = std::make_shared<stages::ByteDataset>(file, 4);
  m.data = engine::data_manifest(d, 2);
  ASSERT_TRUE(m.data["train"].contains("contents")) << m.data.dump();
  // The warnings of a resume with `path` as its data (and `held` out, `batches` of it).
  auto warnings = [&](const std::string& path, const std::string& held = "", int64_t batches = 1) {
    stages::TrainData now;
    now.train = std::make_shared<stages::ByteDataset>(path, 4);
    if (!held.empty()) now.eval = std::make_shared<stages::ByteDataset>(held, 4);
    o.eval_batches = batches;
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    engine::warn_resume_changes(m, "ck", engine::data_manifest(now, 2), o, 8, 0);
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  EXPECT_EQ(warnings(file), "");
  EXPECT_EQ(warnings(ws.path("link.txt")), "");
  EXPECT_EQ(warnings(ws.dir + "/./tok.txt"), "");
  memory::write_file_durably(file, std::string(64, 'b'));
  EXPECT_NE(warnings(file).find("ck/manifest.json: $.data.train: the checkpoint was written for"),
            std::string::npos);
  // An old manifest: no fingerprint, no warning for one; the names are compared.
  m.data["train"].erase("contents");
  EXPECT_EQ(warnings(ws.dir + "/./tok.txt"), "");
  EXPECT_NE(warnings(ws.path("link.txt")).find("$.data.train"), std::string::npos);

  // Other held-out data or batches: the held-out losses change series (it had been silent).
  const std::string held = ws.path("held.txt"), other = ws.path("other.txt");
  memory::write_file_durably(held, std::string(64, 'c'));
  memory::write_file_durably(other, std::string(64, 'd'));
  d.eval = std::make_shared<stages::ByteDataset>(held, 4);
  m.data = engine::data_manifest(d, 2);
  m.train["eval_batches"] = 1;
  ASSERT_TRUE(m.data["eval"].contains("contents")) << m.data.dump();
  EXPECT_EQ(warnings(file, held), "");
  EXPECT_NE(warnings(file, other)
                .find("ck/manifest.json: $.data.eval: the checkpoint's run "
                      "held out"),
            std::string::npos);
  EXPECT_NE(warnings(file, held, 3)
                .find("$.train.eval_batches: the checkpoint's run averaged 1 "
                      "held-out batches; continuing with --eval-batches 3"),
            std::string::npos);
}

// An image directory is known by its files' contents too: `d/`, `d` and `./d` are one
// directory (each had warned), the same name over other images is not (it had not).
TEST(Checkpoint, ResumeComparesImageDataByItsContents) {
  Workspace ws("resume-images");
  const std::string dir = ws.path("d");
  std::filesystem::copy(std::string(BATON_SOURCE_DIR) + "/examples/data/digits", dir);
  engine::LoopOptions o;
  o.steps = 4;
  stages::Manifest m;
  m.step = 2;
  m.train = {{"lr_schedule", engine::lr_schedule_of(o).to_json()}};
  m.data = engine::data_manifest(stages::ImageDataset(dir + "/"), 2);
  auto warnings = [&](const std::string& path) {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    engine::warn_resume_changes(m, "ck", engine::data_manifest(stages::ImageDataset(path), 2), o, 8,
                                0);
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  EXPECT_EQ(warnings(dir), "");
  EXPECT_EQ(warnings(ws.dir + "/./d"), "");
  std::string labels = memory::read_file(dir + "/labels.npy");
  std::swap(labels[labels.size() - 1], labels[labels.size() - 9]);  // two labels swapped
  ASSERT_NE(labels, memory::read_file(dir + "/labels.npy"));
  memory::write_file_durably(dir + "/labels.npy", labels);
  EXPECT_NE(warnings(dir).find("ck/manifest.json: $.data.train: the checkpoint was written for"),
            std::string::npos);
  // An old manifest, without the fingerprint: the names, a trailing slash aside.
  m.data["train"].erase("contents");
  EXPECT_EQ(warnings(dir), "");
}

// A manifest's batch that is no sample count is refused, naming the field: "two" or 4.5
// had skipped the warning above without a word.
TEST(Checkpoint, ResumeRefusesABatchThatIsNoCount) {
  engine::LoopOptions o;
  o.steps = 4;
  stages::Manifest m;
  for (const nlohmann::json& bad :
       {nlohmann::json("two"), nlohmann::json(4.5), nlohmann::json(0), nlohmann::json(nullptr)}) {
    m.train = {{"lr_schedule", engine::lr_schedule_of(o).to_json()}, {"batch", bad}};
    try {
      engine::warn_resume_changes(m, "ckpt/step-00000002", nlohmann::json::object(), o, 8, 0);
      ADD_FAILURE() << "batch " << bad.dump() << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("ckpt/step-00000002/manifest.json: $.train.batch: "
                                           "expected the samples a step (an integer >= 1), found"),
                std::string::npos)
          << e.what();
    }
  }
}

// --steps is the run's total: a checkpoint past it leaves nothing to train, and the run
// says so (it had ended at once, exit 0, without a word).
TEST(Checkpoint, ResumePastStepsSaysNothingIsTrained) {
  engine::LoopOptions o;
  o.steps = 7;
  stages::Manifest m;
  m.step = 10;
  m.train = {{"lr_schedule", engine::lr_schedule_of(o).to_json()}};
  auto warnings = [&]() {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    engine::warn_resume_changes(m, "ckpt/step-00000010", nlohmann::json::object(), o, 8, 0);
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  std::string text = warnings();
  EXPECT_NE(text.find("ckpt/step-00000010: the checkpoint is at step 10, past --steps 7 (the "
                      "run's total steps, not the steps to add): nothing is trained; give "
                      "--steps above 10 to continue"),
            std::string::npos)
      << text;
  o.steps = 10;  // a finished run resumed again (a restart): nothing to say
  m.train = {{"lr_schedule", engine::lr_schedule_of(o).to_json()}};
  text = warnings();
  EXPECT_EQ(text.find("past --steps"), std::string::npos) << text;
}

// A path that is not UTF-8 (baton train refuses them; a library caller may not) does not
// make the summary throw nlohmann's raw type_error after the run: it shows as U+FFFD.
TEST(Checkpoint, ASummaryWithANonUtf8PathIsWritten) {
  Workspace ws("summary-utf8");
  engine::LoopOptions o;
  o.loss_log = "log-\xff.jsonl";
  const std::string path = ws.path("run.json");
  engine::write_summary(path, engine::summary_json(o, engine::TrainSummary{}, 8, {}, "", ""));
  const nlohmann::json back = nlohmann::json::parse(memory::read_file(path));
  EXPECT_EQ(back["loss_log"], "log-\xef\xbf\xbd.jsonl");
}

// What a run checks of its checkpoint directory before its first step: checkpoint flags
// without one, a fresh run into a directory holding an earlier run's checkpoints (which
// its pruning would delete and --resume would later continue), a --resume whose
// checkpoints are all damaged (starting over would write over them), a --summary with no
// directory to go in.
TEST(Checkpoint, TheCheckpointDirectoryIsCheckedBeforeTheFirstStep) {
  Workspace ws("ckpt-start");
  auto error_of = [](const engine::LoopOptions& o) {
    try {
      engine::check_loop_options(o);
      engine::prepare_checkpoint_dir(o);  // after the model and data, in a run
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  engine::LoopOptions o;
  o.steps = 4;
  o.checkpoint_every = 2;
  EXPECT_EQ(error_of(o), "--checkpoint-every and --keep-checkpoints need --checkpoint-dir");
  o.checkpoint_dir = ws.path("ckpt");
  EXPECT_EQ(error_of(o), "");
  EXPECT_TRUE(std::filesystem::is_directory(o.checkpoint_dir));
  o.keep_checkpoints = -1;
  EXPECT_EQ(error_of(o).substr(0, 40), "--keep-checkpoints: expected a count >= ");
  o.keep_checkpoints = 0;
  // An earlier run's checkpoint: a fresh run is refused, --resume takes it.
  const std::string step2 = stages::checkpoint_dir(o.checkpoint_dir, 2);
  std::filesystem::create_directories(step2);
  memory::write_file_durably(step2 + "/manifest.json", "{}");
  EXPECT_EQ(error_of(o), "--checkpoint-dir " + o.checkpoint_dir +
                             " holds the checkpoints of an earlier run (the newest: " + step2 +
                             "): give --resume to continue it, or another --checkpoint-dir");
  o.resume = true;
  EXPECT_EQ(error_of(o), "");
  // ... which finds it unreadable: refused, not started over.
  EXPECT_FALSE(stages::latest_checkpoint(o.checkpoint_dir));
  try {
    engine::refuse_unusable_checkpoints(o.checkpoint_dir);
    ADD_FAILURE() << "damaged checkpoints written over";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--resume: no checkpoint in " + o.checkpoint_dir +
                                         " is complete and undamaged"),
              std::string::npos)
        << e.what();
  }
  // An incomplete one only (no manifest: a run killed in its first save) starts over.
  std::filesystem::remove(step2 + "/manifest.json");
  EXPECT_NO_THROW(engine::refuse_unusable_checkpoints(o.checkpoint_dir));
  o.resume = false;
  EXPECT_EQ(error_of(o), "");
  o.summary_path = ws.path("no/such/dir/summary.json");
  EXPECT_EQ(error_of(o), "--summary " + o.summary_path + ": no directory " +
                             ws.path("no/such/dir") + " to write it in");
  // The loss log is checked as the summary is, at the start on every rank (under a plan
  // only rank 0 had found it, after the rendezvous, and said no more than "cannot open").
  o.summary_path.clear();
  o.loss_log = ws.path("no/such/dir/loss.jsonl");
  EXPECT_EQ(error_of(o), "--loss-log " + o.loss_log + ": no directory " + ws.path("no/such/dir") +
                             " to write it in");
  o.loss_log = ws.path("");
  EXPECT_NE(error_of(o).find(": a directory, expected a file"), std::string::npos) << error_of(o);
  // Inside a checkpoint folder that the first save would make: the folder is made now
  // (it had been refused as "no directory").
  o.checkpoint_dir = ws.path("fresh/ck/");
  o.loss_log = ws.path("fresh/ck/loss.jsonl");
  o.summary_path = ws.path("fresh/ck/summary.json");
  EXPECT_EQ(error_of(o), "");
  EXPECT_TRUE(std::filesystem::is_directory(ws.path("fresh/ck")));
  // Beside it, not in it: still refused, nothing made.
  o.summary_path.clear();
  o.loss_log = ws.path("fresh/other/loss.jsonl");
  EXPECT_EQ(error_of(o), "--loss-log " + o.loss_log + ": no directory " + ws.path("fresh/other") +
                             " to write it in");
  EXPECT_FALSE(std::filesystem::exists(ws.path("fresh/other")));
}

// A --summary in a folder the run cannot write (a read-only mount) is refused before the
// first step; it had been found only after the last. The mount is made in a child's own
// mount namespace.
TEST(Checkpoint, ASummaryThatCannotBeWrittenIsRefusedAtTheStart) {
  Workspace ws("summary-ro");
  const std::string ro = ws.path("ro");
  std::filesystem::create_directories(ro);
  const std::string report = testing_support::report_from_child([&]() -> std::string {
    std::string said = "skip";
    if (::unshare(CLONE_NEWNS) == 0 &&
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        ::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k") == 0) {
      engine::LoopOptions o;
      o.summary_path = ro + "/summary.json";
      try {
        engine::check_output_path(o.summary_path, "--summary");
        said = "accepted";
      } catch (const InputError& e) {
        said = e.what();
      }
      // Through a symbolic link: the target's folder is the one written (the link's own
      // folder had been checked).
      const std::string link = ws.path("summary-link.json");
      std::filesystem::create_symlink(ro + "/summary.json", link);
      try {
        engine::check_output_path(link, "--summary");
        said += "|accepted";
      } catch (const InputError& e) {
        said += std::string("|") + e.what();
      }
    }
    return said;
  });
  if (report == "skip")
    GTEST_SKIP() << "no mount namespace here (needs root) for a read-only mount";
  EXPECT_EQ(report, "--summary " + ro + "/summary.json: cannot write in " + ro +
                        ": Read-only file system|--summary " + ws.path("summary-link.json") +
                        ": cannot write in " + ro +
                        " (the target of the link): Read-only file system");
}

// A --summary that is a link to a file in a folder that does not exist, or a link loop.
TEST(Checkpoint, ASummaryLinkIsCheckedWhereItPoints) {
  Workspace ws("summary-link");
  const std::string link = ws.path("sum.json");
  std::filesystem::create_symlink(ws.path("nowhere") + "/sum.json", link);
  try {
    engine::check_output_path(link, "--summary");
    ADD_FAILURE() << "a link into a folder that does not exist accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--summary " + link + ": no directory " + ws.path("nowhere") +
                                         " to write it in (the target of the link)");
  }
  std::filesystem::create_symlink("loop.json", ws.path("loop.json"));
  try {
    engine::check_output_path(ws.path("loop.json"), "--summary");
    ADD_FAILURE() << "a link loop accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link loop"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SamePlanResumesBitForBit) {
  Workspace ws("ckpt");
  PlanSpec p = checkpoint_gpt_plan({2, 2}, 2, "zb-v", 2);
  std::vector<engine::StepRecord> whole = checkpoint_train(p, ws, ws.path("a"), 20, false);
  std::vector<engine::StepRecord> first = checkpoint_train(p, ws, ws.path("b"), 10, false);
  // Every rank's files are listed in the manifest of the last complete checkpoint.
  auto dir = stages::latest_checkpoint(ws.path("b"));
  ASSERT_TRUE(dir.has_value());
  stages::Manifest m = stages::read_manifest(*dir);
  EXPECT_EQ(m.step, 10);
  std::set<int> writers;
  for (const auto& s : m.shards) writers.insert(s.rank);
  // Replica 0 writes (ranks 0-3); tensor-parallel rank 1 of each stage holds shards.
  EXPECT_EQ(writers, (std::set<int>{0, 1, 2, 3}));
  std::vector<engine::StepRecord> rest = checkpoint_train(p, ws, ws.path("b"), 20, true);
  ASSERT_EQ(first.size(), 10u);
  ASSERT_EQ(rest.size(), 10u);
  for (size_t i = 0; i < 20; ++i) {
    const engine::StepRecord& r = i < 10 ? first[i] : rest[i - 10];
    EXPECT_EQ(r.step, whole[i].step);
    EXPECT_EQ(r.loss, whole[i].loss) << "step " << i + 1;
    EXPECT_EQ(r.grad_norm, whole[i].grad_norm) << "step " << i + 1;
  }
}

// A run of no steps with a checkpoint directory writes the initial weights as step 0
// (it had written nothing, silently), one process and under a plan; resuming from it is
// the run that never stopped.
TEST(Checkpoint, NoStepsWriteTheInitialWeights) {
  Workspace ws("ckpt-zero");
  for (const PlanSpec& p :
       {checkpoint_gpt_plan({}, 1, "1f1b", 2), checkpoint_gpt_plan({1, 1}, 1, "1f1b", 2)}) {
    const std::string tag = p.tp.empty() ? "one" : "plan";
    SCOPED_TRACE(tag);
    std::vector<engine::StepRecord> whole = checkpoint_train(p, ws, ws.path(tag + "-a"), 3, false);
    EXPECT_TRUE(checkpoint_train(p, ws, ws.path(tag + "-b"), 0, false).empty());
    auto dir = stages::latest_checkpoint(ws.path(tag + "-b"));
    ASSERT_TRUE(dir.has_value());
    EXPECT_EQ(stages::read_manifest(*dir).step, 0);
    std::vector<engine::StepRecord> rest = checkpoint_train(p, ws, ws.path(tag + "-b"), 3, true);
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest[i].loss, whole[i].loss) << "step " << i + 1;
  }
}

struct Pair {
  PlanSpec before, after;  // empty tp: one process
};

TEST(Checkpoint, ResumesUnderAnotherPlan) {
  PlanSpec one;
  one.model = tiny_gpt_json();
  one.tp.clear();
  std::vector<Pair> pairs = {
      {checkpoint_gpt_plan({2, 2}, 2, "1f1b", 2),
       checkpoint_gpt_plan({1, 1, 1, 1}, 1, "interleaved-1f1b", 4)},
      {checkpoint_gpt_plan({1, 1, 1, 1}, 1, "interleaved-1f1b", 4),
       checkpoint_gpt_plan({2}, 2, "gpipe", 2)},
      {one, checkpoint_gpt_plan({2, 2}, 1, "zb-v", 4)},
      {checkpoint_gpt_plan({2, 1, 2}, 1, "1f1b", 4), one},
  };
  for (const Pair& pr : pairs) {
    Workspace ws("ckpt");
    std::string what = (pr.before.tp.empty() ? std::string("one process") : pr.before.describe()) +
                       " -> " +
                       (pr.after.tp.empty() ? std::string("one process") : pr.after.describe());
    SCOPED_TRACE(what);
    std::printf("%s\n", what.c_str());
    RunSettings s;
    std::vector<engine::StepRecord> want =
        run_reference(checkpoint_gpt_plan({1}, 1, "1f1b", 4), ws, s);
    std::vector<engine::StepRecord> a = checkpoint_train(pr.before, ws, ws.path("ckpt"), 10, false);
    std::vector<engine::StepRecord> b = checkpoint_train(pr.after, ws, ws.path("ckpt"), 20, true);
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    for (size_t i = 0; i < 20; ++i) {
      const engine::StepRecord& r = i < 10 ? a[i] : b[i - 10];
      EXPECT_EQ(r.step, int64_t(i + 1));
      EXPECT_NEAR(r.loss, want[i].loss, 1e-5 * want[i].loss) << "step " << i + 1;
      EXPECT_NEAR(r.grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm) << "step " << i + 1;
    }
  }
}

// Runs `f(rank, world)` on two thread ranks; each rank's InputError message, or "".
std::vector<std::string> two_ranks(const std::function<void(int, transport::Communicator&)>& f) {
  std::vector<transport::CommPtr> world = transport::make_local_world(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r, *world[size_t(r)]);
      } catch (const InputError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Hosts that do not share files: each rank reads its own checkpoint directory of the
// same name. A host whose directory holds another run's checkpoint at the step rank 0
// resumes from is refused on every rank (it had resumed from it silently); identical
// copies resume.
TEST(Checkpoint, ResumeRefusesAHostWhoseCheckpointIsAnotherRuns) {
  Workspace ws("resume-other-run");
  const std::string mine = ws.path("host-a"), copy = ws.path("host-b"), other = ws.path("host-c");
  checkpoint_train(checkpoint_gpt_plan({1, 1}, 1, "1f1b", 2), ws, mine, 5, false);
  std::filesystem::copy(mine, copy, std::filesystem::copy_options::recursive);
  std::filesystem::copy(mine, other, std::filesystem::copy_options::recursive);
  const std::string step_dir = stages::checkpoint_dir(other, 5);
  stages::Manifest m = stages::read_manifest(step_dir);
  m.seed += 1;  // another run's, at the same step
  stages::write_manifest(step_dir, m);

  std::vector<int64_t> steps(2, -1);
  auto resume = [&](const std::string& rank1_dir) {
    return two_ranks([&](int r, transport::Communicator& c) {
      steps[size_t(r)] = engine::detail::agree_on_checkpoint(c, r == 0 ? mine : rank1_dir);
    });
  };
  for (const std::string& e : resume(copy)) EXPECT_EQ(e, "");
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 5}));
  for (const std::string& e : resume(other)) {
    EXPECT_EQ(e.rfind("--resume: rank 1 (host ", 0), 0u) << e;
    // Each rank names the path as it was given (on hosts, the same for all).
    EXPECT_NE(e.find("/step-00000005/manifest.json as crc32:"), std::string::npos) << e;
    EXPECT_NE(e.find("the checkpoint directory must be one file system every rank sees"),
              std::string::npos)
        << e;
    EXPECT_EQ(e.find("identical copies"), std::string::npos) << e;  // refused at start-up
  }
  std::filesystem::remove_all(stages::checkpoint_dir(other, 5));
  for (const std::string& e : resume(other))
    EXPECT_NE(e.find(" as none where"), std::string::npos) << e;
}

// A --checkpoint-dir that is not one directory for every rank (the same name on hosts
// that do not share files) is refused at start-up on every rank, where the first save
// had failed (exit 1, and --max-restarts retrained each time).
TEST(Checkpoint, ACheckpointDirectoryNotSharedIsRefusedAtTheStart) {
  Workspace ws("ckpt-not-shared");
  const std::string a = ws.path("a"), b = ws.path("b");
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  for (const std::string& e : two_ranks([&](int, transport::Communicator& c) {
         engine::detail::check_checkpoint_dir_shared(c, a);
       }))
    EXPECT_EQ(e, "");
  EXPECT_TRUE(std::filesystem::is_empty(a));  // the probe is gone
  for (const std::string& e : two_ranks([&](int r, transport::Communicator&c) {
         engine::detail::check_checkpoint_dir_shared(c, r == 0 ? a : b);
       })) {
    EXPECT_EQ(e.rfind("--checkpoint-dir ", 0), 0u) << e;
    EXPECT_NE(e.find(": rank 1 (host "), std::string::npos) << e;
    EXPECT_NE(e.find("the directory is not shared"), std::string::npos) << e;
  }
  EXPECT_TRUE(std::filesystem::is_empty(a));
}

// --data (and --eval-data, --init-from) are compared by their files' contents as well as
// by path: other files under one path on two hosts had trained on mismatched inputs and
// targets silently.
TEST(Checkpoint, RanksReadingOtherContentsUnderOnePathAllStop) {
  Workspace ws("same-contents");
  const std::string a = ws.path("a.bin"), copy = ws.path("copy.bin"), other = ws.path("other.bin"),
                    longer = ws.path("longer.bin");
  std::string bytes(10000, 'x');
  memory::write_file_durably(a, bytes);
  memory::write_file_durably(copy, bytes);
  bytes[9990] = 'y';  // in the last 4 KiB
  memory::write_file_durably(other, bytes);
  memory::write_file_durably(longer, bytes + "z");
  auto check = [&](const std::string& rank1) {
    return two_ranks([&](int r, transport::Communicator& c) {
      engine::detail::check_same_contents(c, "--data", {r == 0 ? a : rank1});
    });
  };
  for (const std::string& e : check(copy)) EXPECT_EQ(e, "");
  for (const std::string& rank1 : {other, longer})
    for (const std::string& e : check(rank1)) {
      EXPECT_EQ(e.rfind("--data ", 0), 0u) << e;
      EXPECT_NE(e.find(": rank 1 reads other contents under that path (1 file, " +
                       std::to_string(rank1 == longer ? 10001 : 10000) + " bytes"),
                std::string::npos)
          << e;
      EXPECT_NE(e.find("than rank 0 (1 file, 10000 bytes"), std::string::npos) << e;
    }
  EXPECT_EQ(engine::detail::contents_identity(ws.path("none")), "missing");
  // A FIFO is refused, not opened: opening it had waited for a writer, and every rank of a
  // plan with `--data FIFO` hung for ever.
  ASSERT_EQ(::mkfifo(ws.path("fifo").c_str(), 0600), 0);
  try {
    engine::detail::contents_identity(ws.path("fifo"));
    ADD_FAILURE() << "a FIFO was hashed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(ws.path("fifo") + ": cannot open file (not a regular "
                                                           "file: a FIFO)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace baton::engine_testing
