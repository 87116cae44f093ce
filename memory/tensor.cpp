#include "memory/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>

#include "memory/cuda_device.h"
#include "memory/error.h"

namespace baton::memory {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::optional<int64_t> checked_shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

int64_t shape_numel(const Shape& s) {
  // Signed overflow is undefined: a shape read from a file had wrapped to a small count
  // that passed the checks made with it.
  int64_t n = 1;
  for (int64_t d : s)
    BATON_CHECK(!__builtin_mul_overflow(n, d, &n),
                "the element count of " + shape_str(s) + " overflows int64");
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

// ---- Storage ----

Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(bytes);
}

Storage::Storage(void* data, size_t bytes, Device device, std::function<void(void*)> deleter)
    : data_(data), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (allocator_ != nullptr)
    allocator_->deallocate(data_, bytes_);
  else if (deleter_)
    deleter_(data_);
}

// ---- copies between devices ----

namespace {
std::atomic<CopyFn> g_copy{nullptr};
std::atomic<ZeroFn> g_zero{nullptr};

// The backend of a non-CPU device, registered on first use.
void need_backend(Device dev) {
  if (g_copy.load() == nullptr && dev.is_cuda())
    cuda::ensure_registered();  // memory that came from outside the allocator (from_blob)
}
}  // namespace

void register_copy(CopyFn copy, ZeroFn zero) {
  g_zero.store(zero);
  g_copy.store(copy);
}

void copy_rows(const RowCopy& c, Device dst_dev, Device src_dev) {
  if (c.width == 0 || c.rows == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    for (size_t r = 0; r < c.rows; ++r)
      std::memcpy(static_cast<char*>(c.dst) + r * c.dst_pitch,
                  static_cast<const char*>(c.src) + r * c.src_pitch, c.width);
    return;
  }
  need_backend(dst_dev.is_cpu() ? src_dev : dst_dev);
  CopyFn fn = g_copy.load();
  if (fn == nullptr)
    throw RuntimeError("cannot copy between " + src_dev.str() + " and " + dst_dev.str() +
                       ": no backend for that device is loaded");
  fn(c, dst_dev, src_dev);
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  copy_rows({dst, bytes, src, bytes, bytes, 1}, dst_dev, src_dev);
}

void for_each_row_block(const Shape& shape, const Shape& dst_strides, const Shape& src_strides,
                        size_t esize, char* dst, const char* src,
                        const std::function<void(const RowCopy&)>& fn) {
  struct Dim {
    int64_t n, ds, ss;
  };
  std::vector<Dim> dims;  // innermost first, size-1 dimensions dropped, contiguous runs merged
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return;
    if (shape[i] == 1) continue;
    Dim d{shape[i], dst_strides[i], src_strides[i]};
    if (!dims.empty()) {
      Dim& in = dims.back();
      if (d.ds == in.n * in.ds && d.ss == in.n * in.ss) {
        in.n *= d.n;
        continue;
      }
    }
    dims.push_back(d);
  }
  size_t next = 0;  // the first dimension not yet in the row block
  RowCopy c{dst, esize, src, esize, esize, 1};
  if (next < dims.size() && dims[next].ds == 1 && dims[next].ss == 1)
    c.width = size_t(dims[next++].n) * esize;
  // The rows of a block: only when rows do not overlap on either side (a broadcast source
  // has stride 0; a 2-D copy needs pitches of at least the width).
  if (next < dims.size() && size_t(dims[next].ds) * esize >= c.width &&
      size_t(dims[next].ss) * esize >= c.width) {
    c.rows = size_t(dims[next].n);
    c.dst_pitch = size_t(dims[next].ds) * esize;
    c.src_pitch = size_t(dims[next].ss) * esize;
    ++next;
  } else {
    c.dst_pitch = c.src_pitch = c.width;
  }
  std::vector<int64_t> index(dims.size(), 0);
  for (;;) {
    int64_t od = 0, os = 0;
    for (size_t k = next; k < dims.size(); ++k)
      od += index[k] * dims[k].ds, os += index[k] * dims[k].ss;
    RowCopy b = c;
    b.dst = dst + od * int64_t(esize);
    b.src = src + os * int64_t(esize);
    fn(b);
    size_t k = next;
    for (; k < dims.size(); ++k) {
      if (++index[k] < dims[k].n) break;
      index[k] = 0;
    }
    if (k == dims.size()) return;
  }
}

// ---- Tensor ----

namespace {

void check_shape(const Shape& shape) {
  for (int64_t d : shape)
    if (d < 0) throw std::logic_error("negative dimension in shape " + shape_str(shape));
}

// The bytes of a shape's elements: the count times the element's size can wrap where the
// count fits (2^62 floats had made a tensor of 0 bytes, written past its block).
size_t shape_bytes(const Shape& shape, DType dtype) {
  check_shape(shape);
  size_t bytes = 0;
  BATON_CHECK(!__builtin_mul_overflow(size_t(shape_numel(shape)), dtype_size(dtype), &bytes) &&
                  bytes <= size_t(INT64_MAX),
              "the bytes of " + shape_str(shape) + " in " + std::string(dtype_name(dtype)) +
                  " overflow int64");
  return bytes;
}

int64_t wrap_dim(int64_t d, int64_t rank) {
  int64_t w = d < 0 ? d + rank : d;
  if (w < 0 || w >= rank)
    throw std::logic_error("dimension " + std::to_string(d) + " out of range for rank " +
                           std::to_string(rank));
  return w;
}

double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f64:
      return static_cast<const double*>(p)[i];
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      return double(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = float(v);
      break;
    case DType::f64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(float(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = float_to_f16(float(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      break;
  }
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(shape_bytes(shape, dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::function<void(void*)> deleter) {
  Tensor t;
  t.storage_ =
      std::make_shared<Storage>(data, shape_bytes(shape, dtype), device, std::move(deleter));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

namespace {
std::mutex staging_mu;
MemoryStats staging_held;  // in_use and peak only
}  // namespace

Tensor Tensor::staging(const Shape& shape, DType dtype) {
  const size_t bytes = shape_bytes(shape, dtype);
  const size_t held = std::max(Allocator::rounded(bytes), Allocator::alignment());
  void* p = std::aligned_alloc(Allocator::alignment(), held);
  if (p == nullptr)  // the host allocator's tensors in use beside it
    throw OutOfMemoryError(Device::cpu(), bytes, 0, allocator_for(Device::cpu()).stats().in_use);
  {
    std::lock_guard lock(staging_mu);
    staging_held.in_use += held;
    staging_held.peak = std::max(staging_held.peak, staging_held.in_use);
  }
  return from_blob(p, shape, dtype, Device::cpu(), [held](void* q) {
    std::free(q);
    std::lock_guard lock(staging_mu);
    staging_held.in_use -= held;
  });
}

MemoryStats Tensor::staging_stats() {
  std::lock_guard lock(staging_mu);
  return staging_held;
}

void Tensor::reset_staging_peak() {
  std::lock_guard lock(staging_mu);
  staging_held.peak = staging_held.in_use;
}

int64_t Tensor::size(int64_t d) const {
  return shape_[size_t(wrap_dim(d, dim()))];
}

bool Tensor::is_contiguous() const {
  // No elements: nothing out of place (a narrow to 0 columns had not been, so its view() and
  // span() threw).
  for (int64_t d : shape_)
    if (d == 0) return true;
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) throw std::logic_error("data access on an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  if (!is_contiguous()) throw std::logic_error("view() of a non-contiguous tensor " + str());
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw std::logic_error("view(): more than one -1 in " + shape_str(shape));
      infer = int64_t(i);
    } else {
      if (s[i] < 0)
        throw std::logic_error("view(): negative size " + std::to_string(s[i]) + " in " +
                               shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) s[size_t(infer)] = known == 0 ? 0 : numel() / known;
  if (shape_numel(s) != numel())
    throw std::logic_error("view(): cannot view " + str() + " as " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim());
  if (start < 0 || length < 0 || start > shape_[size_t(d)] || length > shape_[size_t(d)] - start)
    throw std::logic_error("narrow(" + std::to_string(d) + ", " + std::to_string(start) + ", " +
                           std::to_string(length) + ") out of range for " + str());
  Tensor t = *this;
  t.offset_ += start * strides_[size_t(d)];
  t.shape_[size_t(d)] = length;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim());
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim());
  d1 = wrap_dim(d1, dim());
  Tensor t = *this;
  std::swap(t.shape_[size_t(d0)], t.shape_[size_t(d1)]);
  std::swap(t.strides_[size_t(d0)], t.strides_[size_t(d1)]);
  return t;
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  if (int64_t(order.size()) != dim()) throw std::logic_error("permute(): wrong number of dims");
  Tensor t = *this;
  std::vector<bool> seen(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    int64_t d = wrap_dim(order[i], dim());
    if (seen[size_t(d)]) throw std::logic_error("permute(): repeated dimension");
    seen[size_t(d)] = true;
    t.shape_[i] = shape_[size_t(d)];
    t.strides_[i] = strides_[size_t(d)];
  }
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = contiguous();
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.raw_data(), device, src.raw_data(), src.device(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  if (!device().is_cpu()) throw std::logic_error("Tensor::to(dtype) is CPU only; got " + str());
  Tensor src = contiguous();
  Tensor t = empty(shape_, dtype, device());
  const void* s = src.raw_data();
  void* d = t.raw_data();
  for (int64_t i = 0, n = numel(); i < n; ++i)
    store_from_double(d, dtype, i, load_as_double(s, dtype_, i));
  return t;
}

Tensor Tensor::to_staging(DType dtype) const {
  Tensor host = *this;
  if (!device().is_cpu() || !is_contiguous()) {
    host = staging(shape_, dtype_);
    host.copy_from(*this);
  }
  if (dtype == dtype_) return host;
  Tensor t = staging(shape_, dtype);
  const void* s = host.raw_data();
  void* d = t.raw_data();
  for (int64_t i = 0, n = numel(); i < n; ++i)
    store_from_double(d, dtype, i, load_as_double(s, dtype_, i));
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw std::logic_error("copy_from(): " + src.str() + " into " + str());
  if (numel() == 0) return;
  if (is_contiguous() && src.is_contiguous()) {
    copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
    return;
  }
  // Row blocks: a narrowed view (a column range of a fused qkv, a tile's rows) is one 2-D
  // copy on a device and a memcpy per row on the host; other layouts, a few blocks.
  for_each_row_block(shape_, strides_, src.strides_, dtype_size(dtype_),
                     static_cast<char*>(raw_data()), static_cast<const char*>(src.raw_data()),
                     [&](const RowCopy& c) { copy_rows(c, device(), src.device()); });
}

void Tensor::zero_() {
  fill_(0.0);
}

void Tensor::fill_(double value) {
  if (numel() == 0) return;
  if (!device().is_cpu()) {
    need_backend(device());
    if (ZeroFn zero = g_zero.load(); value == 0.0 && zero != nullptr) {
      // On the device (a memset): a host buffer of zeros copied in would cost its whole
      // size in host memory and bandwidth, every step for a gradient accumulator.
      for_each_row_block(shape_, strides_, strides_, dtype_size(dtype_),
                         static_cast<char*>(raw_data()), static_cast<const char*>(raw_data()),
                         [&](const RowCopy& c) { zero(c, device()); });
      return;
    }
    Tensor host = full(shape_, value, dtype_, Device::cpu());
    copy_from(host);
    return;
  }
  if (is_contiguous() && value == 0.0) {
    std::memset(raw_data(), 0, nbytes());
    return;
  }
  // One element converted, then replicated through a copy of a broadcast view.
  Tensor one = empty({1}, dtype_);
  store_from_double(one.raw_data(), dtype_, 0, value);
  Tensor b = one;
  b.shape_ = shape_;
  b.strides_.assign(shape_.size(), 0);
  copy_from(b);
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device().str();
}

}  // namespace baton::memory
