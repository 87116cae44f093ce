// The scratch a collective takes from the allocator (transport/collective_memory.h, what
// partitioner/'s memory model counts) against the allocator's measured peak: two local
// ranks (threads sharing one allocator, so the peak holds both ranks' scratch) run one
// collective on buffers allocated beforehand, for each algorithm: a message small enough
// for the thread's own blocks, recursive doubling, the ring's window, the ring all-gather, and the
// reduce-scatter in place and not.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memory/allocator.h"
#include "memory/tensor.h"
#include "tests/transport/world_harness.h"
#include "transport/collective_memory.h"
#include "transport/detail/group_view.h"
#include "transport/local.h"

namespace baton::transport::testing {
namespace {

using memory::Tensor;

int64_t measured_extra(const std::function<void(Communicator&, Tensor&, Tensor&)>& run,
                       int64_t count, int64_t out_count) {
  auto world = make_local_world(2, test_options());
  std::vector<Tensor> in, out;
  for (int r = 0; r < 2; ++r) {
    in.push_back(Tensor::full({count}, 1.0, memory::DType::f32));
    out.push_back(Tensor::full({out_count}, 0.0, memory::DType::f32));
  }
  auto& alloc = memory::allocator_for(memory::Device::cpu());
  const size_t before = alloc.stats().in_use;
  alloc.reset_peak();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] { run(*world[size_t(r)], in[size_t(r)], out[size_t(r)]); });
  for (auto& t : threads) t.join();
  return int64_t(alloc.stats().peak - before);
}

TEST(CollectiveScratch, AllReduceMatchesTheAllocatorPeak) {
  auto all_reduce = [](Communicator& c, Tensor& t, Tensor&) {
    c.all_reduce(t, ReduceOp::sum)->wait();
  };
  for (int64_t count : {int64_t(100), int64_t(4000), int64_t(100000), int64_t(1000000)}) {
    SCOPED_TRACE(count);
    const int64_t want =
        2 * int64_t(collective_scratch_bytes(Collective::all_reduce, size_t(count), 4, 2));
    EXPECT_EQ(measured_extra(all_reduce, count, 1), want);
  }
  // The four cases are the four regimes: none, one message, the ring's two slots of one
  // part (50000 floats, under a 512 KiB chunk), the ring's window of two whole chunks.
  EXPECT_EQ(collective_scratch_bytes(Collective::all_reduce, 100, 4, 2), 0u);
  EXPECT_EQ(collective_scratch_bytes(Collective::all_reduce, 4000, 4, 2), 16000u);
  EXPECT_EQ(collective_scratch_bytes(Collective::all_reduce, 100000, 4, 2), 400000u);
  EXPECT_EQ(collective_scratch_bytes(Collective::all_reduce, 1000000, 4, 2), 1048576u);
  EXPECT_EQ(collective_scratch_bytes(Collective::all_reduce, 100000, 4, 1), 0u);
}

TEST(CollectiveScratch, AllGatherMatchesTheAllocatorPeak) {
  auto all_gather = [](Communicator& c, Tensor& in, Tensor& out) { c.all_gather(in, out)->wait(); };
  for (int64_t count : {int64_t(1000), int64_t(50000)}) {
    SCOPED_TRACE(count);
    const int64_t want =
        2 * int64_t(collective_scratch_bytes(Collective::all_gather, size_t(2 * count), 4, 2));
    EXPECT_EQ(measured_extra(all_gather, count, 2 * count), want);
  }
  // Both the direct exchange and the ring receive into the output.
  EXPECT_EQ(collective_scratch_bytes(Collective::all_gather, 100000, 4, 2), 0u);
}

// Into a separate output the ring keeps its partial sums in accumulator slots beside its
// receive slots; in place (the output the rank's own part of the input, as the gradient
// reducer runs it) in the input, so only the receive slots.
TEST(CollectiveScratch, ReduceScatterMatchesTheAllocatorPeak) {
  auto apart = [](Communicator& c, Tensor& in, Tensor& out) {
    c.reduce_scatter(in, out, ReduceOp::sum)->wait();
  };
  auto in_place = [](Communicator& c, Tensor& in, Tensor&) {
    const int64_t half = in.numel() / 2;
    Tensor own = in.narrow(0, c.rank() * half, half);
    c.reduce_scatter(in, own, ReduceOp::sum)->wait();
  };
  for (int64_t count : {int64_t(4000), int64_t(200000)}) {
    SCOPED_TRACE(count);
    for (bool place : {false, true}) {
      const int64_t want =
          2 * int64_t(collective_scratch_bytes(Collective::reduce_scatter, size_t(count), 4, 2,
                                               size_t(count / 2), place));
      EXPECT_EQ(measured_extra(place ? in_place : apart, count, count / 2), want) << place;
    }
  }
  // The ring in place holds half the scratch of the ring into a separate output.
  EXPECT_EQ(2 * collective_scratch_bytes(Collective::reduce_scatter, 200000, 4, 2, 100000, true),
            collective_scratch_bytes(Collective::reduce_scatter, 200000, 4, 2, 100000, false));
}

// A Scratch destroyed by an exception (a failed collective, whose receives may still be
// posted into it) is not given back: the next one of its size gets another block, where a
// late message from a live peer had landed in a new tensor or on the stack. One destroyed
// normally is reused.
TEST(CollectiveScratch, AFailedCollectivesScratchIsNotReused) {
  for (size_t bytes : {size_t(64), size_t(1) << 20}) {
    SCOPED_TRACE(bytes);
    char* failed = nullptr;
    try {
      detail::Scratch s(bytes);
      failed = s.data();
      throw std::runtime_error("a peer failed");
    } catch (const std::runtime_error&) {
    }
    char* reused = nullptr;
    {
      detail::Scratch s(bytes);
      EXPECT_NE(s.data(), failed);
      reused = s.data();
    }
    detail::Scratch again(bytes);
    EXPECT_EQ(again.data(), reused);
  }
}

// A failed collective's tensors are kept for the process's life: a live peer's late
// message may still land in them, and dropping the work had given them back to the pool
// (for a new tensor to receive it). Two ranks whose all-gather counts disagree both fail.
TEST(CollectiveScratch, AFailedCollectivesTensorsAreKept) {
  auto world = make_local_world(2, test_options());
  std::vector<std::weak_ptr<memory::Storage>> outs(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const std::vector<int64_t> counts =
          r == 0 ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{5, 3};
      Tensor in = Tensor::full({counts[size_t(r)]}, 1.0, memory::DType::f32);
      Tensor out = Tensor::zeros({8}, memory::DType::f32);
      outs[size_t(r)] = out.storage();
      try {
        world[size_t(r)]->all_gather(in, out, counts)->wait();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  // The executor's thread lets go of a job some moment after its waiter returns: past it,
  // nothing but the keeping can hold the bytes.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[size_t(r)], "") << "rank " << r << " did not fail";
    // The tensor and the work are gone here: only the keeping holds the bytes.
    EXPECT_FALSE(outs[size_t(r)].expired()) << "rank " << r;
  }
}

// Once wait() returns, the collective holds none of its tensors' bytes, whichever thread
// ran it: freeing the tensor frees them at once, so a rank's peak does not depend on when
// the executor's thread lets go of the job.
TEST(CollectiveScratch, FinishedCollectiveKeepsNoBytes) {
  auto world = make_local_world(2, test_options());
  // Above the executor's wake-up size: its background thread runs them.
  const int64_t count = int64_t(2) << 20;
  std::vector<std::weak_ptr<memory::Storage>> bytes(2);
  std::vector<WorkPtr> works(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Tensor t = Tensor::full({count}, 1.0, memory::DType::f32);
      bytes[size_t(r)] = t.storage();
      works[size_t(r)] = world[size_t(r)]->all_reduce(t, ReduceOp::sum);
      works[size_t(r)]->wait();
      EXPECT_EQ(t.data<float>()[count - 1], 2.0f);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(bytes[size_t(r)].expired())
        << "rank " << r << ": the finished work keeps the tensor";
    EXPECT_TRUE(works[size_t(r)]->test());
  }
}

}  // namespace
}  // namespace baton::transport::testing
