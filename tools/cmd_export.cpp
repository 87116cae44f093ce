// `baton export`: writes a baton checkpoint (written under any plan) as a Hugging Face
// directory: config.json and safetensors, sharded with an index above --max-shard-size.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "memory/error.h"
#include "stages/checkpoint.h"
#include "stages/hf.h"
#include "stages/model.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

namespace fs = std::filesystem;

// DIR itself when it holds a manifest, else the newest complete checkpoint under it.
std::string resolve_checkpoint(const std::string& dir) {
  if (!fs::exists(dir)) throw InputError(dir + ": no such checkpoint directory");
  if (fs::exists(dir + "/manifest.json")) return dir;
  if (auto latest = stages::latest_checkpoint(dir)) return *latest;
  throw InputError(dir +
                   ": no complete checkpoint (no manifest.json in it or in a step-* "
                   "directory under it)");
}

int run_export(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string checkpoint, format, out, max_shard, dtype;
  opts.add_options()("checkpoint", po::value(&checkpoint)->required(),
                     "a checkpoint directory (--checkpoint-dir of train: its newest complete "
                     "checkpoint), or one step-* directory in it")(
      "format", po::value(&format)->default_value("hf"),
      "output format: hf (Hugging Face transformers)")("out", po::value(&out)->required(),
                                                       "output directory")(
      "max-shard-size", po::value(&max_shard)->default_value(""),
      "shard the weights above this size (e.g. 5GB, 200MB), with model.safetensors.index.json")(
      "dtype", po::value(&dtype)->default_value("f32"), "stored weights: f32, bf16 or f16");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args, "baton export --checkpoint DIR --out OUT [options]", opts, vm)) return 0;
  apply_common_options(vm);
  if (format != "hf") throw InputError("--format: expected hf, found '" + format + "'");
  stages::HfWriteOptions wo;
  if (dtype == "f32")
    wo.dtype = memory::DType::f32;
  else if (dtype == "bf16")
    wo.dtype = memory::DType::bf16;
  else if (dtype == "f16")
    wo.dtype = memory::DType::f16;
  else
    throw InputError("--dtype: expected f32, bf16 or f16, found '" + dtype + "'");
  if (!max_shard.empty())
    wo.max_shard_bytes = stages::parse_byte_size(max_shard, "--max-shard-size");

  const std::string step_dir = resolve_checkpoint(checkpoint);
  stages::Manifest m = stages::read_manifest(step_dir);
  auto g = std::make_shared<stages::Graph>(
      stages::load_model_json(m.model, step_dir + "/manifest.json: $.model"));
  // The whole model on one process: load_stage reads each parameter's blocks from
  // whichever rank's files hold them.
  stages::Stage stage(g, 0, g->num_layers());
  stages::load_stage(step_dir, m, stage, false);
  stages::save_hf(out, stage, wo);
  spdlog::info("exported {} (step {}) to {} ({}{})", step_dir, m.step, out, dtype,
               wo.max_shard_bytes > 0 ? ", sharded at " + max_shard : "");
  return 0;
}

const RegisterCommand register_export{
    {"export", "write a checkpoint as a Hugging Face model directory", run_export}};

}  // namespace
}  // namespace baton::tools
