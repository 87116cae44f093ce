// The model shorthands: a GPT-2-style decoder whose fields are Hugging Face GPT-2 config
// names, a LLaMA-family decoder whose fields are LlamaConfig's, and a byte-level MLP
// language model. Each expands to the general graph form, with Hugging Face's parameter
// names, layouts and initialisation for the decoders.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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

// A LLaMA-family decoder (LLaMA, Mistral without a sliding window, Qwen2): RMSNorm,
// rotary positions, grouped-query attention, a SwiGLU MLP, a tied or untied head.
// Fields are Hugging Face LlamaConfig's.
struct LlamaConfig {
  std::string name = "llama";
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;                                      // 0: hidden / heads
  int64_t max_position_embeddings = 2048, vocab_size = 0;
  int64_t context = 0;  // training sequence length (baton's field); 0: max_position_embeddings
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, initializer_range = 0.02;
  double attention_dropout = 0;
  nlohmann::json rope_scaling;  // null, or Hugging Face's object (linear, llama3)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q, k, v and o
  bool qkv_bias = false;        // biases on q, k, v only (Qwen2)
  bool mlp_bias = false;
  // The embedding row transformers builds as nn.Embedding's padding_idx: the lookup gives it
  // no gradient. In [0, vocab_size); a negative pad_token_id counts from the end, as torch's.
  std::optional<int64_t> pad_token_id;

  int64_t seq() const { return context > 0 ? context : max_position_embeddings; }
  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  nlohmann::json to_json() const;  // the shorthand form
};

// The baton shorthand {"type": "llama", ...} with LlamaConfig's field names: unknown
// fields are errors.
LlamaConfig parse_llama_shorthand(const JsonReader& r);
// A Hugging Face config.json with "model_type" "llama", "mistral" or "qwen2" (biases on
// q, k, v; no sliding window): every field that changes the math is checked, an
// unsupported value is an InputError naming the field; bookkeeping fields are ignored.
// Mistral's sliding window (hf_sliding_window) is accepted when the context fits in it,
// and max_position_embeddings is then capped at it: baton attends to every position.
LlamaConfig parse_hf_llama_config(const JsonReader& r);
// The sliding window transformers applies to a config.json's attention, or nullopt: a
// Mistral's sliding_window, 4096 (MistralConfig's default) when the key is absent.
std::optional<int64_t> hf_sliding_window(const JsonReader& r);
// A LLaMA-family config.json's max_position_embeddings, or its model_type's transformers
// default when absent (2048 for llama, 131072 for mistral, 32768 for qwen2).
int64_t hf_max_position_embeddings(const JsonReader& r);
nlohmann::json llama_graph_json(const LlamaConfig& c);

// A Hugging Face config.json of any model type baton reads, as the shorthand it expands
// to ({"type": "gpt2", ...} or {"type": "llama", ...}); InputError for other types.
nlohmann::json hf_config_to_shorthand(const JsonReader& r);

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
