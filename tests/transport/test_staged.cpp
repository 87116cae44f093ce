// The staged communicator (transport/staged.h): UCX or the local transport carrying CUDA
// tensors through host buffers. Every operation the engine uses, on 3 ranks, gives what
// the inner communicator gives on host tensors: with host tensors (they pass through)
// everywhere, and with CUDA tensors where a GPU is present (skipped otherwise).
#include <gtest/gtest.h>

#include <vector>

#include "memory/cuda_device.h"
#include "memory/tensor.h"
#include "tests/transport/world_harness.h"
#include "transport/staged.h"

namespace baton::transport::testing {
namespace {

using memory::Device;
using memory::DType;

Tensor values(int rank, int64_t n, uint32_t seed, Device dev) {
  Tensor t = Tensor::empty({n});
  auto s = t.span<float>();
  for (int64_t i = 0; i < n; ++i) s[size_t(i)] = float(test_value(rank, i, seed));
  return t.to(dev);
}

std::vector<float> host(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<float>();  // waits for the device's stream
}

// Runs each operation once on tensors on `dev` and returns every result, in order.
std::vector<std::vector<float>> exercise(Communicator& c, Device dev) {
  const int r = c.rank(), n = c.size();
  std::vector<std::vector<float>> out;
  // A ring of sends and receives.
  Tensor send = values(r, 1000, 1, dev), recv = Tensor::zeros({1000}, DType::f32, dev);
  auto ws = c.isend(send, (r + 1) % n, 7);
  auto wr = c.irecv(recv, (r + n - 1) % n, 7);
  ws->wait();
  wr->wait();
  out.push_back(host(recv));
  Tensor b = values(r, 300, 2, dev);
  c.broadcast(b, 1)->wait();
  out.push_back(host(b));
  Tensor a = values(r, 5000, 3, dev);
  c.all_reduce(a, ReduceOp::sum)->wait();
  out.push_back(host(a));
  // In place, uneven parts: this rank's part is a view of the output.
  const std::vector<int64_t> counts{4, 7, 2};
  int64_t offset = 0;
  for (int q = 0; q < r; ++q) offset += counts[size_t(q)];
  Tensor gathered = Tensor::zeros({13}, DType::f32, dev);
  Tensor mine = gathered.narrow(0, offset, counts[size_t(r)]);
  mine.copy_from(values(r, counts[size_t(r)], 4, dev));
  c.all_gather(mine, gathered, counts)->wait();
  out.push_back(host(gathered));
  Tensor whole = values(r, 13, 5, dev), part = Tensor::zeros({counts[size_t(r)]}, DType::f32, dev);
  c.reduce_scatter(whole, part, ReduceOp::sum, counts)->wait();
  out.push_back(host(part));
  Tensor from_root = r == 2 ? values(r, 9, 6, dev) : Tensor();
  Tensor piece = Tensor::zeros({3}, DType::f32, dev);
  c.scatter(from_root, piece, 2)->wait();
  out.push_back(host(piece));
  Tensor at_root = r == 0 ? Tensor::zeros({9}, DType::f32, dev) : Tensor();
  c.gather(values(r, 3, 7, dev), at_root, 0)->wait();
  if (r == 0) out.push_back(host(at_root));
  // A split keeps the staging.
  auto pair = c.split(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2});
  Tensor s = values(r, 50, 8, dev);
  pair->all_reduce(s, ReduceOp::max)->wait();
  out.push_back(host(s));
  c.barrier()->wait();
  return out;
}

void expect_staged_equals_direct(Device dev) {
  for (Backend b : tested_backends()) {
    SCOPED_TRACE(backend_name(b));
    std::vector<std::vector<std::vector<float>>> direct(3), staged(3);
    run_world(b, 3,
              [&](Communicator& c) { direct[size_t(c.rank())] = exercise(c, Device::cpu()); });
    run_world(b, 3, [&](Communicator& c) {
      CommPtr inner(&c, [](Communicator*) {});  // the harness owns it
      CommPtr s = make_staged(inner);
      EXPECT_EQ(s->size(), 3);
      EXPECT_EQ(s->backend(), c.backend());
      staged[size_t(c.rank())] = exercise(*s, dev);
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(staged[size_t(r)].size(), direct[size_t(r)].size()) << "rank " << r;
      for (size_t k = 0; k < direct[size_t(r)].size(); ++k)
        EXPECT_EQ(staged[size_t(r)][k], direct[size_t(r)][k]) << "rank " << r << ", result " << k;
    }
  }
}

TEST(Staged, HostTensorsPassThrough) {
  expect_staged_equals_direct(Device::cpu());
}

TEST(Staged, CudaTensorsThroughAHostTransport) {
  if (memory::cuda::device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << memory::cuda::unavailable_reason();
  expect_staged_equals_direct(Device::cuda(0));
}

}  // namespace
}  // namespace baton::transport::testing
