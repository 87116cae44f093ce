// Elementwise ops (residual add, scaling, bias, GELU and bias + GELU, ReLU, SiLU and
// SwiGLU, dropout, casts, loss-scale unscaling): one grid-stride kernel per op, computing
// in f32 whatever the storage type, 8 elements per thread where the memory allows (map1,
// map2).
#include "kernels/cuda/colsum.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/random.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <class F>
__global__ void each(int64_t n, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void launch_each(int64_t n, const Launch& l, F f) {
  if (n == 0) return;
  each<<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(n, f);
  BATON_CUDA_CHECK_LAUNCH();
}

// out[i] = fn(x[i]), plus out's old value when accumulating (out may be x).
template <class X, class O, class Fn>
void map1(const X* x, O* out, int64_t n, bool accumulate, const Launch& l, Fn fn) {
  if (packable(n, {x, out})) {
    launch_each(n / kPack, l, [=] __device__(int64_t p) {
      const int64_t i = p * kPack;
      float vx[kPack], vo[kPack];
      load_pack(x + i, vx);
      if (accumulate) load_pack(out + i, vo);
#pragma unroll
      for (int k = 0; k < kPack; ++k) vo[k] = accumulate ? vo[k] + fn(vx[k]) : fn(vx[k]);
      store_pack(out + i, vo);
    });
  } else {
    launch_each(n, l, [=] __device__(int64_t i) {
      const float r = fn(to_f(x[i]));
      out[i] = from_f<O>(accumulate ? to_f(out[i]) + r : r);
    });
  }
}

// out[i] = fn(a[i], b[j]) with j = i, or i % b_cols for a bias over rows of b_cols, plus
// out's old value when accumulating. The types may differ (an f32 bias on bf16 rows).
template <class A, class B, class O, class Fn>
void map2(const A* a, const B* b, int64_t b_cols, O* out, int64_t n, bool accumulate,
          const Launch& l, Fn fn) {
  if (packable(n, {a, b, out}) && b_cols % kPack == 0) {
    launch_each(n / kPack, l, [=] __device__(int64_t p) {
      const int64_t i = p * kPack;
      float va[kPack], vb[kPack], vo[kPack];
      load_pack(a + i, va);
      load_pack(b + (b_cols > 0 ? i % b_cols : i), vb);
      if (accumulate) load_pack(out + i, vo);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float r = fn(va[k], vb[k]);
        vo[k] = accumulate ? vo[k] + r : r;
      }
      store_pack(out + i, vo);
    });
  } else {
    launch_each(n, l, [=] __device__(int64_t i) {
      const float r = fn(to_f(a[i]), to_f(b[b_cols > 0 ? i % b_cols : i]));
      out[i] = from_f<O>(accumulate ? to_f(out[i]) + r : r);
    });
  }
}

void same(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  require_cuda(op, an, a);
  require_cuda(op, bn, b);
  require(a.dtype() == b.dtype(), op, std::string(an) + " and " + bn + " must have one dtype");
  require(a.numel() == b.numel(), op,
          std::string(an) + " " + a.str() + " and " + bn + " " + b.str() + " differ in size");
  require(a.device() == b.device(), op, "tensors on different devices");
}

constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
}

// Where tanh has saturated at -1 the gradient is 0, as the CPU's (kernels/cpu/activation.cpp):
// the formula's 0 * inf (3 a v^2 overflows below about -5e19) had made NaN.
__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
  if (t == -1.f) return 0.f;
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v);
}

__device__ __forceinline__ float sigmoid(float v) {
  return 1.f / (1.f + expf(-v));
}
// d/dv of v sigmoid(v) = s (1 + v (1 - s)).
__device__ __forceinline__ float silu_grad(float v) {
  const float s = sigmoid(v);
  return s * (1.f + v * (1.f - s));
}

template <class T>
void dropout(const char* op, const Tensor& in, Tensor& out, double p, uint64_t seed,
             uint64_t stream, const Block& where, bool accumulate) {
  Launch l(out);
  const BlockMap map = block_map(in.shape(), where.global_shape, where.offsets, op);
  const T* x = static_cast<const T*>(in.raw_data());
  T* y = static_cast<T*>(out.raw_data());
  const int64_t n = in.numel();
  if (p >= 1) {
    if (!accumulate) launch_each(n, l, [=] __device__(int64_t i) { y[i] = from_f<T>(0.f); });
    return;
  }
  const uint32_t threshold = random::dropout_threshold(p);
  const float scale = float(1.0 / (1.0 - p));
  launch_each(n, l, [=] __device__(int64_t i) {
    const bool keep = p <= 0 || random::dropout_keep(
                                    random::random_bits(seed, stream, map.logical(i)), threshold);
    const float v = keep ? to_f(x[i]) * scale : 0.f;
    y[i] = from_f<T>(accumulate ? to_f(y[i]) + v : v);
  });
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  same("add", a, "a", b, "b");
  same("add", a, "a", out, "out");
  Launch l(out);
  BATON_CUDA_DISPATCH("add", a.dtype(), T, {
    map2(static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), 0,
         static_cast<T*>(out.raw_data()), a.numel(), false, l,
         [] __device__(float x, float y) { return x + y; });
  });
}

void add_inplace(Tensor& acc, const Tensor& x) {
  const char* op = "add_inplace";
  require_cuda(op, "acc", acc);
  require_cuda(op, "x", x);
  require(acc.numel() == x.numel(), op, "acc and x differ in size");
  Launch l(acc);
  BATON_CUDA_DISPATCH2(op, x.dtype(), acc.dtype(), T, S, {
    map1(static_cast<const T*>(x.raw_data()), static_cast<S*>(acc.raw_data()), x.numel(), true, l,
         [] __device__(float v) { return v; });
  });
}

void scale_inplace(Tensor& t, double s) {
  require_cuda("scale_inplace", "t", t);
  Launch l(t);
  const float f = float(s);
  BATON_CUDA_DISPATCH("scale_inplace", t.dtype(), T, {
    T* p = static_cast<T*>(t.raw_data());
    map1(p, p, t.numel(), false, l, [=] __device__(float v) { return v * f; });
  });
}

void bias_add_inplace(Tensor& y, const Tensor& bias) {
  const char* op = "bias_add_inplace";
  require_cuda(op, "y", y);
  require_cuda(op, "bias", bias);
  const int64_t cols = bias.numel();
  require(cols > 0 && y.numel() % cols == 0 && y.size(-1) == cols, op,
          "bias must match y's last dimension");
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, y.dtype(), bias.dtype(), T, S, {
    T* p = static_cast<T*>(y.raw_data());
    map2(p, static_cast<const S*>(bias.raw_data()), cols, p, y.numel(), false, l,
         [] __device__(float v, float b) { return v + b; });
  });
}

void bias_backward(const Tensor& dy, Tensor& dbias, bool accumulate) {
  const char* op = "bias_backward";
  require_cuda(op, "dy", dy);
  require_cuda(op, "dbias", dbias);
  const int64_t cols = dbias.numel();
  require(cols > 0 && dy.size(-1) == cols, op, "dbias must match dy's last dimension");
  const int64_t rows = dy.numel() / cols;
  Launch l(dbias);
  const int slices = colsum_slices(rows, cols);
  BATON_CUDA_DISPATCH2(op, dy.dtype(), dbias.dtype(), T, S, {
    const T* g = static_cast<const T*>(dy.raw_data());
    Tensor partial = colsum_run<1>(
        [=] __device__(int64_t r, int64_t c, float* v) { v[0] = to_f(g[r * cols + c]); }, rows,
        cols, slices, l);
    colsum_store<S>(partial, 0, slices, cols, dbias, accumulate, l);
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  same("gelu_forward", x, "x", y, "y");
  Launch l(y);
  BATON_CUDA_DISPATCH("gelu_forward", x.dtype(), T, {
    map1(static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), x.numel(), false, l,
         [] __device__(float v) { return gelu(v); });
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  same("gelu_backward", x, "x", dy, "dy");
  same("gelu_backward", x, "x", dx, "dx");
  Launch l(dx);
  BATON_CUDA_DISPATCH("gelu_backward", x.dtype(), T, {
    map2(static_cast<const T*>(x.raw_data()), static_cast<const T*>(dy.raw_data()), 0,
         static_cast<T*>(dx.raw_data()), x.numel(), accumulate, l,
         [] __device__(float v, float g) { return gelu_grad(v) * g; });
  });
}

void bias_gelu_forward(const Tensor& x, const Tensor& bias, Tensor& h, Tensor& y) {
  const char* op = "bias_gelu_forward";
  same(op, x, "x", h, "h");
  same(op, x, "x", y, "y");
  require_cuda(op, "bias", bias);
  const int64_t cols = bias.numel();
  require(cols > 0 && x.size(-1) == cols, op, "bias must match x's last dimension");
  Launch l(y);
  const int64_t n = x.numel();
  BATON_CUDA_DISPATCH2(op, x.dtype(), bias.dtype(), T, S, {
    const T* in = static_cast<const T*>(x.raw_data());
    const S* b = static_cast<const S*>(bias.raw_data());
    T* hv = static_cast<T*>(h.raw_data());  // may be x itself: read before written
    T* out = static_cast<T*>(y.raw_data());
    // h is stored in T, and y is GELU of the stored h (what bias_add then gelu give).
    if (packable(n, {in, b, hv, out}) && cols % kPack == 0) {
      launch_each(n / kPack, l, [=] __device__(int64_t p) {
        const int64_t i = p * kPack;
        float vx[kPack], vb[kPack], vy[kPack];
        load_pack(in + i, vx);
        load_pack(b + i % cols, vb);
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          vx[k] = to_f(from_f<T>(vx[k] + vb[k]));
          vy[k] = gelu(vx[k]);
        }
        store_pack(hv + i, vx);
        store_pack(out + i, vy);
      });
    } else {
      launch_each(n, l, [=] __device__(int64_t i) {
        const T hs = from_f<T>(to_f(in[i]) + to_f(b[i % cols]));
        hv[i] = hs;
        out[i] = from_f<T>(gelu(to_f(hs)));
      });
    }
  });
}

void silu_forward(const Tensor& x, Tensor& y) {
  same("silu_forward", x, "x", y, "y");
  Launch l(y);
  BATON_CUDA_DISPATCH("silu_forward", x.dtype(), T, {
    map1(static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), x.numel(), false, l,
         [] __device__(float v) { return v * sigmoid(v); });
  });
}

void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  same("silu_backward", x, "x", dy, "dy");
  same("silu_backward", x, "x", dx, "dx");
  Launch l(dx);
  BATON_CUDA_DISPATCH("silu_backward", x.dtype(), T, {
    map2(static_cast<const T*>(x.raw_data()), static_cast<const T*>(dy.raw_data()), 0,
         static_cast<T*>(dx.raw_data()), x.numel(), accumulate, l,
         [] __device__(float v, float g) { return silu_grad(v) * g; });
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const char* op = "swiglu_forward";
  same(op, gate, "gate", up, "up");
  same(op, gate, "gate", y, "y");
  Launch l(y);
  BATON_CUDA_DISPATCH(op, gate.dtype(), T, {
    map2(static_cast<const T*>(gate.raw_data()), static_cast<const T*>(up.raw_data()), 0,
         static_cast<T*>(y.raw_data()), gate.numel(), false, l,
         [] __device__(float v, float u) { return v * sigmoid(v) * u; });
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                     Tensor& dup, bool acc_gate, bool acc_up) {
  const char* op = "swiglu_backward";
  same(op, gate, "gate", up, "up");
  same(op, gate, "gate", dy, "dy");
  if (dgate.defined()) same(op, gate, "gate", dgate, "dgate");
  if (dup.defined()) same(op, gate, "gate", dup, "dup");
  if (!dgate.defined() && !dup.defined()) return;
  Launch l(dgate.defined() ? dgate : dup);
  BATON_CUDA_DISPATCH(op, gate.dtype(), T, {
    const T* g = static_cast<const T*>(gate.raw_data());
    const T* u = static_cast<const T*>(up.raw_data());
    const T* d = static_cast<const T*>(dy.raw_data());
    T* dg = dgate.defined() ? static_cast<T*>(dgate.raw_data()) : nullptr;
    T* du = dup.defined() ? static_cast<T*>(dup.raw_data()) : nullptr;
    launch_each(gate.numel(), l, [=] __device__(int64_t i) {
      const float v = to_f(g[i]), grad = to_f(d[i]);
      if (dg != nullptr) {
        const float w = silu_grad(v) * to_f(u[i]) * grad;
        dg[i] = from_f<T>(acc_gate ? to_f(dg[i]) + w : w);
      }
      if (du != nullptr) {
        const float w = v * sigmoid(v) * grad;
        du[i] = from_f<T>(acc_up ? to_f(du[i]) + w : w);
      }
    });
  });
}

void relu_forward(const Tensor& x, Tensor& y) {
  same("relu_forward", x, "x", y, "y");
  Launch l(y);
  BATON_CUDA_DISPATCH("relu_forward", x.dtype(), T, {
    map1(static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), x.numel(), false, l,
         [] __device__(float v) { return v < 0.f ? 0.f : v; });  // a NaN passes, as on the CPU
  });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  same("relu_backward", x, "x", dy, "dy");
  same("relu_backward", x, "x", dx, "dx");
  Launch l(dx);
  BATON_CUDA_DISPATCH("relu_backward", x.dtype(), T, {
    map2(static_cast<const T*>(x.raw_data()), static_cast<const T*>(dy.raw_data()), 0,
         static_cast<T*>(dx.raw_data()), x.numel(), accumulate, l,
         [] __device__(float v, float g) { return v > 0.f ? g : 0.f; });
  });
}

void dropout_forward(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t stream,
                     const Block& where) {
  same("dropout_forward", x, "x", y, "y");
  BATON_CUDA_DISPATCH("dropout_forward", x.dtype(), T,
                      dropout<T>("dropout_forward", x, y, p, seed, stream, where, false));
}

void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t stream,
                      const Block& where, bool accumulate) {
  same("dropout_backward", dy, "dy", dx, "dx");
  BATON_CUDA_DISPATCH("dropout_backward", dy.dtype(), T,
                      dropout<T>("dropout_backward", dy, dx, p, seed, stream, where, accumulate));
}

void cast(const Tensor& src, Tensor& dst) {
  const char* op = "cast";
  require_cuda(op, "src", src);
  require_cuda(op, "dst", dst);
  require(src.numel() == dst.numel(), op, "src and dst differ in size");
  Launch l(dst);
  BATON_CUDA_DISPATCH(op, src.dtype(), T, {
    BATON_CUDA_DISPATCH(op, dst.dtype(), U, {
      map1(static_cast<const T*>(src.raw_data()), static_cast<U*>(dst.raw_data()), src.numel(),
           false, l, [] __device__(float v) { return v; });
    });
  });
}

void unscale_check(Tensor& t, double inv_scale, Tensor& found_inf) {
  const char* op = "unscale_check";
  require_cuda(op, "t", t);
  require_cuda(op, "found_inf", found_inf);
  require(found_inf.dtype() == DType::f32 && found_inf.numel() == 1, op,
          "found_inf must be f32 [1]");
  Launch l(t);
  const float f = float(inv_scale);
  float* flag = found_inf.data<float>();
  BATON_CUDA_DISPATCH(op, t.dtype(), T, {
    T* p = static_cast<T*>(t.raw_data());
    launch_each(t.numel(), l, [=] __device__(int64_t i) {
      const float v = to_f(p[i]) * f;
      if (!isfinite(v)) *flag = 1.f;  // a benign race: every writer writes 1
      p[i] = from_f<T>(v);
    });
  });
}

}  // namespace baton::kernels::cuda
