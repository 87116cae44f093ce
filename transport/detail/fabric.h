// Fabric: the point-to-point layer under every communicator of one rank. A backend
// (in-process mailbox, UCX) moves bytes between global ranks with 64-bit tags; the
// fabric adds what all backends share: completion, waiting (poll, then sleep), and the
// record of failed peers that turns waits into PeerErrors.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "transport/communicator.h"
#include "transport/options.h"

namespace baton::transport::detail {

// A spin-wait's pause between polls (the fabrics' progress and completion loops).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// A failure as plain data. Every thread that waits on a failed operation throws its
// own exception made from it: one exception object shared between threads would be
// released by whichever thread drops it last, through reference counts inside
// libstdc++ that ThreadSanitizer cannot see.
struct ErrorInfo {
  enum Kind : uint8_t { kRuntime, kPeer, kLogic, kInput } kind = kRuntime;
  int rank = -1;  // the failed peer, for kPeer
  std::string what;

  static ErrorInfo of(const std::exception_ptr& e);  // classifies a thrown exception
  [[noreturn]] void raise() const;  // throws PeerError, InputError, RuntimeError, ...
};

// A pending send or receive. The backend completes or fails it exactly once.
struct Request {
  enum : int { kPending = 0, kDone = 1, kFailed = 2 };
  std::atomic<int> state{kPending};
  ErrorInfo error;  // written before state becomes kFailed
  int peer = -1;    // global rank on the other side
  bool is_send = false;
  size_t bytes = 0;
  void* backend = nullptr;        // the backend's own handle (a UCX request, a mailbox entry)
  class Fabric* owner = nullptr;  // whose waiters sleep on it (set by the backend)

  bool done() const { return state.load(std::memory_order_acquire) != kPending; }
};
using RequestPtr = std::shared_ptr<Request>;

class Fabric {
 public:
  Fabric(int rank, int size, CommOptions options);
  virtual ~Fabric() = default;
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  virtual std::string backend() const = 0;

  // Posts a send or a receive of `bytes` bytes; `tag` is a full tag (detail/tag.h).
  // A peer already known to have failed gives a request that is already failed.
  virtual RequestPtr isend(const void* data, size_t bytes, int dst, uint64_t tag) = 0;
  virtual RequestPtr irecv(void* data, size_t bytes, int src, uint64_t tag) = 0;

  // Blocks until r completes; rethrows its error. `scope` lists global ranks whose
  // failure also ends the wait (the members of a collective), so that a collective
  // fails as soon as any member is gone, not only the one it waits on.
  void wait(Request& r, std::span<const int> scope = {});
  // True when complete; throws as wait() does.
  bool test(Request& r, std::span<const int> scope = {});

  // Records that a peer failed (idempotent): fails its pending requests and wakes every
  // waiter so that collectives involving it fail too. A peer that `left` (closed its
  // communicator normally) fails only the operations that involve it directly: it has
  // done its part of every collective it issued. If it leaves one of ours unfinished,
  // that makes it a failure like any other; so does another rank's report that it failed.
  void declare_failed(int peer, const std::string& reason, bool left = false);
  // Whether declare_failed(peer, ..., left) would add nothing: the peer is known to have
  // failed, or to have left when `left`.
  bool knows_failure(int peer, bool left) const;
  // Throws the PeerError of the rank in scope that failed first, if any: when one rank's
  // death makes others give up, the error still names the one that died.
  void check_scope(std::span<const int> scope) const;
  // The failure of one peer, if it failed.
  std::optional<std::string> failure_of(int peer) const;
  // Cheap test for the common case: has any peer failed or left at all?
  bool any_failure() const { return failure_epoch_.load(std::memory_order_acquire) != 0; }
  // The first failure recorded (rank, reason), if any; peers that merely left do not count.
  std::optional<std::pair<int, std::string>> first_failure() const;
  // For a peer known to have failed; `more` follows its recorded reason.
  PeerError peer_error(int peer, const std::string& more = {}) const;

  // Context ids for sub-groups: a member proposes next_context(), the members agree on
  // the largest proposal, and every member then calls reserve_context(agreed).
  uint16_t next_context() const { return next_context_.load(); }
  void reserve_context(uint16_t id);

 protected:
  // Messages from this rank to itself, for a backend whose transport cannot carry them
  // (UCX has no endpoint to its own worker), matched here as the local backend matches
  // them: FIFO per tag, sizes must agree, a send of up to kSelfEagerLimit bytes is copied
  // and completes at once, a larger one waits for its receive and is copied once.
  static constexpr size_t kSelfEagerLimit = 64 << 10;
  RequestPtr self_isend(const void* data, size_t bytes, uint64_t tag);
  RequestPtr self_irecv(void* data, size_t bytes, uint64_t tag);
  // Fails a new request to or from a peer that already failed or left. A peer that
  // left while this rank still needs it counts as failed from now on (it left a
  // collective or an exchange unfinished).
  void fail_gone(Request& r, int peer);
  // What a peer that left is said to have done when this rank still needed it.
  std::string still_needed() const;
  // Called by backends, from any thread and for any fabric's request: the request's
  // owner wakes its own waiters.
  static void complete(Request& r);
  static void fail(Request& r, std::exception_ptr error);
  // Advances communication once; true if something happened. The caller's thread calls
  // it while polling in wait(); backends without asynchronous work keep the default.
  virtual bool progress() { return false; }
  // Fails the backend's pending requests that involve `peer`; returns how many.
  virtual size_t fail_pending(int peer, const PeerError& error) = 0;
  // Called by waiters around their polling and their sleep, so that a backend knows
  // when a caller drives progress itself (the UCX progress thread then stays out of its
  // way) and when it stopped (the thread takes over).
  virtual void on_poll_begin() {}
  virtual void on_poll_end() {}
  // A peer that an operation waited on longer than CommOptions::stall_timeout: recorded as
  // failed; a backend that can tells the other ranks too.
  virtual void report_stalled(int peer, const std::string& reason) { declare_failed(peer, reason); }
  virtual void on_sleep_begin() {}
  virtual void on_sleep_end() {}

 private:
  void wake_waiters();
  bool mark_needed(int peer);  // a peer that left is now a failure; true if it changed
  bool poll(Request& r, std::span<const int> scope, uint64_t& seen_epoch);

  const int rank_;
  const int size_;
  const CommOptions options_;

  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::atomic<int> sleepers_{0};

  mutable std::mutex failed_mu_;
  struct Failed {
    std::string reason;
    uint64_t order;  // failures are reported earliest first
    bool left;       // left normally: not a failure of the collectives in flight
  };
  std::map<int, Failed> failed_;  // global rank -> why and when
  std::atomic<uint64_t> failure_epoch_{0};

  std::atomic<uint16_t> next_context_{1};

  struct SelfSend {
    RequestPtr req;  // null for an eager send that already completed
    const void* data = nullptr;
    std::vector<char> eager;
    size_t bytes = 0;
  };
  struct SelfRecv {
    RequestPtr req;
    void* data = nullptr;
    size_t bytes = 0;
  };
  RequestPtr self_request(bool is_send, size_t bytes);
  void self_deliver(SelfSend& s, SelfRecv& r);
  std::mutex self_mu_;  // held while a matched self-message is copied
  std::map<uint64_t, std::deque<SelfSend>> self_unexpected_;  // by full tag
  std::map<uint64_t, std::deque<SelfRecv>> self_posted_;
};

}  // namespace baton::transport::detail
