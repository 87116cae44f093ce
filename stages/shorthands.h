// The model shorthands: a GPT-2-style decoder whose fields are Hugging Face GPT-2 config
// names, and a byte-level MLP language model. Each expands to the general graph form, with
// Hugging Face GPT-2's parameter names, layouts and initialisation for the decoder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stages/json_reader.h"

namespace baton::stages {

struct Gpt2Config {
  std::string name = "gpt2";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, n_positions = 0, vocab_size = 0;
  int64_t n_inner = 0;  // 0: 4 * n_embd
  int64_t context = 0;  // training sequence length (baton's field); 0: n_positions
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  double embd_pdrop = 0, resid_pdrop = 0, attn_pdrop = 0;

  int64_t seq() const { return context > 0 ? context : n_positions; }
  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  nlohmann::json to_json() const;  // the shorthand form
};

// The baton shorthand {"type": "gpt2", ...}: unknown fields are errors.
Gpt2Config parse_gpt2_shorthand(const JsonReader& r);
// A Hugging Face config.json with "model_type": "gpt2": fields that change the math are
// checked (activation, attention scaling, tied embeddings, ...); HF's bookkeeping fields
// (token ids, task parameters, versions) are ignored.
Gpt2Config parse_hf_gpt2_config(const JsonReader& r);
nlohmann::json gpt2_graph_json(const Gpt2Config& c);

struct MlpConfig {
  std::string name = "mlp";
  int64_t context = 0;     // input tokens per sample
  int64_t vocab_size = 0;  // input and output vocabulary
  int64_t n_embd = 0;      // embedding width
  std::vector<int64_t> hidden;
  std::string activation = "relu";
  double init_std = 0.02;
};
MlpConfig parse_mlp_shorthand(const JsonReader& r);
nlohmann::json mlp_graph_json(const MlpConfig& c);

}  // namespace baton::stages
