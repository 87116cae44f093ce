// `baton export`: writes a baton checkpoint (written under any plan) as a Hugging Face
// directory: config.json and safetensors, sharded with an index above --max-shard-size.
#include <spdlog/spdlog.h>

#include "memory/error.h"
#include "stages/hf.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

int run_export(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string checkpoint, format, out, max_shard, dtype;
  opts.add_options()("checkpoint", po::value(&checkpoint)->required(),
                     "a checkpoint directory (--checkpoint-dir of train: its newest complete "
                     "checkpoint), or one step-* directory in it")(
      "format", po::value(&format)->default_value("hf"),
      "output format: hf (Hugging Face transformers)")("out,o", po::value(&out)->required(),
                                                       "output directory")(
      "max-shard-size", po::value(&max_shard),
      "shard the weights above this size (e.g. 5GB, 200MB: powers of 1000 as transformers "
      "reads them; 4GiB: powers of 1024), with model.safetensors.index.json")(
      "dtype", po::value(&dtype)->default_value("f32"), "stored weights: f32, bf16 or f16");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args, "baton export --checkpoint DIR --out OUT [options]", opts, vm)) return 0;
  apply_common_options(vm);
  check_path_flags(vm, {"checkpoint", "out"});
  check_value_flags(vm, {"max-shard-size"});
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
  if (vm.count("max-shard-size")) {
    // parse_bytes reads 0 as unlimited; a shard size of 0 bytes is a mistake, not "no
    // shards". Its own message for a fraction of a byte ("0 or at least 1 byte") named a 0
    // refused here.
    const std::string at_least =
        "--max-shard-size: expected a size of at least 1 byte (e.g. 5GB), found '" + max_shard +
        "'";
    try {
      wo.max_shard_bytes = parse_bytes_option("--max-shard-size", max_shard);
    } catch (const InputError& e) {
      if (std::string(e.what()).find("expected 0 or at least 1 byte") == std::string::npos) throw;
      throw InputError(at_least);
    }
    if (wo.max_shard_bytes == 0) throw InputError(at_least);
  }

  // Read again when a live run prunes the step being read (read_checkpoint).
  stages::WholeModel w;
  std::string step_dir;
  stages::read_checkpoint(checkpoint, [&](const std::string& dir) {
    w = stages::load_whole_checkpoint(dir);
    step_dir = dir;
  });
  stages::export_hf(w, step_dir, out, wo);
  spdlog::info("exported {} (step {}) to {} ({}{})", step_dir, w.manifest.step, out, dtype,
               wo.max_shard_bytes > 0 ? ", sharded at " + max_shard : "");
  return 0;
}

const RegisterCommand register_export{
    {"export", "write a checkpoint as a Hugging Face model directory", run_export}};

}  // namespace
}  // namespace baton::tools
