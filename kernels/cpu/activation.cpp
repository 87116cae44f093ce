// GELU (GPT-2's tanh form) and ReLU, forward and backward.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = c (x + a x^3); the sigmoid form
// needs one exp and one reciprocal, and saturates correctly at both ends.
// gelu'(x) = s + 2 x s (1 - s) c (1 + 3 a x^2), s = sigmoid(2u).
template <class V, class T>
inline V gelu_value(V x) {
  const V u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  return x * vrecip(T(1) + vexp(T(-2) * u));
}

template <class V, class T>
inline V gelu_grad(V x) {
  const V u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  const V s = vrecip(T(1) + vexp(T(-2) * u));
  return s + T(2) * x * s * (T(1) - s) * T(kGeluC) * (T(1) + T(3 * kGeluA) * x * x);
}

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  parallel_for(n, kElementwiseGrain / 4, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    for (; i + L <= e; i += L) store(y + i, gelu_value<vec<T>, T>(load(x + i)));
    for (; i < e; ++i) y[i] = gelu_value<T, T>(x[i]);
  });
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  parallel_for(n, kElementwiseGrain / 4, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    // Two paths: with accumulate = false dx may hold garbage (even NaN) that must not leak.
    if (accumulate) {
      for (; i + L <= e; i += L)
        store(dx + i, load(dx + i) + gelu_grad<vec<T>, T>(load(x + i)) * load(dy + i));
      for (; i < e; ++i) dx[i] += gelu_grad<T, T>(x[i]) * dy[i];
    } else {
      for (; i + L <= e; i += L) store(dx + i, gelu_grad<vec<T>, T>(load(x + i)) * load(dy + i));
      for (; i < e; ++i) dx[i] = gelu_grad<T, T>(x[i]) * dy[i];
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

#define BATON_INSTANTIATE(T)                                             \
  template void gelu_forward<T>(const T*, T*, int64_t);                  \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, bool); \
  template void relu_forward<T>(const T*, T*, int64_t);                  \
  template void relu_backward<T>(const T*, const T*, T*, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
