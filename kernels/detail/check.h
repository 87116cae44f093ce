// Argument checks shared by the ops' dispatch (kernels/ops.cpp): every backend receives
// tensors whose shapes, dtypes and devices have already been checked here. A failed
// check is a bug in the caller (the graph code), so it throws std::invalid_argument
// naming the op, the argument, what was expected and what was found.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "memory/error.h"
#include "memory/tensor.h"

namespace baton::kernels::detail {

using memory::DType;
using memory::Shape;
using memory::Tensor;

[[noreturn]] inline void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string("kernels::") + op + ": " + msg);
}

// Checks cond; the message is only built when it fails, so a passing check allocates
// nothing (kernels run many times per step).
#define BATON_NEED(cond, op, msg)                             \
  do {                                                        \
    if (!(cond)) ::baton::kernels::detail::fail((op), (msg)); \
  } while (0)

// Defined and contiguous.
inline void check_tensor(const char* op, const char* name, const Tensor& t) {
  BATON_NEED(t.defined(), op, std::string(name) + " is undefined");
  BATON_NEED(t.is_contiguous(), op, std::string(name) + " must be contiguous, got " + t.str());
}

// CUDA tensors may also be bf16 or f16 (the CUDA backend checks its exact combinations).
inline void check_float(const char* op, const char* name, const Tensor& t) {
  check_tensor(op, name, t);
  const bool half = t.device().is_cuda() && (t.dtype() == DType::bf16 || t.dtype() == DType::f16);
  BATON_NEED(t.dtype() == DType::f32 || t.dtype() == DType::f64 || half, op,
             std::string(name) + " must be f32 or f64" +
                 (t.device().is_cuda() ? " (or bf16, f16)" : "") + ", got " + t.str());
}

inline void check_ids(const char* op, const char* name, const Tensor& t) {
  check_tensor(op, name, t);
  BATON_NEED(t.dtype() == DType::i32 || t.dtype() == DType::i64, op,
             std::string(name) + " must be i32 or i64, got " + t.str());
}

// `t` is a float tensor of `like`'s dtype.
inline void check_like(const char* op, const char* name, const Tensor& t, const char* like_name,
                       const Tensor& like) {
  check_float(op, name, t);
  // Mixed precision on CUDA (bf16 activations beside f32 statistics, master weights and
  // gradient accumulators): kernels/cuda/ops_cuda.h lists the allowed pairs and checks them.
  if (t.device().is_cuda() && like.device().is_cuda()) return;
  BATON_NEED(t.dtype() == like.dtype(), op,
             std::string(name) + " must have the dtype of " + like_name + " (" + like.str() +
                 "), got " + t.str());
}

inline bool shape_is(const Tensor& t, std::initializer_list<int64_t> dims) {
  return std::equal(t.shape().begin(), t.shape().end(), dims.begin(), dims.end());
}

// t has exactly these dimensions.
inline void check_dims(const char* op, const char* name, const Tensor& t,
                       std::initializer_list<int64_t> dims) {
  BATON_NEED(shape_is(t, dims), op,
             std::string(name) + " must have shape " + memory::shape_str(Shape(dims)) + ", got " +
                 t.str());
}

// t has ref's shape.
inline void check_same_shape(const char* op, const char* name, const Tensor& t,
                             const char* ref_name, const Tensor& ref) {
  BATON_NEED(t.shape() == ref.shape(), op,
             std::string(name) + " must have the shape of " + ref_name + " (" + ref.str() +
                 "), got " + t.str());
}

// t has ref's leading dimensions (all but ref's last `drop`) followed by `tail`.
inline void check_leading_then(const char* op, const char* name, const Tensor& t,
                               const char* ref_name, const Tensor& ref, int64_t drop,
                               std::initializer_list<int64_t> tail) {
  const int64_t lead = ref.dim() - drop;
  bool ok = lead >= 0 && t.dim() == lead + int64_t(tail.size()) &&
            std::equal(ref.shape().begin(), ref.shape().begin() + lead, t.shape().begin()) &&
            std::equal(tail.begin(), tail.end(), t.shape().begin() + lead);
  BATON_NEED(ok, op, [&] {
    Shape want(ref.shape().begin(), ref.shape().begin() + std::max<int64_t>(lead, 0));
    want.insert(want.end(), tail.begin(), tail.end());
    return std::string(name) + " must have shape " + memory::shape_str(want) + " (from " +
           ref_name + " " + ref.str() + "), got " + t.str();
  }());
}

inline void check_numel(const char* op, const char* name, const Tensor& t, int64_t want) {
  BATON_NEED(
      t.numel() == want, op,
      std::string(name) + " must have " + std::to_string(want) + " elements, got " + t.str());
}

// At least one dimension; returns the last.
inline int64_t last_dim(const char* op, const char* name, const Tensor& t) {
  BATON_NEED(t.dim() >= 1, op,
             std::string(name) + " must have at least one dimension, got " + t.str());
  return t.size(-1);
}

// The byte ranges of two (contiguous) tensors intersect.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Every defined tensor lives on one device; returns it.
inline memory::Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (first == nullptr)
      first = t;
    else
      BATON_NEED(t->device() == first->device(), op,
                 "tensors on different devices: " + first->str() + " and " + t->str());
  }
  return first != nullptr ? first->device() : memory::Device::cpu();
}

[[noreturn]] inline void no_cuda(const char* op, memory::Device d) {
  throw RuntimeError(std::string("kernels::") + op + ": tensors on " + d.str() +
                     " but this build of baton has no CUDA kernels (configure with a CUDA "
                     "toolkit and the kernels/cuda backend)");
}

// Calls f(T{}) with T = float or double for the dtype.
template <class F>
decltype(auto) on_float(const char* op, DType dt, F&& f) {
  if (dt == DType::f32) return f(float{});
  if (dt == DType::f64) return f(double{});
  fail(op, "unsupported dtype " + std::string(memory::dtype_name(dt)));
}

// Calls f(I{}) with I = int32_t or int64_t for the dtype.
template <class F>
decltype(auto) on_index(const char* op, DType dt, F&& f) {
  if (dt == DType::i32) return f(int32_t{});
  if (dt == DType::i64) return f(int64_t{});
  fail(op, "unsupported id dtype " + std::string(memory::dtype_name(dt)));
}

}  // namespace baton::kernels::detail
