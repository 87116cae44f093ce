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
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/safetensors.h"
#include "stages/stage.h"

namespace baton::stages {

// <dir>/config.json, checked: a model_type baton reads, every field that changes the math
// supported. It is a model JSON (load_model_json accepts it).
nlohmann::json read_hf_model_config(const std::string& dir);

// Where each stored tensor of a Hugging Face directory lives; files open on first use.
class HfCheckpoint {
 public:
  explicit HfCheckpoint(std::string dir);  // InputError: no weights, a bad index
  const std::string& dir() const { return dir_; }
  // The entry of tensor `name` (its file opened), or null when no file holds it.
  const SafetensorsEntry* find(const std::string& name, const SafetensorsReader** file);
  // The file names that a load opened so far (relative to dir): for tests of "reads only
  // its shards".
  std::vector<std::string> opened() const;
  // The tensor names of the whole checkpoint.
  std::vector<std::string> names() const;

 private:
  std::string dir_, index_path_;
  std::map<std::string, std::string> where_;  // tensor -> file (relative)
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
};

// The stored name of a baton parameter: GPT-2's live under "transformer." in
// GPT2LMHeadModel (both are accepted when loading), the LLaMA family's as they are.
std::string hf_tensor_name(const Graph& g, const std::string& param);

// Fills the stage's parameters from the checkpoint. InputError names the file and the
// tensor on a missing tensor, a shape or a dtype that does not fit.
void load_hf_weights(HfCheckpoint& ckpt, Stage& stage);
void load_hf_weights(const std::string& dir, Stage& stage);

// ---- writing ----
struct HfWriteOptions {
  DType dtype = DType::f32;      // f32, bf16 or f16 stored weights
  uint64_t max_shard_bytes = 0;  // 0: one file; otherwise shards of at most this size
                                 // (a tensor larger than it gets a shard of its own)
};

// The Hugging Face config.json of a graph loaded from a gpt2 or llama shorthand or from a
// Hugging Face config (g.config). InputError for other models.
nlohmann::json hf_config_of(const Graph& g, DType dtype);

// Writes config.json and model.safetensors (or model-0000i-of-0000n.safetensors and
// model.safetensors.index.json) into `dir` from `tensors` (whole logical parameters by
// baton name, in the order given). Each file is written to a temporary name and renamed.
void write_hf(const std::string& dir, const Graph& g, const std::vector<NamedTensor>& tensors,
              const HfWriteOptions& opt);

// A whole model's stage (every layer, unsplit) written as a Hugging Face directory.
void save_hf(const std::string& dir, const Stage& stage, const HfWriteOptions& opt = {});

// "5GB", "200MB", "64KB", "1000" (bytes); decimal units as transformers reads them.
uint64_t parse_byte_size(const std::string& text, const std::string& where);

}  // namespace baton::stages
