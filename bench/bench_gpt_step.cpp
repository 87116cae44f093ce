// bench_gpt_step: one training step (forward, backward, AdamW) of the GPT configs A and B
// (or, with --family llama, LLaMA-style decoders of the same widths: RMSNorm, rotary,
// SwiGLU with intermediate 8/3 d rounded up to 32, grouped-query attention with half the
// heads for keys and values, untied head) on one process, at 1 and 2 threads: ms per step (median,
// min, max after warm-up), tokens/s, achieved GFLOP/s and its fraction of the sgemm rate measured
// in the same run at the same thread count (baton's f32 GEMM at 1024^3: oneDNN or OpenBLAS,
// whichever it runs; BATON_SGEMM chooses). FLOPs per step are counted as 6 N
// T + 12 L ctx d T (N: matmul weights incl. the LM head, T: tokens), the convention of
// docs/benchmarks.md. --profile prints where the time goes, per op type.
//
//   bench_gpt_step [--config A|B|all] [--family gpt|llama] [--threads 1,2] [--steps 10]
//                  [--warmup 2] [--profile]

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/stats.h"
#include "kernels/ops.h"
#include "memory/allocator.h"
#include "stages/model.h"
#include "stages/shorthands.h"
#include "stages/stage.h"

namespace {

namespace st = baton::stages;
namespace po = boost::program_options;
using baton::memory::DType;
using baton::memory::Tensor;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string name;
  int64_t layers, heads, embd, ctx, batch, vocab;
  bool llama = false;
  int64_t kv_heads() const { return heads / 2; }
  int64_t kv_width() const { return kv_heads() * (embd / heads); }
  int64_t ffn() const { return (8 * embd / 3 + 31) / 32 * 32; }
  double flops() const {
    const double d = double(embd);
    // GPT: qkv, proj, 4d MLP; LLaMA: q and o, k and v at kv_heads, gate/up/down.
    double block =
        llama ? 2 * d * d + 2 * d * double(kv_width()) + 3 * d * double(ffn()) : 12 * d * d;
    double n = double(layers) * block + double(vocab) * d;
    double t = double(batch * ctx);
    return 6.0 * n * t + 12.0 * double(layers) * double(ctx) * double(embd) * t;
  }
};

using baton::bench::stats;
using baton::bench::Stats;

// baton's own f32 GEMM (the library it chose) at 1024^3.
double sgemm_rate(int reps) {
  const int n = 1024;
  const Tensor a = Tensor::full({n, n}, 0.5, DType::f32),
               b = Tensor::full({n, n}, 0.25, DType::f32);
  Tensor c = Tensor::zeros({n, n}, DType::f32);
  std::vector<double> ts;
  for (int i = 0; i < reps + 2; ++i) {
    auto t0 = Clock::now();
    baton::kernels::matmul(a, false, b, false, c);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= 2) ts.push_back(s);
  }
  return 2.0 * n * n * n / stats(ts).median / 1e9;
}

int run(int argc, char** argv) {
  std::string which = "all", family = "gpt", threads_arg = "1,2";
  int steps = 10, warmup = 2;
  bool profile = false;
  po::options_description opts("bench_gpt_step");
  opts.add_options()("help,h", "help")("config", po::value(&which), "A, B or all")(
      "family", po::value(&family), "gpt or llama")("threads", po::value(&threads_arg),
                                                    "thread counts, e.g. 1,2")(
      "steps", po::value(&steps), "timed steps")("warmup", po::value(&warmup), "untimed steps")(
      "profile", po::bool_switch(&profile), "print time per op type");
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
  // No timed step had left stats() an empty vector (a crash); a config other than A, B
  // or all had printed the header alone.
  if (steps < 1)
    throw baton::InputError("--steps: expected at least 1, found " + std::to_string(steps));
  if (warmup < 0)
    throw baton::InputError("--warmup: expected at least 0, found " + std::to_string(warmup));
  if (which != "A" && which != "B" && which != "all")
    throw baton::InputError("--config: expected A, B or all, found '" + which + "'");
  if (family != "gpt" && family != "llama")
    throw baton::InputError("--family: expected gpt or llama, found '" + family + "'");
  const std::vector<int> thread_list = baton::bench::thread_counts(threads_arg);
  std::vector<Config> configs;
  const bool llama = family == "llama";
  if (which == "A" || which == "all") configs.push_back({"A", 4, 4, 256, 128, 8, 256, llama});
  if (which == "B" || which == "all") configs.push_back({"B", 8, 8, 512, 256, 8, 256, llama});

  const char* core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("# bench_gpt_step: %s, forward + backward + AdamW, f32, one process\n",
              family.c_str());
  std::printf(
      "# f32 GEMMs on %s, OPENBLAS_CORETYPE=%s, %d timed steps after %d warm-up\n",
      baton::kernels::cpu_sgemm() == baton::kernels::CpuSgemm::kOneDnn ? "oneDNN" : "OpenBLAS",
      core ? core : "(autodetect)", steps, warmup);
  std::printf("%-6s %7s %10s %10s %10s %10s %9s %9s %8s\n", "config", "threads", "ms/step", "min",
              "max", "tok/s", "GFLOP/s", "sgemm", "of sgemm");
  for (const Config& c : configs) {
    nlohmann::json model_json;
    if (c.llama) {
      st::LlamaConfig l;
      l.name = "llama-" + c.name;
      l.hidden_size = c.embd;
      l.intermediate_size = c.ffn();
      l.num_hidden_layers = c.layers;
      l.num_attention_heads = c.heads;
      l.num_key_value_heads = c.kv_heads();
      l.max_position_embeddings = c.ctx;
      l.vocab_size = c.vocab;
      model_json = l.to_json();
    } else {
      st::Gpt2Config g;
      g.name = "config-" + c.name;
      g.n_layer = c.layers;
      g.n_head = c.heads;
      g.n_embd = c.embd;
      g.n_positions = c.ctx;
      g.vocab_size = c.vocab;
      model_json = g.to_json();
    }
    auto graph = std::make_shared<st::Graph>(st::load_model_json(model_json, "config " + c.name));
    std::mt19937_64 rng(1);
    std::vector<int32_t> tok(size_t(c.batch * c.ctx)), tgt(tok.size());
    for (auto& x : tok) x = int32_t(rng() % uint64_t(c.vocab));
    for (auto& x : tgt) x = int32_t(rng() % uint64_t(c.vocab));
    st::TensorMap in{{"tokens", Tensor::from_vector(tok, {c.batch, c.ctx})},
                     {"targets", Tensor::from_vector(tgt, {c.batch, c.ctx})}};
    for (int threads : thread_list) {
      baton::kernels::set_num_threads(threads);
      double sgemm = sgemm_rate(5);
      st::StageOptions so;
      so.seed = 1;
      so.profile = profile;
      st::Stage stage(graph, 0, graph->num_layers(), so);
      st::OptimizerConfig oc;
      oc.adamw.lr = 1e-4;
      stage.set_optimizer(oc);
      st::MicroBatch mb{0, 0, c.batch, c.batch, double(c.batch * c.ctx), 0};
      std::vector<double> ts;
      auto& alloc = baton::memory::allocator_for(baton::memory::Device::cpu());
      size_t fresh_before = 0;
      for (int i = 0; i < warmup + steps; ++i) {
        if (i == warmup) {
          stage.reset_op_times();
          fresh_before = alloc.stats().fresh;
        }
        auto t0 = Clock::now();
        stage.zero_grad();
        stage.forward(mb, in);
        stage.backward(0);
        stage.finish_grads();
        stage.step(1.0);
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (i >= warmup) ts.push_back(s);
      }
      Stats s = stats(ts);
      double timed = 0;
      for (double t : ts) timed += t;
      size_t fresh = alloc.stats().fresh - fresh_before;
      double gflops = c.flops() / s.median / 1e9;
      std::printf("%-6s %7d %10.1f %10.1f %10.1f %10.0f %9.1f %9.1f %7.0f%%\n", c.name.c_str(),
                  threads, s.median * 1e3, s.min * 1e3, s.max * 1e3,
                  double(c.batch * c.ctx) / s.median, gflops, sgemm, 100.0 * gflops / sgemm);
      if (profile) {
        double total = 0;
        for (const auto& [op, t] : stage.op_times())
          total += t.forward + t.backward_input + t.backward_weight;
        std::printf("#   per op type, ms per step (forward / B / W), share of the step:\n");
        for (const auto& [op, t] : stage.op_times()) {
          double sum = t.forward + t.backward_input + t.backward_weight;
          std::printf("#   %-20s %8.2f %8.2f %8.2f  %5.1f%%\n", op.c_str(), t.forward * 1e3 / steps,
                      t.backward_input * 1e3 / steps, t.backward_weight * 1e3 / steps,
                      100.0 * sum / timed);
        }
        std::printf("#   outside ops (stage bookkeeping, allocation): %.2f ms per step\n",
                    (timed - total) * 1e3 / steps);
      }
      if (fresh > 0)
        std::printf("#   %zu allocations during the timed steps needed fresh memory\n", fresh);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return baton::bench::run_main("bench_gpt_step", [&] { return run(argc, argv); });
}
