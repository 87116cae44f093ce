// Rotary position embeddings (rotate-half convention, as kernels/cpu/rotary.cpp): one
// thread per (row, head, pair). The angle is the CPU's float product of frequency and
// position, its cos and sin in double, so the tables match the CPU reference; the
// frequencies travel in the kernel's arguments (no table and no copy per call).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 256;  // head size up to 512

struct Freqs {
  float f[kMaxHalf];
};

struct RotaryGeometry {
  int64_t B, T, heads, D, dst_ld, dst_col, offset;
};

// forward: dst = R x; backward (transpose): dx (+)= R^T ddst.
template <class T, bool kBackward>
__global__ void rotate(const T* in, T* out, RotaryGeometry g, Freqs fr, bool accumulate) {
  const int64_t half = g.D / 2, n = g.B * g.T * g.heads * half;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % g.heads, row = k / (half * g.heads);
    const int64_t t = row % g.T;
    const double angle = double(fr.f[i] * float(t + g.offset));
    const float c = float(cos(angle)), s = float(sin(angle));
    const int64_t xcol = row * g.heads * g.D + h * g.D + i;
    const int64_t dcol = row * g.dst_ld + g.dst_col + h * g.D + i;
    if (!kBackward) {
      const float x1 = to_f(in[xcol]), x2 = to_f(in[xcol + half]);
      out[dcol] = from_f<T>(x1 * c - x2 * s);
      out[dcol + half] = from_f<T>(x2 * c + x1 * s);
    } else {
      const float g1 = to_f(in[dcol]), g2 = to_f(in[dcol + half]);
      float v1 = g1 * c + g2 * s, v2 = g2 * c - g1 * s;
      if (accumulate) {
        v1 += to_f(out[xcol]);
        v2 += to_f(out[xcol + half]);
      }
      out[xcol] = from_f<T>(v1);
      out[xcol + half] = from_f<T>(v2);
    }
  }
}

// x: [B, T, heads * D] (dx backward); wide: [B, T, C] (dst forward, ddst backward).
RotaryGeometry geometry(const char* op, const Tensor& x, const Tensor& wide, int64_t dst_col,
                        const RotaryOptions& opt, Freqs& fr) {
  require_cuda(op, "x", x);
  require_cuda(op, "fused", wide);
  require(x.dtype() == wide.dtype(), op, "x and the fused tensor must have one dtype");
  require(x.dim() == 3 && wide.dim() == 3 && opt.heads > 0 && x.size(2) % opt.heads == 0, op,
          "x [B, T, heads * D] beside a fused [B, T, C]");
  const RotaryGeometry g{x.size(0),    x.size(1), opt.heads,          x.size(2) / opt.heads,
                         wide.size(2), dst_col,   opt.position_offset};
  require(opt.inv_freq != nullptr && int64_t(opt.inv_freq->size()) == g.D / 2, op,
          "inv_freq must hold head_dim / 2 values");
  require(g.D / 2 <= kMaxHalf, op,
          "head size " + std::to_string(g.D) + " above the CUDA kernel's " +
              std::to_string(2 * kMaxHalf));
  for (int64_t i = 0; i < g.D / 2; ++i) fr.f[i] = float((*opt.inv_freq)[size_t(i)]);
  return g;
}

}  // namespace

void rotary_forward(const Tensor& x, const RotaryOptions& opt, Tensor& dst, int64_t dst_col) {
  const char* op = "rotary_forward";
  Freqs fr{};
  const RotaryGeometry g = geometry(op, x, dst, dst_col, opt, fr);
  const int64_t n = g.B * g.T * g.heads * (g.D / 2);
  if (n == 0) return;
  Launch l(dst);
  BATON_CUDA_DISPATCH(op, x.dtype(), T, {
    rotate<T, false><<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), static_cast<T*>(dst.raw_data()), g, fr, false);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void rotary_backward(const Tensor& ddst, int64_t dst_col, const RotaryOptions& opt, Tensor& dx,
                     bool accumulate) {
  const char* op = "rotary_backward";
  Freqs fr{};
  const RotaryGeometry g = geometry(op, dx, ddst, dst_col, opt, fr);
  const int64_t n = g.B * g.T * g.heads * (g.D / 2);
  if (n == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH(op, dx.dtype(), T, {
    rotate<T, true><<<grid_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<const T*>(ddst.raw_data()), static_cast<T*>(dx.raw_data()), g, fr, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace baton::kernels::cuda
