// Point-to-point traffic on a communicator of its own per direction of each pair of ranks,
// collectives on the world: for NCCL, whose operations on one communicator run in order on
// one stream. There a receive posted ahead (the executor posts receives before their
// sends are due) holds up every operation queued after it, and two pipeline ranks that
// each send before they receive (1F1B's steady state) wait for each other forever. Apart,
// a direction's stream holds only its own messages, which both sides post in the same
// order (NCCL matches them by order), so each waits only for its own counterpart.
// Header-only: the engine and the NCCL tests (whose GPU-check build has no transport
// library) both use it.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "transport/communicator.h"

namespace baton::transport {

namespace detail {

class PairRoutedComm final : public Communicator {
 public:
  PairRoutedComm(CommPtr world, std::map<std::pair<int, int>, CommPtr> pairs)
      : world_(std::move(world)), pairs_(std::move(pairs)) {}

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  int global_rank(int r) const override { return world_->global_rank(r); }
  std::string backend() const override { return world_->backend(); }

  // In a pair's communicator the lower world rank is rank 0.
  WorkPtr isend(const Tensor& t, int dst, uint64_t tag) override {
    return pair(rank(), dst, "isend").isend(t, dst < rank() ? 0 : 1, tag);
  }
  WorkPtr irecv(Tensor& t, int src, uint64_t tag) override {
    return pair(src, rank(), "irecv").irecv(t, src < rank() ? 0 : 1, tag);
  }

  WorkPtr broadcast(Tensor& t, int root) override { return world_->broadcast(t, root); }
  WorkPtr all_reduce(Tensor& t, ReduceOp op) override { return world_->all_reduce(t, op); }
  WorkPtr all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    return world_->all_gather(in, out, counts);
  }
  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                         std::span<const int64_t> counts) override {
    return world_->reduce_scatter(in, out, op, counts);
  }
  WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                  std::span<const int64_t> counts) override {
    return world_->scatter(in, out, root, counts);
  }
  WorkPtr gather(const Tensor& in, Tensor& out, int root,
                 std::span<const int64_t> counts) override {
    return world_->gather(in, out, root, counts);
  }
  WorkPtr barrier() override { return world_->barrier(); }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    return world_->split(ranks);
  }
  std::optional<std::pair<int, std::string>> first_failure() const override {
    return world_->first_failure();
  }

 private:
  Communicator& pair(int src, int dst, const char* op) {
    auto it = pairs_.find({src, dst});
    if (it == pairs_.end())
      throw std::logic_error(std::string(op) + ": no route from rank " + std::to_string(src) +
                             " to rank " + std::to_string(dst) + " was made (route_pairs_apart)");
    return *it->second;
  }

  CommPtr world_;
  std::map<std::pair<int, int>, CommPtr> pairs_;  // (source, destination) -> its communicator
};

}  // namespace detail

// `routes`: the (source, destination) world-rank pairs this rank sends or receives on
// (each includes this rank). `split_pair(members)` makes the communicator of the two ranks
// `members` (ascending), called by both (world->split, or nccl_split_p2p for NCCL's
// launch-at-once form). The pairs are split in ascending order of (lower rank, higher
// rank, direction), so each pair's two ranks reach it: a rank waits on a pair only after
// finishing every smaller one of its own, and the smallest pair not yet made has both its
// ranks ready. Every rank of the world calls it (with its own routes) at the same point.
// isend/irecv to a rank outside the routes is a logic_error; the rest is world's.
inline CommPtr route_pairs_apart(
    CommPtr world, const std::set<std::pair<int, int>>& routes,
    const std::function<CommPtr(const std::vector<int>&)>& split_pair) {
  const int me = world->rank();
  // (lower, higher, direction: 0 for lower -> higher) in ascending order.
  std::set<std::tuple<int, int, int>> order;
  for (const auto& [src, dst] : routes) {
    if (src == dst || (src != me && dst != me) || src < 0 || dst < 0 || src >= world->size() ||
        dst >= world->size())
      throw std::logic_error("route_pairs_apart: rank " + std::to_string(me) + " given the route " +
                             std::to_string(src) + " -> " + std::to_string(dst));
    order.insert({std::min(src, dst), std::max(src, dst), src < dst ? 0 : 1});
  }
  std::map<std::pair<int, int>, CommPtr> pairs;
  for (const auto& [lo, hi, dir] : order) {
    CommPtr c = split_pair({lo, hi});
    pairs[dir == 0 ? std::pair{lo, hi} : std::pair{hi, lo}] = std::move(c);
  }
  return std::make_shared<detail::PairRoutedComm>(std::move(world), std::move(pairs));
}

}  // namespace baton::transport
