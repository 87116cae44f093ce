// The GPT-2-style training step on one GPU through kernels/ (the CUDA backend), timed
// with CUDA events: tokens/s and model FLOP utilisation, with the loss to show it learns.
// bench/pytorch/gpt_step.py runs the same model, precision and batch in PyTorch eager;
// tools/gpu-check.sh runs both in one go.
//
//   gpt_step [--layers 12 --hidden 768 --heads 12 --ctx 1024 --batch 8 --vocab 50304
//             --steps 20 --warmup 5 --dtype bf16|f32 --tf32 0|1 --peak-tflops 989
//             --attention auto|flash|cublas|cudnn]
//
// bf16 is mixed precision: f32 master weights, Adam moments and gradients; bf16 working
// copies of the matrices, bf16 activations, f32 LayerNorm statistics and log-sum-exps.
// FLOPs per step: 6 N tokens + 12 L ctx hidden tokens (N: the matrix weights, the tied
// output projection included), as docs/benchmarks.md counts them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/mixed_precision.h"
#include "kernels/ops.h"
#include "memory/cuda_device.h"

using namespace baton;
using kernels::WeightLayout;
using memory::Device;
using memory::DType;
using memory::Shape;
using memory::Tensor;

namespace {

struct Config {
  int64_t layers = 12, hidden = 768, heads = 12, ctx = 1024, batch = 8, vocab = 50304;
  int steps = 20, warmup = 5;
  DType dtype = DType::bf16;
  bool tf32 = false;
  kernels::cuda::AttentionImpl attention = kernels::cuda::AttentionImpl::automatic;
  double peak_tflops = 989.0;  // H200 SXM dense bf16 (datasheet); f32 runs name their own
};

Config parse(int argc, char** argv) {
  Config c;
  std::map<std::string, std::string> kv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "gpt_step: expected --name value, got %s\n", argv[i]);
      std::exit(2);
    }
    kv[argv[i] + 2] = argv[i + 1];
  }
  auto num = [&](const char* k, int64_t& v) {
    if (auto it = kv.find(k); it != kv.end()) v = std::stoll(it->second), kv.erase(it);
  };
  int64_t steps = c.steps, warmup = c.warmup, tf32 = 0;
  num("layers", c.layers), num("hidden", c.hidden), num("heads", c.heads), num("ctx", c.ctx);
  num("batch", c.batch), num("vocab", c.vocab), num("steps", steps), num("warmup", warmup);
  num("tf32", tf32);
  c.steps = int(steps), c.warmup = int(warmup), c.tf32 = tf32 != 0;
  if (auto it = kv.find("dtype"); it != kv.end())
    c.dtype = memory::parse_dtype(it->second), kv.erase(it);
  if (auto it = kv.find("attention"); it != kv.end()) {
    if (it->second == "flash")
      c.attention = kernels::cuda::AttentionImpl::flash;
    else if (it->second == "cublas")
      c.attention = kernels::cuda::AttentionImpl::cublas;
    else if (it->second == "cudnn")  // cuDNN's fused forward, our backward
      c.attention = kernels::cuda::AttentionImpl::cudnn;
    else if (it->second != "auto")
      std::fprintf(stderr, "gpt_step: --attention auto|flash|cublas|cudnn\n"), std::exit(2);
    kv.erase(it);
  }
  if (auto it = kv.find("peak-tflops"); it != kv.end())
    c.peak_tflops = std::stod(it->second), kv.erase(it);
  if (!kv.empty()) {
    std::fprintf(stderr, "gpt_step: unknown option --%s\n", kv.begin()->first.c_str());
    std::exit(2);
  }
  if (c.hidden % c.heads != 0 || (c.dtype != DType::bf16 && c.dtype != DType::f32)) {
    std::fprintf(stderr, "gpt_step: hidden must divide by heads; dtype bf16 or f32\n");
    std::exit(2);
  }
  return c;
}

const Device kGpu = Device::cuda(0);

// A parameter: f32 master, its gradient and Adam moments, and (bf16 runs) the working copy.
struct Param {
  Tensor master, grad, m, v, work;
  bool cast = false;  // matrices and biases get a 16-bit working copy; LayerNorm stays f32
};

struct Layer {
  Param ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
  // Saved activations.
  Tensor x, ln1, m1, r1, qkv, att, lse, x1, ln2, m2, r2, h, g;
};

class Gpt {
 public:
  explicit Gpt(const Config& c) : c_(c), ct_(c.dtype) {
    const int64_t C = c.hidden, N = c.batch * c.ctx;
    uint64_t seed = 1337;
    auto param = [&](const std::string& name, Shape s, double std, double fill, bool cast) {
      Param p;
      p.master = Tensor::empty(s, DType::f32, kGpu);
      if (std > 0)
        kernels::random_normal(p.master, 0.0, std, seed, kernels::stream_of(name), {});
      else
        p.master.fill_(fill);
      p.grad = Tensor::zeros(s, DType::f32, kGpu);
      p.m = Tensor::zeros(s, DType::f32, kGpu);
      p.v = Tensor::zeros(s, DType::f32, kGpu);
      p.cast = cast && ct_ != DType::f32;
      p.work = p.cast ? Tensor::empty(s, ct_, kGpu) : p.master;
      return p;
    };
    const double proj_std = 0.02 / std::sqrt(2.0 * double(c.layers));
    wte_ = param("wte", {c.vocab, C}, 0.02, 0, true);
    wpe_ = param("wpe", {c.ctx, C}, 0.01, 0, false);
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      Layer L;
      L.ln1_w = param(p + "ln_1.weight", {C}, 0, 1, false);
      L.ln1_b = param(p + "ln_1.bias", {C}, 0, 0, false);
      L.attn_w = param(p + "attn.c_attn.weight", {C, 3 * C}, 0.02, 0, true);
      L.attn_b = param(p + "attn.c_attn.bias", {3 * C}, 0, 0, true);
      L.proj_w = param(p + "attn.c_proj.weight", {C, C}, proj_std, 0, true);
      L.proj_b = param(p + "attn.c_proj.bias", {C}, 0, 0, true);
      L.ln2_w = param(p + "ln_2.weight", {C}, 0, 1, false);
      L.ln2_b = param(p + "ln_2.bias", {C}, 0, 0, false);
      L.fc_w = param(p + "mlp.c_fc.weight", {C, 4 * C}, 0.02, 0, true);
      L.fc_b = param(p + "mlp.c_fc.bias", {4 * C}, 0, 0, true);
      L.fcp_w = param(p + "mlp.c_proj.weight", {4 * C, C}, proj_std, 0, true);
      L.fcp_b = param(p + "mlp.c_proj.bias", {C}, 0, 0, true);
      auto act = [&](Shape s) { return Tensor::empty(s, ct_, kGpu); };
      auto stat = [&](Shape s) { return Tensor::empty(s, DType::f32, kGpu); };
      L.x = act({N, C}), L.ln1 = act({N, C}), L.m1 = stat({N}), L.r1 = stat({N});
      L.qkv = act({N, 3 * C}), L.att = act({N, C}), L.lse = stat({c.batch, c.heads, c.ctx});
      L.x1 = act({N, C}), L.ln2 = act({N, C}), L.m2 = stat({N}), L.r2 = stat({N});
      L.h = act({N, 4 * C}), L.g = act({N, 4 * C});
      layers_.push_back(std::move(L));
    }
    lnf_w_ = param("ln_f.weight", {C}, 0, 1, false);
    lnf_b_ = param("ln_f.bias", {C}, 0, 0, false);
    xf_ = Tensor::empty({N, C}, ct_, kGpu);
    lnf_ = Tensor::empty({N, C}, ct_, kGpu);
    mf_ = Tensor::empty({N}, DType::f32, kGpu), rf_ = Tensor::empty({N}, DType::f32, kGpu);
    logits_ = Tensor::empty({N, c.vocab}, ct_, kGpu);
    tmp_ = Tensor::empty({N, C}, ct_, kGpu);
    dx_ = Tensor::empty({N, C}, ct_, kGpu), dn_ = Tensor::empty({N, C}, ct_, kGpu);
    dh_ = Tensor::empty({N, 4 * C}, ct_, kGpu), dg_ = Tensor::empty({N, 4 * C}, ct_, kGpu);
    dqkv_ = Tensor::empty({N, 3 * C}, ct_, kGpu);
    rm_ = Tensor::empty({N}, DType::f32, kGpu), se_ = Tensor::empty({N}, DType::f32, kGpu);
    tl_ = Tensor::empty({N}, DType::f32, kGpu), losses_ = Tensor::empty({N}, DType::f32, kGpu);
    // One fixed batch of random tokens, learned by heart: the loss must fall.
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab - 1));
    std::vector<int32_t> ids(static_cast<size_t>(N + 1)), pos(static_cast<size_t>(N));
    for (auto& t : ids) t = tok(rng);
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % c.ctx);
    ids_ = Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.end() - 1), {N}).to(kGpu);
    targets_ = Tensor::from_vector(std::vector<int32_t>(ids.begin() + 1, ids.end()), {N}).to(kGpu);
    pos_ = Tensor::from_vector(pos, {N}).to(kGpu);
  }

  template <class F>
  void for_each_param(F f) {
    f(wte_), f(wpe_), f(lnf_w_), f(lnf_b_);
    for (Layer& L : layers_)
      for (Param* p : {&L.ln1_w, &L.ln1_b, &L.attn_w, &L.attn_b, &L.proj_w, &L.proj_b, &L.ln2_w,
                       &L.ln2_b, &L.fc_w, &L.fc_b, &L.fcp_w, &L.fcp_b})
        f(*p);
  }

  int64_t matrix_weights() const {
    const int64_t C = c_.hidden;
    return c_.layers * 12 * C * C + c_.vocab * C;
  }

  // One training step (n counts from 1), queued on the GPU without waiting.
  void step(int64_t n) {
    const int64_t N = c_.batch * c_.ctx, C = c_.hidden;
    const WeightLayout io = WeightLayout::in_out;
    for_each_param([](Param& p) {
      if (p.cast) kernels::cast(p.master, p.work);
    });
    kernels::AttentionOptions opt;
    opt.heads = c_.heads;
    // ---- forward ----
    Tensor x = layers_.empty() ? xf_ : layers_[0].x;
    kernels::embedding_forward(ids_, wte_.master, 0, x, false);
    kernels::embedding_forward(pos_, wpe_.master, 0, x, true);
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& L = layers_[l];
      Tensor& next = l + 1 < layers_.size() ? layers_[l + 1].x : xf_;
      kernels::layernorm_forward(L.x, L.ln1_w.work, L.ln1_b.work, 1e-5, L.ln1, L.m1, L.r1);
      kernels::linear_forward(L.ln1, L.attn_w.work, L.attn_b.work, io, L.qkv);
      Tensor att3 = L.att.view({c_.batch, c_.ctx, C});
      kernels::attention_forward(L.qkv.view({c_.batch, c_.ctx, 3 * C}), opt, att3, L.lse);
      kernels::linear_forward(L.att, L.proj_w.work, L.proj_b.work, io, tmp_);
      kernels::add(L.x, tmp_, L.x1);
      kernels::layernorm_forward(L.x1, L.ln2_w.work, L.ln2_b.work, 1e-5, L.ln2, L.m2, L.r2);
      kernels::linear_forward(L.ln2, L.fc_w.work, L.fc_b.work, io, L.h);
      kernels::gelu_forward(L.h, L.g);
      kernels::linear_forward(L.g, L.fcp_w.work, L.fcp_b.work, io, tmp_);
      kernels::add(L.x1, tmp_, next);
    }
    kernels::layernorm_forward(xf_, lnf_w_.work, lnf_b_.work, 1e-5, lnf_, mf_, rf_);
    kernels::linear_forward(lnf_, wte_.work, Tensor(), WeightLayout::out_in, logits_);
    kernels::ce_row_max(logits_, rm_);
    kernels::ce_sum_exp(logits_, targets_, 0, rm_, se_, tl_);
    kernels::ce_finish(logits_, targets_, 0, rm_, se_, tl_, 1.0 / double(N), losses_, logits_);
    // ---- backward (logits_ now holds dlogits) ----
    kernels::linear_backward_input(logits_, wte_.work, WeightLayout::out_in, dn_, false);
    kernels::linear_backward_weight(logits_, lnf_, WeightLayout::out_in, wte_.grad, no_bias_,
                                    false);
    kernels::layernorm_backward_weight(dn_, xf_, mf_, rf_, lnf_w_.grad, lnf_b_.grad, false);
    kernels::layernorm_backward_input(dn_, xf_, lnf_w_.work, mf_, rf_, dx_, false);
    for (size_t l = layers_.size(); l-- > 0;) {
      Layer& L = layers_[l];
      kernels::linear_backward_weight(dx_, L.g, io, L.fcp_w.grad, L.fcp_b.grad, false);
      kernels::linear_backward_input(dx_, L.fcp_w.work, io, dg_, false);
      kernels::gelu_backward(L.h, dg_, dh_, false);
      kernels::linear_backward_weight(dh_, L.ln2, io, L.fc_w.grad, L.fc_b.grad, false);
      kernels::linear_backward_input(dh_, L.fc_w.work, io, dn_, false);
      kernels::layernorm_backward_weight(dn_, L.x1, L.m2, L.r2, L.ln2_w.grad, L.ln2_b.grad, false);
      kernels::layernorm_backward_input(dn_, L.x1, L.ln2_w.work, L.m2, L.r2, dx_, true);
      kernels::linear_backward_weight(dx_, L.att, io, L.proj_w.grad, L.proj_b.grad, false);
      kernels::linear_backward_input(dx_, L.proj_w.work, io, tmp_, false);
      Tensor dqkv3 = dqkv_.view({c_.batch, c_.ctx, 3 * C});
      kernels::attention_backward(L.qkv.view({c_.batch, c_.ctx, 3 * C}),
                                  L.att.view({c_.batch, c_.ctx, C}), L.lse,
                                  tmp_.view({c_.batch, c_.ctx, C}), opt, dqkv3, false);
      kernels::linear_backward_weight(dqkv_, L.ln1, io, L.attn_w.grad, L.attn_b.grad, false);
      kernels::linear_backward_input(dqkv_, L.attn_w.work, io, dn_, false);
      kernels::layernorm_backward_weight(dn_, L.x, L.m1, L.r1, L.ln1_w.grad, L.ln1_b.grad, false);
      kernels::layernorm_backward_input(dn_, L.x, L.ln1_w.work, L.m1, L.r1, dx_, true);
    }
    kernels::embedding_backward(ids_, dx_, 0, wte_.grad);  // adds to the output projection's
    kernels::scale_inplace(wpe_.grad, 0.0);
    kernels::embedding_backward(pos_, dx_, 0, wpe_.grad);
    // ---- optimizer ----
    kernels::AdamW cfg{6e-4, 0.9, 0.95, 1e-8, 0.0};
    for_each_param([&](Param& p) { kernels::adamw_step(p.master, p.grad, p.m, p.v, cfg, n, 1.0); });
  }

  // The mean loss of the last step's forward (waits for it).
  double loss() const {
    std::vector<float> l = losses_.to(Device::cpu()).to_vector<float>();
    double s = 0;
    for (float v : l) s += v;
    return s / double(l.size());
  }

 private:
  Config c_;
  DType ct_;
  Param wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Layer> layers_;
  Tensor xf_, lnf_, mf_, rf_, logits_, tmp_, dx_, dn_, dh_, dg_, dqkv_, rm_, se_, tl_, losses_;
  Tensor ids_, targets_, pos_, no_bias_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  if (memory::cuda::device_count() == 0) {
    std::fprintf(stderr, "gpt_step: no CUDA device (%s)\n",
                 memory::cuda::unavailable_reason().c_str());
    return 1;
  }
  kernels::cuda::set_allow_tf32(c.tf32);
  kernels::cuda::set_attention_impl(c.attention);
  try {
    Gpt gpt(c);
    const int64_t tokens = c.batch * c.ctx;
    const double flops =
        6.0 * double(gpt.matrix_weights()) * double(tokens) +
        12.0 * double(c.layers) * double(c.ctx) * double(c.hidden) * double(tokens);
    std::vector<double> ms;
    double first_loss = NAN, last_loss = NAN;
    memory::cuda::Event t0(0, true), t1(0, true);
    const auto stream = memory::cuda::current_stream(0);
    for (int s = 1; s <= c.warmup + c.steps; ++s) {
      t0.record(stream);
      gpt.step(s);
      t1.record(stream);
      t1.synchronize();
      if (s > c.warmup) ms.push_back(double(memory::cuda::Event::elapsed_ms(t0, t1)));
      if (s == 1) first_loss = gpt.loss();
      if (s == c.warmup + c.steps) last_loss = gpt.loss();
    }
    const double med = median(ms);
    const double mn = *std::min_element(ms.begin(), ms.end()),
                 mx = *std::max_element(ms.begin(), ms.end());
    const auto alloc = memory::allocator_for(kGpu).stats();
    const char* attn = c.attention == kernels::cuda::AttentionImpl::flash    ? "flash"
                       : c.attention == kernels::cuda::AttentionImpl::cublas ? "cublas"
                       : c.attention == kernels::cuda::AttentionImpl::cudnn  ? "cudnn"
                                                                             : "auto";
    std::printf(
        "baton gpt_step: layers %lld hidden %lld heads %lld ctx %lld batch %lld vocab %lld dtype "
        "%s tf32 %d "
        "attention %s\n",
        (long long)c.layers, (long long)c.hidden, (long long)c.heads, (long long)c.ctx,
        (long long)c.batch, (long long)c.vocab, std::string(memory::dtype_name(c.dtype)).c_str(),
        int(c.tf32), attn);
    std::printf("  step ms: median %.3f min %.3f max %.3f over %d steps after %d warm-up\n", med,
                mn, mx, c.steps, c.warmup);
    std::printf(
        "  tokens/s: %.0f (median step)   TFLOP/step %.3f   achieved %.1f TFLOP/s   MFU %.1f%% of "
        "%.0f\n",
        double(tokens) / (med / 1e3), flops / 1e12, flops / (med / 1e3) / 1e12,
        100.0 * flops / (med / 1e3) / (c.peak_tflops * 1e12), c.peak_tflops);
    std::printf(
        "  loss: %.4f at step 1, %.4f at step %d   device memory peak %.2f GiB, fresh allocations "
        "%zu\n",
        first_loss, last_loss, c.warmup + c.steps, double(alloc.peak) / double(1ull << 30),
        alloc.fresh);
    std::printf("RESULT baton %s tokens_per_s %.0f step_ms %.3f mfu %.4f\n",
                std::string(memory::dtype_name(c.dtype)).c_str(), double(tokens) / (med / 1e3), med,
                flops / (med / 1e3) / (c.peak_tflops * 1e12));
    const bool learned = std::isfinite(last_loss) && last_loss < first_loss;
    if (!learned) std::printf("  FAIL: the loss did not fall\n");
    return learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
}
