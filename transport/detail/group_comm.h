// GroupComm: the one Communicator implementation, over any Fabric. Point-to-point
// calls go straight to the fabric; collectives run the algorithms of collectives.h on
// the group's Executor; split() agrees on a fresh context id with the new members.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/communicator.h"
#include "transport/detail/executor.h"
#include "transport/detail/fabric.h"
#include "transport/detail/group_view.h"

namespace baton::transport::detail {

class GroupComm final : public Communicator {
 public:
  // globals: the group's members as global ranks, in group-rank order; this process's
  // fabric rank must be among them.
  GroupComm(std::shared_ptr<Fabric> fabric, uint16_t context, std::vector<int> globals);
  ~GroupComm() override;

  int rank() const override { return rank_; }
  int size() const override { return int(globals_.size()); }
  int global_rank(int group_rank) const override;
  std::string backend() const override { return fabric_->backend(); }
  std::optional<std::pair<int, std::string>> first_failure() const override {
    return fabric_->first_failure();
  }

  WorkPtr isend(const Tensor& t, int dst, uint64_t tag) override;
  WorkPtr irecv(Tensor& t, int src, uint64_t tag) override;

  WorkPtr broadcast(Tensor& t, int root) override;
  WorkPtr all_reduce(Tensor& t, ReduceOp op) override;
  WorkPtr all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override;
  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                         std::span<const int64_t> counts) override;
  WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                  std::span<const int64_t> counts) override;
  WorkPtr gather(const Tensor& in, Tensor& out, int root, std::span<const int64_t> counts) override;
  WorkPtr barrier() override;

  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override;

  uint16_t context() const { return context_; }
  const std::shared_ptr<Fabric>& fabric() const { return fabric_; }

 private:
  // The storage of up to two tensors, kept alive while a collective may touch them.
  using Keep = std::array<std::shared_ptr<memory::Storage>, 2>;
  // Queues fn(GroupView) as this group's next collective; `bytes` decides whether to
  // wake the background thread at once. A template so that the whole job is one
  // allocation (small collectives are latency-bound).
  template <class Fn>
  WorkPtr submit(size_t bytes, Keep keep, Fn fn);
  GroupView view(uint32_t seq) const;
  void check_rank(int r, const char* what) const;
  std::vector<int64_t> parts(std::span<const int64_t> counts, size_t total, const char* what) const;

  std::shared_ptr<Fabric> fabric_;
  uint16_t context_;
  std::vector<int> globals_;
  int rank_ = -1;
  uint32_t seq_ = 0;  // the next collective's sequence number; only the runner touches it
  std::shared_ptr<Executor> executor_;
};

}  // namespace baton::transport::detail
