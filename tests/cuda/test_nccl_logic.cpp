// The NCCL communicator's logic that needs no GPU, with stand-ins for CUDA events: the
// watchdog keeps an operation's tensors until it is done, aborts a late operation or a
// hung initialisation once and names the peer, and never aborts after stop() (the
// destructor's destroy cannot race an abort); the rendezvous gives every
// initialisation a key of its own and names the ranks that never joined.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "memory/tensor.h"
#include "memory_store.h"
#include "transport/communicator.h"
#include "transport/detail/nccl_rendezvous.h"
#include "transport/detail/nccl_watchdog.h"

using namespace baton;
using namespace std::chrono_literals;
using memory::DType;
using memory::Tensor;
using transport::detail::Watchdog;

namespace {

// A CPU tensor that raises `released` when its memory goes back.
Tensor watched_tensor(std::shared_ptr<std::atomic<bool>> released) {
  static float data[4];
  return Tensor::from_blob(data, {4}, DType::f32, memory::Device::cpu(),
                           [released](void*) { released->store(true); });
}

template <class F>
bool eventually(F&& f, std::chrono::milliseconds limit = 2000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return f();
}

}  // namespace

TEST(NcclWatchdog, KeepsADroppedOperationsTensorsUntilItsEventCompletes) {
  std::atomic<int> aborts{0};
  Watchdog dog(
      10s, "[0, 1]", [&] { aborts++; }, 2ms);
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<std::atomic<bool>>(false);
  dog.launch_begin(1);
  dog.launch_end([done] { return done->load(); }, {watched_tensor(released)});
  // The Work (and the caller's tensor) are gone; the watchdog's copy is the last one.
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(released->load())
      << "the tensor went back to its pool while the stream still used it";
  EXPECT_EQ(dog.in_flight(), 1u);
  done->store(true);
  EXPECT_TRUE(eventually([&] { return released->load(); }));
  EXPECT_EQ(dog.in_flight(), 0u);
  EXPECT_EQ(aborts.load(), 0);
  EXPECT_NO_THROW(dog.check());
}

// On the GPU: an allocation that fails releases the cache under the allocator's lock,
// through a device synchronisation that waits on a receive posted ahead whose peer is gone.
// A finished send's tensor freed by the watchdog then waits on that lock; were the
// watchdog's own thread the one waiting, the receive's time-out would never be seen and
// nothing would end the synchronisation. The stand-in: a tensor whose free blocks until
// the abort.
TEST(NcclWatchdog, AFreeThatBlocksDoesNotStopTheTimeOut) {
  auto aborted = std::make_shared<std::atomic<bool>>(false);
  Watchdog dog(
      50ms, "[0, 1]", [aborted] { aborted->store(true); }, 2ms);
  dog.launch_begin(1);
  dog.launch_end([] { return false; }, {});  // the receive: never completes
  static float data[4];
  Tensor blocking =
      Tensor::from_blob(data, {4}, DType::f32, memory::Device::cpu(), [aborted](void*) {
        const auto end = std::chrono::steady_clock::now() + 10s;  // bounded: a failing test ends
        while (!aborted->load() && std::chrono::steady_clock::now() < end)
          std::this_thread::sleep_for(1ms);
      });
  dog.launch_begin(1);
  dog.launch_end([] { return true; }, {std::move(blocking)});  // the send: done
  EXPECT_TRUE(eventually([&] { return dog.aborted(); }, 3000ms))
      << "the watchdog's thread waited on a free and never saw the receive's time-out";
  EXPECT_THROW(dog.check(), transport::PeerError);
}

TEST(NcclWatchdog, ReapFreesFinishedOperationsWithoutWaitingForThePoll) {
  Watchdog dog(
      10s, "[0]", [] {}, 10s);
  auto released = std::make_shared<std::atomic<bool>>(false);
  bool done = false;
  dog.launch_begin(-1);
  dog.launch_end([&done] { return done; }, {watched_tensor(released)});
  dog.reap();
  EXPECT_FALSE(released->load());
  done = true;
  dog.reap();
  EXPECT_TRUE(released->load());
  // A query that throws counts as finished (the error surfaces through NCCL instead).
  auto released2 = std::make_shared<std::atomic<bool>>(false);
  dog.launch_begin(-1);
  dog.launch_end([]() -> bool { throw std::runtime_error("event failed"); },
                 {watched_tensor(released2)});
  dog.reap();
  EXPECT_TRUE(released2->load());
}

TEST(NcclWatchdog, ALateOperationAbortsOnceAndNamesItsPeer) {
  std::atomic<int> aborts{0};
  Watchdog dog(
      30ms, "[0, 3]", [&] { aborts++; }, 2ms);
  dog.launch_begin(3);
  dog.launch_end([] { return false; }, {});
  ASSERT_TRUE(eventually([&] { return dog.aborted(); }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(aborts.load(), 1);
  try {
    dog.check();
    FAIL() << "check() did not throw after the abort";
  } catch (const transport::PeerError& e) {
    EXPECT_EQ(e.peer(), 3);
    EXPECT_NE(std::string(e.what()).find("waiting on rank 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, 3]"), std::string::npos) << e.what();
  }
}

TEST(NcclWatchdog, AHostBlockingPhaseIsWatchedToo) {
  std::atomic<int> aborts{0};
  Watchdog dog(
      20ms, "[0, 1, 2]", [&] { aborts++; }, 2ms);
  dog.launch_begin(-1, "joining");  // initialisation: no operation yet, nothing ends it
  ASSERT_TRUE(eventually([&] { return dog.aborted(); }));
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(dog.failed_peer(), -1);
  try {
    dog.check();
  } catch (const transport::PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("joining"), std::string::npos) << e.what();
  }
  // A phase that ends in time is not late.
  std::atomic<int> aborts2{0};
  Watchdog quick(
      200ms, "[0]", [&] { aborts2++; }, 2ms);
  quick.launch_begin(-1, "joining");
  quick.launch_cancel();
  std::this_thread::sleep_for(250ms);
  EXPECT_EQ(aborts2.load(), 0);
}

// The destructor stops the watchdog, then destroys the communicator unless it was
// aborted: after stop() returns no abort may happen, whatever the timing.
TEST(NcclWatchdog, NoAbortAfterStopReturns) {
  int aborted_runs = 0;
  for (int i = 0; i < 40; ++i) {
    std::atomic<bool> stopped{false};
    std::atomic<int> aborts{0}, late_aborts{0};
    auto dog = std::make_unique<Watchdog>(
        std::chrono::milliseconds(i % 8), "[0, 1]",
        [&] {
          aborts++;
          if (stopped.load()) late_aborts++;
        },
        1ms);
    dog->launch_begin(1);
    dog->launch_end([] { return false; }, {});
    std::this_thread::sleep_for(std::chrono::microseconds(500 * (i % 10)));
    dog->stop();
    stopped.store(true);
    const bool was_aborted = dog->aborted();
    std::this_thread::sleep_for(2ms);
    EXPECT_EQ(late_aborts.load(), 0);
    EXPECT_EQ(aborts.load(), was_aborted ? 1 : 0);
    aborted_runs += was_aborted;
    dog.reset();
  }
  SUCCEED() << aborted_runs << " of 40 runs aborted before stop()";
}

TEST(NcclRendezvous, EveryInitialisationGetsAKeyOfItsOwn) {
  test::MemoryStore store;
  // Three ranks, two communicators under one key, one after the other (NCCL's init
  // completes only once all have arrived, so the second's arrivals come after).
  std::vector<std::string> first, second;
  for (int r = 0; r < 3; ++r)
    first.push_back(transport::detail::nccl_init_key(store, "baton/nccl/world", 3));
  for (int r = 0; r < 3; ++r)
    second.push_back(transport::detail::nccl_init_key(store, "baton/nccl/world", 3));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(first[size_t(r)], "baton/nccl/world/0");
    EXPECT_EQ(second[size_t(r)], "baton/nccl/world/1");
  }
  // Ranks arriving in any order within one initialisation agree, from threads.
  std::vector<std::string> keys(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&, r] { keys[size_t(r)] = transport::detail::nccl_init_key(store, "tp", 4); });
  for (auto& t : ts) t.join();
  for (auto& k : keys) EXPECT_EQ(k, "tp/0");
  EXPECT_THROW(transport::detail::nccl_init_key(store, "x", 0), std::logic_error);
}

TEST(NcclRendezvous, NamesTheRanksThatNeverJoined) {
  test::MemoryStore store;
  transport::detail::mark_joined(store, "k/0", 0);
  transport::detail::mark_joined(store, "k/0", 2);
  const auto missing = transport::detail::missing_ranks(store, "k/0", 4);
  EXPECT_EQ(missing, (std::vector<int>{1, 3}));
  EXPECT_EQ(transport::detail::describe_missing(missing, {4, 5, 6, 7}),
            "ranks 1, 3 (global 5, 7) never joined");
  EXPECT_EQ(transport::detail::describe_missing({2}, {0, 1, 2}), "rank 2 (global 2) never joined");
  transport::detail::mark_joined(store, "k/0", 1);
  transport::detail::mark_joined(store, "k/0", 3);
  EXPECT_TRUE(transport::detail::missing_ranks(store, "k/0", 4).empty());
  EXPECT_NE(transport::detail::describe_missing({}, {0, 1}).find("every rank"), std::string::npos);
  // Another initialisation's marks do not count.
  EXPECT_EQ(transport::detail::missing_ranks(store, "k/1", 2), (std::vector<int>{0, 1}));
}
