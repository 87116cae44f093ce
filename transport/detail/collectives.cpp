#include "transport/detail/collectives.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/allocator.h"
#include "memory/error.h"
#include "transport/collective_memory.h"
#include "transport/detail/reduce.h"
#include "transport/detail/ring.h"

namespace baton::transport::detail {

using memory::DType;

namespace {

// A positive whole number of the environment, or `fallback` when unset. Only digits:
// strtoull alone would read "-1" as 2^64 - 1 and skip leading blanks and signs.
size_t env_size(const char* name, size_t fallback, size_t most) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  bool digits = true;
  for (const char* c = v; *c != '\0'; ++c) digits = digits && *c >= '0' && *c <= '9';
  errno = 0;
  unsigned long long x = digits ? std::strtoull(v, nullptr, 10) : 0;
  if (!digits || errno == ERANGE || x == 0 || x > most)
    throw InputError(std::string(name) + "='" + v + "': expected a whole number from 1 to " +
                     std::to_string(most));
  return size_t(x);
}

int mod(int x, int n) {
  return ((x % n) + n) % n;
}

int largest_power_of_two_at_most(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// ---- all-reduce, latency-bound: recursive doubling ----
//
// With n not a power of two, the first 2*rem ranks pair up first (the even one hands
// its data to the odd one and sits out), so that a power of two takes part; the
// result goes back to those that sat out. Each combination puts the lower group's
// data first, so that every rank computes the same bits.
void all_reduce_doubling(const GroupView& g, char* buf, size_t count, DType dtype, ReduceOp op) {
  const int n = g.size;
  const int r = g.rank;
  const size_t bytes = count * memory::dtype_size(dtype);
  const int p = largest_power_of_two_at_most(n);
  const int rem = n - p;
  Scratch tmp(bytes);
  int vr;  // rank among the p that take part, or -1
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      g.wait(g.send(buf, bytes, r + 1, 0));
      vr = -1;
    } else {
      g.wait(g.recv(tmp.data(), bytes, r - 1, 0));
      reduce(buf, tmp.data(), buf, count, dtype, op);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    int step = 1;
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      int pv = vr ^ mask;
      int partner = pv < rem ? pv * 2 + 1 : pv + rem;
      auto rq = g.recv(tmp.data(), bytes, partner, uint64_t(step));
      auto sq = g.send(buf, bytes, partner, uint64_t(step));
      g.wait(rq);
      g.wait(sq);
      if (pv < vr)
        reduce(buf, tmp.data(), buf, count, dtype, op);
      else
        reduce(buf, buf, tmp.data(), count, dtype, op);
    }
  }
  if (op == ReduceOp::avg && vr >= 0) divide(buf, count, dtype, n);
  if (r < 2 * rem) {
    const uint64_t back = 1000;
    if (r % 2 == 0)
      g.wait(g.recv(buf, bytes, r + 1, back));
    else
      g.wait(g.send(buf, bytes, r - 1, back));
  }
}

// ---- reduce-scatter, latency-bound: direct exchange ----
// Every rank sends each part straight to its owner and sums what it receives in rank
// order, in one round.
void reduce_scatter_direct(const GroupView& g, const char* in, char* out,
                           std::span<const int64_t> counts, DType dtype, ReduceOp op) {
  const int n = g.size;
  const int r = g.rank;
  const size_t es = memory::dtype_size(dtype);
  auto off = offsets_of(counts);
  const size_t mine = size_t(counts[size_t(r)]);
  Scratch tmp(mine * es * size_t(n));
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    reqs.push_back(g.recv(tmp.data() + size_t(q) * mine * es, mine * es, q, 0));
  }
  for (int i = 1; i < n; ++i) {
    int q = mod(r + i, n);
    reqs.push_back(g.send(in + off[size_t(q)] * es, size_t(counts[size_t(q)]) * es, q, 0));
  }
  g.wait_all(reqs);
  std::memcpy(tmp.data() + size_t(r) * mine * es, in + off[size_t(r)] * es, mine * es);
  if (mine > 0) {
    std::memcpy(out, tmp.data(), mine * es);
    for (int q = 1; q < n; ++q)
      reduce(out, out, tmp.data() + size_t(q) * mine * es, mine, dtype, op);
    if (op == ReduceOp::avg) divide(out, mine, dtype, n);
  }
}

// ---- all-gather, latency-bound: direct exchange ----
void all_gather_direct(const GroupView& g, const char* in, char* out,
                       std::span<const int64_t> counts, size_t es) {
  const int n = g.size;
  const int r = g.rank;
  auto off = offsets_of(counts);
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < n; ++q)
    if (q != r)
      reqs.push_back(g.recv(out + off[size_t(q)] * es, size_t(counts[size_t(q)]) * es, q, 0));
  for (int i = 1; i < n; ++i)
    reqs.push_back(g.send(in, size_t(counts[size_t(r)]) * es, mod(r + i, n), 0));
  if (counts[size_t(r)] > 0 && in != out + off[size_t(r)] * es)  // not in place
    std::memcpy(out + off[size_t(r)] * es, in, size_t(counts[size_t(r)]) * es);
  g.wait_all(reqs);
}

// ---- agreeing on the root ----
//
// Ranks that name different roots of a rooted collective send to ranks that expect
// nothing from them: such messages stay unmatched, and 255 collectives later (the
// sequence number in the tag wraps) one would match, handing over stale data. So every
// rooted collective either moves its data in a pattern that does not depend on the root
// (small broadcasts) or first agrees on the root in one, and every rank fails alike,
// naming both roots, before any message can be left behind.

// Each rank's root with its rank, merged as maxima: the largest and the smallest root
// named, and by whom.
struct RootVote {
  int64_t hi = 0;   // root << kSourceBits | rank
  int64_t lo = 0;   // (kMaxRanks - 1 - root) << kSourceBits | rank
  int64_t has = 0;  // 1: the data that travels with it is the root's
};

RootVote vote_of(int rank, int root) {
  return {(int64_t(root) << kSourceBits) | rank,
          (int64_t(kMaxRanks - 1 - root) << kSourceBits) | rank, 0};
}

void check_vote(const RootVote& v, const char* op) {
  const int64_t mask = (int64_t(1) << kSourceBits) - 1;
  const int64_t big = v.hi >> kSourceBits, small = kMaxRanks - 1 - (v.lo >> kSourceBits);
  if (big == small) return;
  throw RuntimeError(std::string(op) + ": the ranks disagree on the root: rank " +
                     std::to_string(v.lo & mask) + " names root " + std::to_string(small) +
                     ", rank " + std::to_string(v.hi & mask) + " names root " +
                     std::to_string(big) + " (every rank of the group must name the same root)");
}

// Dissemination, as the barrier's: in round k every rank sends what it knows to rank +
// 2^k and merges what rank - 2^k knows; after ceil(log2 n) rounds every rank knows
// every vote, and, with `bytes` > 0, holds the root's data in buf. Steps from `step0`.
void disseminate(const GroupView& g, char* buf, size_t bytes, int root, const char* op,
                 uint64_t step0) {
  const int n = g.size;
  const size_t H = sizeof(RootVote);
  RootVote v = vote_of(g.rank, root);
  v.has = g.rank == root;
  Scratch mine(H + bytes), theirs(H + bytes);
  if (v.has && bytes > 0) std::memcpy(mine.data() + H, buf, bytes);
  uint64_t step = step0;
  for (int dist = 1; dist < n; dist <<= 1, ++step) {
    std::memcpy(mine.data(), &v, H);
    auto rq = g.recv(theirs.data(), H + bytes, mod(g.rank - dist, n), step);
    auto sq = g.send(mine.data(), H + bytes, mod(g.rank + dist, n), step);
    g.wait(rq);
    g.wait(sq);
    RootVote o;
    std::memcpy(&o, theirs.data(), H);
    v.hi = std::max(v.hi, o.hi);
    v.lo = std::max(v.lo, o.lo);
    if (!v.has && o.has) {
      if (bytes > 0) std::memcpy(mine.data() + H, theirs.data() + H, bytes);
      v.has = 1;
    }
  }
  check_vote(v, op);
  if (g.rank != root && bytes > 0) std::memcpy(buf, mine.data() + H, bytes);
}

// Broadcasts up to this size carry their data with the votes, in a small scratch
// block: larger ones would move it ceil(log2 n) times per rank and copy it in and out of
// scratch (a 32 KiB broadcast between 2 threads took 8x the tree's time), so they agree
// first and then use the tree.
constexpr size_t kVotedBytes = Scratch::kInline - sizeof(RootVote);

// Steps of the agreement ahead of a rooted collective: clear of its own steps (chain
// chunks count from 0; equal tags would still match in order, but need not meet).
constexpr uint64_t kAgreeStep = uint64_t(1) << (kStepBits - 1);

void agree_on_root(const GroupView& g, int root, const char* op) {
  disseminate(g, nullptr, 0, root, op, kAgreeStep);
}

// ---- broadcast ----

// Binomial tree rooted at `root`: log2(n) rounds of whole messages.
void broadcast_tree(const GroupView& g, char* buf, size_t bytes, int root) {
  const int n = g.size;
  const int vr = mod(g.rank - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      g.wait(g.recv(buf, bytes, mod(vr - mask + root, n), 0));
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) sends.push_back(g.send(buf, bytes, mod(vr + mask + root, n), 0));
  g.wait_all(sends);
}

// Pipelined chain root -> root+1 -> ...: each rank forwards chunk k as soon as it has
// it, so the time is about one message time plus (n - 2) chunk times.
void broadcast_chain(const GroupView& g, char* buf, size_t bytes, int root) {
  const int n = g.size;
  const int vr = mod(g.rank - root, n);
  const size_t C = std::max<size_t>(1, AlgoTuning::get().chunk_bytes);
  const size_t nc = (bytes + C - 1) / C;
  const int next = mod(g.rank + 1, n);
  const int prev = mod(g.rank - 1, n);
  std::vector<RequestPtr> sends;
  if (vr == 0) {
    for (size_t k = 0; k < nc; ++k)
      sends.push_back(g.send(buf + k * C, std::min(C, bytes - k * C), next, k));
  } else {
    std::vector<RequestPtr> recvs(nc);
    for (size_t k = 0; k < nc; ++k)
      recvs[k] = g.recv(buf + k * C, std::min(C, bytes - k * C), prev, k);
    for (size_t k = 0; k < nc; ++k) {
      g.wait(recvs[k]);
      if (vr + 1 < n) sends.push_back(g.send(buf + k * C, std::min(C, bytes - k * C), next, k));
    }
  }
  g.wait_all(sends);
}

}  // namespace

AlgoTuning AlgoTuning::from_env() {
  AlgoTuning a;
  // Sizes up to 2^48 bytes: larger ones are surely typos, and products of them overflow.
  const size_t most_bytes = size_t(1) << 48;
  a.small_bytes = env_size("BATON_SMALL_BYTES", a.small_bytes, most_bytes);
  a.chunk_bytes = env_size("BATON_RING_CHUNK", a.chunk_bytes, most_bytes);
  a.window = int(env_size("BATON_RING_WINDOW", size_t(a.window), 1 << 16));
  return a;
}

const AlgoTuning& AlgoTuning::get() {
  static const AlgoTuning t = from_env();  // a throw leaves it unset: the next call reads again
  return t;
}

std::vector<size_t> offsets_of(std::span<const int64_t> counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + size_t(counts[i]);
  return off;
}

std::vector<int64_t> equal_parts(size_t count, int n) {
  std::vector<int64_t> parts(size_t(n), int64_t(count / size_t(n)));
  for (size_t i = 0; i < count % size_t(n); ++i) parts[i] += 1;
  return parts;
}

void all_reduce(const GroupView& g, void* buf, size_t count, DType dtype, ReduceOp op) {
  const size_t es = memory::dtype_size(dtype);
  if (g.size == 1 || count == 0) return;  // avg over one rank is the value itself
  if (count * es <= AlgoTuning::get().small_bytes || count < size_t(g.size)) {
    all_reduce_doubling(g, static_cast<char*>(buf), count, dtype, op);
    return;
  }
  auto parts = equal_parts(count, g.size);
  auto off = offsets_of(parts);
  RingJob job;
  job.off.assign(off.begin(), off.end() - 1);
  job.len.assign(parts.begin(), parts.end());
  job.esize = es;
  job.dtype = dtype;
  job.op = op;
  job.reduce = job.gather = true;
  job.in = static_cast<const char*>(buf);
  job.buf = static_cast<char*>(buf);
  run_ring(g, job);
}

void reduce_scatter(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
                    DType dtype, ReduceOp op) {
  const size_t es = memory::dtype_size(dtype);
  auto off = offsets_of(counts);
  const size_t total = off.back();
  if (g.size == 1) {
    if (total > 0) std::memmove(out, in, total * es);
    return;
  }
  if (total * es <= AlgoTuning::get().small_bytes) {
    reduce_scatter_direct(g, static_cast<const char*>(in), static_cast<char*>(out), counts, dtype,
                          op);
    return;
  }
  RingJob job;
  job.off.assign(off.begin(), off.end() - 1);
  job.len.assign(counts.begin(), counts.end());
  job.esize = es;
  job.dtype = dtype;
  job.op = op;
  job.reduce = true;
  job.in = static_cast<const char*>(in);
  job.out = static_cast<char*>(out);
  // In place (the output is this rank's own part of the input): the partial sums go
  // into the input, as an all-reduce's do, and no accumulator slots are needed.
  char* own = static_cast<char*>(out);
  if (own == job.in + off[size_t(g.rank)] * es) job.buf = own - off[size_t(g.rank)] * es;
  run_ring(g, job);
}

void all_gather(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
                size_t es) {
  auto off = offsets_of(counts);
  const size_t total = off.back();
  if (g.size == 1) {
    if (total > 0) std::memmove(out, in, total * es);
    return;
  }
  if (total * es <= AlgoTuning::get().small_bytes) {
    all_gather_direct(g, static_cast<const char*>(in), static_cast<char*>(out), counts, es);
    return;
  }
  RingJob job;
  job.off.assign(off.begin(), off.end() - 1);
  job.len.assign(counts.begin(), counts.end());
  job.esize = es;
  job.gather = true;
  job.buf = static_cast<char*>(out);
  // In place (the input is this rank's own part of the output): the ring sends it from there.
  if (in != job.buf + off[size_t(g.rank)] * es) job.own = static_cast<const char*>(in);
  run_ring(g, job);
}

void broadcast(const GroupView& g, void* buf, size_t bytes, int root) {
  if (g.size == 1) return;
  char* p = static_cast<char*>(buf);
  if (bytes <= kVotedBytes) {
    // The data travels with the votes: ceil(log2 n) rounds, as the tree's for a power of two.
    disseminate(g, p, bytes, root, "broadcast", 0);
    return;
  }
  agree_on_root(g, root, "broadcast");
  if (bytes <= AlgoTuning::get().small_bytes || g.size == 2)
    broadcast_tree(g, p, bytes, root);
  else
    broadcast_chain(g, p, bytes, root);
}

void scatter(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
             size_t es, int root) {
  const int r = g.rank;
  const size_t mine = size_t(counts[size_t(r)]) * es;
  if (g.size > 1) agree_on_root(g, root, "scatter");
  if (r != root) {
    g.wait(g.recv(out, mine, root, 0));
    return;
  }
  auto off = offsets_of(counts);
  const char* src = static_cast<const char*>(in);
  std::vector<RequestPtr> sends;
  for (int i = 1; i < g.size; ++i) {
    int q = mod(r + i, g.size);
    sends.push_back(g.send(src + off[size_t(q)] * es, size_t(counts[size_t(q)]) * es, q, 0));
  }
  if (mine > 0) std::memmove(out, src + off[size_t(r)] * es, mine);
  g.wait_all(sends);
}

void gather(const GroupView& g, const void* in, void* out, std::span<const int64_t> counts,
            size_t es, int root) {
  const int r = g.rank;
  const size_t mine = size_t(counts[size_t(r)]) * es;
  if (g.size > 1) agree_on_root(g, root, "gather");
  if (r != root) {
    g.wait(g.send(in, mine, root, 0));
    return;
  }
  auto off = offsets_of(counts);
  char* dst = static_cast<char*>(out);
  std::vector<RequestPtr> recvs;
  for (int q = 0; q < g.size; ++q)
    if (q != r)
      recvs.push_back(g.recv(dst + off[size_t(q)] * es, size_t(counts[size_t(q)]) * es, q, 0));
  if (mine > 0) std::memmove(dst + off[size_t(r)] * es, in, mine);
  g.wait_all(recvs);
}

// Dissemination barrier: in round k every rank signals rank + 2^k and hears from
// rank - 2^k; after ceil(log2 n) rounds everyone has heard, indirectly, from everyone.
void barrier(const GroupView& g) {
  const int n = g.size;
  uint64_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    auto rq = g.recv(nullptr, 0, mod(g.rank - dist, n), round);
    auto sq = g.send(nullptr, 0, mod(g.rank + dist, n), round);
    g.wait(rq);
    g.wait(sq);
  }
}

}  // namespace baton::transport::detail

namespace baton::transport {

size_t p2p_rendezvous_bytes() {
  const char* env = std::getenv("UCX_RNDV_THRESH");
  if (env == nullptr) return 65536;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  return end != env && *end == '\0' ? size_t(v) : 0;
}

size_t collective_scratch_bytes(Collective c, size_t count, size_t esize, int group_size,
                                size_t part, bool in_place, size_t own) {
  using detail::AlgoTuning;
  using detail::Scratch;
  const AlgoTuning& tune = AlgoTuning::get();
  auto held = [](size_t bytes) {
    return bytes > Scratch::kInline ? memory::Allocator::rounded(bytes) : 0;
  };
  // run_ring's window of receive slots (and of accumulators when it reduces into a
  // separate output), each a chunk or the largest part (`largest` elements) if smaller.
  auto ring = [&](size_t largest, bool acc) {
    const size_t chunk = std::max<size_t>(1, tune.chunk_bytes / esize);
    return held(size_t(std::max(1, tune.window)) * std::min(chunk, largest) * esize *
                (acc ? 2 : 1));
  };
  if (group_size <= 1 || count == 0) return 0;
  const size_t bytes = count * esize;
  const size_t n = size_t(group_size);
  switch (c) {
    case Collective::all_reduce:
      if (bytes <= tune.small_bytes || count < n) return held(bytes);
      return ring((count + n - 1) / n, false);  // equal parts
    case Collective::reduce_scatter:
      if (bytes <= tune.small_bytes) return held((own == SIZE_MAX ? part : own) * esize * n);
      return ring(part > 0 ? part : count, !in_place);
    case Collective::all_gather:
      return 0;  // the direct exchange and the ring both receive in place
  }
  return 0;
}

size_t all_reduce_scratch_bound(size_t count, size_t esize) {
  // Small messages hold themselves, larger ones a ring window of parts, the largest part
  // (half the message) with two ranks; each grows with the message, so the bound is the
  // larger of the two at their largest sizes.
  const size_t small = detail::AlgoTuning::get().small_bytes / std::max<size_t>(1, esize);
  return std::max(
      collective_scratch_bytes(Collective::all_reduce, std::min(count, small), esize, 2),
      collective_scratch_bytes(Collective::all_reduce, count, esize, 2));
}

size_t reduce_scatter_scratch_bound(size_t count, size_t esize, int group_size, int owners) {
  // The direct exchange's grows with the message up to small_bytes, the ring's beyond it.
  const size_t small = detail::AlgoTuning::get().small_bytes / std::max<size_t>(1, esize);
  const size_t n = size_t(std::max(1, owners));
  auto at = [&](size_t c) {
    return collective_scratch_bytes(Collective::reduce_scatter, c, esize, group_size,
                                    (c + n - 1) / n, true);
  };
  return std::max(at(std::min(count, small)), at(count));
}

}  // namespace baton::transport
