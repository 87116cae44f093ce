#include "transport/detail/executor.h"

#include "memory/error.h"

namespace baton::transport::detail {

Executor::~Executor() {
  shutdown();
}

void Executor::submit(const std::shared_ptr<Job>& job, bool urgent) {
  std::unique_lock lock(mu_);
  if (stop_) {
    job->error.what = "collective issued on a closed communicator";
    job->state.store(Job::kFailed);
    return;
  }
  // A job queued behind others keeps their deadline.
  if (urgent)
    due_ = std::chrono::steady_clock::now();
  else if (queue_.empty())
    due_ = std::chrono::steady_clock::now() + kPickup;
  queue_.push_back(job);
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { loop(); });
  }
  // The thread sleeps without a deadline while nothing is queued: wake it, to start
  // this job now (urgent) or by its deadline.
  if (urgent || idle_) cv_.notify_one();
}

void Executor::run(Job& job) {
  job.state.store(Job::kRunning, std::memory_order_release);
  job.state.notify_all();
  std::optional<ErrorInfo> broken;
  {
    std::lock_guard lock(mu_);
    broken = broken_;
  }
  if (broken) {
    job.error = *broken;
    job.state.store(Job::kFailed, std::memory_order_release);
  } else {
    try {
      job.run();
      job.state.store(Job::kDone, std::memory_order_release);
    } catch (...) {
      job.error = ErrorInfo::of(std::current_exception());
      {
        // Peers are now out of step with this rank; every later collective fails too.
        std::lock_guard lock(mu_);
        if (!broken_) broken_ = job.error;
      }
      job.state.store(Job::kFailed, std::memory_order_release);
    }
  }
  job.state.notify_all();
}

void Executor::drain(std::unique_lock<std::mutex>& lock, Job* target) {
  while (!queue_.empty()) {
    auto job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    run(*job);
    lock.lock();
    if (job.get() == target) break;
  }
}

void Executor::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    if (!running_ && !queue_.empty()) {
      if (std::chrono::steady_clock::now() < due_) {
        cv_.wait_until(lock, due_);
        continue;
      }
      running_ = true;
      drain(lock, nullptr);
      running_ = false;
      continue;
    }
    if (stop_) break;
    // Nothing queued (or a caller runs it): no deadline, so that an idle communicator
    // costs no wake-ups. A thread waking every kPickup for each communicator of each rank
    // slowed 8 ranks on 2 cores by 15-17% (docs/transport.md, "Progress").
    idle_ = true;
    cv_.wait(lock);
    idle_ = false;
  }
}

bool Executor::test(Job& job) {
  int s = job.state.load(std::memory_order_acquire);
  if (s == Job::kFailed) job.error.raise();
  return s == Job::kDone;
}

void Executor::wait(Job& job) {
  while (true) {
    int s = job.state.load(std::memory_order_acquire);
    if (s == Job::kDone) return;
    if (s == Job::kFailed) job.error.raise();
    if (s == Job::kQueued) {
      std::unique_lock lock(mu_);
      if (!running_ && job.state.load(std::memory_order_acquire) == Job::kQueued) {
        running_ = true;
        drain(lock, &job);
        running_ = false;
        if (!queue_.empty()) cv_.notify_one();
        continue;
      }
    }
    job.state.wait(s, std::memory_order_acquire);
  }
}

void Executor::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::unique_lock lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    // Jobs nobody started: fail them rather than block on peers that may never come.
    // A job being run finishes first (its peers' failure ends it if they are gone).
    dropped.swap(queue_);
    cv_.notify_all();
  }
  for (auto& job : dropped) {
    job->error.what = "the communicator was closed before this collective started";
    job->state.store(Job::kFailed, std::memory_order_release);
    job->state.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  // A caller thread may still be running a stolen job: wait for it to hand back.
  std::unique_lock lock(mu_);
  while (running_) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    lock.lock();
  }
}

}  // namespace baton::transport::detail
