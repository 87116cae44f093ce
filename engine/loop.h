// The pieces both training loops share (the one-process reference, engine/trainer.h, and
// one rank of a plan, engine/plan_trainer.h): the options they have in common (data,
// learning-rate schedule, evaluation), the resume checks, the loss log, the progress
// line, the checkpoint and evaluation cadence and the run summary (`--summary`,
// docs/formats/summary.md). The loops differ only in what one step and one evaluation
// run; run_loop() is the loop around them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernels/mixed_precision.h"
#include "kernels/precision.h"
#include "memory/device.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/graph.h"
#include "stages/image_data.h"
#include "stages/lr_schedule.h"
#include "stages/stage.h"

namespace baton::engine {

// What both loops accept; each loop's options derive from it.
struct LoopOptions {
  // One --data argument: a token dataset (stages/data.h), a text file or an image
  // directory; data.data (several, or weighted ones: a blend) replaces it when not empty.
  std::string data_path;
  // The other data flags (--data-format, --token-dtype, --no-cross-documents,
  // --eval-data, --eval-fraction); docs/formats/data.md.
  stages::DataFlags data;
  // --lr-schedule and its steps; its peak rate is the optimizer's and its total o.steps
  // (lr_schedule_of()).
  stages::LrSchedule lr_schedule;
  int64_t eval_every = 0;    // steps between evaluations of the held-out data; 0: after the last
  int64_t eval_batches = 1;  // K: the held-out loss is the mean over the same K batches
  int64_t steps = 100;       // total steps; a resumed run continues up to this
  stages::OptimizerConfig optimizer;
  double grad_clip = 1.0;        // max global gradient norm; 0: no clipping
  uint64_t seed = 1;             // initialisation, data order and dropout
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps; 0: only at the end
  int keep_checkpoints = 0;      // keep the newest N complete checkpoints; 0: all
  bool resume = false;           // continue from the newest complete checkpoint
  int64_t log_every = 1;         // steps between progress lines; 0: none
  std::string loss_log;          // JSON lines {"step", "loss", "grad_norm", "lr"}
  std::string summary_path;      // the run's summary JSON, written at the end
  // Where the stages live (--device; a plan's "device": every rank its local GPU) and
  // the numeric precision (--precision: f32, tf32, bf16 or fp16; kernels/precision.h).
  memory::Device device = memory::Device::cpu();
  kernels::Precision precision = kernels::Precision::f32;
  // Dynamic loss scaling: fp16 runs get the scaler's defaults; set, any run scales (the
  // CPU tests scale an f32 run, where a power-of-two scale changes no bit).
  std::optional<kernels::LossScaler::Options> loss_scaling;
  // Every step's record in TrainSummary::records (a library caller's curve). `baton train`
  // keeps only what its summary needs: the records had grown by 72 bytes a step for the
  // whole run (0.7 GB over 10 M steps).
  bool keep_records = true;
  // SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C, `baton launch` stopping its
  // ranks) end the run after the step under way, with a checkpoint of it under
  // checkpoint_dir, on every rank after the same step (TrainSummary::stopped_by), where
  // the process called watch_stop_signals() (`baton train` does; elsewhere nothing
  // changes). A signal during set-up, or a second one a second or more after the first,
  // ends the process at once as before.
  bool stop_on_signal = false;
};

// The device and precision of a run checked before anything is built: RuntimeError for a
// CUDA device this process does not have ("no CUDA device" and the driver's reason: exit
// 1), InputError for a precision the device cannot run (naming both); tf32 turns on the
// CUDA GEMMs' TF32 tensor cores.
void prepare_device(const LoopOptions& o);
// The loss scaler of the run (null: no loss scaling).
std::unique_ptr<kernels::LossScaler> make_loss_scaler(const LoopOptions& o);

// What the optimizer does with a step's gradients, from their global sum of squares as
// the backward left them (multiplied by the loss scale when scaling): the unscaled norm,
// whether the step runs (not when a gradient overflowed: inf or NaN, the step is skipped
// and the scale backs off) and the factor the optimizer multiplies the gradients by
// (clipping to grad_clip, and 1 / loss scale). Updates the scaler; null: no scaling.
struct UpdateDecision {
  double grad_norm = 0;
  bool apply = true;
  double grad_scale = 1;
  double loss_scale = 0;  // the scale this step's gradients carried; 0: no scaling
};
UpdateDecision decide_update(double sum_squares, double grad_clip, kernels::LossScaler* scaler);

// The scaler's state in a checkpoint's manifest (train.loss_scale: {scale, good_steps}),
// so a resumed fp16 run continues with the same scale; nothing without a scaler. A
// resumed run with a scaler whose checkpoint has none (written in another precision)
// starts from the scaler's initial scale.
void save_loss_scale(stages::Manifest& m, const kernels::LossScaler* scaler);
void restore_loss_scale(const stages::Manifest& m, kernels::LossScaler* scaler);

struct StepRecord {
  int64_t step = 0;  // 1-based: the step just completed
  double loss = 0;
  double grad_norm = 0;
  double seconds = 0;
  double lr = 0;                    // the rate this step's update used
  std::optional<double> eval_loss;  // the held-out loss after this step, when evaluated
  double loss_scale = 0;            // the loss scale of the step (0: no loss scaling)
  bool skipped = false;             // a gradient was inf or NaN (any precision): no optimizer step
};

// Step times for the median rate in bounded memory: every step's while they fit in
// kCapacity, then every 2nd, 4th, ... step's, evenly spread over the run.
class StepTimes {
 public:
  static constexpr size_t kCapacity = size_t(1) << 16;
  void add(double seconds);
  const std::vector<double>& kept() const { return kept_; }

 private:
  std::vector<double> kept_;
  int64_t stride_ = 1, seen_ = 0;
};

struct TrainSummary {
  int64_t first_step = 0;           // steps already done when this run started (resume)
  std::vector<StepRecord> records;  // every step's, with LoopOptions::keep_records
  // What the summary reports, kept whatever keep_records says.
  int64_t steps_run = 0;
  std::optional<StepRecord> first, last;
  std::vector<std::pair<int64_t, double>> evaluations;  // step, held-out loss
  int64_t skipped_steps = 0;
  StepTimes step_seconds;  // of the steps after the first
  size_t peak_bytes = 0;   // this process's device allocator's peak during the run
  std::string last_checkpoint;
  int stopped_by = 0;  // the signal that ended the run early (install_stop_handlers), or 0
};

// An output the run writes at its end (--summary, --trace): refused at the start when
// its directory is missing or the path is a directory, not after the last step.
void check_output_path(const std::string& path, const char* flag);
// InputError naming both flags when an output among `files` (flag, path; empty paths
// skipped) is the same file as an input or another output, by resolved path (links
// followed: a hard link under another name loses nothing to a rename): `--loss-log` naming
// the --data file had replaced the training data, and two outputs under one name kept the
// second. Devices and FIFOs (/dev/null twice) and descriptors (/dev/stdout, written in
// place) are no files to lose. `outputs` counts the leading entries, which are written;
// the rest are read.
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files,
                          size_t outputs);
// The files --data and --eval-data read, by flag: a blend's paths, a Megatron prefix's
// .bin and .idx.
std::vector<std::pair<std::string, std::string>> data_files(const LoopOptions& o);
// The path a --data entry reads: PATH of a blend's WEIGHT:PATH (unless a file is named so).
std::string data_entry_path(const std::string& entry);
// InputError for options that no loop accepts (negative steps, --resume without a
// checkpoint directory, a schedule that does not fit the run, evaluation flags without
// held-out data, checkpoint flags without a directory, a --summary with no directory to go
// in).
void check_loop_options(const LoopOptions& o);
// Creates --checkpoint-dir (when given); InputError when it cannot hold checkpoints or holds
// an earlier run's without --resume. Called once the model and data are checked, so that a
// run refused for bad input leaves no directory behind.
void prepare_checkpoint_dir(const LoopOptions& o);
// A warning when --checkpoint-dir's file system has less room than one checkpoint of
// `graph` (its parameters and optimizer state in f32): a full disk had been found only at
// the first save, after the steps before it.
void warn_if_checkpoint_room_short(const LoopOptions& o, const stages::Graph& graph);

// The run's learning-rate schedule: o.lr_schedule with the optimizer's rate as its peak
// and o.steps as its total.
stages::LrSchedule lr_schedule_of(const LoopOptions& o);

// The data flags of the run, with data_path as the one --data when data.data is empty.
stages::DataFlags data_flags(const LoopOptions& o);
// True when the run reads images (an image directory); the token flags and evaluation
// (--eval-every, --eval-batches other than 1) do not apply then (InputError when one was
// given).
bool image_data(const LoopOptions& o);
// When the run is not image_data(): InputError naming --data's path when the model reads
// images (an image directory mistyped, or lacking images.npy), before the token data's
// loader would call the model wrong.
void expect_token_model(const stages::Graph& g, const LoopOptions& o);

// The log line of the data's opening: its time, and the vocabulary check started.
void log_data_opened(const stages::TrainData& d);

// What a checkpoint's manifest records of the data: the dataset (and held-out dataset)
// and the position (steps done: the next step's samples follow from it).
nlohmann::json data_manifest(const stages::TrainData& d, int64_t position);
// The same of image data: its directory, image count, image shape and classes as "train".
nlohmann::json data_manifest(const stages::ImageDataset& d, int64_t position);

// A checkpoint may resume this run when it was written for the same model and seed;
// InputError naming the manifest's field otherwise.
void check_resume(const stages::Manifest& m, const std::string& dir,
                  const nlohmann::json& model_json, const std::string& model_source, uint64_t seed);

// Warnings (a resumed run may change these; the lead rank logs them) when the checkpoint
// was written for other training data (`data`: data_manifest() of this run; the run
// continues at the checkpoint's position in the data it has now) or under a
// learning-rate schedule whose rates differ from this run's (a constant rate's run may
// be lengthened), or with another batch (`batch`: this run's samples per step), or with
// batch norm over another number of samples (`batchnorm_samples`, below: this run's), or
// at a step past --steps (nothing is trained). A $.train.batch that is no sample count is
// refused (InputError naming the manifest).
void warn_resume_changes(const stages::Manifest& m, const std::string& dir,
                         const nlohmann::json& data, const LoopOptions& o, int64_t batch,
                         int64_t batchnorm_samples);

// The plan field's name of the run's optimizer: adamw, sgd-momentum or sgd.
std::string plan_optimizer_name(const LoopOptions& o);

// The samples each batch norm of `g` normalises over, `samples` (a micro-batch, or with
// sync_batchnorm the replicas' micro-batches together), recorded in a checkpoint's
// $.train.batchnorm_samples; 0 when `g` has no batch norm.
int64_t batchnorm_samples(const stages::Graph& g, int64_t samples);

// A warning for the data-parallel state a checkpoint holds and a resumed run does not use
// (`local_sgd` / `parameter_server`: the run's dp_sync reads it): the replicas' own
// parameters and the outer optimizer of local SGD, or a parameter server's pulls in flight.
void warn_unused_dp_state(const stages::Manifest& m, const std::string& dir, bool local_sgd,
                          bool parameter_server);

// The loss log: JSON lines, one per step. A resumed run keeps the lines up to its
// checkpoint and drops any that a crashed run wrote after it, so the log is the loss
// curve of one uninterrupted run; a log that ends before the checkpoint's step (a run
// killed during the evaluation after its checkpoint) is kept with a warning. A log that
// exists but cannot be read is an InputError (its steps are not dropped). Only a regular
// file named as such is trimmed: a pipe, FIFO or terminal is appended to, never read back,
// and a descriptor (/dev/stdout, /dev/fd/N) is written through itself, at the place the
// shell's redirection has reached. A new run (start 0) replaces the log at its first line,
// not before: a run refused before any step (a bad token in its data) leaves the previous
// log whole. An empty path writes nothing.
class LossLog {
 public:
  // `restorable`: the checkpoint at `start` holds its step's record (pending_step), whose
  // line run_loop writes when the log lacks it: not warned of.
  LossLog(const std::string& path, int64_t start, bool restorable = false);
  ~LossLog();
  LossLog(const LossLog&) = delete;
  LossLog& operator=(const LossLog&) = delete;
  // {"step", "loss", "grad_norm", "lr"} and "eval_loss" when the step evaluated (null
  // where a value is not finite).
  void write(const StepRecord& r);
  // The log read back ends one step before `start`: the run stopped between the
  // checkpoint and the step's line, during its evaluation.
  bool lacks_start() const { return lacks_start_; }
  // The log was read back and holds `start`'s line (false too without a log, or for a
  // pipe, which is not read back).
  bool holds_start() const { return holds_start_; }

 private:
  void open();

  std::string path_;
  std::string keep_;      // the lines kept, written when the log is replaced
  bool replace_ = false;  // a file replaced by keep_ at the first line (else appended to)
  int given_fd_ = -1;     // the descriptor the path names (/dev/stdout), or -1
  int fd_ = -1;           // open once the first line comes
  bool lacks_start_ = false;
  bool holds_start_ = false;
};

// Blocks SIGTERM and SIGINT in the calling thread, which every thread started after
// inherits, and starts the one thread that receives them (sigwait), for
// LoopOptions::stop_on_signal. Call first thing in main, before any thread exists: a
// handler's frame pushed on a compute thread had corrupted the heap inside oneDNN's JIT
// GEMM, whose kernels point the stack pointer into the heap (oneDNN issue 4845). Signals
// the process was started ignoring stay ignored.
void watch_stop_signals();
// The stop signal the watcher has received during the running loop, or 0.
int stop_signal_received();

// While one lives (and `on`, where watch_stop_signals() set up), SIGTERM and SIGINT are
// received() for the caller to stop in order (run_loop: LoopOptions::stop_on_signal;
// `baton data prepare`), a second one a second or more later ending the process.
// `said`: what the first signal's receipt logs ("got SIGTERM: <said>") and the second's
// (a run that gave no sign had seemed to ignore the first, and the second killed it
// without a word); null says nothing.
class StopSignals {
 public:
  explicit StopSignals(bool on, const char* said = nullptr);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int received() const;

 private:
  bool on_;
};

// "SIGTERM", or "signal N".
std::string signal_text(int sig);

// A step's record as the checkpoint's manifest holds it (train.pending_step: the step's
// line is written after the checkpoint when the step evaluates), and back.
nlohmann::json step_record_json(const StepRecord& r);
StepRecord step_record_from_json(const nlohmann::json& j);
// A resumed checkpoint's train.pending_step (null: none), for LoopSteps::resumed_pending.
nlohmann::json pending_step_of(const stages::Manifest& m);

// What run_loop needs from a loop.
struct LoopSteps {
  // Runs step `step` (0-based) and returns its loss and gradient norm.
  std::function<StepRecord(int64_t step)> step;
  // Writes the checkpoint after `done` steps; returns its directory. `pending`: when the
  // checkpoint comes before the step's evaluation and loss-log line, the step's record
  // (step_record_json), for the manifest's train.pending_step; null otherwise.
  std::function<std::string(int64_t done, const nlohmann::json& pending)> checkpoint;
  // Sets the learning rate of the next step (every optimizer the loop steps).
  std::function<void(double lr)> set_lr;
  // The held-out loss of the model as it is now (empty: no held-out data).
  std::function<double()> evaluate;
  // The background check of every token of the data (stages/data.h; null: none).
  stages::VocabularyCheck* data_check = nullptr;
  // The progress line's rate: "tok/s", or "img/s" for image data (a sample per "token").
  const char* rate_unit = "tok/s";
  // On resume, the checkpoint's train.pending_step (null: none): every rank evaluates the
  // step again, as it had after the checkpoint, and the lead writes the line its log lacks.
  nlohmann::json resumed_pending;
  // Under a plan: the largest of a value over every rank (a collective; null: this rank
  // alone). After each step with the stop signal each has seen, so that all stop after the
  // same step; on resume with whether the lead's loss log lacks the pending step's line.
  std::function<int(int value)> max_over_ranks;
};

// The loop around the steps from `start` to o.steps: the schedule's rate of each step,
// the records, the check for a finite loss (RuntimeError), an evaluation every
// o.eval_every steps and after the last, the loss log, the progress line every
// o.log_every steps and at each evaluation (only where `lead`), a warning for each step
// skipped without loss scaling (a scaler's skips are routine: only logged), `on_step`, and a
// checkpoint every o.checkpoint_every steps and after the last: after the step's loss-log
// line, or, at a step that evaluates, before the evaluation (one that throws then loses no
// checkpoint; the step's line is written without its held-out loss before the error goes
// on), with the step's record, from which a run resumed there writes the line a stop
// during the evaluation lost (steps.resumed_pending). The data check's
// InputError stops the run after the step that saw it; each checkpoint, and the end of
// the run, waits for the check to pass.
TrainSummary run_loop(const LoopOptions& o, int64_t start, int64_t tokens_per_step, bool lead,
                      const LoopSteps& steps,
                      const std::function<void(const StepRecord&)>& on_step);

// The resume message: where the run continues from, or that it starts over.
void log_resume(const std::optional<std::string>& dir, int64_t step, const std::string& root);
// --resume found no usable checkpoint (latest_checkpoint: nullopt): InputError when root
// holds checkpoints all the same (damaged), which starting from step 0 would write over;
// nothing when there are none (a run that stopped before its first checkpoint).
void refuse_unusable_checkpoints(const std::string& root);

// One rank's memory for the summary: its allocator's measured peak, and the plan's
// estimate of it (-1: no estimate, the one-process loop).
struct RankPeak {
  int rank = 0;
  int64_t peak_bytes = 0;
  int64_t estimated_peak_bytes = -1;
};

// The run's summary (docs/formats/summary.md): steps, first and last loss, the loss
// log, tokens per second, every rank's peak memory (and estimate), the schedule and
// plan (empty: one process).
nlohmann::json summary_json(const LoopOptions& o, const TrainSummary& s, int64_t tokens_per_step,
                            const std::vector<RankPeak>& ranks, const std::string& schedule,
                            const std::string& plan);
// Writes it durably (memory/file_io.h) to `path`.
void write_summary(const std::string& path, const nlohmann::json& summary);

// Tokens per second of a run: the median over its steps after the first (the first
// pays for allocation and warm-up; beyond StepTimes::kCapacity steps, over steps evenly
// spread through the run); 0 without such steps.
double median_tokens_per_second(const TrainSummary& s, int64_t tokens_per_step);

}  // namespace baton::engine
