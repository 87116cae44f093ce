// bench_kernels: the CPU kernels at the shapes of the GPT configs A and B, each against
// its ceiling measured in the same run: GEMM-shaped work (matmul, linear, attention) in
// GFLOP/s against baton's f32 GEMM (oneDNN or OpenBLAS, whichever it runs; BATON_SGEMM
// chooses) at the same sizes, memory-bound work in GB/s (bytes
// read + bytes written) against a memcpy moving as many bytes (counted the same way) on
// the same threads. Prints a table and the settings it ran under.
//
//   bench_kernels [--config A|B|all] [--threads 1,2] [--min-time 0.3] [--filter text]
//   bench_kernels --mix   # GEMMs with our loops between them (OpenMP vs pthread OpenBLAS)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/stats.h"
#include "kernels/fused.h"
#include "kernels/ops.h"

namespace {

using baton::kernels::AttentionOptions;
using baton::kernels::WeightLayout;
using baton::memory::DType;
using baton::memory::Shape;
using baton::memory::Tensor;
namespace k = baton::kernels;
namespace po = boost::program_options;

struct Timing {
  double median = 0, min = 0, max = 0;  // seconds
  int reps = 0;
};

// Wall-clock seconds, or with --cpu-time the process's CPU seconds: on a machine shared
// with other work that excludes the time other processes take the core (meaningful for
// one thread only, since waiting threads also burn CPU time).
bool g_cpu_time = false;
double now_seconds() {
  timespec ts;
  clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Runs f a few times to warm up, then until min_time has passed (at least 5 times);
// returns median, min and max of the timed runs.
Timing time_it(const std::function<void()>& f, double min_time) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ts;
  const double start = now_seconds();
  while (ts.size() < 5 || now_seconds() - start < min_time) {
    const double t0 = now_seconds();
    f();
    ts.push_back(now_seconds() - t0);
    if (ts.size() >= 2000) break;
  }
  const baton::bench::Stats s = baton::bench::stats(ts);
  return {s.median, s.min, s.max, int(ts.size())};
}

// Inputs from the kernels' own counter-based normals: fast, so setting up the large
// optimizer tensors does not dominate the run.
Tensor randn(const Shape& s, std::mt19937_64& rng, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f32);
  k::random_normal(t, 0.0, scale, rng(), 0, {});
  return t;
}

Tensor ids(const Shape& s, int64_t vocab, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(s, DType::i32);
  for (int32_t& v : t.span<int32_t>()) v = int32_t(rng() % uint64_t(vocab));
  return t;
}

struct Config {
  std::string name;
  int64_t layers, heads, embd, ctx, batch, vocab;
};

struct Row {
  std::string config, kernel, shape;
  int threads;
  Timing t;
  double rate, ceiling;  // GFLOP/s or GB/s
  std::string unit;
};

class Bench {
 public:
  Bench(double min_time, std::string filter) : min_time_(min_time), filter_(std::move(filter)) {}

  // baton's f32 GEMM, NN at m x n x k on the current threads, GFLOP/s (cached).
  double sgemm_rate(int64_t m, int64_t n, int64_t kk, int64_t repeat = 1) {
    const auto key = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(kk) + "x" +
                     std::to_string(repeat) + "@" + std::to_string(k::num_threads());
    if (auto it = sgemm_cache_.find(key); it != sgemm_cache_.end()) return it->second;
    std::mt19937_64 rng(1);
    Tensor a = randn({m, kk}, rng), b = randn({kk, n}, rng), c = Tensor::zeros({m, n});
    omp_set_num_threads(k::num_threads());
    const Timing t = time_it(
        [&] {
          for (int64_t r = 0; r < repeat; ++r) k::matmul(a, false, b, false, c);
        },
        min_time_);
    return sgemm_cache_[key] = 2.0 * double(m * n * kk * repeat) / t.median / 1e9;
  }

  // memcpy of `bytes` (split over the current threads), in GB/s of read + write (cached).
  double memcpy_rate(size_t bytes) {
    const auto key = std::to_string(bytes) + "@" + std::to_string(k::num_threads());
    if (auto it = memcpy_cache_.find(key); it != memcpy_cache_.end()) return it->second;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const int nt = k::num_threads();
    const Timing t = time_it(
        [&] {
#pragma omp parallel num_threads(nt)
          {
            const size_t i = size_t(omp_get_thread_num()), p = size_t(omp_get_num_threads());
            const size_t b = bytes * i / p, e = bytes * (i + 1) / p;
            std::memcpy(dst.data() + b, src.data() + b, e - b);
          }
        },
        min_time_);
    return memcpy_cache_[key] = 2.0 * double(bytes) / t.median / 1e9;
  }

  bool wanted(const std::string& kernel) const {
    return filter_.empty() || kernel.find(filter_) != std::string::npos;
  }

  // A GEMM-shaped kernel doing `flops`, against sgemm at m x n x kk (repeat times).
  void gemm_row(const Config& c, const std::string& kernel, const std::string& shape, double flops,
                int64_t m, int64_t n, int64_t kk, const std::function<void()>& f,
                int64_t repeat = 1) {
    if (!wanted(kernel)) return;
    const Timing t = time_it(f, min_time_);
    rows_.push_back({c.name, kernel, shape, k::num_threads(), t, flops / t.median / 1e9,
                     sgemm_rate(m, n, kk, repeat), "GFLOP/s"});
  }

  // A memory-bound kernel moving `bytes` (read + written), against a memcpy that moves
  // as many (bytes / 2 read and written), so both see the same cache level.
  void mem_row(const Config& c, const std::string& kernel, const std::string& shape, double bytes,
               const std::function<void()>& f) {
    if (!wanted(kernel)) return;
    const Timing t = time_it(f, min_time_);
    rows_.push_back({c.name, kernel, shape, k::num_threads(), t, bytes / t.median / 1e9,
                     memcpy_rate(size_t(bytes / 2) / 64 * 64), "GB/s"});
  }

  bool empty() const {
    return rows_.empty();
  }

  void print() const {
    std::printf("%-3s %-26s %-22s %3s %9s %9s %9s %9s %9s %-7s %6s\n", "cfg", "kernel", "shape",
                "thr", "median ms", "min ms", "max ms", "rate", "ceiling", "unit", "% ceil");
    for (const Row& r : rows_)
      std::printf("%-3s %-26s %-22s %3d %9.3f %9.3f %9.3f %9.1f %9.1f %-7s %5.0f%%\n",
                  r.config.c_str(), r.kernel.c_str(), r.shape.c_str(), r.threads, r.t.median * 1e3,
                  r.t.min * 1e3, r.t.max * 1e3, r.rate, r.ceiling, r.unit.c_str(),
                  100.0 * r.rate / r.ceiling);
  }

 private:
  double min_time_;
  std::string filter_;
  std::map<std::string, double> sgemm_cache_, memcpy_cache_;
  std::vector<Row> rows_;
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

// The local work of one rank of the vocabulary-parallel cross-entropy in one read
// (kernels/fused.h), the all-reduces replaced by what a rank without the row's max sees.
void ce_vocab_parallel_one_read(const Tensor& logits, const Tensor& targets, double grad_scale,
                                Tensor& losses, Tensor& dlogits) {
  const int64_t n = logits.size(0);
  thread_local Tensor local_max, local_sum, row_max, sum_exp, target_logit;
  if (!local_max.defined() || local_max.numel() != n)
    for (Tensor* t : {&local_max, &local_sum, &row_max, &sum_exp, &target_logit})
      *t = Tensor::empty({n});
  k::ce_local_forward(logits, targets, 0, grad_scale, local_max, local_sum, target_logit, dlogits);
  for (int64_t r = 0; r < n; ++r) row_max.data<float>()[r] = local_max.data<float>()[r] + 0.5f;
  k::ce_local_share(local_max, local_sum, row_max, sum_exp);
  for (int64_t r = 0; r < n; ++r) sum_exp.data<float>()[r] *= 2.0f;
  k::ce_local_finish(targets, 0, local_max, local_sum, row_max, sum_exp, target_logit, grad_scale,
                     losses, dlogits);
}

void bench_config(Bench& b, const Config& c) {
  std::mt19937_64 rng(42);
  const int64_t B = c.batch, T = c.ctx, C = c.embd, H = c.heads, D = C / H, V = c.vocab;
  const int64_t N = B * T;

  // ---- GEMM-shaped: the linear layers of one block (GPT-2's [in, out] weights) ----
  struct Lin {
    const char* name;
    int64_t in, out;
  };
  for (const Lin& l : {Lin{"qkv", C, 3 * C}, Lin{"attn_proj", C, C}, Lin{"fc", C, 4 * C},
                       Lin{"mlp_proj", 4 * C, C}}) {
    const Tensor x = randn({N, l.in}, rng), w = randn({l.in, l.out}, rng, 0.02),
                 bias = randn({l.out}, rng), dy = randn({N, l.out}, rng);
    Tensor y = Tensor::empty({N, l.out}), dx = Tensor::empty({N, l.in}),
           dw = Tensor::empty({l.in, l.out}), db = Tensor::empty({l.out});
    const double flops = 2.0 * double(N * l.in * l.out);
    const std::string shape = dims({N, l.in, l.out});
    b.gemm_row(c, std::string("linear_fwd ") + l.name, shape, flops, N, l.out, l.in,
               [&] { k::linear_forward(x, w, bias, WeightLayout::in_out, y); });
    b.gemm_row(c, std::string("linear_bwd_in ") + l.name, shape, flops, N, l.in, l.out,
               [&] { k::linear_backward_input(dy, w, WeightLayout::in_out, dx, false); });
    b.gemm_row(c, std::string("linear_bwd_w ") + l.name, shape, flops, l.in, l.out, N,
               [&] { k::linear_backward_weight(dy, x, WeightLayout::in_out, dw, db, false); });
  }
  {  // lm head: logits = x wte^T (tied weights, [V, C] = out_in layout)
    const Tensor x = randn({N, C}, rng), w = randn({V, C}, rng, 0.02), none;
    Tensor y = Tensor::empty({N, V});
    b.gemm_row(c, "linear_fwd lm_head", dims({N, C, V}), 2.0 * double(N * C * V), N, V, C,
               [&] { k::linear_forward(x, w, none, WeightLayout::out_in, y); });
  }
  {  // batched matmul at the attention's per-head shape: [B*H, T, D] x [B*H, D, T]
    const Tensor q = randn({B * H, T, D}, rng), kt = randn({B * H, D, T}, rng);
    Tensor s = Tensor::empty({B * H, T, T});
    b.gemm_row(
        c, "matmul batched", dims({B * H, T, D, T}), 2.0 * double(B * H * T * T * D), T, T, D,
        [&] { k::matmul(q, false, kt, false, s); }, B * H);
  }

  // ---- attention: causal FLOPs (half the T x T products), against sgemm of the same
  // per-head products T x T x D looped over B*H heads ----
  {
    const Tensor qkv = randn({B, T, 3 * C}, rng), dout = randn({B, T, C}, rng);
    Tensor out = Tensor::empty({B, T, C}), lse = Tensor::empty({B, H, T}),
           dqkv = Tensor::empty({B, T, 3 * C});
    const double fwd = 2.0 * 2.0 * double(B * H * T * T * D) / 2;  // QK^T and PV, causal
    for (double p : {0.0, 0.1}) {
      AttentionOptions o;
      o.heads = H;
      o.dropout = p;
      const std::string sfx = p > 0 ? " drop0.1" : "";
      const std::string shape = dims({B, T, H, D});
      b.gemm_row(
          c, "attention_fwd" + sfx, shape, fwd, T, T, D,
          [&] { k::attention_forward(qkv, o, out, lse); }, B * H);
      k::attention_forward(qkv, o, out, lse);
      b.gemm_row(
          c, "attention_bwd" + sfx, shape, 2 * fwd, T, T, D,
          [&] { k::attention_backward(qkv, out, lse, dout, o, dqkv, false); }, B * H);
    }
  }

  // ---- memory-bound ----
  const size_t act = size_t(N * C) * 4, act4 = size_t(N * 4 * C) * 4;
  {
    const Tensor x = randn({N, C}, rng), y0 = randn({N, C}, rng), w = randn({C}, rng),
                 bias = randn({C}, rng), dy = randn({N, C}, rng);
    Tensor y = Tensor::empty({N, C}), mean = Tensor::empty({N}), rstd = Tensor::empty({N}),
           dx = Tensor::empty({N, C}), dw = Tensor::empty({C}), db = Tensor::empty({C});
    const std::string shape = dims({N, C});
    b.mem_row(c, "add (residual)", shape, 3.0 * act, [&] { k::add(x, y0, y); });
    b.mem_row(c, "add_inplace", shape, 3.0 * act, [&] { k::add_inplace(y, x); });
    b.mem_row(c, "bias_add_inplace", shape, 2.0 * act, [&] { k::bias_add_inplace(y, bias); });
    b.mem_row(c, "bias_backward", shape, 1.0 * act, [&] { k::bias_backward(dy, db, false); });
    b.mem_row(c, "layernorm_fwd", shape, 2.0 * act,
              [&] { k::layernorm_forward(x, w, bias, 1e-5, y, mean, rstd); });
    // Fused with the residual add: reads a and b, writes s and y.
    Tensor s2 = Tensor::empty({N, C});
    b.mem_row(c, "add_layernorm_fwd", shape, 4.0 * act,
              [&] { k::add_layernorm_forward(x, y0, w, bias, 1e-5, s2, y, mean, rstd); });
    b.mem_row(c, "layernorm_bwd_in", shape, 3.0 * act,
              [&] { k::layernorm_backward_input(dy, x, w, mean, rstd, dx, false); });
    b.mem_row(c, "layernorm_bwd_w", shape, 2.0 * act,
              [&] { k::layernorm_backward_weight(dy, x, mean, rstd, dw, db, false); });
    // LLaMA's norm (the same rows, no mean and no bias).
    b.mem_row(c, "rmsnorm_fwd", shape, 2.0 * act, [&] { k::rmsnorm_forward(x, w, 1e-5, y, rstd); });
    b.mem_row(c, "rmsnorm_bwd_in", shape, 3.0 * act,
              [&] { k::rmsnorm_backward_input(dy, x, w, rstd, dx, false); });
    b.mem_row(c, "dropout_fwd p0.1", shape, 2.0 * act,
              [&] { k::dropout_forward(x, y, 0.1, 1, 2, {}); });
    b.mem_row(c, "dropout_bwd p0.1", shape, 2.0 * act,
              [&] { k::dropout_backward(dy, dx, 0.1, 1, 2, {}, false); });
  }
  {
    const Tensor x = randn({N, 4 * C}, rng), dy = randn({N, 4 * C}, rng);
    Tensor y = Tensor::empty({N, 4 * C}), dx = Tensor::empty({N, 4 * C});
    const std::string shape = dims({N, 4 * C});
    b.mem_row(c, "gelu_fwd", shape, 2.0 * act4, [&] { k::gelu_forward(x, y); });
    // Fused with the bias (after a bias-free GEMM): reads x, writes h and y.
    const Tensor bias4 = randn({4 * C}, rng);
    Tensor h = Tensor::empty({N, 4 * C});
    b.mem_row(c, "bias_gelu_fwd", shape, 3.0 * act4, [&] { k::bias_gelu_forward(x, bias4, h, y); });
    b.mem_row(c, "gelu_bwd", shape, 3.0 * act4, [&] { k::gelu_backward(x, dy, dx, false); });
    b.mem_row(c, "relu_fwd", shape, 2.0 * act4, [&] { k::relu_forward(x, y); });
  }
  {
    const size_t lg = size_t(N * V) * 4;
    const Tensor logits = randn({N, V}, rng, 3.0), tg = ids({N}, V, rng), dy = randn({N, V}, rng);
    Tensor dlogits = Tensor::empty({N, V}), y = Tensor::empty({N, V}), dx = Tensor::empty({N, V});
    Tensor mx = Tensor::empty({N}), se = Tensor::empty({N}), tl = Tensor::empty({N}),
           losses = Tensor::empty({N});
    const std::string shape = dims({N, V});
    b.mem_row(c, "softmax_fwd", shape, 2.0 * lg, [&] { k::softmax_forward(logits, y); });
    b.mem_row(c, "softmax_bwd", shape, 3.0 * lg, [&] { k::softmax_backward(y, dy, dx, false); });
    // Loss and gradient: one read of the logits and one write of the gradient at the
    // least (the three steps read the logits three times).
    b.mem_row(c, "cross_entropy (3 steps)", shape, 2.0 * lg, [&] {
      k::ce_row_max(logits, mx);
      k::ce_sum_exp(logits, tg, 0, mx, se, tl);
      k::ce_finish(logits, tg, 0, mx, se, tl, 1.0 / double(N), losses, dlogits);
    });
    b.mem_row(c, "cross_entropy (one call)", shape, 2.0 * lg,
              [&] { k::cross_entropy_forward(logits, tg, 1.0 / double(N), losses, dlogits); });
    // The vocabulary-parallel form's local work (its rows beside "3 steps", which is that
    // form's local work too), the all-reduces replaced by a max half a unit above this
    // rank's and a sum twice its share, so that the gradient's rescaling pass runs as on
    // a rank without the row's max.
    b.mem_row(c, "ce vocab-parallel (one read)", shape, 2.0 * lg,
              [&] { ce_vocab_parallel_one_read(logits, tg, 1.0 / double(N), losses, dlogits); });
  }
  if (c.name == "A") {  // GPT-2's vocabulary: rows longer than L1, softmax in chunks
    const int64_t R = 32, GV = 50257;
    const size_t lg = size_t(R * GV) * 4;
    const Tensor logits = randn({R, GV}, rng, 3.0), tg = ids({R}, GV, rng);
    Tensor y = Tensor::empty({R, GV}), losses = Tensor::empty({R});
    const std::string shape = dims({R, GV});
    b.mem_row(c, "softmax_fwd V50257", shape, 2.0 * lg, [&] { k::softmax_forward(logits, y); });
    b.mem_row(c, "cross_entropy V50257 (one call)", shape, 2.0 * lg,
              [&] { k::cross_entropy_forward(logits, tg, 1.0 / double(R), losses, y); });
    // One rank of two under tensor parallelism: half the vocabulary.
    const int64_t HV = GV / 2;
    const size_t hlg = size_t(R * HV) * 4;
    const Tensor half = randn({R, HV}, rng, 3.0), htg = ids({R}, HV, rng);
    Tensor hy = Tensor::empty({R, HV}), mx = Tensor::empty({R}), se = Tensor::empty({R}),
           tl = Tensor::empty({R});
    const std::string hshape = dims({R, HV});
    b.mem_row(c, "ce vocab-par. V/2 (3 steps)", hshape, 2.0 * hlg, [&] {
      k::ce_row_max(half, mx);
      k::ce_sum_exp(half, htg, 0, mx, se, tl);
      k::ce_finish(half, htg, 0, mx, se, tl, 1.0 / double(R), losses, hy);
    });
    b.mem_row(c, "ce vocab-par. V/2 (one read)", hshape, 2.0 * hlg,
              [&] { ce_vocab_parallel_one_read(half, htg, 1.0 / double(R), losses, hy); });
  }
  {
    const Tensor tok = ids({B, T}, V, rng), table = randn({V, C}, rng),
                 dout = randn({B, T, C}, rng);
    Tensor out = Tensor::empty({B, T, C}), dtable = Tensor::zeros({V, C});
    const std::string shape = dims({N, C});
    b.mem_row(c, "embedding_fwd", shape, 2.0 * act,
              [&] { k::embedding_forward(tok, table, 0, out, false); });
    b.mem_row(c, "embedding_bwd", shape, 1.0 * act,
              [&] { k::embedding_backward(tok, dout, 0, dtable); });
  }
  {  // optimizer over every parameter of the model: 12 L C^2 + (V + T) C
    const int64_t P = 12 * c.layers * C * C + (V + T) * C;
    Tensor p = randn({P}, rng, 0.02), g = randn({P}, rng), m = Tensor::zeros({P}),
           v = Tensor::zeros({P});
    const size_t pb = size_t(P) * 4;
    const std::string shape = std::to_string(P);
    k::AdamW cfg;
    cfg.weight_decay = 0.1;
    int64_t step = 0;
    b.mem_row(c, "adamw_step", shape, 7.0 * pb,
              [&] { k::adamw_step(p, g, m, v, cfg, ++step, 1.0); });
    k::Sgd s;
    s.momentum = 0.9;
    b.mem_row(c, "sgd_step momentum", shape, 5.0 * pb, [&] { k::sgd_step(p, g, m, s, 1.0); });
    volatile double sink = 0;
    b.mem_row(c, "sum_squares", shape, 1.0 * pb, [&] { sink = sink + k::sum_squares(g); });
  }
}

// An MLP block forward and backward at config B's shapes: GEMMs with our elementwise
// loops between them. Compares OpenBLAS builds: run once as built (OpenMP) and once with
// LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread.
void bench_mix(double min_time, const std::vector<int>& threads) {
  std::mt19937_64 rng(7);
  const int64_t N = 2048, C = 512;
  const Tensor x = randn({N, C}, rng), w1 = randn({C, 4 * C}, rng, 0.02), b1 = randn({4 * C}, rng),
               w2 = randn({4 * C, C}, rng, 0.02), b2 = randn({C}, rng), lw = randn({C}, rng),
               lb = randn({C}, rng);
  Tensor ln = Tensor::empty({N, C}), mean = Tensor::empty({N}), rstd = Tensor::empty({N}),
         h = Tensor::empty({N, 4 * C}), a = Tensor::empty({N, 4 * C}), y = Tensor::empty({N, C}),
         dy = randn({N, C}, rng), da = Tensor::empty({N, 4 * C}), dh = Tensor::empty({N, 4 * C}),
         dln = Tensor::empty({N, C}), dx = Tensor::empty({N, C}), dw1 = Tensor::empty(w1.shape()),
         db1 = Tensor::empty(b1.shape()), dw2 = Tensor::empty(w2.shape()),
         db2 = Tensor::empty(b2.shape()), dlw = Tensor::empty({C}), dlb = Tensor::empty({C});
  const double flops = 3 * 2 * 2.0 * double(N * C * 4 * C);
  std::printf("\nMLP block fwd+bwd, N=%lld C=%lld (%.2f GFLOP per iteration)\n", (long long)N,
              (long long)C, flops / 1e9);
  std::printf("%3s %9s %9s %9s %9s\n", "thr", "median ms", "min ms", "max ms", "GFLOP/s");
  for (int t : threads) {
    k::set_num_threads(t);
    const Timing tm = time_it(
        [&] {
          k::layernorm_forward(x, lw, lb, 1e-5, ln, mean, rstd);
          k::linear_forward(ln, w1, b1, WeightLayout::in_out, h);
          k::gelu_forward(h, a);
          k::linear_forward(a, w2, b2, WeightLayout::in_out, y);
          k::add_inplace(y, x);
          k::linear_backward_input(dy, w2, WeightLayout::in_out, da, false);
          k::linear_backward_weight(dy, a, WeightLayout::in_out, dw2, db2, false);
          k::gelu_backward(h, da, dh, false);
          k::linear_backward_input(dh, w1, WeightLayout::in_out, dln, false);
          k::linear_backward_weight(dh, ln, WeightLayout::in_out, dw1, db1, false);
          k::layernorm_backward_input(dln, x, lw, mean, rstd, dx, false);
          k::layernorm_backward_weight(dln, x, mean, rstd, dlw, dlb, false);
          k::add_inplace(dx, dy);
        },
        min_time);
    std::printf("%3d %9.3f %9.3f %9.3f %9.1f\n", t, tm.median * 1e3, tm.min * 1e3, tm.max * 1e3,
                flops / tm.median / 1e9);
  }
}

int run(int argc, char** argv) {
  po::options_description opts("bench_kernels options");
  opts.add_options()("help", "this help")("config", po::value<std::string>()->default_value("all"),
                                          "A, B or all")(
      "threads", po::value<std::string>()->default_value("1,2"), "thread counts, e.g. 1,2")(
      "min-time", po::value<double>()->default_value(0.3, "0.3"),
      "seconds of timed runs per kernel")("filter", po::value<std::string>()->default_value(""),
                                          "only kernels whose name contains this")(
      "cpu-time", "time by process CPU time instead of wall time (one thread, loaded machine)")(
      "mix", "only the MLP-block mix of GEMMs and loops (for comparing OpenBLAS builds)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw baton::InputError(e.what());
  }
  if (vm.count("help")) {
    std::printf("%s\n", (std::stringstream() << opts).str().c_str());
    return 0;
  }
  g_cpu_time = vm.count("cpu-time") > 0;
  const auto threads = baton::bench::thread_counts(vm["threads"].as<std::string>());
  const double min_time = vm["min-time"].as<double>();
  // A config other than A, B or all had printed an empty table with exit 0.
  const std::string which = vm["config"].as<std::string>();
  if (which != "A" && which != "B" && which != "all")
    throw baton::InputError("--config: expected A, B or all, found '" + which + "'");
  if (!(min_time >= 0))
    throw baton::InputError("--min-time: expected seconds of at least 0, found " +
                            std::to_string(min_time));
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const char* l2 = std::getenv("OPENBLAS_L2_SIZE");
  std::printf("OpenBLAS: %s | core %s | OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s | cores %d | %s\n",
              openblas_get_config(), openblas_get_corename(), core ? core : "(unset)",
              l2 ? l2 : "(unset)", omp_get_num_procs(),
              vm.count("cpu-time") ? "process CPU time" : "wall time");
  std::printf(
      "rates: GEMM-shaped work in GFLOP/s against baton's f32 GEMM (%s) at the same sizes;\n"
      "memory-bound work in GB/s (read + written) against memcpy moving as many bytes,\n"
      "both measured in this run on the same threads.\n\n",
      k::cpu_sgemm() == k::CpuSgemm::kOneDnn ? "oneDNN" : "OpenBLAS");
  if (vm.count("mix")) {
    bench_mix(min_time, threads);
    return 0;
  }
  const std::vector<Config> configs{{"A", 4, 4, 256, 128, 8, 256}, {"B", 8, 8, 512, 256, 8, 256}};
  Bench b(min_time, vm["filter"].as<std::string>());
  for (int t : threads) {
    k::set_num_threads(t);
    for (const Config& c : configs)
      if (which == "all" || which == c.name) bench_config(b, c);
    // A --filter that names no kernel had printed an empty table with exit 0: said after
    // the first thread count, before the others would time nothing.
    if (b.empty())
      throw baton::InputError("--filter '" + vm["filter"].as<std::string>() +
                              "': no kernel's name contains it");
  }
  b.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return baton::bench::run_main("bench_kernels", [&] { return run(argc, argv); });
}
