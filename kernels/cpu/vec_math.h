// Branch-free exp and tanh that the compiler vectorises (-O3): float uses a Cephes-style
// polynomial (relative error about 2e-7, a couple of ulp); double calls std::exp, since
// f64 is the reference path and must be exact rather than fast.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace baton::kernels::cpu {

// exp(x) for float; inputs below about -87.9 give 0 and above 88.37 saturate at e^88.37
// (softmax-style callers only pass x <= 0).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -88.0f), 88.37f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n in [-127, 127]: n = -127 builds the bit pattern 0, i.e. exp underflows to 0.
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

template <class T>
inline T vexp(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_approx(x);
  else
    return std::exp(x);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); saturates correctly at both ends.
template <class T>
inline T vtanh(T u) {
  if constexpr (std::is_same_v<T, float>)
    return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f);
  else
    return std::tanh(u);
}

}  // namespace baton::kernels::cpu
