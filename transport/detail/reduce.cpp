#include "transport/detail/reduce.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace baton::transport::detail {

using memory::DType;

namespace {

// Plain loops the compiler vectorises (this file is built with -O3); dst may alias a
// or b, which the vectoriser checks at run time.
template <class T>
void sum_loop(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

template <class T>
void max_loop(T* dst, const T* a, const T* b, size_t n) {
  // NaN wins, as in torch.maximum: a NaN in either input makes the result NaN.
  for (size_t i = 0; i < n; ++i) dst[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i];
}

template <class T>
void int_max_loop(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
}

// A 16-bit float format (bf16, f16) reduced in float: the sum, or the maximum with NaN
// winning as above.
template <bool kMax, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void half_loop(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = ToFloat(a[i]);
    float y = ToFloat(b[i]);
    float r = kMax ? ((x > y || x != x) ? x : y) : x + y;
    dst[i] = FromFloat(r);
  }
}

template <bool kMax>
void bf16_loop(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  half_loop<kMax, memory::bf16_to_float, memory::float_to_bf16>(dst, a, b, n);
}

template <bool kMax>
void f16_scalar(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  half_loop<kMax, memory::f16_to_float, memory::float_to_f16>(dst, a, b, n);
}

#if defined(__x86_64__)
// F16C converts 8 halves at a time with round-to-nearest-even, the same rounding as
// memory::float_to_f16.
template <bool kMax>
__attribute__((target("avx,f16c"))) void f16_f16c(uint16_t* dst, const uint16_t* a,
                                                  const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 r;
    if constexpr (kMax) {
      // max(x, y) with NaN propagation: pick x where x > y or x is NaN.
      __m256 pick_x =
          _mm256_or_ps(_mm256_cmp_ps(x, y, _CMP_GT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      r = _mm256_blendv_ps(y, x, pick_x);
    } else {
      r = _mm256_add_ps(x, y);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  f16_scalar<kMax>(dst + i, a + i, b + i, n - i);
}

bool have_f16c() {
  // cpuid for F16C: clang 14's __builtin_cpu_supports does not know the "f16c" feature.
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && __builtin_cpu_supports("avx");
  }();
  return ok;
}
#endif

template <bool kMax>
void f16_loop(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
#if defined(__x86_64__)
  if (have_f16c()) return f16_f16c<kMax>(dst, a, b, n);
#endif
  f16_scalar<kMax>(dst, a, b, n);
}

template <class T>
void typed(void* dst, const void* a, const void* b, size_t n, bool is_max) {
  auto* d = static_cast<T*>(dst);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  if (!is_max)
    sum_loop(d, x, y, n);
  else if constexpr (std::is_floating_point_v<T>)
    max_loop(d, x, y, n);
  else
    int_max_loop(d, x, y, n);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  bool is_max = op == ReduceOp::max;
  switch (dtype) {
    case DType::f32:
      return typed<float>(dst, a, b, n, is_max);
    case DType::f64:
      return typed<double>(dst, a, b, n, is_max);
    case DType::i32:
      return typed<int32_t>(dst, a, b, n, is_max);
    case DType::i64:
      return typed<int64_t>(dst, a, b, n, is_max);
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      auto* x = static_cast<const uint16_t*>(a);
      auto* y = static_cast<const uint16_t*>(b);
      return is_max ? bf16_loop<true>(d, x, y, n) : bf16_loop<false>(d, x, y, n);
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      auto* x = static_cast<const uint16_t*>(a);
      auto* y = static_cast<const uint16_t*>(b);
      return is_max ? f16_loop<true>(d, x, y, n) : f16_loop<false>(d, x, y, n);
    }
  }
  throw std::logic_error("reduce: unknown dtype");
}

void divide(void* p, size_t n, DType dtype, int count) {
  switch (dtype) {
    case DType::f32: {
      auto* x = static_cast<float*>(p);
      float c = float(count);
      for (size_t i = 0; i < n; ++i) x[i] /= c;
      return;
    }
    case DType::f64: {
      auto* x = static_cast<double*>(p);
      double c = double(count);
      for (size_t i = 0; i < n; ++i) x[i] /= c;
      return;
    }
    case DType::i32: {
      auto* x = static_cast<int32_t*>(p);
      for (size_t i = 0; i < n; ++i) x[i] /= count;
      return;
    }
    case DType::i64: {
      auto* x = static_cast<int64_t*>(p);
      for (size_t i = 0; i < n; ++i) x[i] /= count;
      return;
    }
    case DType::bf16: {
      auto* x = static_cast<uint16_t*>(p);
      float c = float(count);
      for (size_t i = 0; i < n; ++i) x[i] = memory::float_to_bf16(memory::bf16_to_float(x[i]) / c);
      return;
    }
    case DType::f16: {
      auto* x = static_cast<uint16_t*>(p);
      float c = float(count);
      for (size_t i = 0; i < n; ++i) x[i] = memory::float_to_f16(memory::f16_to_float(x[i]) / c);
      return;
    }
  }
  throw std::logic_error("divide: unknown dtype");
}

}  // namespace baton::transport::detail
