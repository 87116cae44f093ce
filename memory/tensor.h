// Tensor: a typed, strided view of a device buffer. Views (narrow, transpose, view)
// share the storage; contiguous() and clone() copy. Kernels take contiguous tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "memory/device.h"
#include "memory/dtype.h"

namespace baton::memory {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);    // BATON_CHECK that it fits in int64
// The element count, or none when a dimension is negative or the count overflows int64
// (shapes read from files).
std::optional<int64_t> checked_shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// Owns bytes on one device: from the device's allocator, or external memory released
// by a deleter (a memory-mapped file, a buffer another library owns).
class Storage {
 public:
  Storage(size_t bytes, Device device);
  Storage(void* data, size_t bytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  std::function<void(void*)> deleter_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // Wraps memory the tensor does not own; deleter (may be empty) runs when the last view goes.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::function<void(void*)> deleter = {});
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  // Host memory outside every allocator's accounting and cap: the staging buffers of
  // checkpoint and weight-file I/O, which on a GPU live on the host and are no part of the
  // device's budget (on the CPU backend, charging them would count a copy of the weights
  // against the cap the plan was sized for).
  static Tensor staging(const Shape& shape, DType dtype);
  // The staging bytes held now and the most held at once since reset_staging_peak()
  // (in_use and peak; nothing else is set): how much of the host checkpoint I/O takes,
  // which no allocator counts.
  static MemoryStats staging_stats();
  static void reset_staging_peak();

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  int64_t offset() const { return offset_; }  // in elements
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;  // first element
  template <class T>
  T* data() const;  // checks the dtype
  template <class T>
  std::vector<T> to_vector() const;  // CPU only; any strides
  template <class T>
  std::span<T> span() const;  // contiguous CPU tensors

  // Views.
  Tensor view(const Shape& shape) const;     // contiguous only; one dimension may be -1
  Tensor reshape(const Shape& shape) const;  // a view where possible, else a copy
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops the dimension
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& order) const;

  // Copies.
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;  // converts floats and ints; CPU only
  // A contiguous host copy in `dtype`, in staging() memory; itself when it is a contiguous
  // CPU tensor of that dtype already. Any device and strides.
  Tensor to_staging(DType dtype) const;
  void copy_from(const Tensor& src);  // same shape and dtype; any strides and devices
  void zero_();
  void fill_(double value);

  std::string str() const;  // "f32[2, 3] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::f32;
};

// Copies `rows` rows of `width` bytes between devices, row r from src + r * src_pitch to
// dst + r * dst_pitch (one row: a plain copy); the CUDA backend installs its own for
// non-CPU devices (cudaMemcpy2DAsync does the rows in one call).
struct RowCopy {
  void* dst;
  size_t dst_pitch;
  const void* src;
  size_t src_pitch;
  size_t width, rows;
};
using CopyFn = void (*)(const RowCopy& c, Device dst_dev, Device src_dev);
// Zeroes the rows at c.dst (c.src unused) on a device, in that device's stream order.
using ZeroFn = void (*)(const RowCopy& c, Device dev);
void register_copy(CopyFn copy, ZeroFn zero);
void copy_rows(const RowCopy& c, Device dst_dev, Device src_dev);
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

// A strided copy of `shape` as row copies: adjacent dimensions that are contiguous on both
// sides are merged, the innermost (unit stride on both, else one element wide) becomes a
// row, the next one the rows of a block, and `fn` gets one RowCopy per index of the rest.
// Strides in elements; dst and src point at the first element.
void for_each_row_block(const Shape& shape, const Shape& dst_strides, const Shape& src_strides,
                        size_t esize, char* dst, const char* src,
                        const std::function<void(const RowCopy&)>& fn);

// ---- template definitions ----

template <class T>
T* Tensor::data() const {
  if (dtype_of<T>() != dtype_)
    throw std::logic_error("Tensor::data<" + std::string(dtype_name(dtype_of<T>())) +
                           ">() on a tensor of " + std::string(dtype_name(dtype_)));
  return static_cast<T*>(raw_data());
}

template <class T>
std::span<T> Tensor::span() const {
  if (!is_contiguous() || !device().is_cpu())
    throw std::logic_error("Tensor::span() needs a contiguous CPU tensor, got " + str());
  return {data<T>(), size_t(numel())};
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  if (int64_t(values.size()) != shape_numel(shape))
    throw std::logic_error("from_vector: " + std::to_string(values.size()) + " values for shape " +
                           shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = device().is_cpu() ? contiguous() : to(Device::cpu());
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace baton::memory
