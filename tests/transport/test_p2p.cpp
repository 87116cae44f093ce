// Point-to-point: many concurrent messages with distinct tags arriving out of order,
// FIFO order for one tag, empty messages, size mismatches, sub-group isolation, and
// failures of a peer, on both backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "memory/tensor.h"
#include "tests/transport/world_harness.h"
#include "transport/detail/local_fabric.h"
#include "transport/local.h"
#include "transport/pair_routes.h"

namespace baton::transport::testing {
namespace {

using memory::DType;

Tensor pattern(int64_t n, uint32_t key) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(key * 1000003u + uint32_t(i));
  return Tensor::from_vector(v, {n});
}

bool matches(const Tensor& t, uint32_t key) {
  auto v = t.to_vector<int32_t>();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != int32_t(key * 1000003u + uint32_t(i))) return false;
  return true;
}

int64_t size_for(int t) {
  static const int64_t sizes[] = {0, 2, 256, 25'000, 300'000};  // up to 1.2 MB
  return sizes[t % 5];
}

class P2P : public ::testing::TestWithParam<Backend> {};

TEST_P(P2P, ManyTagsOutOfOrder) {
  const uint32_t seed = uint32_t(std::random_device{}());
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("ManyTagsOutOfOrder seed %u\n", seed);
  constexpr int kMessages = 120;
  run_world(GetParam(), 2, [&](Communicator& c) {
    const int peer = 1 - c.rank();
    // Both ranks send everything in tag order and receive in a random order, posting
    // receives before, during and after the sends.
    std::mt19937 rng(seed + uint32_t(c.rank()));
    std::vector<int> order(kMessages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Tensor> out(kMessages), in(kMessages);
    std::vector<WorkPtr> sends, recvs(kMessages);
    for (int t = 0; t < kMessages; ++t)
      out[size_t(t)] = pattern(size_for(t), uint32_t(c.rank() * 10000 + t));
    for (int i = 0; i < kMessages / 2; ++i) {
      int t = order[size_t(i)];
      in[size_t(t)] = Tensor::zeros({size_for(t)}, DType::i32);
      recvs[size_t(t)] = c.irecv(in[size_t(t)], peer, uint64_t(t));
    }
    for (int t = 0; t < kMessages; ++t) sends.push_back(c.isend(out[size_t(t)], peer, uint64_t(t)));
    for (int i = kMessages / 2; i < kMessages; ++i) {
      int t = order[size_t(i)];
      in[size_t(t)] = Tensor::zeros({size_for(t)}, DType::i32);
      recvs[size_t(t)] = c.irecv(in[size_t(t)], peer, uint64_t(t));
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (int t : order) {
      recvs[size_t(t)]->wait();
      EXPECT_TRUE(matches(in[size_t(t)], uint32_t(peer * 10000 + t))) << "tag " << t;
    }
    for (auto& s : sends) s->wait();
  });
}

TEST_P(P2P, OneTagKeepsOrder) {
  run_world(GetParam(), 3, [&](Communicator& c) {
    // Ranks 1 and 2 each send 40 messages with one tag to rank 0, of varying sizes;
    // rank 0 receives them in order from each.
    constexpr int kCount = 40;
    if (c.rank() != 0) {
      std::vector<Tensor> out;
      std::vector<WorkPtr> ws;
      for (int k = 0; k < kCount; ++k) {
        out.push_back(pattern(size_for(k), uint32_t(c.rank() * 100 + k)));
        ws.push_back(c.isend(out.back(), 0, 7));
      }
      for (auto& w : ws) w->wait();
    } else {
      for (int src : {1, 2}) {
        for (int k = 0; k < kCount; ++k) {
          Tensor in = Tensor::zeros({size_for(k)}, DType::i32);
          c.irecv(in, src, 7)->wait();
          EXPECT_TRUE(matches(in, uint32_t(src * 100 + k))) << "from " << src << " message " << k;
        }
      }
    }
  });
}

TEST_P(P2P, ReceivePostedLongBeforeSend) {
  run_world(GetParam(), 2, [&](Communicator& c) {
    Tensor t = c.rank() == 0 ? pattern(1 << 20, 5) : Tensor::zeros({1 << 20}, DType::i32);
    if (c.rank() == 1) {
      auto w = c.irecv(t, 0, 3);
      c.barrier()->wait();
      EXPECT_FALSE(w->test());  // rank 0 has not sent yet
      c.barrier()->wait();
      w->wait();
      EXPECT_TRUE(matches(t, 5));
    } else {
      c.barrier()->wait();
      c.barrier()->wait();
      c.isend(t, 1, 3)->wait();
    }
  });
}

// route_pairs_apart (transport/pair_routes.h): a chain 0 - 1 - 2 whose middle rank has
// four routes and the ends two; each direction gets a communicator of its own, split in
// one order on every rank (no rank waits on another's split forever), messages both ways
// with receives posted first, collectives on the world, and no route to a rank not given.
TEST_P(P2P, PairsRoutedApart) {
  run_world(GetParam(), 3, [&](Communicator& c) {
    const int me = c.rank();
    std::set<std::pair<int, int>> routes;
    for (int peer : {me - 1, me + 1})
      if (peer >= 0 && peer < 3) {
        routes.insert({me, peer});
        routes.insert({peer, me});
      }
    CommPtr world(&c, [](Communicator*) {});
    std::vector<std::vector<int>> made;
    CommPtr p2p = route_pairs_apart(world, routes, [&](const std::vector<int>& m) {
      made.push_back(m);
      return c.split(m);
    });
    EXPECT_EQ(made.size(), routes.size());
    EXPECT_TRUE(std::is_sorted(made.begin(), made.end()));
    std::vector<std::pair<Tensor, WorkPtr>> recvs;
    for (const auto& [src, dst] : routes)
      if (dst == me) {
        recvs.push_back({Tensor::zeros({4096}, DType::i32), nullptr});
        recvs.back().second = p2p->irecv(recvs.back().first, src, 1);
      }
    for (const auto& [src, dst] : routes)
      if (src == me) p2p->isend(pattern(4096, 10 * me + dst), dst, 1)->wait();
    size_t k = 0;
    for (const auto& [src, dst] : routes)
      if (dst == me) {
        recvs[k].second->wait();
        EXPECT_TRUE(matches(recvs[k].first, 10 * src + me)) << src << " -> " << me;
        ++k;
      }
    Tensor one = Tensor::from_vector(std::vector<int32_t>{1}, {1});
    p2p->all_reduce(one, ReduceOp::sum)->wait();
    EXPECT_EQ(one.to_vector<int32_t>(), std::vector<int32_t>{3});
    if (me == 0) {
      Tensor t = pattern(4, 1);
      EXPECT_THROW(p2p->isend(t, 2, 1), std::logic_error);
      EXPECT_THROW(
          route_pairs_apart(world, {{1, 2}}, [&](const std::vector<int>& m) { return c.split(m); }),
          std::logic_error);
    }
    c.barrier()->wait();
  });
}

// Messages to one's own rank, as the local backend always took them: UCX cannot connect a
// worker to itself, and a rank had declared itself failed, breaking the whole job.
// Eager and large, receive first and send first, FIFO per tag, a size mismatch, and a
// sub-group's own tags apart from the world's.
TEST_P(P2P, MessagesToOneselfMatchAsBetweenTwoRanks) {
  run_world(GetParam(), 2, [&](Communicator& c) {
    const int me = c.rank();
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(300'000)}) {  // up to 1.2 MB: not eager
      Tensor a = pattern(n, uint32_t(10 + me)), b = Tensor::zeros({n}, DType::i32);
      auto sw = c.isend(a, me, 9);
      auto rw = c.irecv(b, me, 9);
      rw->wait();
      sw->wait();
      EXPECT_TRUE(matches(b, uint32_t(10 + me))) << n << " elements, send first";
      Tensor d = Tensor::zeros({n}, DType::i32);
      rw = c.irecv(d, me, 10);
      sw = c.isend(a, me, 10);
      sw->wait();
      rw->wait();
      EXPECT_TRUE(matches(d, uint32_t(10 + me))) << n << " elements, receive first";
    }
    std::vector<Tensor> out, in;
    std::vector<WorkPtr> ws;
    for (int k = 0; k < 10; ++k) {
      out.push_back(pattern(size_for(k), uint32_t(k)));
      ws.push_back(c.isend(out.back(), me, 3));
    }
    for (int k = 0; k < 10; ++k) {
      in.push_back(Tensor::zeros({size_for(k)}, DType::i32));
      ws.push_back(c.irecv(in.back(), me, 3));
    }
    for (auto& w : ws) w->wait();
    for (int k = 0; k < 10; ++k)
      EXPECT_TRUE(matches(in[size_t(k)], uint32_t(k))) << "message " << k;
    Tensor big = pattern(16, 1), small = Tensor::zeros({8}, DType::i32);
    auto s = c.isend(big, me, 4);
    try {
      c.irecv(small, me, 4)->wait();
      ADD_FAILURE() << "a receive of 8 elements matched a message of 16";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("size mismatch"), std::string::npos) << e.what();
    }
    s->wait();
    auto alone = c.split({me});
    Tensor x = pattern(5, 7), y = pattern(5, 8), rx = Tensor::zeros({5}, DType::i32),
           ry = Tensor::zeros({5}, DType::i32);
    auto wx = c.isend(x, me, 6);
    auto wy = alone->isend(y, 0, 6);
    alone->irecv(ry, 0, 6)->wait();
    c.irecv(rx, me, 6)->wait();
    wx->wait();
    wy->wait();
    EXPECT_TRUE(matches(rx, 7));
    EXPECT_TRUE(matches(ry, 8));
    EXPECT_FALSE(c.first_failure().has_value()) << c.first_failure()->second;
    // The world still works, with the other rank too.
    Tensor t = Tensor::full({4}, 1);
    c.all_reduce(t, ReduceOp::sum)->wait();
    EXPECT_EQ(t.data<float>()[0], 2.0f);
  });
}

TEST_P(P2P, SizeMismatchIsAnError) {
  run_world(GetParam(), 2, [&](Communicator& c) {
    if (c.rank() == 0) {
      Tensor t = pattern(16, 1);
      c.isend(t, 1, 9)->wait();
    } else {
      Tensor t = Tensor::zeros({8}, DType::i32);
      try {
        c.irecv(t, 0, 9)->wait();
        ADD_FAILURE() << "a receive of 8 elements matched a message of 16";
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find("size mismatch"), std::string::npos) << e.what();
      }
    }
  });
}

TEST_P(P2P, BadArgumentsAreRejected) {
  run_world(GetParam(), 2, [&](Communicator& c) {
    Tensor t = pattern(4, 1);
    EXPECT_THROW(c.isend(t, 2, 0), std::invalid_argument);
    EXPECT_THROW(c.isend(t, 1 - c.rank(), uint64_t(1) << 40), std::invalid_argument);
    Tensor strided = pattern(8, 1).view({2, 4}).transpose(0, 1);
    EXPECT_THROW(c.irecv(strided, 1 - c.rank(), 0), std::invalid_argument);
    Tensor in = pattern(5, 1), odd = Tensor::zeros({11}, DType::i32);
    EXPECT_THROW(c.all_gather(in, odd), std::invalid_argument);  // 11 does not split in 2
    Tensor floats = Tensor::zeros({10});
    EXPECT_THROW(c.all_gather(in, floats), std::invalid_argument);  // i32 into f32
    EXPECT_THROW(c.split({0, 0}), std::invalid_argument);
  });
}

TEST_P(P2P, GroupsDoNotMix) {
  run_world(GetParam(), 4, [&](Communicator& c) {
    // The same pair, the same user tag, on the world and on a sub-group.
    auto pair = c.split(c.rank() < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    int peer_world = c.rank() ^ 1;
    int peer_sub = pair->rank() ^ 1;
    Tensor a = pattern(100, uint32_t(1000 + c.rank())), b = pattern(100, uint32_t(2000 + c.rank()));
    Tensor ra = Tensor::zeros({100}, DType::i32), rb = Tensor::zeros({100}, DType::i32);
    // Receive on the sub-group first, send on the world first: a shared queue would
    // swap them.
    auto wb = pair->irecv(rb, peer_sub, 4);
    auto wa = c.irecv(ra, peer_world, 4);
    auto sa = c.isend(a, peer_world, 4);
    auto sb = pair->isend(b, peer_sub, 4);
    wa->wait();
    wb->wait();
    sa->wait();
    sb->wait();
    EXPECT_TRUE(matches(ra, uint32_t(1000 + peer_world)));
    EXPECT_TRUE(matches(rb, uint32_t(2000 + peer_world)));
  });
}

INSTANTIATE_TEST_SUITE_P(All, P2P, ::testing::ValuesIn(tested_backends()),
                         [](const auto& p) { return backend_name(p.param); });

// ---- failures, local backend (UCX failures are tested with real processes) ----

TEST(LocalFailure, ARankLeavingMidCollectiveIsNamedByAll) {
  // Rank 2 of 3 closes its communicator instead of joining an all-reduce (a local rank
  // cannot die; leaving is the closest). Rank 0, which waits on it, fails naming it and
  // then closes too, as a failing process exits; rank 1, which waits on rank 0, must
  // still name rank 2, the first failure.
  auto world = make_local_world(3, test_options());
  std::vector<std::thread> threads;
  std::vector<std::string> errors(3);
  std::vector<int> peers(3, -1);
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Tensor t = Tensor::full({100000}, 1.0);
      try {
        world[size_t(r)]->all_reduce(t, ReduceOp::sum)->wait();
      } catch (const PeerError& e) {
        errors[size_t(r)] = e.what();
        peers[size_t(r)] = e.peer();
      }
      world[size_t(r)].reset();
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  world[2].reset();
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(peers[size_t(r)], 2) << "rank " << r << ": " << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("rank 2"), std::string::npos) << errors[size_t(r)];
  }
  EXPECT_LT(secs, 5.0);  // fast, not hanging (TSan and a loaded machine are slow)
}

TEST(LocalFailure, OperationsWithARankThatLeftFailAtOnce) {
  auto world = make_local_world(3, test_options());
  world[2].reset();
  Tensor t = Tensor::full({4}, 1.0);
  EXPECT_THROW(world[0]->isend(t, 2, 0)->wait(), PeerError);
  Tensor u = Tensor::zeros({4});
  EXPECT_THROW(world[0]->irecv(u, 2, 0)->wait(), PeerError);
  // Between the others, point-to-point still works.
  std::thread other([&] { world[1]->irecv(u, 0, 1)->wait(); });
  world[0]->isend(t, 1, 1)->wait();
  other.join();
}

TEST(LocalFailure, MessagesSentBeforeLeavingStillArrive) {
  auto world = make_local_world(2, test_options());
  Tensor small = pattern(10, 3);
  world[1]->isend(small, 0, 1)->wait();  // eager: complete once copied
  world[1].reset();
  Tensor in = Tensor::zeros({10}, DType::i32);
  world[0]->irecv(in, 1, 1)->wait();
  EXPECT_TRUE(matches(in, 3));
  Tensor more = Tensor::zeros({10}, DType::i32);
  EXPECT_THROW(world[0]->irecv(more, 1, 2)->wait(), PeerError);
}

}  // namespace
}  // namespace baton::transport::testing

namespace baton::transport::testing {
namespace {

// A peer that is busy (here: asleep) for several peer timeouts is alive: its progress
// thread answers the liveness pings, so nothing fails.
TEST(Liveness, ABusyPeerIsNotAFailedPeer) {
  CommOptions o = test_options();
  o.peer_timeout = std::chrono::milliseconds(500);
  for (Backend b : tested_backends()) {
    run_world(
        b, 2,
        [&](Communicator& c) {
          Tensor t = Tensor::full({1000}, 1.0);
          if (c.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2000));
            c.isend(t, 0, 1)->wait();
          } else {
            c.irecv(t, 1, 1)->wait();
          }
          c.all_reduce(t, ReduceOp::sum)->wait();
        },
        o);
  }
}

// A peer whose process answers the pings but whose thread never takes part (stuck in a
// deadlock) fails the operation waiting on it after the stall timeout, naming it, where
// the wait had lasted forever.
TEST(Liveness, APeerThatAnswersButNeverTakesPartStallsOut) {
  CommOptions o = test_options();
  o.peer_timeout = std::chrono::milliseconds(500);
  o.stall_timeout = std::chrono::milliseconds(1000);
  for (Backend b : tested_backends()) {
    run_world(
        b, 2,
        [&](Communicator& c) {
          Tensor t = Tensor::full({16}, 1.0);
          if (c.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3000));
            try {
              c.isend(t, 0, 1)->wait();
            } catch (const PeerError&) {  // rank 0 gave up on it and left
            }
            return;
          }
          const auto t0 = std::chrono::steady_clock::now();
          try {
            c.irecv(t, 1, 1)->wait();
            ADD_FAILURE() << backend_name(b) << ": the receive waited out the stuck peer";
          } catch (const PeerError& e) {
            EXPECT_EQ(e.peer(), 1) << e.what();
            EXPECT_NE(std::string(e.what()).find("BATON_STALL_TIMEOUT"), std::string::npos)
                << e.what();
          }
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          EXPECT_GT(waited, 0.9) << backend_name(b);
          EXPECT_LT(waited, 2.9) << backend_name(b);
        },
        o, /*leave_together=*/false);
  }
}

}  // namespace
}  // namespace baton::transport::testing

namespace baton::transport::testing {
namespace {

// Communication advances without its caller: a collective nobody waits on finishes in
// the background, and a large send finishes while its sender sleeps.
TEST(Progress, CollectivesFinishWithoutAWait) {
  for (Backend b : tested_backends()) {
    run_world(b, 3, [&](Communicator& c) {
      Tensor big = Tensor::full({1 << 20}, 1.0);  // 4 MiB: the background thread starts at once
      Tensor small = Tensor::full({4}, 1.0);      // small: picked up within a millisecond
      auto w1 = c.all_reduce(big, ReduceOp::sum);
      auto w2 = c.all_reduce(small, ReduceOp::sum);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!(w1->test() && w2->test())) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << backend_name(b) << ": no progress";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(big.data<float>()[12345], 3.0f);
      EXPECT_EQ(small.data<float>()[3], 3.0f);
    });
  }
}

TEST(Progress, ALargeSendFinishesWhileItsSenderSleeps) {
  for (Backend b : tested_backends()) {
    run_world(b, 2, [&](Communicator& c) {
      Tensor t = c.rank() == 0 ? Tensor::full({4 << 20}, 7.0) : Tensor::zeros({4 << 20});  // 16 MiB
      if (c.rank() == 0) {
        auto w = c.isend(t, 1, 5);
        // No call into the library for a while: the progress thread moves the data.
        std::this_thread::sleep_for(std::chrono::milliseconds(4000));
        EXPECT_TRUE(w->test()) << backend_name(b) << ": the send waited for its sender";
        w->wait();
      } else {
        auto t0 = std::chrono::steady_clock::now();
        c.irecv(t, 0, 5)->wait();
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // Well under the sender's 4 s sleep; the margin is for the instrumented copy of
        // 16 MiB under ThreadSanitizer on a busy machine (1.65 s once).
        EXPECT_LT(secs, 3.0) << backend_name(b)
                             << ": the receive waited for the sender's next call";
        EXPECT_EQ(t.data<float>()[(4 << 20) - 1], 7.0f);
      }
    });
  }
}

// Rank 0 leaves of its own error (its goodbye says only that it left); rank 1, which still
// needed it, leaves saying rank 0 failed. Rank 2 names rank 0, not the reporter: it had
// kept rank 0 as merely gone and named none, or under UCX rank 1.
TEST(Fabric, ALeaverReportedFailedByAnotherIsTheFailure) {
  auto hub = std::make_shared<detail::LocalHub>(3);
  auto f0 = std::make_unique<detail::LocalFabric>(hub, 0, CommOptions{});
  auto f1 = std::make_unique<detail::LocalFabric>(hub, 1, CommOptions{});
  detail::LocalFabric f2(hub, 2, CommOptions{});
  f0.reset();
  EXPECT_FALSE(f2.first_failure().has_value());  // left: no failure of its own
  EXPECT_TRUE(f2.knows_failure(0, /*left=*/true));
  EXPECT_FALSE(f2.knows_failure(0, /*left=*/false));
  f1->declare_failed(0, "it left the job while rank 1 still needed it");
  f1.reset();
  const auto first = f2.first_failure();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->first, 0);
  EXPECT_NE(first->second.find("while rank 1 still needed it (reported by rank 1)"),
            std::string::npos)
      << first->second;
  EXPECT_TRUE(f2.knows_failure(0, /*left=*/false));
}

}  // namespace
}  // namespace baton::transport::testing
