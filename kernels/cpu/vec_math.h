// SIMD helpers for the CPU kernels: vectors of one register of the target in GCC's
// vector extensions (64 bytes with AVX-512, 32 with AVX/AVX2, 16 otherwise), a
// vectorised exp for float (Cephes-style polynomial, relative error about 2e-7) and
// reductions. Written explicitly because GCC 12 leaves max reductions and loops with
// several sums scalar. The width follows the target because GCC splits a wider vector
// into pieces and scalarises its compares and selects (64-byte vectors on an AVX2 CPU ran
// softmax 10x slower). Double, the reference precision, calls std::exp lane by lane: it
// must be exact rather than fast.
#pragma once

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__)
#define BATON_VEC_BYTES 64
#define BATON_VEC_REGS 32
#elif defined(__AVX__)
#define BATON_VEC_BYTES 32
#define BATON_VEC_REGS 16
#else
#define BATON_VEC_BYTES 16
#define BATON_VEC_REGS 16
#endif

namespace baton::kernels::cpu {

typedef float vfloat __attribute__((vector_size(BATON_VEC_BYTES)));
typedef double vdouble __attribute__((vector_size(BATON_VEC_BYTES)));
typedef int32_t vint32 __attribute__((vector_size(BATON_VEC_BYTES)));
// Bytes of one vector and the number of vector registers (for register blocking).
constexpr int64_t kVecBytes = BATON_VEC_BYTES;
constexpr int kVecRegs = BATON_VEC_REGS;
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  using type = vfloat;
};
template <>
struct VecOf<double> {
  using type = vdouble;
};
template <class T>
using vec = typename VecOf<T>::type;
template <class T>
constexpr int64_t kLanes = int64_t(kVecBytes / sizeof(T));
template <class V>
using lane_t = std::remove_cvref_t<decltype(std::declval<V>()[0])>;

template <class T>
inline vec<T> load(const T* p) {
  vec<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(T* p, vec<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}
template <class T>
inline vec<T> splat(T x) {
  return vec<T>{} + x;
}
template <class V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}
template <class V>
inline V vmin(V a, V b) {
  return a < b ? a : b;
}
template <class V>
inline lane_t<V> hsum(V v) {
  lane_t<V> s = 0;
  for (int64_t i = 0; i < kLanes<lane_t<V>>; ++i) s += v[i];
  return s;
}
template <class V>
inline lane_t<V> hmax(V v) {
  lane_t<V> m = v[0];
  for (int64_t i = 1; i < kLanes<lane_t<V>>; ++i) m = m > v[i] ? m : v[i];
  return m;
}

// exp(x) for float; inputs below about -87.9 give 0 and above 88.37 saturate at e^88.37
// (softmax-style callers only pass x <= 0). The same arithmetic as the vector version.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -88.0f), 88.37f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: adding it leaves n in the low mantissa
  // bits (std::floor would not vectorise without -fno-trapping-math).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const int32_t n = std::bit_cast<int32_t>(shifted) - 0x4B400000;
  const float fn = shifted - 12582912.0f;
  float r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n in [-127, 127]: n = -127 builds the bit pattern 0, i.e. exp underflows to 0.
  return p * std::bit_cast<float>(uint32_t(n + 127) << 23);
}

inline vfloat exp_approx(vfloat x) {
  x = vmin(vmax(x, splat(-88.0f)), splat(88.37f));
  const vfloat shifted = x * 1.44269504088896341f + 12582912.0f;
  const vint32 n = std::bit_cast<vint32>(shifted) - 0x4B400000;
  const vfloat fn = shifted - 12582912.0f;
  vfloat r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  vfloat p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<vfloat>((n + 127) << 23);
}

inline float vexp(float x) {
  return exp_approx(x);
}
inline double vexp(double x) {
  return std::exp(x);
}
inline vfloat vexp(vfloat x) {
  return exp_approx(x);
}
inline vdouble vexp(vdouble x) {
  for (int64_t i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}

// 1 / x: with AVX-512 a 14-bit estimate refined by one Newton step (about 1 ulp),
// since a full division is several times slower than everything else in GELU.
inline vfloat vrecip(vfloat x) {
#if defined(__AVX512F__)
  // maskz form: the plain intrinsic trips GCC 12's uninitialised-value warning.
  const vfloat r = (vfloat)_mm512_maskz_rcp14_ps(__mmask16(0xFFFF), (__m512)x);
  return r * (2.0f - x * r);
#else
  return 1.0f / x;
#endif
}
inline vdouble vrecip(vdouble x) {
  return 1.0 / x;
}
inline float vrecip(float x) {
  return 1.0f / x;
}
inline double vrecip(double x) {
  return 1.0 / x;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); saturates correctly at both ends.
template <class T>
inline T vtanh(T u) {
  if constexpr (std::is_same_v<T, float>)
    return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f);
  else
    return std::tanh(u);
}

// max over x[0, n) (-inf when n = 0).
template <class T>
inline T reduce_max(const T* x, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  int64_t i = 0;
  T m = -std::numeric_limits<T>::infinity();
  if (n >= L) {
    vec<T> acc = load(x);
    for (i = L; i + L <= n; i += L) acc = vmax(acc, load(x + i));
    m = hmax(acc);
  }
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

// y[i] = exp(x[i] - shift) for i < n; returns their sum. y may be x.
template <class T>
inline T exp_shifted_sum(const T* x, T shift, T* y, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  int64_t i = 0;
  vec<T> acc{};
  for (; i + L <= n; i += L) {
    const vec<T> e = vexp(load(x + i) - shift);
    store(y + i, e);
    acc += e;
  }
  T s = hsum(acc);
  for (; i < n; ++i) {
    const T e = vexp(x[i] - shift);
    y[i] = e;
    s += e;
  }
  return s;
}

// sum of exp(x[i] - shift) for i < n.
template <class T>
inline T exp_shifted_sum(const T* x, T shift, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  int64_t i = 0;
  vec<T> acc{};
  for (; i + L <= n; i += L) acc += vexp(load(x + i) - shift);
  T s = hsum(acc);
  for (; i < n; ++i) s += vexp(x[i] - shift);
  return s;
}

// y[i] = exp(x[i] - shift) * scale for i < n. y may be x.
template <class T>
inline void exp_shifted_scaled(const T* x, T shift, T scale, T* y, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  int64_t i = 0;
  for (; i + L <= n; i += L) store(y + i, vexp(load(x + i) - shift) * scale);
  for (; i < n; ++i) y[i] = vexp(x[i] - shift) * scale;
}

// sum of f(i) over i < n, in sixteen running sums (one or two vector registers) added
// together at the end. Fixed order, so the result depends on n only. For simple bodies;
// `omp simd reduction(+)` stays scalar in GCC 12 when a loop has two sums.
template <class T, class F>
inline T sum_of(int64_t n, F&& f) {
  constexpr int64_t W = 16;
  T acc[W] = {};
  int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int64_t j = 0; j < W; ++j) acc[j] += f(i + j);
  for (int64_t j = 0; i < n; ++i, ++j) acc[j] += f(i);
  T s = 0;
  for (int64_t j = 0; j < W; ++j) s += acc[j];
  return s;
}

// Two sums at once: f(i) returns {a, b}.
template <class T, class F>
inline std::pair<T, T> sum2_of(int64_t n, F&& f) {
  constexpr int64_t W = 16;
  T a[W] = {}, b[W] = {};
  int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int64_t j = 0; j < W; ++j) {
      const auto [x, y] = f(i + j);
      a[j] += x;
      b[j] += y;
    }
  for (int64_t j = 0; i < n; ++i, ++j) {
    const auto [x, y] = f(i);
    a[j] += x;
    b[j] += y;
  }
  T sa = 0, sb = 0;
  for (int64_t j = 0; j < W; ++j) {
    sa += a[j];
    sb += b[j];
  }
  return {sa, sb};
}

}  // namespace baton::kernels::cpu
