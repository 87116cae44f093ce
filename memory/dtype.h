// Element types of tensors, their sizes and names, and conversions of the 16-bit floats.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace baton::memory {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
// Accepts baton's names and the safetensors names ("F32", "BF16", "I64", ...).
// Throws InputError naming the text otherwise.
DType parse_dtype(std::string_view name);
std::string_view safetensors_dtype_name(DType t);  // "F32", "BF16", ...
bool is_floating(DType t);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}

// bfloat16: the top 16 bits of a float32, rounded to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(uint32_t(h) << 16);
}

// IEEE half precision, round to nearest even; overflow goes to infinity.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace baton::memory
