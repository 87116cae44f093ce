// GELU (GPT-2's tanh form) and ReLU, forward and backward.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

namespace {
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;
}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  const T c = T(kGeluC), a = T(kGeluA);
  parallel_for(n, kElementwiseGrain / 4, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) {
      const T v = x[i];
      const T t = vtanh<T>(c * (v + a * v * v * v));
      y[i] = T(0.5) * v * (T(1) + t);
    }
  });
}

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3)).
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  const T c = T(kGeluC), a = T(kGeluA);
  auto grad = [c, a](T v) {
    const T t = vtanh<T>(c * (v + a * v * v * v));
    return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * c * (T(1) + T(3) * a * v * v);
  };
  parallel_for(n, kElementwiseGrain / 4, [&](int64_t s, int64_t e) {
    // Two loops: with accumulate = false dx may hold garbage (even NaN) that must not leak.
    if (accumulate) {
#pragma GCC ivdep
      for (int64_t i = s; i < e; ++i) dx[i] += grad(x[i]) * dy[i];
    } else {
#pragma GCC ivdep
      for (int64_t i = s; i < e; ++i) dx[i] = grad(x[i]) * dy[i];
    }
  });
}

template <class T>
void relu_forward(const T* x, T* y, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    for (int64_t i = s; i < e; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
  });
}

template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
    if (accumulate) {
#pragma GCC ivdep
      for (int64_t i = s; i < e; ++i) dx[i] += x[i] > T(0) ? dy[i] : T(0);
    } else {
#pragma GCC ivdep
      for (int64_t i = s; i < e; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
    }
  });
}

#define BATON_INSTANTIATE(T)                                                 \
  template void gelu_forward<T>(const T*, T*, int64_t);                      \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, bool);     \
  template void relu_forward<T>(const T*, T*, int64_t);                      \
  template void relu_backward<T>(const T*, const T*, T*, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
