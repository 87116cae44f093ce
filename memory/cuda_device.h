// CUDA devices as the rest of baton sees them, without CUDA's headers: whether a device is
// there, the streams work runs on, events that order streams, and pinned host memory.
// Every function exists in every build; built without CUDA, device_count() is 0 and the
// others throw RuntimeError.
//
// Streams: each device has a compute stream (every kernel of kernels/cuda runs on the
// calling thread's current stream, the compute stream unless a StreamGuard says
// otherwise) and a communication stream (NCCL). Work on one is ordered after work on the
// other only through events, so communication overlaps compute.
#pragma once

#include <string>
#include <utility>

#include "memory/allocator.h"
#include "memory/tensor.h"

namespace baton::memory::cuda {

// True when baton was built with its CUDA backend.
bool built();
// The number of CUDA devices this process can use; 0 without the backend, a driver or
// a device.
int device_count();
// Why device_count() is 0, in words ("" when it is not).
std::string unavailable_reason();
// Throws RuntimeError unless `device` can hold tensors in this process: the CPU always;
// cuda:N when N < device_count(). Without a device the message starts "no CUDA device"
// and gives the driver's reason (unavailable_reason()).
void require_device(Device device);

// Installs the CUDA allocator factory and the host<->device copy (memory/tensor.h).
// Idempotent; allocator_for() calls it on the first CUDA device it meets.
void ensure_registered();

using StreamHandle = void*;  // a cudaStream_t

StreamHandle compute_stream(int device);
StreamHandle comm_stream(int device);
// The stream kernels on this device run on, for the calling thread.
StreamHandle current_stream(int device);

// A stream of its owner's own (each NCCL communicator's, the input copy stream),
// non-blocking, destroyed with the object after the work queued on it has finished.
class Stream {
 public:
  Stream(int device, bool high_priority);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle handle() const { return stream_; }
  int device() const { return device_; }

 private:
  int device_;
  StreamHandle stream_ = nullptr;
};

// Makes `stream` the calling thread's current stream on `device` for its lifetime.
class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  // Unused in builds without CUDA (clang's -Wunused-private-field).
  [[maybe_unused]] int device_;
  [[maybe_unused]] StreamHandle previous_;
};

// Makes `device` the calling thread's CUDA device for its lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;  // unused without CUDA
};

// Waits on the host until the calling thread's current stream of `device` is idle.
void synchronize(int device);

// A CUDA event on one device: record() on a stream, then let another stream wait for
// it (GPU-side, the host goes on) or wait on the host.
class Event {
 public:
  explicit Event(int device, bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(StreamHandle stream);
  void block(StreamHandle stream) const;  // `stream` waits for the recorded work
  bool query() const;                     // true once the recorded work is done
  void synchronize() const;               // host waits
  // Milliseconds between two recorded timing events.
  static float elapsed_ms(const Event& start, const Event& end);
  int device() const { return device_; }

 private:
  int device_;
  [[maybe_unused]] void* event_ = nullptr;  // a cudaEvent_t (unused without CUDA)
};

// Page-locked host memory: host<->device copies from and to it run at full PCIe/NVLink
// speed and asynchronously. Its own caching allocator (device cpu), kept apart from the
// process's ordinary host allocator.
Allocator& pinned_allocator();
// A CPU tensor in pinned memory, returned to the pinned pool when its last view goes.
Tensor pinned_empty(const Shape& shape, DType dtype);
// Copies contiguous tensors of equal size between any devices on `stream`, without
// waiting on the host. Both tensors' blocks are recorded on `stream` (record_stream), so
// the caller may drop them at once: their pools hand them out only after the copy.
void copy_async(Tensor& dst, const Tensor& src, StreamHandle stream);

// The tensor's block (device memory or a pinned buffer) is used on `stream`: when freed,
// its pool reuses it only after the work queued on `stream` until then has finished
// (CachingAllocator::record_stream). Needed for any stream but the device's compute
// stream; tensors not from baton's pools are left alone.
void record_stream(const Tensor& t, StreamHandle stream);

// A device's total and free bytes now (cudaMemGetInfo), and its name.
std::pair<size_t, size_t> memory_info(int device);
std::string device_name(int device);

}  // namespace baton::memory::cuda
