// Model inputs staged to the device ahead of use (engine/detail/staged_inputs.h), wired
// into the executor's loader: here through a CPU stand-in for the GPU's pinned buffers
// and copy stream (the GPU's own backend runs in tools/gpu-check.sh; the stager's event
// ordering is tested against simulated streams in tests/cuda/test_input_staging.cpp).
// A staged plan must train exactly as an unstaged one, every micro-batch's inputs going
// through the stager once, also where one rank reads a micro-batch's tokens and, much
// later, its targets (a V schedule's first and last stage).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "engine/detail/staged_inputs.h"
#include "engine_harness.h"

namespace baton::engine_testing {
namespace {

using memory::DType;
using memory::Tensor;

// Host buffers standing in for pinned and device memory; copies run at once, so every
// event has completed when it is waited for. Counts the copies it was asked for.
class HostStaging final : public memory::StagingBackend {
 public:
  explicit HostStaging(std::atomic<int64_t>* copies) : copies_(copies) {}
  Stream copy_stream() override { return &copy_; }
  Stream compute_stream() override { return &compute_; }
  Tensor host_buffer(const memory::Shape& s, DType d) override { return Tensor::zeros(s, d); }
  Tensor device_buffer(const memory::Shape& s, DType d) override { return Tensor::zeros(s, d); }
  Event make_event() override { return new int(0); }
  void destroy_event(Event e) override { delete static_cast<int*>(e); }
  void record(Event, Stream) override {}
  void stream_wait(Stream, Event) override {}
  void host_wait(Event) override {}
  void copy(Tensor& dst, const Tensor& src, Stream) override {
    dst.copy_from(src);
    ++*copies_;
  }

 private:
  std::atomic<int64_t>* copies_;
  int copy_ = 0, compute_ = 0;
};

engine::detail::StagedInputs::Backend host_staging(std::atomic<int64_t>* copies) {
  return [copies] { return std::make_unique<HostStaging>(copies); };
}

stages::TensorMap batch(int32_t first, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ids[size_t(i)] = first + int32_t(i);
    tg[size_t(i)] = -first - int32_t(i);
  }
  return {{"targets", Tensor::from_vector(tg, {n})}, {"tokens", Tensor::from_vector(ids, {n})}};
}

TEST(StagedInputs, TakenTensorsAreTheirOwnAndHoldTheStagedValues) {
  std::atomic<int64_t> copies{0};
  engine::detail::StagedInputs s(host_staging(&copies), 2);
  EXPECT_EQ(s.stage(batch(10, 4)), 0);
  EXPECT_EQ(s.stage(batch(20, 4)), 1);
  const stages::TensorMap a = s.take(0);
  EXPECT_EQ(s.stage(batch(30, 4)), 2);  // into micro-batch 0's slot, taken already
  const stages::TensorMap b = s.take(1), c = s.take(2);
  EXPECT_EQ(copies.load(), 6);  // two fields, three micro-batches
  // Micro-batch 0's tensors outlive its slot's reuse: copies of their own.
  EXPECT_EQ(a.at("tokens").to_vector<int32_t>(), (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(a.at("targets").to_vector<int32_t>(), (std::vector<int32_t>{-10, -11, -12, -13}));
  EXPECT_EQ(b.at("tokens").to_vector<int32_t>()[0], 20);
  EXPECT_EQ(c.at("tokens").to_vector<int32_t>()[3], 33);
  EXPECT_NE(a.at("tokens").raw_data(), c.at("tokens").raw_data());
  // Another shape (or another field) is not staged: the caller copies it itself.
  EXPECT_EQ(s.stage(batch(40, 3)), -1);
  EXPECT_EQ(s.stage({{"tokens", batch(50, 4).at("tokens")}}), -1);
  EXPECT_THROW(s.take(-1), std::logic_error);
  EXPECT_EQ(s.staged(), 3);
}

// Three steps of a plan with and without staging: the same losses and norms, bit for
// bit, and each of a micro-batch's two inputs staged once, by the rank that reads it.
void expect_staged_like_unstaged(const PlanSpec& p) {
  Workspace ws("staging");
  auto plan = resolve(p, ws);
  RunSettings s;
  s.steps = 3;
  engine::PlanTrainOptions o = train_options(ws, s);
  const std::vector<engine::StepRecord> plain = run_threads(plan, o);
  std::atomic<int64_t> copies{0};
  o.input_staging = host_staging(&copies);
  const std::vector<engine::StepRecord> staged = run_threads(plan, o);
  expect_steps_match(staged, plain, true);
  EXPECT_EQ(copies.load(), 2 * s.steps * p.micro_batches);
}

TEST(StagedInputs, OneFOneBPlanTrainsAsUnstaged) {
  PlanSpec p;
  p.model = tiny_gpt_json(2);
  p.tp = {1, 1};
  p.schedule = "1f1b";
  expect_staged_like_unstaged(p);  // rank 0 stages the tokens, rank 1 the targets
}

TEST(StagedInputs, VScheduleReadsTokensAndTargetsOnOneRank) {
  PlanSpec p;
  p.model = tiny_gpt_json(4);
  p.tp = {1, 1};
  p.schedule = "zb-v";
  expect_staged_like_unstaged(p);  // rank 0 holds the first and the last stage: both
}

}  // namespace
}  // namespace baton::engine_testing
