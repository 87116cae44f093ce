#include "transport/nccl_communicator.h"

#ifdef BATON_HAVE_NCCL

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "memory/cuda_check.h"
#include "memory/cuda_device.h"
#include "transport/detail/nccl_rendezvous.h"
#include "transport/detail/nccl_watchdog.h"

// The communicators are nonblocking (so that a hung initialisation or launch can be
// aborted): a call may return ncclInProgress, and settle() waits for it to complete.
#define BATON_NCCL_CHECK(call)                                                          \
  do {                                                                                  \
    ncclResult_t baton_nccl_res_ = (call);                                              \
    if (baton_nccl_res_ != ncclSuccess && baton_nccl_res_ != ncclInProgress)            \
      ::baton::transport::throw_nccl_error(baton_nccl_res_, #call, __FILE__, __LINE__); \
  } while (0)

namespace baton::transport {

[[noreturn]] void throw_nccl_error(ncclResult_t res, const char* call, const char* file, int line) {
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                     " failed: " + ncclGetErrorString(res));
}

namespace {

namespace mc = memory::cuda;
using memory::DType;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  throw std::logic_error("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  throw std::logic_error("nccl: unknown reduce op");
}

// The NCCL handle, shared with the watchdog's abort. Every NCCL call on it is made with
// `mu` held; as the communicator is nonblocking no call blocks, so the abort (which takes
// `mu` too) never waits long, and no call ever sees a handle the abort has freed.
struct CommHandle {
  std::mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  void abort() {
    std::lock_guard lock(mu);
    if (comm != nullptr) (void)ncclCommAbort(comm);
    comm = nullptr;
  }
};

// What a timed-out initialisation says: the missing peer (-1: unknown or several) and why.
struct Missing {
  int peer = -1;
  std::string what;
};

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, std::vector<Tensor> keep, bool host_blocking)
      : comm_(comm), keep_(std::move(keep)), host_blocking_(host_blocking) {}
  ~NcclWork() override;
  bool test() override;
  void wait() override;
  void set_done(std::shared_ptr<mc::Event> e) { done_ = std::move(e); }

 private:
  NcclCommunicator* comm_;
  std::vector<Tensor> keep_;  // the tensors stay alive while NCCL may use them
  bool host_blocking_;
  std::shared_ptr<mc::Event> done_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator,
                               public std::enable_shared_from_this<NcclCommunicator> {
 public:
  // Each communicator has a stream of its own (a split group's collectives overlap its
  // parent's), high priority so that a transfer on the critical path is not queued
  // behind compute.
  NcclCommunicator(std::shared_ptr<CommHandle> handle, int rank, int size, int device,
                   std::vector<int> global, std::chrono::milliseconds timeout,
                   std::unique_ptr<detail::Watchdog> dog)
      : h_(std::move(handle)),
        rank_(rank),
        size_(size),
        device_(device),
        global_(std::move(global)),
        own_stream_(std::make_unique<mc::Stream>(device, true)),
        stream_(static_cast<cudaStream_t>(own_stream_->handle())),
        timeout_(timeout),
        dog_(std::move(dog)) {}
  // Destructors do not throw: failures here are ignored on purpose. The watchdog stops
  // first (after that nothing aborts the handle behind our back); queued operations are
  // waited for, within the timeout (a communicator must not be destroyed under running
  // NCCL kernels, but a receive posted ahead whose send never comes would hold an
  // unbounded wait forever); an aborted communicator is already gone. Destroyed while an
  // exception unwinds (the rank failed: its peers will not send what its receives wait
  // for), it aborts at once, so the rank's own error is reported now, not after the
  // peer timeout.
  ~NcclCommunicator() override {
    dog_->stop();
    std::lock_guard lock(h_->mu);
    if (h_->comm == nullptr) return;
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(device_);
    const bool unwinding = std::uncaught_exceptions() > 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool drained = false;
    while (!unwinding) {
      const cudaError_t q = cudaStreamQuery(stream_);
      drained = q == cudaSuccess;
      if (q != cudaErrorNotReady || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // Nonblocking: finalize, wait for it (bounded), then destroy; abort when it hangs.
    bool finalized = drained && ncclCommFinalize(h_->comm) == ncclSuccess;
    for (ncclResult_t st = ncclInProgress; drained && !finalized;) {
      if (ncclCommGetAsyncError(h_->comm, &st) != ncclSuccess ||
          (st != ncclInProgress && st != ncclSuccess) ||
          std::chrono::steady_clock::now() > deadline)
        break;
      finalized = st == ncclSuccess;
      if (!finalized) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (finalized)
      (void)ncclCommDestroy(h_->comm);
    else
      (void)ncclCommAbort(h_->comm);
    h_->comm = nullptr;
    if (previous >= 0) (void)cudaSetDevice(previous);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int global_rank(int r) const override { return global_.at(size_t(r)); }
  std::string backend() const override { return "nccl"; }

  WorkPtr isend(const Tensor& t, int dst, uint64_t) override {
    check(t, "isend");
    check_peer(dst, "isend");
    std::lock_guard lock(mu_);
    auto w = std::make_shared<NcclWork>(this, std::vector<Tensor>{t}, false);
    pending_.push_back({true, t, dst, w});
    if (launch_at_once_) flush_locked();
    return w;
  }
  WorkPtr irecv(Tensor& t, int src, uint64_t) override {
    check(t, "irecv");
    check_peer(src, "irecv");
    std::lock_guard lock(mu_);
    auto w = std::make_shared<NcclWork>(this, std::vector<Tensor>{t}, false);
    pending_.push_back({false, t, src, w});
    if (launch_at_once_) flush_locked();
    return w;
  }
  // Each send and receive launched when posted, alone (nccl_split_p2p): for a
  // communicator that carries one direction of one pair, whose operations the peer posts
  // in the same order, grouping would only make a receive wait for the later ones.
  void launch_at_once() { launch_at_once_ = true; }

  WorkPtr broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    check_peer(root, "broadcast");
    return collective({t}, false, [&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()),
                                     nccl_type(t.dtype()), root, c, stream_));
    });
  }

  WorkPtr all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    return collective({t}, false, [&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()),
                                     nccl_type(t.dtype()), nccl_op(op), c, stream_));
    });
  }

  WorkPtr all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    check(in, "all_gather");
    check(out, "all_gather");
    // Named, not a structured binding: the launch lambdas capture them.
    const auto cut = parts(counts, in.numel(), out.numel(), "all_gather", in.numel());
    const std::vector<int64_t>&cnt = cut.first, &off = cut.second;
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    return collective({in, out}, false, [&](ncclComm_t c) {
      if (equal(cnt)) {
        BATON_NCCL_CHECK(
            ncclAllGather(in.raw_data(), out.raw_data(), size_t(cnt[0]), ty, c, stream_));
        return;
      }
      BATON_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        char* dst = static_cast<char*>(out.raw_data()) + size_t(off[size_t(r)]) * es;
        BATON_NCCL_CHECK(ncclBroadcast(r == rank_ ? in.raw_data() : dst, dst,
                                       size_t(cnt[size_t(r)]), ty, r, c, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                         std::span<const int64_t> counts) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    // Named, not a structured binding: the launch lambdas capture them.
    const auto cut = parts(counts, out.numel(), in.numel(), "reduce_scatter", out.numel());
    const std::vector<int64_t>&cnt = cut.first, &off = cut.second;
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    return collective({in, out}, false, [&](ncclComm_t c) {
      if (equal(cnt)) {
        BATON_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(cnt[0]), ty,
                                           nccl_op(op), c, stream_));
        return;
      }
      BATON_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        const char* src = static_cast<const char*>(in.raw_data()) + size_t(off[size_t(r)]) * es;
        BATON_NCCL_CHECK(ncclReduce(src, out.raw_data() /* written on root r only */,
                                    size_t(cnt[size_t(r)]), ty, nccl_op(op), r, c, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                  std::span<const int64_t> counts) override {
    check(out, "scatter");
    check_peer(root, "scatter");
    if (rank_ == root) check(in, "scatter");
    const int64_t total = rank_ == root ? in.numel() : -1;
    // Named, not a structured binding: the launch lambdas capture them.
    const auto cut = parts(counts, out.numel(), total, "scatter", out.numel());
    const std::vector<int64_t>&cnt = cut.first, &off = cut.second;
    const size_t es = memory::dtype_size(out.dtype());
    const ncclDataType_t ty = nccl_type(out.dtype());
    std::vector<Tensor> keep{out};
    if (rank_ == root) keep.push_back(in);
    return collective(std::move(keep), false, [&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclGroupStart());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          const char* src = static_cast<const char*>(in.raw_data()) + size_t(off[size_t(r)]) * es;
          if (r == rank_)
            BATON_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), src, size_t(cnt[size_t(r)]) * es,
                                             cudaMemcpyDeviceToDevice, stream_));
          else
            BATON_NCCL_CHECK(ncclSend(src, size_t(cnt[size_t(r)]), ty, r, c, stream_));
        }
      } else {
        BATON_NCCL_CHECK(ncclRecv(out.raw_data(), size_t(out.numel()), ty, root, c, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr gather(const Tensor& in, Tensor& out, int root,
                 std::span<const int64_t> counts) override {
    check(in, "gather");
    check_peer(root, "gather");
    if (rank_ == root) check(out, "gather");
    const int64_t total = rank_ == root ? out.numel() : -1;
    // Named, not a structured binding: the launch lambdas capture them.
    const auto cut = parts(counts, in.numel(), total, "gather", in.numel());
    const std::vector<int64_t>&cnt = cut.first, &off = cut.second;
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    std::vector<Tensor> keep{in};
    if (rank_ == root) keep.push_back(out);
    return collective(std::move(keep), false, [&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclGroupStart());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          char* dst = static_cast<char*>(out.raw_data()) + size_t(off[size_t(r)]) * es;
          if (r == rank_)
            BATON_CUDA_CHECK(cudaMemcpyAsync(dst, in.raw_data(), size_t(cnt[size_t(r)]) * es,
                                             cudaMemcpyDeviceToDevice, stream_));
          else
            BATON_NCCL_CHECK(ncclRecv(dst, size_t(cnt[size_t(r)]), ty, r, c, stream_));
        }
      } else {
        BATON_NCCL_CHECK(ncclSend(in.raw_data(), size_t(in.numel()), ty, root, c, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr barrier() override {
    Tensor one = Tensor::empty({1}, DType::f32, memory::Device::cuda(device_));
    return collective({one}, true, [&](ncclComm_t c) {
      BATON_NCCL_CHECK(
          ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, c, stream_));
    });
  }

  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    // Members only: the first member makes an id and sends it to the others over this
    // communicator (ncclCommSplit would need every rank of this group to call).
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    if (me == ranks.end())
      throw std::logic_error("nccl split: rank " + std::to_string(rank_) + " is not in the list");
    const int sub_rank = int(me - ranks.begin()), sub_size = int(ranks.size());
    NcclId id{};
    Tensor dev = Tensor::empty({int64_t(sizeof id / 4)}, DType::i32, memory::Device::cuda(device_));
    if (sub_rank == 0) {
      id = nccl_unique_id();
      Tensor host =
          Tensor::from_blob(id.data(), {int64_t(sizeof id / 4)}, DType::i32, memory::Device::cpu());
      dev.copy_from(host);
      std::vector<WorkPtr> works;
      for (int i = 1; i < sub_size; ++i) works.push_back(isend(dev, ranks[size_t(i)], 0));
      for (auto& w : works) w->wait();
      mc::synchronize(device_);
    } else {
      irecv(dev, ranks[0], 0)->wait();
      Tensor host = dev.to(memory::Device::cpu());
      std::memcpy(id.data(), host.raw_data(), sizeof id);
    }
    std::vector<int> global;
    for (int r : ranks) global.push_back(global_rank(r));
    return create(id, sub_rank, sub_size, device_, std::move(global), timeout_);
  }

  // Initialisation is nonblocking and watched like any launch: when a rank never joins,
  // the communicator is aborted after `timeout` and PeerError names the missing rank
  // (`missing` asks the rendezvous store who did not arrive; without a store, the peer
  // of a pair, else -1).
  static std::shared_ptr<NcclCommunicator> create(const NcclId& id, int rank, int size, int device,
                                                  std::vector<int> global,
                                                  std::chrono::milliseconds timeout,
                                                  const std::function<Missing()>& missing = {}) {
    if (rank < 0 || rank >= size)
      throw std::logic_error("nccl: rank " + std::to_string(rank) + " of " + std::to_string(size));
    mc::DeviceGuard guard(device);
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof(NcclId));
    std::memcpy(&uid, id.data(), sizeof uid);
    const std::string group = group_str(global);
    auto h = std::make_shared<CommHandle>();
    auto dog = std::make_unique<detail::Watchdog>(timeout, group, [h] { h->abort(); });
    dog->launch_begin(-1, "joining");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    {
      std::lock_guard lock(h->mu);
      ncclComm_t comm = nullptr;
      BATON_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, uid, rank, &config));
      h->comm = comm;
    }
    for (;;) {
      ncclResult_t st = ncclInProgress;
      std::string last;
      bool gone = false;
      {
        std::lock_guard lock(h->mu);
        gone = h->comm == nullptr;
        if (!gone && ncclCommGetAsyncError(h->comm, &st) != ncclSuccess) st = ncclInternalError;
        if (!gone && st != ncclSuccess && st != ncclInProgress) last = ncclGetLastError(h->comm);
      }
      if (st == ncclSuccess && !gone) break;
      if (dog->aborted() || gone) {
        dog->stop();
        h->abort();
        Missing m = missing ? missing() : Missing{};
        if (!missing && size == 2) m.peer = global.at(size_t(1 - rank));
        if (m.what.empty())
          m.what = size == 2
                       ? "rank " + std::to_string(m.peer) + " never joined"
                       : "not every rank joined (start them all, or ask the rendezvous store)";
        throw PeerError(
            m.peer, "nccl: rank " + std::to_string(global.at(size_t(rank))) + " of the group " +
                        group + " waited " + std::to_string(timeout.count()) +
                        " ms for the others to join: " + m.what + "; the communicator was aborted");
      }
      if (st != ncclInProgress) {
        dog->stop();
        h->abort();
        throw RuntimeError("nccl: initialising rank " + std::to_string(rank) + " of the group " +
                           group + " failed: " + ncclGetErrorString(st) + " (" + last + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    dog->launch_cancel();
    return std::make_shared<NcclCommunicator>(std::move(h), rank, size, device, std::move(global),
                                              timeout, std::move(dog));
  }

  // Launches the queued point-to-point operations as one group; with mu_ held.
  void flush_locked() {
    if (pending_.empty()) return;
    // The peer the watchdog names if this group hangs: the only one, or none.
    int peer = global_rank(pending_.front().peer);
    for (auto& p : pending_)
      if (global_rank(p.peer) != peer) peer = -1;
    std::vector<Tensor> keep;
    for (auto& p : pending_) keep.push_back(p.t);
    auto done = launch_watched(peer, std::move(keep), [&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclGroupStart());
      for (auto& p : pending_) {
        if (p.send)
          BATON_NCCL_CHECK(ncclSend(p.t.raw_data(), size_t(p.t.numel()), nccl_type(p.t.dtype()),
                                    p.peer, c, stream_));
        else
          BATON_NCCL_CHECK(ncclRecv(p.t.raw_data(), size_t(p.t.numel()), nccl_type(p.t.dtype()),
                                    p.peer, c, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
    // A work dropped before this flush has no one to hand the event to: its tensors
    // are kept by the watchdog until the event completes all the same.
    for (auto& p : pending_)
      if (auto w = p.work.lock()) w->set_done(done);
    pending_.clear();
  }

  void flush() {
    std::lock_guard lock(mu_);
    flush_locked();
  }

  // Throws PeerError after an abort, RuntimeError for NCCL's asynchronous errors.
  void check_async_error() {
    dog_->check();
    dog_->reap();
    (void)async_state();
  }

  int device() const { return device_; }

 private:
  struct Pending {
    bool send;
    Tensor t;
    int peer;
    std::weak_ptr<NcclWork> work;
  };

  void check(const Tensor& t, const char* op) const {
    if (!t.defined() || !t.device().is_cuda() || t.device().index != device_ || !t.is_contiguous())
      throw std::logic_error(std::string("nccl ") + op + ": needs a contiguous tensor on cuda:" +
                             std::to_string(device_) + ", got " + t.str());
  }
  void check_peer(int r, const char* op) const {
    if (r < 0 || r >= size_)
      throw std::logic_error(std::string("nccl ") + op + ": rank " + std::to_string(r) +
                             " outside a group of " + std::to_string(size_));
  }
  static bool equal(const std::vector<int64_t>& c) {
    return std::all_of(c.begin(), c.end(), [&](int64_t x) { return x == c[0]; });
  }
  // Part sizes and offsets; `mine` must equal this rank's part, `total` (if >= 0) their sum.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> parts(std::span<const int64_t> counts,
                                                              int64_t mine, int64_t total,
                                                              const char* op,
                                                              int64_t equal_part) const {
    std::vector<int64_t> c(counts.begin(), counts.end());
    if (c.empty()) c.assign(size_t(size_), equal_part);
    if (int(c.size()) != size_)
      throw std::logic_error(std::string("nccl ") + op + ": counts needs one entry per rank");
    std::vector<int64_t> off(c.size(), 0);
    for (size_t r = 1; r < c.size(); ++r) off[r] = off[r - 1] + c[r - 1];
    const int64_t sum = off.back() + c.back();
    if (c[size_t(rank_)] != mine || (total >= 0 && total != sum))
      throw std::logic_error(std::string("nccl ") + op + ": tensor sizes do not match the counts");
    return {c, off};
  }
  // The communication stream waits for what the caller queued before this call.
  void order_after_caller() {
    mc::Event ready(device_);
    ready.record(mc::current_stream(device_));
    ready.block(stream_);
  }
  template <class F>
  WorkPtr collective(std::vector<Tensor> keep, bool host_blocking, F&& launch) {
    std::lock_guard lock(mu_);
    flush_locked();  // earlier point-to-point first: NCCL runs a communicator's calls in order
    auto w = std::make_shared<NcclWork>(this, keep, host_blocking);
    w->set_done(launch_watched(-1, std::move(keep), launch));
    return w;
  }

  // Runs `calls(comm)` (NCCL calls) under the watchdog: ordered after the caller's
  // stream, settled (nonblocking calls complete), an event recorded after them. The
  // watchdog keeps `keep` until that event has completed, whatever becomes of the Work,
  // so no tensor returns to the pool while the stream may still use it. A failure after
  // the watchdog aborted is the peer's (PeerError), not NCCL's.
  template <class F>
  std::shared_ptr<mc::Event> launch_watched(int peer, std::vector<Tensor> keep, F&& calls) {
    mc::DeviceGuard guard(device_);
    order_after_caller();
    dog_->check();
    dog_->reap();
    dog_->launch_begin(peer);
    try {
      with_comm(calls);
      settle();
    } catch (const RuntimeError&) {
      dog_->launch_cancel();
      dog_->check();
      throw;
    }
    auto done = std::make_shared<mc::Event>(device_);
    done->record(stream_);
    dog_->launch_end([done] { return done->query(); }, std::move(keep));
    return done;
  }

  // Calls f(comm) with the handle locked; throws once the handle is gone (aborted).
  template <class F>
  void with_comm(F&& f) {
    {
      std::lock_guard lock(h_->mu);
      if (h_->comm != nullptr) {
        f(h_->comm);
        return;
      }
    }
    dog_->check();
    throw RuntimeError("nccl: the communicator of the group " + group_str(global_) + " is gone");
  }

  // NCCL's asynchronous state: ncclSuccess or ncclInProgress; throws for an error.
  ncclResult_t async_state() {
    ncclResult_t st = ncclSuccess;
    std::string last;
    with_comm([&](ncclComm_t c) {
      BATON_NCCL_CHECK(ncclCommGetAsyncError(c, &st));
      if (st != ncclSuccess && st != ncclInProgress) last = ncclGetLastError(c);
    });
    if (st != ncclSuccess && st != ncclInProgress) {
      dog_->check();
      throw RuntimeError(std::string("nccl: communication failed: ") + ncclGetErrorString(st) +
                         " (" + last + ")");
    }
    return st;
  }

  // Waits until the nonblocking calls just made have been queued on the stream (the
  // watchdog's time-out covers the wait: its abort ends it with PeerError).
  void settle() {
    while (async_state() == ncclInProgress)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

  static std::string group_str(const std::vector<int>& g) {
    std::string s = "[";
    for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + std::to_string(g[i]);
    return s + "]";
  }

  std::shared_ptr<CommHandle> h_;
  int rank_, size_, device_;
  std::vector<int> global_;
  std::unique_ptr<mc::Stream> own_stream_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<Pending> pending_;
  bool launch_at_once_ = false;
  std::unique_ptr<detail::Watchdog> dog_;
};

// Dropping a Work needs nothing: the watchdog keeps its tensors until its event has
// completed (so the pool does not hand them out while the communication stream still
// reads or writes them), and a result nobody waited for is not to be read.
NcclWork::~NcclWork() = default;

bool NcclWork::test() {
  if (!done_) comm_->flush();
  comm_->check_async_error();
  return done_->query();
}

void NcclWork::wait() {
  if (!done_) comm_->flush();
  comm_->check_async_error();
  if (host_blocking_) {
    done_->synchronize();
  } else {
    done_->block(mc::current_stream(done_->device()));
  }
  comm_->check_async_error();
  waited_ = true;
}

}  // namespace

bool nccl_available() {
  return true;
}

NcclId nccl_unique_id() {
  ncclUniqueId uid;
  BATON_NCCL_CHECK(ncclGetUniqueId(&uid));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

CommPtr nccl_split_p2p(Communicator& nccl, const std::vector<int>& ranks) {
  auto* parent = dynamic_cast<NcclCommunicator*>(&nccl);
  if (parent == nullptr)
    throw std::logic_error("nccl_split_p2p: a " + nccl.backend() + " communicator");
  auto sub = std::static_pointer_cast<NcclCommunicator>(parent->split(ranks));
  sub->launch_at_once();
  return sub;
}

CommPtr make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                               std::chrono::milliseconds peer_timeout) {
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  return NcclCommunicator::create(id, rank, size, device, std::move(global), peer_timeout);
}

CommPtr make_nccl_communicator(Store& store, const std::string& key, int rank, int size, int device,
                               std::chrono::milliseconds timeout,
                               std::chrono::milliseconds peer_timeout) {
  // A key of this initialisation's own: a second communicator under `key` (or a
  // restarted job whose store lives on) never reads an old id.
  const std::string init_key = detail::nccl_init_key(store, key, size);
  NcclId id{};
  if (rank == 0) {
    id = nccl_unique_id();
    store.set(init_key, std::string(id.data(), id.size()));
  } else {
    const std::string v = store.get(init_key, timeout);
    if (v.size() != id.size())
      throw RuntimeError("nccl: the id under '" + init_key + "' has " + std::to_string(v.size()) +
                         " bytes, expected " + std::to_string(id.size()));
    std::memcpy(id.data(), v.data(), id.size());
  }
  detail::mark_joined(store, init_key, rank);
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  // When the initialisation times out, the store says who never arrived.
  auto missing = [&store, &init_key, &global, size] {
    const std::vector<int> m = detail::missing_ranks(store, init_key, size);
    return Missing{m.size() == 1 ? global[size_t(m[0])] : -1, detail::describe_missing(m, global)};
  };
  return NcclCommunicator::create(id, rank, size, device, global, peer_timeout, missing);
}

CommPtr make_nccl_world(const LaunchEnv& env, Store* store, const std::string& prefix,
                        std::chrono::milliseconds peer_timeout) {
  const int gpus = mc::device_count();
  if (env.local_rank >= gpus)
    throw RuntimeError("nccl: rank " + std::to_string(env.rank) + " is local rank " +
                       std::to_string(env.local_rank) + " but this host has " +
                       std::to_string(gpus) + " CUDA devices" +
                       (gpus == 0 ? " (" + mc::unavailable_reason() + ")" : ""));
  if (env.size == 1)
    return make_nccl_communicator(nccl_unique_id(), 0, 1, env.local_rank, peer_timeout);
  if (store == nullptr)
    throw std::logic_error("nccl: a world of " + std::to_string(env.size) +
                           " ranks without a store");
  return make_nccl_communicator(*store, prefix + "/nccl/world", env.rank, env.size, env.local_rank,
                                std::chrono::milliseconds(60'000), peer_timeout);
}

}  // namespace baton::transport

#else  // built without NCCL

namespace baton::transport {

namespace {
[[noreturn]] void no_nccl() {
  throw RuntimeError("baton was built without NCCL (needs CUDA and NCCL at build time)");
}
}  // namespace

bool nccl_available() {
  return false;
}
NcclId nccl_unique_id() {
  no_nccl();
}
CommPtr nccl_split_p2p(Communicator&, const std::vector<int>&) {
  no_nccl();
}
CommPtr make_nccl_communicator(const NcclId&, int, int, int, std::chrono::milliseconds) {
  no_nccl();
}
CommPtr make_nccl_communicator(Store&, const std::string&, int, int, int, std::chrono::milliseconds,
                               std::chrono::milliseconds) {
  no_nccl();
}
CommPtr make_nccl_world(const LaunchEnv&, Store*, const std::string&, std::chrono::milliseconds) {
  no_nccl();
}

}  // namespace baton::transport

#endif
