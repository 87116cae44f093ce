// Checkpoints: one safetensors file per rank shard for the model and one for the
// optimizer state, plus a JSON manifest, in <root>/step-<NNNNNNNN>/. Tensors are stored
// under their LOGICAL names; a tensor that is only a block of its logical parameter is
// stored as "<name>@<offsets>", and every file's __metadata__ records each tensor's block
// (logical name, global shape, offsets), so a loader under another plan (other PP, TP,
// DP) reads the blocks it needs from whichever files hold them. Writing is atomic: each
// file goes to a temporary name, is fsynced and renamed, the directory is fsynced, and
// the manifest is written last: its presence marks a complete checkpoint.
//
// Hugging Face GPT-2 checkpoints (config.json + model.safetensors) load too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stages/safetensors.h"
#include "stages/stage.h"

namespace baton::stages {

struct ShardFile {
  std::string file;  // relative to the step directory
  std::string kind;  // "model" or "optimizer"
  int rank = 0;
  uint64_t bytes = 0;
  std::string hash;  // "crc32:<8 hex digits>" (zlib's) of the whole file; version 1: "fnv1a64:..."
};

struct Manifest {
  // 2: crc32 checksums (whole file in the manifest, each tensor in the file's metadata).
  // 3: the manifest's own crc32 ("crc32"), which version 2 readers would refuse as an
  // unknown field and fall back past.
  static constexpr int kVersion = 3;
  static constexpr int kMinVersion = 1;  // read too (FNV-1a file hashes)
  int64_t step = 0;                      // training steps completed
  uint64_t seed = 0;                     // the run's seed (init, data order, dropout)
  OptimizerConfig optimizer;
  int64_t optimizer_steps = 0;
  nlohmann::json data;   // {"position": next step, "file", "bytes"}
  nlohmann::json model;  // the model JSON as given
  nlohmann::json train;  // settings of the run (batch, micro-batches, ...)
  std::vector<ShardFile> shards;
  nlohmann::json to_json() const;  // with its "crc32"
  // InputError naming the file and field, also for a manifest whose crc32 disagrees with
  // its content (required from version 3, checked whenever present).
  static Manifest from_json(const nlohmann::json& j, const std::string& source);
};

// "<root>/step-00000042".
std::string checkpoint_dir(const std::string& root, int64_t step);

// Writes the stage's parameters (and optimizer state, when it has some) as the shard
// files of `rank` into `step_dir` (created if needed). `owns(param_id)` selects the
// parameters this rank writes (replicas write nothing twice). Atomic per file.
std::vector<ShardFile> write_stage_shards(const std::string& step_dir, const Stage& stage, int rank,
                                          const std::function<bool(int)>& owns = {});
// The same for several stages of one rank (interleaved and V schedules) into one pair of
// files; `owns(k, param_id)` selects what stages[k] writes. `owns_state(k, param_id)`
// selects parameters whose optimizer state this rank writes although it may not write
// the parameter: a sharded optimizer's part (Stage::optimizer_shard), stored as the
// blocks of the logical tensor its elements cover, so any plan and sharding reads it.
std::vector<ShardFile> write_rank_shards(const std::string& step_dir,
                                         const std::vector<const Stage*>& stages, int rank,
                                         const std::function<bool(size_t, int)>& owns = {},
                                         const std::function<bool(size_t, int)>& owns_state = {});
// A flat part of a parameter's local tensor held outside any Stage (an extra
// parameter-server rank's, engine/detail/param_server.h): elements [lo, hi) of the
// flattened local tensor of `param`, stored under `name` (the parameter's name, or
// "<name>:<state>" for its optimizer state), `values` a 1-D tensor of hi - lo elements.
struct ParamPart {
  const Param* param = nullptr;
  std::string name;
  Tensor values;
  int64_t lo = 0, hi = 0;
};
// Writes parts as the blocks of the logical tensors their elements cover (as a sharded
// optimizer's state: write_rank_shards' owns_state) into <step_dir>/<file>, one shard
// file of `kind` ("model" or "optimizer"), so any plan and sharding reads them.
ShardFile write_part_shard(const std::string& step_dir, const std::string& file,
                           const std::string& kind, int rank, const std::vector<ParamPart>& parts);
// Fills each part's values from the checkpoint's blocks of `kind`, whatever plan wrote
// them (load_stage's reading of a sharded optimizer's part).
void load_parts(const std::string& step_dir, const Manifest& m, const std::string& kind,
                const std::vector<ParamPart>& parts);
// Writes manifest.json last, atomically.
void write_manifest(const std::string& step_dir, const Manifest& m);
// Makes an empty step directory, removing an earlier write of the step manifest first (so
// a crash while rewriting it leaves it incomplete, never mixed).
void begin_checkpoint(const std::string& step_dir);

// One process, one stage: shards of rank 0 and the manifest. Returns the step directory.
std::string save_checkpoint(const std::string& root, const Stage& stage, Manifest m);

// Reads and validates <step_dir>/manifest.json; InputError naming the file and field (a
// format version newer than kVersion is refused with the version named).
Manifest read_manifest(const std::string& step_dir);
// Checks every shard file of a manifest exists with its size and checksum; returns the
// first problem, or nullopt when the checkpoint is complete. The problem names the file
// and, for a truncated or damaged one, the tensor (from the per-tensor crc32s).
std::optional<std::string> verify_checkpoint(const std::string& step_dir, const Manifest& m);
// The newest complete checkpoint under root (manifest present, shards verified), or
// nullopt. Incomplete or damaged ones are skipped with a warning (falling back to the
// previous one); one of a newer format version is an InputError, never skipped.
std::optional<std::string> latest_checkpoint(const std::string& root);

// A --checkpoint-dir made ready at the start of a run, so that a path that cannot hold
// checkpoints stops the run before any step rather than at its first save: created with
// its parents, and a file written and removed in it. InputError naming the path.
void prepare_checkpoint_root(const std::string& root);

// A --checkpoint-dir held by one run for its life (its lead rank): another run writing
// there at once had deleted this one's step directories, and one's manifest could
// certify the other's shard. An flock on the directory (released when the process ends,
// however it ends); a second holder gets an InputError.
class CheckpointRootLock {
 public:
  explicit CheckpointRootLock(const std::string& root);
  ~CheckpointRootLock();
  CheckpointRootLock(const CheckpointRootLock&) = delete;
  CheckpointRootLock& operator=(const CheckpointRootLock&) = delete;

 private:
  int fd_ = -1;
};

// The newest checkpoint directory under root that has a manifest, complete or damaged
// (nullopt when none): the work of an earlier run that a fresh run must not prune, and
// that --resume must not silently restart over when none of it is usable.
std::optional<std::string> newest_written_checkpoint(const std::string& root);
// Why the newest of those cannot be resumed from, for the error when none can ("the
// newest, <dir>, is damaged: ..."): the warnings that say it for each are hidden at
// --log-level error.
std::string unusable_newest(const std::string& root);

// After the checkpoint of step `written`: removes all but the newest `keep` complete
// checkpoints up to it under root (and incomplete ones older than the newest complete
// one). Those of later steps are left: a run resumed from an earlier checkpoint, because
// the later ones were damaged, writes over them as it reaches their steps, and counting
// them as kept would delete the good ones. keep = 0 keeps everything.
void prune_checkpoints(const std::string& root, int keep, int64_t written);

// Fills the stage's parameters (and, with `optimizer`, its optimizer state) from the
// blocks stored in the checkpoint, whatever plan wrote it. InputError when a block is
// missing or a shape disagrees.
void load_stage(const std::string& step_dir, const Manifest& m, Stage& stage, bool optimizer);

// ---- Hugging Face (stages/hf.h has the general form) ----
// Reads <dir>/config.json as a GPT-2 or LLaMA-family config (the model JSON to use).
nlohmann::json read_hf_config(const std::string& dir);
// Loads <dir>'s safetensors (one file or sharded) into the stage's parameters: GPT-2
// names with or without the "transformer." prefix; causal-mask buffers and a tied
// lm_head.weight are ignored; F32, F16 and BF16 are converted to the stage's dtype.
void load_hf_gpt2(const std::string& dir, Stage& stage);
// Writes the stage's parameters (one process) as <dir>/model.safetensors + config.json
// that Hugging Face transformers loads.
void save_hf_gpt2(const std::string& dir, const Stage& stage);

// The checksum of a file's bytes as "<algorithm>:<hex>": "crc32" (zlib's, what baton
// writes) or "fnv1a64" (64-bit FNV-1a, in version-1 checkpoints).
std::string hash_file(const std::string& path, const std::string& algorithm = "crc32");

// Writes `tensors` (any device and strides, in order) as a safetensors file with
// `metadata` and the entry that lets a checkpoint file's damaged tensor be named:
// "baton.crc32", {tensor: crc32}, as every checkpoint file carries
// (docs/formats/checkpoint.md). Each tensor is staged on the host, outside the device's
// cap, one at a time: once for its crc32 (the header holds it), again for its bytes.
// Returns the whole file's hash_file(), made from those crc32s without reading it back.
std::string write_checksummed(const std::string& path, const std::vector<NamedTensor>& tensors,
                              std::map<std::string, std::string> metadata);

}  // namespace baton::stages
