// The in-process fabric: ranks are threads of one process and share a mailbox with tag
// matching. Small sends are copied at once and complete (eager); large ones wait for
// their receive and are copied once, straight from the sender's buffer.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transport/detail/fabric.h"

namespace baton::transport::detail {

class LocalFabric;

// The state all ranks of one local world share.
class LocalHub {
 public:
  explicit LocalHub(int size);

  struct Send {
    RequestPtr req;  // null for an eager send that already completed
    const void* data = nullptr;
    std::vector<char> eager;  // the copied bytes of an eager send
    size_t bytes = 0;
  };
  struct Recv {
    RequestPtr req;
    void* data = nullptr;
    size_t bytes = 0;
  };
  // Messages to one rank, by full tag (the tag holds the source).
  struct Mailbox {
    std::mutex mu;
    std::map<uint64_t, std::deque<Send>> unexpected;
    std::map<uint64_t, std::deque<Recv>> posted;
  };

  int size() const { return int(boxes_.size()); }
  Mailbox& box(int rank) { return *boxes_[size_t(rank)]; }

  void attach(int rank, LocalFabric* f);
  // A matched message being copied involves its sender's and receiver's memory and
  // requests: counted (under the mailbox lock that matched it) so that neither rank's
  // fabric goes away in the middle.
  void begin_delivery(int src, int dst) {
    inflight_[size_t(src)].fetch_add(1, std::memory_order_relaxed);
    inflight_[size_t(dst)].fetch_add(1, std::memory_order_relaxed);
  }
  void end_delivery(int src, int dst) {
    inflight_[size_t(src)].fetch_sub(1, std::memory_order_release);
    inflight_[size_t(dst)].fetch_sub(1, std::memory_order_release);
  }
  // Detaches a rank whose fabric is closing and tells the others it left (and which
  // failure made it leave, if one did).
  void detach(int rank, std::optional<std::pair<int, std::string>> first);

 private:
  std::vector<std::unique_ptr<Mailbox>> boxes_;
  std::mutex mu_;
  std::vector<LocalFabric*> fabrics_;
  std::deque<std::atomic<int>> inflight_;  // deliveries under way, per rank
};

class LocalFabric final : public Fabric {
 public:
  LocalFabric(std::shared_ptr<LocalHub> hub, int rank, CommOptions options);
  ~LocalFabric() override;

  std::string backend() const override { return "local"; }
  RequestPtr isend(const void* data, size_t bytes, int dst, uint64_t tag) override;
  RequestPtr irecv(void* data, size_t bytes, int src, uint64_t tag) override;

  // Sends at most this large are copied and complete at once.
  static constexpr size_t kEagerLimit = 64 << 10;

 protected:
  size_t fail_pending(int peer, const PeerError& error) override;

 private:
  friend class LocalHub;
  RequestPtr make_request(int peer, bool is_send, size_t bytes);
  // Copies a matched message and completes both sides (outside the mailbox lock).
  void deliver(LocalHub::Send& s, LocalHub::Recv& r, int src, int dst);

  std::shared_ptr<LocalHub> hub_;
};

}  // namespace baton::transport::detail
