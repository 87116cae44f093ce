// Batch normalisation over N and the spatial dimensions of NCHW tensors: one task per
// channel (its statistics are one reduction over N planes), sums in double in a fixed
// order, so results do not depend on the thread count. Memory-bound: two reads of x for
// the statistics (mean, then the centred variance), one read and one write to normalise.
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vision_cpu.h"

namespace baton::kernels::cpu {

template <class T>
void batchnorm_forward_train(const T* x, const T* w, const T* b, double eps, double momentum, T* y,
                             T* mean, T* rstd, T* running_mean, T* running_var, int64_t n,
                             int64_t c, int64_t plane) {
  const double count = double(n * plane);
  parallel_tasks(c, [&](int64_t ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * plane;
      for (int64_t k = 0; k < plane; ++k) sum += double(p[k]);
    }
    const double mu = sum / count;
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * plane;
      for (int64_t k = 0; k < plane; ++k) {
        const double d = double(p[k]) - mu;
        sq += d * d;
      }
    }
    const double var = sq / count;
    const double r = 1.0 / std::sqrt(var + eps);
    mean[ch] = T(mu);
    rstd[ch] = T(r);
    if (running_mean != nullptr) {
      const double unbiased = count > 1 ? var * count / (count - 1) : var;
      running_mean[ch] = T((1 - momentum) * double(running_mean[ch]) + momentum * mu);
      running_var[ch] = T((1 - momentum) * double(running_var[ch]) + momentum * unbiased);
    }
    const T scale = T(double(w[ch]) * r), shift = T(double(b[ch]) - mu * double(w[ch]) * r);
    for (int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * plane;
      T* q = y + (i * c + ch) * plane;
#pragma GCC ivdep
      for (int64_t k = 0; k < plane; ++k) q[k] = p[k] * scale + shift;
    }
  });
}

template <class T>
void batchnorm_forward_eval(const T* x, const T* w, const T* b, const T* running_mean,
                            const T* running_var, double eps, T* y, int64_t n, int64_t c,
                            int64_t plane) {
  parallel_for(n * c, row_grain(plane), [&](int64_t s, int64_t e) {
    for (int64_t row = s; row < e; ++row) {
      const int64_t ch = row % c;
      const double r = 1.0 / std::sqrt(double(running_var[ch]) + eps);
      const T scale = T(double(w[ch]) * r);
      const T shift = T(double(b[ch]) - double(running_mean[ch]) * double(w[ch]) * r);
      const T* p = x + row * plane;
      T* q = y + row * plane;
#pragma GCC ivdep
      for (int64_t k = 0; k < plane; ++k) q[k] = p[k] * scale + shift;
    }
  });
}

namespace {
// Per channel: sum of dy and of dy * xhat.
template <class T>
void grad_sums(const T* dy, const T* x, T mean, T rstd, int64_t n, int64_t c, int64_t plane,
               int64_t ch, double& sum_dy, double& sum_dy_xhat) {
  sum_dy = 0;
  sum_dy_xhat = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* d = dy + (i * c + ch) * plane;
    const T* p = x + (i * c + ch) * plane;
    for (int64_t k = 0; k < plane; ++k) {
      sum_dy += double(d[k]);
      sum_dy_xhat += double(d[k]) * (double(p[k]) - double(mean)) * double(rstd);
    }
  }
}
}  // namespace

namespace {
// One channel's input gradient from its sums over the batch (count elements):
// dx = w rstd (dy - sum_dy / count - xhat sum_dy_xhat / count).
template <class T>
void batchnorm_dx_channel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                          double sum_dy, double sum_dy_xhat, double count, T* dx, int64_t n,
                          int64_t c, int64_t plane, int64_t ch, bool accumulate) {
  const double r = double(rstd[ch]), mu = double(mean[ch]);
  const T k1 = T(double(w[ch]) * r), k0 = T(sum_dy / count);
  const T k2 = T(sum_dy_xhat / count * r), m = T(mu);
  for (int64_t i = 0; i < n; ++i) {
    const T* d = dy + (i * c + ch) * plane;
    const T* p = x + (i * c + ch) * plane;
    T* q = dx + (i * c + ch) * plane;
    if (accumulate) {
#pragma GCC ivdep
      for (int64_t k = 0; k < plane; ++k) q[k] += k1 * (d[k] - k0 - (p[k] - m) * k2);
    } else {
#pragma GCC ivdep
      for (int64_t k = 0; k < plane; ++k) q[k] = k1 * (d[k] - k0 - (p[k] - m) * k2);
    }
  }
}
}  // namespace

template <class T>
void batchnorm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                              T* dx, int64_t n, int64_t c, int64_t plane, bool accumulate) {
  const double count = double(n * plane);
  parallel_tasks(c, [&](int64_t ch) {
    double sdy = 0, sdyx = 0;
    grad_sums(dy, x, mean[ch], rstd[ch], n, c, plane, ch, sdy, sdyx);
    batchnorm_dx_channel(dy, x, w, mean, rstd, sdy, sdyx, count, dx, n, c, plane, ch, accumulate);
  });
}

// The same with the sums over the whole batch given (reduced over a spatial group).
template <class T>
void batchnorm_backward_input_sums(const T* dy, const T* x, const T* w, const T* mean,
                                   const T* rstd, const T* sum_dy, const T* sum_dy_xhat,
                                   double count, T* dx, int64_t n, int64_t c, int64_t plane,
                                   bool accumulate) {
  parallel_tasks(c, [&](int64_t ch) {
    batchnorm_dx_channel(dy, x, w, mean, rstd, double(sum_dy[ch]), double(sum_dy_xhat[ch]), count,
                         dx, n, c, plane, ch, accumulate);
  });
}

template <class T>
void batchnorm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                               int64_t n, int64_t c, int64_t plane, bool accumulate) {
  parallel_tasks(c, [&](int64_t ch) {
    double sdy = 0, sdyx = 0;
    grad_sums(dy, x, mean[ch], rstd[ch], n, c, plane, ch, sdy, sdyx);
    if (dw != nullptr) dw[ch] = accumulate ? T(double(dw[ch]) + sdyx) : T(sdyx);
    if (db != nullptr) db[ch] = accumulate ? T(double(db[ch]) + sdy) : T(sdy);
  });
}

#define BATON_INSTANTIATE(T)                                                                       \
  template void batchnorm_forward_train<T>(const T*, const T*, const T*, double, double, T*, T*,   \
                                           T*, T*, T*, int64_t, int64_t, int64_t);                 \
  template void batchnorm_forward_eval<T>(const T*, const T*, const T*, const T*, const T*,        \
                                          double, T*, int64_t, int64_t, int64_t);                  \
  template void batchnorm_backward_input<T>(const T*, const T*, const T*, const T*, const T*, T*,  \
                                            int64_t, int64_t, int64_t, bool);                      \
  template void batchnorm_backward_weight<T>(const T*, const T*, const T*, const T*, T*, T*,       \
                                             int64_t, int64_t, int64_t, bool);                     \
  template void batchnorm_backward_input_sums<T>(const T*, const T*, const T*, const T*, const T*, \
                                                 const T*, const T*, double, T*, int64_t, int64_t, \
                                                 int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
