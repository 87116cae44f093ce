// The NCCL communicator: every collective and point-to-point on world size 1 (one GPU)
// and on every GPU of the machine as threads of one process, one rank per GPU (skipped
// without a device; world sizes beyond the GPU count are skipped too).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "memory/cuda_device.h"
#include "memory_store.h"
#include "transport/nccl_communicator.h"
#include "transport/pair_routes.h"

using namespace baton;
using memory::Device;
using memory::DType;
using memory::Tensor;
using transport::CommPtr;
using transport::ReduceOp;

namespace {

Tensor dev_tensor(const std::vector<float>& v, int device) {
  return Tensor::from_vector(v, {int64_t(v.size())}).to(Device::cuda(device));
}
std::vector<float> nccl_host(const Tensor& t) {
  memory::cuda::synchronize(t.device().index);
  return t.to(Device::cpu()).to_vector<float>();
}

// Runs fn(comm, rank) on n ranks, one thread and GPU each.
void run_world(int n, const std::function<void(transport::Communicator&, int)>& fn) {
  const transport::NcclId id = transport::nccl_unique_id();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        memory::cuda::DeviceGuard g(r);
        CommPtr c = transport::make_nccl_communicator(id, r, n, r);
        fn(*c, r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

// Why a test of `gpus` devices cannot run here (the driver's reason when there is no
// device), or "" when it can.
static std::string skip_reason(int gpus) {
  if (!transport::nccl_available()) return "built without NCCL";
  const int present = memory::cuda::device_count();
  if (present == 0) return "no CUDA device: " + memory::cuda::unavailable_reason();
  if (gpus > present)
    return "needs " + std::to_string(gpus) + " GPUs, " + std::to_string(present) + " present";
  return "";
}

class NcclWorld : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = skip_reason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

}  // namespace

TEST_P(NcclWorld, IdExchangedThroughTheRendezvousStore) {
  const int n = GetParam();
  test::MemoryStore store;
  std::vector<std::thread> threads;
  std::vector<float> sums(static_cast<size_t>(n), 0.f);
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        memory::cuda::DeviceGuard g(r);
        CommPtr c = transport::make_nccl_communicator(store, "nccl/world", r, n, r);
        Tensor t = dev_tensor({1.f}, r);
        c->all_reduce(t, ReduceOp::sum)->wait();
        sums[size_t(r)] = nccl_host(t)[0];
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(sums[size_t(r)], float(n)) << "rank " << r;
  }
}

TEST_P(NcclWorld, AllReduceSumAvgMax) {
  const int n = GetParam();
  run_world(n, [n](transport::Communicator& c, int r) {
    EXPECT_EQ(c.backend(), "nccl");
    EXPECT_EQ(c.size(), n);
    Tensor s = dev_tensor({float(r), 1.f, float(r * r)}, r);
    c.all_reduce(s, ReduceOp::sum)->wait();
    float sq = 0;
    for (int i = 0; i < n; ++i) sq += float(i * i);
    const int ranks_sum = n * (n - 1) / 2;  // 0 + 1 + ... + n - 1, exact
    EXPECT_EQ(nccl_host(s), (std::vector<float>{float(ranks_sum), float(n), sq}));
    Tensor m = dev_tensor({float(r), -float(r)}, r);
    c.all_reduce(m, ReduceOp::max)->wait();
    EXPECT_EQ(nccl_host(m), (std::vector<float>{float(n - 1), 0.f}));
    Tensor a = dev_tensor({2.f * float(r)}, r);
    c.all_reduce(a, ReduceOp::avg)->wait();
    EXPECT_FLOAT_EQ(nccl_host(a)[0], float(n - 1));
  });
}

TEST_P(NcclWorld, BroadcastScatterGather) {
  const int n = GetParam();
  run_world(n, [n](transport::Communicator& c, int r) {
    Tensor b = dev_tensor({float(r + 1), 7.f}, r);
    c.broadcast(b, n - 1)->wait();
    EXPECT_EQ(nccl_host(b), (std::vector<float>{float(n), 7.f}));
    // Unequal parts: rank i gets i + 1 elements.
    std::vector<int64_t> counts(static_cast<size_t>(n));
    std::iota(counts.begin(), counts.end(), 1);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
    std::vector<float> all(static_cast<size_t>(total));
    std::iota(all.begin(), all.end(), 0.f);
    Tensor in = dev_tensor(all, r);
    Tensor part = Tensor::empty({r + 1}, DType::f32, Device::cuda(r));
    c.scatter(in, part, 0, counts)->wait();
    const int64_t off = int64_t(r) * (r + 1) / 2;
    EXPECT_EQ(nccl_host(part), std::vector<float>(all.begin() + off, all.begin() + off + r + 1));
    Tensor back = Tensor::zeros({total}, DType::f32, Device::cuda(r));
    c.gather(part, back, 0, counts)->wait();
    if (r == 0) {
      EXPECT_EQ(nccl_host(back), all);
    }
  });
}

TEST_P(NcclWorld, AllGatherAndReduceScatterEqualAndUnequal) {
  const int n = GetParam();
  run_world(n, [n](transport::Communicator& c, int r) {
    Tensor mine = dev_tensor({float(r), float(r) + 0.5f}, r);
    Tensor all = Tensor::empty({2 * n}, DType::f32, Device::cuda(r));
    c.all_gather(mine, all)->wait();
    std::vector<float> want;
    for (int i = 0; i < n; ++i) want.insert(want.end(), {float(i), float(i) + 0.5f});
    EXPECT_EQ(nccl_host(all), want);

    std::vector<int64_t> counts(static_cast<size_t>(n));
    std::iota(counts.begin(), counts.end(), 1);
    const int64_t total = int64_t(n) * (n + 1) / 2;
    Tensor part = dev_tensor(std::vector<float>(size_t(r + 1), float(r)), r);
    Tensor cat = Tensor::empty({total}, DType::f32, Device::cuda(r));
    c.all_gather(part, cat, counts)->wait();
    std::vector<float> want_cat;
    for (int i = 0; i < n; ++i) want_cat.insert(want_cat.end(), size_t(i + 1), float(i));
    EXPECT_EQ(nccl_host(cat), want_cat);

    std::vector<float> ones(size_t(total), 1.f);
    Tensor src = dev_tensor(ones, r);
    Tensor red = Tensor::empty({r + 1}, DType::f32, Device::cuda(r));
    c.reduce_scatter(src, red, ReduceOp::sum, counts)->wait();
    EXPECT_EQ(nccl_host(red), std::vector<float>(size_t(r + 1), float(n)));
    Tensor src2 = dev_tensor(std::vector<float>(size_t(2 * n), float(r)), r);
    Tensor red2 = Tensor::empty({2}, DType::f32, Device::cuda(r));
    c.reduce_scatter(src2, red2, ReduceOp::max)->wait();
    EXPECT_EQ(nccl_host(red2), std::vector<float>(2, float(n - 1)));
  });
}

TEST_P(NcclWorld, SendRecvRingPostedBeforeWaiting) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "point-to-point needs two ranks";
  run_world(n, [n](transport::Communicator& c, int r) {
    // Both directions posted first, then waited: grouped, so no rank blocks its peer.
    Tensor out = dev_tensor(std::vector<float>(1 << 20, float(r)), r);
    Tensor in = Tensor::empty({1 << 20}, DType::f32, Device::cuda(r));
    auto s = c.isend(out, (r + 1) % n, 7);
    auto q = c.irecv(in, (r + n - 1) % n, 7);
    s->wait();
    q->wait();
    EXPECT_EQ(nccl_host(in), std::vector<float>(1 << 20, float((r + n - 1) % n)));
    EXPECT_TRUE(q->test());
  });
}

// 1F1B's steady state between two pipeline ranks: each sends (32 MiB, beyond NCCL's
// buffers, so a send waits for its receive) before it receives, with receives posted two
// ahead. On one communicator the receives posted ahead and the sends queued behind them
// wait for each other; over route_pairs_apart's communicators (one per direction, each
// operation launched when posted) every message arrives.
TEST_P(NcclWorld, PipelineTrafficRoutedPerPairNeverWaitsOnItself) {
  const int n = GetParam();
  if (n != 2) GTEST_SKIP() << "a pair of pipeline ranks";
  run_world(2, [](transport::Communicator& c, int r) {
    CommPtr world(&c, [](transport::Communicator*) {});
    CommPtr p2p = transport::route_pairs_apart(
        world, {{0, 1}, {1, 0}},
        [&](const std::vector<int>& m) { return transport::nccl_split_p2p(c, m); });
    const int64_t elements = int64_t(8) << 20;
    const int peer = 1 - r, steps = 4;
    std::vector<Tensor> in;
    std::vector<transport::WorkPtr> recvs, sends;
    for (int k = 0; k < steps; ++k)
      in.push_back(Tensor::empty({elements}, DType::f32, Device::cuda(r)));
    for (int k = 0; k < 2; ++k) recvs.push_back(p2p->irecv(in[size_t(k)], peer, 0));
    for (int k = 0; k < steps; ++k) {
      Tensor out = Tensor::empty({elements}, DType::f32, Device::cuda(r));
      out.copy_from(
          Tensor::from_vector(std::vector<float>(size_t(elements), float(10 * r + k)), {elements})
              .to(Device::cuda(r)));
      sends.push_back(p2p->isend(out, peer, 0));
      if (k + 2 < steps) recvs.push_back(p2p->irecv(in[size_t(k + 2)], peer, 0));
      recvs[size_t(k)]->wait();
      EXPECT_EQ(nccl_host(in[size_t(k)].narrow(0, elements - 1, 1)),
                std::vector<float>{float(10 * peer + k)});
    }
    for (auto& w : sends) w->wait();
    memory::cuda::synchronize(r);
  });
}

TEST_P(NcclWorld, SplitMakesIndependentGroups) {
  const int n = GetParam();
  run_world(n, [](transport::Communicator& c, int r) {
    std::vector<int> members{r};  // each rank alone: a group of one
    auto sub = c.split(members);
    EXPECT_EQ(sub->size(), 1);
    EXPECT_EQ(sub->global_rank(0), r);
    Tensor t = dev_tensor({3.f}, r);
    sub->all_reduce(t, ReduceOp::sum)->wait();
    EXPECT_EQ(nccl_host(t), std::vector<float>{3.f});
    c.barrier()->wait();
  });
}

TEST(Nccl, WorldOfOneOnTheLocalRanksDevice) {
  if (std::string why = skip_reason(1); !why.empty()) GTEST_SKIP() << why;
  transport::LaunchEnv env;  // what read_launch_env() says for a process started alone
  CommPtr c = transport::make_nccl_world(env, nullptr);
  EXPECT_EQ(c->size(), 1);
  Tensor t = dev_tensor({2.f, 3.f}, 0);
  c->all_reduce(t, ReduceOp::sum)->wait();
  EXPECT_EQ(nccl_host(t), (std::vector<float>{2.f, 3.f}));
  env.local_rank = memory::cuda::device_count();  // one past the last GPU
  EXPECT_THROW(transport::make_nccl_world(env, nullptr), RuntimeError);
}

TEST(Nccl, APeerThatNeverAnswersBecomesAPeerError) {
  if (std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << why;
  const transport::NcclId id = transport::nccl_unique_id();
  std::atomic<bool> done{false};
  std::string error;
  bool peer_error = false;
  std::thread silent([&] {  // rank 1 joins, then never posts the receive
    memory::cuda::DeviceGuard g(1);
    CommPtr c = transport::make_nccl_communicator(id, 1, 2, 1, std::chrono::milliseconds(1000));
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  try {
    memory::cuda::DeviceGuard g(0);
    CommPtr c = transport::make_nccl_communicator(id, 0, 2, 0, std::chrono::milliseconds(1000));
    Tensor t = Tensor::zeros({1 << 20}, DType::f32, Device::cuda(0));
    auto s = c->isend(t, 1, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    try {
      while (!s->test() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      error = "the send completed or the watchdog never fired";
    } catch (const transport::PeerError& e) {
      peer_error = true;
      EXPECT_EQ(e.peer(), 1) << e.what();
      EXPECT_THROW(c->barrier()->wait(), transport::PeerError);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  done.store(true);
  silent.join();
  EXPECT_TRUE(peer_error) << error;
}

// Initialisation is watched too: rank 1 never comes, rank 0 (one GPU is enough) gives up
// after the peer timeout with PeerError naming rank 1, instead of hanging in NCCL.
TEST(Nccl, ARankThatNeverJoinsBecomesAPeerErrorNamingIt) {
  if (std::string why = skip_reason(1); !why.empty()) GTEST_SKIP() << why;
  test::MemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  try {
    transport::make_nccl_communicator(store, "lonely", 0, 2, 0, std::chrono::milliseconds(1000),
                                      std::chrono::milliseconds(2000));
    FAIL() << "a communicator of two was made with one rank";
  } catch (const transport::PeerError& e) {
    EXPECT_EQ(e.peer(), 1) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 (global 1) never joined"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Two communicators under one key in one job: each initialisation gets its own id.
TEST(Nccl, TwoWorldsUnderOneKeyAreIndependent) {
  if (std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << why;
  test::MemoryStore store;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> ts;
    std::vector<float> got(2);
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        memory::cuda::DeviceGuard g(r);
        CommPtr c = transport::make_nccl_communicator(store, "baton/nccl/world", r, 2, r);
        Tensor t = dev_tensor({float(r + 1)}, r);
        c->all_reduce(t, ReduceOp::sum)->wait();
        got[size_t(r)] = nccl_host(t)[0];
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(got, (std::vector<float>{3.f, 3.f})) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclWorld, ::testing::Values(1, 2, 4, 8),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

TEST(Nccl, RejectsHostTensors) {
  if (std::string why = skip_reason(1); !why.empty()) GTEST_SKIP() << why;
  run_world(1, [](transport::Communicator& c, int) {
    Tensor t = Tensor::zeros({4});
    EXPECT_THROW(c.all_reduce(t, ReduceOp::sum), std::logic_error);
  });
}
