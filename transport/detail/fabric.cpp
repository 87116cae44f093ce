#include "transport/detail/fabric.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "transport/detail/tag.h"

namespace baton::transport::detail {

Fabric::Fabric(int rank, int size, CommOptions options)
    : rank_(rank), size_(size), options_(options) {
  if (size < 1 || size > kMaxRanks)
    throw InputError("world size " + std::to_string(size) + " is out of range (1.." +
                     std::to_string(kMaxRanks) + ")");
  if (rank < 0 || rank >= size)
    throw InputError("rank " + std::to_string(rank) + " is out of range for world size " +
                     std::to_string(size));
}

void Fabric::complete(Request& r) {
  Fabric* f = r.owner;
  r.state.store(Request::kDone, std::memory_order_seq_cst);
  if (f->sleepers_.load(std::memory_order_seq_cst) > 0) f->wake_waiters();
}

ErrorInfo ErrorInfo::of(const std::exception_ptr& e) {
  ErrorInfo info;
  try {
    std::rethrow_exception(e);
  } catch (const PeerError& p) {
    info.kind = kPeer;
    info.rank = p.peer();
    info.what = p.what();
  } catch (const InputError& i) {
    // Bad input stays bad input (exit code 2) across threads: a restart would meet it again.
    info.kind = kInput;
    info.what = i.what();
  } catch (const std::logic_error& l) {
    info.kind = kLogic;
    info.what = l.what();
  } catch (const std::exception& x) {
    info.what = x.what();
  } catch (...) {
    info.what = "unknown error";
  }
  return info;
}

void ErrorInfo::raise() const {
  switch (kind) {
    case kPeer:
      throw PeerError(rank, what);
    case kLogic:
      throw std::logic_error(what);
    case kInput:
      throw InputError(what);
    case kRuntime:
      break;
  }
  throw RuntimeError(what);
}

void Fabric::fail(Request& r, std::exception_ptr error) {
  Fabric* f = r.owner;
  r.error = ErrorInfo::of(error);
  r.state.store(Request::kFailed, std::memory_order_seq_cst);
  if (f->sleepers_.load(std::memory_order_seq_cst) > 0) f->wake_waiters();
}

void Fabric::wake_waiters() {
  // Taking the lock orders this wake after a waiter's check-then-sleep.
  { std::lock_guard lock(wait_mu_); }
  wait_cv_.notify_all();
}

bool Fabric::poll(Request& r, std::span<const int> scope, uint64_t& seen_epoch) {
  int s = r.state.load(std::memory_order_acquire);
  if (s == Request::kDone) return true;
  // A failure in scope first: it names the rank that failed first, which may not be
  // the one this request waits on.
  uint64_t epoch = failure_epoch_.load(std::memory_order_acquire);
  if (epoch != seen_epoch) {
    seen_epoch = epoch;
    check_scope(scope);
  }
  if (s == Request::kFailed) r.error.raise();
  return false;
}

bool Fabric::test(Request& r, std::span<const int> scope) {
  uint64_t seen = 0;
  if (poll(r, scope, seen)) return true;
  progress();
  return poll(r, scope, seen);
}

void Fabric::wait(Request& r, std::span<const int> scope) {
  uint64_t seen = 0;
  if (poll(r, scope, seen)) return;
  // Poll first: a small message usually completes within microseconds, far less than
  // the cost of sleeping and being woken.
  auto deadline = std::chrono::steady_clock::now() + options_.spin;
  int spins = 0;
  on_poll_begin();
  struct PollEnd {
    Fabric* f;
    ~PollEnd() { f->on_poll_end(); }
  };
  {
    PollEnd poll_end{this};
    while (true) {
      if (!progress()) cpu_relax();
      if (poll(r, scope, seen)) return;
      if (++spins % 64 == 0) {
        if (std::chrono::steady_clock::now() >= deadline) break;
        // When the cores are oversubscribed the thread we wait for may be queued
        // behind us on this core: let it run. On an idle core this returns at once.
        std::this_thread::yield();
      }
    }
  }
  on_sleep_begin();
  struct SleepEnd {
    Fabric* f;
    ~SleepEnd() { f->on_sleep_end(); }
  } sleep_end{this};
  std::unique_lock lock(wait_mu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  struct Unsleep {
    std::atomic<int>& n;
    ~Unsleep() { n.fetch_sub(1, std::memory_order_seq_cst); }
  } unsleep{sleepers_};
  // A peer alive to the pings but silent this long has stopped taking part.
  const auto stall = options_.stall_timeout;
  auto give_up = stall.count() > 0 ? std::chrono::steady_clock::now() + stall
                                   : std::chrono::steady_clock::time_point::max();
  while (!poll(r, scope, seen)) {
    if (wait_cv_.wait_until(lock, give_up) != std::cv_status::timeout) continue;
    if (poll(r, scope, seen)) return;
    // Reported once; a wait with no peer to blame (a message to itself) sleeps on, and
    // must not spin on a deadline in the past.
    give_up = std::chrono::steady_clock::time_point::max();
    if (r.peer < 0 || r.peer == rank_) continue;
    lock.unlock();
    // The peer may itself be waiting, on a rank that never came: which it is, this rank
    // cannot see, so the message names both.
    report_stalled(r.peer, fmt::format("it answers the liveness pings but sent nothing rank {} "
                                       "waited for in {:g} s (BATON_STALL_TIMEOUT): its training "
                                       "thread is stuck, or it waits in turn on a rank that is",
                                       rank_, double(stall.count()) / 1000));
    lock.lock();
  }
}

void Fabric::declare_failed(int peer, const std::string& reason, bool left) {
  {
    std::lock_guard lock(failed_mu_);
    auto [it, fresh] = failed_.emplace(peer, Failed{reason, failed_.size(), left});
    if (!fresh) {
      // Known to have left, then reported failed by a rank that still needed it (its
      // goodbye carries the failure): a failure, in the place it took when it left. A rank
      // two hops from one that failed of its own error had named the reporter instead.
      if (left || !it->second.left) return;
      it->second.left = false;
      it->second.reason = reason;
    }
  }
  failure_epoch_.fetch_add(1, std::memory_order_acq_rel);
  // What waits on a peer that left is failed as needing it, so that its first waiter's
  // error says so as the record will once marked below.
  size_t hit = fail_pending(peer, peer_error(peer, left ? still_needed() : std::string()));
  if (left && hit > 0) mark_needed(peer);  // it left while we still waited on it
  wake_waiters();
}

bool Fabric::mark_needed(int peer) {
  std::lock_guard lock(failed_mu_);
  auto it = failed_.find(peer);
  if (it == failed_.end() || !it->second.left) return false;
  it->second.left = false;
  it->second.reason += still_needed();
  failure_epoch_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

void Fabric::fail_gone(Request& r, int peer) {
  bool changed = mark_needed(peer);
  fail(r, std::make_exception_ptr(peer_error(peer)));
  if (changed) wake_waiters();
}

bool Fabric::knows_failure(int peer, bool left) const {
  std::lock_guard lock(failed_mu_);
  auto it = failed_.find(peer);
  return it != failed_.end() && (left || !it->second.left);
}

std::optional<std::string> Fabric::failure_of(int peer) const {
  if (!any_failure()) return std::nullopt;  // no lock on the fast path
  std::lock_guard lock(failed_mu_);
  auto it = failed_.find(peer);
  if (it == failed_.end()) return std::nullopt;
  return it->second.reason;
}

std::optional<std::pair<int, std::string>> Fabric::first_failure() const {
  std::lock_guard lock(failed_mu_);
  const std::pair<const int, Failed>* best = nullptr;
  for (auto& f : failed_)
    if (!f.second.left && (!best || f.second.order < best->second.order)) best = &f;
  if (!best) return std::nullopt;
  return std::make_pair(best->first, best->second.reason);
}

PeerError Fabric::peer_error(int peer, const std::string& more) const {
  auto reason = failure_of(peer);
  return PeerError(peer, "rank " + std::to_string(peer) +
                             " failed: " + (reason ? *reason : std::string("unknown reason")) +
                             more + " (seen by rank " + std::to_string(rank_) + ")");
}

std::string Fabric::still_needed() const {
  return " while rank " + std::to_string(rank_) + " still needed it";
}

void Fabric::check_scope(std::span<const int> scope) const {
  if (failure_epoch_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(failed_mu_);
  int first = -1;
  uint64_t order = ~uint64_t(0);
  for (int g : scope) {
    auto it = failed_.find(g);
    if (it != failed_.end() && !it->second.left && it->second.order < order) {
      first = g;
      order = it->second.order;
    }
  }
  if (first >= 0)
    throw PeerError(first, "rank " + std::to_string(first) +
                               " failed: " + failed_.at(first).reason + " (seen by rank " +
                               std::to_string(rank_) + ")");
}

// ---- messages to this rank itself ----

RequestPtr Fabric::self_request(bool is_send, size_t bytes) {
  auto r = std::make_shared<Request>();
  r->peer = rank_;
  r->is_send = is_send;
  r->bytes = bytes;
  r->owner = this;
  return r;
}

void Fabric::self_deliver(SelfSend& s, SelfRecv& r) {
  if (s.bytes != r.bytes) {
    // As between two ranks: the send is done (its bytes went out); the receive reports it.
    if (s.req) complete(*s.req);
    fail(*r.req, std::make_exception_ptr(RuntimeError(
                     "message size mismatch from rank " + std::to_string(rank_) + " to rank " +
                     std::to_string(rank_) + ": sent " + std::to_string(s.bytes) +
                     " bytes, receive expects " + std::to_string(r.bytes))));
    return;
  }
  const void* from = s.data != nullptr ? s.data : s.eager.data();
  if (r.bytes > 0) std::memcpy(r.data, from, r.bytes);
  if (s.req) complete(*s.req);
  complete(*r.req);
}

RequestPtr Fabric::self_isend(const void* data, size_t bytes, uint64_t tag) {
  auto req = self_request(true, bytes);
  std::lock_guard lock(self_mu_);
  auto it = self_posted_.find(tag);
  if (it != self_posted_.end()) {
    SelfRecv r = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) self_posted_.erase(it);
    SelfSend s{req, data, {}, bytes};
    self_deliver(s, r);
  } else if (bytes <= kSelfEagerLimit) {
    SelfSend s{nullptr, nullptr, {}, bytes};
    s.eager.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    self_unexpected_[tag].push_back(std::move(s));
    complete(*req);
  } else {
    self_unexpected_[tag].push_back(SelfSend{req, data, {}, bytes});
  }
  return req;
}

RequestPtr Fabric::self_irecv(void* data, size_t bytes, uint64_t tag) {
  auto req = self_request(false, bytes);
  std::lock_guard lock(self_mu_);
  auto it = self_unexpected_.find(tag);
  if (it == self_unexpected_.end()) {
    self_posted_[tag].push_back(SelfRecv{req, data, bytes});
    return req;
  }
  SelfSend s = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) self_unexpected_.erase(it);
  SelfRecv r{req, data, bytes};
  self_deliver(s, r);
  return req;
}

void Fabric::reserve_context(uint16_t id) {
  uint16_t cur = next_context_.load();
  while (cur <= id && !next_context_.compare_exchange_weak(cur, uint16_t(id + 1))) {
  }
}

}  // namespace baton::transport::detail
