#include "transport/detail/local_fabric.h"

#include <cstring>
#include <thread>

#include "transport/detail/tag.h"

namespace baton::transport::detail {

// ---- LocalHub ----

LocalHub::LocalHub(int size) : fabrics_(size_t(size), nullptr), inflight_(size_t(size)) {
  for (int i = 0; i < size; ++i) boxes_.push_back(std::make_unique<Mailbox>());
}

void LocalHub::attach(int rank, LocalFabric* f) {
  std::lock_guard lock(mu_);
  fabrics_[size_t(rank)] = f;
}

void LocalHub::detach(int rank, std::optional<std::pair<int, std::string>> first) {
  {
    std::lock_guard lock(mu_);
    fabrics_[size_t(rank)] = nullptr;
  }
  // Large sends the closing rank left unmatched point into its memory: drop them.
  // Eager ones were copied and stay deliverable, as on a network.
  for (auto& b : boxes_) {
    std::lock_guard lock(b->mu);
    for (auto it = b->unexpected.begin(); it != b->unexpected.end();) {
      if (tag_source(it->first) == rank)
        std::erase_if(it->second, [](const Send& s) { return s.req != nullptr; });
      if (it->second.empty())
        it = b->unexpected.erase(it);
      else
        ++it;
    }
  }
  {
    auto& mine = box(rank);
    std::lock_guard lock(mine.mu);
    mine.posted.clear();
  }
  // Copies already matched may still touch this rank's buffers and requests.
  while (inflight_[size_t(rank)].load(std::memory_order_acquire) > 0) std::this_thread::yield();
  // Tell every other rank, under the hub lock: a rank that is closing at the same time
  // waits for it in its own detach(), so its fabric is still alive here. A rank that
  // closes because another failed passes that failure on first, as UCX ranks do.
  std::lock_guard lock(mu_);
  for (auto* f : fabrics_) {
    if (f == nullptr) continue;
    if (first.has_value() && first->first != f->rank())
      f->declare_failed(first->first,
                        first->second + " (reported by rank " + std::to_string(rank) + ")");
    f->declare_failed(rank, "it left the job (closed its communicator)", /*left=*/true);
  }
}

// ---- LocalFabric ----

LocalFabric::LocalFabric(std::shared_ptr<LocalHub> hub, int rank, CommOptions options)
    : Fabric(rank, hub->size(), options), hub_(std::move(hub)) {
  hub_->attach(rank, this);
}

LocalFabric::~LocalFabric() {
  hub_->detach(rank(), first_failure());
}

RequestPtr LocalFabric::make_request(int peer, bool is_send, size_t bytes) {
  auto r = std::make_shared<Request>();
  r->peer = peer;
  r->is_send = is_send;
  r->bytes = bytes;
  r->owner = this;
  return r;
}

RequestPtr LocalFabric::isend(const void* data, size_t bytes, int dst, uint64_t tag) {
  auto req = make_request(dst, true, bytes);
  auto& box = hub_->box(dst);
  LocalHub::Send s;
  s.data = data;
  s.bytes = bytes;
  LocalHub::Recv r;
  bool matched = false;
  {
    std::lock_guard lock(box.mu);
    // Checked under the mailbox lock, which fail_pending() also takes: a send queued
    // here is either seen by it or sees the failure.
    if (failure_of(dst)) {
      fail_gone(*req, dst);
      return req;
    }
    auto it = box.posted.find(tag);
    if (it != box.posted.end()) {
      r = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) box.posted.erase(it);
      matched = true;
      hub_->begin_delivery(rank(), dst);
    } else if (bytes <= kEagerLimit) {
      // A Send of its own (no request, no pointer): `s` stays whole for the matched case.
      LocalHub::Send eager;
      eager.bytes = bytes;
      eager.eager.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
      box.unexpected[tag].push_back(std::move(eager));
    } else {
      s.req = req;
      box.unexpected[tag].push_back(std::move(s));
      return req;
    }
  }
  if (matched) {
    s.req = req;
    deliver(s, r, rank(), dst);
    hub_->end_delivery(rank(), dst);
  } else {
    complete(*req);  // eager: the bytes are copied
  }
  return req;
}

RequestPtr LocalFabric::irecv(void* data, size_t bytes, int src, uint64_t tag) {
  auto req = make_request(src, false, bytes);
  auto& box = hub_->box(rank());
  LocalHub::Recv r{req, data, bytes};
  LocalHub::Send s;
  {
    std::lock_guard lock(box.mu);
    auto it = box.unexpected.find(tag);
    if (it == box.unexpected.end()) {
      // A sender known to be gone can never send it.
      if (failure_of(src)) {
        fail_gone(*req, src);
        return req;
      }
      box.posted[tag].push_back(std::move(r));
      return req;
    }
    s = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) box.unexpected.erase(it);
    hub_->begin_delivery(src, rank());
  }
  deliver(s, r, src, rank());
  hub_->end_delivery(src, rank());
  return req;
}

void LocalFabric::deliver(LocalHub::Send& s, LocalHub::Recv& r, int src, int dst) {
  if (s.bytes != r.bytes) {
    auto e = std::make_exception_ptr(
        RuntimeError("message size mismatch from rank " + std::to_string(src) + " to rank " +
                     std::to_string(dst) + ": sent " + std::to_string(s.bytes) +
                     " bytes, receive expects " + std::to_string(r.bytes)));
    // As on a network, the send is done (its bytes went out); the receive reports it.
    if (s.req) complete(*s.req);
    fail(*r.req, e);
    return;
  }
  const void* from = s.data != nullptr ? s.data : s.eager.data();
  if (r.bytes > 0) std::memcpy(r.data, from, r.bytes);
  if (s.req) complete(*s.req);
  complete(*r.req);
}

size_t LocalFabric::fail_pending(int peer, const PeerError& error) {
  auto e = std::make_exception_ptr(error);
  std::vector<RequestPtr> doomed;
  {
    // Receives from the peer that nothing has matched yet.
    auto& mine = hub_->box(rank());
    std::lock_guard lock(mine.mu);
    for (auto it = mine.posted.begin(); it != mine.posted.end();) {
      if (tag_source(it->first) == peer) {
        for (auto& r : it->second) doomed.push_back(r.req);
        it = mine.posted.erase(it);
      } else {
        ++it;
      }
    }
  }
  {
    // Large sends to the peer that it will never receive.
    auto& theirs = hub_->box(peer);
    std::lock_guard lock(theirs.mu);
    for (auto& [tag, q] : theirs.unexpected) {
      if (tag_source(tag) != rank()) continue;
      for (auto it = q.begin(); it != q.end();) {
        if (it->req) {
          doomed.push_back(it->req);
          it = q.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  for (auto& r : doomed) fail(*r, e);
  return doomed.size();
}

}  // namespace baton::transport::detail
