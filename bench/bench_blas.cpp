// sgemm from three BLAS libraries in one run, at the GPT configs' matmul shapes, at 1
// and 2 threads: OpenBLAS (OpenMP build, what baton links), BLIS (Debian's OpenMP build)
// and oneDNN's dnnl_sgemm. OpenBLAS and BLIS are loaded with dlopen (RTLD_LOCAL, so their
// cblas_sgemm symbols do not clash and the bench needs neither at build time); a library
// that is not installed is skipped. All three run on the one libgomp runtime.
//
// build/release/bench/bench_blas [--threads 1,2] [--config A|B|all] [--reps N]
// Each row: the median and best time of N calls after a warm-up, in GFLOP/s (2·M·N·K).
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/args.h"
#include "oneapi/dnnl/dnnl.h"

namespace {

// CBLAS's enums, as OpenBLAS and BLIS both define them.
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);

struct Library {
  std::string name;
  std::function<void(int)> set_threads;
  // C[M,N] = op(A) op(B), row-major; ta/tb: transposed.
  std::function<void(bool, bool, int, int, int, const float*, const float*, float*)> sgemm;
};

bool load_cblas(const char* name, const char* path, const char* threads_fn, bool long_threads,
                std::vector<Library>& out) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::printf("# %s: not loaded (%s)\n", name, dlerror());
    return false;
  }
  auto gemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  void* thr = dlsym(h, threads_fn);
  if (gemm == nullptr || thr == nullptr) {
    std::printf("# %s: cblas_sgemm or %s missing\n", name, threads_fn);
    return false;
  }
  Library lib;
  lib.name = name;
  if (long_threads)
    lib.set_threads = [thr](int n) { reinterpret_cast<void (*)(long)>(thr)(long(n)); };
  else
    lib.set_threads = [thr](int n) { reinterpret_cast<void (*)(int)>(thr)(n); };
  lib.sgemm = [gemm](bool ta, bool tb, int m, int n, int k, const float* a, const float* b,
                     float* c) {
    gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, 1.0f, a, ta ? m : k, b,
         tb ? k : n, 0.0f, c, n);
  };
  out.push_back(std::move(lib));
  return true;
}

struct Shape {
  std::string config, name;
  int m, n, k;
  bool ta, tb;
};

// The linear layers of a GPT block and the head, forward (x W), input gradient (dy W^T)
// and weight gradient (x^T dy), for `tokens` rows of width c and a vocabulary of v.
void add_config(const std::string& cfg, int tokens, int c, int v, std::vector<Shape>& out) {
  struct L {
    const char* name;
    int in, outw;
  };
  for (L l : {L{"qkv", c, 3 * c}, L{"attn_proj", c, c}, L{"fc", c, 4 * c}, L{"mlp_proj", 4 * c, c},
              L{"lm_head", c, v}}) {
    out.push_back({cfg, std::string(l.name) + " fwd", tokens, l.outw, l.in, false, false});
    out.push_back({cfg, std::string(l.name) + " bwd_in", tokens, l.in, l.outw, false, true});
    out.push_back({cfg, std::string(l.name) + " bwd_w", l.in, l.outw, tokens, true, false});
  }
}

}  // namespace

constexpr const char* kUsage = "usage: bench_blas [--threads 1,2] [--config A|B|all] [--reps N]";

int run(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  std::string config = "all";
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw baton::InputError(a + " needs a value");
      return argv[++i];
    };
    // --config C, --threads 0 and --reps 0 had run (an empty table, "thr 0", one call)
    // with exit 0.
    if (a == "--help" || a == "-h") {
      std::printf("%s\n", kUsage);
      return 0;
    } else if (a == "--threads") {
      threads = baton::bench::thread_counts(next());
    } else if (a == "--config") {
      config = next();
      if (config != "A" && config != "B" && config != "all")
        throw baton::InputError("--config: expected A, B or all, found '" + config + "'");
    } else if (a == "--reps") {
      reps = baton::bench::parse_int("--reps", next(), 1);
    } else {
      throw baton::InputError("unknown argument '" + a + "'\n" + kUsage);
    }
  }

  std::vector<Library> libs;
  load_cblas("openblas", "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
             "openblas_set_num_threads", false, libs);
  load_cblas("blis", "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
             "bli_thread_set_num_threads", true, libs);
  libs.push_back(
      {"onednn", [](int n) { omp_set_num_threads(n); },
       [](bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
         dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n,
                    0.0f, c, n);
       }});

  std::vector<Shape> shapes;
  if (config == "A" || config == "all") add_config("A", 8 * 128, 256, 256, shapes);
  if (config == "B" || config == "all") add_config("B", 8 * 256, 512, 256, shapes);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("%-3s %-18s %-16s %3s", "cfg", "gemm", "MxNxK", "thr");
  for (const Library& l : libs) std::printf(" %10s %10s", (l.name + " med").c_str(), "best");
  std::printf("   GFLOP/s\n");
  for (int t : threads) {
    for (const Shape& s : shapes) {
      std::vector<float> a(size_t(s.m) * s.k), b(size_t(s.k) * s.n), c(size_t(s.m) * s.n);
      for (float& x : a) x = u(rng);
      for (float& x : b) x = u(rng);
      char mnk[64];
      std::snprintf(mnk, sizeof mnk, "%dx%dx%d", s.m, s.n, s.k);
      std::printf("%-3s %-18s %-16s %3d", s.config.c_str(), s.name.c_str(), mnk, t);
      const double flops = 2.0 * s.m * s.n * s.k;
      for (const Library& l : libs) {
        l.set_threads(t);
        omp_set_num_threads(t);
        for (int w = 0; w < 3; ++w)
          l.sgemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), b.data(), c.data());
        std::vector<double> ts;
        for (int r = 0; r < reps; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          l.sgemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), b.data(), c.data());
          ts.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ts.begin(), ts.end());
        std::printf(" %10.1f %10.1f", flops / ts[ts.size() / 2] / 1e9, flops / ts.front() / 1e9);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  return baton::bench::run_main("bench_blas", [&] { return run(argc, argv); });
}
