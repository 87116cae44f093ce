#include "engine/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "memory/units.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/json_reader.h"
#include "stages/model.h"

namespace baton::engine {

namespace {

using Clock = std::chrono::steady_clock;
using namespace stages;  // the Stage, its graph, data and checkpoints

std::string duration_str(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

// The model's inputs must be byte tokens and targets that byte-level data can fill.
void check_byte_model(const Graph& g, const std::string& source) {
  int tok = g.find_value("tokens"), tgt = g.find_value("targets");
  if (tok < 0 || tgt < 0 || g.inputs.size() != 2)
    throw InputError(source + ": $.inputs: expected exactly the inputs 'tokens' and 'targets' "
                     "(byte-level data), found " + std::to_string(g.inputs.size()) + " input(s)");
  const ValueType& t = g.values[size_t(tok)].type;
  const ValueType& y = g.values[size_t(tgt)].type;
  bool ints = !memory::is_floating(t.dtype) && !memory::is_floating(y.dtype);
  if (!ints || t.shape.size() != 1 || !(y.shape == t.shape || y.shape.empty()))
    throw InputError(source + ": $.inputs: expected tokens [T] and targets [T] or [] of integer "
                     "type, found tokens " + type_str(t) + " and targets " + type_str(y));
  for (const Node& n : g.nodes) {
    if (n.op == "embedding" && n.inputs[0] == tok) {
      int64_t rows = g.params[size_t(n.params[0])].logical_shape[0];
      if (rows < 256)
        throw InputError(source + ": " + n.json_path + ": byte-level data needs a vocabulary of at "
                         "least 256, the embedding has " + std::to_string(rows) + " rows");
    }
    if (n.op == "cross_entropy") {
      int64_t v = g.values[size_t(n.inputs[0])].type.shape.back();
      if (v < 256)
        throw InputError(source + ": " + n.json_path + ": byte-level targets need at least 256 "
                         "classes, the logits have " + std::to_string(v));
    }
  }
}

}  // namespace

TrainSummary run_training(const TrainOptions& o,
                          const std::function<void(const StepRecord&)>& on_step) {
  if (o.batch <= 0 || o.micro_batches <= 0 || o.batch % o.micro_batches != 0)
    throw InputError("--batch " + std::to_string(o.batch) + " must be a positive multiple of "
                     "--micro-batches " + std::to_string(o.micro_batches));
  if (o.steps < 0) throw InputError("--steps must be >= 0");
  if (o.resume && o.checkpoint_dir.empty())
    throw InputError("--resume needs --checkpoint-dir");

  // ---- the model ----
  nlohmann::json model_json;
  std::string model_source = o.model_path;
  if (!o.model_path.empty()) {
    model_json = read_json_file(o.model_path);
  } else if (!o.init_from.empty()) {
    model_json = read_hf_config(o.init_from);
    model_source = o.init_from + "/config.json";
  } else {
    throw InputError("--model is required (or --init-from a Hugging Face directory)");
  }
  LoadOptions lo;
  lo.float_dtype = o.float_dtype;
  auto graph = std::make_shared<Graph>(load_model_json(model_json, model_source, lo));
  check_byte_model(*graph, model_source);
  for (int l : o.recompute_layers)
    if (l >= graph->num_layers())
      throw InputError("--recompute: layer " + std::to_string(l) + " does not exist (the model has " +
                       std::to_string(graph->num_layers()) + " layers)");
  const ValueType& tok_type = graph->value("tokens").type;
  const ValueType& tgt_type = graph->value("targets").type;
  const int64_t T = tok_type.shape[0];
  const bool per_position = !tgt_type.shape.empty();

  ByteDataset data(o.data_path, T);
  auto& alloc = memory::allocator_for(memory::Device::cpu());
  alloc.reset_peak();

  StageOptions so;
  so.seed = o.seed;
  so.recompute_layers = o.recompute_layers;
  Stage stage(graph, 0, graph->num_layers(), so);
  stage.set_optimizer(o.optimizer);
  if (!o.init_from.empty()) load_hf_gpt2(o.init_from, stage);

  TrainSummary summary;
  int64_t start = 0;
  if (o.resume) {
    if (auto dir = latest_checkpoint(o.checkpoint_dir)) {
      Manifest m = read_manifest(*dir);
      if (m.model != model_json)
        throw InputError(*dir + "/manifest.json: $.model: the checkpoint was written for another "
                         "model than " + model_source);
      if (m.seed != o.seed)
        throw InputError(*dir + "/manifest.json: $.seed: expected the run's --seed " +
                         std::to_string(o.seed) + ", found " + std::to_string(m.seed));
      load_stage(*dir, m, stage, true);
      stage.optimizer().set_lr(o.optimizer.lr());  // a resumed run may change the rate
      start = m.step;
      spdlog::info("resumed from {} (step {})", *dir, start);
    } else {
      spdlog::info("no complete checkpoint in {}; starting from step 0", o.checkpoint_dir);
    }
  }
  summary.first_step = start;

  std::ofstream loss_log;
  if (!o.loss_log.empty()) {
    // A resumed run keeps the lines up to its checkpoint and drops any a crashed run
    // wrote after it, so the log is the loss curve of one uninterrupted run.
    std::vector<std::string> keep;
    if (start > 0) {
      std::ifstream old(o.loss_log);
      std::string line;
      while (std::getline(old, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("step") &&
            j["step"].is_number_integer() && j["step"].get<int64_t>() <= start)
          keep.push_back(line);
      }
    }
    loss_log.open(o.loss_log, std::ios::trunc);
    for (const std::string& line : keep) loss_log << line << "\n";
    if (!loss_log) throw InputError(o.loss_log + ": cannot open for writing (--loss-log)");
  }
  spdlog::info("model {}: {} layers, {:.3f} M parameters; data {} ({} bytes); batch {} x {} "
               "tokens in {} micro-batch(es); {} steps",
               graph->name, graph->num_layers(), double(graph->num_parameters()) / 1e6,
               o.data_path, data.size(), o.batch, T, o.micro_batches, o.steps);

  const int64_t mb_size = o.batch / o.micro_batches;
  const double loss_tokens = double(o.batch * (per_position ? T : 1));
  Tensor tokens = Tensor::empty({mb_size, T}, tok_type.dtype);
  Tensor targets = per_position ? Tensor::empty({mb_size, T}, tgt_type.dtype)
                                : Tensor::empty({mb_size}, tgt_type.dtype);
  double ema_step = 0;
  auto manifest_for = [&](int64_t step) {
    Manifest m;
    m.step = step;
    m.seed = o.seed;
    m.model = model_json;
    m.data = {{"position", step}, {"file", o.data_path}, {"bytes", data.size()}};
    m.train = {{"batch", o.batch}, {"micro_batches", o.micro_batches}, {"grad_clip", o.grad_clip},
               {"steps", o.steps}};
    return m;
  };

  for (int64_t step = start; step < o.steps; ++step) {
    auto t0 = Clock::now();
    stage.zero_grad();
    double loss = 0;
    for (int64_t k = 0; k < o.micro_batches; ++k) {
      MicroBatch mb{k, k * mb_size, mb_size, o.batch, loss_tokens, step};
      data.fill(o.seed, step, mb.sample_offset, mb_size, tokens, targets);
      TensorMap out = stage.forward(mb, {{"tokens", tokens}, {"targets", targets}});
      loss += out.at("loss").to_vector<double>()[0];
      stage.backward(k);
    }
    stage.finish_grads();
    double norm = std::sqrt(stage.grad_sum_squares());
    double scale = (o.grad_clip > 0 && norm > o.grad_clip) ? o.grad_clip / norm : 1.0;
    stage.step(scale);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();

    StepRecord rec{step + 1, loss, norm, secs};
    summary.records.push_back(rec);
    if (!std::isfinite(loss)) throw RuntimeError("loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1));
    ema_step = ema_step == 0 ? secs : 0.9 * ema_step + 0.1 * secs;
    if (loss_log) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "{\"step\": %lld, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g}\n",
                    static_cast<long long>(step + 1), loss, norm, stage.optimizer().lr());
      loss_log << buf << std::flush;
    }
    if (o.log_every > 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps || step == start))
      spdlog::info("step {:>6}/{} | loss {:.4f} | grad norm {:.3f} | {:>8.0f} tok/s | {:.0f} ms/step | {} left",
                   step + 1, o.steps, loss, norm, double(o.batch * T) / secs, secs * 1e3,
                   duration_str(ema_step * double(o.steps - step - 1)));
    if (on_step) on_step(rec);
    bool last = step + 1 == o.steps;
    if (!o.checkpoint_dir.empty() &&
        (last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0))) {
      summary.last_checkpoint = save_checkpoint(o.checkpoint_dir, stage, manifest_for(step + 1));
      prune_checkpoints(o.checkpoint_dir, o.keep_checkpoints);
      spdlog::info("checkpoint {}", summary.last_checkpoint);
    }
  }
  summary.peak_bytes = alloc.stats().peak;
  spdlog::info("peak device memory {}", memory::format_bytes(double(summary.peak_bytes)));
  return summary;
}

}  // namespace baton::engine
