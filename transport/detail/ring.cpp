#include "transport/detail/ring.h"

#include <algorithm>
#include <cstring>

#include "transport/detail/collectives.h"
#include "transport/detail/reduce.h"

namespace baton::transport::detail {

namespace {

struct Unit {
  int step;
  int block;  // received block
  size_t chunk;
};

}  // namespace

void run_ring(const GroupView& g, const RingJob& job) {
  const int n = g.size;
  const int r = g.rank;
  const size_t es = job.esize;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  if (n == 1) {
    if (job.reduce && !job.gather && job.len[0] > 0) std::memmove(job.out, job.in, job.len[0] * es);
    if (job.gather && job.own != nullptr && job.len[0] > 0)
      std::memmove(job.buf + job.off[0] * es, job.own, job.len[0] * es);
    return;
  }
  const AlgoTuning& tune = AlgoTuning::get();
  const size_t C = std::max<size_t>(1, tune.chunk_bytes / es);  // chunk, elements
  const int W = std::max(1, tune.window);
  const int t_rs = job.reduce ? n - 1 : 0;
  const int T = t_rs + (job.gather ? n - 1 : 0);
  auto send_block = [&](int t) { return t < t_rs ? mod(r - t - 1) : mod(r - (t - t_rs)); };
  auto recv_block = [&](int t) { return t < t_rs ? mod(r - t - 2) : mod(r - (t - t_rs) - 1); };
  auto nchunks = [&](int b) { return (job.len[size_t(b)] + C - 1) / C; };
  auto chunk_len = [&](int b, size_t k) { return std::min(C, job.len[size_t(b)] - k * C); };
  auto tag_step = [](int t, size_t k) { return (uint64_t(t) << 12) | (k & 0xfff); };

  // Units in chunk-major order, as NCCL's rings run: chunk k travels all the way round
  // (every step) before chunk k+1's steps are processed here, while other ranks work
  // on other chunks. Each unit's send is then matched one unit later by the next rank,
  // so a bounded window of slots never waits on a receive that is not yet posted.
  size_t rows = 0;
  for (int b = 0; b < n; ++b) rows = std::max(rows, nchunks(b));
  std::vector<Unit> units;
  for (size_t k = 0; k < rows; ++k)
    for (int t = 0; t < T; ++t)
      if (k < nchunks(recv_block(t))) units.push_back({t, recv_block(t), k});

  // Receive slots for reduce steps (gather steps receive in place: none for an
  // all-gather); accumulator slots when the partial sums cannot live in the caller's
  // buffer (reduce-scatter into a separate output). A slot holds one chunk, so no more
  // than the largest block when every block fits one chunk.
  const bool acc_in_scratch = job.reduce && !job.gather && job.buf == nullptr;
  size_t slot = 0;  // elements
  if (job.reduce)
    for (int b = 0; b < n; ++b) slot = std::max(slot, std::min(C, job.len[size_t(b)]));
  Scratch slots(size_t(W) * slot * es * (acc_in_scratch ? 2 : 1));
  char* recv_slots = slots.data();
  char* acc_slots = acc_in_scratch ? slots.data() + size_t(W) * slot * es : nullptr;
  std::vector<RequestPtr> acc_send(static_cast<size_t>(W));

  std::vector<RequestPtr> recvs(units.size());
  std::vector<RequestPtr> sends;
  const int b0 = send_block(0);
  const size_t n0 = nchunks(b0);

  auto post_recv = [&](size_t i) {
    const Unit& u = units[i];
    size_t bytes = chunk_len(u.block, u.chunk) * es;
    char* dst = u.step < t_rs ? recv_slots + (i % size_t(W)) * slot * es
                              : job.buf + (job.off[size_t(u.block)] + u.chunk * C) * es;
    recvs[i] = g.recv(dst, bytes, mod(r - 1), tag_step(u.step, u.chunk));
  };
  auto post_first_send = [&](size_t k) {
    const char* src;
    if (job.reduce)
      src = job.in + (job.off[size_t(b0)] + k * C) * es;
    else if (job.own != nullptr)
      src = job.own + k * C * es;  // b0 is this rank's own block
    else
      src = job.buf + (job.off[size_t(b0)] + k * C) * es;
    sends.push_back(g.send(src, chunk_len(b0, k) * es, mod(r + 1), tag_step(0, k)));
  };

  // Step 0 sends this rank's own data: kept a few chunks ahead of the rows processed.
  const size_t lead = 2;
  size_t next_recv = 0;
  size_t next_first = 0;
  for (; next_first < std::min(lead, n0); ++next_first) post_first_send(next_first);
  // An all-gather also copies its own block into place: a chunk per row, while that
  // row's transfers are under way, rather than all of it before the first wait.
  const bool copy_own = !job.reduce && job.own != nullptr;
  size_t next_copy = 0;
  auto copy_own_chunk = [&](size_t k) {
    std::memcpy(job.buf + (job.off[size_t(r)] + k * C) * es, job.own + k * C * es,
                chunk_len(r, k) * es);
  };

  // Chunk k of step t is sent at step t+1 from where unit (t, k) left its result.
  for (size_t i = 0; i < units.size(); ++i) {
    while (next_recv < units.size() && next_recv < i + size_t(W)) post_recv(next_recv++);
    const Unit& u = units[i];
    while (next_first < n0 && next_first < u.chunk + lead) post_first_send(next_first++);
    if (copy_own && next_copy < n0 && next_copy <= u.chunk) copy_own_chunk(next_copy++);
    g.wait(recvs[i]);
    size_t len = chunk_len(u.block, u.chunk);
    size_t at = (job.off[size_t(u.block)] + u.chunk * C) * es;
    char* res;
    if (u.step < t_rs) {
      const char* mine = job.in + at;
      if (!acc_in_scratch) {
        res = job.buf + at;
      } else if (u.step == t_rs - 1) {
        res = job.out + u.chunk * C * es;
      } else {
        size_t s = i % size_t(W);
        if (acc_send[s]) g.wait(acc_send[s]);  // the slot's previous sum is still going out
        res = acc_slots + s * slot * es;
      }
      reduce(res, mine, recv_slots + (i % size_t(W)) * slot * es, len, job.dtype, job.op);
      if (u.step == t_rs - 1 && job.op == ReduceOp::avg) divide(res, len, job.dtype, n);
    } else {
      res = job.buf + at;
    }
    if (u.step + 1 < T) {
      sends.push_back(g.send(res, len * es, mod(r + 1), tag_step(u.step + 1, u.chunk)));
      if (acc_in_scratch && u.step < t_rs - 1) acc_send[i % size_t(W)] = sends.back();
    }
  }
  while (next_first < n0) post_first_send(next_first++);
  while (copy_own && next_copy < n0) copy_own_chunk(next_copy++);
  g.wait_all(sends);
}

}  // namespace baton::transport::detail
