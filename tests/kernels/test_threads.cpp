// Kernels called from several threads at once, as in-process ranks do (the local
// transport's tests): per-thread scratch and OpenBLAS must cope. A program of its own so
// that the thread-sanitizer preset runs it (one kernel thread: no OpenMP regions, which
// TSan cannot see into).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

TEST(Threads, ConcurrentCallsFromSeveralThreadsAgreeWithSerialOnes) {
  // In-process ranks (the local transport's tests) call kernels from several threads at
  // once: per-thread scratch and OpenBLAS must cope.
  std::mt19937_64 rng(test_seed(91));
  const int before = num_threads();
  set_num_threads(1);
  const DType f = DType::f32;
  const Tensor qkv = randn({2, 96, 3 * 2 * 32}, rng, 1.0, f), g = randn({2, 96, 64}, rng, 1.0, f);
  const Tensor a = randn({64, 48}, rng, 1.0, f), b = randn({48, 40}, rng, 1.0, f);
  AttentionOptions o;
  o.heads = 2;
  o.dropout = 0.1;
  auto work = [&](std::vector<Tensor>& res) {
    Tensor out = Tensor::empty({2, 96, 64}, f), lse = Tensor::empty({2, 2, 96}, f),
           d = Tensor::empty(qkv.shape(), f), c = Tensor::empty({64, 40}, f);
    for (int i = 0; i < 10; ++i) {
      attention_forward(qkv, o, out, lse);
      attention_backward(qkv, out, lse, g, o, d, false);
      matmul(a, false, b, false, c);
    }
    res = {out, d, c};
  };
  std::vector<Tensor> serial, r1, r2;
  work(serial);
  std::thread t1([&] { work(r1); }), t2([&] { work(r2); });
  t1.join();
  t2.join();
  set_num_threads(before);
  for (const auto* r : {&r1, &r2})
    for (size_t i = 0; i < serial.size(); ++i)
      EXPECT_EQ(std::memcmp((*r)[i].raw_data(), serial[i].raw_data(), serial[i].nbytes()), 0) << i;
}

}  // namespace
}  // namespace baton::kernels::test
