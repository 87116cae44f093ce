// Autoregressive generation with a key/value cache for the decoder families baton reads
// (GPT-2 and the LLaMA family), on one process from a whole-model Stage's parameters:
// the prompt is fed once (prefill), then one token per step attends to the cached keys
// and values of all earlier positions. Sampling: greedy at temperature 0, otherwise
// softmax(logits / T) restricted by top-k and top-p, from a seeded generator.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stages/stage.h"

namespace baton::stages {

struct SampleOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t top_k = 0;       // 0: all tokens
  double top_p = 1;        // nucleus: the smallest set with probability >= top_p
  uint64_t seed = 0;
};

class Generator {
 public:
  // `stage` holds every layer of a gpt2 or llama model (shorthand or Hugging Face config),
  // unsplit; it must outlive the generator. max_positions bounds prompt + new tokens.
  Generator(const Stage& stage, int64_t max_positions);
  ~Generator();
  // Appends tokens to the sequence and returns the logits (float, [vocab]) after the last.
  std::vector<float> feed(const std::vector<int32_t>& tokens);
  int64_t position() const;  // tokens fed so far
  int64_t capacity() const;  // positions it holds: max_positions, at most the model's context
  int64_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The whole model to generate from: a baton checkpoint (`checkpoint`: a --checkpoint-dir,
// whose newest complete checkpoint is taken, or one step directory; written under any
// plan) or a Hugging Face directory (`hf_dir`), exactly one of them; `model_path`, when
// given, replaces the model JSON they name. InputError for bad input.
struct GenerationModel {
  std::shared_ptr<Graph> graph;
  std::unique_ptr<Stage> stage;  // every layer, unsplit
  int64_t vocab_size = 0;
  // The end-of-sequence ids transformers' generate stops at (hf_eos_token_ids; a checkpoint
  // started from a Hugging Face config keeps that config's eos_token_id); nullopt when the
  // model knows of none (a shorthand: its tokenizer's may stand in).
  std::optional<std::vector<int32_t>> eos_ids;
  // The ids to stop at: eos_ids, else the tokenizer's end-of-sequence id (-1: none).
  std::vector<int32_t> stop_ids(int32_t tokenizer_eos = -1) const;
};
// `sampling`: the caller samples (a temperature above 0), so a generation_config.json
// that samples is not said to be left unused.
GenerationModel load_generation_model(const std::string& checkpoint, const std::string& hf_dir,
                                      const std::string& model_path = "", bool sampling = false);

// The next token from logits under the sampling options (rng state advanced). InputError
// for a NaN temperature; an infinite one samples uniformly among the tokens kept.
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opt, uint64_t& rng);

// Seconds to the first new token (the prompt read and the token sampled), and in all.
struct GenerationTimes {
  double first_token_s = 0, total_s = 0;
};

// The max_new tokens that follow the prompt; fewer when one of `stop` is drawn, which ends
// the output (as transformers' generate returns its end-of-sequence token).
std::vector<int32_t> generate(const Stage& stage, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SampleOptions& opt,
                              const std::vector<int32_t>& stop = {},
                              GenerationTimes* times = nullptr);

}  // namespace baton::stages
