// Batch normalisation, pooling and the convolution's bias on CUDA (the convolutions
// themselves are cuDNN's: cudnn_conv.cu). Batch statistics: one block per channel, sums
// in double in a fixed order, so results are deterministic and close to the CPU's
// (which sums in double too). Pooling backward gathers per input element (average) or
// walks each plane's outputs in order on one thread (max, whose argmax may repeat), so
// nothing needs atomics.
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_cuda.h"

namespace baton::kernels::cuda {

namespace {

constexpr int kBlock = 256;

// Sum over a block of 256 threads, in double; every thread gets the result.
__device__ double block_sum_d(double v) {
  __shared__ double part[kBlock / 32];
  __shared__ double total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int i = 0; i < kBlock / 32; ++i) t += part[i];
    total = t;
  }
  __syncthreads();
  const double r = total;
  __syncthreads();  // part and total are reused by the next call
  return r;
}

struct BnShape {
  int64_t n, c, plane;
  __device__ int64_t at(int64_t k, int64_t ch) const {  // k-th element of channel ch
    return ((k / plane) * c + ch) * plane + k % plane;
  }
  __device__ int64_t count() const { return n * plane; }
};

BnShape bn_shape(const char* op, const Tensor& x) {
  require_cuda(op, "x", x);
  BnShape s{x.size(0), x.size(1), 1};
  for (int64_t i = 2; i < x.dim(); ++i) s.plane *= x.size(i);
  return s;
}

template <class S>
__device__ float get(const S* p, int64_t i) {
  return to_f(p[i]);
}

template <class T, class S>
__global__ void bn_train(const T* x, const S* w, const S* b, double eps, double momentum, T* y,
                         S* mean, S* rstd, S* rmean, S* rvar, BnShape s) {
  const int64_t ch = blockIdx.x, cnt = s.count();
  double sum = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) sum += double(to_f(x[s.at(k, ch)]));
  const double mu = block_sum_d(sum) / double(cnt);
  double sq = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) {
    const double d = double(to_f(x[s.at(k, ch)])) - mu;
    sq += d * d;
  }
  const double var = block_sum_d(sq) / double(cnt);
  const double r = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) {
    mean[ch] = from_f<S>(float(mu));
    rstd[ch] = from_f<S>(float(r));
    if (rmean != nullptr) {
      const double unbiased = cnt > 1 ? var * double(cnt) / double(cnt - 1) : var;
      rmean[ch] = from_f<S>(float((1 - momentum) * double(get(rmean, ch)) + momentum * mu));
      rvar[ch] = from_f<S>(float((1 - momentum) * double(get(rvar, ch)) + momentum * unbiased));
    }
  }
  const float scale = float(double(get(w, ch)) * r);
  const float shift = float(double(get(b, ch)) - mu * double(get(w, ch)) * r);
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) {
    const int64_t i = s.at(k, ch);
    y[i] = from_f<T>(to_f(x[i]) * scale + shift);
  }
}

template <class T, class S>
__global__ void bn_eval(const T* x, const S* w, const S* b, const S* rmean, const S* rvar,
                        double eps, T* y, BnShape s) {
  const int64_t n = s.n * s.c * s.plane;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s.plane) % s.c;
    const double r = 1.0 / sqrt(double(get(rvar, ch)) + eps);
    const float scale = float(double(get(w, ch)) * r);
    const float shift = float(double(get(b, ch)) - double(get(rmean, ch)) * double(get(w, ch)) * r);
    y[i] = from_f<T>(to_f(x[i]) * scale + shift);
  }
}

// Per channel: sum dy and sum dy * xhat; then dweight/dbias, or dx.
template <class T, class S>
__global__ void bn_backward(const T* dy, const T* x, const S* w, const S* mean, const S* rstd,
                            T* dx, S* dweight, S* dbias, BnShape s, bool accumulate) {
  const int64_t ch = blockIdx.x, cnt = s.count();
  const double mu = double(get(mean, ch)), r = double(get(rstd, ch));
  double sdy = 0, sdyx = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) {
    const int64_t i = s.at(k, ch);
    const double d = double(to_f(dy[i]));
    sdy += d;
    sdyx += d * (double(to_f(x[i])) - mu) * r;
  }
  sdy = block_sum_d(sdy);
  sdyx = block_sum_d(sdyx);
  if (dx == nullptr) {
    if (threadIdx.x == 0) {
      if (dweight != nullptr)
        dweight[ch] = from_f<S>(float(accumulate ? double(get(dweight, ch)) + sdyx : sdyx));
      if (dbias != nullptr)
        dbias[ch] = from_f<S>(float(accumulate ? double(get(dbias, ch)) + sdy : sdy));
    }
    return;
  }
  // dx = w rstd (dy - sum_dy / count - xhat sum_dy_xhat / count)
  const float k1 = float(double(get(w, ch)) * r), k0 = float(sdy / double(cnt));
  const float k2 = float(sdyx / double(cnt) * r), m = float(mu);
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) {
    const int64_t i = s.at(k, ch);
    const float v = k1 * (to_f(dy[i]) - k0 - (to_f(x[i]) - m) * k2);
    dx[i] = from_f<T>(accumulate ? to_f(dx[i]) + v : v);
  }
}

// The same input gradient from the whole batch's sums (a spatial tile's, or replicas'
// synchronised batch norm): elementwise.
template <class T, class S>
__global__ void bn_backward_sums(const T* dy, const T* x, const S* w, const S* mean, const S* rstd,
                                 const S* sum_dy, const S* sum_dy_xhat, double count, T* dx,
                                 BnShape s, bool accumulate) {
  const int64_t n = s.n * s.c * s.plane;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s.plane) % s.c;
    const double r = double(get(rstd, ch));
    const float k1 = float(double(get(w, ch)) * r), k0 = float(double(get(sum_dy, ch)) / count);
    const float k2 = float(double(get(sum_dy_xhat, ch)) / count * r), m = get(mean, ch);
    const float v = k1 * (to_f(dy[i]) - k0 - (to_f(x[i]) - m) * k2);
    dx[i] = from_f<T>(accumulate ? to_f(dx[i]) + v : v);
  }
}

template <class S>
S* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<S*>(t.raw_data()) : nullptr;
}

// ---- pooling ----
struct PoolShape {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
  __device__ int64_t window_count(int64_t i, int64_t j) const {
    if (count_include_pad) {
      const int64_t r0 = i * sh - ph, s0 = j * sw - pw;
      const int64_t r1 = min(r0 + kh, h + ph), s1 = min(s0 + kw, w + pw);
      return (r1 - r0) * (s1 - s0);
    }
    const int64_t r0 = max(i * sh - ph, int64_t(0)), s0 = max(j * sw - pw, int64_t(0));
    const int64_t r1 = min(i * sh - ph + kh, h), s1 = min(j * sw - pw + kw, w);
    return max(r1 - r0, int64_t(0)) * max(s1 - s0, int64_t(0));
  }
};

PoolShape pool_shape(const Tensor& x, const Tensor& y, const Pool2dOptions& o) {
  return PoolShape{x.size(0) * x.size(1),
                   x.size(2),
                   x.size(3),
                   y.size(2),
                   y.size(3),
                   o.kernel_h,
                   o.kernel_w,
                   o.stride_h,
                   o.stride_w,
                   o.pad_h,
                   o.pad_w,
                   o.count_include_pad};
}

template <class T>
__global__ void max_pool(const T* x, T* y, int32_t* argmax, PoolShape g) {
  const int64_t n = g.planes * g.oh * g.ow;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = k / (g.oh * g.ow), i = (k / g.ow) % g.oh, j = k % g.ow;
    const T* in = x + p * g.h * g.w;
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t a = 0; a < g.kh; ++a) {
      const int64_t r = i * g.sh - g.ph + a;
      if (r < 0 || r >= g.h) continue;
      for (int64_t b = 0; b < g.kw; ++b) {
        const int64_t s = j * g.sw - g.pw + b;
        if (s < 0 || s >= g.w) continue;
        const float v = to_f(in[r * g.w + s]);
        if (at < 0 || v > best || (v != v && best == best)) {  // NaN propagates, as the CPU's
          best = v;
          at = r * g.w + s;
        }
      }
    }
    y[k] = from_f<T>(best);
    argmax[k] = int32_t(at);
  }
}

// One thread per plane, its outputs in order: the CPU's order of additions.
template <class T>
__global__ void max_pool_back(const T* dy, const int32_t* argmax, T* dx, int64_t planes,
                              int64_t in_plane, int64_t out_plane, bool accumulate) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < planes;
       p += int64_t(gridDim.x) * blockDim.x) {
    T* out = dx + p * in_plane;
    if (!accumulate)
      for (int64_t k = 0; k < in_plane; ++k) out[k] = from_f<T>(0.f);
    const T* d = dy + p * out_plane;
    const int32_t* idx = argmax + p * out_plane;
    for (int64_t k = 0; k < out_plane; ++k)
      if (idx[k] >= 0) out[idx[k]] = from_f<T>(to_f(out[idx[k]]) + to_f(d[k]));
  }
}

template <class T>
__global__ void avg_pool(const T* x, T* y, PoolShape g) {
  const int64_t n = g.planes * g.oh * g.ow;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = k / (g.oh * g.ow), i = (k / g.ow) % g.oh, j = k % g.ow;
    const T* in = x + p * g.h * g.w;
    float acc = 0;
    for (int64_t a = 0; a < g.kh; ++a) {
      const int64_t r = i * g.sh - g.ph + a;
      if (r < 0 || r >= g.h) continue;
      for (int64_t b = 0; b < g.kw; ++b) {
        const int64_t s = j * g.sw - g.pw + b;
        if (s >= 0 && s < g.w) acc += to_f(in[r * g.w + s]);
      }
    }
    const int64_t cnt = g.window_count(i, j);
    y[k] = from_f<T>(cnt > 0 ? acc / float(cnt) : 0.f);
  }
}

// dx[r, s] = sum over the windows (i, j) that hold (r, s) of dy[i, j] / count(i, j).
template <class T>
__global__ void avg_pool_back(const T* dy, T* dx, PoolShape g, bool accumulate) {
  const int64_t n = g.planes * g.h * g.w;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = k / (g.h * g.w), r = (k / g.w) % g.h, s = k % g.w;
    // i * sh - ph <= r < i * sh - ph + kh
    const int64_t i0 = max(int64_t(0), (r + g.ph - g.kh + g.sh) / g.sh);
    const int64_t i1 = min(g.oh - 1, (r + g.ph) / g.sh);
    const int64_t j0 = max(int64_t(0), (s + g.pw - g.kw + g.sw) / g.sw);
    const int64_t j1 = min(g.ow - 1, (s + g.pw) / g.sw);
    const T* d = dy + p * g.oh * g.ow;
    float v = 0;
    for (int64_t i = i0; i <= i1; ++i) {
      if (r < i * g.sh - g.ph || r >= i * g.sh - g.ph + g.kh) continue;
      for (int64_t j = j0; j <= j1; ++j) {
        if (s < j * g.sw - g.pw || s >= j * g.sw - g.pw + g.kw) continue;
        const int64_t cnt = g.window_count(i, j);
        if (cnt > 0) v += to_f(d[i * g.ow + j]) / float(cnt);
      }
    }
    dx[k] = from_f<T>(accumulate ? to_f(dx[k]) + v : v);
  }
}

template <class T>
__global__ void global_avg(const T* x, T* y, int64_t planes, int64_t plane) {
  const int64_t p = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (p >= planes) return;
  double acc = 0;
  for (int64_t k = lane; k < plane; k += 32) acc += double(to_f(x[p * plane + k]));
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[p] = from_f<T>(float(acc / double(plane)));
}

template <class T>
__global__ void global_avg_back(const T* dy, T* dx, int64_t planes, int64_t plane,
                                bool accumulate) {
  const int64_t n = planes * plane;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const float v = float(double(to_f(dy[k / plane])) / double(plane));
    dx[k] = from_f<T>(accumulate ? to_f(dx[k]) + v : v);
  }
}

// ---- the convolution's bias ----
template <class T, class S>
__global__ void conv_bias_add(T* y, const S* bias, int64_t n, int64_t channels, int64_t plane) {
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x)
    y[k] = from_f<T>(to_f(y[k]) + to_f(bias[(k / plane) % channels]));
}

// dbias[o] (+)= the sum of dy over its batch and plane: one block per channel.
template <class T, class S>
__global__ void conv_bias_grad(const T* dy, S* dbias, BnShape s, bool accumulate) {
  const int64_t ch = blockIdx.x, cnt = s.count();
  double sum = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += kBlock) sum += double(to_f(dy[s.at(k, ch)]));
  sum = block_sum_d(sum);
  if (threadIdx.x == 0)
    dbias[ch] = from_f<S>(float(accumulate ? double(get(dbias, ch)) + sum : sum));
}

}  // namespace

// ---- convolution ----

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                    Tensor& y) {
  const char* op = "conv2d_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "w", w);
  require_cuda(op, "y", y);
  require(x.dtype() == w.dtype() && x.dtype() == y.dtype(), op, "x, w and y of one dtype");
  cudnn_convolution(ConvPass::forward, x, w, y, o, 0.f);
  if (!bias.defined()) return;
  require_cuda(op, "bias", bias);
  Launch l(y);
  const int64_t plane = y.size(2) * y.size(3);
  BATON_CUDA_DISPATCH2(op, y.dtype(), bias.dtype(), T, S, {
    conv_bias_add<T, S><<<grid_for(y.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<T*>(y.raw_data()), static_cast<const S*>(bias.raw_data()), y.numel(), y.size(1),
        plane);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Conv2dOptions& o, Tensor& dx,
                           bool accumulate) {
  const char* op = "conv2d_backward_input";
  require_cuda(op, "dy", dy);
  require_cuda(op, "w", w);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == w.dtype() && dy.dtype() == dx.dtype(), op, "dy, w and dx of one dtype");
  cudnn_convolution(ConvPass::data, dx, w, dy, o, accumulate ? 1.f : 0.f);
}

void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Conv2dOptions& o, Tensor& dw,
                            Tensor& dbias, bool accumulate) {
  const char* op = "conv2d_backward_weight";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require_cuda(op, "dw", dw);
  require(dy.dtype() == x.dtype() && dy.dtype() == dw.dtype(), op, "dy, x and dw of one dtype");
  cudnn_convolution(ConvPass::filter, x, dw, dy, o, accumulate ? 1.f : 0.f);
  if (!dbias.defined()) return;
  require_cuda(op, "dbias", dbias);
  Launch l(dbias);
  const BnShape s{dy.size(0), dy.size(1), dy.size(2) * dy.size(3)};
  BATON_CUDA_DISPATCH2(op, dy.dtype(), dbias.dtype(), T, S, {
    conv_bias_grad<T, S><<<unsigned(s.c), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<S*>(dbias.raw_data()), s, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

// ---- batch normalisation ----

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             double momentum, Tensor& y, Tensor& mean, Tensor& rstd,
                             Tensor& running_mean, Tensor& running_var) {
  const char* op = "batchnorm_forward_train";
  const BnShape s = bn_shape(op, x);
  require_cuda(op, "y", y);
  require(y.dtype() == x.dtype(), op, "x and y of one dtype");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&weight, &bias, &mean, &rstd,
                                                              &running_mean, &running_var}) {
    if (!t->defined()) continue;
    require_cuda(op, "a per-channel tensor", *t);
    require(t->dtype() == weight.dtype(), op, "the per-channel tensors of one dtype");
  }
  if (s.c == 0 || s.n * s.plane == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, S, {
    bn_train<T, S><<<unsigned(s.c), kBlock, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), opt_ptr<S>(weight), opt_ptr<S>(bias), eps, momentum,
        static_cast<T*>(y.raw_data()), opt_ptr<S>(mean), opt_ptr<S>(rstd), opt_ptr<S>(running_mean),
        opt_ptr<S>(running_var), s);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double eps,
                            Tensor& y) {
  const char* op = "batchnorm_forward_eval";
  const BnShape s = bn_shape(op, x);
  require_cuda(op, "y", y);
  require(y.dtype() == x.dtype(), op, "x and y of one dtype");
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    require_cuda(op, "a per-channel tensor", *t);
    require(t->dtype() == weight.dtype(), op, "the per-channel tensors of one dtype");
  }
  if (x.numel() == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, S, {
    bn_eval<T, S><<<grid_for(x.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), opt_ptr<S>(weight), opt_ptr<S>(bias),
        opt_ptr<S>(running_mean), opt_ptr<S>(running_var), eps, static_cast<T*>(y.raw_data()), s);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "batchnorm_backward_input";
  const BnShape s = bn_shape(op, x);
  require_cuda(op, "dy", dy);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == x.dtype() && dx.dtype() == x.dtype(), op, "dy, x and dx of one dtype");
  for (const Tensor* t : {&weight, &mean, &rstd}) {
    require_cuda(op, "a per-channel tensor", *t);
    require(t->dtype() == weight.dtype(), op, "the per-channel tensors of one dtype");
  }
  if (s.c == 0 || s.n * s.plane == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, S, {
    bn_backward<T, S><<<unsigned(s.c), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<const T*>(x.raw_data()),
        opt_ptr<S>(weight), opt_ptr<S>(mean), opt_ptr<S>(rstd), static_cast<T*>(dx.raw_data()),
        nullptr, nullptr, s, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_backward_input_sums(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xhat, double count, Tensor& dx,
                                   bool accumulate) {
  const char* op = "batchnorm_backward_input_sums";
  const BnShape s = bn_shape(op, x);
  require_cuda(op, "dy", dy);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == x.dtype() && dx.dtype() == x.dtype(), op, "dy, x and dx of one dtype");
  for (const Tensor* t : {&weight, &mean, &rstd, &sum_dy, &sum_dy_xhat}) {
    require_cuda(op, "a per-channel tensor", *t);
    require(t->dtype() == weight.dtype(), op, "the per-channel tensors of one dtype");
  }
  if (x.numel() == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH2(op, x.dtype(), weight.dtype(), T, S, {
    bn_backward_sums<T, S><<<grid_for(x.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<const T*>(x.raw_data()),
        opt_ptr<S>(weight), opt_ptr<S>(mean), opt_ptr<S>(rstd), opt_ptr<S>(sum_dy),
        opt_ptr<S>(sum_dy_xhat), count, static_cast<T*>(dx.raw_data()), s, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias,
                               bool accumulate) {
  const char* op = "batchnorm_backward_weight";
  const BnShape s = bn_shape(op, x);
  require_cuda(op, "dy", dy);
  require(dy.dtype() == x.dtype(), op, "dy and x of one dtype");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&mean, &rstd, &dweight, &dbias}) {
    if (!t->defined()) continue;
    require_cuda(op, "a per-channel tensor", *t);
    require(t->dtype() == mean.dtype(), op, "the per-channel tensors of one dtype");
  }
  if (s.c == 0) return;
  Launch l(dweight.defined() ? dweight : dbias);
  BATON_CUDA_DISPATCH2(op, x.dtype(), mean.dtype(), T, S, {
    bn_backward<T, S><<<unsigned(s.c), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<const T*>(x.raw_data()), nullptr,
        opt_ptr<S>(mean), opt_ptr<S>(rstd), nullptr, opt_ptr<S>(dweight), opt_ptr<S>(dbias), s,
        accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

// ---- pooling ----

void maxpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y, Tensor& argmax) {
  const char* op = "maxpool2d_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require_cuda(op, "argmax", argmax);
  require(x.dtype() == y.dtype(), op, "x and y of one dtype");
  const PoolShape g = pool_shape(x, y, o);
  if (y.numel() == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH(op, x.dtype(), T, {
    max_pool<T><<<grid_for(y.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), argmax.data<int32_t>(),
        g);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx, bool accumulate) {
  const char* op = "maxpool2d_backward";
  require_cuda(op, "dy", dy);
  require_cuda(op, "argmax", argmax);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == dx.dtype(), op, "dy and dx of one dtype");
  const int64_t planes = dx.size(0) * dx.size(1);
  if (planes == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH(op, dx.dtype(), T, {
    max_pool_back<T><<<grid_for(planes, kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), argmax.data<int32_t>(),
        static_cast<T*>(dx.raw_data()), planes, dx.size(2) * dx.size(3), dy.size(2) * dy.size(3),
        accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void avgpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y) {
  const char* op = "avgpool2d_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require(x.dtype() == y.dtype(), op, "x and y of one dtype");
  const PoolShape g = pool_shape(x, y, o);
  if (y.numel() == 0) return;
  Launch l(y);
  BATON_CUDA_DISPATCH(op, x.dtype(), T, {
    avg_pool<T><<<grid_for(y.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), g);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void avgpool2d_backward(const Tensor& dy, const Pool2dOptions& o, Tensor& dx, bool accumulate) {
  const char* op = "avgpool2d_backward";
  require_cuda(op, "dy", dy);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == dx.dtype(), op, "dy and dx of one dtype");
  const PoolShape g = pool_shape(dx, dy, o);
  if (dx.numel() == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH(op, dx.dtype(), T, {
    avg_pool_back<T><<<grid_for(dx.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<T*>(dx.raw_data()), g, accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void global_avgpool_forward(const Tensor& x, Tensor& y) {
  const char* op = "global_avgpool_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require(x.dtype() == y.dtype(), op, "x and y of one dtype");
  const int64_t planes = x.size(0) * x.size(1), plane = x.size(2) * x.size(3);
  if (planes == 0) return;
  Launch l(y);
  constexpr int kWarpsPerBlock = kBlock / 32;
  BATON_CUDA_DISPATCH(op, x.dtype(), T, {
    global_avg<T>
        <<<unsigned((planes + kWarpsPerBlock - 1) / kWarpsPerBlock), kBlock, 0, l.stream>>>(
            static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), planes, plane);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

void global_avgpool_backward(const Tensor& dy, Tensor& dx, bool accumulate) {
  const char* op = "global_avgpool_backward";
  require_cuda(op, "dy", dy);
  require_cuda(op, "dx", dx);
  require(dy.dtype() == dx.dtype(), op, "dy and dx of one dtype");
  const int64_t planes = dx.size(0) * dx.size(1), plane = dx.size(2) * dx.size(3);
  if (dx.numel() == 0) return;
  Launch l(dx);
  BATON_CUDA_DISPATCH(op, dx.dtype(), T, {
    global_avg_back<T><<<grid_for(dx.numel(), kBlock), kBlock, 0, l.stream>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<T*>(dx.raw_data()), planes, plane,
        accumulate);
    BATON_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace baton::kernels::cuda
