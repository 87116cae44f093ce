// InputStager's ordering on CPU: a simulated device whose two streams (copy and compute)
// run their queued operations in random interleavings, honouring only the events. A
// copy reads the host buffer when it runs and the consumer reads the device buffer when
// it runs, so a missing wait shows up as a micro-batch seen with another's data. The
// same simulation with stream waits ignored must catch that (the test can fail).
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <random>

#include "memory/cuda_device.h"
#include "memory/input_staging.h"

using namespace baton::memory;

namespace {

class SimDevice final : public StagingBackend {
 public:
  explicit SimDevice(uint64_t seed, bool ignore_waits = false, bool reused_blocks = false)
      : rng_(seed), ignore_waits_(ignore_waits), reused_blocks_(reused_blocks) {}

  Stream copy_stream() override { return &copy_; }
  Stream compute_stream() override { return &compute_; }
  Tensor host_buffer(const Shape& s, DType d) override { return Tensor::zeros(s, d); }
  // With reused_blocks, each device buffer comes as the caching allocator hands out a block
  // freed on the compute stream: its previous owner's kernel, still queued there, writes it.
  Tensor device_buffer(const Shape& s, DType d) override {
    Tensor t = Tensor::zeros(s, d);
    if (reused_blocks_)
      compute_.push_back([t]() mutable {
        std::memset(t.raw_data(), 0xff, t.nbytes());
        return true;
      });
    return t;
  }
  Event make_event() override { return new Ev(); }
  void destroy_event(Event e) override { delete static_cast<Ev*>(e); }
  void record(Event e, Stream s) override {
    auto* ev = static_cast<Ev*>(e);
    const int64_t gen = ++ev->recorded;
    q(s).push_back([ev, gen] {
      ev->done = gen;
      return true;
    });
  }
  void stream_wait(Stream s, Event e) override {
    if (ignore_waits_) return;
    auto* ev = static_cast<Ev*>(e);
    const int64_t target = ev->recorded;
    q(s).push_back([ev, target] { return ev->done >= target; });
  }
  void host_wait(Event e) override {
    auto* ev = static_cast<Ev*>(e);
    const int64_t target = ev->recorded;
    while (ev->done < target)
      if (!step())
        throw std::runtime_error("simulation: the host waits on an event no stream will reach");
  }
  void copy(Tensor& dst, const Tensor& src, Stream s) override {
    q(s).push_back([dst, src]() mutable {
      std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
      return true;
    });
  }
  // A kernel on the compute stream that reads `t` when it runs.
  void consume(const Tensor& t, std::vector<int32_t>& seen) {
    compute_.push_back([t, &seen] {
      seen.push_back(t.data<int32_t>()[0]);
      return true;
    });
  }
  // Runs one runnable head operation of a random stream; false if none can run.
  bool step() {
    std::deque<Op>* order[2] = {&copy_, &compute_};
    if (rng_() & 1) std::swap(order[0], order[1]);
    for (auto* s : order)
      if (!s->empty() && s->front()()) {
        s->pop_front();
        return true;
      }
    return false;
  }
  void run_some() {
    for (int n = int(rng_() % 4); n > 0 && step(); --n) {
    }
  }
  void drain() {
    while (step()) {
    }
  }
  bool idle() const { return copy_.empty() && compute_.empty(); }

 private:
  using Op = std::function<bool()>;
  struct Ev {
    int64_t recorded = 0, done = 0;
  };
  std::deque<Op>& q(Stream s) { return *static_cast<std::deque<Op>*>(s); }
  std::deque<Op> copy_, compute_;
  std::mt19937_64 rng_;
  bool ignore_waits_;
  bool reused_blocks_;
};

// Stages micro-batches 0..n-1 (each a [4] i32 filled with its index) depth - 1 ahead of
// the one computing, as the engine does; returns what the consumer saw.
std::vector<int32_t> run(SimDevice* sim, int depth, int n) {
  std::vector<int32_t> seen;
  {
    InputStager st(std::unique_ptr<StagingBackend>(sim), {{{4}, DType::i32}}, depth);
    auto fill = [](int64_t i) {
      return [i](std::vector<Tensor>& host) {
        for (int32_t& v : host[0].span<int32_t>()) v = int32_t(i);
      };
    };
    int64_t staged = 0;
    for (int64_t i = 0; i < n; ++i) {
      while (staged < n && staged < i + depth) {
        st.stage(staged, fill(staged));
        staged++;
        sim->run_some();
      }
      std::vector<Tensor> dev = st.acquire(i);
      sim->consume(dev[0], seen);
      sim->run_some();
      st.release(i);
      sim->run_some();
    }
    sim->drain();
  }
  return seen;
}

}  // namespace

TEST(InputStaging, EveryMicroBatchSeesItsOwnDataInAnyInterleaving) {
  for (int depth : {1, 2, 3}) {
    for (uint64_t seed = 1; seed <= 200; ++seed) {
      auto* sim = new SimDevice(seed);
      const std::vector<int32_t> seen = run(sim, depth, 12);
      std::vector<int32_t> want(12);
      for (int i = 0; i < 12; ++i) want[size_t(i)] = i;
      ASSERT_EQ(seen, want) << "depth " << depth << ", seed " << seed;
    }
  }
}

// A slot's first copy waits for the compute stream's work queued before the stager took
// its buffers (it had waited only from the slot's first release on: a block whose previous
// owner's kernel was still queued could be written by it after the copy).
TEST(InputStaging, TheFirstCopyIntoABufferWaitsForItsPreviousOwner) {
  for (int depth : {1, 2, 3}) {
    for (uint64_t seed = 1; seed <= 200; ++seed) {
      auto* sim = new SimDevice(seed, /*ignore_waits=*/false, /*reused_blocks=*/true);
      const std::vector<int32_t> seen = run(sim, depth, 6);
      std::vector<int32_t> want(6);
      for (int i = 0; i < 6; ++i) want[size_t(i)] = i;
      ASSERT_EQ(seen, want) << "depth " << depth << ", seed " << seed;
    }
  }
}

TEST(InputStaging, WithoutTheStreamWaitsTheSimulationSeesRaces) {
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::vector<int32_t> want(12);
    for (int i = 0; i < 12; ++i) want[size_t(i)] = i;
    if (run(new SimDevice(seed, /*ignore_waits=*/true), 2, 12) != want) wrong++;
  }
  EXPECT_GT(wrong, 0) << "the simulation cannot tell a missing event from a correct run";
}

TEST(InputStaging, RefusesToOverwriteAMicroBatchNotYetReleased) {
  auto* sim = new SimDevice(7);
  InputStager st(std::unique_ptr<StagingBackend>(sim), {{{2}, DType::i32}, {{2}, DType::f32}}, 2);
  auto nothing = [](std::vector<Tensor>& host) { EXPECT_EQ(host.size(), 2u); };
  st.stage(0, nothing);
  st.stage(1, nothing);
  EXPECT_THROW(st.stage(2, nothing), std::logic_error);  // 0 is still in use
  EXPECT_THROW(st.stage(5, nothing), std::logic_error);  // out of order
  EXPECT_THROW(st.release(0), std::logic_error);         // not acquired
  EXPECT_EQ(st.acquire(0).size(), 2u);
  EXPECT_THROW(st.acquire(1 + 2), std::logic_error);
  st.release(0);
  EXPECT_NO_THROW(st.stage(2, nothing));
  EXPECT_EQ(st.staged(), 3);
  EXPECT_EQ(st.released(), 1);
  sim->drain();
  EXPECT_THROW(InputStager(std::make_unique<SimDevice>(1), {}, 0), std::logic_error);
}

// The real thing: pinned buffers, the copy stream, CUDA events. Every micro-batch read
// on the compute stream (Tensor::to runs there) holds its own data.
TEST(InputStaging, OnTheGpuEveryMicroBatchArrivesInOrder) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const int depth = 3, n = 10;
  InputStager st(cuda_staging_backend(0), {{{1 << 16}, DType::i32}}, depth);
  int64_t staged = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (; staged < n && staged < i + depth; ++staged)
      st.stage(staged, [staged](std::vector<Tensor>& host) {
        for (int32_t& v : host[0].span<int32_t>()) v = int32_t(staged * 7 + 1);
      });
    Tensor back = st.acquire(i)[0].to(Device::cpu());
    st.release(i);
    const auto v = back.to_vector<int32_t>();
    EXPECT_EQ(v.front(), int32_t(i * 7 + 1)) << "micro-batch " << i;
    EXPECT_EQ(v.back(), int32_t(i * 7 + 1)) << "micro-batch " << i;
  }
}
