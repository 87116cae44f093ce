#include "transport/detail/nccl_watchdog.h"

#include "transport/communicator.h"

namespace baton::transport::detail {

Watchdog::Watchdog(std::chrono::milliseconds timeout, std::string group,
                   std::function<void()> abort, std::chrono::milliseconds poll)
    : timeout_(timeout),
      poll_(poll),
      group_(std::move(group)),
      abort_(std::move(abort)),
      freer_([this] { free_run(); }),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(free_mu_);
    free_stop_ = true;
  }
  free_cv_.notify_all();
  if (freer_.joinable()) freer_.join();
}

void Watchdog::free_run() {
  std::unique_lock lock(free_mu_);
  while (true) {
    free_cv_.wait(lock, [&] { return free_stop_ || !to_free_.empty(); });
    if (to_free_.empty()) return;  // stopped, nothing left
    std::vector<Item> items = std::move(to_free_);
    to_free_.clear();
    lock.unlock();
    items.clear();
    lock.lock();
  }
}

void Watchdog::launch_begin(int peer, std::string what) {
  std::lock_guard lock(mu_);
  launch_start_ = Clock::now();
  launch_peer_ = peer;
  launch_what_ = std::move(what);
  launching_ = true;
}

void Watchdog::launch_end(Done done, std::vector<memory::Tensor> keep) {
  std::lock_guard lock(mu_);
  launching_ = false;
  items_.push_back({std::move(done), launch_start_, launch_peer_, std::move(keep)});
}

void Watchdog::launch_cancel() {
  std::lock_guard lock(mu_);
  launching_ = false;
}

int Watchdog::scan_locked(Clock::time_point now, std::vector<Item>& dropped) {
  int late = -1;
  for (size_t i = 0; i < items_.size();) {
    bool done = false;
    try {
      done = items_[i].done();
    } catch (const std::exception&) {
      done = true;
    }
    if (done) {
      dropped.push_back(std::move(items_[i]));
      items_.erase(items_.begin() + std::ptrdiff_t(i));
      continue;
    }
    if (late < 0 && now - items_[i].start > timeout_) late = int(i);
    ++i;
  }
  return late;
}

void Watchdog::reap() {
  std::vector<Item> dropped;  // freed after the lock is released
  std::lock_guard lock(mu_);
  (void)scan_locked(Clock::now(), dropped);
}

size_t Watchdog::in_flight() const {
  std::lock_guard lock(mu_);
  return items_.size();
}

void Watchdog::check() const {
  if (!aborted_.load()) return;
  std::lock_guard lock(mu_);
  throw PeerError(failed_peer_, failed_what_);
}

int Watchdog::failed_peer() const {
  std::lock_guard lock(mu_);
  return failed_peer_;
}

void Watchdog::run() {
  std::unique_lock lock(mu_);
  while (!stop_ && !aborted_.load()) {
    cv_.wait_for(lock, poll_);
    if (stop_) break;
    std::vector<Item> dropped;
    const auto now = Clock::now();
    const int late = scan_locked(now, dropped);
    int peer = -2;
    std::string what;
    if (launching_ && now - launch_start_ > timeout_) {
      peer = launch_peer_;
      what = launch_what_;
    } else if (late >= 0) {
      peer = items_[size_t(late)].peer;
      what = "an operation";
    }
    if (peer != -2) {
      failed_peer_ = peer;
      failed_what_ = "nccl: " + what + " of the group " + group_ + " did not finish within " +
                     std::to_string(timeout_.count()) + " ms" +
                     (peer >= 0 ? " (waiting on rank " + std::to_string(peer) + ")" : "") +
                     "; the communicator was aborted";
      // Under the lock, so that stop() (which takes it) cannot return while an abort
      // is under way: the owner then sees aborted() and does not destroy.
      abort_();
      aborted_.store(true);
    }
    if (dropped.empty()) continue;
    {
      std::lock_guard free_lock(free_mu_);
      for (Item& item : dropped) to_free_.push_back(std::move(item));
    }
    free_cv_.notify_one();
  }
}

}  // namespace baton::transport::detail
