// `baton train`: trains a model on one process from byte-level text data.
#include <spdlog/spdlog.h>

#include <sstream>

#include "kernels/ops.h"
#include "memory/allocator.h"
#include "memory/error.h"
#include "memory/units.h"
#include "stages/trainer.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

std::set<int> parse_layers(const std::string& text) {
  std::set<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      out.insert(v);
    } catch (const std::exception&) {
      throw InputError("--recompute: expected layer indices like 1,2,3, found '" + item + "'");
    }
  }
  return out;
}

int run_train(const std::vector<std::string>& args) {
  po::options_description opts("options");
  stages::TrainOptions o;
  std::string optimizer, device_memory, recompute;
  double lr = 0, weight_decay = 0, momentum = 0, beta1 = 0, beta2 = 0;
  opts.add_options()
      ("model", po::value(&o.model_path), "model JSON (general graph, gpt2 or mlp shorthand, or a Hugging Face config.json)")
      ("data", po::value(&o.data_path)->required(), "training text: any file, one token per byte")
      ("steps", po::value(&o.steps)->default_value(100), "total training steps")
      ("batch", po::value(&o.batch)->default_value(8), "samples per step")
      ("micro-batches", po::value(&o.micro_batches)->default_value(1), "micro-batches per step (divides --batch)")
      ("lr", po::value(&lr)->default_value(1e-3), "learning rate")
      ("weight-decay", po::value(&weight_decay)->default_value(0.0), "decoupled weight decay (matrices only)")
      ("optimizer", po::value(&optimizer)->default_value("adamw"), "adamw or sgd")
      ("beta1", po::value(&beta1)->default_value(0.9), "AdamW beta1")
      ("beta2", po::value(&beta2)->default_value(0.999), "AdamW beta2")
      ("momentum", po::value(&momentum)->default_value(0.0), "SGD momentum")
      ("grad-clip", po::value(&o.grad_clip)->default_value(1.0), "max global gradient norm (0: off)")
      ("seed", po::value(&o.seed)->default_value(1), "seed of initialisation, data order and dropout")
      ("checkpoint-dir", po::value(&o.checkpoint_dir), "directory for checkpoints")
      ("checkpoint-every", po::value(&o.checkpoint_every)->default_value(0), "steps between checkpoints (0: at the end)")
      ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(0), "keep only the newest N checkpoints (0: all)")
      ("resume", po::bool_switch(&o.resume), "continue from the newest complete checkpoint")
      ("init-from", po::value(&o.init_from), "Hugging Face GPT-2 directory (config.json + model.safetensors) to start from")
      ("device-memory", po::value(&device_memory), "cap on the device's memory, e.g. 512MiB")
      ("recompute", po::value(&recompute), "layers whose activations are recomputed, e.g. 1,2,3")
      ("log-every", po::value(&o.log_every)->default_value(1), "steps between progress lines")
      ("loss-log", po::value(&o.loss_log), "write JSON lines {step, loss, grad_norm, lr} here");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args, "baton train --model M --data FILE [options]", opts, vm)) return 0;
  apply_common_options(vm);
  if (int t = vm["threads"].as<int>(); t > 0) kernels::set_num_threads(t);

  if (optimizer == "adamw") {
    o.optimizer.kind = stages::OptimizerConfig::Kind::adamw;
    o.optimizer.adamw = kernels::AdamW{lr, beta1, beta2, 1e-8, weight_decay};
  } else if (optimizer == "sgd") {
    o.optimizer.kind = stages::OptimizerConfig::Kind::sgd;
    o.optimizer.sgd = kernels::Sgd{lr, momentum, weight_decay, false};
  } else {
    throw InputError("--optimizer: expected adamw or sgd, found '" + optimizer + "'");
  }
  if (!(lr > 0)) throw InputError("--lr: expected a positive number");
  if (!device_memory.empty())
    memory::allocator_for(memory::Device::cpu()).set_capacity(memory::parse_bytes(device_memory));
  o.recompute_layers = parse_layers(recompute);
  stages::run_training(o);
  return 0;
}

const RegisterCommand reg{{"train", "train a model on one process from byte-level text", run_train}};

}  // namespace
}  // namespace baton::tools
