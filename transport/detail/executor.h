// Executor: runs one communicator's collectives in the order they were issued, in the
// background, so that an all-reduce progresses while its caller computes. A caller who
// waits on a collective that has not started runs it (and any before it) on its own
// thread instead of handing it over: no thread switch on the latency-critical path.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "transport/detail/fabric.h"

namespace baton::transport::detail {

// A queued collective. Subclasses hold the work itself (see GroupComm), so that a
// collective is one allocation.
struct Job {
  enum : int { kQueued = 0, kRunning = 1, kDone = 2, kFailed = 3 };
  virtual ~Job() = default;
  virtual void run() = 0;
  std::atomic<int> state{kQueued};
  ErrorInfo error;  // written before state becomes kFailed
};

class Executor {
 public:
  Executor() = default;
  ~Executor();  // calls shutdown()
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues a job. `urgent` wakes the background thread at once (long jobs, where a
  // wake-up costs little next to the work); other jobs start within kPickup, or at
  // once when their caller waits.
  void submit(const std::shared_ptr<Job>& job, bool urgent);
  // Blocks until the job is done; rethrows its error.
  void wait(Job& job);
  // True when done; rethrows its error. Runs nothing.
  bool test(Job& job);
  // Fails the jobs not yet started, waits for the running one and stops the thread.
  void shutdown();

  static constexpr std::chrono::microseconds kPickup{1000};

 private:
  void loop();
  void run(Job& job);
  // With the runner role held and the lock taken: runs queued jobs until `target` has
  // run (or the queue is empty when target is null).
  void drain(std::unique_lock<std::mutex>& lock, Job* target);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool running_ = false;  // someone holds the runner role
  bool stop_ = false;
  bool idle_ = false;  // the thread sleeps with no deadline (nothing queued for it)
  bool started_ = false;
  std::optional<ErrorInfo> broken_;  // the first failure: later jobs fail with it
  // When the thread takes up the queued jobs (the first's submission + kPickup, or now
  // for an urgent one).
  std::chrono::steady_clock::time_point due_{};
  std::thread thread_;
};

}  // namespace baton::transport::detail
