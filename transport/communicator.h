// Communicator: the interface every transport backend implements (local threads, UCX
// between processes, NCCL between GPUs). Stages, the executor and data-parallel
// replicas talk only through it.
//
// Semantics shared by every backend:
// - Every operation is asynchronous and returns a Work handle; tensors must stay alive
//   and untouched until the work completes. Receives may be posted before the matching
//   send; messages between one pair with one tag arrive in the order they were sent.
// - Collectives: every rank of the group calls the same collectives in the same order.
// - Communication progresses without the caller calling in (a progress thread or an
//   equivalent), so a large send never waits for the sender's next call.
// - A peer that dies or stops answering turns every pending and later operation that
//   involves it into a PeerError naming its global rank, within the configured timeout.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/error.h"
#include "memory/tensor.h"

namespace baton::transport {

using memory::Tensor;

enum class ReduceOp { sum, avg, max };

class PeerError : public RuntimeError {
 public:
  PeerError(int global_rank, const std::string& what) : RuntimeError(what), peer_(global_rank) {}
  int peer() const { return peer_; }  // the global rank that failed

 private:
  int peer_;
};

class Work {
 public:
  virtual ~Work() = default;
  // True once complete; throws PeerError (or RuntimeError) if the operation failed.
  virtual bool test() = 0;
  // Blocks until complete; throws PeerError (or RuntimeError) if it failed.
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in this group
  virtual int size() const = 0;
  virtual int global_rank(int group_rank) const = 0;  // the world rank, for messages
  virtual std::string backend() const = 0;            // "local", "ucx", "nccl"

  // ---- point to point (contiguous tensors; sizes must match on both sides) ----
  virtual WorkPtr isend(const Tensor& t, int dst, uint64_t tag) = 0;
  virtual WorkPtr irecv(Tensor& t, int src, uint64_t tag) = 0;

  // ---- collectives ----
  virtual WorkPtr broadcast(Tensor& t, int root) = 0;
  virtual WorkPtr all_reduce(Tensor& t, ReduceOp op) = 0;
  // counts[r]: the number of elements rank r contributes (all_gather, gather) or receives
  // (reduce_scatter, scatter); empty means equal parts. `out`/`in` on the many-side is
  // the concatenation of the parts in rank order, flattened.
  // all_gather may run in place: `in` a view of this rank's own part of `out`.
  virtual WorkPtr all_gather(const Tensor& in, Tensor& out,
                             std::span<const int64_t> counts = {}) = 0;
  // reduce_scatter may run in place: `out` a view of this rank's own part of `in`; the
  // other parts of `in` then hold partial sums afterwards (its contents are spent), and
  // no staging beyond the all-reduce's is needed (the sharded optimizer uses this).
  virtual WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                                 std::span<const int64_t> counts = {}) = 0;
  virtual WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                          std::span<const int64_t> counts = {}) = 0;
  virtual WorkPtr gather(const Tensor& in, Tensor& out, int root,
                         std::span<const int64_t> counts = {}) = 0;
  virtual WorkPtr barrier() = 0;

  // A sub-group of this group's ranks (in the given order). Called by the members only,
  // each with the same list; the sub-group's traffic never mixes with its parent's.
  virtual std::shared_ptr<Communicator> split(const std::vector<int>& ranks) = 0;

  // The first peer failure this process has learnt of, in any group (global rank and
  // reason), if any; peers that merely left do not count. A PeerError names the failure
  // in its own operation's scope ("rank 3 left the job" when rank 3 gave up because rank
  // 2 died); this names the root cause, for the message a user reads.
  virtual std::optional<std::pair<int, std::string>> first_failure() const { return std::nullopt; }
};

using CommPtr = std::shared_ptr<Communicator>;

}  // namespace baton::transport
