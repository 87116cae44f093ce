#include "engine/detail/gossip.h"

#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "memory/error.h"

namespace baton::engine::detail {

using memory::Tensor;

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Gossip::Gossip(const DpSyncConfig& config, const std::map<int, stages::Stage*>& stages)
    : cfg_(config) {
  BATON_CHECK(cfg_.peers >= 1, "gossip: peers must be at least 1");
  for (const auto& [s, st] : stages)
    for (int id : st->param_ids())
      if (st->graph().params[size_t(id)].trainable) params_.emplace_back(st, id);
}

std::vector<int> Gossip::pairing(uint64_t seed, int64_t step, int round, int replicas) {
  uint64_t state = seed;
  state ^= splitmix64(state) + uint64_t(step) * 0xD1B54A32D192ED03ull;
  state ^= splitmix64(state) + uint64_t(round) * 0xABC98388FB8FAC03ull;
  std::vector<int> perm(static_cast<size_t>(replicas));
  for (int i = 0; i < replicas; ++i) perm[size_t(i)] = i;
  for (int i = replicas - 1; i > 0; --i)
    std::swap(perm[size_t(i)], perm[size_t(splitmix64(state) % uint64_t(i + 1))]);
  std::vector<int> partner(static_cast<size_t>(replicas), -1);
  for (int i = 0; i + 1 < replicas; i += 2) {
    partner[size_t(perm[size_t(i)])] = perm[size_t(i + 1)];
    partner[size_t(perm[size_t(i + 1)])] = perm[size_t(i)];
  }
  return partner;
}

void Gossip::after_step(int64_t step) {
  transport::Communicator* comm = cfg_.replica_comm;
  if (comm == nullptr || comm->size() < 2) return;
  BATON_CHECK(comm->size() == cfg_.replicas && comm->rank() == cfg_.replica,
              "gossip: the replica communicator does not match the replica index");
  const int rounds = std::min(cfg_.peers, cfg_.replicas - 1);
  for (int round = 0; round < rounds; ++round) {
    const int peer = pairing(cfg_.seed, step, round, cfg_.replicas)[size_t(cfg_.replica)];
    if (peer < 0) continue;
    std::vector<Tensor> theirs;
    std::vector<transport::WorkPtr> works;
    theirs.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].first->param(params_[i].second);
      theirs.push_back(Tensor::empty(p.shape(), p.dtype(), p.device()));
      works.push_back(comm->irecv(theirs.back(), peer, uint64_t(i)));
      works.push_back(comm->isend(p, peer, uint64_t(i)));
    }
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].first->param(params_[i].second);
      kernels::add_inplace(p, theirs[i]);
      kernels::scale_inplace(p, 0.5);
    }
  }
}

}  // namespace baton::engine::detail
