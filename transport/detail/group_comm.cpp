#include "transport/detail/group_comm.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "transport/detail/collectives.h"
#include "transport/detail/tag.h"

namespace baton::transport::detail {

using memory::DType;

namespace {

class P2PWork final : public Work {
 public:
  P2PWork(std::shared_ptr<Fabric> fabric, RequestPtr req, int peer,
          std::shared_ptr<memory::Storage> keep)
      : fabric_(std::move(fabric)), req_(std::move(req)), peer_(peer), keep_(std::move(keep)) {}
  bool test() override { return fabric_->test(*req_, {&peer_, 1}); }
  void wait() override { fabric_->wait(*req_, {&peer_, 1}); }

 private:
  std::shared_ptr<Fabric> fabric_;
  RequestPtr req_;
  int peer_;
  std::shared_ptr<memory::Storage>
      keep_;  // the bytes stay alive while the operation may touch them
};

// A collective's Work and its Job in one object: the executor's queue holds it
// through an aliasing pointer to the job.
template <class F>
class CollectiveWork final : public Work {
 public:
  CollectiveWork(std::shared_ptr<Executor> ex, F fn) : ex_(std::move(ex)), job_(std::move(fn)) {}
  bool test() override { return ex_->test(job_); }
  void wait() override { ex_->wait(job_); }

  struct FnJob final : Job {
    explicit FnJob(F fn) : f(std::move(fn)) {}
    void run() override { f(); }
    F f;
  };
  Job& job() { return job_; }

 private:
  std::shared_ptr<Executor> ex_;
  FnJob job_;
};

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument(what);
}

void check_tensor(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) bad(std::string(op) + ": " + name + " is an undefined tensor");
  if (!t.device().is_cpu())
    bad(std::string(op) + ": " + name + " is on " + t.device().str() +
        "; this backend moves CPU tensors only");
  if (!t.is_contiguous()) bad(std::string(op) + ": " + name + " " + t.str() + " is not contiguous");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    bad(std::string(op) + ": input " + a.str() + " and output " + b.str() + " differ in dtype");
}

}  // namespace

GroupComm::GroupComm(std::shared_ptr<Fabric> fabric, uint16_t context, std::vector<int> globals)
    : fabric_(std::move(fabric)),
      context_(context),
      globals_(std::move(globals)),
      executor_(std::make_shared<Executor>()) {
  auto it = std::find(globals_.begin(), globals_.end(), fabric_->rank());
  BATON_CHECK(it != globals_.end(), "this rank is not a member of the group it builds");
  rank_ = int(it - globals_.begin());
}

GroupComm::~GroupComm() {
  executor_->shutdown();
}

int GroupComm::global_rank(int group_rank) const {
  check_rank(group_rank, "global_rank");
  return globals_[size_t(group_rank)];
}

void GroupComm::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size())
    bad(std::string(what) + ": rank " + std::to_string(r) + " is not in a group of size " +
        std::to_string(size()));
}

GroupView GroupComm::view(uint32_t seq) const {
  return GroupView{*fabric_, context_, rank_, size(), globals_, seq};
}

// ---- point to point ----

WorkPtr GroupComm::isend(const Tensor& t, int dst, uint64_t tag) {
  check_tensor(t, "isend", "tensor");
  check_rank(dst, "isend");
  if (tag > kMaxUserTag)
    bad("isend: tag " + std::to_string(tag) + " exceeds the largest tag " +
        std::to_string(kMaxUserTag));
  int g = globals_[size_t(dst)];
  auto req =
      fabric_->isend(t.raw_data(), t.nbytes(), g, make_tag(context_, fabric_->rank(), false, tag));
  return std::make_shared<P2PWork>(fabric_, std::move(req), g, t.storage());
}

WorkPtr GroupComm::irecv(Tensor& t, int src, uint64_t tag) {
  check_tensor(t, "irecv", "tensor");
  check_rank(src, "irecv");
  if (tag > kMaxUserTag)
    bad("irecv: tag " + std::to_string(tag) + " exceeds the largest tag " +
        std::to_string(kMaxUserTag));
  int g = globals_[size_t(src)];
  auto req = fabric_->irecv(t.raw_data(), t.nbytes(), g, make_tag(context_, g, false, tag));
  return std::make_shared<P2PWork>(fabric_, std::move(req), g, t.storage());
}

// ---- collectives ----

// Collectives at least this large wake the background thread when issued.
constexpr size_t kWakeBytes = size_t(4) << 20;

template <class Fn>
WorkPtr GroupComm::submit(size_t bytes, Keep keep, Fn fn) {
  auto body = [this, fn = std::move(fn), keep = std::move(keep)]() mutable {
    // Jobs run one at a time, in the order they were issued, on every rank: numbering
    // them as they run gives every rank the same sequence, with no lock.
    uint32_t seq = seq_;
    seq_ = (seq_ + 1) % kMaxCollectiveSeq;
    GroupView v = view(seq);
    try {
      fabric_->check_scope(globals_);
      fn(v);
    } catch (...) {
      // A failed job's receives from live peers may still be posted into these bytes:
      // they are never given back (as a failed collective's scratch is not), where the
      // caller's dropping its work had freed them to the pool for a late message to land
      // in whatever took them next.
      keep_for_late_messages(std::move(keep));
      throw;
    }
    // Done with the bytes: let go of them before the job is marked done. The background
    // thread drops its reference to the job some time after the waiter returns, so a kept
    // storage would outlive the caller's last tensor by a timing-dependent moment, and a
    // rank's peak memory with it.
    keep = {};
  };
  auto work = std::make_shared<CollectiveWork<decltype(body)>>(executor_, std::move(body));
  // Only collectives that take milliseconds wake the background thread at once: for
  // the others its pickup delay is harmless, and a caller that waits runs them itself,
  // without the thread switch (a rank's threads share its cores).
  executor_->submit(std::shared_ptr<Job>(work, &work->job()), bytes >= kWakeBytes);
  return work;
}

std::vector<int64_t> GroupComm::parts(std::span<const int64_t> counts, size_t total,
                                      const char* what) const {
  if (counts.empty()) {
    if (total % size_t(size()) != 0)
      bad(std::string(what) + ": " + std::to_string(total) + " elements do not split into " +
          std::to_string(size()) + " equal parts; pass counts");
    return std::vector<int64_t>(size_t(size()), int64_t(total / size_t(size())));
  }
  if (int(counts.size()) != size())
    bad(std::string(what) + ": " + std::to_string(counts.size()) + " counts for a group of " +
        std::to_string(size()));
  for (int64_t c : counts)
    if (c < 0) bad(std::string(what) + ": negative count " + std::to_string(c));
  return {counts.begin(), counts.end()};
}

WorkPtr GroupComm::broadcast(Tensor& t, int root) {
  check_tensor(t, "broadcast", "tensor");
  check_rank(root, "broadcast");
  size_t bytes = t.nbytes();
  void* p = t.raw_data();
  return submit(bytes, {t.storage()},
                [p, bytes, root](const GroupView& g) { detail::broadcast(g, p, bytes, root); });
}

WorkPtr GroupComm::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce", "tensor");
  size_t n = size_t(t.numel());
  DType dt = t.dtype();
  void* p = t.raw_data();
  return submit(t.nbytes(), {t.storage()},
                [p, n, dt, op](const GroupView& g) { detail::all_reduce(g, p, n, dt, op); });
}

WorkPtr GroupComm::all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts) {
  check_tensor(in, "all_gather", "input");
  check_tensor(out, "all_gather", "output");
  check_same_dtype(in, out, "all_gather");
  auto c = parts(counts, size_t(out.numel()), "all_gather");
  int64_t total = 0;
  for (int64_t x : c) total += x;
  if (total != out.numel())
    bad("all_gather: counts add up to " + std::to_string(total) + " but the output " + out.str() +
        " has " + std::to_string(out.numel()) + " elements");
  if (in.numel() != c[size_t(rank_)])
    bad("all_gather: the input " + in.str() + " of rank " + std::to_string(rank_) +
        " should have " + std::to_string(c[size_t(rank_)]) + " elements");
  size_t es = memory::dtype_size(in.dtype());
  const void* ip = in.raw_data();
  void* op = out.raw_data();
  return submit(out.nbytes(), {in.storage(), out.storage()},
                [ip, op, c, es](const GroupView& g) { detail::all_gather(g, ip, op, c, es); });
}

WorkPtr GroupComm::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp rop,
                                  std::span<const int64_t> counts) {
  check_tensor(in, "reduce_scatter", "input");
  check_tensor(out, "reduce_scatter", "output");
  check_same_dtype(in, out, "reduce_scatter");
  auto c = parts(counts, size_t(in.numel()), "reduce_scatter");
  int64_t total = 0;
  for (int64_t x : c) total += x;
  if (total != in.numel())
    bad("reduce_scatter: counts add up to " + std::to_string(total) + " but the input " + in.str() +
        " has " + std::to_string(in.numel()) + " elements");
  if (out.numel() != c[size_t(rank_)])
    bad("reduce_scatter: the output " + out.str() + " of rank " + std::to_string(rank_) +
        " should have " + std::to_string(c[size_t(rank_)]) + " elements");
  DType dt = in.dtype();
  const void* ip = in.raw_data();
  void* op = out.raw_data();
  return submit(
      in.nbytes(), {in.storage(), out.storage()},
      [ip, op, c, dt, rop](const GroupView& g) { detail::reduce_scatter(g, ip, op, c, dt, rop); });
}

WorkPtr GroupComm::scatter(const Tensor& in, Tensor& out, int root,
                           std::span<const int64_t> counts) {
  check_rank(root, "scatter");
  check_tensor(out, "scatter", "output");
  const bool is_root = rank_ == root;
  if (is_root) {
    check_tensor(in, "scatter", "input");
    check_same_dtype(in, out, "scatter");
  }
  // Only the root has the whole input; the others need counts or equal parts of size
  // out.numel().
  std::vector<int64_t> c;
  if (counts.empty())
    c.assign(size_t(size()), out.numel());
  else
    c = parts(counts, 0, "scatter");
  if (out.numel() != c[size_t(rank_)])
    bad("scatter: the output " + out.str() + " of rank " + std::to_string(rank_) + " should have " +
        std::to_string(c[size_t(rank_)]) + " elements");
  if (is_root) {
    int64_t total = 0;
    for (int64_t x : c) total += x;
    if (in.numel() != total)
      bad("scatter: the root's input " + in.str() + " should have " + std::to_string(total) +
          " elements");
  }
  size_t es = memory::dtype_size(out.dtype());
  const void* ip = is_root ? in.raw_data() : nullptr;
  void* op = out.raw_data();
  Keep keep{out.storage(), is_root ? in.storage() : nullptr};
  return submit(
      out.nbytes() * size_t(size()), std::move(keep),
      [ip, op, c, es, root](const GroupView& g) { detail::scatter(g, ip, op, c, es, root); });
}

WorkPtr GroupComm::gather(const Tensor& in, Tensor& out, int root,
                          std::span<const int64_t> counts) {
  check_rank(root, "gather");
  check_tensor(in, "gather", "input");
  const bool is_root = rank_ == root;
  if (is_root) {
    check_tensor(out, "gather", "output");
    check_same_dtype(in, out, "gather");
  }
  std::vector<int64_t> c;
  if (counts.empty())
    c.assign(size_t(size()), in.numel());
  else
    c = parts(counts, 0, "gather");
  if (in.numel() != c[size_t(rank_)])
    bad("gather: the input " + in.str() + " of rank " + std::to_string(rank_) + " should have " +
        std::to_string(c[size_t(rank_)]) + " elements");
  if (is_root) {
    int64_t total = 0;
    for (int64_t x : c) total += x;
    if (out.numel() != total)
      bad("gather: the root's output " + out.str() + " should have " + std::to_string(total) +
          " elements");
  }
  size_t es = memory::dtype_size(in.dtype());
  const void* ip = in.raw_data();
  void* op = is_root ? out.raw_data() : nullptr;
  Keep keep{in.storage(), is_root ? out.storage() : nullptr};
  return submit(
      in.nbytes() * size_t(size()), std::move(keep),
      [ip, op, c, es, root](const GroupView& g) { detail::gather(g, ip, op, c, es, root); });
}

WorkPtr GroupComm::barrier() {
  return submit(0, {}, [](const GroupView& g) { detail::barrier(g); });
}

// ---- sub-groups ----

std::shared_ptr<Communicator> GroupComm::split(const std::vector<int>& ranks) {
  if (ranks.empty()) bad("split: the list of ranks is empty");
  std::set<int> seen;
  std::vector<int> members;
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_rank(ranks[i], "split");
    if (!seen.insert(ranks[i]).second)
      bad("split: rank " + std::to_string(ranks[i]) + " is listed twice");
    if (ranks[i] == rank_) my_index = int(i);
    members.push_back(globals_[size_t(ranks[i])]);
  }
  if (my_index < 0)
    bad("split: rank " + std::to_string(rank_) + " calls split but is not in the list");
  // The members agree on the largest context id any of them could take next, over the
  // parent's context with a sequence number collectives never use.
  GroupView v{*fabric_, context_, my_index, int(members.size()), members, kSplitSeq};
  int32_t id = fabric_->next_context();
  detail::all_reduce(v, &id, 1, DType::i32, ReduceOp::max);
  if (id > kMaxContext)
    throw RuntimeError("split: this process has used all " + std::to_string(kMaxContext) +
                       " group contexts");
  fabric_->reserve_context(uint16_t(id));
  return std::make_shared<GroupComm>(fabric_, uint16_t(id), std::move(members));
}

}  // namespace baton::transport::detail
