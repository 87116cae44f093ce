// Every op of the CUDA backend against the CPU backend on the same inputs, in f32
// (max error under 1e-4 of the reference's largest magnitude) and in bf16 and f16 (under 1e-2),
// the bf16 runs also exercising the mixed-precision pairs (f32 statistics, master
// weights and gradient accumulators). The CPU reference runs in f32 on the inputs
// rounded to the GPU's type. Skipped without a GPU. At the end a table of the errors
// (tools/gpu-check.sh prints it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/vision_cuda.h"
#include "kernels/fused.h"
#include "kernels/grad_scale.h"
#include "kernels/mixed_precision.h"
#include "kernels/ops.h"
#include "kernels/vision.h"
#include "memory/cuda_device.h"

using namespace baton;
using namespace baton::kernels;
using memory::Device;
using memory::DType;
using memory::Shape;
using memory::Tensor;

namespace {

const Device kGpu = Device::cuda(0);

std::map<std::string, double>& error_table() {
  static std::map<std::string, double> t;
  return t;
}

class PrintTable : public ::testing::Environment {
 public:
  void TearDown() override {
    if (error_table().empty()) return;
    std::printf("\n%-40s %12s %10s\n", "op (dtype)", "max rel err", "tolerance");
    for (auto& [name, err] : error_table())
      std::printf("%-40s %12.3e %10s\n", name.c_str(), err,
                  name.find("f16") != std::string::npos ? "1e-2" : "1e-4");
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrintTable);

double tol(DType dt) {
  return dt == DType::f32 ? 1e-4 : 1e-2;
}

Tensor randn(const Shape& s, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<float> d(0.f, float(scale));
  Tensor t = Tensor::empty(s);
  for (float& v : t.span<float>()) v = d(rng);
  return t;
}
// The CPU's copy of an input as the GPU sees it (rounded to dt), in f32.
Tensor rounded(const Tensor& t, DType dt) {
  return dt == DType::f32 ? t.clone() : t.to(dt).to(DType::f32);
}
Tensor dev(const Tensor& t, DType dt) {
  return t.to(dt).to(kGpu);
}
Tensor cuda_ops_host(const Tensor& d) {
  memory::cuda::synchronize(0);
  Tensor h = d.to(Device::cpu());
  return h.dtype() == DType::f32 ? h : h.to(DType::f32);
}

// max |got - want| / max |want|; infinite when either holds a NaN or an infinity where
// the other does not (std::max would pass a NaN over: NaN < x is false).
double rel_err(const Tensor& got_dev, const Tensor& want) {
  const std::vector<float> g = cuda_ops_host(got_dev).to_vector<float>(),
                           w = want.to_vector<float>();
  EXPECT_EQ(g.size(), w.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    const double a = g[i], b = w[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (a == b) continue;  // the same infinity
      return std::numeric_limits<double>::infinity();
    }
    num = std::max(num, std::fabs(a - b));
    den = std::max(den, std::fabs(b));
  }
  return num / den;
}

void expect_close(const std::string& op, DType dt, const Tensor& got_dev, const Tensor& want) {
  const double e = rel_err(got_dev, want);
  const std::string key = op + " (" + std::string(memory::dtype_name(dt)) + ")";
  error_table()[key] = std::max(error_table()[key], e);
  EXPECT_LT(e, tol(dt)) << key;
}

class CudaOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (memory::cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << memory::cuda::unavailable_reason();
    seed_ = 1234 + uint64_t(GetParam());
    std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed_));
    rng_.seed(seed_);
  }
  DType dt() const { return GetParam(); }
  // f32 in the f32 runs; in the bf16 runs the mixed-precision side type.
  DType wide() const { return DType::f32; }
  void elementwise_case(int64_t C);
  void layernorm_case(int64_t C);
  void add_layernorm_case(int64_t C);
  void silu_swiglu_bias_gelu_case(int64_t C);
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace

TEST_P(CudaOps, Matmul) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared : {false, true}) {
        const int64_t B = 3, M = 33, N = 29, K = 47;
        Tensor a = randn(ta ? Shape{B, K, M} : Shape{B, M, K}, rng_);
        Tensor b = randn(
            shared ? (tb ? Shape{N, K} : Shape{K, N}) : (tb ? Shape{B, N, K} : Shape{B, K, N}),
            rng_);
        Tensor c = randn({B, M, N}, rng_);
        Tensor ra = rounded(a, dt()), rb = rounded(b, dt()), rc = rounded(c, dt());
        Tensor da = dev(a, dt()), db = dev(b, dt()), dc = dev(c, dt());
        kernels::matmul(ra, ta, rb, tb, rc, 0.5, 1.0);
        kernels::matmul(da, ta, db, tb, dc, 0.5, 1.0);
        expect_close("matmul", dt(), dc, rc);
        // f32 output of 16-bit inputs (weight gradients in f32).
        Tensor dc32 = dev(c, DType::f32), rc32 = c.clone();
        kernels::matmul(ra, ta, rb, tb, rc32, 1.0, 0.0);
        kernels::matmul(da, ta, db, tb, dc32, 1.0, 0.0);
        expect_close("matmul f32 out", dt(), dc32, rc32);
      }
}

TEST_P(CudaOps, Linear) {
  for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
    const int64_t N = 37, in = 48, out = 40;
    const bool io = layout == WeightLayout::in_out;
    Tensor x = randn({N, in}, rng_), w = randn(io ? Shape{in, out} : Shape{out, in}, rng_, 0.2);
    Tensor bias = randn({out}, rng_), dy = randn({N, out}, rng_);
    Tensor rx = rounded(x, dt()), rw = rounded(w, dt()), rb = rounded(bias, dt()),
           rdy = rounded(dy, dt());
    Tensor dx_ = dev(x, dt()), dw_ = dev(w, dt()), db_ = dev(bias, dt()), ddy = dev(dy, dt());
    for (bool with_bias : {true, false}) {
      Tensor ry = Tensor::empty({N, out}), gy = Tensor::empty({N, out}, dt(), kGpu);
      const auto before = kernels::cuda::linear_bias_paths();
      kernels::linear_forward(rx, rw, with_bias ? rb : Tensor(), layout, ry);
      kernels::linear_forward(dx_, dw_, with_bias ? db_ : Tensor(), layout, gy);
      expect_close(with_bias ? "linear_forward+bias" : "linear_forward", dt(), gy, ry);
      // Whole tensors from the caching allocator are aligned: the bias goes through
      // cuBLASLt's epilogue, not a GEMM and a second pass.
      const auto after = kernels::cuda::linear_bias_paths();
      EXPECT_EQ(after.lt_epilogue - before.lt_epilogue, with_bias ? 1u : 0u)
          << "the bias GEMM did not take cuBLASLt";
      EXPECT_EQ(after.gemm_then_bias, before.gemm_then_bias);
    }
    {  // A view 4 elements in is not 256-byte aligned: GEMM + bias kernel, same result.
      Tensor big = dev(randn({N * out + 4}, rng_), dt());
      Tensor gy = big.narrow(0, 4, N * out).view({N, out});
      Tensor ry = Tensor::empty({N, out});
      const auto before = kernels::cuda::linear_bias_paths();
      kernels::linear_forward(rx, rw, rb, layout, ry);
      kernels::linear_forward(dx_, dw_, db_, layout, gy);
      expect_close("linear_forward+bias unaligned", dt(), gy, ry);
      EXPECT_EQ(kernels::cuda::linear_bias_paths().gemm_then_bias - before.gemm_then_bias, 1u);
    }
    Tensor prev = randn({N, in}, rng_);
    Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
    kernels::linear_backward_input(rdy, rw, layout, rdx, true);
    kernels::linear_backward_input(ddy, dw_, layout, gdx, true);
    expect_close("linear_backward_input", dt(), gdx, rdx);
    // Weight and bias gradients (f32 whatever the activations' type) of dy on the CPU and
    // on the GPU, added to random ones or written; returns how many went each bias path.
    auto weight_grads = [&](const Tensor& cpu_dy, const Tensor& gpu_dy, bool accumulate,
                            const std::string& tag) {
      SCOPED_TRACE(tag + (accumulate ? " accumulate" : " write"));
      Tensor acc_w = randn(w.shape(), rng_), acc_b = randn({out}, rng_);
      Tensor rdw = acc_w.clone(), rdb = acc_b.clone();
      Tensor gdw = dev(acc_w, wide()), gdb = dev(acc_b, wide());
      const auto before = kernels::cuda::linear_bias_paths();
      kernels::linear_backward_weight(cpu_dy, rx, layout, rdw, rdb, accumulate);
      kernels::linear_backward_weight(gpu_dy, dx_, layout, gdw, gdb, accumulate);
      expect_close("linear_backward_weight" + tag, dt(), gdw, rdw);
      expect_close("linear_backward_weight dbias" + tag, dt(), gdb, rdb);
      const auto after = kernels::cuda::linear_bias_paths();
      return std::pair{after.lt_bias_grad - before.lt_bias_grad,
                       after.colsum_bias_grad - before.colsum_bias_grad};
    };
    for (bool accumulate : {true, false}) {
      const auto [lt, colsum] = weight_grads(rdy, ddy, accumulate, "");
      EXPECT_EQ(lt + colsum, 1u);
      // The bias gradient summed in the GEMM's epilogue, not by a second pass over dy.
      // W [out, in] (BGRADB, the form Transformer Engine uses) must take it; for GPT-2's
      // W [in, out] (BGRADA) cuBLASLt decides, and the check prints which path ran.
      if (layout == WeightLayout::out_in)
        EXPECT_EQ(lt, 1u) << "the bias gradient did not take cuBLASLt's epilogue";
      else
        std::printf("linear_backward_weight W [in, out] %s: bias gradient by %s\n",
                    std::string(memory::dtype_name(dt())).c_str(),
                    lt == 1 ? "cuBLASLt's BGRADA epilogue" : "the column sums");
    }
    {  // dy 4 elements into a buffer is not 256-byte aligned: the column sums, same result.
      Tensor big = dev(randn({N * out + 4}, rng_), dt());
      Tensor gdy = big.narrow(0, 4, N * out).view({N, out});
      EXPECT_EQ(weight_grads(cuda_ops_host(gdy), gdy, false, " unaligned").second, 1u);
    }
  }
}

// Widths of 70 take one element per thread; 64 (rows of whole 16-byte packs) the packed path.
TEST_P(CudaOps, Elementwise) {
  for (int64_t C : {70, 64}) elementwise_case(C);
}

void CudaOps::elementwise_case(int64_t C) {
  SCOPED_TRACE("width " + std::to_string(C));
  Tensor a = randn({300, C}, rng_), b = randn({300, C}, rng_), bias = randn({C}, rng_);
  Tensor ra = rounded(a, dt()), rb = rounded(b, dt()), rbias = rounded(bias, dt());
  Tensor ga = dev(a, dt()), gb = dev(b, dt());
  Tensor ro = Tensor::empty(a.shape()), go = Tensor::empty(a.shape(), dt(), kGpu);
  kernels::add(ra, rb, ro);
  kernels::add(ga, gb, go);
  expect_close("add", dt(), go, ro);
  // An f32 accumulator of 16-bit values.
  Tensor racc = a.clone(), gacc = dev(a, wide());
  kernels::add_inplace(racc, rb);
  kernels::add_inplace(gacc, gb);
  expect_close("add_inplace", dt(), gacc, racc);
  Tensor rs = ra.clone(), gs = ga.clone();
  kernels::scale_inplace(rs, -1.75);
  kernels::scale_inplace(gs, -1.75);
  expect_close("scale_inplace", dt(), gs, rs);
  Tensor rba = ra.clone(), gba = ga.clone();
  kernels::bias_add_inplace(rba, rbias);
  kernels::bias_add_inplace(gba, dev(bias, dt()));
  expect_close("bias_add_inplace", dt(), gba, rba);
  Tensor rba32 = ra.clone(), gba32 = ga.clone();  // an f32 bias on 16-bit activations
  kernels::bias_add_inplace(rba32, bias);
  kernels::bias_add_inplace(gba32, dev(bias, DType::f32));
  expect_close("bias_add_inplace f32 bias", dt(), gba32, rba32);
  Tensor rdb = bias.clone(), gdb = dev(bias, wide());
  kernels::bias_backward(ra, rdb, true);
  kernels::bias_backward(ga, gdb, true);
  expect_close("bias_backward", dt(), gdb, rdb);
}

TEST_P(CudaOps, Activations) {
  for (int64_t n : {5000, 5001}) {  // packs of 8 elements, and one element per thread
    Tensor x = randn({n}, rng_, 2.0), dy = randn({n}, rng_), prev = randn({n}, rng_);
    Tensor rx = rounded(x, dt()), rdy = rounded(dy, dt());
    Tensor gx = dev(x, dt()), gdy = dev(dy, dt());
    for (bool gelu : {true, false}) {
      Tensor ry = Tensor::empty({n}), gy = Tensor::empty({n}, dt(), kGpu);
      (gelu ? kernels::gelu_forward : kernels::relu_forward)(rx, ry);
      (gelu ? kernels::gelu_forward : kernels::relu_forward)(gx, gy);
      expect_close(gelu ? "gelu_forward" : "relu_forward", dt(), gy, ry);
      Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
      (gelu ? kernels::gelu_backward : kernels::relu_backward)(rx, rdy, rdx, true);
      (gelu ? kernels::gelu_backward : kernels::relu_backward)(gx, gdy, gdx, true);
      expect_close(gelu ? "gelu_backward" : "relu_backward", dt(), gdx, rdx);
    }
  }
}

// Far on the negative side GELU's gradient is 0, as on the CPU: the CUDA formula's
// 0 * inf (3 a x^2 overflowing below about -5e19) had made NaN.
TEST_P(CudaOps, GeluFarOnTheNegativeSide) {
  const std::vector<float> xs = {-3e38f, -1e30f, -1e20f, -6e19f, -100.f, -50.f, -12.f, -5.f};
  Tensor x = Tensor::from_vector(xs, {int64_t(xs.size())});
  Tensor dy = Tensor::from_vector(std::vector<float>(xs.size(), 1.f), x.shape());
  Tensor rx = rounded(x, dt()), gx = dev(x, dt());
  Tensor rdx = Tensor::empty(x.shape()), gdx = Tensor::empty(x.shape(), dt(), kGpu);
  kernels::gelu_backward(rx, dy, rdx, false);
  kernels::gelu_backward(gx, dev(dy, dt()), gdx, false);
  const std::vector<float> h = cuda_ops_host(gdx).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(std::isfinite(h[i])) << "x " << xs[i];
  expect_close("gelu_backward far negative", dt(), gdx, rdx);
}

// LLaMA's gated MLP and GPT's fused bias + GELU.
TEST_P(CudaOps, SiluSwigluAndBiasGelu) {
  for (int64_t C : {90, 96}) silu_swiglu_bias_gelu_case(C);  // 96: the packed path
}

void CudaOps::silu_swiglu_bias_gelu_case(int64_t C) {
  SCOPED_TRACE("width " + std::to_string(C));
  const int64_t N = 60;
  Tensor g = randn({N, C}, rng_, 2.0), u = randn({N, C}, rng_), dy = randn({N, C}, rng_),
         prev = randn({N, C}, rng_), bias = randn({C}, rng_);
  Tensor rg = rounded(g, dt()), ru = rounded(u, dt()), rdy = rounded(dy, dt());
  Tensor gg = dev(g, dt()), gu = dev(u, dt()), gdy = dev(dy, dt());
  Tensor ry = Tensor::empty({N, C}), gy = Tensor::empty({N, C}, dt(), kGpu);
  kernels::silu_forward(rg, ry);
  kernels::silu_forward(gg, gy);
  expect_close("silu_forward", dt(), gy, ry);
  Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
  kernels::silu_backward(rg, rdy, rdx, true);
  kernels::silu_backward(gg, gdy, gdx, true);
  expect_close("silu_backward", dt(), gdx, rdx);
  kernels::swiglu_forward(rg, ru, ry);
  kernels::swiglu_forward(gg, gu, gy);
  expect_close("swiglu_forward", dt(), gy, ry);
  for (bool acc : {false, true}) {
    Tensor rdg = rounded(prev, dt()), rdu = rounded(prev, dt());
    Tensor gdg = dev(prev, dt()), gdu = dev(prev, dt());
    kernels::swiglu_backward(rg, ru, rdy, rdg, rdu, acc, acc);
    kernels::swiglu_backward(gg, gu, gdy, gdg, gdu, acc, acc);
    expect_close("swiglu_backward dgate", dt(), gdg, rdg);
    expect_close("swiglu_backward dup", dt(), gdu, rdu);
  }
  Tensor undefined;  // only one of the two gradients asked for
  Tensor rdu = Tensor::empty({N, C}), gdu = Tensor::empty({N, C}, dt(), kGpu);
  kernels::swiglu_backward(rg, ru, rdy, undefined, rdu, false, false);
  kernels::swiglu_backward(gg, gu, gdy, undefined, gdu, false, false);
  expect_close("swiglu_backward dup only", dt(), gdu, rdu);
  for (bool f32_bias : {false, true}) {
    Tensor rh = Tensor::empty({N, C}), gh = Tensor::empty({N, C}, dt(), kGpu);
    kernels::bias_gelu_forward(rg, f32_bias ? bias : rounded(bias, dt()), rh, ry);
    kernels::bias_gelu_forward(gg, dev(bias, f32_bias ? DType::f32 : dt()), gh, gy);
    expect_close(f32_bias ? "bias_gelu_forward f32 bias h" : "bias_gelu_forward h", dt(), gh, rh);
    expect_close(f32_bias ? "bias_gelu_forward f32 bias" : "bias_gelu_forward", dt(), gy, ry);
  }
  Tensor rin = rg.clone(), gin = gg.clone();  // h in place of x
  kernels::bias_gelu_forward(rin, rounded(bias, dt()), rin, ry);
  kernels::bias_gelu_forward(gin, dev(bias, dt()), gin, gy);
  expect_close("bias_gelu_forward in place", dt(), gy, ry);
}

TEST_P(CudaOps, DropoutMasksMatchTheCpuBitForBit) {
  // A [6, 40] block at offset (2, 24) of a [16, 100] logical tensor.
  Block where{{16, 100}, {2, 24}};
  Tensor x = randn({6, 40}, rng_), dy = randn({6, 40}, rng_);
  for (uint64_t i = 0; i < 240; ++i)  // no zeros in the input: a zero out means dropped
    if (x.span<float>()[i] == 0.f) x.span<float>()[i] = 1.f;
  Tensor rx = rounded(x, dt()), gx = dev(x, dt());
  Tensor ry = Tensor::empty({6, 40}), gy = Tensor::empty({6, 40}, dt(), kGpu);
  kernels::dropout_forward(rx, ry, 0.3, 99, 7, where);
  kernels::dropout_forward(gx, gy, 0.3, 99, 7, where);
  expect_close("dropout_forward", dt(), gy, ry);
  const std::vector<float> hy = cuda_ops_host(gy).to_vector<float>(), cy = ry.to_vector<float>();
  int dropped = 0;
  for (size_t i = 0; i < hy.size(); ++i) {
    ASSERT_EQ(hy[i] == 0.f, cy[i] == 0.f) << "mask differs at " << i;
    dropped += cy[i] == 0.f;
  }
  EXPECT_GT(dropped, 30);
  EXPECT_LT(dropped, 120);
  Tensor rdx = rounded(x, dt()), gdx = dev(x, dt());
  kernels::dropout_backward(rounded(dy, dt()), rdx, 0.3, 99, 7, where, true);
  kernels::dropout_backward(dev(dy, dt()), gdx, 0.3, 99, 7, where, true);
  expect_close("dropout_backward", dt(), gdx, rdx);
}

// 300 columns: one per lane at a time; 264 and 768 (GPT-2's): packs of 8.
TEST_P(CudaOps, LayerNorm) {
  for (int64_t C : {300, 264, 768}) layernorm_case(C);
}

void CudaOps::layernorm_case(int64_t C) {
  SCOPED_TRACE("width " + std::to_string(C));
  const int64_t N = 67;
  Tensor x = randn({N, C}, rng_, 3.0), w = randn({C}, rng_), b = randn({C}, rng_),
         dy = randn({N, C}, rng_);
  Tensor rx = rounded(x, dt()), rdy = rounded(dy, dt());
  Tensor gx = dev(x, dt()), gdy = dev(dy, dt()), gw = dev(w, wide()), gb = dev(b, wide());
  Tensor ry = Tensor::empty({N, C}), rm = Tensor::empty({N}), rr = Tensor::empty({N});
  Tensor gy = Tensor::empty({N, C}, dt(), kGpu), gm = Tensor::empty({N}, DType::f32, kGpu),
         gr = Tensor::empty({N}, DType::f32, kGpu);
  kernels::layernorm_forward(rx, w, b, 1e-5, ry, rm, rr);
  kernels::layernorm_forward(gx, gw, gb, 1e-5, gy, gm, gr);
  expect_close("layernorm_forward", dt(), gy, ry);
  expect_close("layernorm_forward rstd", dt(), gr, rr);
  Tensor rdx = Tensor::empty({N, C}), gdx = Tensor::empty({N, C}, dt(), kGpu);
  kernels::layernorm_backward_input(rdy, rx, w, rm, rr, rdx, false);
  kernels::layernorm_backward_input(gdy, gx, gw, gm, gr, gdx, false);
  expect_close("layernorm_backward_input", dt(), gdx, rdx);
  Tensor rdw = w.clone(), rdb = b.clone(), gdw = dev(w, wide()), gdb = dev(b, wide());
  kernels::layernorm_backward_weight(rdy, rx, rm, rr, rdw, rdb, true);
  kernels::layernorm_backward_weight(gdy, gx, gm, gr, gdw, gdb, true);
  expect_close("layernorm_backward_weight", dt(), gdw, rdw);
  expect_close("layernorm_backward_weight dbias", dt(), gdb, rdb);
}

TEST_P(CudaOps, AddLayerNorm) {
  for (int64_t C : {260, 320}) add_layernorm_case(C);  // 320: packs of 8
}

void CudaOps::add_layernorm_case(int64_t C) {
  SCOPED_TRACE("width " + std::to_string(C));
  const int64_t N = 45;
  Tensor a = randn({N, C}, rng_, 2.0), b = randn({N, C}, rng_), w = randn({C}, rng_),
         bias = randn({C}, rng_), dy = randn({N, C}, rng_), ds = randn({N, C}, rng_),
         prev = randn({N, C}, rng_);
  Tensor ra = rounded(a, dt()), rb = rounded(b, dt());
  Tensor rs = Tensor::empty({N, C}), ry = Tensor::empty({N, C}), rm = Tensor::empty({N}),
         rr = Tensor::empty({N});
  Tensor gs = Tensor::empty({N, C}, dt(), kGpu), gy = Tensor::empty({N, C}, dt(), kGpu),
         gm = Tensor::empty({N}, DType::f32, kGpu), gr = Tensor::empty({N}, DType::f32, kGpu);
  kernels::add_layernorm_forward(ra, rb, w, bias, 1e-5, rs, ry, rm, rr);
  kernels::add_layernorm_forward(dev(a, dt()), dev(b, dt()), dev(w, wide()), dev(bias, wide()),
                                 1e-5, gs, gy, gm, gr);
  // The CPU sum is f32; the GPU's s is stored in dt and normalised as stored.
  expect_close("add_layernorm_forward s", dt(), gs, rs);
  expect_close("add_layernorm_forward", dt(), gy, ry);
  expect_close("add_layernorm_forward rstd", dt(), gr, rr);
  Tensor rsr = rounded(cuda_ops_host(gs), dt());
  for (bool with_ds : {false, true})
    for (bool acc : {false, true}) {
      Tensor none, rdx = rounded(prev, dt()), gdx = dev(prev, dt());
      kernels::add_layernorm_backward_input(rounded(dy, dt()), with_ds ? rounded(ds, dt()) : none,
                                            rsr, w, cuda_ops_host(gm), cuda_ops_host(gr), rdx, acc);
      kernels::add_layernorm_backward_input(dev(dy, dt()), with_ds ? dev(ds, dt()) : none, gs,
                                            dev(w, wide()), gm, gr, gdx, acc);
      expect_close(std::string("add_layernorm_backward_input") + (with_ds ? " ds" : "") +
                       (acc ? " acc" : ""),
                   dt(), gdx, rdx);
    }
}

TEST_P(CudaOps, RmsNorm) {
  const int64_t N = 67, C = 300;
  Tensor x = randn({N, C}, rng_, 3.0), w = randn({C}, rng_), dy = randn({N, C}, rng_),
         prev = randn({N, C}, rng_);
  Tensor rx = rounded(x, dt()), rdy = rounded(dy, dt()), rw = rounded(w, dt());
  Tensor gx = dev(x, dt()), gdy = dev(dy, dt());
  for (bool f32_side : {false, true}) {  // weight and rstd in f32 beside 16-bit activations
    const DType side = f32_side ? DType::f32 : dt();
    const Tensor& cw = f32_side ? w : rw;
    const std::string tag = f32_side ? " f32 weight" : "";
    Tensor ry = Tensor::empty({N, C}), rr = Tensor::empty({N});
    Tensor gy = Tensor::empty({N, C}, dt(), kGpu), gr = Tensor::empty({N}, side, kGpu);
    kernels::rmsnorm_forward(rx, cw, 1e-6, ry, rr);
    kernels::rmsnorm_forward(gx, dev(w, side), 1e-6, gy, gr);
    expect_close("rmsnorm_forward" + tag, dt(), gy, ry);
    expect_close("rmsnorm_forward rstd" + tag, dt(), gr, rr);
    for (bool acc : {false, true}) {
      Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
      kernels::rmsnorm_backward_input(rdy, rx, cw, rr, rdx, acc);
      kernels::rmsnorm_backward_input(gdy, gx, dev(w, side), gr, gdx, acc);
      expect_close("rmsnorm_backward_input" + tag + (acc ? " acc" : ""), dt(), gdx, rdx);
    }
    Tensor rdw = w.clone(), gdw = dev(w, f32_side ? DType::f32 : dt());
    if (!f32_side) rdw = rounded(w, dt());
    kernels::rmsnorm_backward_weight(rdy, rx, rr, rdw, true);
    kernels::rmsnorm_backward_weight(gdy, gx, gr, gdw, true);
    expect_close("rmsnorm_backward_weight" + tag, dt(), gdw, rdw);
  }
}

// Into and out of a column range of a wider (qkv-like) tensor, with a position offset
// (a generation step's) and Llama 3's frequency scaling.
TEST_P(CudaOps, Rotary) {
  const int64_t B = 2, T = 19, heads = 3, D = 64, C = 5 * heads * D, col = heads * D;
  RopeScaling sc;
  sc.kind = RopeScaling::Kind::llama3;
  sc.factor = 8;
  sc.original_max_position_embeddings = 16;
  const std::vector<double> freq = rope_inv_freq(D, 500000.0, sc);
  RotaryOptions opt;
  opt.heads = heads;
  opt.inv_freq = &freq;
  opt.position_offset = 7;
  Tensor x = randn({B, T, heads * D}, rng_), wide = randn({B, T, C}, rng_),
         prev = randn({B, T, heads * D}, rng_);
  Tensor rx = rounded(x, dt()), rw = rounded(wide, dt()), gw = dev(wide, dt());
  kernels::rotary_forward(rx, opt, rw, col);
  kernels::rotary_forward(dev(x, dt()), opt, gw, col);
  expect_close("rotary_forward", dt(), gw, rw);  // the other columns untouched too
  for (bool acc : {false, true}) {
    Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
    kernels::rotary_backward(rounded(wide, dt()), col, opt, rdx, acc);
    kernels::rotary_backward(dev(wide, dt()), col, opt, gdx, acc);
    expect_close(std::string("rotary_backward") + (acc ? " acc" : ""), dt(), gdx, rdx);
  }
}

TEST_P(CudaOps, Softmax) {
  Tensor x = randn({45, 333}, rng_, 3.0), dy = randn({45, 333}, rng_);
  Tensor rx = rounded(x, dt()), gx = dev(x, dt());
  Tensor ry = Tensor::empty(x.shape()), gy = Tensor::empty(x.shape(), dt(), kGpu);
  kernels::softmax_forward(rx, ry);
  kernels::softmax_forward(gx, gy);
  expect_close("softmax_forward", dt(), gy, ry);
  Tensor rdx = Tensor::empty(x.shape()), gdx = Tensor::empty(x.shape(), dt(), kGpu);
  kernels::softmax_backward(rounded(cuda_ops_host(gy), dt()), rounded(dy, dt()), rdx, false);
  kernels::softmax_backward(gy, dev(dy, dt()), gdx, false);
  expect_close("softmax_backward", dt(), gdx, rdx);
}

// Both implementations: the fused flash kernels (16-bit, head sizes 32/64/128) and the
// cuBLAS path (every type and head size), with and without dropout, on sequence lengths
// that are not multiples of the 64-row tiles.
TEST_P(CudaOps, Attention) {
  struct Case {
    int64_t B, T, H, D;
  };
  const std::vector<Case> cases{{2, 37, 3, 16}, {2, 150, 2, 32}, {1, 129, 2, 64}, {1, 70, 1, 128}};
  using kernels::cuda::AttentionImpl;
  for (auto impl : {AttentionImpl::cublas, AttentionImpl::flash, AttentionImpl::cudnn}) {
    // Forced, not `automatic`: the flash rows test the fused kernels or fail, the cudnn
    // rows cuDNN's fused forward and backward or fail (its accumulating backward is ours,
    // from its lse).
    const bool flash = impl == AttentionImpl::flash, cudnn = impl == AttentionImpl::cudnn;
    if ((flash || cudnn) && dt() == DType::f32) continue;  // the fused kernels are 16-bit only
    if (cudnn && !kernels::cuda::cudnn_built()) {
      std::printf("[ note     ] attention cudnn: built without cuDNN, not tested\n");
      continue;
    }
    kernels::cuda::set_attention_impl(impl);
    const std::string name = flash   ? "attention flash"
                             : cudnn ? "attention cudnn"
                                     : "attention cublas";
    for (const Case& k : cases) {
      if (flash && k.D == 16) {  // not covered by the fused kernels: forced, they say so
        AttentionOptions opt;
        opt.heads = k.H;
        Tensor gq = dev(randn({k.B, k.T, 3 * k.H * k.D}, rng_), dt());
        Tensor go = Tensor::empty({k.B, k.T, k.H * k.D}, dt(), kGpu),
               gl = Tensor::empty({k.B, k.H, k.T}, DType::f32, kGpu);
        EXPECT_THROW(kernels::attention_forward(gq, opt, go, gl), std::exception);
        continue;
      }
      for (double p : {0.0, 0.2}) {
        if (cudnn && p > 0) continue;  // the cuDNN graph has no dropout
        AttentionOptions opt;
        opt.heads = k.H;
        opt.dropout = p;
        opt.seed = 5, opt.stream = 11;
        opt.batch_offset = 1, opt.head_offset = 2, opt.global_batch = 4, opt.global_heads = k.H + 3;
        const int64_t B = k.B, T = k.T, H = k.H, D = k.D;
        Tensor qkv = randn({B, T, 3 * H * D}, rng_), dout = randn({B, T, H * D}, rng_);
        Tensor rq = rounded(qkv, dt()), gq = dev(qkv, dt());
        Tensor ro = Tensor::empty({B, T, H * D}), rl = Tensor::empty({B, H, T});
        Tensor go = Tensor::empty({B, T, H * D}, dt(), kGpu),
               gl = Tensor::empty({B, H, T}, DType::f32, kGpu);
        kernels::attention_forward(rq, opt, ro, rl);
        kernels::attention_forward(gq, opt, go, gl);
        const std::string tag = name + (p > 0 ? " dropout" : "");
        expect_close(tag + " forward", dt(), go, ro);
        expect_close(tag + " lse", dt(), gl, rl);
        // Backward from the GPU's own forward output, rounded for the CPU.
        Tensor rd = Tensor::empty(qkv.shape()), gd = dev(randn(qkv.shape(), rng_), dt());
        Tensor prev = cuda_ops_host(gd);
        kernels::attention_backward(rq, rounded(cuda_ops_host(go), dt()), rl, rounded(dout, dt()),
                                    opt, rd, false);
        kernels::attention_backward(gq, go, gl, dev(dout, dt()), opt, gd, false);
        expect_close(tag + " backward", dt(), gd, rd);
        if (!cudnn) {  // the first query sees one key: its gradient is exactly 0, as on the CPU
          const Tensor hd = cuda_ops_host(gd).to(DType::f32);
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t c = 0; c < H * D; ++c)
              ASSERT_EQ(hd.data<float>()[bi * T * 3 * H * D + c], 0.0f)
                  << tag << " batch " << bi << " column " << c;
        }
        // accumulate = true adds to what dqkv held.
        Tensor gacc = dev(prev, dt());
        kernels::attention_backward(gq, go, gl, dev(dout, dt()), opt, gacc, true);
        kernels::add_inplace(rd, rounded(prev, dt()));
        expect_close(tag + " backward acc", dt(), gacc, rd);
      }
    }
  }
  kernels::cuda::set_attention_impl(AttentionImpl::automatic);
}

// Grouped-query and multi-query attention, and a tensor-parallel rank's slice of the
// query heads beside every key/value head (replicated), on both implementations.
// The scale as given (0: uniform weights) on every path `automatic` and cublas take, and
// T = 1, where every query is a first query: its gradient exactly 0, as on the CPU
// (automatic leaves cuDNN's backward there).
TEST_P(CudaOps, AttentionScaleAndOneKey) {
  using kernels::cuda::AttentionImpl;
  for (auto impl : {AttentionImpl::automatic, AttentionImpl::cublas}) {
    kernels::cuda::set_attention_impl(impl);
    for (int64_t T : {1, 37})
      for (std::optional<double> scale :
           {std::optional<double>{}, std::optional<double>{0.3}, std::optional<double>{0.0}}) {
        const int64_t B = 2, H = 2, D = 32;
        const std::string tag =
            std::string(impl == AttentionImpl::cublas ? "cublas" : "automatic") + " T " +
            std::to_string(T) + (scale ? " scale " + std::to_string(*scale) : "");
        AttentionOptions opt;
        opt.heads = H;
        opt.scale = scale;
        Tensor qkv = randn({B, T, 3 * H * D}, rng_), dout = randn({B, T, H * D}, rng_);
        Tensor rq = rounded(qkv, dt()), gq = dev(qkv, dt());
        Tensor ro = Tensor::empty({B, T, H * D}), rl = Tensor::empty({B, H, T});
        Tensor go = Tensor::empty({B, T, H * D}, dt(), kGpu),
               gl = Tensor::empty({B, H, T}, DType::f32, kGpu);
        kernels::attention_forward(rq, opt, ro, rl);
        kernels::attention_forward(gq, opt, go, gl);
        expect_close("attention scale forward", dt(), go, ro);
        Tensor rd = Tensor::empty(qkv.shape()), gd = Tensor::empty(qkv.shape(), dt(), kGpu);
        kernels::attention_backward(rq, rounded(cuda_ops_host(go), dt()), rl, rounded(dout, dt()),
                                    opt, rd, false);
        kernels::attention_backward(gq, go, gl, dev(dout, dt()), opt, gd, false);
        expect_close("attention scale backward", dt(), gd, rd);
        if (T == 1) {
          const Tensor hd = cuda_ops_host(gd);
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t c = 0; c < 2 * H * D; ++c)  // the query and key columns
              ASSERT_EQ(hd.data<float>()[bi * 3 * H * D + c], 0.0f) << tag << " column " << c;
        }
      }
  }
  kernels::cuda::set_attention_impl(AttentionImpl::automatic);
}

// A device tensor's host copy in each dtype is the host tensor's (checkpoints and export
// write device weights through it).
TEST_P(CudaOps, ToStagingFromTheDevice) {
  Tensor x = randn({3, 67}, rng_, 50.0);
  const Tensor host = rounded(x, dt()).to(dt());
  const Tensor d = dev(x, dt());
  for (DType to : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor want = host.to_staging(to), got = d.to_staging(to);
    ASSERT_EQ(got.dtype(), to);
    ASSERT_TRUE(got.device().is_cpu());
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), size_t(want.nbytes())), 0)
        << memory::dtype_name(to);
  }
  // A strided view (a column slice) too.
  const Tensor col = d.narrow(1, 5, 20), want = host.narrow(1, 5, 20).to_staging(DType::f32);
  const Tensor got = col.to_staging(DType::f32);
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), size_t(want.nbytes())), 0);
}

TEST_P(CudaOps, GroupedQueryAttention) {
  struct Case {
    int64_t B, T, H, KV, D, group, kv_offset, head_offset, global_heads;
  };
  const std::vector<Case> cases{{2, 37, 4, 2, 32, 0, -1, 0, 0},
                                {1, 70, 4, 1, 64, 0, -1, 0, 0},
                                {2, 45, 2, 2, 32, 2, 0, 2, 4}};  // heads 2..3 of 4, KV 2 of 2
  using kernels::cuda::AttentionImpl;
  for (auto impl : {AttentionImpl::cublas, AttentionImpl::flash}) {
    if (impl == AttentionImpl::flash && dt() == DType::f32) continue;
    kernels::cuda::set_attention_impl(impl);
    const std::string name =
        impl == AttentionImpl::flash ? "attention gqa flash" : "attention gqa cublas";
    for (const Case& k : cases) {
      AttentionOptions opt;
      opt.heads = k.H, opt.kv_heads = k.KV, opt.group = k.group, opt.kv_offset = k.kv_offset;
      opt.head_offset = k.head_offset, opt.global_heads = k.global_heads;
      const int64_t W = (k.H + 2 * k.KV) * k.D;
      Tensor qkv = randn({k.B, k.T, W}, rng_), dout = randn({k.B, k.T, k.H * k.D}, rng_),
             prev = randn({k.B, k.T, W}, rng_);
      Tensor rq = rounded(qkv, dt()), gq = dev(qkv, dt());
      Tensor ro = Tensor::empty({k.B, k.T, k.H * k.D}), rl = Tensor::empty({k.B, k.H, k.T});
      Tensor go = Tensor::empty({k.B, k.T, k.H * k.D}, dt(), kGpu),
             gl = Tensor::empty({k.B, k.H, k.T}, DType::f32, kGpu);
      kernels::attention_forward(rq, opt, ro, rl);
      kernels::attention_forward(gq, opt, go, gl);
      expect_close(name + " forward", dt(), go, ro);
      expect_close(name + " lse", dt(), gl, rl);
      for (bool acc : {false, true}) {
        Tensor rd = rounded(prev, dt()), gd = dev(prev, dt());
        kernels::attention_backward(rq, rounded(cuda_ops_host(go), dt()), rl, rounded(dout, dt()),
                                    opt, rd, acc);
        kernels::attention_backward(gq, go, gl, dev(dout, dt()), opt, gd, acc);
        expect_close(name + " backward" + (acc ? " acc" : ""), dt(), gd, rd);
      }
    }
  }
  kernels::cuda::set_attention_impl(AttentionImpl::automatic);
}

// Convolutions on cuDNN: strides, uneven padding (a spatial tile's), dilation, groups;
// the bias, and accumulation into the gradients.
TEST_P(CudaOps, Conv2d) {
  if (!kernels::cuda::cudnn_conv_built()) GTEST_SKIP() << "built without cuDNN";
  struct Case {
    int64_t N, C, H, W, O, K;
    Conv2dOptions o;
  };
  Conv2dOptions strided = Conv2dOptions::symmetric(2, 2, 1, 1, 1, 1, 1);
  Conv2dOptions tile;  // a tile's padding: only at the image's top edge
  tile.pad_top = 1, tile.pad_left = tile.pad_right = 1;
  Conv2dOptions dilated = Conv2dOptions::symmetric(1, 1, 2, 2, 2, 2, 1);
  Conv2dOptions grouped = Conv2dOptions::symmetric(1, 1, 1, 1, 1, 1, 4);
  const std::vector<Case> cases{{2, 8, 17, 15, 16, 3, strided},
                                {1, 8, 12, 12, 8, 3, tile},
                                {2, 4, 11, 13, 8, 3, dilated},
                                {2, 8, 9, 9, 16, 3, grouped},
                                {3, 16, 7, 7, 8, 1, Conv2dOptions{}}};
  for (const Case& k : cases) {
    const Conv2dOptions& o = k.o;
    const int64_t OH =
        conv_output_size(k.H, k.K, o.stride_h, o.pad_top, o.pad_bottom, o.dilation_h);
    const int64_t OW =
        conv_output_size(k.W, k.K, o.stride_w, o.pad_left, o.pad_right, o.dilation_w);
    Tensor x = randn({k.N, k.C, k.H, k.W}, rng_), w = randn({k.O, k.C / o.groups, k.K, k.K}, rng_),
           bias = randn({k.O}, rng_), dy = randn({k.N, k.O, OH, OW}, rng_);
    Tensor rx = rounded(x, dt()), rw = rounded(w, dt()), rdy = rounded(dy, dt());
    Tensor gx = dev(x, dt()), gw = dev(w, dt()), gdy = dev(dy, dt());
    Tensor ry = Tensor::empty({k.N, k.O, OH, OW}), gy = Tensor::empty(ry.shape(), dt(), kGpu);
    kernels::conv2d_forward(rx, rw, bias, o, ry);
    kernels::conv2d_forward(gx, gw, dev(bias, wide()), o, gy);
    expect_close("conv2d_forward", dt(), gy, ry);
    Tensor rdx = rounded(x, dt()), gdx = dev(x, dt());  // accumulates onto x
    kernels::conv2d_backward_input(rdy, rw, o, rdx, true);
    kernels::conv2d_backward_input(gdy, gw, o, gdx, true);
    expect_close("conv2d_backward_input", dt(), gdx, rdx);
    Tensor rdw = Tensor::empty(w.shape()), gdw = Tensor::empty(w.shape(), dt(), kGpu);
    Tensor rdb = bias.clone(), gdb = dev(bias, wide());
    kernels::conv2d_backward_weight(rdy, rx, o, rdw, rdb, false);
    kernels::conv2d_backward_weight(gdy, gx, o, gdw, gdb, false);
    expect_close("conv2d_backward_weight", dt(), gdw, rdw);
    expect_close("conv2d_backward_weight dbias", dt(), gdb, rdb);
  }
}

TEST_P(CudaOps, BatchNorm) {
  const int64_t N = 6, C = 5, H = 9, W = 7;
  Tensor x = randn({N, C, H, W}, rng_, 2.0), w = randn({C}, rng_), b = randn({C}, rng_),
         dy = randn({N, C, H, W}, rng_), prev = randn({N, C, H, W}, rng_);
  Tensor rm0 = randn({C}, rng_, 0.1), rv0 = Tensor::empty({C});
  for (float& v : rv0.span<float>()) v = 1.5f;
  Tensor rx = rounded(x, dt()), rdy = rounded(dy, dt()), gx = dev(x, dt()), gdy = dev(dy, dt());
  Tensor ry = Tensor::empty(x.shape()), gy = Tensor::empty(x.shape(), dt(), kGpu);
  Tensor rmean = Tensor::empty({C}), rrstd = Tensor::empty({C});
  Tensor gmean = dev(rmean, wide()), grstd = dev(rrstd, wide());
  Tensor rrm = rm0.clone(), rrv = rv0.clone(), grm = dev(rm0, wide()), grv = dev(rv0, wide());
  kernels::batchnorm_forward_train(rx, w, b, 1e-5, 0.1, ry, rmean, rrstd, rrm, rrv);
  kernels::batchnorm_forward_train(gx, dev(w, wide()), dev(b, wide()), 1e-5, 0.1, gy, gmean, grstd,
                                   grm, grv);
  expect_close("batchnorm_forward_train", dt(), gy, ry);
  expect_close("batchnorm_forward_train rstd", dt(), grstd, rrstd);
  expect_close("batchnorm_forward_train running_var", dt(), grv, rrv);
  expect_close("batchnorm_forward_train running_mean", dt(), grm, rrm);
  kernels::batchnorm_forward_eval(rx, w, b, rrm, rrv, 1e-5, ry);
  kernels::batchnorm_forward_eval(gx, dev(w, wide()), dev(b, wide()), grm, grv, 1e-5, gy);
  expect_close("batchnorm_forward_eval", dt(), gy, ry);
  Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
  kernels::batchnorm_backward_input(rdy, rx, w, rmean, rrstd, rdx, true);
  kernels::batchnorm_backward_input(gdy, gx, dev(w, wide()), gmean, grstd, gdx, true);
  expect_close("batchnorm_backward_input", dt(), gdx, rdx);
  Tensor rdw = w.clone(), rdb = b.clone(), gdw = dev(w, wide()), gdb = dev(b, wide());
  kernels::batchnorm_backward_weight(rdy, rx, rmean, rrstd, rdw, rdb, true);
  kernels::batchnorm_backward_weight(gdy, gx, gmean, grstd, gdw, gdb, true);
  expect_close("batchnorm_backward_weight", dt(), gdw, rdw);
  expect_close("batchnorm_backward_weight dbias", dt(), gdb, rdb);
  // From given sums (a spatial tile's): twice this batch's, as if a second tile matched it.
  Tensor rsy = Tensor::empty({C}), rsyx = Tensor::empty({C});
  kernels::batchnorm_backward_weight(rdy, rx, rmean, rrstd, rsyx, rsy, false);
  kernels::scale_inplace(rsy, 2.0);
  kernels::scale_inplace(rsyx, 2.0);
  const double count = 2.0 * N * H * W;
  Tensor rds = Tensor::empty(x.shape()), gds = Tensor::empty(x.shape(), dt(), kGpu);
  kernels::batchnorm_backward_input_sums(rdy, rx, w, rmean, rrstd, rsy, rsyx, count, rds, false);
  kernels::batchnorm_backward_input_sums(gdy, gx, dev(w, wide()), gmean, grstd, dev(rsy, wide()),
                                         dev(rsyx, wide()), count, gds, false);
  expect_close("batchnorm_backward_input_sums", dt(), gds, rds);
}

// Overlapping windows (ResNet's 3x3 stride-2 stem pool), padding counted or not.
TEST_P(CudaOps, Pooling) {
  const int64_t N = 2, C = 3, H = 13, W = 10;
  Pool2dOptions o;
  o.kernel_h = o.kernel_w = 3;
  o.stride_h = o.stride_w = 2;
  o.pad_h = o.pad_w = 1;
  const int64_t OH = conv_output_size(H, 3, 2, 1, 1, 1), OW = conv_output_size(W, 3, 2, 1, 1, 1);
  Tensor x = randn({N, C, H, W}, rng_), dy = randn({N, C, OH, OW}, rng_),
         prev = randn({N, C, H, W}, rng_);
  Tensor rx = rounded(x, dt()), rdy = rounded(dy, dt()), gx = dev(x, dt()), gdy = dev(dy, dt());
  Tensor ry = Tensor::empty({N, C, OH, OW}), gy = Tensor::empty(ry.shape(), dt(), kGpu);
  Tensor ra = Tensor::empty(ry.shape(), DType::i32),
         ga = Tensor::empty(ry.shape(), DType::i32, kGpu);
  kernels::maxpool2d_forward(rx, o, ry, ra);
  kernels::maxpool2d_forward(gx, o, gy, ga);
  expect_close("maxpool2d_forward", dt(), gy, ry);
  memory::cuda::synchronize(0);
  EXPECT_EQ(ga.to(Device::cpu()).to_vector<int32_t>(), ra.to_vector<int32_t>());
  Tensor rdx = rounded(prev, dt()), gdx = dev(prev, dt());
  kernels::maxpool2d_backward(rdy, ra, rdx, true);
  kernels::maxpool2d_backward(gdy, ga, gdx, true);
  expect_close("maxpool2d_backward", dt(), gdx, rdx);
  for (bool include_pad : {true, false}) {
    o.count_include_pad = include_pad;
    const std::string tag = include_pad ? "" : " exclude pad";
    kernels::avgpool2d_forward(rx, o, ry);
    kernels::avgpool2d_forward(gx, o, gy);
    expect_close("avgpool2d_forward" + tag, dt(), gy, ry);
    Tensor rd = Tensor::empty(x.shape()), gd = Tensor::empty(x.shape(), dt(), kGpu);
    kernels::avgpool2d_backward(rdy, o, rd, false);
    kernels::avgpool2d_backward(gdy, o, gd, false);
    expect_close("avgpool2d_backward" + tag, dt(), gd, rd);
  }
  Tensor rg = Tensor::empty({N, C}), gg = Tensor::empty({N, C}, dt(), kGpu);
  kernels::global_avgpool_forward(rx, rg);
  kernels::global_avgpool_forward(gx, gg);
  expect_close("global_avgpool_forward", dt(), gg, rg);
  Tensor rgd = rounded(prev, dt()), ggd = dev(prev, dt());
  kernels::global_avgpool_backward(rounded(rg, dt()), rgd, true);
  kernels::global_avgpool_backward(dev(rg, dt()), ggd, true);
  expect_close("global_avgpool_backward", dt(), ggd, rgd);
}

TEST_P(CudaOps, Embedding) {
  const int64_t N = 50, rows = 20, C = 24, offset = 10;
  std::vector<int64_t> ids(N);
  std::uniform_int_distribution<int64_t> pick(0, 35);
  for (auto& i : ids) i = pick(rng_);  // some below, some above this slice's rows
  Tensor tid = Tensor::from_vector(ids, {N}), gid = tid.to(kGpu);
  Tensor table = randn({rows, C}, rng_), prev = randn({N, C}, rng_), dout = randn({N, C}, rng_);
  Tensor rt = rounded(table, dt());
  for (bool acc : {false, true}) {
    Tensor ro = rounded(prev, dt()), go = dev(prev, dt());
    kernels::embedding_forward(tid, rt, offset, ro, acc);
    kernels::embedding_forward(gid, dev(table, dt()), offset, go, acc);
    expect_close(acc ? "embedding_forward acc" : "embedding_forward", dt(), go, ro);
  }
  // An f32 master table looked up into 16-bit activations.
  Tensor go16 = Tensor::empty({N, C}, dt(), kGpu), ro16 = Tensor::empty({N, C});
  kernels::embedding_forward(tid, table, offset, ro16, false);
  kernels::embedding_forward(gid, dev(table, wide()), offset, go16, false);
  expect_close("embedding_forward f32 table", dt(), go16, ro16);
  Tensor rdt = table.clone(), gdt = dev(table, wide());
  kernels::embedding_backward(tid, rounded(dout, dt()), offset, rdt);
  kernels::embedding_backward(gid, dev(dout, dt()), offset, gdt);
  expect_close("embedding_backward", dt(), gdt, rdt);
  // padding_idx 15 (a global id inside this slice's rows [10, 30)): those positions add
  // nothing, as on the CPU.
  Tensor rpad = table.clone(), gpad = dev(table, wide());
  kernels::embedding_backward(tid, rounded(dout, dt()), offset, rpad, 15);
  kernels::embedding_backward(gid, dev(dout, dt()), offset, gpad, 15);
  expect_close("embedding_backward padding_idx", dt(), gpad, rpad);
}

// Text repeats a few ids hundreds of times per batch: the backward sorts the positions by
// row and sums them in pieces (kPiece 32), with no atomics. Rows run over many pieces, more
// positions than one grid covers (65536 blocks), ids outside the slice, a width that is
// not a multiple of the block; the same bits twice.
TEST_P(CudaOps, EmbeddingBackwardOfRepeatedIds) {
  const int64_t N = 70001, rows = 300, C = 72, offset = 40;
  std::vector<int32_t> ids(N);
  std::uniform_int_distribution<int32_t> pick(0, 399);
  std::bernoulli_distribution common(0.7);
  for (auto& i : ids) i = common(rng_) ? 45 : pick(rng_);
  ids[0] = ids[N - 1] = 339;  // the slice's last row, first and last
  Tensor tid = Tensor::from_vector(ids, {N}), gid = tid.to(kGpu);
  Tensor table = randn({rows, C}, rng_), dout = randn({N, C}, rng_);
  Tensor rdt = table.clone();
  kernels::embedding_backward(tid, rounded(dout, dt()), offset, rdt);
  for (DType tdt : {wide(), dt()}) {
    Tensor once = dev(table, tdt), twice = dev(table, tdt);
    kernels::embedding_backward(gid, dev(dout, dt()), offset, once);
    kernels::embedding_backward(gid, dev(dout, dt()), offset, twice);
    expect_close(
        tdt == wide() ? "embedding_backward repeated, f32 table" : "embedding_backward repeated",
        tdt, once, rdt);
    EXPECT_EQ(cuda_ops_host(once).to_vector<float>(), cuda_ops_host(twice).to_vector<float>());
  }
}

TEST_P(CudaOps, CrossEntropyThreeSteps) {
  const int64_t N = 19, V = 50, offset = 10;
  Tensor logits = randn({N, V}, rng_, 3.0);
  std::vector<int32_t> tg(N);
  std::uniform_int_distribution<int32_t> pick(0, 79);
  for (auto& t : tg) t = pick(rng_);
  tg[3] = -100;  // ignored
  Tensor rt = Tensor::from_vector(tg, {N}), gt = rt.to(kGpu);
  Tensor rl = rounded(logits, dt()), gl = dev(logits, dt());
  auto stat = [&](bool gpu) {
    return gpu ? Tensor::empty({N}, DType::f32, kGpu) : Tensor::empty({N});
  };
  Tensor rm = stat(false), rs = stat(false), rtl = stat(false), rloss = stat(false);
  Tensor gm = stat(true), gs = stat(true), gtl = stat(true), gloss = stat(true);
  kernels::ce_row_max(rl, rm);
  kernels::ce_row_max(gl, gm);
  expect_close("ce_row_max", dt(), gm, rm);
  kernels::ce_sum_exp(rl, rt, offset, rm, rs, rtl);
  kernels::ce_sum_exp(gl, gt, offset, gm, gs, gtl);
  expect_close("ce_sum_exp", dt(), gs, rs);
  expect_close("ce_sum_exp target_logit", dt(), gtl, rtl);
  Tensor rd = rl;  // in place over the logits, as the caller may ask
  Tensor gd = gl;
  kernels::ce_finish(rl, rt, offset, rm, rs, rtl, 0.25, rloss, rd);
  kernels::ce_finish(gl, gt, offset, gm, gs, gtl, 0.25, gloss, gd);
  expect_close("ce_finish losses", dt(), gloss, rloss);
  expect_close("ce_finish dlogits", dt(), gd, rd);
}

// The one-kernel loss (two reads of the logits) against the CPU's: rows of a width that
// takes 16-byte vector loads and of one that does not, a misaligned start (scalar path),
// GPT-2's padded vocabulary, an ignored row, in place, apart and losses only; then the
// loss's f64 sum against the CPU's and the same bits twice.
TEST_P(CudaOps, CrossEntropyOneKernel) {
  struct Case {
    int64_t N, V;
    bool misaligned;
  };
  for (const Case c :
       {Case{19, 50, false}, Case{19, 64, false}, Case{7, 64, true}, Case{4, 50304, false}}) {
    const std::string tag =
        "cross_entropy V=" + std::to_string(c.V) + (c.misaligned ? " misaligned" : "");
    Tensor logits = randn({c.N, c.V}, rng_, 3.0);
    std::vector<int64_t> tg(size_t(c.N));
    std::uniform_int_distribution<int64_t> pick(0, c.V - 1);
    for (auto& t : tg) t = pick(rng_);
    tg[1] = -100;  // ignored
    Tensor rt = Tensor::from_vector(tg, {c.N}), gt = rt.to(kGpu);
    Tensor rl = rounded(logits, dt());
    auto on_gpu = [&] {  // a fresh device copy, 2 bytes past a 16-byte boundary if asked
      if (!c.misaligned) return dev(logits, dt());
      Tensor flat = Tensor::empty({c.N * c.V + 1}, dt(), kGpu);
      Tensor view = flat.narrow(0, 1, c.N * c.V).view({c.N, c.V});
      view.copy_from(dev(logits, dt()));
      return view;
    };
    Tensor rloss = Tensor::empty({c.N}), rd = Tensor::empty({c.N, c.V});
    kernels::cross_entropy_forward(rl, rt, 0.25, rloss, rd);
    // Apart from the logits.
    Tensor gl = on_gpu(), gloss = Tensor::empty({c.N}, DType::f32, kGpu);
    Tensor gd = Tensor::empty({c.N, c.V}, dt(), kGpu);
    kernels::cross_entropy_forward(gl, gt, 0.25, gloss, gd);
    expect_close(tag + " losses", dt(), gloss, rloss);
    expect_close(tag + " dlogits", dt(), gd, rd);
    // In place, as the op asks when it may overwrite its input.
    Tensor gi = on_gpu(), gloss2 = Tensor::empty({c.N}, DType::f32, kGpu);
    kernels::cross_entropy_forward(gi, gt, 0.25, gloss2, gi);
    expect_close(tag + " in place", dt(), gi, rd);
    expect_close(tag + " in place losses", dt(), gloss2, rloss);
    // Losses only (evaluation).
    Tensor none, gloss3 = Tensor::empty({c.N}, DType::f32, kGpu);
    kernels::cross_entropy_forward(on_gpu(), gt, 0.25, gloss3, none);
    expect_close(tag + " losses only", dt(), gloss3, rloss);
  }
  Tensor losses = randn({5000}, rng_);
  Tensor want = Tensor::empty({}, DType::f64), a = Tensor::empty({}, DType::f64, kGpu),
         b = Tensor::empty({}, DType::f64, kGpu);
  kernels::loss_sum(rounded(losses, dt()), 4096.0, want);
  kernels::loss_sum(dev(losses, dt()), 4096.0, a);
  kernels::loss_sum(dev(losses, dt()), 4096.0, b);
  memory::cuda::synchronize(0);
  const double w = want.data<double>()[0], ga = a.to(Device::cpu()).data<double>()[0],
               gb = b.to(Device::cpu()).data<double>()[0];
  EXPECT_LT(std::fabs(ga - w), 1e-12 * std::max(1.0, std::fabs(w)));
  EXPECT_EQ(ga, gb);  // a fixed order: the same bits every time
  // Logits far from zero: log S + (M - target), as on the CPU (log 8, not 2.07910); a
  // target past the vocabulary is a NaN loss (the CPU refuses it).
  const Tensor far = dev(Tensor::full({2, 8}, -1e4), dt());
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 8}, {2}).to(kGpu);
  Tensor fl = Tensor::empty({2}, DType::f32, kGpu), none;
  kernels::cross_entropy_forward(far, ids, 1.0, fl, none);
  const Tensor fv = cuda_ops_host(fl);
  if (dt() == DType::f32) {
    EXPECT_NEAR(fv.data<float>()[0], std::log(8.0), 1e-6);
  }
  EXPECT_TRUE(std::isnan(fv.data<float>()[1]));
}

TEST_P(CudaOps, RandomNormalMatchesTheCpu) {
  Block where{{64, 50}, {8, 10}};
  Tensor r = Tensor::empty({16, 30}), g = Tensor::empty({16, 30}, dt(), kGpu);
  kernels::random_normal(r, 0.5, 0.02, 42, kernels::stream_of("h.0.attn.c_attn.weight"), where);
  kernels::random_normal(g, 0.5, 0.02, 42, kernels::stream_of("h.0.attn.c_attn.weight"), where);
  expect_close("random_normal", dt(), g, rounded(r, dt()));
}

TEST_P(CudaOps, SumSquaresAndOptimizers) {
  Tensor t = randn({10001}, rng_);
  const double want = kernels::sum_squares(rounded(t, dt()));
  const double got = kernels::sum_squares(dev(t, dt()));
  const std::string key =
      std::string("sum_squares (") + std::string(memory::dtype_name(dt())) + ")";
  error_table()[key] = std::fabs(got - want) / want;
  EXPECT_LT(std::fabs(got - want) / want, 1e-6);
  // Many at once (one wait): each the same bits as alone, an empty one 0, a view at an offset.
  Tensor big = dev(randn({300, 70}, rng_), dt());
  const std::vector<Tensor> many{dev(t, dt()), Tensor::empty({0}, dt(), kGpu), big,
                                 big.view({21000}).narrow(0, 4000, 9999)};
  const std::vector<double> each = kernels::sum_squares_each(many);
  ASSERT_EQ(each.size(), many.size());
  EXPECT_EQ(each[0], got);
  EXPECT_EQ(each[1], 0.0);
  EXPECT_EQ(each[2], kernels::sum_squares(big));
  EXPECT_EQ(each[3], kernels::sum_squares(many[3]));

  // f32 master weights and moments, gradients in the compute type.
  Tensor p = randn({4097}, rng_), grad = randn({4097}, rng_), m = randn({4097}, rng_, 0.1);
  Tensor v = randn({4097}, rng_, 0.1);
  for (float& x : v.span<float>()) x = x * x;
  Tensor rp = p.clone(), rm = m.clone(), rv = v.clone(), rg = rounded(grad, dt());
  Tensor gp = dev(p, wide()), gm = dev(m, wide()), gv = dev(v, wide()), gg = dev(grad, dt());
  AdamW cfg{1e-2, 0.9, 0.95, 1e-8, 0.1};
  for (int64_t step = 1; step <= 3; ++step) {
    kernels::adamw_step(rp, rg, rm, rv, cfg, step, 0.5);
    kernels::adamw_step(gp, gg, gm, gv, cfg, step, 0.5);
  }
  expect_close("adamw_step", dt(), gp, rp);
  Tensor sp = p.clone(), sb = Tensor::zeros({4097}), gsp = dev(p, wide()),
         gsb = Tensor::zeros({4097}, DType::f32, kGpu);
  Sgd sgd{0.1, 0.9, 0.01, true};
  for (int i = 0; i < 3; ++i) {
    kernels::sgd_step(sp, rg, sb, sgd, 2.0);
    kernels::sgd_step(gsp, gg, gsb, sgd, 2.0);
  }
  expect_close("sgd_step", dt(), gsp, sp);
}

// The one-launch AdamW over many tensors against each tensor's own adamw_step on the GPU,
// bit for bit: 300 tensors (two launches' worth), sizes from 0 to several chunks, an
// f32-gradient tensor among the 16-bit ones (a launch of its own), a shard's view at an
// offset, weight decay on some.
TEST_P(CudaOps, AdamWOverManyTensorsIsEachOnesStep) {
  std::uniform_int_distribution<int64_t> size(0, 3000);
  struct Set {
    std::vector<Tensor> p, g, m, v;
  };
  Set one, many;
  std::vector<double> decay;
  Tensor big = randn({40000}, rng_);
  for (int i = 0; i < 300; ++i) {
    const int64_t n = i == 7 ? 0 : i == 11 ? 20000 : size(rng_);
    const DType gt = i == 150 ? DType::f32 : dt();
    Tensor p = randn({n}, rng_), g = randn({n}, rng_), m = randn({n}, rng_, 0.1);
    Tensor v = randn({n}, rng_, 0.1);
    for (float& x : v.span<float>()) x = x * x;
    for (Set* s : {&one, &many}) {
      // Tensor 20 a shard: a view at an offset into a bigger device buffer.
      s->p.push_back(i == 20 ? dev(big, wide()).narrow(0, 1001, n) : dev(p, wide()));
      s->g.push_back(dev(g, gt));
      s->m.push_back(dev(m, wide()));
      s->v.push_back(dev(v, wide()));
    }
    decay.push_back(i % 3 == 0 ? 0.0 : 0.1);
  }
  AdamW cfg{1e-2, 0.9, 0.95, 1e-8, 0.1};
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<kernels::AdamWTensors> ts;
    for (size_t i = 0; i < decay.size(); ++i) {
      AdamW c = cfg;
      c.weight_decay = decay[i];
      kernels::adamw_step(one.p[i], one.g[i], one.m[i], one.v[i], c, step, 0.5);
      ts.push_back({many.p[i], many.g[i], many.m[i], many.v[i], decay[i]});
    }
    kernels::adamw_step_each(ts, cfg, step, 0.5);
  }
  for (size_t i = 0; i < decay.size(); ++i) {
    EXPECT_EQ(cuda_ops_host(many.p[i]).to_vector<float>(),
              cuda_ops_host(one.p[i]).to_vector<float>())
        << "tensor " << i;
    EXPECT_EQ(cuda_ops_host(many.v[i]).to_vector<float>(),
              cuda_ops_host(one.v[i]).to_vector<float>())
        << "tensor " << i;
  }
}

// The scale derived on the device from the squared norm (GradScale) gives the bits of the
// number the host would pass, and a norm that is not finite leaves every tensor as it was;
// the grouped sum of squares is the CPU's, bit for bit.
TEST_P(CudaOps, AdamWScaleFromTheNormOnTheDevice) {
  std::vector<Tensor> host;
  for (int64_t n : {3000, 17, 20000}) host.push_back(randn({n}, rng_));
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : host) on_gpu.push_back(dev(t, dt()));
  const Tensor norm2 = kernels::sum_squares_grouped(on_gpu, {1, 0, 1}, 2);
  EXPECT_TRUE(norm2.device().is_cuda());
  memory::cuda::synchronize(0);
  const double norm2_host = norm2.to(Device::cpu()).to_vector<double>()[0];
  // The GPU's own per-tensor sums, added as the groups say (group 0: tensor 1).
  const std::vector<double> e = kernels::sum_squares_each(on_gpu);
  EXPECT_EQ(norm2_host, e[1] + (e[0] + e[2]));
  std::vector<Tensor> rounded_host;
  for (const Tensor& t : on_gpu) rounded_host.push_back(cuda_ops_host(t));
  EXPECT_NEAR(norm2_host,
              kernels::sum_squares_grouped(rounded_host, {1, 0, 1}, 2).to_vector<double>()[0],
              1e-9 * norm2_host);

  AdamW cfg{1e-2, 0.9, 0.95, 1e-8, 0.1};
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [n2, clip, carried] :
       {std::tuple{norm2_host, 1.0, 0.0}, std::tuple{norm2_host, 0.0, 8.0},
        std::tuple{inf, 1.0, 0.0}}) {
    const kernels::ClipDecision d = kernels::clip_decision(n2, clip, carried);
    Tensor p = randn({20000}, rng_), g = randn({20000}, rng_), m = randn({20000}, rng_, 0.1);
    Tensor v = randn({20000}, rng_, 0.1);
    for (float& x : v.span<float>()) x = x * x;
    std::vector<kernels::AdamWTensors> derived = {
        {dev(p, wide()), dev(g, dt()), dev(m, wide()), dev(v, wide()), 0.1}};
    std::vector<kernels::AdamWTensors> given = {
        {dev(p, wide()), dev(g, dt()), dev(m, wide()), dev(v, wide()), 0.1}};
    const Tensor on_device = Tensor::from_vector(std::vector<double>{n2}, {1}).to(kGpu);
    kernels::adamw_step_each(derived, cfg, 2, kernels::GradScale(on_device, clip, carried));
    if (d.apply) kernels::adamw_step_each(given, cfg, 2, d.grad_scale);
    EXPECT_EQ(cuda_ops_host(derived[0].param).to_vector<float>(),
              cuda_ops_host(given[0].param).to_vector<float>())
        << n2 << " " << clip << " " << carried;
    EXPECT_EQ(cuda_ops_host(derived[0].v).to_vector<float>(),
              cuda_ops_host(given[0].v).to_vector<float>());
    if (!d.apply) {
      EXPECT_EQ(cuda_ops_host(derived[0].param).to_vector<float>(),
                cuda_ops_host(dev(p, wide())).to_vector<float>());
    }
  }
}

TEST_P(CudaOps, CastAndUnscale) {
  Tensor x = randn({1000}, rng_);
  Tensor g16 = Tensor::empty({1000}, dt(), kGpu);
  kernels::cast(dev(x, DType::f32), g16);
  expect_close("cast", dt(), g16, rounded(x, dt()));
  Tensor found = Tensor::zeros({1}, DType::f32, kGpu);
  Tensor g = dev(x, dt());
  kernels::unscale_check(g, 0.5, found);
  Tensor half = rounded(x, dt());
  kernels::scale_inplace(half, 0.5);
  expect_close("unscale_check", dt(), g, half);
  EXPECT_EQ(cuda_ops_host(found).to_vector<float>()[0], 0.f);
  Tensor bad = Tensor::from_vector(std::vector<float>{1.f, INFINITY, 2.f}, {3});
  Tensor gbad = dev(bad, dt());
  kernels::unscale_check(gbad, 1.0, found);
  EXPECT_EQ(cuda_ops_host(found).to_vector<float>()[0], 1.f);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& p) { return std::string(memory::dtype_name(p.param)); });
