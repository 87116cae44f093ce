#include "memory/cuda_device.h"

#include "memory/error.h"

#ifdef BATON_HAVE_CUDA

#include <array>
#include <cstring>
#include <mutex>

#include "memory/caching_allocator.h"
#include "memory/cuda_check.h"

namespace baton::memory::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int count = 0;
  std::string reason;
};

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    cudaError_t err = cudaGetDeviceCount(&d.count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // a missing driver is not an error of later calls
      d.count = 0;
      d.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                 cudaGetErrorString(err);
    } else if (d.count == 0) {
      d.reason = "no CUDA device";
    }
    return d;
  }();
  return info;
}

void check_device(int device) {
  if (device < 0 || device >= device_count())
    throw RuntimeError("CUDA device " + std::to_string(device) + " does not exist (" +
                       std::to_string(device_count()) + " present" +
                       (unavailable_reason().empty() ? "" : ": " + unavailable_reason()) + ")");
}

struct Streams {
  std::mutex mu;
  std::array<cudaStream_t, kMaxDevices> compute{}, comm{};
};

Streams& streams() {
  static Streams* s = new Streams();  // never destroyed: streams die with the process
  return *s;
}

cudaStream_t make_stream(int device, bool high_priority) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  BATON_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  BATON_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least));
  return s;
}

thread_local std::array<cudaStream_t, kMaxDevices> t_current{};

// The device a stream belongs to (events must be made on it).
int stream_device(cudaStream_t s) {
  int d = -1;
#if CUDART_VERSION >= 12080
  BATON_CUDA_CHECK(cudaStreamGetDevice(s, &d));
#else
  (void)s;
  BATON_CUDA_CHECK(cudaGetDevice(&d));
#endif
  return d;
}

// The events of the caching allocators' stream bookkeeping.
void* record_on(cudaStream_t s) {
  DeviceGuard guard(stream_device(s));
  cudaEvent_t e = nullptr;
  BATON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  BATON_CUDA_CHECK(cudaEventRecord(e, s));
  return e;
}
bool event_finished(void* e) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  BATON_CUDA_CHECK(err);
  return true;
}

// ---- raw memory sources of the caching allocators ----

class DeviceMemory final : public RawMemory {
 public:
  explicit DeviceMemory(int device) : device_(device) {}
  void* allocate(size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    BATON_CUDA_CHECK(err);
    return p;
  }
  void free(void* ptr) override {
    DeviceGuard guard(device_);
    BATON_CUDA_CHECK(cudaFree(ptr));
  }
  void synchronize() override {
    DeviceGuard guard(device_);
    BATON_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void* home_stream() override { return compute_stream(device_); }
  void* record_event(void* stream) override { return record_on(static_cast<cudaStream_t>(stream)); }
  bool event_done(void* e) override { return event_finished(e); }
  void destroy_event(void* e) override { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  std::pair<size_t, size_t> total_and_free() const override {
    DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return {0, 0};
    }
    return {total, free};
  }

 private:
  int device_;
};

class PinnedMemory final : public RawMemory {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    BATON_CUDA_CHECK(err);
    return p;
  }
  void free(void* ptr) override { BATON_CUDA_CHECK(cudaFreeHost(ptr)); }
  // No home stream: the host reuses a buffer at once, so every DMA's stream is recorded.
  void* record_event(void* stream) override { return record_on(static_cast<cudaStream_t>(stream)); }
  bool event_done(void* e) override { return event_finished(e); }
  void destroy_event(void* e) override { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  void synchronize() override {
    for (int d = 0; d < device_count(); ++d) {
      DeviceGuard guard(d);
      BATON_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
};

Allocator* make_device_allocator(int index) {
  if (index < 0 || index >= device_count()) return nullptr;
  return new CachingAllocator(Device::cuda(index), std::make_unique<DeviceMemory>(index));
}

// The copy behind Tensor::to() and copy_from(): synchronous for the host, as a memcpy is.
// Device-to-device copies on one device stay on the stream (stream order suffices). Rows
// of a strided view are one cudaMemcpy2DAsync.
void copy(const RowCopy& c, Device dst_dev, Device src_dev) {
  auto queue = [&c](cudaMemcpyKind kind, cudaStream_t s) {
    if (c.rows == 1)
      BATON_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.width, kind, s));
    else
      BATON_CUDA_CHECK(
          cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.rows, kind, s));
  };
  if (dst_dev.is_cuda() && src_dev.is_cuda()) {
    if (dst_dev.index == src_dev.index) {
      DeviceGuard guard(dst_dev.index);
      queue(cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(current_stream(dst_dev.index)));
      return;
    }
    synchronize(src_dev.index);
    DeviceGuard guard(dst_dev.index);
    auto s = static_cast<cudaStream_t>(current_stream(dst_dev.index));
    if (c.rows == 1)
      BATON_CUDA_CHECK(cudaMemcpyPeerAsync(c.dst, dst_dev.index, c.src, src_dev.index, c.width, s));
    else
      queue(cudaMemcpyDefault, s);  // unified addressing reaches the peer's memory
    BATON_CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  int dev = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  DeviceGuard guard(dev);
  auto s = static_cast<cudaStream_t>(current_stream(dev));
  queue(cudaMemcpyDefault, s);
  BATON_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Zeroing on the device's current stream, like the kernels that use the memory next.
void zero(const RowCopy& c, Device dev) {
  DeviceGuard guard(dev.index);
  auto s = static_cast<cudaStream_t>(current_stream(dev.index));
  if (c.rows == 1)
    BATON_CUDA_CHECK(cudaMemsetAsync(c.dst, 0, c.width, s));
  else
    BATON_CUDA_CHECK(cudaMemset2DAsync(c.dst, c.dst_pitch, 0, c.width, c.rows, s));
}

}  // namespace

bool built() {
  return true;
}
int device_count() {
  return device_info().count;
}
std::string unavailable_reason() {
  return device_info().reason;
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_allocator_factory(DeviceType::cuda, &make_device_allocator);
    register_copy(&copy, &zero);
  });
}

StreamHandle compute_stream(int device) {
  check_device(device);
  Streams& s = streams();
  std::lock_guard lock(s.mu);
  if (s.compute[size_t(device)] == nullptr) s.compute[size_t(device)] = make_stream(device, false);
  return s.compute[size_t(device)];
}

StreamHandle comm_stream(int device) {
  check_device(device);
  Streams& s = streams();
  std::lock_guard lock(s.mu);
  // Higher priority, so that a transfer waiting on the critical path is not queued
  // behind a long stretch of compute kernels.
  if (s.comm[size_t(device)] == nullptr) s.comm[size_t(device)] = make_stream(device, true);
  return s.comm[size_t(device)];
}

StreamHandle current_stream(int device) {
  check_device(device);
  cudaStream_t s = t_current[size_t(device)];
  return s != nullptr ? s : compute_stream(device);
}

Stream::Stream(int device, bool high_priority) : device_(device) {
  check_device(device);
  stream_ = make_stream(device, high_priority);
}

Stream::~Stream() {
  if (stream_ == nullptr) return;
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (previous >= 0) (void)cudaSetDevice(previous);
}

StreamGuard::StreamGuard(int device, StreamHandle stream)
    : device_(device), previous_(t_current.at(size_t(device))) {
  t_current[size_t(device)] = static_cast<cudaStream_t>(stream);
}

StreamGuard::~StreamGuard() {
  t_current[size_t(device_)] = static_cast<cudaStream_t>(previous_);
}

DeviceGuard::DeviceGuard(int device) {
  BATON_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) BATON_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

void synchronize(int device) {
  DeviceGuard guard(device);
  BATON_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(current_stream(device))));
}

Event::Event(int device, bool timing) : device_(device) {
  check_device(device);
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  BATON_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  event_ = e;
}

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void Event::record(StreamHandle stream) {
  DeviceGuard guard(device_);
  BATON_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)));
}

void Event::block(StreamHandle stream) const {
  BATON_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0));
}

bool Event::query() const {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  BATON_CUDA_CHECK(err);
  return true;
}

void Event::synchronize() const {
  BATON_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  BATON_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                        static_cast<cudaEvent_t>(end.event_)));
  return ms;
}

Allocator& pinned_allocator() {
  static CachingAllocator* a =
      new CachingAllocator(Device::cpu(), std::make_unique<PinnedMemory>());
  return *a;
}

Tensor pinned_empty(const Shape& shape, DType dtype) {
  size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  Allocator& a = pinned_allocator();
  void* p = a.allocate(bytes);
  return Tensor::from_blob(p, shape, dtype, Device::cpu(),
                           [&a, bytes](void* q) { a.deallocate(q, bytes); });
}

void copy_async(Tensor& dst, const Tensor& src, StreamHandle stream) {
  if (dst.nbytes() != src.nbytes() || !dst.is_contiguous() || !src.is_contiguous())
    throw std::logic_error("copy_async: " + src.str() + " into " + dst.str() +
                           " (contiguous tensors of one size expected)");
  if (dst.nbytes() == 0) return;
  Device d = dst.device().is_cuda() ? dst.device() : src.device();
  if (d.is_cpu()) {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  DeviceGuard guard(d.index);
  BATON_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault,
                                   static_cast<cudaStream_t>(stream)));
  // Neither buffer goes back to its pool before the copy has passed.
  record_stream(dst, stream);
  record_stream(src, stream);
}

void record_stream(const Tensor& t, StreamHandle stream) {
  if (!t.defined() || t.storage() == nullptr) return;
  void* base = t.storage()->data();
  // Both pools are CachingAllocators (make_device_allocator, pinned_allocator).
  Allocator& a = t.device().is_cuda() ? allocator_for(t.device()) : pinned_allocator();
  if (auto* c = dynamic_cast<CachingAllocator*>(&a)) (void)c->record_stream(base, stream);
}

std::pair<size_t, size_t> memory_info(int device) {
  check_device(device);
  DeviceGuard guard(device);
  size_t free = 0, total = 0;
  BATON_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {total, free};
}

std::string device_name(int device) {
  check_device(device);
  cudaDeviceProp prop{};
  BATON_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace baton::memory::cuda

#else  // built without CUDA

namespace baton::memory::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw RuntimeError(std::string(what) + ": baton was built without its CUDA backend");
}
}  // namespace

bool built() {
  return false;
}
int device_count() {
  return 0;
}
std::string unavailable_reason() {
  return "baton was built without its CUDA backend";
}
void ensure_registered() {}
StreamHandle compute_stream(int) {
  no_cuda("compute_stream");
}
StreamHandle comm_stream(int) {
  no_cuda("comm_stream");
}
StreamHandle current_stream(int) {
  no_cuda("current_stream");
}
Stream::Stream(int, bool) : device_(0) {
  no_cuda("Stream");
}
Stream::~Stream() = default;
StreamGuard::StreamGuard(int, StreamHandle) : device_(0), previous_(nullptr) {
  no_cuda("StreamGuard");
}
StreamGuard::~StreamGuard() = default;
DeviceGuard::DeviceGuard(int) {
  no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;
void synchronize(int) {
  no_cuda("synchronize");
}
Event::Event(int, bool) : device_(0) {
  no_cuda("Event");
}
Event::~Event() = default;
void Event::record(StreamHandle) {
  no_cuda("Event::record");
}
void Event::block(StreamHandle) const {
  no_cuda("Event::block");
}
bool Event::query() const {
  no_cuda("Event::query");
}
void Event::synchronize() const {
  no_cuda("Event::synchronize");
}
float Event::elapsed_ms(const Event&, const Event&) {
  no_cuda("Event::elapsed_ms");
}
Allocator& pinned_allocator() {
  no_cuda("pinned_allocator");
}
Tensor pinned_empty(const Shape&, DType) {
  no_cuda("pinned_empty");
}
void copy_async(Tensor&, const Tensor&, StreamHandle) {
  no_cuda("copy_async");
}
void record_stream(const Tensor&, StreamHandle) {
  no_cuda("record_stream");
}
std::pair<size_t, size_t> memory_info(int) {
  no_cuda("memory_info");
}
std::string device_name(int) {
  no_cuda("device_name");
}

}  // namespace baton::memory::cuda

#endif

namespace baton::memory::cuda {

void require_device(Device device) {
  if (device.is_cpu()) return;
  const int n = device_count();
  if (n == 0)
    throw RuntimeError("no CUDA device for " + device.str() + ": " + unavailable_reason());
  if (device.index >= n)
    throw RuntimeError(device.str() + ": no such CUDA device (" + std::to_string(n) +
                       " present, cuda:0 to cuda:" + std::to_string(n - 1) + ")");
}

}  // namespace baton::memory::cuda
