#include "engine/detail/staged_inputs.h"

#include <stdexcept>
#include <utility>

namespace baton::engine::detail {

StagedInputs::StagedInputs(Backend make_backend, int depth)
    : make_backend_(std::move(make_backend)), depth_(depth) {
  if (!make_backend_) throw std::logic_error("StagedInputs: no staging backend");
}

StagedInputs::~StagedInputs() = default;

int64_t StagedInputs::stage(const stages::TensorMap& host) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stager_) {  // the first micro-batch fixes the slots' fields
    for (const auto& [name, t] : host) {
      names_.push_back(name);
      fields_.push_back({t.shape(), t.dtype()});
    }
    stager_ = std::make_unique<memory::InputStager>(make_backend_(), fields_, depth_);
  }
  if (host.size() != names_.size()) return -1;
  size_t f = 0;
  for (const auto& [name, t] : host) {
    if (name != names_[f] || t.shape() != fields_[f].shape || t.dtype() != fields_[f].dtype)
      return -1;
    ++f;
  }
  const int64_t ticket = stager_->staged();
  stager_->stage(ticket, [&](std::vector<memory::Tensor>& slots) {
    size_t i = 0;
    for (const auto& [name, t] : host) slots[i++].copy_from(t);
  });
  return ticket;
}

stages::TensorMap StagedInputs::take(int64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stager_ || ticket < 0)
    throw std::logic_error("StagedInputs::take: ticket " + std::to_string(ticket) +
                           " was not staged");
  const std::vector<memory::Tensor> slots = stager_->acquire(ticket);
  stages::TensorMap out;
  for (size_t f = 0; f < slots.size(); ++f) out[names_[f]] = slots[f].clone();
  stager_->release(ticket);
  return out;
}

int64_t StagedInputs::staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stager_ ? stager_->staged() : 0;
}

}  // namespace baton::engine::detail
