// Input staging: micro-batches written into pinned host buffers and copied to the device
// on a copy stream ahead of their use, so that loading overlaps compute. A ring of
// `depth` slots; each slot has a host and a device buffer per field (ids, targets, ...)
// and two events, ordered so that
// - the host does not overwrite a slot's host buffer while its last copy may still read
//   it (the host waits for the copy's event: with depth >= 2 that copy is long done);
// - the copy stream does not overwrite a slot's device buffer before the compute stream
//   has finished with the micro-batch that used it (the copy stream waits, on the GPU,
//   for the event release() recorded on the compute stream);
// - the compute stream does not read a micro-batch before its copy is done (acquire()
//   makes it wait for the copy's event, on the GPU).
// The streams and events are behind StagingBackend, so the ordering is tested on CPU with
// a simulation that runs the two streams in random interleavings
// (tests/cuda/test_input_staging.cpp); cuda_staging_backend() is the real one. The
// engine stages micro-batch i + depth - 1 while micro-batch i computes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "memory/tensor.h"

namespace baton::memory {

class StagingBackend {
 public:
  using Stream = void*;
  using Event = void*;
  virtual ~StagingBackend() = default;
  virtual Stream copy_stream() = 0;
  virtual Stream compute_stream() = 0;
  virtual Tensor host_buffer(const Shape& shape, DType dtype) = 0;    // pinned
  virtual Tensor device_buffer(const Shape& shape, DType dtype) = 0;  // on the device
  virtual Event make_event() = 0;
  virtual void destroy_event(Event e) = 0;
  virtual void record(Event e, Stream s) = 0;       // e completes when s reaches this point
  virtual void stream_wait(Stream s, Event e) = 0;  // s waits for e's last record (GPU-side)
  virtual void host_wait(Event e) = 0;              // the host waits for e's last record
  virtual void copy(Tensor& dst, const Tensor& src, Stream s) = 0;  // queued on s
};

// Pinned host buffers, device buffers and a copy stream of its own on CUDA device `device`
// (throws RuntimeError without one).
std::unique_ptr<StagingBackend> cuda_staging_backend(int device);

class InputStager {
 public:
  struct Field {
    Shape shape;
    DType dtype;
  };
  InputStager(std::unique_ptr<StagingBackend> backend, const std::vector<Field>& fields,
              int depth = 2);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Stages micro-batch `index` (0, 1, 2, ... in order): fill() writes its fields into the
  // slot's host buffers, then their copy is queued on the copy stream. At most `depth`
  // micro-batches may be staged and not yet released; another throws std::logic_error.
  void stage(int64_t index, const std::function<void(std::vector<Tensor>& host)>& fill);
  // Micro-batch `index`'s device tensors (it must be staged), with the compute stream
  // ordered after their copy. Valid until release(index).
  std::vector<Tensor> acquire(int64_t index);
  // The compute stream's work queued so far is the last to read `index`'s buffers.
  void release(int64_t index);

  int depth() const { return int(slots_.size()); }
  int64_t staged() const { return next_stage_; }      // micro-batches staged so far
  int64_t released() const { return next_release_; }  // micro-batches released so far

 private:
  struct Slot {
    std::vector<Tensor> host, device;
    StagingBackend::Event copied = nullptr, consumed = nullptr;
    bool copied_once = false, consumed_once = false;
    int64_t index = -1;
  };
  Slot& slot(int64_t index, const char* op);

  std::unique_ptr<StagingBackend> b_;
  std::vector<Slot> slots_;
  int64_t next_stage_ = 0, next_acquire_ = 0, next_release_ = 0;
};

}  // namespace baton::memory
