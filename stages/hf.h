// Hugging Face checkpoints in both directions, for every model family baton reads
// (GPT-2; the LLaMA family: llama, mistral, qwen2): a directory with config.json and
// either model.safetensors or shards listed by model.safetensors.index.json.
//
// Loading fills a stage's parameters, whatever plan cut or split them: each local piece
// is read as a block of the stored tensor, from the one file that holds it, so a rank
// opens only the files with its tensors and reads only its rows. Stored F32, F16, BF16
// and F64 are converted to the stage's dtype. Every problem (no config, a tensor missing
// or of the wrong shape, an index naming a missing file) is an InputError naming the
// file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stages/checkpoint.h"
#include "stages/safetensors.h"
#include "stages/stage.h"

namespace baton::stages {

// <dir>/config.json, checked: a model_type baton reads, every field that changes the math
// supported. It is a model JSON (load_model_json accepts it). `context`: the context of
// another model JSON used with these weights (--model), which replaces config.json's own,
// so a Mistral is checked against the window the run uses (check_same_model_math refuses a
// context beyond its window, naming that model); the config returned then holds it
// (within the window and max_position_embeddings).
nlohmann::json read_hf_model_config(const std::string& dir,
                                    std::optional<int64_t> context = std::nullopt);

// The context of a gpt2 or llama model JSON (a shorthand or a Hugging Face config);
// nullopt for other models.
std::optional<int64_t> model_json_context(const nlohmann::json& model, const std::string& source);

// The end-of-sequence ids transformers' generate stops at for a Hugging Face directory:
// generation_config.json's eos_token_id when that file exists, else config.json's (an id
// or a list of them; null or absent: none).
std::vector<int32_t> hf_eos_token_ids(const std::string& dir);
// A model JSON's eos_token_id when it is a Hugging Face config (a checkpoint started from
// one keeps it); nullopt for shorthands and graphs, which know of no tokens.
std::optional<std::vector<int32_t>> model_eos_token_ids(const nlohmann::json& model,
                                                        const std::string& source);
// The stop ids a checkpoint keeps from its --init-from directory (hf_eos_token_ids, in its
// manifest's $.train.eos_token_ids): generation_config.json's, which config.json in
// $.model does not hold. nullopt for a checkpoint without them (not started from a
// directory, or written before they were kept).
std::optional<std::vector<int32_t>> checkpoint_eos_token_ids(const Manifest& m,
                                                             const std::string& source);

// Where each stored tensor of a Hugging Face directory lives; files open on first use.
// model.safetensors is read when it exists, even beside an index (transformers prefers it
// too); otherwise the shards model.safetensors.index.json lists.
class HfCheckpoint {
 public:
  explicit HfCheckpoint(std::string dir);  // InputError: no weights, a bad index
  const std::string& dir() const { return dir_; }
  bool sharded() const { return !index_path_.empty(); }  // read by the index
  // The entry of tensor `name` (its file opened), or null when no file holds it.
  const SafetensorsEntry* find(const std::string& name, const SafetensorsReader** file);
  // The file names that a load opened so far (relative to dir): for tests of "reads only
  // its shards".
  std::vector<std::string> opened() const;
  // The tensor names of the whole checkpoint.
  std::vector<std::string> names() const;
  // Bytes read from the opened files so far (their headers and the blocks loaded).
  uint64_t bytes_read() const;

 private:
  std::string dir_, index_path_;              // index_path_ empty when model.safetensors is read
  std::map<std::string, std::string> where_;  // tensor -> file (relative)
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
};

// The fields of a model JSON (a gpt2 or llama shorthand, or a Hugging Face config) that
// change what its weights compute, in the shorthand form (the sequence length, dropout
// and initialisation left out: a run may change them); null for other models.
nlohmann::json hf_math_fields(const nlohmann::json& model, const std::string& source);

// InputError when the model (from `source`) and the Hugging Face directory's config.json
// disagree in a field that changes what the weights compute, naming the field and both
// values; nothing for models other than gpt2 and llama (their names and shapes are
// checked when loading).
void check_hf_model_matches(const nlohmann::json& model, const std::string& source,
                            const std::string& dir);
// The same check against another model JSON (`reference`, from `reference_source`): the
// model a checkpoint's weights were trained as. `why` ends the message.
void check_same_model_math(const nlohmann::json& model, const std::string& source,
                           const nlohmann::json& reference, const std::string& reference_source,
                           const std::string& why);

// The stored name of a baton parameter: GPT-2's live under "transformer." in
// GPT2LMHeadModel (both are accepted when loading), the LLaMA family's as they are.
std::string hf_tensor_name(const Graph& g, const std::string& param);

// InputError unless the checkpoint holds, for each of `params` (ids in g: the parameters
// of the layers a stage will hold), a tensor of its name, whole shape and a floating
// dtype, and nothing the model has no parameter for. It reads the headers (and a tied
// head stored beside the embedding), so a config.json that does not describe the weights
// is refused before a Stage allocates and initialises what config.json asks for.
void check_hf_weights(HfCheckpoint& ckpt, const Graph& g, const std::vector<int>& params);
void check_hf_weights(const std::string& dir, const Graph& g, const std::vector<int>& params);

// Fills the stage's parameters from the checkpoint. InputError names the file and the
// tensor on a missing tensor, a shape or a dtype that does not fit (check_hf_weights).
void load_hf_weights(HfCheckpoint& ckpt, Stage& stage);
void load_hf_weights(const std::string& dir, Stage& stage);

// ---- writing ----
struct HfWriteOptions {
  DType dtype = DType::f32;      // f32, bf16 or f16 stored weights
  uint64_t max_shard_bytes = 0;  // 0: one file; otherwise shards of at most this size
                                 // (a tensor larger than it gets a shard of its own)
  // Tests: called after each change to the directory while the new files replace the
  // earlier export's (each a point where a crash may stop the export).
  std::function<void(const std::string& what)> on_swap_step;
  // The stop ids transformers' generate is to use (checkpoint_eos_token_ids): written as
  // generation_config.json when they differ from config.json's eos_token_id.
  std::optional<std::vector<int32_t>> eos_token_ids;
};

// The Hugging Face config.json of a graph loaded from a gpt2 or llama shorthand or from a
// Hugging Face config (g.config; its bos, eos and pad token ids are kept). InputError for
// other models.
nlohmann::json hf_config_of(const Graph& g, DType dtype);

// Writes config.json and model.safetensors (or model-0000i-of-0000n.safetensors and
// model.safetensors.index.json) into `dir` from `tensors` (whole logical parameters by
// baton name, in the order given). The files are written aside, then replace an earlier
// export's, config.json last: a crash leaves the earlier export, a directory without
// config.json, or the new export.
void write_hf(const std::string& dir, const Graph& g, const std::vector<NamedTensor>& tensors,
              const HfWriteOptions& opt);

// A whole model's stage (every layer, unsplit) written as a Hugging Face directory.
void save_hf(const std::string& dir, const Stage& stage, const HfWriteOptions& opt = {});

// The checkpoint a user names (--checkpoint DIR of export and generate): DIR itself when
// it holds a manifest, else the newest complete checkpoint under it (a --checkpoint-dir);
// InputError when neither (saying so when manifests exist but none is usable).
std::string resolve_checkpoint(const std::string& dir);

// resolve_checkpoint(dir), then read(step_dir). A live run's --keep-checkpoints may prune
// the step while it is read (its manifest goes first): then the newest is resolved and
// read again, a few times; RuntimeError (not the read's "no such file") when it keeps
// vanishing, or when `dir` is that step's own directory. Other errors pass through.
void read_checkpoint(const std::string& dir,
                     const std::function<void(const std::string& step_dir)>& read);

// The whole model of a checkpoint written under any plan (or by one process) as one
// unsplit Stage: each parameter's blocks read from whichever rank's files hold them.
struct WholeModel {
  Manifest manifest;
  std::shared_ptr<Graph> graph;
  std::unique_ptr<Stage> stage;
};
WholeModel load_whole_checkpoint(const std::string& step_dir);

// `baton export --format hf`: a checkpoint's whole model (read from step_dir) written as
// a Hugging Face directory, with the stop ids its manifest keeps.
void export_hf(const WholeModel& w, const std::string& step_dir, const std::string& out,
               HfWriteOptions opt);
// The same, reading the checkpoint at step_dir (resolve_checkpoint). Returns its step.
int64_t export_hf(const std::string& step_dir, const std::string& out, const HfWriteOptions& opt);

}  // namespace baton::stages
