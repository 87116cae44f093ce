#include "stages/generate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <tuple>
#include <utility>

#include "kernels/ops.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/json_object.h"
#include "stages/checkpoint.h"
#include "stages/hf.h"
#include "stages/json_reader.h"
#include "stages/model.h"
#include "stages/shorthands.h"

namespace baton::stages {

using nlohmann::json;

namespace {

// The model's hyper-parameters as the generator needs them.
struct Spec {
  bool llama = false;
  int64_t layers = 0, C = 0, H = 0, KV = 0, D = 0, V = 0, max_pos = 0;
  double eps = 1e-5;
  std::vector<double> inv_freq;
  bool tied = true;
};

Spec spec_of(const Graph& g) {
  JsonReader r(g.config, g.source);
  json sh = g.config.is_object() && g.config.contains("model_type") ? hf_config_to_shorthand(r)
                                                                    : g.config;
  const std::string type =
      sh.is_object() && sh.contains("type") ? sh["type"].get<std::string>() : "";
  Spec s;
  if (type == "gpt2") {
    Gpt2Config c = parse_gpt2_shorthand(JsonReader(sh, g.source));
    s.layers = c.n_layer;
    s.C = c.n_embd;
    s.H = s.KV = c.n_head;
    s.D = c.n_embd / c.n_head;
    s.V = c.vocab_size;
    s.max_pos = c.n_positions;
    s.eps = c.layer_norm_epsilon;
    return s;
  }
  if (type == "llama") {
    LlamaConfig c = parse_llama_shorthand(JsonReader(sh, g.source));
    s.llama = true;
    s.layers = c.num_hidden_layers;
    s.C = c.hidden_size;
    s.H = c.num_attention_heads;
    s.KV = c.kv_heads();
    s.D = c.head_size();
    s.V = c.vocab_size;
    s.max_pos = c.max_position_embeddings;
    s.eps = c.rms_norm_eps;
    s.tied = c.tie_word_embeddings;
    // The rotary op's frequencies: read from the graph's first rotary node (its attrs
    // hold rope_theta and rope_scaling exactly as the model trains with).
    kernels::RopeScaling sc;
    if (!c.rope_scaling.is_null()) {
      const json& j = c.rope_scaling;
      const std::string t = j.contains("rope_type") ? j["rope_type"].get<std::string>()
                                                    : j.value("type", std::string("default"));
      if (t == "linear") {
        sc.kind = kernels::RopeScaling::Kind::linear;
        sc.factor = j["factor"].get<double>();
      } else if (t == "llama3") {
        sc.kind = kernels::RopeScaling::Kind::llama3;
        sc.factor = j["factor"].get<double>();
        sc.low_freq_factor = j["low_freq_factor"].get<double>();
        sc.high_freq_factor = j["high_freq_factor"].get<double>();
        sc.original_max_position_embeddings = j["original_max_position_embeddings"].get<double>();
      }
    }
    s.inv_freq = kernels::rope_inv_freq(s.D, c.rope_theta, sc);
    return s;
  }
  throw InputError(g.source + ": generation needs a gpt2 or llama model");
}

}  // namespace

struct Generator::Impl {
  const Stage& st;
  Spec s;
  int64_t cap = 0, pos = 0;
  std::vector<Tensor> kcache, vcache;  // per layer [cap, KV * D], float

  Impl(const Stage& stage, int64_t max_positions) : st(stage), s(spec_of(stage.graph())) {
    if (!st.is_first() || !st.is_last())
      throw RuntimeError("generation needs the whole model in one stage");
    cap = std::min(max_positions, s.max_pos);
    for (int64_t l = 0; l < s.layers; ++l) {
      kcache.push_back(Tensor::zeros({cap, s.KV * s.D}));
      vcache.push_back(Tensor::zeros({cap, s.KV * s.D}));
    }
  }

  Tensor p(const std::string& name) const { return st.param(name).to(memory::DType::f32); }
  Tensor maybe(const std::string& name) const {
    return st.graph().find_param(name) >= 0 ? p(name) : Tensor();
  }

  // y = x W^T (+ b) for x [n, in], W [out, in] (or [in, out] for GPT-2's Conv1D).
  static Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool in_out) {
    const int64_t out = in_out ? w.size(1) : w.size(0);
    Tensor y = Tensor::empty({x.size(0), out});
    kernels::linear_forward(
        x, w, b, in_out ? kernels::WeightLayout::in_out : kernels::WeightLayout::out_in, y);
    return y;
  }

  // A prompt read from position 0: qkv [n, (H + 2 KV) D] holds every key and value, so the
  // training kernel's causal attention computes it (blocked, threaded); the per-row loop
  // below had taken O(n^2) scalar time, 4-10x transformers' for prompts of 1-3k tokens.
  Tensor attend_prompt(const Tensor& qkv, int64_t n) const {
    Tensor out = Tensor::empty({1, n, s.H * s.D}), lse = Tensor::empty({1, s.H, n});
    kernels::AttentionOptions opt;
    opt.heads = s.H;
    opt.kv_heads = s.KV;
    kernels::attention_forward(qkv.view({1, n, (s.H + 2 * s.KV) * s.D}), opt, out, lse);
    return out.view({n, s.H * s.D});
  }

  // Causal attention of n new queries q [n, H D] at positions pos..pos+n-1 against the
  // cache (keys and values of positions 0..pos+n-1 already stored); out [n, H D].
  Tensor attend(const Tensor& q, int64_t l, int64_t n) const {
    const int64_t H = s.H, KV = s.KV, D = s.D, G = H / KV;
    Tensor out = Tensor::zeros({n, H * D});
    const float* qd = q.data<float>();
    const float* kd = kcache[size_t(l)].data<float>();
    const float* vd = vcache[size_t(l)].data<float>();
    float* od = out.data<float>();
    const double scale = 1.0 / std::sqrt(double(D));
    std::vector<double> sc(size_t(pos + n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t last = pos + i, kvh = h / G;
        double mx = -1e300;
        for (int64_t j = 0; j <= last; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += double(qd[i * H * D + h * D + e]) * double(kd[j * KV * D + kvh * D + e]);
          sc[size_t(j)] = d * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += (sc[size_t(j)] = std::exp(sc[size_t(j)] - mx));
        for (int64_t j = 0; j <= last; ++j) {
          const double w = sc[size_t(j)] / sum;
          for (int64_t e = 0; e < D; ++e)
            od[i * H * D + h * D + e] += float(w * double(vd[j * KV * D + kvh * D + e]));
        }
      }
    return out;
  }

  std::vector<float> feed(const std::vector<int32_t>& tokens) {
    const int64_t n = int64_t(tokens.size());
    if (n == 0) throw InputError("generation: nothing to feed");
    if (pos + n > cap)
      throw InputError("generation: " + std::to_string(pos + n) + " positions exceed the model's " +
                       std::to_string(cap));
    for (int32_t t : tokens)
      if (t < 0 || t >= s.V)
        throw InputError("generation: token id " + std::to_string(t) +
                         " outside the vocabulary [0, " + std::to_string(s.V) + ")");
    const Tensor ids = Tensor::from_vector(std::vector<int32_t>(tokens), {n});
    const std::string emb = s.llama ? "model.embed_tokens.weight" : "wte.weight";
    Tensor x = Tensor::empty({n, s.C});
    kernels::embedding_forward(ids, p(emb), 0, x, false);
    if (!s.llama) {
      Tensor wpe = p("wpe.weight").narrow(0, pos, n).contiguous();
      kernels::add_inplace(x, wpe);
    }
    auto norm = [&](const Tensor& in, const std::string& name) {
      Tensor y = Tensor::empty(in.shape());
      Tensor rstd = Tensor::empty({in.size(0)}), mean = Tensor::empty({in.size(0)});
      if (s.llama)
        kernels::rmsnorm_forward(in, p(name + ".weight"), s.eps, y, rstd);
      else
        kernels::layernorm_forward(in, p(name + ".weight"), p(name + ".bias"), s.eps, y, mean,
                                   rstd);
      return y;
    };
    const int64_t qd = s.H * s.D, kvd = s.KV * s.D;
    for (int64_t l = 0; l < s.layers; ++l) {
      Tensor q;
      Tensor kc = kcache[size_t(l)].narrow(0, pos, n), vc = vcache[size_t(l)].narrow(0, pos, n);
      if (s.llama) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        Tensor h = norm(x, pre + "input_layernorm");
        const std::string at = pre + "self_attn.";
        Tensor qq = linear(h, p(at + "q_proj.weight"), maybe(at + "q_proj.bias"), false);
        Tensor kk = linear(h, p(at + "k_proj.weight"), maybe(at + "k_proj.bias"), false);
        Tensor vv = linear(h, p(at + "v_proj.weight"), maybe(at + "v_proj.bias"), false);
        Tensor qkv = Tensor::empty({1, n, qd + 2 * kvd});
        kernels::RotaryOptions ro{s.H, &s.inv_freq, pos};
        kernels::rotary_forward(qq.view({1, n, qd}), ro, qkv, 0);
        ro.heads = s.KV;
        kernels::rotary_forward(kk.view({1, n, kvd}), ro, qkv, qd);
        q = qkv.view({n, qd + 2 * kvd}).narrow(1, 0, qd).contiguous();
        kc.copy_from(qkv.view({n, qd + 2 * kvd}).narrow(1, qd, kvd));
        vc.copy_from(vv);
        Tensor o;
        if (pos == 0 && n > 1) {
          qkv.view({n, qd + 2 * kvd}).narrow(1, qd + kvd, kvd).copy_from(vv);
          o = attend_prompt(qkv, n);
        } else {
          o = attend(q, l, n);
        }
        kernels::add_inplace(x,
                             linear(o, p(at + "o_proj.weight"), maybe(at + "o_proj.bias"), false));
        Tensor h2 = norm(x, pre + "post_attention_layernorm");
        const std::string m = pre + "mlp.";
        Tensor gate = linear(h2, p(m + "gate_proj.weight"), maybe(m + "gate_proj.bias"), false);
        Tensor up = linear(h2, p(m + "up_proj.weight"), maybe(m + "up_proj.bias"), false);
        Tensor act = Tensor::empty(gate.shape());
        kernels::swiglu_forward(gate, up, act);
        kernels::add_inplace(
            x, linear(act, p(m + "down_proj.weight"), maybe(m + "down_proj.bias"), false));
      } else {
        const std::string pre = "h." + std::to_string(l) + ".";
        Tensor h = norm(x, pre + "ln_1");
        Tensor qkv = linear(h, p(pre + "attn.c_attn.weight"), p(pre + "attn.c_attn.bias"), true);
        kc.copy_from(qkv.narrow(1, qd, kvd));
        vc.copy_from(qkv.narrow(1, qd + kvd, kvd));
        Tensor o = pos == 0 && n > 1 ? attend_prompt(qkv, n)
                                     : attend(qkv.narrow(1, 0, qd).contiguous(), l, n);
        kernels::add_inplace(
            x, linear(o, p(pre + "attn.c_proj.weight"), p(pre + "attn.c_proj.bias"), true));
        Tensor h2 = norm(x, pre + "ln_2");
        Tensor f = linear(h2, p(pre + "mlp.c_fc.weight"), p(pre + "mlp.c_fc.bias"), true);
        Tensor act = Tensor::empty(f.shape());
        kernels::gelu_forward(f, act);
        kernels::add_inplace(
            x, linear(act, p(pre + "mlp.c_proj.weight"), p(pre + "mlp.c_proj.bias"), true));
      }
    }
    pos += n;
    // Only the last position's logits are needed.
    Tensor last = x.narrow(0, n - 1, 1).contiguous();
    Tensor hn = norm(last, s.llama ? "model.norm" : "ln_f");
    const std::string head =
        s.llama ? (s.tied ? "model.embed_tokens.weight" : "lm_head.weight") : "wte.weight";
    Tensor logits = linear(hn, p(head), Tensor(), false);
    return logits.to_vector<float>();
  }
};

Generator::Generator(const Stage& stage, int64_t max_positions)
    : impl_(std::make_unique<Impl>(stage, max_positions)) {}
Generator::~Generator() = default;
std::vector<float> Generator::feed(const std::vector<int32_t>& tokens) {
  return impl_->feed(tokens);
}
int64_t Generator::position() const {
  return impl_->pos;
}
int64_t Generator::capacity() const {
  return impl_->cap;
}
int64_t Generator::vocab_size() const {
  return impl_->s.V;
}

namespace {
uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opt, uint64_t& rng) {
  // NaN fails every comparison below and would draw the least likely token.
  if (std::isnan(opt.temperature))
    throw InputError("sampling: the temperature is NaN (expected a value >= 0)");
  // A diverged model's logits: greedy takes the first NaN as torch's argmax does; sampling
  // has no distribution (torch's multinomial refuses it too), where every NaN had drawn
  // the last token in the sort.
  const auto bad = std::find_if(logits.begin(), logits.end(),
                                [](float x) { return std::isnan(x) || x == INFINITY; });
  if (opt.temperature <= 0)
    return int32_t((bad != logits.end() && std::isnan(*bad)
                        ? bad
                        : std::max_element(logits.begin(), logits.end())) -
                   logits.begin());
  if (bad != logits.end())
    throw RuntimeError("sampling: the model's logit of token " +
                       std::to_string(bad - logits.begin()) + " is " +
                       (std::isnan(*bad) ? "nan" : "inf") +
                       ": no distribution to sample from (are the weights finite?)");
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = idx.size();
  if (opt.top_k > 0) {
    keep = std::min(keep, size_t(opt.top_k));
    // Tokens tied with the k-th stay, as transformers' top-k keeps every score not below
    // it (padded vocabulary rows tie exactly).
    while (keep < idx.size() && logits[size_t(idx[keep])] == logits[size_t(idx[keep - 1])]) ++keep;
  }
  std::vector<double> pr(keep);
  const double mx = logits[size_t(idx[0])];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += (pr[i] = std::exp((double(logits[size_t(idx[i])]) - mx) / opt.temperature));
  if (opt.top_p < 1) {
    double acc = 0;
    size_t n = 0;
    while (n < keep) {
      acc += pr[n++] / sum;
      if (acc >= opt.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += pr[i];
  }
  const double u = double(splitmix(rng) >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += pr[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(const Stage& stage, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SampleOptions& opt,
                              const std::vector<int32_t>& stop, GenerationTimes* times) {
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Checked before the first token: the last new token is sampled, never fed. Unsigned,
  // so that any max_new counts without overflow.
  const uint64_t positions = uint64_t(prompt.size()) + uint64_t(std::max<int64_t>(max_new, 0));
  const uint64_t need = positions > 0 ? positions - 1 : 0;
  Generator gen(stage, int64_t(std::min<uint64_t>(positions, uint64_t(INT64_MAX))));
  if (need > uint64_t(gen.capacity()))
    throw InputError(
        "generation: a prompt of " + std::to_string(prompt.size()) + " tokens and " +
        std::to_string(max_new) + " new tokens need " + std::to_string(need) +
        " positions; the model's context holds " + std::to_string(gen.capacity()) +
        // The position table bounds generation, not the training window.
        // A Mistral's sliding_window, where smaller, capped it at import.
        (spec_of(stage.graph()).llama
             ? " (its max_position_embeddings, or a Mistral's sliding_window where smaller)"
             : " (its n_positions)") +
        (int64_t(prompt.size()) <= gen.capacity()
             ? " (at most " + std::to_string(gen.capacity() - int64_t(prompt.size()) + 1) +
                   " new tokens after this prompt)"
             : ""));
  uint64_t rng = opt.seed;
  std::vector<int32_t> out;
  std::vector<float> logits = gen.feed(prompt);
  for (int64_t i = 0; i < max_new; ++i) {
    const int32_t t = sample_token(logits, opt, rng);
    out.push_back(t);
    if (times && i == 0) times->first_token_s = since();
    if (std::find(stop.begin(), stop.end(), t) != stop.end() || i + 1 == max_new) break;
    logits = gen.feed({t});
  }
  if (times) times->total_s = since();
  return out;
}

std::vector<int32_t> GenerationModel::stop_ids(int32_t tokenizer_eos) const {
  if (eos_ids) return *eos_ids;
  if (tokenizer_eos >= 0) return {tokenizer_eos};
  return {};
}

namespace {
// transformers' generate samples with a generation_config.json's do_sample, temperature,
// top_k and top_p by default (temperature 1 and top_k 50 where the file gives none);
// baton generate decodes as its flags say. When they decode greedily, said, with the
// flags that sample alike, rather than decoding greedily without a word. Logits processors
// baton does not have (a repetition penalty, n-gram blocking, beams, suppressed tokens)
// change transformers' output greedy or not: said whenever the file sets them.
void warn_unused_generation_config(const std::string& hf_dir, bool sampling) {
  const std::string path = hf_dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  nlohmann::json j;
  try {
    j = memory::parse_json_text(memory::read_file(path), path);
  } catch (const InputError&) {
    return;  // its eos ids were read (and checked) already
  }
  if (!j.is_object()) return;
  const bool file_samples = j.contains("do_sample") && j["do_sample"] == true;
  // Each with the value at which it changes nothing (null: any value but null changes; an
  // empty list none). The warpers act only on a sampling run (transformers applies them
  // under do_sample alone); the processors on every run, greedy too.
  std::string unsupported;
  for (const auto& [key, neutral, warper] :
       {std::tuple<const char*, json, bool>{"repetition_penalty", 1.0, false},
        {"encoder_repetition_penalty", 1.0, false},
        {"no_repeat_ngram_size", 0, false},
        {"num_beams", 1, false},
        {"min_new_tokens", 0, false},
        {"min_length", 0, false},
        {"bad_words_ids", nullptr, false},
        {"suppress_tokens", nullptr, false},
        {"begin_suppress_tokens", nullptr, false},
        {"forced_bos_token_id", nullptr, false},
        {"forced_eos_token_id", nullptr, false},
        {"sequence_bias", nullptr, false},
        {"min_p", nullptr, true},
        {"typical_p", 1.0, true},
        {"epsilon_cutoff", 0.0, true},
        {"eta_cutoff", 0.0, true}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (warper && !sampling && !file_samples) continue;
    if (j[key].is_array() && j[key].empty()) continue;
    if (neutral.is_number() && j[key].is_number() && j[key].get<double>() == neutral.get<double>())
      continue;
    unsupported +=
        (unsupported.empty() ? "" : ", ") + std::string(key) + " " + brief(j[key].dump());
  }
  if (!unsupported.empty())
    spdlog::warn(
        "{}: {}: transformers' generate applies {}, baton generate does not: its tokens will "
        "differ from transformers' (remove {} from the file to compare them)",
        path, unsupported, unsupported.find(',') == std::string::npos ? "it" : "them",
        unsupported.find(',') == std::string::npos ? "it" : "them");
  if (sampling || !j.contains("do_sample") || j["do_sample"].is_null()) return;
  if (!j["do_sample"].is_boolean())
    throw InputError(path + ": $.do_sample: expected true or false, found " +
                     brief(j["do_sample"].dump()));
  if (!j["do_sample"].get<bool>()) return;
  std::string flags;
  for (const auto& [key, flag, unset] :
       {std::tuple<const char*, const char*, const char*>{"temperature", "--temperature", "1"},
        {"top_k", "--top-k", "50"},
        {"top_p", "--top-p", nullptr}}) {
    const bool given = j.contains(key) && j[key].is_number();
    if (given || unset != nullptr)
      flags += std::string(" ") + flag + " " + (given ? j[key].dump() : unset);
  }
  spdlog::warn(
      "{}: do_sample is true (transformers' generate samples by default); baton generate "
      "decodes as its flags say, greedily without --temperature: give{} to sample as it "
      "would",
      path, flags);
}
}  // namespace

GenerationModel load_generation_model(const std::string& checkpoint, const std::string& hf_dir,
                                      const std::string& model_path, bool sampling) {
  if (checkpoint.empty() == hf_dir.empty())
    throw InputError("give exactly one of --checkpoint and --init-from");
  json given;
  GenerationModel m;
  if (!model_path.empty()) given = read_json_file(model_path);
  // The graph and stage of the weights' model, or of --model when it computes the same.
  auto build = [&](json model_json, const std::string& source) {
    if (!model_path.empty()) {
      // Another model JSON may change the context or dropout, not what the weights compute.
      check_same_model_math(given, model_path, model_json, source, "the weights were made for it");
      model_json = given;
    }
    m.graph = std::make_shared<Graph>(
        load_model_json(model_json, model_path.empty() ? source : model_path));
    StageOptions loaded;
    loaded.init = false;  // the checkpoint's or the directory's weights fill every one
    loaded.gradients = false;
    m.stage = std::make_unique<Stage>(m.graph, 0, m.graph->num_layers(), loaded);
  };
  if (!checkpoint.empty()) {
    // Read again when a live run prunes the step being read (read_checkpoint).
    read_checkpoint(checkpoint, [&](const std::string& step_dir) {
      const Manifest manifest = read_manifest(step_dir);
      const std::string source = step_dir + "/manifest.json: $.model";
      // The --init-from directory's (its generation_config.json's), else config.json's.
      m.eos_ids = checkpoint_eos_token_ids(manifest, step_dir + "/manifest.json");
      if (!m.eos_ids) m.eos_ids = model_eos_token_ids(manifest.model, source);
      build(manifest.model, source);
      load_stage(step_dir, manifest, *m.stage, false);
    });
  } else {
    // At the context of a --model, which replaces config.json's (a Mistral's window).
    json config = read_hf_model_config(
        hf_dir, model_path.empty() ? std::nullopt : model_json_context(given, model_path));
    m.eos_ids = hf_eos_token_ids(hf_dir);
    warn_unused_generation_config(hf_dir, sampling);
    build(std::move(config), hf_dir + "/config.json");
    load_hf_weights(hf_dir, *m.stage);
  }
  m.vocab_size = spec_of(*m.graph).V;
  return m;
}

}  // namespace baton::stages
