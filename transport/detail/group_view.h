// GroupView: what a collective algorithm sees of its group: its rank and size, the
// global ranks, and send/recv/wait in group ranks with the collective's own tags.
// Algorithms know nothing of the backend underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "memory/allocator.h"
#include "transport/detail/fabric.h"
#include "transport/detail/tag.h"

namespace baton::transport::detail {

struct GroupView {
  Fabric& fabric;
  uint16_t context;
  int rank;  // in the group
  int size;
  std::span<const int> globals;  // group rank -> global rank
  uint32_t seq;                  // this collective's sequence number in the group

  RequestPtr send(const void* data, size_t bytes, int to, uint64_t step) const {
    return fabric.isend(data, bytes, globals[size_t(to)],
                        make_tag(context, fabric.rank(), true, collective_tag(seq, step)));
  }
  RequestPtr recv(void* data, size_t bytes, int from, uint64_t step) const {
    int src = globals[size_t(from)];
    return fabric.irecv(data, bytes, src, make_tag(context, src, true, collective_tag(seq, step)));
  }
  // Waits for one request; fails as soon as any member of the group has failed.
  void wait(const RequestPtr& r) const { fabric.wait(*r, globals); }
  void wait_all(std::span<const RequestPtr> rs) const {
    for (const auto& r : rs)
      if (r) wait(r);
  }
};

// Memory a failed collective may still receive into, kept for the process's life: never
// given back, and reachable (from here), so that leak checkers do not count it.
template <class T>
void keep_for_late_messages(T value) {
  static std::mutex mu;
  static auto* kept = new std::vector<T>();
  std::lock_guard lock(mu);
  kept->push_back(std::move(value));
}

// A temporary buffer from the pooled host allocator: collectives reuse the same blocks
// call after call instead of faulting in fresh pages. Up to kInline bytes come from the
// thread's own blocks: small collectives take no lock.
//
// A collective that fails (a peer gone, sizes that disagree) leaves receives posted into
// its scratch, which a live peer's late message may still fill: a block freed then had
// been written after its reuse (a new tensor, or the stack when small blocks lived in the
// object). So a Scratch destroyed by an exception is not given back.
class Scratch {
 public:
  static constexpr size_t kInline = 1024;
  explicit Scratch(size_t bytes)
      : bytes_(bytes),
        unwinding_(std::uncaught_exceptions()),
        data_(bytes > kInline
                  ? static_cast<char*>(memory::allocator_for(memory::Device::cpu()).allocate(bytes))
                  : small_blocks().take()) {}
  ~Scratch() {
    if (std::uncaught_exceptions() > unwinding_) {  // may still be written: kept
      keep_for_late_messages(data_);
      return;
    }
    if (bytes_ > kInline)
      memory::allocator_for(memory::Device::cpu()).deallocate(data_, bytes_);
    else
      small_blocks().give(data_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* data() const { return data_; }

 private:
  // A thread's free small blocks (kInline bytes, 64-byte aligned).
  struct SmallBlocks {
    static constexpr std::align_val_t kAlign{64};
    std::vector<char*> free;
    char* take() {
      if (free.empty()) return static_cast<char*>(::operator new(kInline, kAlign));
      char* p = free.back();
      free.pop_back();
      return p;
    }
    void give(char* p) { free.push_back(p); }
    ~SmallBlocks() {
      for (char* p : free) ::operator delete(p, kAlign);
    }
  };
  static SmallBlocks& small_blocks() {
    thread_local SmallBlocks blocks;
    return blocks;
  }

  size_t bytes_;
  int unwinding_;
  char* data_;
};

}  // namespace baton::transport::detail
