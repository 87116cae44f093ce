#include "memory/input_staging.h"

#include <stdexcept>
#include <string>

#include "memory/cuda_device.h"

namespace baton::memory {

namespace {

class CudaStaging final : public StagingBackend {
 public:
  explicit CudaStaging(int device) : device_(device), copy_(device, false) {}
  Stream copy_stream() override { return copy_.handle(); }
  Stream compute_stream() override { return cuda::compute_stream(device_); }
  Tensor host_buffer(const Shape& shape, DType dtype) override {
    return cuda::pinned_empty(shape, dtype);
  }
  Tensor device_buffer(const Shape& shape, DType dtype) override {
    return Tensor::empty(shape, dtype, Device::cuda(device_));
  }
  Event make_event() override { return new cuda::Event(device_); }
  void destroy_event(Event e) override { delete static_cast<cuda::Event*>(e); }
  void record(Event e, Stream s) override { static_cast<cuda::Event*>(e)->record(s); }
  void stream_wait(Stream s, Event e) override { static_cast<cuda::Event*>(e)->block(s); }
  void host_wait(Event e) override { static_cast<cuda::Event*>(e)->synchronize(); }
  void copy(Tensor& dst, const Tensor& src, Stream s) override { cuda::copy_async(dst, src, s); }

 private:
  int device_;
  cuda::Stream copy_;  // the input copies' own stream (normal priority: not the critical path)
};

}  // namespace

std::unique_ptr<StagingBackend> cuda_staging_backend(int device) {
  return std::make_unique<CudaStaging>(device);
}

InputStager::InputStager(std::unique_ptr<StagingBackend> backend, const std::vector<Field>& fields,
                         int depth)
    : b_(std::move(backend)) {
  if (depth < 1)
    throw std::logic_error("InputStager: depth " + std::to_string(depth) + " (at least 1)");
  slots_.resize(size_t(depth));
  for (Slot& s : slots_) {
    for (const Field& f : fields) {
      s.host.push_back(b_->host_buffer(f.shape, f.dtype));
      s.device.push_back(b_->device_buffer(f.shape, f.dtype));
    }
    s.copied = b_->make_event();
    s.consumed = b_->make_event();
    // The caching allocator hands out a block freed on the compute stream as soon as it is
    // freed, its last kernels maybe still queued there: the slot's first copy waits for
    // them as later copies wait for the slot's release.
    b_->record(s.consumed, b_->compute_stream());
    s.consumed_once = true;
  }
}

InputStager::~InputStager() {
  // The copies may still be running: wait for them before the buffers go. A device in an
  // error state (a kernel fault being unwound) fails the wait: nothing to wait for then,
  // and a destructor must not throw over the error that is propagating.
  for (Slot& s : slots_) {
    try {
      if (s.copied_once) b_->host_wait(s.copied);
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
    }
    b_->destroy_event(s.copied);
    b_->destroy_event(s.consumed);
  }
}

InputStager::Slot& InputStager::slot(int64_t index, const char* op) {
  Slot& s = slots_[size_t(index % int64_t(slots_.size()))];
  if (s.index != index)
    throw std::logic_error(std::string("InputStager::") + op + ": micro-batch " +
                           std::to_string(index) + " is not staged");
  return s;
}

void InputStager::stage(int64_t index, const std::function<void(std::vector<Tensor>& host)>& fill) {
  if (index != next_stage_)
    throw std::logic_error("InputStager::stage: micro-batch " + std::to_string(index) + " where " +
                           std::to_string(next_stage_) + " comes next");
  if (index - next_release_ >= int64_t(slots_.size()))
    throw std::logic_error("InputStager::stage: micro-batch " + std::to_string(index) +
                           " would overwrite " + std::to_string(index - int64_t(slots_.size())) +
                           ", which is not released yet (depth " + std::to_string(slots_.size()) +
                           ")");
  Slot& s = slots_[size_t(index % int64_t(slots_.size()))];
  if (s.copied_once) b_->host_wait(s.copied);  // the last DMA out of s.host is done
  fill(s.host);
  StagingBackend::Stream cs = b_->copy_stream();
  if (s.consumed_once) b_->stream_wait(cs, s.consumed);  // the compute stream is done with s.device
  for (size_t f = 0; f < s.host.size(); ++f) b_->copy(s.device[f], s.host[f], cs);
  b_->record(s.copied, cs);
  s.copied_once = true;
  s.index = index;
  next_stage_++;
}

std::vector<Tensor> InputStager::acquire(int64_t index) {
  Slot& s = slot(index, "acquire");
  if (index != next_acquire_ && index != next_acquire_ - 1)
    throw std::logic_error("InputStager::acquire: micro-batch " + std::to_string(index) +
                           " where " + std::to_string(next_acquire_) + " comes next");
  b_->stream_wait(b_->compute_stream(), s.copied);
  if (index == next_acquire_) next_acquire_++;
  return s.device;
}

void InputStager::release(int64_t index) {
  Slot& s = slot(index, "release");
  if (index != next_release_ || index >= next_acquire_)
    throw std::logic_error("InputStager::release: micro-batch " + std::to_string(index) +
                           " where " + std::to_string(next_release_) + " (acquired) comes next");
  b_->record(s.consumed, b_->compute_stream());
  s.consumed_once = true;
  next_release_++;
}

}  // namespace baton::memory
