#include "transport/nccl_communicator.h"

#ifdef BATON_HAVE_NCCL

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "memory/cuda_check.h"
#include "memory/cuda_device.h"

#define BATON_NCCL_CHECK(call)                                                               \
  do {                                                                                       \
    ncclResult_t baton_nccl_res_ = (call);                                                   \
    if (baton_nccl_res_ != ncclSuccess)                                                      \
      ::baton::transport::throw_nccl_error(baton_nccl_res_, #call, __FILE__, __LINE__);      \
  } while (0)

namespace baton::transport {

[[noreturn]] void throw_nccl_error(ncclResult_t res, const char* call, const char* file, int line) {
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                     ncclGetErrorString(res));
}

namespace {

namespace mc = memory::cuda;
using memory::DType;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  throw std::logic_error("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  throw std::logic_error("nccl: unknown reduce op");
}

// Watches a communicator's operations. One that has not finished `timeout` after its
// launch began means a peer is gone or stuck (NCCL itself would wait forever): the
// communicator is aborted, which makes NCCL's kernels and any blocked NCCL call return,
// and every later test() or wait() throws PeerError.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  Watchdog(ncclComm_t comm, std::chrono::milliseconds timeout, std::string group)
      : comm_(comm), timeout_(timeout), group_(std::move(group)), thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Host-blocking NCCL calls (connection set-up waits for the peer) are watched too.
  void launch_begin(int peer) {
    std::lock_guard lock(mu_);
    launch_start_ = Clock::now();
    launch_peer_ = peer;
    launching_ = true;
  }
  void launch_end(std::shared_ptr<mc::Event> done) {
    std::lock_guard lock(mu_);
    launching_ = false;
    items_.push_back({std::move(done), launch_start_, launch_peer_});
  }
  bool aborted() const { return aborted_.load(); }
  void check() const {
    if (!aborted_.load()) return;
    std::lock_guard lock(mu_);
    throw PeerError(failed_peer_, failed_what_);
  }

 private:
  struct Item {
    std::shared_ptr<mc::Event> done;
    Clock::time_point start;
    int peer;
  };

  void run() {
    std::unique_lock lock(mu_);
    while (!stop_ && !aborted_.load()) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      const auto now = Clock::now();
      int late_peer = -2;
      if (launching_ && now - launch_start_ > timeout_) late_peer = launch_peer_;
      for (auto it = items_.begin(); it != items_.end() && late_peer == -2;) {
        bool done = false;
        try {
          done = it->done->query();
        } catch (const std::exception&) {
          done = true;  // the error surfaces through NCCL's asynchronous error
        }
        if (done) {
          it = items_.erase(it);
        } else if (now - it->start > timeout_) {
          late_peer = it->peer;
        } else {
          ++it;
        }
      }
      if (late_peer == -2) continue;
      failed_peer_ = late_peer;
      failed_what_ = "nccl: an operation of the group " + group_ + " did not finish within " +
                     std::to_string(timeout_.count()) + " ms" +
                     (late_peer >= 0 ? " (waiting on rank " + std::to_string(late_peer) + ")" : "") +
                     "; the communicator was aborted";
      (void)ncclCommAbort(comm_);
      aborted_.store(true);
    }
  }

  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  std::string group_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool launching_ = false;
  Clock::time_point launch_start_{};
  int launch_peer_ = -1;
  std::vector<Item> items_;
  std::atomic<bool> aborted_{false};
  int failed_peer_ = -1;
  std::string failed_what_;
  std::thread thread_;  // last: starts once everything above exists
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

class NcclCommunicator final : public Communicator, public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::vector<int> global,
                   std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), device_(device), global_(std::move(global)),
        stream_(static_cast<cudaStream_t>(mc::comm_stream(device))), timeout_(timeout),
        dog_(std::make_unique<Watchdog>(comm, timeout, group_str(global_))) {}
  // Destructors do not throw: failures here are ignored on purpose. Queued operations are
  // waited for first (a communicator must not be destroyed under running NCCL kernels);
  // an aborted communicator is already gone.
  ~NcclCommunicator() override {
    const bool aborted = dog_->aborted();
    dog_.reset();
    if (comm_ == nullptr || aborted) return;
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_);
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
    return w;
  }
  WorkPtr irecv(Tensor& t, int src, uint64_t) override {
    check(t, "irecv");
    check_peer(src, "irecv");
    std::lock_guard lock(mu_);
    auto w = std::make_shared<NcclWork>(this, std::vector<Tensor>{t}, false);
    pending_.push_back({false, t, src, w});
    return w;
  }

  WorkPtr broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    check_peer(root, "broadcast");
    return collective({t}, false, [&] {
      BATON_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()),
                                     root, comm_, stream_));
    });
  }

  WorkPtr all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    return collective({t}, false, [&] {
      BATON_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()),
                                     nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    check(in, "all_gather");
    check(out, "all_gather");
    auto [cnt, off] = parts(counts, in.numel(), out.numel(), "all_gather", in.numel());
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    return collective({in, out}, false, [&] {
      if (equal(cnt)) {
        BATON_NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), size_t(cnt[0]), ty, comm_, stream_));
        return;
      }
      BATON_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        char* dst = static_cast<char*>(out.raw_data()) + size_t(off[size_t(r)]) * es;
        BATON_NCCL_CHECK(ncclBroadcast(r == rank_ ? in.raw_data() : dst, dst, size_t(cnt[size_t(r)]), ty, r,
                                       comm_, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, std::span<const int64_t> counts) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    auto [cnt, off] = parts(counts, out.numel(), in.numel(), "reduce_scatter", out.numel());
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    return collective({in, out}, false, [&] {
      if (equal(cnt)) {
        BATON_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(cnt[0]), ty, nccl_op(op), comm_,
                                           stream_));
        return;
      }
      BATON_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        const char* src = static_cast<const char*>(in.raw_data()) + size_t(off[size_t(r)]) * es;
        BATON_NCCL_CHECK(ncclReduce(src, out.raw_data() /* written on root r only */, size_t(cnt[size_t(r)]), ty,
                                    nccl_op(op), r, comm_, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr scatter(const Tensor& in, Tensor& out, int root, std::span<const int64_t> counts) override {
    check(out, "scatter");
    check_peer(root, "scatter");
    if (rank_ == root) check(in, "scatter");
    const int64_t total = rank_ == root ? in.numel() : -1;
    auto [cnt, off] = parts(counts, out.numel(), total, "scatter", out.numel());
    const size_t es = memory::dtype_size(out.dtype());
    const ncclDataType_t ty = nccl_type(out.dtype());
    std::vector<Tensor> keep{out};
    if (rank_ == root) keep.push_back(in);
    return collective(std::move(keep), false, [&] {
      BATON_NCCL_CHECK(ncclGroupStart());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          const char* src = static_cast<const char*>(in.raw_data()) + size_t(off[size_t(r)]) * es;
          if (r == rank_)
            BATON_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), src, size_t(cnt[size_t(r)]) * es,
                                             cudaMemcpyDeviceToDevice, stream_));
          else
            BATON_NCCL_CHECK(ncclSend(src, size_t(cnt[size_t(r)]), ty, r, comm_, stream_));
        }
      } else {
        BATON_NCCL_CHECK(ncclRecv(out.raw_data(), size_t(out.numel()), ty, root, comm_, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr gather(const Tensor& in, Tensor& out, int root, std::span<const int64_t> counts) override {
    check(in, "gather");
    check_peer(root, "gather");
    if (rank_ == root) check(out, "gather");
    const int64_t total = rank_ == root ? out.numel() : -1;
    auto [cnt, off] = parts(counts, in.numel(), total, "gather", in.numel());
    const size_t es = memory::dtype_size(in.dtype());
    const ncclDataType_t ty = nccl_type(in.dtype());
    std::vector<Tensor> keep{in};
    if (rank_ == root) keep.push_back(out);
    return collective(std::move(keep), false, [&] {
      BATON_NCCL_CHECK(ncclGroupStart());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          char* dst = static_cast<char*>(out.raw_data()) + size_t(off[size_t(r)]) * es;
          if (r == rank_)
            BATON_CUDA_CHECK(cudaMemcpyAsync(dst, in.raw_data(), size_t(cnt[size_t(r)]) * es,
                                             cudaMemcpyDeviceToDevice, stream_));
          else
            BATON_NCCL_CHECK(ncclRecv(dst, size_t(cnt[size_t(r)]), ty, r, comm_, stream_));
        }
      } else {
        BATON_NCCL_CHECK(ncclSend(in.raw_data(), size_t(in.numel()), ty, root, comm_, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
  }

  WorkPtr barrier() override {
    Tensor one = Tensor::empty({1}, DType::f32, memory::Device::cuda(device_));
    return collective({one}, true, [&] {
      BATON_NCCL_CHECK(ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, comm_, stream_));
    });
  }

  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    // Members only: the first member makes an id and sends it to the others over this
    // communicator (ncclCommSplit would need every rank of this group to call).
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    if (me == ranks.end()) throw std::logic_error("nccl split: rank " + std::to_string(rank_) + " is not in the list");
    const int sub_rank = int(me - ranks.begin()), sub_size = int(ranks.size());
    NcclId id{};
    Tensor dev = Tensor::empty({int64_t(sizeof id / 4)}, DType::i32, memory::Device::cuda(device_));
    if (sub_rank == 0) {
      id = nccl_unique_id();
      Tensor host = Tensor::from_blob(id.data(), {int64_t(sizeof id / 4)}, DType::i32, memory::Device::cpu());
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

  static std::shared_ptr<NcclCommunicator> create(const NcclId& id, int rank, int size, int device,
                                                  std::vector<int> global, std::chrono::milliseconds timeout) {
    if (rank < 0 || rank >= size) throw std::logic_error("nccl: rank " + std::to_string(rank) + " of " + std::to_string(size));
    mc::DeviceGuard guard(device);
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof(NcclId));
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclComm_t comm = nullptr;
    BATON_NCCL_CHECK(ncclCommInitRank(&comm, size, uid, rank));
    return std::make_shared<NcclCommunicator>(comm, rank, size, device, std::move(global), timeout);
  }

  // Launches the queued point-to-point operations as one group; with mu_ held.
  void flush_locked() {
    if (pending_.empty()) return;
    mc::DeviceGuard guard(device_);
    order_after_caller();
    dog_->check();
    // The peer the watchdog names if this group hangs: the only one, or none.
    int peer = global_rank(pending_.front().peer);
    for (auto& p : pending_)
      if (global_rank(p.peer) != peer) peer = -1;
    dog_->launch_begin(peer);
    watched([&] {
      BATON_NCCL_CHECK(ncclGroupStart());
      for (auto& p : pending_) {
        if (p.send)
          BATON_NCCL_CHECK(ncclSend(p.t.raw_data(), size_t(p.t.numel()), nccl_type(p.t.dtype()), p.peer, comm_, stream_));
        else
          BATON_NCCL_CHECK(ncclRecv(p.t.raw_data(), size_t(p.t.numel()), nccl_type(p.t.dtype()), p.peer, comm_, stream_));
      }
      BATON_NCCL_CHECK(ncclGroupEnd());
    });
    auto done = std::make_shared<mc::Event>(device_);
    done->record(stream_);
    dog_->launch_end(done);
    for (auto& p : pending_)
      if (auto w = p.work.lock()) w->set_done(done);
    pending_.clear();
  }

  void flush() {
    std::lock_guard lock(mu_);
    flush_locked();
  }

  void check_async_error() {
    dog_->check();
    ncclResult_t async = ncclSuccess;
    BATON_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      throw RuntimeError(std::string("nccl: communication failed: ") + ncclGetErrorString(async) + " (" +
                         ncclGetLastError(comm_) + ")");
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
      throw std::logic_error(std::string("nccl ") + op + ": rank " + std::to_string(r) + " outside a group of " +
                             std::to_string(size_));
  }
  static bool equal(const std::vector<int64_t>& c) {
    return std::all_of(c.begin(), c.end(), [&](int64_t x) { return x == c[0]; });
  }
  // Part sizes and offsets; `mine` must equal this rank's part, `total` (if >= 0) their sum.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> parts(std::span<const int64_t> counts, int64_t mine,
                                                              int64_t total, const char* op, int64_t equal_part) const {
    std::vector<int64_t> c(counts.begin(), counts.end());
    if (c.empty()) c.assign(size_t(size_), equal_part);
    if (int(c.size()) != size_) throw std::logic_error(std::string("nccl ") + op + ": counts needs one entry per rank");
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
    mc::DeviceGuard guard(device_);
    order_after_caller();
    dog_->check();
    dog_->launch_begin(-1);
    watched(launch);
    auto done = std::make_shared<mc::Event>(device_);
    done->record(stream_);
    dog_->launch_end(done);
    auto w = std::make_shared<NcclWork>(this, std::move(keep), host_blocking);
    w->set_done(std::move(done));
    return w;
  }

  // Runs NCCL calls that may block on the host; when the watchdog aborted the
  // communicator to free them, the failure is the peer's (PeerError), not NCCL's.
  template <class F>
  void watched(F&& calls) {
    try {
      calls();
    } catch (const RuntimeError&) {
      dog_->check();
      throw;
    }
  }

  static std::string group_str(const std::vector<int>& g) {
    std::string s = "[";
    for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + std::to_string(g[i]);
    return s + "]";
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::vector<int> global_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<Pending> pending_;
  std::unique_ptr<Watchdog> dog_;
};

NcclWork::~NcclWork() {
  // Not waited on: later work on the device's compute stream (which reuses freed
  // blocks of the caching allocator) must still come after NCCL is done with ours.
  if (!waited_ && done_) {
    try {
      done_->block(mc::compute_stream(done_->device()));
    } catch (...) {
    }
  }
}

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

bool nccl_available() { return true; }

NcclId nccl_unique_id() {
  ncclUniqueId uid;
  BATON_NCCL_CHECK(ncclGetUniqueId(&uid));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

CommPtr make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                               std::chrono::milliseconds peer_timeout) {
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  return NcclCommunicator::create(id, rank, size, device, std::move(global), peer_timeout);
}

CommPtr make_nccl_communicator(Store& store, const std::string& key, int rank, int size, int device,
                               std::chrono::milliseconds timeout, std::chrono::milliseconds peer_timeout) {
  NcclId id{};
  if (rank == 0) {
    id = nccl_unique_id();
    store.set(key, std::string(id.data(), id.size()));
  } else {
    const std::string v = store.get(key, timeout);
    if (v.size() != id.size())
      throw RuntimeError("nccl: the id under '" + key + "' has " + std::to_string(v.size()) + " bytes, expected " +
                         std::to_string(id.size()));
    std::memcpy(id.data(), v.data(), id.size());
  }
  return make_nccl_communicator(id, rank, size, device, peer_timeout);
}

CommPtr make_nccl_world(const LaunchEnv& env, Store* store, const std::string& prefix,
                        std::chrono::milliseconds peer_timeout) {
  const int gpus = mc::device_count();
  if (env.local_rank >= gpus)
    throw RuntimeError("nccl: rank " + std::to_string(env.rank) + " is local rank " + std::to_string(env.local_rank) +
                       " but this host has " + std::to_string(gpus) + " CUDA devices" +
                       (gpus == 0 ? " (" + mc::unavailable_reason() + ")" : ""));
  if (env.size == 1) return make_nccl_communicator(nccl_unique_id(), 0, 1, env.local_rank, peer_timeout);
  if (store == nullptr)
    throw std::logic_error("nccl: a world of " + std::to_string(env.size) + " ranks without a store");
  return make_nccl_communicator(*store, prefix + "/nccl/world", env.rank, env.size, env.local_rank,
                                std::chrono::milliseconds(60'000), peer_timeout);
}

}  // namespace baton::transport

#else  // built without NCCL

namespace baton::transport {

namespace {
[[noreturn]] void no_nccl() { throw RuntimeError("baton was built without NCCL (needs CUDA and NCCL at build time)"); }
}  // namespace

bool nccl_available() { return false; }
NcclId nccl_unique_id() { no_nccl(); }
CommPtr make_nccl_communicator(const NcclId&, int, int, int, std::chrono::milliseconds) { no_nccl(); }
CommPtr make_nccl_communicator(Store&, const std::string&, int, int, int, std::chrono::milliseconds,
                               std::chrono::milliseconds) {
  no_nccl();
}
CommPtr make_nccl_world(const LaunchEnv&, Store*, const std::string&, std::chrono::milliseconds) { no_nccl(); }

}  // namespace baton::transport

#endif
