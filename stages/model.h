// Loading a model JSON into a logical Graph: the general graph form ("type": "graph")
// and the shorthands ("type": "gpt2" with Hugging Face GPT-2 config names, "type": "mlp"),
// which expand to the general form. A Hugging Face config.json ("model_type": "gpt2") is
// accepted too. Shapes are inferred on load; every error names the file, the JSON path,
// what was expected and what was found.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "stages/graph.h"

namespace baton::stages {

struct LoadOptions {
  // The dtype of every floating value and parameter (f32 unless a test asks for f64).
  DType float_dtype = DType::f32;
};

// Reads and loads a model file.
Graph load_model(const std::string& path, const LoadOptions& options = {});
// Loads a parsed model JSON; `source` names it in messages.
Graph load_model_json(const nlohmann::json& model, const std::string& source,
                      const LoadOptions& options = {});
// The general graph form a model JSON stands for (shorthands expanded; a general graph is
// returned as given). `source` names the document in messages.
nlohmann::json expand_model_json(const nlohmann::json& model, const std::string& source);
// Throws InputError naming `source` when the loss depends on no trainable parameter: a run
// that trains it would change nothing (baton train checks it; evaluation is allowed).
void check_loss_trains(const Graph& g, const std::string& source);

}  // namespace baton::stages
