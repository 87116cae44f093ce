// The executor's gradient reduction: the gradients of parameters held by several ranks
// (data-parallel replicas, tied parameters, DualPipe's replicas) are summed over their
// group in buckets, each bucket one asynchronous all-reduce started as soon as the last
// of its gradients is final (Stage::backward_weight's ready callback), so reduction
// overlaps the rest of the backward pass; finish() waits for them before the optimizer.
//
// Determinism: a group's buckets are fixed at construction (its parameters in
// descending id order, cut at bucket_bytes) and started in that order on every member,
// so every member issues the same collectives in the same order and the sums have the
// same bits on every run.
//
// Sharded groups (ZeRO, GradGroup::shard): a bucket of E elements is cut into the equal
// parts the transport's all-reduce uses (E / n, the first E % n one more) and
// reduce-scattered, so member r receives the sum of part r with the bits the all-reduce
// would have given it whenever both take the same algorithm (always for two members:
// two addends commute). The reducer tells each holding stage the elements of each
// parameter that fall in its part (Stage::set_optimizer_shard) at construction; after
// the optimizer step, gather_params() all-gathers the parts: a bucket of several
// parameters in one gather, in place in a flat copy like the reduction's (the memory
// model's RankBuffers::gather), and a bucket of one straight into the parameter, its
// input staged in the spent gradient. The reduce-scatter needs no buffer beyond the
// all-reduce's: it writes into the rank's own part of its input.
//
// ZeRO-2 (GradGroup::shard_grads): the group's parameters held by one local stage keep
// no whole gradient across micro-batches. Their buckets never span two stages; each
// micro-batch's W hands every parameter's gradient over as soon as its last user ran
// (Stage::set_micro_grad_fn), and once a bucket's are all in it is reduce-scattered (the
// same parts) and waited for at once, the rank's part added to the parameters'
// part-sized accumulators (Stage::set_grad_shard) and the whole gradients dropped: a
// rank holds at most one bucket of whole gradients (and its flat copy) beyond the W's
// own buffers. The sums are over replicas per micro-batch, then over micro-batches (the
// unsharded order is the reverse), so losses agree within rounding, not bit for bit.
// A parameter held by several local stages (tied over a V schedule's chunks) stays as
// under zero1.
//
// A parameter server with staleness s > 0 (plan field dp_sync "parameter-server",
// set_staleness): the sharded groups' parts are the servers' parts and the parameters
// the stages hold are the replica's working copy, s updates behind. Each member keeps
// its part's latest value (the master) as the input of its newest pull, not in the
// parameter: before the update the master is put into the part (install_masters) and
// after it the new part is copied out as the input of an all-gather into a bucket-sized
// buffer (the pull, one per bucket as gather_params'), posted and not waited for, and the
// working part put back.
// The pull of update t is waited for after update t + s, its buffer then becoming the
// working parameters, so step t + s + 1 runs on the updates up to t: the same pattern on
// every run (the first s + 1 steps run on the initial parameters). At most s pulls are in
// flight between steps; stale_parts() and restore_stale() carry them through a checkpoint.
//
// Extra server ranks (dp_sync ps_ranks > 0, GradGroup::servers): the group's communicator
// also holds the servers, last, and the parts are theirs (bucket_parts: none for the
// replicas), so the same reduce-scatter pushes each replica's gradients to the servers and
// the same all-gathers pull the parameters back; the replicas update nothing of the
// group and hold no optimizer state for it. Before the first step replica 0 scatters the
// initial parameters to the servers. With more than one server the pull is not the
// all-gather (whose ring would pass every server's part through every member, the other
// servers included) but point to point: each server sends its part of a bucket to each
// replica (pull_bucket). The servers' side: engine/detail/param_server.h.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "engine/executor.h"

namespace baton::engine::detail {

// What a gradient group's buckets are cut from: each parameter's gradient, in the group's
// order (descending id). `stage` differs only under ZeRO-2 (a bucket within one stage).
struct BucketItem {
  int64_t numel = 0;
  size_t nbytes = 0;
  memory::DType dtype = memory::DType::f32;
  int stage = 0;
};
// Consecutive items of one dtype and stage up to bucket_bytes (a larger item alone):
// each bucket's item indices.
std::vector<std::vector<size_t>> cut_buckets(const std::vector<BucketItem>& items,
                                             size_t bucket_bytes);
// The members' parts of a bucket of `elements` over a communicator of `members`: the
// all-reduce's equal parts, or with `servers` > 0 extra server ranks (its last members)
// none for the others and equal parts over the servers.
std::vector<int64_t> bucket_parts(int64_t elements, int members, int servers);
// The elements of the parameter at [first, first + numel) of a bucket in each member's part.
std::vector<int64_t> param_parts(const std::vector<int64_t>& bucket_counts, int64_t first,
                                 int64_t numel);
// The pull of one bucket (or of a bucket's one parameter) from `servers` extra server
// ranks, the communicator's last members, with parts `counts`: with one server (or none)
// the all-gather of `in` into `out`; with more, point to point under `tag` (the bucket's
// index in its group): a server sends `in`, its part, to every replica (`out` untouched),
// and a replica receives each server's part into its place in `out` (`in` unused). Every
// member calls it for the same buckets in the same order.
transport::WorkPtr pull_bucket(transport::Communicator& comm, const memory::Tensor& in,
                               memory::Tensor& out, std::span<const int64_t> counts, int servers,
                               uint64_t tag);

class GradReducer {
 public:
  GradReducer(const std::vector<GradGroup>& groups, const std::map<int, stages::Stage*>& stages,
              size_t bucket_bytes);

  void begin_step();
  // Stage `stage`'s gradient of `param` is final for this step.
  void ready(int stage, int param);
  // Starts every bucket whose gradients are all final (in order); REDUCE calls it.
  void start_ready();
  // While held (the executor, during a compute action), buckets of a host transport's
  // groups whose gradients become final wait for the release, which starts them.
  void hold(bool on);
  // Waits for every reduction (all gradients must be final) and writes the sums back
  // into every local stage's gradient.
  void finish();
  // True when this rank reduces nothing (no group, no parameter held twice).
  bool empty() const { return groups_.empty(); }
  // A sharded parameter of stage `stage`: the elements [begin, end) of its flattened
  // gradient that are reduced here (and that this rank updates); nullopt when not sharded.
  std::optional<std::pair<int64_t, int64_t>> shard_of(int stage, int param) const;
  // After the optimizer step: all-gathers the updated parts of every sharded parameter
  // into every local holder, and waits. With staleness s > 0: posts the pull of this
  // update, restores the working parts and completes the pull of s updates ago.
  void gather_params();
  // Parameter server (s > 0): the pulls' lag, and the masters put into the parts before
  // the update (every holder), the working parts kept aside.
  void set_staleness(int s) { staleness_ = s; }
  int staleness() const { return staleness_; }
  void install_masters();
  // The in-flight pulls, oldest first: for each, this rank's part of every sharded
  // parameter (in stale_params()'s order). restore_stale() posts them again (a resume;
  // none may be in flight).
  std::vector<std::vector<memory::Tensor>> stale_parts() const;
  std::vector<std::pair<int, int>> stale_params() const;  // (stage, parameter id)
  void restore_stale(const std::vector<std::vector<memory::Tensor>>& parts);
  // Waits for every pull in flight without applying it (before the communicators go).
  void drain() noexcept;
  ~GradReducer();
  // ZeRO-2: stage `stage`'s gradient of `param` for one micro-batch (undefined: zero).
  void micro(int stage, int param, memory::Tensor grad);
  // Bytes of the elements this rank holds optimizer state for, over all sharded
  // parameters, and of those parameters in full (the state saved is their difference).
  std::pair<int64_t, int64_t> sharded_elements() const;

 private:
  struct Param {
    int id = -1;
    std::vector<stages::Stage*> holders;  // local stages holding it, ascending stage
    std::vector<int> holder_stages;
    int waiting = 0;              // holders not yet final this step
    size_t bucket = 0, slot = 0;  // ZeRO-2: its bucket and place in it
  };
  struct Bucket {
    std::vector<size_t> params;    // indices into Group::params
    std::vector<int64_t> offsets;  // each parameter's first element in the bucket
    int64_t elements = 0;
    memory::Tensor flat;  // several parameters: their gradients side by side
    transport::WorkPtr work;
    bool started = false;
    // Sharded: the parts of the members (elements) and this rank's [part_begin, part_end).
    std::vector<int64_t> counts;
    int64_t part_begin = 0, part_end = 0;
    memory::Tensor part;  // this rank's reduced part: a view of its part of the input
    // ZeRO-2: the current micro-batch's whole gradients, and how many are still to come.
    std::vector<memory::Tensor> micro;
    size_t micro_waiting = 0;
  };
  struct Group {
    transport::Communicator* comm = nullptr;
    bool shard = false;
    int servers = 0;           // extra server ranks, the comm's last members (GradGroup::servers)
    bool shard_grads = false;  // ZeRO-2
    std::vector<Param> params;
    std::vector<Bucket> buckets;
    size_t next = 0;  // the first bucket not started
  };
  void add_group(Group g, size_t bucket_bytes);
  void seed_servers();
  bool seeded_ = false;
  bool held_ = false;
  void reduce_micro(Group& g, Bucket& b);
  void try_start(Group& g);
  void start(Group& g, Bucket& b);
  static memory::Tensor& first_grad(Group& g, Bucket& b);
  static void pack(Group& g, Bucket& b);
  template <class Fn>
  static void for_part(const Group& g, const Bucket& b, Fn&& fn);

  // One sharded parameter's all-gather: its members' counts and this rank's elements.
  struct GatherSpec {
    Group* g = nullptr;
    Param* p = nullptr;
    std::vector<int64_t> counts;
    int64_t lo = 0, hi = 0;
  };
  std::vector<GatherSpec> gather_specs();
  struct Pull {
    std::vector<memory::Tensor> in;  // per gather spec: the rank's part (views of a bucket's)
    // Per bucket: its all-gather into a bucket-sized buffer.
    std::vector<memory::Tensor> out;
    std::vector<transport::WorkPtr> works;
    std::vector<const Bucket*> buckets;
    std::vector<const Group*> groups;
  };
  void post_pull(const std::vector<memory::Tensor>& parts);
  void complete_pull(Pull& pull);  // waits and copies into every holder

  std::vector<Group> groups_;
  int staleness_ = 0;
  std::deque<Pull> pulls_;
  std::vector<memory::Tensor> working_;  // install_masters: the working parts, per spec
  std::map<std::pair<int, int>, std::pair<size_t, size_t>>
      where_;  // (stage, param) -> (group, param index)
};

}  // namespace baton::engine::detail
