#include "engine/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "engine/detail/staged_inputs.h"
#include "memory/cuda_device.h"
#include "memory/input_staging.h"
#include "memory/units.h"
#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"
#include "partitioner/fusion.h"
#include "partitioner/resolved_plan.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/evaluation.h"
#include "stages/hf.h"
#include "stages/image_data.h"
#include "stages/json_reader.h"
#include "stages/model.h"

namespace baton::engine {

using memory::Tensor;

namespace {

// One process runs its micro-batches as a one-rank 1F1B plan does (a forward and its
// backward each, then the step), so that plan's estimate is its peak (0.0-0.2% above the
// measured one at 1-4 micro-batches, with and without recompute: docs/engine.md).
int64_t estimated_peak(const TrainOptions& o, const std::shared_ptr<const stages::Graph>& graph) {
  partitioner::Plan p;
  p.source = "baton train";
  p.device = o.device.is_cuda() ? "cuda" : "cpu";
  p.devices = 1;
  p.dp = 1;
  p.pp = 1;
  p.tp = {1};
  p.schedule = "1f1b";
  p.micro_batches = int(o.micro_batches);
  p.micro_batch_size = o.batch / o.micro_batches;
  p.global_batch = o.batch;
  p.optimizer = plan_optimizer_name(o);
  p.optimizer_stated = true;
  partitioner::PlanStage whole;
  whole.first_layer = 0;
  whole.last_layer = graph->num_layers();
  for (int l : o.recompute_layers) whole.recompute_names.push_back(graph->layers[size_t(l)].name);
  p.stages = {whole};
  const partitioner::ResolvedPlan r = partitioner::resolve_plan(p, graph);
  partitioner::CostModel model(graph, partitioner::Machine{});
  // Its inputs: made at each forward on a CPU (no loader's queue: a ResNet's estimate had
  // been a micro-batch of images over, 26% at 32 x 32), staged one ahead on a GPU.
  partitioner::EvaluateOptions eval;
  eval.input_loader = o.device.is_cuda();
  eval.input_ahead = 1;
  return partitioner::evaluate_plan(r, model, eval).ranks.at(0).peak;
}

// A cap below the estimate is refused before the weights are allocated, as a plan over
// its cap is, rather than failing in the first step, after the loading, with an
// allocator's message.
void check_capacity(const TrainOptions& o, int64_t peak) {
  const size_t cap = memory::allocator_for(o.device).stats().capacity;
  if (cap == 0 || peak <= int64_t(cap)) return;
  throw InputError("--device-memory " + memory::format_bytes(double(cap)) +
                   ": the run's estimated peak is " + memory::format_bytes(double(peak)) +
                   " (parameters, gradients, optimizer state and a micro-batch's activations); "
                   "give more --micro-batches or --recompute layers, or split the model over "
                   "devices (`baton plan --model M --devices N --device-memory " +
                   std::to_string(cap) + "`)");
}

}  // namespace

TrainSummary run_training(const TrainOptions& o,
                          const std::function<void(const StepRecord&)>& on_step) {
  if (o.micro_batches <= 0)
    throw InputError("--micro-batches: expected at least 1, found " +
                     std::to_string(o.micro_batches));
  if (o.batch <= 0 || o.batch % o.micro_batches != 0)
    throw InputError("--batch " + std::to_string(o.batch) +
                     " must be a positive multiple of "
                     "--micro-batches " +
                     std::to_string(o.micro_batches));
  // The bound a plan's micro_batch_size has: past it a micro-batch's element count had
  // overflowed in an internal check, exit 1.
  if (o.batch / o.micro_batches > (int64_t(1) << 24))
    throw InputError("--batch " + std::to_string(o.batch) + " in --micro-batches " +
                     std::to_string(o.micro_batches) + " makes micro-batches of " +
                     std::to_string(o.batch / o.micro_batches) +
                     " samples: expected at most 16777216, as a plan's micro_batch_size");
  // Before check_loop_options, which would ask image data for held-out data it cannot have.
  const bool image_input = image_data(o);
  check_loop_options(o);
  check_distinct_files(
      {{"--summary", o.summary_path}, {"--loss-log", o.loss_log}, {"--model", o.model_path}}, 2);
  prepare_device(o);

  // ---- the checkpoint to resume from, before the model: one found holds the weights
  // and (without --model) the model, so --init-from's directory is not read at all. An
  // existing directory is locked first; a missing one holds none and is made further down,
  // once the inputs are good.
  std::optional<stages::CheckpointRootLock> held;
  std::optional<std::string> resume_dir;
  std::optional<stages::Manifest> resume_manifest;
  std::error_code dir_ec;
  const bool checkpoint_dir_there = std::filesystem::is_directory(o.checkpoint_dir, dir_ec);
  // A missing directory is a first run; one that cannot be looked at (a link loop, no
  // search permission) had leaked a bare "filesystem error", exit 1.
  if (o.resume && dir_ec && dir_ec != std::errc::no_such_file_or_directory &&
      dir_ec != std::errc::not_a_directory)
    throw InputError("--checkpoint-dir " + o.checkpoint_dir + ": " + dir_ec.message() +
                     ", expected a directory to resume from (or none yet)");
  if (o.resume && checkpoint_dir_there) {
    held.emplace(o.checkpoint_dir);
    resume_dir = stages::latest_checkpoint(o.checkpoint_dir);
    if (resume_dir)
      resume_manifest = stages::read_manifest(*resume_dir);
    else
      refuse_unusable_checkpoints(o.checkpoint_dir);
  }
  const bool init_from = !o.init_from.empty() && !resume_dir;

  // ---- the model ----
  nlohmann::json model_json;
  std::string model_source = o.model_path;
  if (!o.model_path.empty()) {
    model_json = stages::read_json_file(o.model_path);
  } else if (!o.init_from.empty() && resume_manifest) {
    model_json = resume_manifest->model;  // the one DIR/config.json gave the first run
    model_source = *resume_dir + "/manifest.json: $.model";
  } else if (!o.init_from.empty()) {
    model_json = stages::read_hf_model_config(o.init_from);
    model_source = o.init_from + "/config.json";
  } else {
    throw InputError("--model is required (or --init-from a Hugging Face directory)");
  }
  if (init_from && !o.model_path.empty())
    stages::check_hf_model_matches(model_json, model_source, o.init_from);
  // The directory's stop ids (generation_config.json's over config.json's), kept in each
  // checkpoint for generate and export; a resumed run keeps its checkpoint's.
  std::optional<std::vector<int32_t>> stop_ids;
  if (resume_manifest)
    stop_ids = stages::checkpoint_eos_token_ids(*resume_manifest, *resume_dir + "/manifest.json");
  else if (!o.init_from.empty())  // a resumed run does not read the directory
    stop_ids = stages::hf_eos_token_ids(o.init_from);
  stages::LoadOptions lo;
  // Mixed precision: the model's floating values (activations, working weights) in the
  // precision's 16-bit type, the masters and optimizer state in f32 (StageOptions).
  const memory::DType compute = kernels::compute_dtype(o.precision);
  if (compute != memory::DType::f32 && o.float_dtype != memory::DType::f32)
    throw InputError("--precision " + std::string(kernels::precision_name(o.precision)) +
                     " needs an f32 model");
  lo.float_dtype = compute != memory::DType::f32 ? compute : o.float_dtype;
  // With the fused kernels (partitioner/fusion.h), as a plan's ranks run it.
  std::shared_ptr<stages::Graph> graph =
      partitioner::fuse_kernels(stages::load_model_json(model_json, model_source, lo));
  if (o.steps > 0) stages::check_loss_trains(*graph, model_source);
  // A directory with images.npy is image data (images + labels); anything else is a token
  // dataset (stages/data.h: Megatron, flat tokens, text, blends), checked against the
  // model's vocabulary.
  std::optional<stages::ImageDataset> images;
  stages::TrainData data;
  if (image_input) {
    images.emplace(o.data_path);
    images->check_model(*graph, model_source);
  } else {
    expect_token_model(*graph, o);
    data = stages::open_train_data(data_flags(o), *graph, model_source);
  }
  for (int l : o.recompute_layers)
    if (l >= graph->num_layers())
      throw InputError("--recompute: layer " + std::to_string(l) +
                       " does not exist (the model has " + std::to_string(graph->num_layers()) +
                       " layers)");
  // For the summary's estimated_peak_bytes too (the cost model walks every op: only when
  // asked for).
  const bool capped = memory::allocator_for(o.device).stats().capacity > 0;
  const int64_t estimate = capped || !o.summary_path.empty() ? estimated_peak(o, graph) : -1;
  check_capacity(o, estimate);
  // The weights' names, dtypes and shapes from their headers, before the Stage allocates
  // and initialises every parameter config.json asks for (possibly far more than them).
  if (init_from)
    stages::check_hf_weights(o.init_from, *graph, graph->params_used(0, graph->num_layers()));
  prepare_checkpoint_dir(o);  // the model and data are good: no directory left on bad input
  warn_if_checkpoint_room_short(o, *graph);
  if (!o.checkpoint_dir.empty() && !held) held.emplace(o.checkpoint_dir);
  const stages::ValueType& tok_type = graph->value(images ? "images" : "tokens").type;
  const stages::ValueType& tgt_type = graph->value(images ? "labels" : "targets").type;
  const int64_t T = images ? 1 : tok_type.shape[0];  // tokens (or images) per sample
  const bool per_position = !images && !tgt_type.shape.empty();
  // The windows every evaluation reads, in memory from the start (stages/data.h).
  if (data.eval)
    data.eval = stages::hold_evaluation_windows(data.eval, o.seed, o.eval_batches, o.batch, T);

  auto& alloc = memory::allocator_for(o.device);
  alloc.reset_peak();

  stages::StageOptions so;
  so.device = o.device;
  so.seed = o.seed;
  if (compute != memory::DType::f32) so.master_dtype = memory::DType::f32;
  so.recompute_layers = o.recompute_layers;
  stages::Stage stage(graph, 0, graph->num_layers(), so);
  stage.set_optimizer(o.optimizer);
  if (init_from) stages::load_hf_weights(o.init_from, stage);

  std::unique_ptr<kernels::LossScaler> scaler = make_loss_scaler(o);
  int64_t start = 0;
  if (o.resume) {
    const std::optional<std::string>& dir = resume_dir;
    if (dir) {
      const stages::Manifest& m = *resume_manifest;
      check_resume(m, *dir, model_json, model_source, o.seed);
      warn_resume_changes(m, *dir,
                          images ? data_manifest(*images, m.step) : data_manifest(data, m.step), o,
                          o.batch, batchnorm_samples(*graph, o.batch / o.micro_batches));
      warn_unused_dp_state(m, *dir, false, false);
      stages::load_stage(*dir, m, stage, true);  // the loop sets each step's rate
      start = m.step;
      restore_loss_scale(m, scaler.get());
    }
    log_resume(dir, start, o.checkpoint_dir);
  }
  spdlog::info(
      "model {}: {} layers, {:.3f} M parameters; data {}; batch {} x {} "
      "{} in {} micro-batch(es); {} steps",
      graph->name, graph->num_layers(), double(graph->num_parameters()) / 1e6,
      images ? o.data_path + " (" + std::to_string(images->size()) + " images)"
             : data.train->describe(),
      o.batch, T, images ? "image" : "tokens", o.micro_batches, o.steps);
  if (data.eval) spdlog::info("held-out data {}", data.eval->describe());
  if (!images) log_data_opened(data);

  if (o.device.is_cuda() || o.precision != kernels::Precision::f32)
    spdlog::info("device {}, precision {}{}", o.device.str(), kernels::precision_name(o.precision),
                 scaler ? fmt::format(", loss scale {:g}", scaler->scale()) : std::string());
  const int64_t mb_size = o.batch / o.micro_batches;
  const double loss_tokens = double(o.batch * (per_position ? T : 1));
  // One micro-batch's inputs on the host, by name.
  auto load = [&](int64_t step, const stages::MicroBatch& mb) {
    Tensor tokens = images ? Tensor::empty(tok_type.with_batch(mb_size), tok_type.dtype)
                           : Tensor::empty({mb_size, T}, tok_type.dtype);
    Tensor targets = per_position ? Tensor::empty({mb_size, T}, tgt_type.dtype)
                                  : Tensor::empty({mb_size}, tgt_type.dtype);
    if (images) {
      images->fill(o.seed, step, mb.sample_offset, mb_size, tokens, targets);
      return stages::TensorMap{{"images", tokens}, {"labels", targets}};
    }
    data.train->fill(o.seed, step, mb.sample_offset, mb_size, tokens, targets);
    return stages::TensorMap{{"tokens", tokens}, {"targets", targets}};
  };
  // On a GPU, micro-batch k + 1 is staged (pinned buffer, copy stream) before k's forward
  // is queued, so its copy runs under k's work.
  std::unique_ptr<detail::StagedInputs> staged;
  if (o.device.is_cuda()) {
    const int device = o.device.index;
    staged = std::make_unique<detail::StagedInputs>(
        [device] { return memory::cuda_staging_backend(device); }, 2);
  }

  LoopSteps steps;
  if (images) steps.rate_unit = "img/s";
  // The reference step: every micro-batch through the one Stage, then clipping and the
  // optimizer step.
  steps.step = [&](int64_t step) {
    auto t0 = std::chrono::steady_clock::now();
    stage.zero_grad();
    std::vector<Tensor> losses;  // on the stage's device until the step reads them
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    auto micro_batch = [&](int64_t k) {
      return stages::MicroBatch{k, k * mb_size, mb_size, o.batch, loss_tokens, step, loss_scale};
    };
    int64_t ticket = -1;
    for (int64_t k = 0; k < o.micro_batches; ++k) {
      const stages::MicroBatch mb = micro_batch(k);
      stages::TensorMap in;
      if (staged) {
        if (k == 0) ticket = staged->stage(load(step, mb));
        in = staged->take(ticket);
        if (k + 1 < o.micro_batches) ticket = staged->stage(load(step, micro_batch(k + 1)));
      } else {
        in = load(step, mb);
      }
      stages::TensorMap out = stage.forward(mb, in);
      losses.push_back(out.at("loss"));
      stage.backward(k);
    }
    stage.finish_grads();
    // The norm's kernels queue right behind the backward and the update right behind them:
    // it derives its clip and loss scale from the norm on the device. On a GPU the norm and
    // the losses are copied to pinned memory ahead of the update and the host waits for
    // those copies only, so the next step's kernels queue while the update runs.
    const Tensor norm2_on_device = stage.grad_sum_squares_tensor();
    std::vector<Tensor> read = losses;  // then the norm; on the host after the wait
    read.push_back(norm2_on_device);
    std::optional<memory::cuda::Event> copied;
    if (o.device.is_cuda()) {
      const memory::cuda::StreamHandle stream = memory::cuda::current_stream(o.device.index);
      for (Tensor& t : read) {
        Tensor host = memory::cuda::pinned_empty(t.shape(), t.dtype());
        memory::cuda::copy_async(host, t, stream);
        t = host;
      }
      copied.emplace(o.device.index);
      copied->record(stream);
    }
    stage.step(kernels::GradScale(norm2_on_device, o.grad_clip, scaler ? scaler->scale() : 0.0));
    if (copied) copied->synchronize();
    const double norm2 = read.back().to_vector<double>()[0];
    read.pop_back();
    double loss = 0;
    for (const Tensor& l : read) loss += l.to_vector<double>()[0];
    const UpdateDecision d = decide_update(norm2, o.grad_clip, scaler.get());
    // A skipped update changed nothing; its count is taken back (run_loop warns).
    if (!d.apply) stage.set_optimizer_steps(stage.optimizer_steps() - 1);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepRecord r{step + 1, loss, d.grad_norm, secs};
    r.loss_scale = d.loss_scale;
    r.skipped = !d.apply;
    return r;
  };
  steps.checkpoint = [&](int64_t done, const nlohmann::json& pending) {
    stages::Manifest m;
    m.step = done;
    m.seed = o.seed;
    m.model = model_json;
    m.data = images ? data_manifest(*images, done) : data_manifest(data, done);
    m.train = {{"batch", o.batch},
               {"micro_batches", o.micro_batches},
               {"grad_clip", o.grad_clip},
               {"steps", o.steps},
               {"lr_schedule", lr_schedule_of(o).to_json()}};
    if (stop_ids) m.train["eos_token_ids"] = *stop_ids;
    if (data.eval) m.train["eval_batches"] = o.eval_batches;
    if (const int64_t n = batchnorm_samples(*graph, o.batch / o.micro_batches); n > 0)
      m.train["batchnorm_samples"] = n;
    if (!pending.is_null()) m.train["pending_step"] = pending;
    save_loss_scale(m, scaler.get());
    std::string dir = stages::save_checkpoint(o.checkpoint_dir, stage, m);
    stages::prune_checkpoints(o.checkpoint_dir, o.keep_checkpoints, done);
    return dir;
  };
  steps.set_lr = [&](double lr) { stage.optimizer().set_lr(lr); };
  steps.data_check = data.check.get();
  if (start > 0 && resume_manifest) steps.resumed_pending = pending_step_of(*resume_manifest);
  if (data.eval)
    steps.evaluate = [&] {
      return stages::evaluate_loss(stage, *data.eval,
                                   {o.eval_batches, o.batch, o.micro_batches, o.seed});
    };

  const int64_t tokens_per_step = o.batch * T;
  TrainSummary summary = run_loop(o, start, tokens_per_step, true, steps, on_step);
  summary.peak_bytes = alloc.stats().peak;
  spdlog::info("peak device memory {}", memory::format_bytes(double(summary.peak_bytes)));
  if (!o.summary_path.empty())
    write_summary(o.summary_path,
                  summary_json(o, summary, tokens_per_step,
                               {{0, int64_t(summary.peak_bytes), estimate}}, "", ""));
  return summary;
}

}  // namespace baton::engine
