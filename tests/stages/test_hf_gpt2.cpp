// A GPT-2 saved by Hugging Face transformers (tests/fixtures/gpt2_tiny, made by
// tests/fixtures/make_gpt2_fixture.py) loads into baton and gives the loss transformers
// computed on the same tokens (float32 and float64) and the same gradients (float64).
#include <cmath>
#include <filesystem>
#include <limits>

#include "stages/checkpoint.h"
#include "stages/generate.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "tests/stages/helpers.h"

namespace baton::stages {
namespace {

const std::string kDir = std::string(BATON_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

struct HfGpt2Fixture {
  nlohmann::json expected;
  Tensor tokens, targets;
  std::shared_ptr<Graph> graph(DType dtype) const {
    std::string path = kDir + "/config.json";
    nlohmann::json cfg = read_json_file(path);
    Gpt2Config c = parse_hf_gpt2_config(JsonReader(cfg, path));
    c.context = tokens.size(1);
    LoadOptions lo;
    lo.float_dtype = dtype;
    return std::make_shared<Graph>(load_model_json(c.to_json(), path, lo));
  }
};

HfGpt2Fixture hf_gpt2_load_fixture() {
  HfGpt2Fixture f;
  f.expected = read_json_file(kDir + "/expected.json");
  f.tokens = testing::int_rows(f.expected["tokens"]);
  f.targets = testing::int_rows(f.expected["targets"]);
  return f;
}

double loss_of(Stage& st, const HfGpt2Fixture& f, bool backward) {
  int64_t b = f.tokens.size(0);
  MicroBatch mb{0, 0, b, b, double(f.targets.numel()), 0};
  TensorMap out = st.forward(mb, {{"tokens", f.tokens}, {"targets", f.targets}}, backward);
  if (backward) {
    st.zero_grad();
    st.backward(0);
    st.finish_grads();
  }
  return testing::value_of(out.at("loss"));
}

TEST(HfGpt2, LossMatchesTransformersF32) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_gpt2(kDir, st);
  double expect = f.expected["loss_f32"].get<double>();
  EXPECT_NEAR(loss_of(st, f, false), expect, 2e-6 * expect);
}

TEST(HfGpt2, LossAndGradientsMatchTransformersF64) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  auto g = f.graph(DType::f64);
  Stage st(g, 0, g->num_layers());
  load_hf_gpt2(kDir, st);
  double expect = f.expected["loss_f64"].get<double>();
  EXPECT_NEAR(loss_of(st, f, true), expect, 1e-12 * expect);
  const auto& norms = f.expected["grad_norms_f64"];
  EXPECT_EQ(norms.size(), st.param_ids().size());
  for (int id : st.param_ids()) {
    const std::string& name = g->params[size_t(id)].name;
    ASSERT_TRUE(norms.contains(name)) << name;
    double n = std::sqrt(kernels::sum_squares(st.grad(id)));
    double e = norms[name].get<double>();
    EXPECT_NEAR(n, e, 1e-9 * e) << name;
  }
}

// A prompt read at once (the training kernel's causal attention) and one token at a time
// (the cache's per-row attention) give the same logits.
TEST(HfGpt2, PromptAtOnceEqualsTokenByToken) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  auto g = f.graph(DType::f32);
  Stage st(g, 0, g->num_layers());
  load_hf_gpt2(kDir, st);
  const int64_t t = f.tokens.size(1);
  std::vector<int32_t> seq;
  for (int64_t i = 0; i < t; ++i) seq.push_back(int32_t(f.tokens.to_vector<int32_t>()[size_t(i)]));
  Generator whole(st, t), pieces(st, t);
  const std::vector<float> a = whole.feed(seq);
  std::vector<float> b;
  for (int32_t tok : seq) b = pieces.feed({tok});
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(a[i]) * double(a[i]);
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);
}

TEST(HfGpt2, SavedCheckpointLoadsBack) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  auto g = f.graph(DType::f32);
  Stage a(g, 0, g->num_layers());
  load_hf_gpt2(kDir, a);
  std::string dir = ::testing::TempDir() + "/baton_hf_roundtrip";
  save_hf_gpt2(dir, a);
  Stage b(g, 0, g->num_layers(), StageOptions{memory::Device::cpu(), 99});
  load_hf_gpt2(dir, b);
  for (int id : a.param_ids())
    EXPECT_EQ(a.param(id).to_vector<float>(), b.param(id).to_vector<float>());
  nlohmann::json cfg = read_hf_config(dir);
  EXPECT_EQ(cfg["n_layer"], 2);
}

// A GPT-2 read from a Hugging Face config exports with that config's token ids (its
// vocabulary has no id 50256, the class default, which export writes as null otherwise).
TEST(HfGpt2, ExportKeepsTheConfigsTokenIds) {
  const std::string path = kDir + "/config.json";
  nlohmann::json cfg = read_json_file(path);
  cfg["eos_token_id"] = 7;
  Graph g = load_model_json(cfg, path);
  const nlohmann::json out = hf_config_of(g, DType::f32);
  EXPECT_EQ(out["eos_token_id"], 7);
  EXPECT_EQ(out["bos_token_id"], cfg["bos_token_id"]);
}

TEST(HfGpt2, MissingTensorIsAnInputError) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  // A model with a third layer needs h.2.* that the file does not have.
  std::string path = kDir + "/config.json";
  nlohmann::json cfg = read_json_file(path);
  cfg["n_layer"] = 3;
  auto g = std::make_shared<Graph>(load_model_json(cfg, path));
  Stage st(g, 0, g->num_layers());
  try {
    load_hf_gpt2(kDir, st);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h.2.ln_1.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

// f16 holds at most 65504: an export as f16 of a weight it rounds to inf is refused naming
// the tensor and its magnitude, before anything is written (it had been written as inf);
// bf16 holds it, up to its own range. A Hugging Face directory with a non-finite weight is refused
// by --init-from's load naming the file and the tensor (training had died with "loss is -nan at
// step 1").
TEST(HfGpt2, F16ExportOfAnOutOfRangeWeightAndANonFiniteLoadAreRefused) {
  HfGpt2Fixture f = hf_gpt2_load_fixture();
  auto g = f.graph(DType::f32);
  Stage a(g, 0, g->num_layers());
  load_hf_gpt2(kDir, a);
  const int id = a.param_ids().front();
  const std::string stored = hf_tensor_name(*g, g->params[size_t(id)].name);
  Tensor& w = a.param(id);
  w.view({w.numel()}).narrow(0, 1, 1).fill_(-1e5);
  const std::string out = ::testing::TempDir() + "/baton_hf_f16_range";
  std::filesystem::remove_all(out);
  HfWriteOptions wo;
  wo.dtype = DType::f16;
  try {
    save_hf(out, a, wo);
    FAIL() << "an f16 export wrote -1e5";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor '" + stored + "' holds values up to 100000 in magnitude"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("65504"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--dtype bf16 or f32"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written
  wo.dtype = DType::bf16;
  save_hf(out, a, wo);
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors"));
  // bf16 rounds 3.4e38 to inf too (it had been written, and --init-from then refused it);
  // 65519 rounds to f16's 65504, as torch's .to() does.
  w.view({w.numel()}).narrow(0, 1, 1).fill_(3.4e38);
  // Into new nested directories: a failed export removes each it made, not only the last.
  const std::string big_root = ::testing::TempDir() + "/baton_hf_bf16_range";
  const std::string big = big_root + "/nested/out";
  std::filesystem::remove_all(big_root);
  try {
    save_hf(big, a, wo);
    FAIL() << "a bf16 export wrote 3.4e38 as inf";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype bf16: tensor '" + stored +
                                         "' holds values up "
                                         "to 3.4e+38 in magnitude, beyond bf16's range"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(big_root));
  w.view({w.numel()}).narrow(0, 1, 1).fill_(65519);
  wo.dtype = DType::f16;
  save_hf(big, a, wo);
  EXPECT_TRUE(std::filesystem::exists(big + "/model.safetensors"));

  // f32 stores inf as it is; loading it back is refused.
  const std::string bad = ::testing::TempDir() + "/baton_hf_inf";
  w.view({w.numel()}).narrow(0, 1, 1).fill_(std::numeric_limits<double>::infinity());
  save_hf(bad, a, HfWriteOptions{});
  Stage b(g, 0, g->num_layers());
  try {
    load_hf_gpt2(bad, b);
    FAIL() << "loaded a weight that is inf";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad + "/model.safetensors: tensor '" + stored + "' holds inf"),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace baton::stages
