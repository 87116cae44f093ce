#include "transport/staged.h"

#include <functional>
#include <utility>

namespace baton::transport {

namespace {

using memory::Device;

bool on_device(const Tensor& t) {
  return t.defined() && !t.device().is_cpu();
}

// What the inner operation reads: a host copy of a device tensor, else the tensor.
Tensor host_input(const Tensor& t) {
  return on_device(t) ? t.to(Device::cpu()) : t;
}
// Where the inner operation writes: a host buffer for a device tensor, else the tensor.
Tensor host_output(const Tensor& t) {
  return on_device(t) ? Tensor::empty(t.shape(), t.dtype(), Device::cpu()) : t;
}

// The inner work, then (once) the copy of its host results back to the device.
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::function<void()> finish)
      : inner_(std::move(inner)), finish_(std::move(finish)) {}
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    complete();
    return true;
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    complete();
  }

 private:
  void complete() {
    if (finish_) finish_();
    finish_ = nullptr;  // frees the host buffers
    done_ = true;
  }
  WorkPtr inner_;
  std::function<void()> finish_;
  bool done_ = false;
};

// Copies a device result from its host stand-in (which the capture keeps alive).
std::function<void()> copy_back(Tensor dst, Tensor host) {
  return [dst, host]() mutable { dst.copy_from(host); };
}

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(CommPtr inner) : in_(std::move(inner)) {}

  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  int global_rank(int group_rank) const override { return in_->global_rank(group_rank); }
  std::string backend() const override { return in_->backend(); }

  WorkPtr isend(const Tensor& t, int dst, uint64_t tag) override {
    if (!on_device(t)) return in_->isend(t, dst, tag);
    Tensor host = host_input(t);
    return staged(in_->isend(host, dst, tag), [host] {});  // the buffer lives until done
  }
  WorkPtr irecv(Tensor& t, int src, uint64_t tag) override {
    if (!on_device(t)) return in_->irecv(t, src, tag);
    Tensor host = host_output(t);
    return staged(in_->irecv(host, src, tag), copy_back(t, host));
  }
  WorkPtr broadcast(Tensor& t, int root) override {
    if (!on_device(t)) return in_->broadcast(t, root);
    Tensor host = host_input(t);
    return staged(in_->broadcast(host, root), copy_back(t, host));
  }
  WorkPtr all_reduce(Tensor& t, ReduceOp op) override {
    if (!on_device(t)) return in_->all_reduce(t, op);
    Tensor host = host_input(t);
    return staged(in_->all_reduce(host, op), copy_back(t, host));
  }
  // The many-to-one and one-to-many collectives run on separate host buffers, never in
  // place: an in-place call's input is then a copy of its part of the output, which is
  // what the inner communicator would read.
  WorkPtr all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    return two_sided(in, out, counts,
                     [&](const Tensor& hin, Tensor& hout, std::span<const int64_t> c) {
                       return in_->all_gather(hin, hout, c);
                     });
  }
  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                         std::span<const int64_t> counts) override {
    return two_sided(in, out, counts,
                     [&](const Tensor& hin, Tensor& hout, std::span<const int64_t> c) {
                       return in_->reduce_scatter(hin, hout, op, c);
                     });
  }
  WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                  std::span<const int64_t> counts) override {
    return two_sided(in, out, counts,
                     [&](const Tensor& hin, Tensor& hout, std::span<const int64_t> c) {
                       return in_->scatter(hin, hout, root, c);
                     });
  }
  WorkPtr gather(const Tensor& in, Tensor& out, int root,
                 std::span<const int64_t> counts) override {
    return two_sided(in, out, counts,
                     [&](const Tensor& hin, Tensor& hout, std::span<const int64_t> c) {
                       return in_->gather(hin, hout, root, c);
                     });
  }
  WorkPtr barrier() override { return in_->barrier(); }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    return make_staged(in_->split(ranks));
  }
  std::optional<std::pair<int, std::string>> first_failure() const override {
    return in_->first_failure();
  }

 private:
  static WorkPtr staged(WorkPtr w, std::function<void()> finish) {
    return std::make_shared<StagedWork>(std::move(w), std::move(finish));
  }
  template <class Op>
  WorkPtr two_sided(const Tensor& in, Tensor& out, std::span<const int64_t> counts, Op&& op) {
    if (!on_device(in) && !on_device(out)) return op(in, out, counts);
    // The counts outlive the call: an asynchronous collective may read them later.
    auto kept = std::make_shared<std::vector<int64_t>>(counts.begin(), counts.end());
    Tensor hin = host_input(in), hout = host_output(out);
    WorkPtr w = op(hin, hout, std::span<const int64_t>(*kept));
    Tensor dst = out;
    return staged(std::move(w), [dst, hin, hout, kept]() mutable {
      if (on_device(dst)) dst.copy_from(hout);
    });
  }

  CommPtr in_;
};

}  // namespace

CommPtr make_staged(CommPtr inner) {
  return std::make_shared<StagedCommunicator>(std::move(inner));
}

}  // namespace baton::transport
