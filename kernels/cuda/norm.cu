// LayerNorm (alone and fused with the residual add before it), RMSNorm and row softmax:
// one warp per row (rows are a few thousand wide at most), statistics in f32, two passes
// over the row so that variance has no cancellation.
#include "kernels/cuda/colsum.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block of 256 threads

__device__ __forceinline__ int64_t warp_row() {
  return int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
}

// LayerNorm of x, or (b defined) of s = x + b stored in T and normalised as stored: the
// bits of add then LayerNorm. Each lane reads back only the columns it wrote, so no
// barrier is needed.
template <class T, class W, class S>
__global__ void ln_forward(const T* x, const T* b, T* s, const W* w, const W* bias, float eps, T* y,
                           S* mean, S* rstd, int64_t rows, int64_t cols) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  float sum = 0;
  if (b != nullptr) {
    const T* br = b + r * cols;
    T* sr = s + r * cols;
    for (int64_t c = lane; c < cols; c += 32) {
      const T v = from_f<T>(to_f(xr[c]) + to_f(br[c]));
      sr[c] = v;
      sum += to_f(v);
    }
    xr = sr;
  } else {
    for (int64_t c = lane; c < cols; c += 32) sum += to_f(xr[c]);
  }
  const float mu = warp_sum(sum) / float(cols);
  float var = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = to_f(xr[c]) - mu;
    var += d * d;
  }
  const float total = warp_sum(var);  // every lane's: the branch below is the warp's
  float rs = rsqrtf(total / float(cols) + eps);
  if (!isfinite(total) && isfinite(mu)) {
    // As the CPU: a finite row whose squared deviations overflow f32 (beyond about 1.8e19)
    // has its variance taken again in double (rstd 0 had left the bias alone).
    double v2 = 0;
    for (int64_t c = lane; c < cols; c += 32) {
      const double d = double(to_f(xr[c])) - double(mu);
      v2 += d * d;
    }
    for (int o = 16; o > 0; o >>= 1) v2 += __shfl_xor_sync(0xffffffffu, v2, o);
    rs = float(1.0 / sqrt(v2 / double(cols) + double(eps)));
  }
  T* yr = y + r * cols;
  for (int64_t c = lane; c < cols; c += 32)
    yr[c] = from_f<T>((to_f(xr[c]) - mu) * rs * to_f(w[c]) + to_f(bias[c]));
  if (lane == 0) {
    mean[r] = from_f<S>(mu);
    rstd[r] = from_f<S>(rs);
  }
}

// dx = (accumulate ? dx : 0) + (ds ? ds : 0) + LayerNorm's input gradient at x (the
// fused add's gradient when ds, s's other readers', is given). kPacked: each lane takes
// kPack columns at a time in 16-byte loads (cols a multiple of kPack, every pointer
// aligned): a 768-wide row is then 3 loads per lane and tensor where it was 24, and the
// kernel no longer waits on memory one 2-byte load at a time (GPT-2 124M's 25 of them
// took 1.25 ms of its step on the H200, about 1 TB/s).
template <class T, class W, class S, bool kPacked>
__global__ void ln_backward_input(const T* dy, const T* ds, const T* x, const W* w, const S* mean,
                                  const S* rstd, T* dx, int64_t rows, int64_t cols,
                                  bool accumulate) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  const T* dyr = dy + r * cols;
  const T* dsr = ds != nullptr ? ds + r * cols : nullptr;
  T* dxr = dx + r * cols;
  const float mu = to_f(mean[r]), rs = to_f(rstd[r]);
  float sg = 0, sgx = 0;
  if constexpr (kPacked) {
    for (int64_t c = int64_t(lane) * kPack; c < cols; c += 32 * kPack) {
      float vg[kPack], vw[kPack], vx[kPack];
      load_pack(dyr + c, vg);
      load_pack(w + c, vw);
      load_pack(xr + c, vx);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float g = vg[k] * vw[k];
        sg += g;
        sgx += g * (vx[k] - mu) * rs;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float g = to_f(dyr[c]) * to_f(w[c]);
      sg += g;
      sgx += g * (to_f(xr[c]) - mu) * rs;
    }
  }
  const float mg = warp_sum(sg) / float(cols), mgx = warp_sum(sgx) / float(cols);
  if constexpr (kPacked) {
    for (int64_t c = int64_t(lane) * kPack; c < cols; c += 32 * kPack) {
      float vg[kPack], vw[kPack], vx[kPack], vs[kPack], vd[kPack];
      load_pack(dyr + c, vg);
      load_pack(w + c, vw);
      load_pack(xr + c, vx);
      if (dsr != nullptr) load_pack(dsr + c, vs);
      if (accumulate) load_pack(dxr + c, vd);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        float v = rs * (vg[k] * vw[k] - mg - (vx[k] - mu) * rs * mgx);
        if (dsr != nullptr) v += vs[k];
        vd[k] = accumulate ? vd[k] + v : v;
      }
      store_pack(dxr + c, vd);
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      float v = rs * (to_f(dyr[c]) * to_f(w[c]) - mg - (to_f(xr[c]) - mu) * rs * mgx);
      if (dsr != nullptr) v += to_f(dsr[c]);
      dxr[c] = from_f<T>(accumulate ? to_f(dxr[c]) + v : v);
    }
  }
}

// Launches ln_backward_input, packed where the row width and the pointers allow.
template <class T, class W, class S>
void launch_ln_backward_input(const T* dy, const T* ds, const T* x, const W* w, const S* mean,
                              const S* rstd, T* dx, int64_t rows, int64_t cols, bool accumulate,
                              const Launch& l) {
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  if (packable(cols, {dy, ds, x, w, dx}))
    ln_backward_input<T, W, S, true><<<blocks, 32 * kWarps, 0, l.stream>>>(
        dy, ds, x, w, mean, rstd, dx, rows, cols, accumulate);
  else
    ln_backward_input<T, W, S, false><<<blocks, 32 * kWarps, 0, l.stream>>>(
        dy, ds, x, w, mean, rstd, dx, rows, cols, accumulate);
  BATON_CUDA_CHECK_LAUNCH();
}

// RMSNorm: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) (Hugging Face's order).
template <class T, class W, class S>
__global__ void rms_forward(const T* x, const W* w, float eps, T* y, S* rstd, int64_t rows,
                            int64_t cols) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  float ss = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = to_f(xr[c]);
    ss += v * v;
  }
  const float rs = rsqrtf(warp_sum(ss) / float(cols) + eps);
  T* yr = y + r * cols;
  for (int64_t c = lane; c < cols; c += 32) yr[c] = from_f<T>(to_f(w[c]) * (to_f(xr[c]) * rs));
  if (lane == 0) rstd[r] = from_f<S>(rs);
}

// dx = rstd (g - x rstd^2 mean(g x)), g = dy w.
template <class T, class W, class S>
__global__ void rms_backward_input(const T* dy, const T* x, const W* w, const S* rstd, T* dx,
                                   int64_t rows, int64_t cols, bool accumulate) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  const T* dyr = dy + r * cols;
  T* dxr = dx + r * cols;
  const float rs = to_f(rstd[r]);
  float sgx = 0;
  for (int64_t c = lane; c < cols; c += 32) sgx += to_f(dyr[c]) * to_f(w[c]) * to_f(xr[c]);
  const float k = rs * rs * warp_sum(sgx) / float(cols);
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = rs * (to_f(dyr[c]) * to_f(w[c]) - to_f(xr[c]) * k);
    dxr[c] = from_f<T>(accumulate ? to_f(dxr[c]) + v : v);
  }
}

template <class T>
__global__ void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  float m = -INFINITY;
  for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, to_f(xr[c]));
  m = warp_max(m);
  float s = 0;
  for (int64_t c = lane; c < cols; c += 32) s += __expf(to_f(xr[c]) - m);
  const float inv = 1.f / warp_sum(s);
  T* yr = y + r * cols;
  for (int64_t c = lane; c < cols; c += 32) yr[c] = from_f<T>(__expf(to_f(xr[c]) - m) * inv);
}

template <class T>
__global__ void softmax_back_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols,
                                  bool accumulate) {
  const int64_t r = warp_row();
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* yr = y + r * cols;
  const T* gr = dy + r * cols;
  T* dr = dx + r * cols;
  float s = 0;
  for (int64_t c = lane; c < cols; c += 32) s += to_f(yr[c]) * to_f(gr[c]);
  s = warp_sum(s);
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = to_f(yr[c]) * (to_f(gr[c]) - s);
    dr[c] = from_f<T>(accumulate ? to_f(dr[c]) + v : v);
  }
}

unsigned row_blocks(int64_t rows) {
  return unsigned((rows + kWarps - 1) / kWarps);
}

void check_rows(const char* op, const Tensor& x, int64_t cols, const Tensor& stat,
                const char* name) {
  require_cuda(op, name, stat);
  require(stat.numel() == x.numel() / cols, op, std::string(name) + " must have one value per row");
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require_cuda(op, "weight", weight);
  require_cuda(op, "bias", bias);
  require(x.dtype() == y.dtype() && x.numel() == y.numel(), op, "x and y must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  require(weight.numel() == cols && bias.numel() == cols && weight.dtype() == bias.dtype(), op,
          "weight and bias: [C] of one dtype");
  check_rows(op, x, cols, mean, "mean");
  check_rows(op, x, cols, rstd, "rstd");
  require(mean.dtype() == rstd.dtype(), op, "mean and rstd of one dtype");
  if (rows == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, x.dtype(), mean.dtype(), T, S, {
      ln_forward<T, W, S><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
          static_cast<const T*>(x.raw_data()), nullptr, nullptr,
          static_cast<const W*>(weight.raw_data()), static_cast<const W*>(bias.raw_data()),
          float(eps), static_cast<T*>(y.raw_data()), static_cast<S*>(mean.raw_data()),
          static_cast<S*>(rstd.raw_data()), rows, cols);
      BATON_CUDA_CHECK_LAUNCH();
    });
  });
}

void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "layernorm_backward_input";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require_cuda(op, "dx", dx);
  require_cuda(op, "weight", weight);
  require(x.dtype() == dy.dtype() && x.dtype() == dx.dtype() && x.numel() == dy.numel() &&
              x.numel() == dx.numel(),
          op, "x, dy, dx must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  require(weight.numel() == cols, op, "weight: [C]");
  check_rows(op, x, cols, mean, "mean");
  check_rows(op, x, cols, rstd, "rstd");
  if (rows == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, x.dtype(), mean.dtype(), T, S, {
      launch_ln_backward_input<T, W, S>(
          static_cast<const T*>(dy.raw_data()), nullptr, static_cast<const T*>(x.raw_data()),
          static_cast<const W*>(weight.raw_data()), static_cast<const S*>(mean.raw_data()),
          static_cast<const S*>(rstd.raw_data()), static_cast<T*>(dx.raw_data()), rows, cols,
          accumulate, l);
    });
  });
}

void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias,
                               bool accumulate) {
  const char* op = "layernorm_backward_weight";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require(x.dtype() == dy.dtype() && x.numel() == dy.numel(), op, "x and dy must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  check_rows(op, x, cols, mean, "mean");
  check_rows(op, x, cols, rstd, "rstd");
  const Tensor& any = dweight.defined() ? dweight : dbias;
  if (!any.defined() || cols == 0) return;
  if (dweight.defined()) require_cuda(op, "dweight", dweight);
  if (dbias.defined()) require_cuda(op, "dbias", dbias);
  require(!dweight.defined() || !dbias.defined() || dweight.dtype() == dbias.dtype(), op,
          "dweight and dbias of one dtype");
  Launch l(any);
  const int slices = colsum_slices(rows, cols);
  BATON_CUDA_DISPATCH2(op, x.dtype(), mean.dtype(), T, S, {
    const T* g = static_cast<const T*>(dy.raw_data());
    const T* xs = static_cast<const T*>(x.raw_data());
    const S* mu = static_cast<const S*>(mean.raw_data());
    const S* rs = static_cast<const S*>(rstd.raw_data());
    Tensor partial = colsum_run<2>(
        [=] __device__(int64_t r, int64_t c, float* v) {
          const float d = to_f(g[r * cols + c]);
          v[0] = d * (to_f(xs[r * cols + c]) - to_f(mu[r])) * to_f(rs[r]);
          v[1] = d;
        },
        rows, cols, slices, l);
    BATON_CUDA_SECOND(op, x.dtype(), any.dtype(), T, D, {
      if (dweight.defined()) colsum_store<D>(partial, 0, slices, cols, dweight, accumulate, l);
      if (dbias.defined()) colsum_store<D>(partial, 1, slices, cols, dbias, accumulate, l);
    });
  });
}

void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight,
                           const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                           Tensor& rstd) {
  const char* op = "add_layernorm_forward";
  for (auto [name, t] :
       {std::pair{"a", &a}, {"b", &b}, {"s", &s}, {"y", &y}, {"weight", &weight}, {"bias", &bias}})
    require_cuda(op, name, *t);
  require(a.dtype() == b.dtype() && a.dtype() == s.dtype() && a.dtype() == y.dtype() &&
              a.numel() == b.numel() && a.numel() == s.numel() && a.numel() == y.numel(),
          op, "a, b, s and y must match");
  const int64_t cols = a.size(-1), rows = cols == 0 ? 0 : a.numel() / cols;
  require(weight.numel() == cols && bias.numel() == cols && weight.dtype() == bias.dtype(), op,
          "weight and bias: [C] of one dtype");
  check_rows(op, a, cols, mean, "mean");
  check_rows(op, a, cols, rstd, "rstd");
  require(mean.dtype() == rstd.dtype(), op, "mean and rstd of one dtype");
  if (rows == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, a.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, a.dtype(), mean.dtype(), T, S, {
      ln_forward<T, W, S><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
          static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
          static_cast<T*>(s.raw_data()), static_cast<const W*>(weight.raw_data()),
          static_cast<const W*>(bias.raw_data()), float(eps), static_cast<T*>(y.raw_data()),
          static_cast<S*>(mean.raw_data()), static_cast<S*>(rstd.raw_data()), rows, cols);
      BATON_CUDA_CHECK_LAUNCH();
    });
  });
}

void add_layernorm_backward_input(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                  Tensor& dx, bool accumulate) {
  const char* op = "add_layernorm_backward_input";
  require_cuda(op, "dy", dy);
  require_cuda(op, "s", s);
  require_cuda(op, "dx", dx);
  require_cuda(op, "weight", weight);
  require(s.dtype() == dy.dtype() && s.dtype() == dx.dtype() && s.numel() == dy.numel() &&
              s.numel() == dx.numel(),
          op, "s, dy, dx must match");
  if (ds.defined()) {
    require_cuda(op, "ds", ds);
    require(ds.dtype() == s.dtype() && ds.numel() == s.numel(), op, "ds must match s");
  }
  const int64_t cols = s.size(-1), rows = cols == 0 ? 0 : s.numel() / cols;
  require(weight.numel() == cols, op, "weight: [C]");
  check_rows(op, s, cols, mean, "mean");
  check_rows(op, s, cols, rstd, "rstd");
  if (rows == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH2(op, s.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, s.dtype(), mean.dtype(), T, S, {
      launch_ln_backward_input<T, W, S>(
          static_cast<const T*>(dy.raw_data()),
          ds.defined() ? static_cast<const T*>(ds.raw_data()) : nullptr,
          static_cast<const T*>(s.raw_data()), static_cast<const W*>(weight.raw_data()),
          static_cast<const S*>(mean.raw_data()), static_cast<const S*>(rstd.raw_data()),
          static_cast<T*>(dx.raw_data()), rows, cols, accumulate, l);
    });
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require_cuda(op, "weight", weight);
  require(x.dtype() == y.dtype() && x.numel() == y.numel(), op, "x and y must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  require(weight.numel() == cols, op, "weight: [C]");
  check_rows(op, x, cols, rstd, "rstd");
  if (rows == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, x.dtype(), rstd.dtype(), T, S, {
      rms_forward<T, W, S><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
          static_cast<const T*>(x.raw_data()), static_cast<const W*>(weight.raw_data()), float(eps),
          static_cast<T*>(y.raw_data()), static_cast<S*>(rstd.raw_data()), rows, cols);
      BATON_CUDA_CHECK_LAUNCH();
    });
  });
}

void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "rmsnorm_backward_input";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require_cuda(op, "dx", dx);
  require_cuda(op, "weight", weight);
  require(x.dtype() == dy.dtype() && x.dtype() == dx.dtype() && x.numel() == dy.numel() &&
              x.numel() == dx.numel(),
          op, "x, dy, dx must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  require(weight.numel() == cols, op, "weight: [C]");
  check_rows(op, x, cols, rstd, "rstd");
  if (rows == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, W, {
    BATON_CUDA_SECOND(op, x.dtype(), rstd.dtype(), T, S, {
      rms_backward_input<T, W, S><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
          static_cast<const T*>(dy.raw_data()), static_cast<const T*>(x.raw_data()),
          static_cast<const W*>(weight.raw_data()), static_cast<const S*>(rstd.raw_data()),
          static_cast<T*>(dx.raw_data()), rows, cols, accumulate);
      BATON_CUDA_CHECK_LAUNCH();
    });
  });
}

void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dweight,
                             bool accumulate) {
  const char* op = "rmsnorm_backward_weight";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require_cuda(op, "dweight", dweight);
  require(x.dtype() == dy.dtype() && x.numel() == dy.numel(), op, "x and dy must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  require(dweight.numel() == cols, op, "dweight: [C]");
  check_rows(op, x, cols, rstd, "rstd");
  if (cols == 0) return;
  Launch l(dweight);
  const int slices = colsum_slices(rows, cols);
  BATON_CUDA_DISPATCH2(op, x.dtype(), rstd.dtype(), T, S, {
    const T* g = static_cast<const T*>(dy.raw_data());
    const T* xs = static_cast<const T*>(x.raw_data());
    const S* rs = static_cast<const S*>(rstd.raw_data());
    Tensor partial = colsum_run<1>(
        [=] __device__(int64_t r, int64_t c, float* v) {
          v[0] = to_f(g[r * cols + c]) * (to_f(xs[r * cols + c]) * to_f(rs[r]));
        },
        rows, cols, slices, l);
    BATON_CUDA_SECOND(op, x.dtype(), dweight.dtype(), T, D,
                      colsum_store<D>(partial, 0, slices, cols, dweight, accumulate, l));
  });
}

void softmax_forward(const Tensor& x, Tensor& y) {
  const char* op = "softmax_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require(x.dtype() == y.dtype() && x.numel() == y.numel(), op, "x and y must match");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH(op, x.dtype(), T, {
    softmax_rows<T><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), rows, cols);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool accumulate) {
  const char* op = "softmax_backward";
  require_cuda(op, "y", y);
  require_cuda(op, "dy", dy);
  require_cuda(op, "dx", dx);
  require(y.dtype() == dy.dtype() && y.dtype() == dx.dtype() && y.numel() == dy.numel() &&
              y.numel() == dx.numel(),
          op, "y, dy, dx must match");
  const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  if (rows == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH(op, y.dtype(), T, {
    softmax_back_rows<T><<<row_blocks(rows), 32 * kWarps, 0, l.stream>>>(
        static_cast<const T*>(y.raw_data()), static_cast<const T*>(dy.raw_data()),
        static_cast<T*>(dx.raw_data()), rows, cols, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace baton::kernels::cuda
