#include "stages/shorthands.h"

#include <cmath>

namespace baton::stages {

using nlohmann::json;

namespace {

json normal(double std) { return {{"type", "normal"}, {"std", std}}; }
json zeros() { return {{"type", "zeros"}}; }
json ones() { return {{"type", "ones"}}; }

json param(const std::string& name, std::vector<int64_t> shape, json init) {
  return {{"name", name}, {"shape", shape}, {"init", std::move(init)}};
}

json node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
          json params = json::object(), json attrs = json::object()) {
  json n = {{"name", name}, {"op", op}, {"inputs", inputs}, {"outputs", {name}}};
  if (!params.empty()) n["params"] = std::move(params);
  if (!attrs.empty()) n["attrs"] = std::move(attrs);
  return n;
}

void check_gpt2(const Gpt2Config& c, const JsonReader& r) {
  if (c.n_embd % c.n_head != 0)
    r.at("n_embd").fail("a multiple of n_head = " + std::to_string(c.n_head),
                        std::to_string(c.n_embd));
  if (c.seq() > c.n_positions)
    r.at("context").fail("at most n_positions = " + std::to_string(c.n_positions),
                         std::to_string(c.context));
}

constexpr int64_t kBig = int64_t(1) << 31;

}  // namespace

json Gpt2Config::to_json() const {
  json j = {{"type", "gpt2"},          {"name", name},
            {"n_layer", n_layer},      {"n_head", n_head},
            {"n_embd", n_embd},        {"n_positions", n_positions},
            {"vocab_size", vocab_size}, {"context", seq()},
            {"layer_norm_epsilon", layer_norm_epsilon},
            {"initializer_range", initializer_range},
            {"embd_pdrop", embd_pdrop}, {"resid_pdrop", resid_pdrop},
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
  c.n_inner = r.get_int("n_inner", 0, 1, kBig);
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
  if (r.get_string("model_type", "") != "gpt2")
    r.at("model_type").fail("\"gpt2\"");
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
  params.push_back(param("wte.weight", {V, C}, normal(std)));
  params.push_back(param("wpe.weight", {c.n_positions, C}, normal(std)));
  json layers = json::array();

  json embed = json::array();
  embed.push_back(node("wte", "embedding", {"tokens"}, {{"weight", "wte.weight"}}));
  embed.push_back(node("wpe", "position_embedding", {"wte"}, {{"weight", "wpe.weight"}}));
  std::string x = "wpe";
  if (c.embd_pdrop > 0) {
    embed.push_back(node("drop", "dropout", {x}, json::object(), {{"p", c.embd_pdrop}}));
    x = "drop";
  }
  layers.push_back({{"name", "embed"}, {"nodes", embed}});

  json conv = {{"layout", "in_out"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    params.push_back(param(h + "ln_1.weight", {C}, ones()));
    params.push_back(param(h + "ln_1.bias", {C}, zeros()));
    params.push_back(param(h + "attn.c_attn.weight", {C, 3 * C}, normal(std)));
    params.push_back(param(h + "attn.c_attn.bias", {3 * C}, zeros()));
    params.push_back(param(h + "attn.c_proj.weight", {C, C}, normal(proj_std)));
    params.push_back(param(h + "attn.c_proj.bias", {C}, zeros()));
    params.push_back(param(h + "ln_2.weight", {C}, ones()));
    params.push_back(param(h + "ln_2.bias", {C}, zeros()));
    params.push_back(param(h + "mlp.c_fc.weight", {C, F}, normal(std)));
    params.push_back(param(h + "mlp.c_fc.bias", {F}, zeros()));
    params.push_back(param(h + "mlp.c_proj.weight", {F, C}, normal(proj_std)));
    params.push_back(param(h + "mlp.c_proj.bias", {C}, zeros()));
    auto wb = [&](const std::string& p) {
      return json{{"weight", h + p + ".weight"}, {"bias", h + p + ".bias"}};
    };
    json ln_eps = {{"eps", c.layer_norm_epsilon}};
    json nodes = json::array();
    nodes.push_back(node(h + "ln_1", "layernorm", {x}, wb("ln_1"), ln_eps));
    nodes.push_back(node(h + "attn.c_attn", "linear", {h + "ln_1"}, wb("attn.c_attn"), conv));
    json att = {{"n_head", c.n_head}};
    if (c.attn_pdrop > 0) att["dropout"] = c.attn_pdrop;
    nodes.push_back(node(h + "attn.attn", "attention", {h + "attn.c_attn"}, json::object(), att));
    nodes.push_back(node(h + "attn.c_proj", "linear", {h + "attn.attn"}, wb("attn.c_proj"), conv));
    std::string a = h + "attn.c_proj";
    if (c.resid_pdrop > 0) {
      nodes.push_back(node(h + "attn.resid_dropout", "dropout", {a}, json::object(),
                           {{"p", c.resid_pdrop}}));
      a = h + "attn.resid_dropout";
    }
    nodes.push_back(node(h + "add_1", "add", {x, a}));
    nodes.push_back(node(h + "ln_2", "layernorm", {h + "add_1"}, wb("ln_2"), ln_eps));
    nodes.push_back(node(h + "mlp.c_fc", "linear", {h + "ln_2"}, wb("mlp.c_fc"), conv));
    nodes.push_back(node(h + "mlp.gelu", "gelu", {h + "mlp.c_fc"}));
    nodes.push_back(node(h + "mlp.c_proj", "linear", {h + "mlp.gelu"}, wb("mlp.c_proj"), conv));
    std::string m = h + "mlp.c_proj";
    if (c.resid_pdrop > 0) {
      nodes.push_back(
          node(h + "mlp.dropout", "dropout", {m}, json::object(), {{"p", c.resid_pdrop}}));
      m = h + "mlp.dropout";
    }
    nodes.push_back(node(h + "add_2", "add", {h + "add_1", m}));
    x = h + "add_2";
    layers.push_back({{"name", "h." + std::to_string(i)}, {"nodes", nodes}});
  }

  params.push_back(param("ln_f.weight", {C}, ones()));
  params.push_back(param("ln_f.bias", {C}, zeros()));
  json head = json::array();
  head.push_back(node("ln_f", "layernorm", {x}, {{"weight", "ln_f.weight"}, {"bias", "ln_f.bias"}},
                      {{"eps", c.layer_norm_epsilon}}));
  // The LM head is tied to wte [V, C]: logits = ln_f(x) wte^T, the torch layout.
  head.push_back(node("lm_head", "linear", {"ln_f"}, {{"weight", "wte.weight"}},
                      {{"layout", "out_in"}}));
  head.push_back(node("loss", "cross_entropy", {"lm_head", "targets"}));
  layers.push_back({{"name", "head"}, {"nodes", head}});

  return {{"type", "graph"},
          {"name", c.name},
          {"inputs", json::array({{{"name", "tokens"}, {"shape", {T}}, {"dtype", "i32"}},
                                  {{"name", "targets"}, {"shape", {T}}, {"dtype", "i32"}}})},
          {"params", params},
          {"layers", layers},
          {"loss", "loss"}};
}

MlpConfig parse_mlp_shorthand(const JsonReader& r) {
  r.expect_only({"type", "name", "context", "vocab_size", "n_embd", "hidden", "activation",
                 "init_std"});
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
  params.push_back(param("wte.weight", {c.vocab_size, c.n_embd}, normal(c.init_std)));
  json embed = json::array();
  embed.push_back(node("wte", "embedding", {"tokens"}, {{"weight", "wte.weight"}}));
  embed.push_back(node("flat", "reshape", {"wte"}, json::object(),
                       {{"shape", {c.context * c.n_embd}}}));
  layers.push_back({{"name", "embed"}, {"nodes", embed}});
  std::string x = "flat";
  int64_t width = c.context * c.n_embd;
  for (size_t i = 0; i < c.hidden.size(); ++i) {
    std::string fc = "fc" + std::to_string(i);
    params.push_back(param(fc + ".weight", {c.hidden[i], width}, normal(c.init_std)));
    params.push_back(param(fc + ".bias", {c.hidden[i]}, zeros()));
    json nodes = json::array();
    nodes.push_back(
        node(fc, "linear", {x}, {{"weight", fc + ".weight"}, {"bias", fc + ".bias"}}));
    nodes.push_back(node(fc + ".act", c.activation, {fc}));
    layers.push_back({{"name", fc}, {"nodes", nodes}});
    x = fc + ".act";
    width = c.hidden[i];
  }
  params.push_back(param("out.weight", {c.vocab_size, width}, normal(c.init_std)));
  params.push_back(param("out.bias", {c.vocab_size}, zeros()));
  json head = json::array();
  head.push_back(node("out", "linear", {x}, {{"weight", "out.weight"}, {"bias", "out.bias"}}));
  head.push_back(node("loss", "cross_entropy", {"out", "targets"}));
  layers.push_back({{"name", "out"}, {"nodes", head}});
  return {{"type", "graph"},
          {"name", c.name},
          {"inputs", json::array({{{"name", "tokens"}, {"shape", {c.context}}, {"dtype", "i32"}},
                                  {{"name", "targets"}, {"shape", json::array()}, {"dtype", "i32"}}})},
          {"params", params},
          {"layers", layers},
          {"loss", "loss"}};
}

}  // namespace baton::stages
