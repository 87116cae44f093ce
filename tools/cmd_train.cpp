// `baton train`: trains a model from a token dataset (Megatron's indexed format, flat
// token files, byte-level text, weighted blends) or image data, on one process, or under
// a plan (--plan) as one rank of a job that `baton launch` (or mpirun, srun) started; with
// a learning-rate schedule and evaluation on held-out data.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "engine/plan_trainer.h"
#include "engine/trainer.h"
#include "kernels/ops.h"
#include "kernels/precision.h"
#include "memory/allocator.h"
#include "memory/cuda_device.h"
#include "memory/device_budget.h"
#include "memory/error.h"
#include "memory/units.h"
#include "partitioner/layout.h"
#include "partitioner/plan.h"
#include "stages/stage.h"
#include "tools/command.h"
#include "transport/launch.h"
#include "transport/nccl_communicator.h"
#include "transport/options.h"
#include "transport/staged.h"
#include "transport/world.h"

namespace baton::tools {
namespace {

// A value outside the range a flag is defined on: InputError naming the flag, the range
// and the value.
void check_flag_range(const char* flag, double value, bool ok, const std::string& expected) {
  if (!ok)
    throw InputError(std::string("--") + flag + ": expected " + expected + ", found " +
                     fmt::format("{}", value));
}

// The optimizer's hyper-parameters, before anything is built (on every rank of a plan):
// out of range they had run (beta 1 is NaN from step 2, --lr inf wrote "lr": inf into
// the loss log, a negative --grad-clip meant off) or failed at the first step (a negative
// momentum had no buffer). torch.optim takes the same ranges, but for momentum, which
// it bounds only below: at 1 or more a gradient is never forgotten.
void check_optimizer_flags(double lr, double beta1, double beta2, double eps, double momentum,
                           double weight_decay, double grad_clip) {
  check_flag_range("lr", lr, lr > 0 && lr <= stages::kMaxOptimizerRate, "a rate in (0, 1e6]");
  check_flag_range("beta1", beta1, beta1 >= 0 && beta1 < 1, "a value in [0, 1)");
  check_flag_range("beta2", beta2, beta2 >= 0 && beta2 < 1, "a value in [0, 1)");
  // torch takes 0 too, where a parameter whose gradients were all 0 divides 0 by 0.
  check_flag_range("eps", eps, eps > 0 && eps <= 1, "a value in (0, 1]");
  check_flag_range("momentum", momentum, momentum >= 0 && momentum < 1, "a value in [0, 1)");
  check_flag_range("weight-decay", weight_decay,
                   weight_decay >= 0 && weight_decay <= stages::kMaxOptimizerRate,
                   "a value in [0, 1e6]");
  check_flag_range("grad-clip", grad_clip, std::isfinite(grad_clip) && grad_clip >= 0,
                   "a finite norm >= 0 (0: off)");
}

int run_train(const std::vector<std::string>& args) {
  po::options_description opts("options");
  engine::TrainOptions o;
  std::string optimizer, device_memory, recompute, plan, schedule_file, trace, device, precision;
  std::vector<std::string> data;
  std::string lr_schedule, seed = "1";
  bool no_cross_documents = false;
  int64_t trace_steps = 1;
  double bucket_mib = 4;
  double lr = 0, weight_decay = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0;
  opts.add_options()("model", po::value(&o.model_path),
                     "model JSON (general graph, gpt2, llama, mlp or resnet shorthand, or a "
                     "Hugging Face config.json)")(
      "data", po::value(&data)->multitoken()->required(),
      "training data: a Megatron dataset (PREFIX, PREFIX.bin or PREFIX.idx), a flat token file "
      "(.bin), any other file (one token per byte), a blend 0.7:a 0.3:b, or a directory with "
      "images.npy and labels.npy")("data-format", po::value(&o.data.format)->default_value("auto"),
                                   "auto, megatron, tokens or text")(
      "token-dtype", po::value(&o.data.token_dtype),
      "flat token files: uint16 (default), uint32, or uint8, int8, int16, int32, int64")(
      "no-cross-documents", po::bool_switch(&no_cross_documents),
      "keep every sample window inside one document")(
      "eval-data", po::value(&o.data.eval_data)->multitoken(),
      "held-out data (same formats and blends as --data)")(
      "eval-fraction", po::value(&o.data.eval_fraction)->default_value(0.0),
      "hold out this share of --data's documents")(
      "eval-every", po::value(&o.eval_every)->default_value(0),
      "steps between evaluations of the held-out data (0: after the last step)")(
      "eval-batches", po::value(&o.eval_batches)->default_value(1),
      "batches the held-out loss averages (the same ones every time)")(
      "steps", po::value(&o.steps)->default_value(100), "total training steps")(
      "batch", po::value(&o.batch)->default_value(8), "samples per step")(
      "micro-batches", po::value(&o.micro_batches)->default_value(1),
      "micro-batches per step (divides --batch)")("lr", po::value(&lr)->default_value(1e-3),
                                                  "learning rate (the peak of --lr-schedule)")(
      "lr-schedule", po::value(&lr_schedule)->default_value("constant"),
      "constant, cosine, linear or wsd (warm-up, stable, decay)")(
      "warmup-steps", po::value(&o.lr_schedule.warmup)->default_value(0),
      "steps of linear warm-up to --lr")(
      "decay-steps", po::value(&o.lr_schedule.decay)->default_value(0),
      "steps of decay after warm-up (0: the remaining steps; wsd: --decay-fraction)")(
      "min-lr", po::value(&o.lr_schedule.min_lr)->default_value(0.0),
      "the rate the decay ends at (its last step's)")(
      "decay-fraction", po::value(&o.lr_schedule.decay_fraction)->default_value(0.1, "0.1"),
      "wsd: the last share of the steps that decays")("weight-decay",
                                                      po::value(&weight_decay)->default_value(0.0),
                                                      "weight decay of matrices, >= 0: "
                                                      "decoupled for adamw (torch.optim.AdamW), "
                                                      "an L2 term added to the gradient before "
                                                      "the momentum for sgd (torch.optim.SGD)")(
      "optimizer", po::value(&optimizer)->default_value("adamw"), "adamw or sgd")(
      "beta1", po::value(&beta1)->default_value(0.9, "0.9"), "adamw: beta1, in [0, 1)")(
      "beta2", po::value(&beta2)->default_value(0.999), "adamw: beta2, in [0, 1)")(
      "eps", po::value(&eps)->default_value(1e-8, "1e-8"),
      "adamw: the term added to the second moment's root, in (0, 1]")(
      "momentum", po::value(&momentum)->default_value(0.0),
      "sgd: momentum, in [0, 1) (torch.optim.SGD takes 1 and more too)")(
      "nesterov", po::bool_switch(), "sgd: Nesterov momentum (needs --momentum > 0)")(
      "grad-clip", po::value(&o.grad_clip)->default_value(1.0),
      "max global gradient norm (0: off)")("seed", po::value(&seed)->default_value("1"),
                                           "seed of initialisation, data order and dropout, in "
                                           "[0, 2^64)")(
      "checkpoint-dir", po::value(&o.checkpoint_dir),
      "directory for checkpoints (with --steps 0: the initial weights, as step 0)")(
      "checkpoint-every", po::value(&o.checkpoint_every)->default_value(0),
      "steps between checkpoints (0: at the end)")("keep-checkpoints",
                                                   po::value(&o.keep_checkpoints)->default_value(0),
                                                   "keep only the newest N checkpoints (0: all)")(
      "resume", po::bool_switch(&o.resume), "continue from the newest complete checkpoint")(
      "init-from", po::value(&o.init_from),
      "a Hugging Face directory (config.json + safetensors: GPT-2, the LLaMA family) to start "
      "from; with --plan, each rank reads only its own layers and blocks")(
      "device", po::value(&device)->default_value("cpu"),
      "cpu, cuda or cuda:N (a plan names its own: its \"device\" field)")(
      "precision", po::value(&precision)->default_value("f32"),
      "f32, tf32, bf16 or fp16 (bf16/fp16: f32 master weights and optimizer state, fp16 with "
      "dynamic loss scaling; tf32, bf16 and fp16 need a CUDA device)")(
      "device-memory", po::value(&device_memory), "cap on the device's memory, e.g. 512MiB")(
      "recompute", po::value(&recompute), "layers whose activations are recomputed, e.g. 1,2,3")(
      "log-every", po::value(&o.log_every)->default_value(1),
      "steps between progress lines (0: none, but at evaluations)")(
      "loss-log", po::value(&o.loss_log), "write JSON lines {step, loss, grad_norm, lr} here")(
      "summary", po::value(&o.summary_path),
      "write the run's summary JSON here at the end (docs/formats/summary.md)")(
      "plan", po::value(&plan),
      "train under this plan (one process per rank: run under baton launch)")(
      "schedule", po::value(&schedule_file),
      "with --plan: a schedule file to run instead of the plan's generator")(
      "trace", po::value(&trace),
      "with --plan: write the measured timeline of the last steps (Chrome trace JSON)")(
      "trace-steps", po::value(&trace_steps)->default_value(1),
      "with --trace: how many of the last steps")(
      "bucket-mib", po::value(&bucket_mib)->default_value(4.0),
      "with --plan: gradient all-reduce bucket size in MiB, up to 1048576 (1 TiB)");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton train --model M --data PATH [options]\n"
                  "       baton launch -n N -- baton train --plan plan.json --data PATH [options]",
                  opts, vm))
    return 0;
  apply_common_options(vm);
  check_path_flags(vm, {"model", "trace"});
  // --schedule is recorded too: the plan's shared flags, compared across ranks as JSON.
  check_path_flags(vm,
                   {"data", "eval-data", "checkpoint-dir", "init-from", "loss-log", "summary",
                    "plan", "schedule"},
                   /*recorded=*/true);
  // Read as unset when empty: --device-memory "" had trained uncapped.
  check_value_flags(vm, {"device-memory", "token-dtype"});
  // Given on the command line, not left at its default.
  auto given = [&vm](const char* flag) { return vm.count(flag) && !vm[flag].defaulted(); };
  check_optimizer_flags(lr, beta1, beta2, eps, momentum, weight_decay, o.grad_clip);
  o.seed = parse_uint64_option("--seed", seed);
  if (o.log_every < 0)
    throw InputError(
        "--log-every: expected a step count >= 0 (0: no progress lines but at "
        "evaluations), found " +
        std::to_string(o.log_every));
  if (given("trace-steps") && trace.empty())
    throw InputError("--trace-steps needs --trace (the timeline it sets the length of)");
  // One --data is data_path (an image directory, too); several (a blend) are o.data.data.
  if (data.size() == 1)
    o.data_path = data[0];
  else
    o.data.data = data;
  o.data.cross_documents = !no_cross_documents;
  o.lr_schedule.kind = stages::parse_lr_schedule(lr_schedule);
  // wsd's alone, as --momentum is sgd's, and wsd's default length: beside another schedule
  // or --decay-steps it had changed nothing.
  if (given("decay-fraction") && o.lr_schedule.kind != stages::LrSchedule::Kind::wsd)
    throw InputError("--decay-fraction is wsd's, but --lr-schedule is " + lr_schedule +
                     (o.lr_schedule.kind == stages::LrSchedule::Kind::constant
                          ? std::string(" (no decay)")
                          : std::string(" (its decay's length is --decay-steps)")));
  if (given("decay-fraction") && o.lr_schedule.decay > 0)
    throw InputError("--decay-fraction and --decay-steps: expected one of them, found both");
  // A constant rate has no decay: its length and final rate had been accepted, changing
  // nothing.
  for (const char* flag : {"decay-steps", "min-lr"})
    if (given(flag) && o.lr_schedule.kind == stages::LrSchedule::Kind::constant)
      throw InputError(std::string("--") + flag +
                       " sets the decay of cosine, linear and wsd, but --lr-schedule is constant "
                       "(no decay)");
  // --eval-batches 1 (its default) given without held-out data had been accepted, any other
  // count refused (engine/loop.cpp tells only the value). Image data has no evaluation,
  // said first: the advice to add held-out data is one it refuses.
  if (given("eval-batches") && engine::image_data(o))
    throw InputError("--eval-batches: evaluation is for token data");
  if (given("eval-batches") && o.data.eval_data.empty() && !(o.data.eval_fraction > 0))
    throw InputError("--eval-batches needs held-out data (--eval-data PATH or --eval-fraction F)");

  o.precision = kernels::parse_precision(precision);
  // The device: the flag's for one process; a plan's "device" field (each rank the GPU of
  // its local rank). A CUDA device this process lacks fails here (exit 1), before any
  // file is read or rank is joined.
  const transport::LaunchEnv env = transport::read_launch_env();
  std::optional<partitioner::Plan> plan_doc;
  if (plan.empty()) {
    o.device = memory::parse_device(device, "--device");
  } else {
    if (!vm["device"].defaulted())
      throw InputError(
          "--device does not go with --plan (the plan's \"device\" field: \"cpu\" or "
          "\"cuda\", each rank the GPU of its local rank)");
    plan_doc = partitioner::read_plan(plan);
    // More ranks than cores: each core gets ranks of every pipeline rank.
    if (const partitioner::Layout layout = partitioner::plan_layout(*plan_doc);
        layout.world() == env.size)
      transport::bind_dealt(layout.core_deal_order()[size_t(env.rank)], env);
    // NCCL: one process per GPU. UCX: ranks may share GPUs (local ranks round the GPUs).
    if (plan_doc->device == "cuda") {
      const int gpus = plan_doc->transport_of() == "ucx" ? memory::cuda::device_count() : 0;
      o.device = memory::Device::cuda(gpus > 0 ? env.local_rank % gpus : env.local_rank);
    }
  }
  // The flag's own values first: a plan's disagreement is no answer to a misspelt value.
  if (optimizer != "adamw" && optimizer != "sgd")
    throw InputError("--optimizer: expected adamw or sgd, found '" + optimizer + "'" +
                     (optimizer == "sgd-momentum"
                          ? " (sgd with --momentum is the plan field's \"sgd-momentum\")"
                          : ""));
  // A plan that names its optimizer was checked for that optimizer's state: it trains with
  // it (--optimizer may only agree, and the momentum must match sgd or sgd-momentum).
  if (plan_doc && plan_doc->optimizer_stated) {
    const std::string& want = plan_doc->optimizer;
    const std::string kind = want == "adamw" ? "adamw" : "sgd";
    const std::string where = plan_doc->where("$.optimizer");
    if (given("optimizer") && optimizer != kind)
      throw InputError("--optimizer " + optimizer + ": the plan trains with \"" + want + "\" (" +
                       where + "), whose state its memory estimate holds");
    optimizer = kind;
    if (want == "sgd" && momentum != 0)
      throw InputError("--momentum: the plan's optimizer is \"sgd\" (" + where +
                       "), without momentum state; \"sgd-momentum\" keeps one");
    if (want == "sgd-momentum" && momentum == 0)
      throw InputError("--momentum: the plan's optimizer is \"sgd-momentum\" (" + where +
                       "): give its momentum (e.g. --momentum 0.9)");
  }
  // A flag of the other optimizer had been ignored without a word (a plan's "sgd" refuses
  // --momentum above).
  const std::string trains_with = plan_doc && plan_doc->optimizer_stated
                                      ? "the plan trains with \"" + plan_doc->optimizer + "\" (" +
                                            plan_doc->where("$.optimizer") + ")"
                                      : "this run trains with " + optimizer;
  const bool nesterov = vm["nesterov"].as<bool>();
  if (optimizer == "adamw")
    for (const char* flag : {"momentum", "nesterov"})
      if (given(flag))
        throw InputError(std::string("--") + flag + " is sgd's, but " + trains_with +
                         " (its first moment's decay is --beta1)");
  if (optimizer == "sgd")
    for (const char* flag : {"beta1", "beta2", "eps"})
      if (given(flag))
        throw InputError(std::string("--") + flag + " is adamw's, but " + trains_with +
                         " (its one state is --momentum)");
  // As torch.optim.SGD: Nesterov's look-ahead is of the momentum (it had been no flag).
  if (nesterov && momentum == 0)
    throw InputError("--nesterov: needs a momentum (--momentum > 0), found none");
  if (optimizer == "adamw") {
    o.optimizer.kind = stages::OptimizerConfig::Kind::adamw;
    o.optimizer.adamw = kernels::AdamW{lr, beta1, beta2, eps, weight_decay};
  } else {
    o.optimizer.kind = stages::OptimizerConfig::Kind::sgd;
    o.optimizer.sgd = kernels::Sgd{lr, momentum, weight_decay, nesterov};
  }
  memory::cuda::require_device(o.device);
  // Under --plan the device is the plan's (--device is refused there): name its field.
  if (plan_doc && o.precision != kernels::Precision::f32 && !o.device.is_cuda())
    throw InputError("--precision " + std::string(kernels::precision_name(o.precision)) +
                     ": needs a CUDA device (the plan's ranks run on " + o.device.str() +
                     ", which computes in f32 only; use --precision f32 or the plan's \"device\": "
                     "\"cuda\", " +
                     plan_doc->where("$.device") + ")");
  kernels::check_precision(o.precision, o.device);
  // The cap: --device-memory, or the plan's device memory (each rank, as its estimate
  // assumed); on a GPU checked against its free memory first.
  size_t cap = device_memory.empty() ? (plan_doc ? size_t(plan_doc->device_memory) : 0)
                                     : parse_bytes_option("--device-memory", device_memory);
  if (o.device.is_cuda())
    memory::reserve_device_memory(
        o.device, cap, device_memory.empty() ? "the plan's device_memory" : "--device-memory");
  else if (cap > 0)
    memory::allocator_for(o.device).set_capacity(cap);
  if (vm.count("recompute"))
    for (int64_t l :
         parse_int_list(recompute, "--recompute", 0, INT32_MAX, "layer indices like 1,2,3"))
      o.recompute_layers.insert(int(l));
  o.keep_records = false;   // the summary's figures are kept apart, in bounded memory
  o.stop_on_signal = true;  // a preemption's SIGTERM ends the run with a checkpoint
  // A rank that `baton launch --max-restarts` restarted resumes as with --resume.
  if (transport::resume_requested() && !o.resume) {
    if (o.checkpoint_dir.empty())
      spdlog::warn(
          "restarted (BATON_RESUME=1) without --checkpoint-dir: starting again from step 0");
    o.resume = !o.checkpoint_dir.empty();
  }
  if (plan.empty()) {
    for (const char* flag : {"schedule", "trace", "bucket-mib"})
      if (given(flag)) throw InputError(std::string("--") + flag + " needs --plan");
    const engine::TrainSummary summary = engine::run_training(o);
    return summary.stopped_by != 0 ? 128 + summary.stopped_by : 0;
  }
  for (const char* flag : {"model", "recompute"})
    if (vm.count(flag))
      throw InputError(std::string("--") + flag +
                       " does not go with --plan (the plan names the model and its recompute)");
  if (!vm["batch"].defaulted() || !vm["micro-batches"].defaulted())
    throw InputError("--batch and --micro-batches do not go with --plan (the plan sets the batch)");
  // In bytes a size_t: a larger value (1e20, inf) had cast to a meaningless size.
  check_flag_range("bucket-mib", bucket_mib, bucket_mib * 1024 * 1024 >= 1 && bucket_mib <= 1 << 20,
                   "a size in MiB of at least one byte and at most 1048576 (1 TiB)");
  if (trace_steps < 1)
    throw InputError("--trace-steps: expected at least 1 step, found " +
                     std::to_string(trace_steps));
  engine::PlanTrainOptions po;
  static_cast<engine::LoopOptions&>(po) = o;  // the options both loops share
  po.plan_path = plan;
  po.schedule_path = schedule_file;
  po.init_from = o.init_from;
  po.trace_path = trace;
  po.trace_steps = trace_steps;
  po.bucket_bytes = size_t(bucket_mib * 1024 * 1024);
  transport::WorldOptions wo;
  if (!transport::env_is_set("BATON_PEER_TIMEOUT"))
    wo.comm.peer_timeout = transport::kTrainingPeerTimeout;
  transport::World world = transport::init_world(wo);
  // GPUs: NCCL carries the device tensors (pipeline transfers, tensor-parallel and
  // gradient groups) and the world (UCX) keeps the host's values; or, with "transport":
  // "ucx", UCX carries everything, device tensors staged through host buffers.
  transport::CommPtr comm = world.comm;
  if (o.device.is_cuda() && plan_doc->transport_of() == "ucx")
    comm = transport::make_staged(comm);
  else if (o.device.is_cuda()) {
    po.device_world = transport::make_nccl_world(world.env, world.store.get());
    po.split_p2p_pair = transport::nccl_split_p2p;  // transport/pair_routes.h: why
  }
  // Rank 0 tells the launcher's rendezvous how far the job got (it names the step when
  // a rank fails).
  std::function<void(const engine::StepRecord&)> progress;
  if (world.store && world.comm->rank() == 0)
    progress = [&world](const engine::StepRecord& r) {
      world.store->set(transport::kProgressKey, std::to_string(r.step));
    };
  const engine::TrainSummary summary = engine::train_plan(po, comm, progress);
  // Stopped by a signal: the shell's code for it (128 + the signal), after the checkpoint.
  return summary.stopped_by != 0 ? 128 + summary.stopped_by : 0;
}

const RegisterCommand register_train{
    {"train", "train a model from a token dataset or text (one process, or a plan's ranks)",
     run_train}};

}  // namespace
}  // namespace baton::tools
