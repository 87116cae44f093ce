// LLaMA-family models saved by Hugging Face transformers (tests/fixtures/llama_gqa,
// llama_mqa_tied, qwen2_sharded; made by tests/fixtures/make_llama_fixture.py) load into
// baton from their config.json and safetensors (one file F32, one file F16, BF16 shards
// with an index) and give the logits and loss transformers computed (float32, 1e-5
// relative), the same gradients (float64 within 1e-5, float32 within 1e-4: norms and
// sampled entries; transformers' float64 keeps float32 rotary angles) and transformers' greedy
// continuation; export writes the F32 tensors back bit for bit. Bad directories are InputErrors
// naming the file and the tensor.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "stages/checkpoint.h"
#include "stages/generate.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& name) {
  return std::string(BATON_SOURCE_DIR) + "/tests/fixtures/" + name;
}

struct HfLlamaFixture {
  std::string dir;
  nlohmann::json expected;
  Tensor tokens, targets;
  std::shared_ptr<Graph> graph(DType dtype) const {
    nlohmann::json cfg = read_hf_model_config(dir);
    nlohmann::json sh = hf_config_to_shorthand(JsonReader(cfg, dir + "/config.json"));
    sh["context"] = tokens.size(1);
    LoadOptions lo;
    lo.float_dtype = dtype;
    return std::make_shared<Graph>(load_model_json(sh, dir + "/config.json", lo));
  }
};

HfLlamaFixture hf_llama_load_fixture(const std::string& name) {
  HfLlamaFixture f;
  f.dir = fixture_dir(name);
  f.expected = read_json_file(f.dir + "/expected.json");
  f.tokens = testing::int_rows(f.expected["tokens"]);
  f.targets = testing::int_rows(f.expected["targets"]);
  return f;
}

// Runs the whole model; returns the loss and keeps the logits (the lm_head value).
struct Outcome {
  double loss = 0;
  Tensor logits;
};

Outcome hf_llama_run(Stage& st, const HfLlamaFixture& f, bool backward) {
  const int64_t b = f.tokens.size(0);
  MicroBatch mb{0, 0, b, b, double(f.targets.numel()), 0};
  st.zero_grad();
  TensorMap out = st.forward(mb, {{"tokens", f.tokens}, {"targets", f.targets}}, backward);
  Outcome r;
  r.loss = testing::value_of(out.at("loss"));
  if (backward) {
    st.backward(0);
    st.finish_grads();
  }
  return r;
}

// The logits [B, T, V]: the layers before the head as a stage, then the head's RMSNorm
// and projection by the kernels, with the head stage's (loaded) parameters.
Tensor logits_of(const std::shared_ptr<Graph>& g, const HfLlamaFixture& f) {
  const int L = g->num_layers();
  Stage body(g, 0, L - 1), head(g, L - 1, L);
  load_hf_weights(f.dir, body);
  load_hf_weights(f.dir, head);
  const int64_t b = f.tokens.size(0), t = f.tokens.size(1);
  MicroBatch mb{0, 0, b, b, double(b * t), 0};
  TensorMap out = body.forward(mb, {{"tokens", f.tokens}}, false);
  EXPECT_EQ(out.size(), 1u);
  Tensor x = out.begin()->second;
  const Tensor& norm = head.param("model.norm.weight");
  const bool tied = g->find_param("lm_head.weight") < 0;
  const Tensor& w = head.param(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  const double eps = g->config["rms_norm_eps"].get<double>();
  Tensor xn = Tensor::empty(x.shape(), x.dtype()), rstd = Tensor::empty({b * t}, x.dtype());
  kernels::rmsnorm_forward(x, norm, eps, xn, rstd);
  Tensor logits = Tensor::empty({b, t, w.size(0)}, x.dtype());
  Tensor l2 = logits.view({b * t, w.size(0)});
  kernels::linear_forward(xn.view({b * t, x.size(2)}), w, Tensor(), kernels::WeightLayout::out_in,
                          l2);
  return logits;
}

class HfLlama : public ::testing::TestWithParam<std::string> {};

TEST_P(HfLlama, LossAndLogitsMatchTransformersF32) {
  HfLlamaFixture f = hf_llama_load_fixture(GetParam());
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  double expect = f.expected["loss_f32"].get<double>();
  Outcome r = hf_llama_run(st, f, false);
  EXPECT_NEAR(r.loss, expect, 1e-5 * expect);
  Tensor logits = logits_of(g, f);
  const auto& want = f.expected["logits_f32"];
  const auto& pos = f.expected["positions"];
  const int64_t V = logits.size(2);
  std::vector<double> got_v, want_v;
  for (size_t b = 0; b < want.size(); ++b)
    for (size_t k = 0; k < pos.size(); ++k) {
      const int64_t t = pos[k].get<int64_t>();
      const Tensor row = logits.select(0, int64_t(b)).select(0, t).to(DType::f64);
      const auto rv = row.to_vector<double>();
      for (int64_t v = 0; v < V; ++v) {
        got_v.push_back(rv[size_t(v)]);
        want_v.push_back(want[b][k][size_t(v)].get<double>());
      }
    }
  double num = 0, den = 0;
  for (size_t i = 0; i < got_v.size(); ++i) {
    num += (got_v[i] - want_v[i]) * (got_v[i] - want_v[i]);
    den += want_v[i] * want_v[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  double worst = 0;
  for (size_t i = 0; i < got_v.size(); ++i)
    worst = std::max(worst, std::abs(got_v[i] - want_v[i]) / (std::abs(want_v[i]) + 1e-2));
  EXPECT_LT(worst, 1e-4);
}

// Each parameter's gradient norm and sampled entries within tol of transformers', relative
// to the larger of the tensor's norm and `floor` times the largest norm of the model: the
// key biases' gradients nearly cancel (softmax ignores a shift of all scores; only rotary
// keeps them off zero), so in float32 they are compared at the model's scale.
void expect_grads(const Stage& st, const Graph& g, const nlohmann::json& grads, double tol,
                  double floor) {
  EXPECT_EQ(grads.size(), st.param_ids().size());
  double largest = 0;
  for (const auto& [k, e] : grads.items()) largest = std::max(largest, e["norm"].get<double>());
  for (int id : st.param_ids()) {
    const std::string& name = g.params[size_t(id)].name;
    ASSERT_TRUE(grads.contains(name)) << name;
    const auto& e = grads[name];
    const Tensor grad = st.grad(id).to(DType::f64);
    const auto v = grad.to_vector<double>();
    const double n = std::sqrt(kernels::sum_squares(grad)), want = e["norm"].get<double>();
    const double scale = std::max(want, floor * largest);
    EXPECT_NEAR(n, want, tol * scale) << name;
    for (size_t k = 0; k < e["index"].size(); ++k) {
      const size_t i = e["index"][k].get<size_t>();
      EXPECT_NEAR(v[i], e["value"][k].get<double>(), tol * scale) << name << "[" << i << "]";
    }
  }
}

TEST_P(HfLlama, LossAndGradientsMatchTransformersF64) {
  HfLlamaFixture f = hf_llama_load_fixture(GetParam());
  auto g = f.graph(DType::f64);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  double expect = f.expected["loss_f64"].get<double>();
  // transformers computes the rotary angles in float32 even in a float64 model (baton's
  // float64 is exact): that moves the loss by up to about 2e-9 relative and gradients by
  // up to about 1e-6 of the tensor's norm (rope_theta 1e6, llama3 scaling); the nearly
  // cancelling key biases more, so they are compared at the model's scale as in float32.
  EXPECT_NEAR(hf_llama_run(st, f, true).loss, expect, 1e-8 * expect);
  expect_grads(st, *g, f.expected["grads_f64"], 1e-5, 1e-2);
}

TEST_P(HfLlama, GradientsInFloat32AgreeWithinTolerance) {
  HfLlamaFixture f = hf_llama_load_fixture(GetParam());
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  hf_llama_run(st, f, true);
  expect_grads(st, *g, f.expected["grads_f64"], 1e-4, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfLlama,
                         ::testing::Values("llama_gqa", "llama_mqa_tied", "qwen2_sharded"));

// Greedy decoding with the key/value cache gives transformers' greedy continuation.
TEST_P(HfLlama, GreedyContinuationIsTransformers) {
  HfLlamaFixture f = hf_llama_load_fixture(GetParam());
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  std::vector<int32_t> prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  std::vector<int32_t> want = f.expected["greedy"].get<std::vector<int32_t>>();
  EXPECT_EQ(generate(st, prompt, int64_t(want.size()), SampleOptions{}), want);
}

// The cache gives the logits a full forward pass gives: the last position's logits after
// feeding a prompt in pieces equal those of the whole sequence at once.
TEST(HfLlamaGenerate, CachedLogitsEqualAFullPass) {
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  std::vector<int32_t> seq = f.expected["tokens"][0].get<std::vector<int32_t>>();
  Generator whole(st, 64), pieces(st, 64);
  std::vector<float> a = whole.feed(seq);
  std::vector<float> b = pieces.feed(std::vector<int32_t>(seq.begin(), seq.begin() + 5));
  for (size_t i = 5; i < seq.size(); ++i) b = pieces.feed({seq[i]});
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);
  // And the last position of the fixture's recorded logits.
  const auto& want = f.expected["logits_f32"][0][2];
  ASSERT_EQ(f.expected["positions"][2].get<size_t>(), seq.size() - 1);
  double n2 = 0, d2 = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    n2 += (a[v] - want[v].get<double>()) * (a[v] - want[v].get<double>());
    d2 += want[v].get<double>() * want[v].get<double>();
  }
  EXPECT_LT(std::sqrt(n2 / d2), 1e-5);
  // Sampling: a seed repeats its draw; top-k 1 is greedy.
  SampleOptions hot{1.0, 0, 0.9, 7};
  std::vector<int32_t> prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  EXPECT_EQ(generate(st, prompt, 6, hot), generate(st, prompt, 6, hot));
  SampleOptions k1{1.0, 1, 1.0, 3};
  EXPECT_EQ(generate(st, prompt, 6, k1), generate(st, prompt, 6, SampleOptions{}));
}

// Import, a baton checkpoint, export: the F32 tensors come out bit for bit as
// transformers stored them, in one file or in shards with an index; bf16 export rounds.
TEST(HfLlamaExport, ImportCheckpointExportIsByteIdentical) {
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  const std::string root = ::testing::TempDir() + "/baton_hf_export_ckpt";
  fs::remove_all(root);
  Manifest m;
  m.model = g->config;
  const std::string step = save_checkpoint(root, st, m);
  Manifest back = read_manifest(step);
  auto g2 = std::make_shared<Graph>(load_model_json(back.model, step));
  Stage restored(g2, 0, g2->num_layers(), StageOptions{memory::Device::cpu(), 99});
  load_stage(step, back, restored, false);
  SafetensorsReader original(f.dir + "/model.safetensors");
  for (uint64_t shard : {uint64_t(0), uint64_t(20000)}) {
    SCOPED_TRACE("max shard " + std::to_string(shard));
    const std::string out = ::testing::TempDir() + "/baton_hf_export_" + std::to_string(shard);
    fs::remove_all(out);
    HfWriteOptions wo;
    wo.max_shard_bytes = shard;
    save_hf(out, restored, wo);
    EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"), shard > 0);
    HfCheckpoint exported(out);
    EXPECT_EQ(exported.names().size(), original.entries().size());
    for (const SafetensorsEntry& e : original.entries()) {
      const SafetensorsReader* file = nullptr;
      const SafetensorsEntry* x = exported.find(e.name, &file);
      ASSERT_NE(x, nullptr) << e.name;
      EXPECT_EQ(x->dtype, "F32");
      Tensor a = original.read(e.name), b = file->read(e.name);
      ASSERT_EQ(a.nbytes(), b.nbytes()) << e.name;
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << e.name;
    }
    if (shard > 0) {
      EXPECT_GE(exported.opened().size(), 2u);
    }
    // The exported config reads back as the same model.
    nlohmann::json cfg = read_hf_model_config(out);
    EXPECT_EQ(cfg["model_type"], "llama");
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["tie_word_embeddings"], false);
  }
  const std::string bf = ::testing::TempDir() + "/baton_hf_export_bf16";
  fs::remove_all(bf);
  HfWriteOptions wo;
  wo.dtype = DType::bf16;
  save_hf(bf, restored, wo);
  SafetensorsReader b16(bf + "/model.safetensors");
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  EXPECT_EQ(b16.find(name)->dtype, "BF16");
  EXPECT_EQ(b16.read(name).to(DType::f32).to_vector<float>(),
            original.read(name).to(DType::bf16).to(DType::f32).to_vector<float>());
  EXPECT_EQ(read_hf_model_config(bf)["torch_dtype"], "bfloat16");

  // Exported again over itself, unsharded: the earlier shards and index go, files that
  // are not an export's stay; a checkpoint (its step or its root) and a file are refused.
  const std::string again = ::testing::TempDir() + "/baton_hf_export_20000";
  std::ofstream(again + "/adapter_model.safetensors") << "not ours";
  save_hf(again, restored, HfWriteOptions{});
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(again)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"adapter_model.safetensors", "config.json",
                                          "model.safetensors"}));
  for (const std::string& bad : {step, root, f.dir + "/config.json"}) {
    try {
      save_hf(bad, restored, HfWriteOptions{});
      ADD_FAILURE() << "exported into " << bad;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
    }
  }
  EXPECT_TRUE(fs::exists(step + "/model-rank00000.safetensors"));
}

TEST(HfLlamaInput, ShardedCheckpointOpensOnlyTheFilesOfTheStage) {
  HfLlamaFixture f = hf_llama_load_fixture("qwen2_sharded");
  auto g = f.graph(DType::f32);
  HfCheckpoint all(f.dir);
  Stage whole(g, 0, g->num_layers());
  load_hf_weights(all, whole);
  std::set<std::string> files;
  {
    nlohmann::json idx = read_json_file(f.dir + "/model.safetensors.index.json");
    for (auto& [k, v] : idx["weight_map"].items()) files.insert(v.get<std::string>());
  }
  ASSERT_GE(files.size(), 2u) << "the fixture is meant to be sharded";
  EXPECT_EQ(all.opened().size(), files.size());
  // The embedding layer alone needs one tensor, in one file.
  HfCheckpoint part(f.dir);
  Stage embed(g, 0, 1);
  load_hf_weights(part, embed);
  EXPECT_EQ(part.opened().size(), 1u);
}

// A copy of a fixture directory to break.
std::string copy_fixture(const std::string& name, const std::string& tag) {
  const std::string dst = ::testing::TempDir() + "/baton_hf_" + tag;
  fs::remove_all(dst);
  fs::copy(fixture_dir(name), dst);
  return dst;
}

template <class F>
void hf_llama_expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

// --model given the directory that --init-from takes: the file meant is named.
TEST(HfLlamaInput, ADirectoryForItsConfigSaysWhichFile) {
  const std::string dir = copy_fixture("llama_gqa", "dir-as-model");
  hf_llama_expect_input_error([&] { read_json_file(dir); },
                              {dir +
                               ": a directory, expected a JSON file; a Hugging Face model's "
                               "is " +
                               dir + "/config.json"});
}

TEST(HfLlamaInput, BadConfigsAreInputErrorsNamingTheField) {
  const std::string dir = copy_fixture("llama_gqa", "badcfg");
  const std::string path = dir + "/config.json";
  nlohmann::json cfg = read_json_file(path);
  auto with = [&](const char* key, nlohmann::json v) {
    nlohmann::json c = cfg;
    c[key] = std::move(v);
    std::ofstream(path) << c.dump();
  };
  with("num_key_value_heads", 3);
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); }, {path, "num_key_value_heads"});
  with("hidden_act", "gelu");
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); }, {path, "hidden_act"});
  with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}});
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); }, {path, "rope_type", "yarn"});
  {  // a sliding window shorter than the context given (baton attends to every position)
    nlohmann::json c = cfg;
    c["model_type"] = "mistral";
    c["sliding_window"] = 16;
    c["context"] = 64;
    std::ofstream(path) << c.dump();
  }
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); },
                              {path, "$.sliding_window", "at least the context 64", "found 16"});
  with("model_type", "falcon");
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); }, {path, "model_type", "falcon"});
  {  // without head_dim, the hidden size must split into the heads
    nlohmann::json c = cfg;
    c.erase("head_dim");
    c["num_attention_heads"] = 6;
    c["num_key_value_heads"] = 2;
    std::ofstream(path) << c.dump();
  }
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); }, {path, "hidden_size", "6"});
  {  // transformers 5's rope_parameters: an unknown type is refused there too
    nlohmann::json c = cfg;
    c["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
    std::ofstream(path) << c.dump();
  }
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); },
                              {path, "rope_parameters", "dynamic"});
}

// A rope type that is not a string is refused naming its path under rope_parameters, as
// under the legacy rope_scaling (transformers fails on each with a KeyError).
TEST(HfLlamaInput, RopeParametersTypeMustBeAString) {
  nlohmann::json c = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  c.erase("rope_scaling");
  const std::pair<nlohmann::json, const char*> cases[] = {
      {{{"rope_type", 5}}, "c.json: $.rope_parameters.rope_type: expected a string, found 5"},
      {{{"rope_type", nullptr}, {"rope_theta", 10000.0}},
       "c.json: $.rope_parameters.rope_type: expected a string, found null"},
      {{{"type", 3}}, "c.json: $.rope_parameters.type: expected a string, found 3"}};
  for (const auto& [rp, message] : cases) {
    c["rope_parameters"] = rp;
    hf_llama_expect_input_error([&] { parse_hf_llama_config(JsonReader(c, "c.json")); }, {message});
  }
}

// A field config.json leaves out takes the default of its model_type's transformers class
// (transformers 5.25's LlamaConfig, MistralConfig, Qwen2Config), so that baton builds the
// shapes transformers builds.
TEST(HfLlamaInput, MissingFieldsTakeTheirModelTypesTransformersDefaults) {
  auto parse = [](const nlohmann::json& c) {
    return parse_hf_llama_config(JsonReader(c, "c.json"));
  };
  auto k_proj = [&](const nlohmann::json& c) {
    const nlohmann::json g = llama_graph_json(parse(c));
    for (const auto& p : g["params"])
      if (p["name"] == "model.layers.0.self_attn.k_proj.weight")
        return p["shape"].get<std::vector<int64_t>>();
    return std::vector<int64_t>{};
  };
  const nlohmann::json base = {
      {"hidden_size", 64}, {"num_hidden_layers", 1}, {"num_attention_heads", 16}, {"context", 16}};
  nlohmann::json c = base;
  c["model_type"] = "mistral";
  LlamaConfig m = parse(c);
  EXPECT_EQ(m.kv_heads(), 8);
  EXPECT_EQ(m.intermediate_size, 14336);
  EXPECT_EQ(m.vocab_size, 32000);
  EXPECT_EQ(m.max_position_embeddings, 4096);  // 131072, capped at the default window
  EXPECT_EQ(k_proj(c), (std::vector<int64_t>{8 * 4, 64}));
  c["sliding_window"] = nullptr;
  EXPECT_EQ(parse(c).max_position_embeddings, 131072);
  c["num_key_value_heads"] = nullptr;  // null is num_attention_heads, as its __post_init__
  EXPECT_EQ(parse(c).kv_heads(), 16);

  c = base;
  c["model_type"] = "qwen2";
  c["num_attention_heads"] = 32;
  LlamaConfig q = parse(c);
  EXPECT_EQ(q.kv_heads(), 32);
  EXPECT_EQ(q.intermediate_size, 22016);
  EXPECT_EQ(q.vocab_size, 151936);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_EQ(k_proj(c), (std::vector<int64_t>{32 * 2, 64}));

  c = base;
  c["model_type"] = "llama";
  LlamaConfig l = parse(c);
  EXPECT_EQ(l.kv_heads(), 16);
  EXPECT_EQ(l.intermediate_size, 11008);
  EXPECT_EQ(l.vocab_size, 32000);
  EXPECT_EQ(l.max_position_embeddings, 2048);
  EXPECT_EQ(l.rope_theta, 10000.0);
  EXPECT_EQ(l.rms_norm_eps, 1e-6);
  EXPECT_EQ(k_proj(c), (std::vector<int64_t>{16 * 4, 64}));

  // A default that does not fit the given heads names the missing field and its class.
  c = base;
  c["num_attention_heads"] = 4;
  c["model_type"] = "qwen2";
  hf_llama_expect_input_error([&] { parse(c); },
                              {"c.json: $: expected a divisor of num_attention_heads = 4",
                               "found 32 (no num_key_value_heads: Qwen2Config's default)"});
  c["model_type"] = "mistral";
  hf_llama_expect_input_error([&] { parse(c); }, {"found 8", "MistralConfig's default"});
  // MistralConfig's 131072 positions are beyond its default window without a context.
  c = base;
  c["model_type"] = "mistral";
  c.erase("context");
  hf_llama_expect_input_error([&] { parse(c); }, {"c.json: $: expected at most 4096",
                                                  "131072 (no max_position_embeddings"});
  // --init-from checks a Mistral at the context of the model given with it.
  const std::string dir = ::testing::TempDir() + "/baton_hf_mistral_defaults";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << c.dump();
  EXPECT_EQ(read_hf_model_config(dir, 8192)["context"], 4096);
}

// transformers refuses a layer_types whose length is not num_hidden_layers, in every class.
TEST(HfLlamaInput, LayerTypesHaveOneEntryPerLayer) {
  nlohmann::json c = {{"model_type", "qwen2"},    {"hidden_size", 64},
                      {"intermediate_size", 48},  {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"vocab_size", 50},         {"max_position_embeddings", 64}};
  auto parse = [&] { return parse_hf_llama_config(JsonReader(c, "c.json")); };
  const std::string full = "full_attention";
  c["layer_types"] = {full, full};
  EXPECT_NO_THROW(parse());
  for (const char* type : {"qwen2", "llama", "mistral"}) {
    c["model_type"] = type;
    c["layer_types"] = nlohmann::json::array();
    hf_llama_expect_input_error([&] { parse(); },
                                {"c.json: $.layer_types: expected 2 entries", "found 0 entries"});
    c["layer_types"] = {full};
    hf_llama_expect_input_error([&] { parse(); }, {"$.layer_types", "found 1 entry"});
    c["layer_types"] = {full, full, full};
    hf_llama_expect_input_error([&] { parse(); }, {"$.layer_types", "found 3 entries"});
  }
}

// Mistral's sliding window, given or transformers' default of 4096 when config.json has no
// sliding_window: a context beyond it is refused (baton attends to every position), one
// within it is the same math and max_position_embeddings is capped at the window, so
// generation stays inside it. Qwen2 has no window unless use_sliding_window.
TEST(HfLlamaInput, MistralSlidingWindowDefaultsAsTransformersDoes) {
  const std::string file = "mistral/config.json";
  nlohmann::json base = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  base["model_type"] = "mistral";
  base["max_position_embeddings"] = 4200;
  base.erase("sliding_window");
  auto parse = [&](const nlohmann::json& c) { return parse_hf_llama_config(JsonReader(c, file)); };
  hf_llama_expect_input_error(
      [&] { parse(base); },
      {file, "$.max_position_embeddings", "at most 4096", "no sliding_window", "found 4200"});
  nlohmann::json c = base;
  c["context"] = 5000;
  hf_llama_expect_input_error([&] { parse(c); }, {file, "$.context", "at most 4096"});
  c["context"] = 4096;
  EXPECT_EQ(parse(c).max_position_embeddings, 4096);
  EXPECT_EQ(parse(c).seq(), 4096);
  c = base;
  c["sliding_window"] = 4096;  // a window below max_position_embeddings: the context
  EXPECT_EQ(parse(c).seq(), 4096);
  EXPECT_EQ(parse(c).max_position_embeddings, 4096);
  c["context"] = 4200;
  hf_llama_expect_input_error([&] { parse(c); }, {file, "$.sliding_window", "found 4096"});
  c.erase("context");
  c["sliding_window"] = 8192;
  EXPECT_EQ(parse(c).max_position_embeddings, 4200);
  c["sliding_window"] = nullptr;
  EXPECT_EQ(parse(c).seq(), 4200);
  c = base;
  c["model_type"] = "qwen2";
  EXPECT_EQ(parse(c).seq(), 4200);
  EXPECT_EQ(hf_sliding_window(JsonReader(c, file)), std::nullopt);

  // A model JSON for the weights of a windowed Mistral: its context must fit the window.
  nlohmann::json ref = base;
  ref["context"] = 64;
  nlohmann::json sh = hf_config_to_shorthand(JsonReader(ref, file));
  EXPECT_NO_THROW(check_same_model_math(sh, "short.json", ref, file, "why"));
  sh["context"] = 4097;
  sh["max_position_embeddings"] = 8192;
  hf_llama_expect_input_error([&] { check_same_model_math(sh, "short.json", ref, file, "why"); },
                              {"short.json: $.context is 4097", "sliding window holds 4096"});
}

// A top-level original_max_position_embeddings (Phi-3-style configs) overrides the llama3
// scaling's own, as transformers' standardize_rope_params does; other scalings ignore it.
TEST(HfLlamaInput, TopLevelOriginalMaxPositionsOverridesLlama3Scaling) {
  nlohmann::json c = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  c.erase("rope_parameters");
  c["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 16}};
  c["original_max_position_embeddings"] = 32;
  LlamaConfig l = parse_hf_llama_config(JsonReader(c, "c.json"));
  EXPECT_EQ(l.rope_scaling["original_max_position_embeddings"], 32);
  // transformers 5's rope_parameters: the same.
  nlohmann::json rp = c["rope_scaling"];
  rp["rope_theta"] = 500000.0;
  c.erase("rope_scaling");
  c["rope_parameters"] = rp;
  l = parse_hf_llama_config(JsonReader(c, "c.json"));
  EXPECT_EQ(l.rope_scaling["original_max_position_embeddings"], 32);
  EXPECT_EQ(l.rope_theta, 500000.0);
  c["original_max_position_embeddings"] = "x";
  hf_llama_expect_input_error([&] { parse_hf_llama_config(JsonReader(c, "c.json")); },
                              {"c.json: $.original_max_position_embeddings"});
  c["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  l = parse_hf_llama_config(JsonReader(c, "c.json"));
  EXPECT_FALSE(l.rope_scaling.contains("original_max_position_embeddings"));
}

// The legacy "type" key names the same rope scaling as "rope_type": --init-from and
// --model compare them as one; a real difference names the field by its JSON path.
TEST(HfLlamaInput, RopeScalingTypeKeySpellingsAreTheSameModel) {
  nlohmann::json hf = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  hf.erase("rope_parameters");
  hf["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  nlohmann::json sh = hf_config_to_shorthand(JsonReader(hf, "config.json"));
  sh["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
  EXPECT_NO_THROW(check_same_model_math(sh, "m.json", hf, "config.json", "why"));
  sh["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  hf_llama_expect_input_error(
      [&] { check_same_model_math(sh, "m.json", hf, "config.json", "why"); },
      {"m.json: $.rope_scaling is ", "config.json has "});
}

// A GPT-2 model beside a LLaMA's weights (and the reverse): the message names the two
// families, not the first field by name that only one of them has ($.attention_bias).
TEST(HfLlamaInput, AnotherModelFamilyIsNamedFirst) {
  const nlohmann::json llama = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  const nlohmann::json gpt2 = read_json_file(fixture_dir("gpt2_tiny") + "/config.json");
  const nlohmann::json gpt2_sh = hf_config_to_shorthand(JsonReader(gpt2, "g/config.json"));
  hf_llama_expect_input_error(
      [&] { check_same_model_math(gpt2_sh, "m.json", llama, "ll/config.json", "why"); },
      {"ll/config.json is a llama model, but m.json is a gpt2 model (why)"});
  hf_llama_expect_input_error(
      [&] { check_same_model_math(llama, "ll/config.json", gpt2, "g/config.json", "why"); },
      {"g/config.json is a gpt2 model, but ll/config.json is a llama model (why)"});
}

// llama and qwen2 are one family whose math differs in q/k/v bias: the message names the
// two model types and what differs, not "$.qkv_bias", a key in neither config.json.
TEST(HfLlamaInput, AnotherModelTypeOfTheFamilyIsNamed) {
  const nlohmann::json llama = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  nlohmann::json qwen2 = llama;
  qwen2["model_type"] = "qwen2";
  hf_llama_expect_input_error(
      [&] { check_same_model_math(llama, "ll/config.json", qwen2, "q/config.json", "why"); },
      {"q/config.json is a qwen2 model with q/k/v bias, but ll/config.json is a llama model "
       "without q/k/v bias (why)"});
  hf_llama_expect_input_error(
      [&] { check_same_model_math(qwen2, "q/config.json", llama, "ll/config.json", "why"); },
      {"ll/config.json is a llama model without q/k/v bias, but q/config.json is a qwen2 model "
       "with q/k/v bias (why)"});
  // Another model type whose math is the same is no error.
  nlohmann::json mistral = llama;
  mistral["model_type"] = "mistral";
  EXPECT_NO_THROW(check_same_model_math(llama, "ll/config.json", mistral, "m/config.json", "why"));
}

// transformers' LlamaConfig refuses hidden_size % num_attention_heads != 0 even with a
// head_dim that makes the shapes work: export says so rather than write a directory it
// cannot load; hidden_size a multiple of the heads with another head_dim exports.
TEST(HfLlamaExport, HeadsThatDoNotDivideHiddenSizeAreRefused) {
  nlohmann::json sh = {{"type", "llama"},          {"hidden_size", 64},
                       {"intermediate_size", 96},  {"num_hidden_layers", 1},
                       {"num_attention_heads", 6}, {"num_key_value_heads", 3},
                       {"head_dim", 16},           {"max_position_embeddings", 16},
                       {"vocab_size", 32}};
  auto g = std::make_shared<Graph>(load_model_json(sh, "h6.json"));
  Stage st(g, 0, g->num_layers());
  const std::string out = ::testing::TempDir() + "/baton_hf_export_h6";
  fs::remove_all(out);
  hf_llama_expect_input_error(
      [&] { save_hf(out, st, HfWriteOptions{}); },
      {"h6.json: hidden_size 64 is not a multiple of num_attention_heads 6", "LlamaConfig"});
  EXPECT_FALSE(fs::exists(out));
  sh["num_attention_heads"] = 4;
  sh["num_key_value_heads"] = 2;
  sh["head_dim"] = 32;
  auto g4 = std::make_shared<Graph>(load_model_json(sh, "h4.json"));
  Stage st4(g4, 0, g4->num_layers());
  save_hf(out, st4, HfWriteOptions{});
  EXPECT_EQ(read_hf_model_config(out)["head_dim"], 32);
}

TEST(HfLlamaInput, BadCheckpointsAreInputErrorsNamingFileAndTensor) {
  // A model with a third layer needs tensors the file does not have; one with a single
  // layer has no parameter for the second layer's (a config.json from another model).
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  nlohmann::json cfg = read_hf_model_config(f.dir);
  for (const auto& [layers, parts] :
       {std::pair{3, std::vector<std::string>{"model.layers.2.input_layernorm.weight",
                                              "model.safetensors"}},
        std::pair{1, std::vector<std::string>{f.dir + ": ", "model.layers.1.", "no parameter"}}}) {
    cfg["num_hidden_layers"] = layers;
    auto gl = std::make_shared<Graph>(load_model_json(cfg, f.dir + "/config.json"));
    Stage st(gl, 0, gl->num_layers());
    try {
      load_hf_weights(f.dir, st);
      ADD_FAILURE() << layers << " layers loaded";
    } catch (const InputError& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  // A wider MLP: shapes disagree.
  cfg["num_hidden_layers"] = 2;
  cfg["intermediate_size"] = 64;
  auto gw = std::make_shared<Graph>(load_model_json(cfg, f.dir + "/config.json"));
  Stage stw(gw, 0, gw->num_layers());
  hf_llama_expect_input_error(
      [&] { load_hf_weights(f.dir, stw); },
      {"model.safetensors", "model.layers.0.mlp.gate_proj.weight", "[48, 32]"});
  // A shard index naming a file that is not there.
  const std::string dir = copy_fixture("qwen2_sharded", "badindex");
  nlohmann::json idx = read_json_file(dir + "/model.safetensors.index.json");
  std::string victim;
  for (auto& [k, v] : idx["weight_map"].items()) {
    victim = k;
    v = "model-99-of-99.safetensors";
    break;
  }
  std::ofstream(dir + "/model.safetensors.index.json") << idx.dump();
  hf_llama_expect_input_error([&] { HfCheckpoint c(dir); }, {"model.safetensors.index.json", victim,
                                                             "model-99-of-99.safetensors"});
  // No weights at all.
  fs::remove(dir + "/model.safetensors.index.json");
  hf_llama_expect_input_error([&] { HfCheckpoint c(dir); }, {dir, "model.safetensors"});
}

// A tied head stored beside the embedding loads when it equals it, and is refused when
// not (transformers 5 would use it untied).
TEST(HfLlamaInput, ATiedHeadStoredDifferentIsRefused) {
  const std::string dir = copy_fixture("llama_mqa_tied", "tied_head");
  const HfLlamaFixture tied = hf_llama_load_fixture("llama_mqa_tied");
  auto g = tied.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  std::vector<NamedTensor> all;
  {
    SafetensorsReader r(dir + "/model.safetensors");
    for (const SafetensorsEntry& e : r.entries()) all.push_back({e.name, r.read(e.name)});
  }
  Tensor embed;
  for (const NamedTensor& t : all)
    if (t.name == "model.embed_tokens.weight") embed = t.tensor;
  ASSERT_TRUE(embed.defined());
  all.push_back({"lm_head.weight", embed.clone()});
  write_safetensors(dir + "/model.safetensors", all, {{"format", "pt"}});
  load_hf_weights(dir, st);
  Tensor changed = embed.to(DType::f32);
  changed.data<float>()[3] += 1.0f;
  all.back().tensor = changed.to(embed.dtype());
  write_safetensors(dir + "/model.safetensors", all, {{"format", "pt"}});
  hf_llama_expect_input_error([&] { load_hf_weights(dir, st); },
                              {dir + ": ", "lm_head.weight different", "tie_word_embeddings"});
}

// A Mistral whose window is shorter than max_position_embeddings (Mistral 7B v0.1's
// 32768 and 4096): config.json alone takes the window for its context (it had been
// refused, so no stock Mistral loaded without an edit); a context beyond the window is
// refused naming the way out; a model JSON with a context inside the window is used with
// its weights, by generate and by train's check (check_hf_model_matches); one beyond the
// window is refused naming that model.
TEST(HfLlamaInput, MistralWindowIsCheckedAtTheContextOfAGivenModel) {
  const std::string dir = copy_fixture("llama_gqa", "mistral_window");
  const std::string path = dir + "/config.json";
  nlohmann::json cfg = read_json_file(path);
  cfg["model_type"] = "mistral";
  cfg["max_position_embeddings"] = 512;
  cfg["sliding_window"] = 16;
  std::ofstream(path) << cfg.dump();
  const LlamaConfig whole = parse_hf_llama_config(JsonReader(read_hf_model_config(dir), path));
  EXPECT_EQ(whole.seq(), 16);
  EXPECT_EQ(whole.max_position_embeddings, 16);
  nlohmann::json too_long = cfg;
  too_long["context"] = 512;
  std::ofstream(path) << too_long.dump();
  hf_llama_expect_input_error([&] { read_hf_model_config(dir); },
                              {path, "$.sliding_window", "at least the context 512",
                               "\"context\": 16 or less", "found 16"});
  std::ofstream(path) << cfg.dump();
  nlohmann::json with_ctx = cfg;
  with_ctx["context"] = 16;
  const std::string model = ::testing::TempDir() + "/baton_hf_mistral_window.json";
  std::ofstream(model) << with_ctx.dump();
  EXPECT_NO_THROW(check_hf_model_matches(with_ctx, model, dir));
  nlohmann::json sh = hf_config_to_shorthand(JsonReader(with_ctx, model));
  EXPECT_EQ(sh["max_position_embeddings"], 16);
  EXPECT_NO_THROW(check_hf_model_matches(sh, "short.json", dir));
  // The weights are llama_gqa's (a Mistral is a LLaMA within its window).
  GenerationModel m = load_generation_model("", dir, model);
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  std::vector<int32_t> prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  std::vector<int32_t> want = f.expected["greedy"].get<std::vector<int32_t>>();
  want.resize(5);
  EXPECT_EQ(generate(*m.stage, prompt, 5, SampleOptions{}), want);
  sh["context"] = 17;
  sh["max_position_embeddings"] = 17;
  hf_llama_expect_input_error([&] { check_hf_model_matches(sh, "short.json", dir); },
                              {"short.json: $.context is 17", "sliding window holds 16"});
}

// A NaN temperature had drawn the least likely token; an infinite one samples uniformly.
TEST(HfLlamaGenerate, NanTemperatureIsRefused) {
  const std::vector<float> logits = {0.f, 3.f, 1.f};
  uint64_t rng = 1;
  EXPECT_THROW(sample_token(logits, SampleOptions{std::nan(""), 0, 1, 1}, rng), InputError);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i)
    seen.insert(sample_token(logits, SampleOptions{INFINITY, 0, 1, 1}, rng));
  EXPECT_EQ(seen.size(), 3u);
}

// NaN logits (a diverged model): greedy takes the first NaN, as torch's argmax; sampling
// is refused (it had drawn the last token of the sort, exit 0), as torch's multinomial is.
TEST(HfLlamaGenerate, NanLogitsAreNotSampled) {
  const std::vector<float> logits = {0.f, NAN, 3.f, NAN};
  uint64_t rng = 1;
  EXPECT_EQ(sample_token(logits, SampleOptions{0, 0, 1, 1}, rng), 1);
  EXPECT_THROW(sample_token(logits, SampleOptions{1, 0, 1, 1}, rng), RuntimeError);
  EXPECT_THROW(sample_token({0.f, INFINITY}, SampleOptions{1, 5, 0.9, 1}, rng), RuntimeError);
  EXPECT_EQ(sample_token({0.f, -INFINITY, 2.f}, SampleOptions{0, 0, 1, 1}, rng), 2);
}

// Top-k keeps every token tied with the k-th, as transformers' warper does (the lower id
// alone had been kept).
TEST(HfLlamaGenerate, TopKKeepsTokensTiedWithTheKth) {
  const std::vector<float> logits = {1.f, 2.f, 0.f, 2.f};
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    uint64_t rng = seed;
    seen.insert(sample_token(logits, SampleOptions{1, 1, 1, seed}, rng));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
}

// As transformers' generate: the output ends with the first end-of-sequence id, which
// comes from generation_config.json when there is one, else from config.json (an id or a
// list); a shorthand knows none, and a tokenizer's stands in.
TEST(HfLlamaGenerate, StopsAtTheModelsEndOfSequenceIds) {
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  const std::vector<int32_t> prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> want = f.expected["greedy"].get<std::vector<int32_t>>();
  const int32_t eos = want[2];
  const std::string dir = copy_fixture("llama_gqa", "eos");
  const std::string path = dir + "/config.json";
  nlohmann::json cfg = read_json_file(path);
  cfg["eos_token_id"] = eos;
  std::ofstream(path) << cfg.dump();
  ASSERT_TRUE(fs::exists(dir + "/generation_config.json"));
  EXPECT_EQ(hf_eos_token_ids(dir), std::vector<int32_t>{});  // its file has none
  fs::remove(dir + "/generation_config.json");
  EXPECT_EQ(hf_eos_token_ids(dir), std::vector<int32_t>{eos});
  cfg["eos_token_id"] = {999, eos};
  std::ofstream(path) << cfg.dump();
  GenerationModel m = load_generation_model("", dir);
  ASSERT_TRUE(m.eos_ids.has_value());
  EXPECT_EQ(*m.eos_ids, (std::vector<int32_t>{999, eos}));
  EXPECT_EQ(generate(*m.stage, prompt, 10, SampleOptions{}, m.stop_ids()),
            std::vector<int32_t>(want.begin(), want.begin() + 3));
  EXPECT_EQ(generate(*m.stage, prompt, 10, SampleOptions{}), want);  // --ignore-eos
  EXPECT_EQ(m.stop_ids(2), (std::vector<int32_t>{999, eos}));
  m.eos_ids.reset();
  EXPECT_EQ(m.stop_ids(2), std::vector<int32_t>{2});
  EXPECT_EQ(m.stop_ids(), std::vector<int32_t>{});
  EXPECT_EQ(model_eos_token_ids(cfg, path).value(), (std::vector<int32_t>{999, eos}));
  EXPECT_FALSE(
      model_eos_token_ids(hf_config_to_shorthand(JsonReader(cfg, path)), path).has_value());
  cfg["eos_token_id"] = "</s>";
  std::ofstream(path) << cfg.dump();
  hf_llama_expect_input_error([&] { hf_eos_token_ids(dir); }, {path, "$.eos_token_id"});
}

// A generation_config.json that samples (transformers' generate does, by default) is said
// to be decoded as the flags say, with the flags that would sample alike: baton had
// decoded greedily without a word.
TEST(HfLlamaGenerate, SaysWhenItIgnoresTheSamplingDefaults) {
  const std::string dir = copy_fixture("llama_gqa", "sampling");
  auto warnings = [&](bool sampling = false) {
    std::ostringstream said;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(said);
    spdlog::default_logger()->sinks().push_back(sink);
    load_generation_model("", dir, "", sampling);
    spdlog::default_logger()->sinks().pop_back();
    return said.str();
  };
  EXPECT_EQ(warnings().find("do_sample"), std::string::npos);  // the fixture's: no sampling
  std::ofstream(dir + "/generation_config.json")
      << R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.3})";
  const std::string said = warnings();
  EXPECT_NE(said.find("generation_config.json: do_sample is true"), std::string::npos) << said;
  EXPECT_NE(said.find("give --temperature 0.6 --top-k 50 --top-p 0.9 to sample as it would"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("generation_config.json: repetition_penalty 1.3: transformers' generate "
                      "applies it, baton generate does not"),
            std::string::npos)
      << said;
  // Greedy or sampling, a processor baton lacks is said (a greedy run had differed from
  // transformers' without a word); at its neutral value it is not.
  EXPECT_NE(warnings(/*sampling=*/true).find("repetition_penalty 1.3"), std::string::npos);
  std::ofstream(dir + "/generation_config.json")
      << R"({"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "num_beams": 1})";
  EXPECT_NE(warnings().find("repetition_penalty 1.5, no_repeat_ngram_size 2: transformers' "
                            "generate applies them"),
            std::string::npos)
      << warnings();
  std::ofstream(dir + "/generation_config.json")
      << R"({"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_p": null,
             "suppress_tokens": []})";
  EXPECT_EQ(warnings(), "");
  // The warpers act on sampling runs only, as transformers applies them; min_new_tokens
  // holds the end-of-sequence token back on any run.
  std::ofstream(dir + "/generation_config.json")
      << R"({"do_sample": false, "typical_p": 0.9, "min_p": 0.05, "min_new_tokens": 4})";
  const std::string greedy = warnings();
  EXPECT_NE(greedy.find("min_new_tokens 4: transformers' generate applies it"), std::string::npos)
      << greedy;
  EXPECT_EQ(greedy.find("typical_p"), std::string::npos) << greedy;
  EXPECT_NE(warnings(/*sampling=*/true).find("min_p 0.05, typical_p 0.9"), std::string::npos);
  // transformers' own defaults where the file gives none (or null).
  std::ofstream(dir + "/generation_config.json") << R"({"do_sample": true, "temperature": null})";
  EXPECT_NE(warnings().find("give --temperature 1 --top-k 50 to sample"), std::string::npos);
  // A caller that samples is not told.
  EXPECT_EQ(warnings(/*sampling=*/true).find("do_sample"), std::string::npos);
  std::ofstream(dir + "/generation_config.json") << R"({"do_sample": "yes"})";
  hf_llama_expect_input_error(
      [&] { load_generation_model("", dir); },
      {"generation_config.json", "$.do_sample", "expected true or false", "\"yes\""});
}

// More new tokens than int64 can add to the prompt: the context's message, not a failure
// of the cache's shape.
TEST(HfLlamaGenerate, HugeMaxNewTokensIsTheContextError) {
  HfLlamaFixture f = hf_llama_load_fixture("llama_gqa");
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(f.dir, st);
  const std::vector<int32_t> prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  hf_llama_expect_input_error([&] { generate(st, prompt, INT64_MAX, SampleOptions{}); },
                              {"9223372036854775807 new tokens need", "context holds"});
}

// A model started from a Hugging Face config exports with its bos, eos and pad token ids
// (transformers would otherwise take LlamaConfig's eos 2); a shorthand writes none.
TEST(HfLlamaExport, TokenIdsOfTheSourceConfigAreKept) {
  nlohmann::json cfg = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  cfg["eos_token_id"] = 30;
  cfg["bos_token_id"] = 1;
  const nlohmann::json out = hf_config_of(load_model_json(cfg, "c.json"), DType::f32);
  EXPECT_EQ(out["eos_token_id"], 30);
  EXPECT_EQ(out["bos_token_id"], 1);
  ASSERT_TRUE(out.contains("pad_token_id"));
  EXPECT_TRUE(out["pad_token_id"].is_null());
  const nlohmann::json sh = hf_config_to_shorthand(JsonReader(cfg, "c.json"));
  EXPECT_FALSE(hf_config_of(load_model_json(sh, "sh.json"), DType::f32).contains("eos_token_id"));
}

// A directory with model.safetensors and an index beside it: transformers reads
// model.safetensors, and so does baton (the index's shards are not opened).
TEST(HfLlamaInput, ModelSafetensorsBesideAnIndexIsReadAsTransformersDoes) {
  const std::string dir = copy_fixture("qwen2_sharded", "both");
  std::vector<NamedTensor> all;
  {
    HfCheckpoint shards(dir);
    for (const std::string& name : shards.names()) {
      const SafetensorsReader* file = nullptr;
      shards.find(name, &file);
      all.push_back({name, file->read(name)});
    }
  }
  const std::string changed = "model.norm.weight";
  for (NamedTensor& t : all)
    if (t.name == changed) {
      Tensor x = t.tensor.to(DType::f32);
      x.data<float>()[0] = 8.0f;  // exact in the shards' bf16
      t.tensor = x.to(t.tensor.dtype());
    }
  write_safetensors(dir + "/model.safetensors", all, {{"format", "pt"}});
  HfCheckpoint both(dir);
  EXPECT_FALSE(both.sharded());
  HfLlamaFixture f = hf_llama_load_fixture("qwen2_sharded");
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_weights(both, st);
  EXPECT_EQ(both.opened(), std::vector<std::string>{"model.safetensors"});
  Stage orig(g, 0, g->num_layers());
  load_hf_weights(f.dir, orig);
  EXPECT_NE(orig.param(changed).to_vector<float>()[0], 8.0f);
  EXPECT_EQ(st.param(changed).to_vector<float>()[0], 8.0f);
}

// llama3 rope scaling as transformers reads it: without original_max_position_embeddings
// it is max_position_embeddings (standardize_rope_params); high_freq_factor not above
// low_freq_factor is refused at the field of config.json, not of the expanded graph.
TEST(HfLlamaInput, Llama3ScalingAsTheFileHasIt) {
  nlohmann::json c = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  c["rope_parameters"] = {{"rope_type", "llama3"},
                          {"factor", 8.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"rope_theta", 50000.0}};
  EXPECT_EQ(parse_hf_llama_config(JsonReader(c, "c.json"))
                .rope_scaling["original_max_position_embeddings"],
            64);
  EXPECT_NO_THROW(load_model_json(c, "c.json"));
  c["rope_parameters"]["original_max_position_embeddings"] = 32;
  c["rope_parameters"]["low_freq_factor"] = 2.0;
  c["rope_parameters"]["high_freq_factor"] = 2.0;
  try {
    load_model_json(c, "c.json");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("c.json: $.rope_parameters.high_freq_factor"), std::string::npos) << what;
    EXPECT_NE(what.find("above low_freq_factor"), std::string::npos) << what;
    EXPECT_EQ(what.find("expanded"), std::string::npos) << what;
  }
}

// The padding_idx of a model's token embedding node (nullopt without one).
std::optional<int64_t> padding_idx(const Graph& g) {
  for (const Node& n : g.nodes)
    if (n.op == "embedding") {
      if (!n.attrs.is_object() || !n.attrs.contains("padding_idx")) return std::nullopt;
      return n.attrs["padding_idx"].get<int64_t>();
    }
  ADD_FAILURE() << "no embedding";
  return std::nullopt;
}

// pad_token_id changes training in transformers (LlamaModel, MistralModel and Qwen2Model
// build nn.Embedding(vocab, hidden, padding_idx=pad_token_id)), so it becomes the
// embedding's padding_idx: null or absent is none, a negative id counts from the end as
// torch's does, one outside the vocabulary is refused naming the field. GPT-2's wte has
// no padding row. The shorthand carries it, an export writes it, and a model that differs
// from the weights' config.json in it is refused.
TEST(HfLlamaInput, PadTokenIdIsTheEmbeddingsPaddingIdx) {
  const nlohmann::json base = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  ASSERT_TRUE(base["pad_token_id"].is_null());
  // nullopt: no pad_token_id at all.
  auto graph_with = [&](std::optional<nlohmann::json> pad, const char* type = "llama") {
    nlohmann::json c = base;
    c["model_type"] = type;
    if (std::string(type) == "mistral") c["sliding_window"] = nullptr;
    if (pad)
      c["pad_token_id"] = *pad;
    else
      c.erase("pad_token_id");
    return load_model_json(c, "c.json");
  };
  EXPECT_EQ(padding_idx(graph_with(nlohmann::json(nullptr))), std::nullopt);
  EXPECT_EQ(padding_idx(graph_with(std::nullopt)), std::nullopt);
  EXPECT_EQ(padding_idx(graph_with(5)), 5);
  EXPECT_EQ(padding_idx(graph_with(0)), 0);
  EXPECT_EQ(padding_idx(graph_with(-1)), 255);
  EXPECT_EQ(padding_idx(graph_with(5, "mistral")), 5);
  EXPECT_EQ(padding_idx(graph_with(5, "qwen2")), 5);
  for (const nlohmann::json& bad :
       {nlohmann::json(256), nlohmann::json(-257), nlohmann::json("5"), nlohmann::json(2.5)})
    hf_llama_expect_input_error(
        [&] { graph_with(bad); },
        {"c.json: $.pad_token_id", "below vocab_size = 256", "found " + json_brief(bad)});

  nlohmann::json gpt2 = read_json_file(fixture_dir("gpt2_tiny") + "/config.json");
  gpt2["pad_token_id"] = 5;
  EXPECT_EQ(padding_idx(load_model_json(gpt2, "g.json")), std::nullopt);

  nlohmann::json cfg = base;
  cfg["pad_token_id"] = 5;
  nlohmann::json sh = hf_config_to_shorthand(JsonReader(cfg, "c.json"));
  EXPECT_EQ(sh["pad_token_id"], 5);
  const Graph from_sh = load_model_json(sh, "sh.json");
  EXPECT_EQ(padding_idx(from_sh), 5);
  EXPECT_EQ(hf_config_of(from_sh, DType::f32)["pad_token_id"], 5);
  sh["pad_token_id"] = 256;
  hf_llama_expect_input_error([&] { load_model_json(sh, "sh.json"); },
                              {"sh.json: $.pad_token_id", "found 256"});
  hf_llama_expect_input_error(
      [&] { check_same_model_math(base, "m.json", cfg, "w/config.json", "why"); },
      {"m.json: $.pad_token_id is null", "w/config.json has 5"});
  check_same_model_math(cfg, "m.json", cfg, "w/config.json", "why");
}

// A config.json that does not describe its weights (another width, more layers) is
// refused from the safetensors headers, naming the file, the tensor and both shapes,
// without a Stage: nothing of the model is allocated. One whose expansion alone would
// exhaust memory is refused while it is read, naming the field.
TEST(HfLlamaInput, WeightsAreCheckedFromTheHeadersBeforeAStage) {
  const std::string dir = fixture_dir("llama_gqa");
  nlohmann::json cfg = read_json_file(dir + "/config.json");
  const Graph fits = load_model_json(cfg, "c.json");
  check_hf_weights(dir, fits, fits.params_used(0, fits.num_layers()));
  cfg.update({{"hidden_size", 2048},
              {"intermediate_size", 5632},
              {"num_attention_heads", 32},
              {"num_key_value_heads", 4},
              {"head_dim", 64},
              {"vocab_size", 32000}});
  const Graph big = load_model_json(cfg, "c.json");
  hf_llama_expect_input_error(
      [&] { check_hf_weights(dir, big, big.params_used(0, big.num_layers())); },
      {dir + "/model.safetensors", "'model.embed_tokens.weight' has shape [256, 32]",
       "[32000, 2048]"});
  // A rank holding only the last layer: its own tensors are checked.
  hf_llama_expect_input_error(
      [&] { check_hf_weights(dir, big, big.params_used(big.num_layers() - 1, big.num_layers())); },
      {dir + "/model.safetensors", "'model.norm.weight' has shape [32]", "[2048]"});
  nlohmann::json deep = read_json_file(dir + "/config.json");
  deep["num_hidden_layers"] = 3;
  const Graph g3 = load_model_json(deep, "c.json");
  hf_llama_expect_input_error(
      [&] { check_hf_weights(dir, g3, g3.params_used(0, g3.num_layers())); },
      {dir + ": no tensor 'model.layers.2.input_layernorm.weight'"});

  // Bounds on the expansion: layers, then parameters in all.
  nlohmann::json huge = read_json_file(dir + "/config.json");
  huge["num_hidden_layers"] = 200000;
  hf_llama_expect_input_error(
      [&] { load_model_json(huge, "c.json"); },
      {"c.json: $.num_hidden_layers", "at most 10000 layers", "found 200000"});
  huge["num_hidden_layers"] = 10000;
  huge["hidden_size"] = 8192;
  huge["head_dim"] = 2048;
  hf_llama_expect_input_error([&] { load_model_json(huge, "c.json"); },
                              {"c.json: $.num_hidden_layers", "2^40 parameters"});
  huge["num_hidden_layers"] = 2;
  huge["vocab_size"] = int64_t(1) << 31;
  hf_llama_expect_input_error([&] { load_model_json(huge, "c.json"); },
                              {"c.json: $.vocab_size", "2^40 parameters"});
  nlohmann::json gpt2 = read_json_file(fixture_dir("gpt2_tiny") + "/config.json");
  gpt2["n_layer"] = 10001;
  hf_llama_expect_input_error([&] { load_model_json(gpt2, "g.json"); },
                              {"g.json: $.n_layer", "at most 10000 layers"});
}

// transformers' LlamaModel cannot run a sliding_attention layer: refused naming the entry,
// as Qwen2's; Mistral ignores the entries (its window is sliding_window's).
TEST(HfLlamaInput, LlamaRefusesSlidingAttentionLayers) {
  nlohmann::json c = {{"model_type", "llama"},
                      {"hidden_size", 64},
                      {"intermediate_size", 48},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 50},
                      {"max_position_embeddings", 64},
                      {"layer_types", {"full_attention", "sliding_attention"}}};
  hf_llama_expect_input_error([&] { parse_hf_llama_config(JsonReader(c, "c.json")); },
                              {"c.json: $.layer_types[1]", "full_attention"});
  c["model_type"] = "mistral";
  c["sliding_window"] = nullptr;
  EXPECT_NO_THROW(parse_hf_llama_config(JsonReader(c, "c.json")));
}

// A transformers 5 file's rope fields sit in $.rope_parameters: a mismatch names them
// there, not $.rope_scaling or $.rope_theta, which the file does not have.
TEST(HfLlamaInput, RopeMismatchNamesRopeParametersPath) {
  nlohmann::json hf = read_json_file(fixture_dir("llama_gqa") + "/config.json");
  hf.erase("rope_parameters");
  hf.erase("rope_scaling");
  nlohmann::json mine = hf;
  mine["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  hf_llama_expect_input_error(
      [&] { check_same_model_math(mine, "m.json", hf, "config.json", "why"); },
      {"m.json: $.rope_parameters.rope_type is \"linear\", but config.json has \"default\""});
  hf["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  hf_llama_expect_input_error(
      [&] { check_same_model_math(mine, "m.json", hf, "config.json", "why"); },
      {"m.json: $.rope_parameters.factor is 2.0, but config.json has 4.0"});
  hf["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  hf["rope_theta"] = 500000.0;
  hf_llama_expect_input_error(
      [&] { check_same_model_math(mine, "m.json", hf, "config.json", "why"); },
      {"m.json: $.rope_parameters.rope_theta is 10000.0, but config.json has 500000.0"});
}

// GPT-2's n_inner of 4·n_embd is its default: written or null/absent, one model.
TEST(HfLlamaInput, Gpt2ExplicitDefaultInnerIsTheSameModel) {
  nlohmann::json hf = read_json_file(fixture_dir("gpt2_tiny") + "/config.json");
  hf["n_inner"] = nullptr;
  nlohmann::json sh = hf_config_to_shorthand(JsonReader(hf, "config.json"));
  sh.erase("n_inner");
  const int64_t inner = 4 * sh["n_embd"].get<int64_t>();
  sh["n_inner"] = inner;
  EXPECT_NO_THROW(check_same_model_math(sh, "m.json", hf, "config.json", "why"));
  sh.erase("n_inner");
  hf["n_inner"] = inner;
  EXPECT_NO_THROW(check_same_model_math(sh, "m.json", hf, "config.json", "why"));
  sh["n_inner"] = 2 * inner;
  hf_llama_expect_input_error(
      [&] { check_same_model_math(sh, "m.json", hf, "config.json", "why"); },
      {"m.json: $.n_inner is " + std::to_string(2 * inner)});
}

// A checkpoint keeps its --init-from directory's stop ids (generation_config.json's) in
// $.train.eos_token_ids; one written before them has none.
TEST(HfLlamaGenerate, CheckpointKeepsTheDirectorysStopIds) {
  Manifest m;
  m.train = {{"batch", 1}};
  EXPECT_FALSE(checkpoint_eos_token_ids(m, "manifest.json").has_value());
  m.train["eos_token_ids"] = {59, 36};
  EXPECT_EQ(checkpoint_eos_token_ids(m, "manifest.json").value(), (std::vector<int32_t>{59, 36}));
  m.train["eos_token_ids"] = nlohmann::json::array();
  EXPECT_EQ(checkpoint_eos_token_ids(m, "manifest.json").value(), std::vector<int32_t>{});
}

}  // namespace
}  // namespace baton::stages
