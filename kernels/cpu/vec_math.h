// SIMD helpers for the CPU kernels: vectors of one register of the target in GCC's
// vector extensions (64 bytes with AVX-512, 32 with AVX/AVX2, 16 otherwise), a
// vectorised exp for float (a 32-entry table of 2^(j/32) and a fitted quadratic with AVX-512,
// a fitted degree-5 polynomial otherwise; relative error under 1.8e-7) and
// reductions. Written explicitly because GCC 12 leaves max reductions and loops with
// several sums scalar. The width follows the target because GCC splits a wider vector
// into pieces and scalarises its compares and selects (64-byte vectors on an AVX2 CPU ran
// softmax 10x slower). Double, the reference precision, calls std::exp lane by lane: it
// must be exact rather than fast. Include it only from code compiled with the kernels'
// target flags (kernels/CMakeLists.txt): the width follows the target, and functions such
// as splat<float> mangle without it, so a unit of another width would clash at link time.
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
// max and min with the semantics of a > b ? a : b (b when either is NaN), which is what
// maxps/minps do; GCC 12 lowers the vector ?: to a compare and a blend, twice the uops.
template <class V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}
template <class V>
inline V vmin(V a, V b) {
  return a < b ? a : b;
}
#if defined(__AVX512F__)
// maskz forms with every lane set (the same vmaxps/vminps): GCC 12's plain intrinsics pass
// _mm512_undefined_ps() as the merge source, which -Wmaybe-uninitialized reports at -O3.
inline vfloat vmax(vfloat a, vfloat b) {
  return (vfloat)_mm512_maskz_max_ps(__mmask16(0xFFFF), (__m512)a, (__m512)b);
}
inline vfloat vmin(vfloat a, vfloat b) {
  return (vfloat)_mm512_maskz_min_ps(__mmask16(0xFFFF), (__m512)a, (__m512)b);
}
#elif defined(__AVX__)
inline vfloat vmax(vfloat a, vfloat b) {
  return (vfloat)_mm256_max_ps((__m256)a, (__m256)b);
}
inline vfloat vmin(vfloat a, vfloat b) {
  return (vfloat)_mm256_min_ps((__m256)a, (__m256)b);
}
#endif

namespace detail {
template <class T, int N>
struct LanesOf {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
// Lane j + N/2 combined into lane j, down to one lane: the pairwise tree inside a register
// (log2 N dependent steps where a lane-by-lane loop takes N - 1).
template <class T, int N, std::size_t... I>
inline T tree_sum(typename LanesOf<T, N>::type v, std::index_sequence<I...>) {
  const auto lo = __builtin_shufflevector(v, v, I...);
  const auto hi = __builtin_shufflevector(v, v, (I + N / 2)...);
  if constexpr (N == 2)
    return (lo + hi)[0];
  else
    return tree_sum<T, N / 2>(lo + hi, std::make_index_sequence<N / 4>{});
}
template <class T, int N, std::size_t... I>
inline T tree_max(typename LanesOf<T, N>::type v, std::index_sequence<I...>) {
  const auto lo = __builtin_shufflevector(v, v, I...);
  const auto hi = __builtin_shufflevector(v, v, (I + N / 2)...);
  const auto m = lo > hi ? lo : hi;
  if constexpr (N == 2)
    return m[0];
  else
    return tree_max<T, N / 2>(m, std::make_index_sequence<N / 4>{});
}
}  // namespace detail

// The lanes' sum and max as pairwise trees: the order depends on the vector width only.
// The softmax rows wait on both between one row and the next; the trees made its forward
// 1.25x faster than lane-by-lane loops (docs/kernels.md).
template <class V>
inline lane_t<V> hsum(V v) {
  constexpr int N = int(kLanes<lane_t<V>>);
  return detail::tree_sum<lane_t<V>, N>(v, std::make_index_sequence<std::size_t(N / 2)>{});
}
template <class V>
inline lane_t<V> hmax(V v) {
  constexpr int N = int(kLanes<lane_t<V>>);
  return detail::tree_max<lane_t<V>, N>(v, std::make_index_sequence<std::size_t(N / 2)>{});
}

#if defined(__AVX512F__)
// 2^(j/32) for j < 32, each the nearest float.
alignas(64) inline constexpr float kExp2Fraction[32] = {
    0x1.000000p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f,
    0x1.2387a6p+0f, 0x1.29e9e0p+0f, 0x1.306fe0p+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, 0x1.44e086p+0f,
    0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f,
    0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f,
    0x1.ae89fap+0f, 0x1.b7f770p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f,
    0x1.ea4afap+0f, 0x1.f50766p+0f};

// exp(x) = 2^fn e^r with fn = x / ln 2 rounded to 1/32 and |r| <= ln 2 / 64: 2^(fn's
// fraction) from the table above, held in two registers (vpermt2ps), e^r as 1 + r (c1 +
// c2 r), fitted for the least maximal relative error (5.3e-8), and 2^floor(fn) applied
// by vscalefps. Seven operations for the FMA pipes where the degree-5 polynomial below
// takes nine; the maximal relative error against the exact exp is 1.66e-7 (1.77e-7 below)
// over [-87, 88]. fn <= -127 (x below about -88, -inf) gives 0, by the mask, so no clamp
// from below is needed; a NaN passes the mask and stays NaN, as torch's exp keeps it (a
// NaN logit must not vanish from a softmax). x <= 88.37.
inline vfloat exp_unclamped(vfloat x) {
  // Adding 1.5 * 2^18 rounds to a multiple of 1/32 and leaves 32 fn in the low bits.
  const vfloat shifted = x * 1.44269504088896341f + 393216.0f;
  const vfloat fn = shifted - 393216.0f;
  // fn (12 significant bits) times 0.693359375 (9) is exact, fused or not.
  vfloat r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  const vfloat q = (r * 0x1.00014p-1f + 0x1.0000f6p+0f) * r;
  const vfloat t = (vfloat)_mm512_permutex2var_ps(_mm512_load_ps(kExp2Fraction), (__m512i)shifted,
                                                  _mm512_load_ps(kExp2Fraction + 16));
  const vfloat p = t * q + t;
  const __mmask16 normal = _mm512_cmp_ps_mask((__m512)fn, _mm512_set1_ps(-127.0f), _CMP_NLE_UQ);
  return (vfloat)_mm512_maskz_scalef_ps(normal, (__m512)p, (__m512)fn);
}
inline vfloat exp_approx(vfloat x) {
  // This order keeps a NaN (vminps returns its second operand).
  return exp_unclamped(vmin(splat(88.37f), x));
}
inline vfloat exp_nonpositive(vfloat x) {
  return exp_unclamped(x);
}
// The vector's bits for one float (tails of rows, a row's rescaling).
inline float exp_approx(float x) {
  return exp_approx(splat(x))[0];
}
#else
// e^r on |r| <= ln2 / 2 as 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3), fitted for the
// least maximal relative error (1.05e-7 before rounding; Lawson's iteration on Chebyshev
// nodes). Two degrees fewer than Cephes' polynomial (3e-9, far below float's 6e-8
// spacing): the exp bounds softmax and cross-entropy, and each degree is an FMA.
constexpr float kExpC2 = 0.499992311000824f;
constexpr float kExpC3 = 0.16667114198207855f;
constexpr float kExpC4 = 0.041890114545822144f;
constexpr float kExpC5 = 0.008312526158988476f;

// exp(x) / 2^fn for fn = round(x / ln 2): the two-constant reduction r = x - fn ln 2 and
// the polynomial of exp(r), shared by both ways of applying 2^fn below.
inline vfloat exp_reduced(vfloat x, vfloat fn) {
  vfloat r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  vfloat p = splat(kExpC5);
  p = p * r + kExpC4;
  p = p * r + kExpC3;
  p = p * r + kExpC2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p;
}

// -88 <= x <= 88.37.
inline vfloat exp_unclamped(vfloat x) {
  const vfloat shifted = x * 1.44269504088896341f + 12582912.0f;
  const vint32 n = std::bit_cast<vint32>(shifted) - 0x4B400000;
  const vfloat fn = shifted - 12582912.0f;
  return exp_reduced(x, fn) * std::bit_cast<vfloat>((n + 127) << 23);
}
// The clamps' operand order keeps a NaN (maxps/minps return their second operand).
inline vfloat exp_approx(vfloat x) {
  return exp_unclamped(vmin(splat(88.37f), vmax(splat(-88.0f), x)));
}
inline vfloat exp_nonpositive(vfloat x) {
  return exp_unclamped(vmax(splat(-88.0f), x));
}
// exp(x) for float; inputs below about -87.9 give 0, above 88.37 saturate at e^88.37
// (softmax-style callers only pass x <= 0), NaN stays NaN. The vector version's arithmetic.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -88.0f), 88.37f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: adding it leaves n in the low mantissa
  // bits (std::floor would not vectorise without -fno-trapping-math).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const int32_t n = std::bit_cast<int32_t>(shifted) - 0x4B400000;
  const float fn = shifted - 12582912.0f;
  float r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = kExpC5;
  p = p * r + kExpC4;
  p = p * r + kExpC3;
  p = p * r + kExpC2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n in [-127, 127]: n = -127 builds the bit pattern 0, i.e. exp underflows to 0.
  return p * std::bit_cast<float>(uint32_t(n + 127) << 23);
}
#endif

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
// exp(x) for x <= 0 or NaN, such as a value less its row's maximum: vexp's bits, for a
// vector of floats without its clamp from above (6-8% of softmax forward, docs/kernels.md).
template <class T>
inline T vexp_nonpositive(T x) {
  if constexpr (std::is_same_v<T, vfloat>)
    return exp_nonpositive(x);
  else
    return vexp(x);
}

// 1 / x: with AVX-512 a 14-bit estimate refined by one Newton step (about 1 ulp),
// since a full division is several times slower than everything else in GELU. AVX's
// 12-bit estimate refined once is off by a few ulp, which SiLU's gradient amplifies past
// 1e-6 (measured 3e-6), so AVX2 divides.
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

// The shift subtracted before an exp: a row's (or chunk's) maximum, or 0 where that is -inf
// (everything masked): -inf - -inf is NaN, which the exp keeps, where each exp is 0.
template <class T>
inline T exp_shift(T max) {
  return max == -std::numeric_limits<T>::infinity() ? T(0) : max;
}

// The exp_shifted_* take shift >= every x[i] (a row's maximum, or a log-sum-exp above it).

// y[i] = exp(x[i] - shift) for i < n; returns their sum. y may be x.
template <class T>
inline T exp_shifted_sum(const T* x, T shift, T* y, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  shift = exp_shift(shift);
  int64_t i = 0;
  vec<T> acc{};
  for (; i + L <= n; i += L) {
    const vec<T> e = vexp_nonpositive(load(x + i) - shift);
    store(y + i, e);
    acc += e;
  }
  T s = hsum(acc);
  for (; i < n; ++i) {
    const T e = vexp_nonpositive(x[i] - shift);
    y[i] = e;
    s += e;
  }
  return s;
}

// sum of exp(x[i] - shift) for i < n.
template <class T>
inline T exp_shifted_sum(const T* x, T shift, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  shift = exp_shift(shift);
  int64_t i = 0;
  vec<T> acc{};
  for (; i + L <= n; i += L) acc += vexp_nonpositive(load(x + i) - shift);
  T s = hsum(acc);
  for (; i < n; ++i) s += vexp_nonpositive(x[i] - shift);
  return s;
}

// y[i] = exp(x[i] - shift) * scale for i < n. y may be x.
template <class T>
inline void exp_shifted_scaled(const T* x, T shift, T scale, T* y, int64_t n) {
  constexpr int64_t L = kLanes<T>;
  shift = exp_shift(shift);
  int64_t i = 0;
  for (; i + L <= n; i += L) store(y + i, vexp_nonpositive(load(x + i) - shift) * scale);
  for (; i < n; ++i) y[i] = vexp_nonpositive(x[i] - shift) * scale;
}

// The value of type V at p: V is either a scalar or one of the vectors above, of the
// same lane type as p or (vdouble from float) converted lane by lane.
template <class V, class S>
inline V load_as(const S* p) {
  if constexpr (std::is_arithmetic_v<V>) {
    return V(*p);
  } else if constexpr (std::is_same_v<lane_t<V>, S>) {
    return load(p);
  } else {
    constexpr std::size_t kParts = sizeof(V) / sizeof(lane_t<V>);
    typedef S part __attribute__((vector_size(kParts * sizeof(S))));
    part v;
    __builtin_memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, V);
  }
}

// Stores v (a scalar or a vector of S's lanes) at p: the counterpart of load_as.
template <class V, class S>
inline void store_as(S* p, V v) {
  if constexpr (std::is_arithmetic_v<V>)
    *p = S(v);
  else
    store(p, v);
}

// sum of f(i) over i < n: whole blocks of 32 elements in 32 running sums (four AVX2 or
// two AVX-512 registers, so four independent chains of additions keep the adder busy;
// slot s gets the elements i = s mod 32), the slots added pairwise in registers (s and
// s + h for h = 16, 8, .., 1), then the last n mod 32 elements one by one. Fixed order,
// so the result depends on n only, not on the instruction set or the thread count. f is
// called as f(V{}, i) with V = vec<T> for elements i..i+L-1 or V = T for element i (write
// its body with load_as<V>), e.g.
//   sum_of<float>(n, [&]<class V>(V, int64_t i) { return load_as<V>(x + i) * load_as<V>(y + i); })
constexpr int64_t kSumWays = 32;

template <class T, class F>
inline auto sum_of_vectors(int64_t n, F&& f) {
  using V = vec<T>;
  constexpr int64_t L = kLanes<T>, P = kSumWays / L;
  using R = std::remove_cvref_t<decltype(f(V{}, int64_t(0)))>;  // V or a pair of V
  constexpr bool kPair = !std::is_same_v<R, V>;
  auto add = [](R& a, const R& b) {
    if constexpr (kPair) {
      a.first += b.first;
      a.second += b.second;
    } else {
      a += b;
    }
  };
  R acc[P];
  for (R& a : acc) {
    if constexpr (kPair)
      a = R(V{}, V{});
    else
      a = V{};
  }
  int64_t i = 0;
  for (; i + kSumWays <= n; i += kSumWays)
#pragma GCC unroll 16
    for (int64_t p = 0; p < P; ++p) add(acc[p], f(V{}, i + p * L));
#pragma GCC unroll 8
  for (int64_t h = P / 2; h >= 1; h /= 2)
#pragma GCC unroll 16
    for (int64_t p = 0; p < h; ++p) add(acc[p], acc[p + h]);
  if constexpr (kPair) {
    T s0 = hsum(acc[0].first);
    T s1 = hsum(acc[0].second);
    for (; i < n; ++i) {
      const auto e = f(T{}, i);
      s0 += e.first;
      s1 += e.second;
    }
    return std::pair<T, T>{s0, s1};
  } else {
    T s = hsum(acc[0]);
    for (; i < n; ++i) s += f(T{}, i);
    return s;
  }
}

template <class T, class F>
inline T sum_of(int64_t n, F&& f) {
  return sum_of_vectors<T>(n, f);
}

// Two sums at once: f(V{}, i) returns std::pair<V, V>.
template <class T, class F>
inline std::pair<T, T> sum2_of(int64_t n, F&& f) {
  return sum_of_vectors<T>(n, f);
}

}  // namespace baton::kernels::cpu
