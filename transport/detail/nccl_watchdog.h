// The NCCL communicator's watchdog, without NCCL: it keeps every launched operation (a
// "done" query and the tensors the operation uses) until the operation has finished, and
// aborts the communicator through a callback when one has not finished `timeout` after
// its launch began (a peer is gone or stuck: NCCL itself would wait forever). Host-
// blocking phases (the communicator's initialisation, the first connection to a peer)
// are watched the same way between launch_begin() and launch_end(). Kept apart from
// nccl_communicator.cpp so that its logic is tested on CPU with stand-in events
// (tests/cuda/test_nccl_logic.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "memory/tensor.h"

namespace baton::transport::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // True once the operation has finished; a query that throws counts as finished (the
  // error surfaces through NCCL's asynchronous error instead).
  using Done = std::function<bool()>;

  // `abort` runs at most once, on the watchdog's thread, and never after stop() returned.
  Watchdog(std::chrono::milliseconds timeout, std::string group, std::function<void()> abort,
           std::chrono::milliseconds poll = std::chrono::milliseconds(50));
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Ends the thread. After it returns, no abort happens any more, so the owner may
  // decide between destroying and leaving an aborted communicator without a race.
  void stop();

  // A host-blocking phase begins: `peer` is the global rank it waits on (-1: several or
  // unknown), `what` says what it is ("an operation", "joining").
  void launch_begin(int peer, std::string what = "an operation");
  // The phase ended with an operation queued: kept, with its tensors, until done().
  void launch_end(Done done, std::vector<memory::Tensor> keep);
  // The phase ended with nothing queued (a failed launch).
  void launch_cancel();
  // Drops the finished operations and their tensors now (the thread does it every poll).
  void reap();
  size_t in_flight() const;

  bool aborted() const { return aborted_.load(); }
  // Throws PeerError (the late peer, the message) once aborted.
  void check() const;
  int failed_peer() const;

 private:
  struct Item {
    Done done;
    Clock::time_point start;
    int peer;
    std::vector<memory::Tensor> keep;
  };
  void run();
  void free_run();
  // Drops finished items; returns the first late one's index or -1. With mu_ held; the
  // tensors of finished items are moved to `dropped` so that they are freed unlocked.
  int scan_locked(Clock::time_point now, std::vector<Item>& dropped);

  std::chrono::milliseconds timeout_, poll_;
  std::string group_;
  std::function<void()> abort_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool launching_ = false;
  Clock::time_point launch_start_{};
  int launch_peer_ = -1;
  std::string launch_what_;
  std::vector<Item> items_;
  std::atomic<bool> aborted_{false};
  int failed_peer_ = -1;
  std::string failed_what_;
  // The watchdog's finished operations go back to their allocator on a thread of their
  // own: a free may wait on the allocator's lock, which a failed allocation holds through
  // the device synchronisation that releases its cache, and that synchronisation waits
  // on the very receive only the watchdog's abort ends.
  std::mutex free_mu_;
  std::condition_variable free_cv_;
  std::vector<Item> to_free_;
  bool free_stop_ = false;
  std::thread freer_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace baton::transport::detail
