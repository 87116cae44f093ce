// Optimizer steps over whole tensors (AdamW, SGD with momentum, both as torch.optim
// defines them) and the sum of squares for global-norm gradient clipping.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace baton::kernels::cpu {

// Fixed chunks (their size depends on n only) summed in order: the result is the same
// for every thread count.
template <class T>
double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kMaxChunks = 1024;
  const int64_t chunk = std::max<int64_t>(1 << 16, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks];
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T* p = x + c * chunk;
      const int64_t m = std::min(chunk, n - c * chunk);
      partial[c] = sum_of<double>(m, [&]<class V>(V, int64_t i) {
        const V v = load_as<V>(p + i);
        return v * v;
      });
    }
  });
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

// torch.optim.AdamW (single-tensor path): p *= 1 - lr wd; m += (1 - b1)(g - m);
// v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, int64_t n, const AdamW& cfg, int64_t step,
                double grad_scale) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  const T decay = T(1.0 - cfg.lr * cfg.weight_decay);
  const T step_size = T(cfg.lr / bc1);
  const T inv_bc2_sqrt = T(1.0 / std::sqrt(bc2));
  const T one_minus_b1 = T(1.0 - cfg.beta1), b2 = T(cfg.beta2), one_minus_b2 = T(1.0 - cfg.beta2);
  const T eps = T(cfg.eps), gs = T(grad_scale);
  parallel_for(n, kElementwiseGrain / 2, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) {
      const T g = grad[i] * gs;
      const T mi = m[i] + one_minus_b1 * (g - m[i]);
      const T vi = b2 * v[i] + one_minus_b2 * g * g;
      const T denom = std::sqrt(vi) * inv_bc2_sqrt + eps;
      param[i] = param[i] * decay - step_size * mi / denom;
      m[i] = mi;
      v[i] = vi;
    }
  });
}

// torch.optim.SGD with dampening 0: d = g + wd p; buf = momentum buf + d (a zeroed buffer
// makes the first step buf = d, as torch's clone does); d = nesterov ? d + momentum buf
// : buf; p -= lr d.
template <class T>
void sgd_step(T* param, const T* grad, T* buf, int64_t n, const Sgd& cfg, double grad_scale) {
  const T lr = T(cfg.lr), wd = T(cfg.weight_decay), mom = T(cfg.momentum), gs = T(grad_scale);
  const bool nesterov = cfg.nesterov;
  parallel_for(n, kElementwiseGrain / 2, [&](int64_t s, int64_t e) {
    if (cfg.momentum == 0) {
#pragma GCC ivdep
      for (int64_t i = s; i < e; ++i) param[i] -= lr * (grad[i] * gs + wd * param[i]);
      return;
    }
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) {
      const T d = grad[i] * gs + wd * param[i];
      const T b = mom * buf[i] + d;
      buf[i] = b;
      param[i] -= lr * (nesterov ? d + mom * b : b);
    }
  });
}

#define BATON_INSTANTIATE(T)                                                                 \
  template double sum_squares<T>(const T*, int64_t);                                         \
  template void adamw_step<T>(T*, const T*, T*, T*, int64_t, const AdamW&, int64_t, double); \
  template void sgd_step<T>(T*, const T*, T*, int64_t, const Sgd&, double);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
