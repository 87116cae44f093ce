#include "stages/shorthands.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <utility>

#include "stages/detail/graph_json.h"

namespace baton::stages {

using detail::graph_node;
using detail::graph_param;
using nlohmann::json;

namespace {

json normal(double std) {
  return {{"type", "normal"}, {"std", std}};
}
json zeros() {
  return {{"type", "zeros"}};
}
json ones() {
  return {{"type", "ones"}};
}

// The graph of a language model on `T` tokens: the head layer ends with the loss of its
// `lm_head` logits against the targets, the model's loss.
json language_model_graph(const std::string& name, int64_t T, json params, json layers, json head) {
  head.push_back(graph_node("loss", "cross_entropy", {"lm_head", "targets"}));
  layers.push_back({{"name", "head"}, {"nodes", std::move(head)}});
  return {{"type", "graph"},
          {"name", name},
          {"inputs", json::array({{{"name", "tokens"}, {"shape", {T}}, {"dtype", "i32"}},
                                  {{"name", "targets"}, {"shape", {T}}, {"dtype", "i32"}}})},
          {"params", std::move(params)},
          {"layers", std::move(layers)},
          {"loss", "loss"}};
}

// Bounds on what a decoder shorthand expands to: a graph JSON of about twenty nodes and
// parameters per layer, then the parameters themselves. A config.json from another model
// or with a typo is refused naming its field instead of exhausting memory (and a
// bad_alloc there can abort: nlohmann::json's destructor allocates while unwinding).
// 10000 layers is far beyond any published decoder (about 130 at most) and expands to
// about 0.5 GB; 2^40 elements is the general graph's bound on one tensor
// (stages/model.cpp), here on all of them together.
constexpr int64_t kMaxLayers = 10000;
constexpr double kMaxParams = double(int64_t(1) << 40);

// The field `key` of a config (or the config itself when it is absent: a default).
JsonReader field(const JsonReader& r, const char* key) {
  return r.has(key) ? r.at(key) : r;
}

// InputError naming `layers_key` beyond kMaxLayers, or, beyond kMaxParams parameters in
// all, the field to blame: the layers when one layer would fit, else `width_key`.
void check_model_size(const JsonReader& r, const char* layers_key, int64_t layers,
                      const char* width_key, double fixed, double per_layer,
                      const std::string& dims) {
  if (layers > kMaxLayers)
    field(r, layers_key)
        .fail("at most " + std::to_string(kMaxLayers) +
                  " layers (a typo, or another model's config?)",
              std::to_string(layers));
  const double total = fixed + double(layers) * per_layer;
  if (total <= kMaxParams) return;
  const bool layers_blame = layers > 1 && fixed + per_layer <= kMaxParams;
  field(r, layers_blame ? layers_key : width_key)
      .fail("a model of at most 2^40 parameters (a typo, or another model's config?)",
            fmt::format("{:.3g} parameters with {}", total, dims));
}

void check_gpt2(const Gpt2Config& c, const JsonReader& r) {
  if (c.n_embd % c.n_head != 0)
    r.at("n_embd").fail("a multiple of n_head = " + std::to_string(c.n_head),
                        std::to_string(c.n_embd));
  if (c.seq() > c.n_positions)
    r.at("context").fail("at most n_positions = " + std::to_string(c.n_positions),
                         std::to_string(c.context));
  const double C = double(c.n_embd), F = double(c.inner());
  const double fixed = double(c.vocab_size + c.n_positions + 2) * C;  // wte, wpe, ln_f
  const double per_layer = 4 * C * C + 2 * C * F + 9 * C + F;
  check_model_size(r, "n_layer", c.n_layer,
                   fixed > per_layer ? "vocab_size" : (F > C ? "n_inner" : "n_embd"), fixed,
                   per_layer,
                   fmt::format("n_layer {}, n_embd {}, inner {}, vocab_size {}, n_positions {}",
                               c.n_layer, c.n_embd, c.inner(), c.vocab_size, c.n_positions));
}

constexpr int64_t kBig = int64_t(1) << 31;

}  // namespace

json Gpt2Config::to_json() const {
  json j = {{"type", "gpt2"},
            {"name", name},
            {"n_layer", n_layer},
            {"n_head", n_head},
            {"n_embd", n_embd},
            {"n_positions", n_positions},
            {"vocab_size", vocab_size},
            {"context", seq()},
            {"layer_norm_epsilon", layer_norm_epsilon},
            {"initializer_range", initializer_range},
            {"embd_pdrop", embd_pdrop},
            {"resid_pdrop", resid_pdrop},
            {"attn_pdrop", attn_pdrop}};
  if (n_inner > 0) j["n_inner"] = n_inner;
  return j;
}

Gpt2Config parse_gpt2_shorthand(const JsonReader& r) {
  r.expect_only({"type", "name", "n_layer", "n_head", "n_embd", "n_positions", "vocab_size",
                 "n_inner", "context", "layer_norm_epsilon", "initializer_range", "embd_pdrop",
                 "resid_pdrop", "attn_pdrop", "activation_function", "tie_word_embeddings"});
  Gpt2Config c;
  c.name = r.get_string("name", "gpt2");
  c.n_layer = r.at("n_layer").as_int(1, kBig);
  c.n_head = r.at("n_head").as_int(1, kBig);
  c.n_embd = r.at("n_embd").as_int(1, kBig);
  c.n_positions = r.at("n_positions").as_int(1, kBig);
  c.vocab_size = r.at("vocab_size").as_int(1, kBig);
  // null is the default, as in a Hugging Face config.json.
  if (auto inner = r.get("n_inner"); inner && !inner->raw().is_null())
    c.n_inner = inner->as_int(1, kBig);
  c.context = r.get_int("context", 0, 1, kBig);
  c.layer_norm_epsilon = r.get_double("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  c.initializer_range = r.get_double("initializer_range", 0.02, 0.0, 10.0);
  c.embd_pdrop = r.get_double("embd_pdrop", 0.0, 0.0, 0.999);
  c.resid_pdrop = r.get_double("resid_pdrop", 0.0, 0.0, 0.999);
  c.attn_pdrop = r.get_double("attn_pdrop", 0.0, 0.0, 0.999);
  if (auto a = r.get("activation_function"); a && a->as_string() != "gelu_new")
    a->fail("\"gelu_new\" (the only GPT-2 activation baton implements)");
  if (auto t = r.get("tie_word_embeddings"); t && !t->as_bool())
    t->fail("true (GPT-2 ties lm_head to wte)");
  check_gpt2(c, r);
  return c;
}

Gpt2Config parse_hf_gpt2_config(const JsonReader& r) {
  r.expect_object();
  if (r.get_string("model_type", "") != "gpt2") r.at("model_type").fail("\"gpt2\"");
  Gpt2Config c;
  c.name = "gpt2";
  c.n_layer = r.get_int("n_layer", 12, 1, kBig);
  c.n_head = r.get_int("n_head", 12, 1, kBig);
  c.n_embd = r.get_int("n_embd", 768, 1, kBig);
  c.n_positions = r.get_int("n_positions", 1024, 1, kBig);
  c.vocab_size = r.get_int("vocab_size", 50257, 1, kBig);
  if (auto inner = r.get("n_inner"); inner && !inner->raw().is_null())
    c.n_inner = inner->as_int(1, kBig);
  c.layer_norm_epsilon = r.get_double("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  c.initializer_range = r.get_double("initializer_range", 0.02, 0.0, 10.0);
  c.embd_pdrop = r.get_double("embd_pdrop", 0.1, 0.0, 0.999);
  c.resid_pdrop = r.get_double("resid_pdrop", 0.1, 0.0, 0.999);
  c.attn_pdrop = r.get_double("attn_pdrop", 0.1, 0.0, 0.999);
  c.context = r.get_int("context", 0, 1, kBig);  // baton's own: the training window
  if (auto a = r.get("activation_function"); a && a->as_string() != "gelu_new")
    a->fail("\"gelu_new\" (the only GPT-2 activation baton implements)");
  if (!r.get_bool("tie_word_embeddings", true))
    r.at("tie_word_embeddings").fail("true (GPT-2 ties lm_head to wte)");
  if (!r.get_bool("scale_attn_weights", true))
    r.at("scale_attn_weights").fail("true (scores scaled by 1/sqrt(head_dim))");
  if (r.get_bool("scale_attn_by_inverse_layer_idx", false))
    r.at("scale_attn_by_inverse_layer_idx").fail("false");
  if (r.get_bool("add_cross_attention", false)) r.at("add_cross_attention").fail("false");
  check_gpt2(c, r);
  return c;
}

json gpt2_graph_json(const Gpt2Config& c) {
  const int64_t C = c.n_embd, T = c.seq(), V = c.vocab_size, F = c.inner();
  const double std = c.initializer_range;
  // Hugging Face scales the output projections of each block by 1/sqrt(2 n_layer).
  const double proj_std = std / std::sqrt(2.0 * double(c.n_layer));
  json params = json::array();
  params.push_back(graph_param("wte.weight", {V, C}, normal(std)));
  params.push_back(graph_param("wpe.weight", {c.n_positions, C}, normal(std)));
  json layers = json::array();

  json embed = json::array();
  embed.push_back(graph_node("wte", "embedding", {"tokens"}, {{"weight", "wte.weight"}}));
  embed.push_back(graph_node("wpe", "position_embedding", {"wte"}, {{"weight", "wpe.weight"}}));
  std::string x = "wpe";
  if (c.embd_pdrop > 0) {
    embed.push_back(graph_node("drop", "dropout", {x}, json::object(), {{"p", c.embd_pdrop}}));
    x = "drop";
  }
  layers.push_back({{"name", "embed"}, {"nodes", embed}});

  json conv = {{"layout", "in_out"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    params.push_back(graph_param(h + "ln_1.weight", {C}, ones()));
    params.push_back(graph_param(h + "ln_1.bias", {C}, zeros()));
    params.push_back(graph_param(h + "attn.c_attn.weight", {C, 3 * C}, normal(std)));
    params.push_back(graph_param(h + "attn.c_attn.bias", {3 * C}, zeros()));
    params.push_back(graph_param(h + "attn.c_proj.weight", {C, C}, normal(proj_std)));
    params.push_back(graph_param(h + "attn.c_proj.bias", {C}, zeros()));
    params.push_back(graph_param(h + "ln_2.weight", {C}, ones()));
    params.push_back(graph_param(h + "ln_2.bias", {C}, zeros()));
    params.push_back(graph_param(h + "mlp.c_fc.weight", {C, F}, normal(std)));
    params.push_back(graph_param(h + "mlp.c_fc.bias", {F}, zeros()));
    params.push_back(graph_param(h + "mlp.c_proj.weight", {F, C}, normal(proj_std)));
    params.push_back(graph_param(h + "mlp.c_proj.bias", {C}, zeros()));
    auto wb = [&](const std::string& p) {
      return json{{"weight", h + p + ".weight"}, {"bias", h + p + ".bias"}};
    };
    json ln_eps = {{"eps", c.layer_norm_epsilon}};
    json nodes = json::array();
    nodes.push_back(graph_node(h + "ln_1", "layernorm", {x}, wb("ln_1"), ln_eps));
    nodes.push_back(graph_node(h + "attn.c_attn", "linear", {h + "ln_1"}, wb("attn.c_attn"), conv));
    json att = {{"n_head", c.n_head}};
    if (c.attn_pdrop > 0) att["dropout"] = c.attn_pdrop;
    nodes.push_back(
        graph_node(h + "attn.attn", "attention", {h + "attn.c_attn"}, json::object(), att));
    nodes.push_back(
        graph_node(h + "attn.c_proj", "linear", {h + "attn.attn"}, wb("attn.c_proj"), conv));
    std::string a = h + "attn.c_proj";
    if (c.resid_pdrop > 0) {
      nodes.push_back(graph_node(h + "attn.resid_dropout", "dropout", {a}, json::object(),
                                 {{"p", c.resid_pdrop}}));
      a = h + "attn.resid_dropout";
    }
    nodes.push_back(graph_node(h + "add_1", "add", {x, a}));
    nodes.push_back(graph_node(h + "ln_2", "layernorm", {h + "add_1"}, wb("ln_2"), ln_eps));
    nodes.push_back(graph_node(h + "mlp.c_fc", "linear", {h + "ln_2"}, wb("mlp.c_fc"), conv));
    nodes.push_back(graph_node(h + "mlp.gelu", "gelu", {h + "mlp.c_fc"}));
    nodes.push_back(
        graph_node(h + "mlp.c_proj", "linear", {h + "mlp.gelu"}, wb("mlp.c_proj"), conv));
    std::string m = h + "mlp.c_proj";
    if (c.resid_pdrop > 0) {
      nodes.push_back(
          graph_node(h + "mlp.dropout", "dropout", {m}, json::object(), {{"p", c.resid_pdrop}}));
      m = h + "mlp.dropout";
    }
    nodes.push_back(graph_node(h + "add_2", "add", {h + "add_1", m}));
    x = h + "add_2";
    layers.push_back({{"name", "h." + std::to_string(i)}, {"nodes", nodes}});
  }

  params.push_back(graph_param("ln_f.weight", {C}, ones()));
  params.push_back(graph_param("ln_f.bias", {C}, zeros()));
  json head = json::array();
  head.push_back(graph_node("ln_f", "layernorm", {x},
                            {{"weight", "ln_f.weight"}, {"bias", "ln_f.bias"}},
                            {{"eps", c.layer_norm_epsilon}}));
  // The LM head is tied to wte [V, C]: logits = ln_f(x) wte^T, the torch layout.
  head.push_back(graph_node("lm_head", "linear", {"ln_f"}, {{"weight", "wte.weight"}},
                            {{"layout", "out_in"}}));
  return language_model_graph(c.name, T, std::move(params), std::move(layers), std::move(head));
}

// ---- LLaMA family ----

namespace {

// What transformers builds for a field a config.json leaves out: each model_type's config
// class has its own defaults (checked against transformers 5.25's LlamaConfig,
// MistralConfig and Qwen2Config). The llama shorthand's optional fields take LlamaConfig's.
struct HfLlamaDefaults {
  const char* model_type;
  const char* config_class;
  int64_t hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t vocab_size, max_position_embeddings;
  double rms_norm_eps, rope_theta, initializer_range, attention_dropout;
};
constexpr HfLlamaDefaults kHfLlamaDefaults[] = {
    {"llama", "LlamaConfig", 4096, 11008, 32, 32, 0, 32000, 2048, 1e-6, 10000.0, 0.02, 0.0},
    {"mistral", "MistralConfig", 4096, 14336, 32, 32, 8, 32000, 131072, 1e-6, 10000.0, 0.02, 0.0},
    {"qwen2", "Qwen2Config", 4096, 22016, 32, 32, 32, 151936, 32768, 1e-6, 10000.0, 0.02, 0.0},
};

// The defaults of a config's model_type (a shorthand's, or an unknown type's: llama's).
const HfLlamaDefaults& hf_llama_defaults(const JsonReader& r) {
  const json* t =
      r.is_object() && r.raw().contains("model_type") ? &r.raw()["model_type"] : nullptr;
  for (const HfLlamaDefaults& d : kHfLlamaDefaults)
    if (t && t->is_string() && *t == d.model_type) return d;
  return kHfLlamaDefaults[0];
}

void check_llama(const LlamaConfig& c, const JsonReader& r) {
  const int64_t h = c.num_attention_heads, kv = c.kv_heads();
  if (c.head_dim == 0 && c.hidden_size % h != 0)
    field(r, "hidden_size")
        .fail("a multiple of num_attention_heads = " + std::to_string(h),
              std::to_string(c.hidden_size));
  if (h % kv != 0)
    field(r, "num_key_value_heads")
        .fail("a divisor of num_attention_heads = " + std::to_string(h),
              std::to_string(kv) + (r.has("num_key_value_heads")
                                        ? ""
                                        : std::string(" (no num_key_value_heads: ") +
                                              hf_llama_defaults(r).config_class + "'s default)"));
  if (c.head_size() % 2 != 0)
    (r.has("head_dim") ? r.at("head_dim") : field(r, "hidden_size"))
        .fail("an even head size for rotary embeddings",
              "head size " + std::to_string(c.head_size()));
  if (c.seq() > c.max_position_embeddings)
    r.at("context").fail(
        "at most max_position_embeddings = " + std::to_string(c.max_position_embeddings),
        std::to_string(c.context));
  const double C = double(c.hidden_size), F = double(c.intermediate_size);
  const double Q = double(h * c.head_size()), KV = double(kv * c.head_size());
  const double fixed = double(c.vocab_size) * C * (c.tie_word_embeddings ? 1 : 2) + C;
  const double per_layer = 2 * C * Q + 2 * C * KV + 3 * C * F + 2 * C + Q + 2 * KV + 3 * F + C;
  check_model_size(
      r, "num_hidden_layers", c.num_hidden_layers,
      fixed > per_layer ? "vocab_size" : (F > C ? "intermediate_size" : "hidden_size"), fixed,
      per_layer,
      fmt::format("num_hidden_layers {}, hidden_size {}, intermediate_size {}, "
                  "num_attention_heads {}, num_key_value_heads {}, head size {}, vocab_size {}",
                  c.num_hidden_layers, c.hidden_size, c.intermediate_size, h, kv, c.head_size(),
                  c.vocab_size));
}

// A rope scaling object (rope_scaling, or transformers 5's rope_parameters, which also
// holds rope_theta): null for the default rope, else the object without rope_theta;
// types baton does not implement are errors (rotary checks it again).
nlohmann::json read_rope_object(const JsonReader& obj, bool with_theta) {
  std::optional<JsonReader> s = obj;
  s->expect_object();
  // Read through the reader, so that a type that is not a string names its path.
  const std::string type =
      s->has("rope_type") ? s->at("rope_type").as_string() : s->get_string("type", "default");
  if (with_theta && type == "default") {
    s->expect_only({"rope_type", "type", "rope_theta"});
    return nullptr;
  }
  if (type != "default" && type != "linear" && type != "llama3")
    (s->has("rope_type") ? s->at("rope_type") : s->at("type"))
        .fail("\"default\", \"linear\" or \"llama3\" (the rope scalings baton implements)",
              "\"" + type + "\"");
  // Only the fields of that type (HF's own validation warns; baton refuses).
  if (type == "linear") {
    if (with_theta)
      s->expect_only({"rope_type", "type", "factor", "rope_theta"});
    else
      s->expect_only({"rope_type", "type", "factor"});
    s->at("factor").as_double(1e-6, 1e6);
  } else if (type == "llama3") {
    if (with_theta)
      s->expect_only({"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings", "rope_theta"});
    else
      s->expect_only({"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings"});
    for (const char* f : {"factor", "low_freq_factor", "high_freq_factor"})
      s->at(f).as_double(1e-6, 1e12);
    // Absent, it is max_position_embeddings (read_llama_fields), as in transformers.
    if (s->has("original_max_position_embeddings"))
      s->at("original_max_position_embeddings").as_double(1e-6, 1e12);
    // Checked here too (the rotary op refuses it) so that the message names this file's
    // field, not the expanded graph's.
    const double low = s->at("low_freq_factor").as_double();
    if (s->at("high_freq_factor").as_double() <= low)
      s->at("high_freq_factor")
          .fail("a value above low_freq_factor = " + json_brief(s->at("low_freq_factor").raw()) +
                    " (llama3 scaling blends the frequencies between the two)",
                json_brief(s->at("high_freq_factor").raw()));
  } else {
    s->expect_only({"rope_type", "type"});
    return nullptr;
  }
  json j = s->raw();
  j.erase("rope_theta");
  return j;
}

nlohmann::json read_rope_scaling(const JsonReader& r) {
  std::optional<JsonReader> s = r.get("rope_scaling");
  if (!s || s->raw().is_null()) return nullptr;
  return read_rope_object(*s, false);
}

// Whether a scaling object read by read_rope_object is llama3's (its "rope_type", else its
// legacy "type"; a "type" beside "rope_type" is not read, whatever it holds).
bool is_llama3(const json& scaling) {
  if (!scaling.is_object()) return false;
  return scaling.contains("rope_type") ? scaling["rope_type"] == "llama3"
                                       : scaling.contains("type") && scaling["type"] == "llama3";
}

// A warning printed once per process: a config is parsed several times on its way to a
// model (checked, compared, expanded).
void warn_once(const std::string& message) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(m);
  if (said.insert(message).second) spdlog::warn("{}", message);
}

// Every layer_types entry "full_attention": baton has no sliding-window attention.
void refuse_windowed_layers(const JsonReader& r) {
  if (auto lt = r.get("layer_types"); lt && !lt->raw().is_null())
    for (const JsonReader& l : lt->items())
      if (l.as_string() != "full_attention")
        l.fail("\"full_attention\" (baton has no sliding-window attention)");
}

void read_llama_fields(LlamaConfig& c, const JsonReader& r, bool hf) {
  const HfLlamaDefaults& d = hf_llama_defaults(r);
  // A Hugging Face config.json may leave any field out; the shorthand requires the shapes.
  auto shape = [&](const char* key, int64_t dflt) {
    return hf ? r.get_int(key, dflt, 1, kBig) : r.at(key).as_int(1, kBig);
  };
  c.hidden_size = shape("hidden_size", d.hidden_size);
  c.intermediate_size = shape("intermediate_size", d.intermediate_size);
  c.num_hidden_layers = shape("num_hidden_layers", d.num_hidden_layers);
  c.num_attention_heads = shape("num_attention_heads", d.num_attention_heads);
  if (auto kv = r.get("num_key_value_heads"); kv && !kv->raw().is_null())
    c.num_key_value_heads = kv->as_int(1, kBig);
  else if (hf && !kv)  // null is num_attention_heads in every class (its __post_init__)
    c.num_key_value_heads = d.num_key_value_heads;
  if (auto hd = r.get("head_dim"); hd && !hd->raw().is_null()) c.head_dim = hd->as_int(1, kBig);
  c.vocab_size = shape("vocab_size", d.vocab_size);
  c.max_position_embeddings =
      r.get_int("max_position_embeddings", d.max_position_embeddings, 1, kBig);
  c.rms_norm_eps = r.get_double("rms_norm_eps", d.rms_norm_eps, 0.0, 1.0);
  c.rope_theta = r.get_double("rope_theta", d.rope_theta, 1e-6, 1e300);
  c.initializer_range = r.get_double("initializer_range", d.initializer_range, 0.0, 10.0);
  c.attention_dropout = r.get_double("attention_dropout", d.attention_dropout, 0.0, 0.999);
  c.rope_scaling = read_rope_scaling(r);
  std::string scaling_key = "rope_scaling";
  // transformers 5 writes rope_theta and the scaling together as rope_parameters.
  if (auto rp = r.get("rope_parameters"); hf && rp && !rp->raw().is_null()) {
    scaling_key = "rope_parameters";
    if (r.has("rope_scaling") && !r.at("rope_scaling").raw().is_null())
      r.at("rope_scaling")
          .fail("null beside rope_parameters (give one of them)",
                json_brief(r.at("rope_scaling").raw()));
    rp->expect_object();
    c.rope_theta = rp->get_double("rope_theta", c.rope_theta, 1e-6, 1e300);
    c.rope_scaling = read_rope_object(*rp, true);
  }
  // As transformers' standardize_rope_params: a top-level original_max_position_embeddings
  // (Phi-3-style configs) overrides the llama3 scaling's own.
  if (auto omax = r.get("original_max_position_embeddings"); hf && omax) {
    if (is_llama3(c.rope_scaling)) {
      omax->as_double(1e-6, 1e12);
      c.rope_scaling["original_max_position_embeddings"] = omax->raw();
    }
  }
  // Without one anywhere, standardize_rope_params takes max_position_embeddings.
  if (is_llama3(c.rope_scaling) && !c.rope_scaling.contains("original_max_position_embeddings")) {
    c.rope_scaling["original_max_position_embeddings"] = c.max_position_embeddings;
    warn_once(r.file() + ": $." + scaling_key +
              " (llama3) has no original_max_position_embeddings: taking "
              "max_position_embeddings = " +
              std::to_string(c.max_position_embeddings) + ", as transformers does");
  }
  if (auto a = r.get("hidden_act"); a && a->as_string() != "silu")
    a->fail("\"silu\" (the only LLaMA activation baton implements)");
  // transformers' slices of the projections under pretraining_tp > 1 sum to the whole
  // products baton computes (transformers 5 ignores the field): any degree reads alike.
  if (auto p = r.get("pretraining_tp"); p && p->as_int() < 1) p->fail("a degree of at least 1");
  // LlamaModel, MistralModel and Qwen2Model build nn.Embedding(vocab_size, hidden_size,
  // padding_idx=pad_token_id): that row gets no gradient from the lookup. torch takes
  // -vocab_size..-1 as counted from the end and refuses ids outside the table.
  if (auto pad = r.get("pad_token_id"); pad && !pad->raw().is_null()) {
    const int64_t v = c.vocab_size;
    if (!pad->raw().is_number_integer() || pad->as_int() < -v || pad->as_int() >= v)
      pad->fail("null or a token id below vocab_size = " + std::to_string(v) +
                    " (transformers makes it the embedding's padding_idx)",
                json_brief(pad->raw()));
    c.pad_token_id = pad->as_int() < 0 ? v + pad->as_int() : pad->as_int();
  }
}

}  // namespace

json LlamaConfig::to_json() const {
  json j = {{"type", "llama"},
            {"name", name},
            {"hidden_size", hidden_size},
            {"intermediate_size", intermediate_size},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"num_key_value_heads", kv_heads()},
            {"head_dim", head_size()},
            {"max_position_embeddings", max_position_embeddings},
            {"vocab_size", vocab_size},
            {"context", seq()},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_theta", rope_theta},
            {"rope_scaling", rope_scaling},
            {"initializer_range", initializer_range},
            {"attention_dropout", attention_dropout},
            {"tie_word_embeddings", tie_word_embeddings},
            {"attention_bias", attention_bias},
            {"mlp_bias", mlp_bias}};
  if (qkv_bias) j["qkv_bias"] = true;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  return j;
}

LlamaConfig parse_llama_shorthand(const JsonReader& r) {
  r.expect_only({"type",
                 "name",
                 "hidden_size",
                 "intermediate_size",
                 "num_hidden_layers",
                 "num_attention_heads",
                 "num_key_value_heads",
                 "head_dim",
                 "max_position_embeddings",
                 "vocab_size",
                 "context",
                 "rms_norm_eps",
                 "rope_theta",
                 "rope_scaling",
                 "initializer_range",
                 "attention_dropout",
                 "tie_word_embeddings",
                 "attention_bias",
                 "qkv_bias",
                 "mlp_bias",
                 "hidden_act",
                 "pretraining_tp",
                 "pad_token_id"});
  LlamaConfig c;
  c.name = r.get_string("name", "llama");
  read_llama_fields(c, r, false);
  c.context = r.get_int("context", 0, 1, kBig);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);
  c.qkv_bias = r.get_bool("qkv_bias", false);
  c.mlp_bias = r.get_bool("mlp_bias", false);
  check_llama(c, r);
  return c;
}

LlamaConfig parse_hf_llama_config(const JsonReader& r) {
  r.expect_object();
  const std::string type = r.get_string("model_type", "");
  if (type != "llama" && type != "mistral" && type != "qwen2")
    r.at("model_type").fail("\"llama\", \"mistral\" or \"qwen2\"");
  LlamaConfig c;
  c.name = type;
  read_llama_fields(c, r, true);
  c.context = r.get_int("context", 0, 1, kBig);  // baton's own: the training window
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  if (type == "llama") {
    c.attention_bias = r.get_bool("attention_bias", false);
    c.mlp_bias = r.get_bool("mlp_bias", false);
    // transformers' LlamaModel cannot run a sliding_attention layer (it builds no mask for
    // one); baton had run it with full attention.
    refuse_windowed_layers(r);
  } else if (type == "mistral") {
    // A sliding window restricts attention to the last W keys, baton attends to all: the
    // same within the window, so a context beyond it is refused, and generation (up to
    // max_position_embeddings) stays inside it.
    if (auto w = hf_sliding_window(r)) {
      const std::string why =
          " (baton has no sliding-window attention; within the window it "
          "computes the same)";
      // Mistral 7B v0.1's config: 32768 positions, a window of 4096. Without a "context"
      // the window is the context, for training and generation alike; it had been
      // refused, so no stock Mistral directory loaded without an edit.
      if (c.seq() > *w && !r.has("context") && r.has("sliding_window")) {
        warn_once(r.where() + ": max_position_embeddings " + std::to_string(c.seq()) +
                  " is beyond the sliding window of " + std::to_string(*w) +
                  ": the context is the window" + why +
                  "; \"context\" in config.json or "
                  "a model JSON given with it (--model) sets a shorter one");
        c.context = *w;
      }
      if (c.seq() > *w && r.has("sliding_window"))
        r.at("sliding_window")
            .fail("null, or at least the context " + std::to_string(c.seq()) + why +
                      "; or a context within the window: \"context\": " + std::to_string(*w) +
                      " or less in config.json, or in a model JSON given with it (--model)",
                  std::to_string(*w));
      if (c.seq() > *w)
        (r.has("context") ? r.at("context") : field(r, "max_position_embeddings"))
            .fail("at most " + std::to_string(*w) +
                      ": config.json has no sliding_window, so transformers' MistralConfig "
                      "attends within its default window of " +
                      std::to_string(*w) + why + "; set \"context\" to " + std::to_string(*w) +
                      " or less",
                  std::to_string(c.seq()) +
                      (r.has("context") || r.has("max_position_embeddings")
                           ? ""
                           : " (no max_position_embeddings: MistralConfig's default)"));
      c.max_position_embeddings = std::min(c.max_position_embeddings, *w);
    }
  } else {  // qwen2: q, k, v have biases; the window applies only with use_sliding_window
    c.qkv_bias = true;
    if (r.get_bool("use_sliding_window", false))
      r.at("use_sliding_window").fail("false (baton has no sliding-window attention)", "true");
    refuse_windowed_layers(r);
  }
  // One entry per layer, as transformers' validate_layer_type requires of every class
  // (Mistral ignores the entries themselves: its window is sliding_window's).
  if (auto lt = r.get("layer_types"); lt && !lt->raw().is_null()) {
    lt->expect_array();
    if (int64_t(lt->size()) != c.num_hidden_layers)
      lt->fail(std::to_string(c.num_hidden_layers) + " entries, one per layer (num_hidden_layers)",
               std::to_string(lt->size()) + (lt->size() == 1 ? " entry" : " entries"));
  }
  check_llama(c, r);
  return c;
}

int64_t hf_max_position_embeddings(const JsonReader& r) {
  return r.get_int("max_position_embeddings", hf_llama_defaults(r).max_position_embeddings, 1,
                   kBig);
}

std::optional<int64_t> hf_sliding_window(const JsonReader& r) {
  if (!r.is_object() || r.get_string("model_type", "") != "mistral") return std::nullopt;
  auto w = r.get("sliding_window");
  if (!w) return 4096;  // MistralConfig's default
  if (w->raw().is_null()) return std::nullopt;
  return w->as_int(1, kBig);
}

json llama_graph_json(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, T = c.seq(), V = c.vocab_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, KV = c.kv_heads(), D = c.head_size();
  const double std = c.initializer_range;
  json params = json::array();
  params.push_back(graph_param("model.embed_tokens.weight", {V, C}, normal(std)));
  json layers = json::array();
  json embed = json::array();
  json embed_attrs = json::object();
  if (c.pad_token_id) embed_attrs["padding_idx"] = *c.pad_token_id;
  embed.push_back(graph_node("model.embed_tokens", "embedding", {"tokens"},
                             {{"weight", "model.embed_tokens.weight"}}, embed_attrs));
  layers.push_back({{"name", "embed"}, {"nodes", embed}});
  std::string x = "model.embed_tokens";
  const json eps = {{"eps", c.rms_norm_eps}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    json nodes = json::array();
    // A linear `name` from `in` to `out` features, its parameters, its node.
    auto linear = [&](const std::string& name, const std::string& input, int64_t in, int64_t out,
                      bool bias) {
      params.push_back(graph_param(p + name + ".weight", {out, in}, normal(std)));
      json slots = {{"weight", p + name + ".weight"}};
      if (bias) {
        params.push_back(graph_param(p + name + ".bias", {out}, zeros()));
        slots["bias"] = p + name + ".bias";
      }
      nodes.push_back(graph_node(p + name, "linear", {input}, slots));
      return p + name;
    };
    params.push_back(graph_param(p + "input_layernorm.weight", {C}, ones()));
    nodes.push_back(graph_node(p + "input_layernorm", "rmsnorm", {x},
                               {{"weight", p + "input_layernorm.weight"}}, eps));
    const std::string ln1 = p + "input_layernorm";
    const bool qkv_b = c.attention_bias || c.qkv_bias;
    std::string q = linear("self_attn.q_proj", ln1, C, H * D, qkv_b);
    std::string k = linear("self_attn.k_proj", ln1, C, KV * D, qkv_b);
    std::string v = linear("self_attn.v_proj", ln1, C, KV * D, qkv_b);
    json rot = {{"n_head", H}, {"n_kv_head", KV}, {"rope_theta", c.rope_theta}};
    if (!c.rope_scaling.is_null()) rot["rope_scaling"] = c.rope_scaling;
    nodes.push_back(graph_node(p + "self_attn.rotary", "rotary", {q, k, v}, json::object(), rot));
    json att = {{"n_head", H}, {"n_kv_head", KV}};
    if (c.attention_dropout > 0) att["dropout"] = c.attention_dropout;
    nodes.push_back(graph_node(p + "self_attn.attn", "attention", {p + "self_attn.rotary"},
                               json::object(), att));
    std::string o = linear("self_attn.o_proj", p + "self_attn.attn", H * D, C, c.attention_bias);
    nodes.push_back(graph_node(p + "add_1", "add", {x, o}));
    params.push_back(graph_param(p + "post_attention_layernorm.weight", {C}, ones()));
    nodes.push_back(graph_node(p + "post_attention_layernorm", "rmsnorm", {p + "add_1"},
                               {{"weight", p + "post_attention_layernorm.weight"}}, eps));
    const std::string ln2 = p + "post_attention_layernorm";
    std::string gate = linear("mlp.gate_proj", ln2, C, F, c.mlp_bias);
    std::string up = linear("mlp.up_proj", ln2, C, F, c.mlp_bias);
    nodes.push_back(graph_node(p + "mlp.act", "swiglu", {gate, up}));
    std::string down = linear("mlp.down_proj", p + "mlp.act", F, C, c.mlp_bias);
    nodes.push_back(graph_node(p + "add_2", "add", {p + "add_1", down}));
    x = p + "add_2";
    layers.push_back({{"name", "layers." + std::to_string(i)}, {"nodes", nodes}});
  }
  params.push_back(graph_param("model.norm.weight", {C}, ones()));
  json head = json::array();
  head.push_back(graph_node("model.norm", "rmsnorm", {x}, {{"weight", "model.norm.weight"}}, eps));
  std::string head_weight = "model.embed_tokens.weight";
  if (!c.tie_word_embeddings) {
    head_weight = "lm_head.weight";
    params.push_back(graph_param(head_weight, {V, C}, normal(std)));
  }
  head.push_back(graph_node("lm_head", "linear", {"model.norm"}, {{"weight", head_weight}}));
  return language_model_graph(c.name, T, std::move(params), std::move(layers), std::move(head));
}

json hf_config_to_shorthand(const JsonReader& r) {
  r.expect_object();
  const std::string type = r.has("model_type") ? r.at("model_type").as_string() : "";
  if (type == "gpt2") return parse_hf_gpt2_config(r).to_json();
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return parse_hf_llama_config(r).to_json();
  (r.has("model_type") ? r.at("model_type") : r)
      .fail("a Hugging Face model_type baton reads: \"gpt2\", \"llama\", \"mistral\" or \"qwen2\"",
            r.has("model_type") ? "\"" + type + "\"" : "no model_type");
}

MlpConfig parse_mlp_shorthand(const JsonReader& r) {
  r.expect_only(
      {"type", "name", "context", "vocab_size", "n_embd", "hidden", "activation", "init_std"});
  MlpConfig c;
  c.name = r.get_string("name", "mlp");
  c.context = r.at("context").as_int(1, kBig);
  c.vocab_size = r.at("vocab_size").as_int(1, kBig);
  c.n_embd = r.at("n_embd").as_int(1, kBig);
  for (const JsonReader& h : r.at("hidden").items()) c.hidden.push_back(h.as_int(1, kBig));
  c.activation = r.get_string("activation", "relu");
  if (c.activation != "relu" && c.activation != "gelu")
    r.at("activation").fail("\"relu\" or \"gelu\"");
  c.init_std = r.get_double("init_std", 0.02, 0.0, 10.0);
  return c;
}

json mlp_graph_json(const MlpConfig& c) {
  json params = json::array();
  json layers = json::array();
  params.push_back(graph_param("wte.weight", {c.vocab_size, c.n_embd}, normal(c.init_std)));
  json embed = json::array();
  embed.push_back(graph_node("wte", "embedding", {"tokens"}, {{"weight", "wte.weight"}}));
  embed.push_back(
      graph_node("flat", "reshape", {"wte"}, json::object(), {{"shape", {c.context * c.n_embd}}}));
  layers.push_back({{"name", "embed"}, {"nodes", embed}});
  std::string x = "flat";
  int64_t width = c.context * c.n_embd;
  for (size_t i = 0; i < c.hidden.size(); ++i) {
    std::string fc = "fc" + std::to_string(i);
    params.push_back(graph_param(fc + ".weight", {c.hidden[i], width}, normal(c.init_std)));
    params.push_back(graph_param(fc + ".bias", {c.hidden[i]}, zeros()));
    json nodes = json::array();
    nodes.push_back(
        graph_node(fc, "linear", {x}, {{"weight", fc + ".weight"}, {"bias", fc + ".bias"}}));
    nodes.push_back(graph_node(fc + ".act", c.activation, {fc}));
    layers.push_back({{"name", fc}, {"nodes", nodes}});
    x = fc + ".act";
    width = c.hidden[i];
  }
  params.push_back(graph_param("out.weight", {c.vocab_size, width}, normal(c.init_std)));
  params.push_back(graph_param("out.bias", {c.vocab_size}, zeros()));
  json head = json::array();
  head.push_back(
      graph_node("out", "linear", {x}, {{"weight", "out.weight"}, {"bias", "out.bias"}}));
  head.push_back(graph_node("loss", "cross_entropy", {"out", "targets"}));
  layers.push_back({{"name", "out"}, {"nodes", head}});
  return {
      {"type", "graph"},
      {"name", c.name},
      {"inputs", json::array({{{"name", "tokens"}, {"shape", {c.context}}, {"dtype", "i32"}},
                              {{"name", "targets"}, {"shape", json::array()}, {"dtype", "i32"}}})},
      {"params", params},
      {"layers", layers},
      {"loss", "loss"}};
}

}  // namespace baton::stages
