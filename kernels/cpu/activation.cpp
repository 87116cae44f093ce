// GELU (GPT-2's tanh form), ReLU, SiLU and the SwiGLU gate (LLaMA's MLP: silu(gate) *
// up, fused so neither silu(gate) nor its gradient is ever stored), forward and backward.
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// The float vexp saturates at exp(88.37) instead of overflowing, so the sigmoid
// 1 / (1 + exp(-a)) of a < -88.37 bottoms out near 4e-39 rather than 0, and what multiplies
// it by a large x came out finite and wrong (gelu'(-1e12) = -9e-4, silu(-1e38) = -0.4).
// Past the saturation the true values are below 1e-35: 0, as torch's overflowing exp gives.
// Double's std::exp overflows to inf and its sigmoid is 0 already.
template <class V, class T>
inline V zero_where_saturated(V a, V value) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr T kLim = -88.37f;  // vexp's clamp (vec_math.h), negated
    if constexpr (std::is_same_v<V, T>)
      return a < kLim ? T(0) : value;
    else
      return a < (V{} + kLim) ? V{} : value;  // lane by lane: no dependence on the split
  } else {
    return value;
  }
}

template <class V, class T>
inline V sigmoid_of(V x) {
  return zero_where_saturated<V, T>(x, vrecip(T(1) + vexp(-x)));
}

// gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = c (x + a x^3); the sigmoid form
// needs one exp and one reciprocal, and saturates correctly at both ends.
// gelu'(x) = s + 2 x s (1 - s) c (1 + 3 a x^2), s = sigmoid(2u).
template <class V, class T>
inline V gelu_value(V x) {
  const V u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  return x * sigmoid_of<V, T>(T(2) * u);
}

// The select is on the whole gradient: with s = 0, x^2 = inf (|x| > 1.8e19) would make NaN.
template <class V, class T>
inline V gelu_grad(V x) {
  const V u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  const V s = vrecip(T(1) + vexp(T(-2) * u));
  return zero_where_saturated<V, T>(
      T(2) * u, s + T(2) * x * s * (T(1) - s) * T(kGeluC) * (T(1) + T(3 * kGeluA) * x * x));
}

// silu(x) = x s, s = sigmoid(x); silu'(x) = s (1 + x (1 - s)).
template <class V, class T>
inline V silu_grad(V x) {
  const V s = sigmoid_of<V, T>(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace

template <class T>
void silu_forward(const T* x, T* y, int64_t n) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    for (; i + L <= e; i += L) {
      const vec<T> v = load(x + i);
      store(y + i, v * sigmoid_of<vec<T>, T>(v));
    }
    for (; i < e; ++i) y[i] = x[i] * sigmoid_of<T, T>(x[i]);
  });
}

template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    if (accumulate) {
      for (; i + L <= e; i += L)
        store(dx + i, load(dx + i) + silu_grad<vec<T>, T>(load(x + i)) * load(dy + i));
      for (; i < e; ++i) dx[i] += silu_grad<T, T>(x[i]) * dy[i];
    } else {
      for (; i + L <= e; i += L) store(dx + i, silu_grad<vec<T>, T>(load(x + i)) * load(dy + i));
      for (; i < e; ++i) dx[i] = silu_grad<T, T>(x[i]) * dy[i];
    }
  });
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    for (; i + L <= e; i += L) {
      const vec<T> g = load(gate + i);
      store(y + i, g * sigmoid_of<vec<T>, T>(g) * load(up + i));
    }
    for (; i < e; ++i) y[i] = gate[i] * sigmoid_of<T, T>(gate[i]) * up[i];
  });
}

// dgate = dy up silu'(gate), dup = dy silu(gate); one pass, one exp per element.
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n,
                     bool acc_gate, bool acc_up) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    auto step = [&]<class V>(int64_t i, V g, V u, V d, auto ld, auto st) {
      const V sg = sigmoid_of<V, T>(g);
      const V dg = d * u * (sg * (T(1) + g * (T(1) - sg)));
      const V du = d * g * sg;
      if (dgate != nullptr) st(dgate + i, acc_gate ? ld(dgate + i) + dg : dg);
      if (dup != nullptr) st(dup + i, acc_up ? ld(dup + i) + du : du);
    };
    auto vld = [](const T* p) { return load(p); };
    auto vst = [](T* p, vec<T> v) { store(p, v); };
    auto sld = [](const T* p) { return *p; };
    auto sst = [](T* p, T v) { *p = v; };
    int64_t i = s;
    for (; i + L <= e; i += L)
      step.template operator()<vec<T>>(i, load(gate + i), load(up + i), load(dy + i), vld, vst);
    for (; i < e; ++i) step.template operator()<T>(i, gate[i], up[i], dy[i], sld, sst);
  });
}

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
    constexpr int64_t L = kLanes<T>;
    int64_t i = s;
    for (; i + L <= e; i += L) store(y + i, gelu_value<vec<T>, T>(load(x + i)));
    for (; i < e; ++i) y[i] = gelu_value<T, T>(x[i]);
  });
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  parallel_for_vectors(n, kElementwiseGrain / 4, kLanes<T>, [&](int64_t s, int64_t e) {
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

// h = x + bias, y = gelu(h) in one pass per row (h may be x: in place); the row's GELU
// runs as gelu_forward's does from an aligned start, so with rows a multiple of the
// vector width the bits equal bias_add_inplace then gelu_forward.
template <class T>
void bias_gelu_forward(const T* x, const T* bias, T* h, T* y, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(4 * cols), [&](int64_t r0, int64_t r1) {
    constexpr int64_t L = kLanes<T>;
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * cols;
      T* hr = h + r * cols;
      T* yr = y + r * cols;
      int64_t c = 0;
      for (; c + L <= cols; c += L) {
        const vec<T> v = load(xr + c) + load(bias + c);
        store(hr + c, v);
        store(yr + c, gelu_value<vec<T>, T>(v));
      }
      for (; c < cols; ++c) {
        const T v = xr[c] + bias[c];
        hr[c] = v;
        yr[c] = gelu_value<T, T>(v);
      }
    }
  });
}

template <class T>
void relu_forward(const T* x, T* y, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma GCC ivdep
    // x < 0, not x > 0: a NaN passes through, as PyTorch's does (a NaN input would
    // otherwise show a finite loss).
    for (int64_t i = s; i < e; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
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

#define BATON_INSTANTIATE(T)                                                        \
  template void gelu_forward<T>(const T*, T*, int64_t);                             \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, bool);            \
  template void relu_forward<T>(const T*, T*, int64_t);                             \
  template void bias_gelu_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t); \
  template void relu_backward<T>(const T*, const T*, T*, int64_t, bool);            \
  template void silu_forward<T>(const T*, T*, int64_t);                             \
  template void silu_backward<T>(const T*, const T*, T*, int64_t, bool);            \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                 \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, bool, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
