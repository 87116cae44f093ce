#include "engine/detail/input_loader.h"

#include <utility>

#include "memory/error.h"

namespace baton::engine::detail {

InputLoader::InputLoader(InputFn fn, std::vector<std::string> names, int ahead,
                         std::function<double()> clock, StagedInputs::Backend staging)
    : fn_(std::move(fn)),
      names_(std::move(names)),
      ahead_(std::max(1, ahead)),
      clock_(std::move(clock)) {
  // At most ahead_ made and not yet taken (each is staged when made, taken at its first
  // use): one more slot leaves the copy stream room.
  if (staging) staged_ = std::make_unique<StagedInputs>(std::move(staging), ahead_ + 1);
  thread_ = std::thread([this] { loop(); });
}

InputLoader::~InputLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void InputLoader::enqueue(const stages::MicroBatch& mb, int uses) {
  if (uses <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Item it;
    it.mb = mb;
    it.uses = uses;
    items_.push_back(std::move(it));
  }
  cv_.notify_all();
}

void InputLoader::set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
}

std::vector<InputLoader::Made> InputLoader::drain_made() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(made_log_, {});
}

stages::TensorMap InputLoader::take(int64_t step, int64_t index, bool* waited) {
  std::unique_lock<std::mutex> lock(mu_);
  if (waited) *waited = false;
  for (;;) {
    if (error_) std::rethrow_exception(error_);
    for (size_t i = 0; i < items_.size(); ++i) {
      Item& it = items_[i];
      if (it.mb.step != step || it.mb.index != index) continue;
      if (!it.ready) break;
      if (it.ticket >= 0) {  // first use: the device copies (ordered on this thread's stream)
        it.tensors = staged_->take(it.ticket);
        it.ticket = -1;
      }
      stages::TensorMap out = it.tensors;
      if (!it.taken) {
        it.taken = true;
        --unused_;
        cv_.notify_all();  // room for the loader to run ahead again
      }
      if (--it.uses == 0) {
        items_.erase(items_.begin() + std::ptrdiff_t(i));
        --made_;
      }
      return out;
    }
    bool queued = false;
    for (const Item& it : items_) queued |= it.mb.step == step && it.mb.index == index;
    if (!queued)
      throw std::logic_error("input loader: micro-batch " + std::to_string(index) + " of step " +
                             std::to_string(step) + " was never queued");
    if (waited) *waited = true;
    cv_.wait(lock);
  }
}

void InputLoader::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (made_ < items_.size() && unused_ < size_t(ahead_)); });
    if (stop_) return;
    stages::MicroBatch mb = items_[made_].mb;
    const bool record = recording_;
    lock.unlock();
    const double start = record ? clock_() : 0.0;
    stages::TensorMap out;
    int64_t ticket = -1;
    std::exception_ptr err;
    try {
      fn_(mb, names_, out);
      if (staged_) ticket = staged_->stage(out);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err) {
      error_ = err;
      cv_.notify_all();
      return;
    }
    if (record) made_log_.push_back({mb.step, mb.index, start, clock_()});
    // The item is still at position made_: take() removes only ready items, which sit
    // before it.
    items_[made_].tensors = std::move(out);
    items_[made_].ticket = ticket;
    items_[made_].ready = true;
    ++made_;
    ++unused_;
    cv_.notify_all();
  }
}

}  // namespace baton::engine::detail
