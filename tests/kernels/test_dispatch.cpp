// The dispatch layer: bad arguments are rejected with messages that name the op and the
// argument, CUDA tensors without the CUDA backend are a RuntimeError, threads settable.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kernels/ops.h"
#include "memory/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

TEST(Dispatch, RejectsBadArgumentsWithAMessage) {
  Tensor x = Tensor::zeros({4, 3}), y = Tensor::zeros({4, 3});
  try {
    Tensor wrong = Tensor::zeros({4, 2});
    gelu_forward(x, wrong);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gelu_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 3]"), std::string::npos) << e.what();
  }
  Tensor ints = Tensor::zeros({4, 3}, DType::i32);
  EXPECT_THROW(gelu_forward(ints, y), std::invalid_argument);
  Tensor undefined;
  EXPECT_THROW(relu_forward(undefined, y), std::invalid_argument);
  Tensor strided = Tensor::zeros({3, 4}).transpose(0, 1);
  EXPECT_THROW(relu_forward(strided, y), std::invalid_argument);
  Tensor f64 = Tensor::zeros({4, 3}, DType::f64);
  EXPECT_THROW(add(x, f64, y), std::invalid_argument);
  EXPECT_THROW(set_num_threads(0), std::invalid_argument);
}

TEST(Dispatch, CudaTensorsWithoutTheCudaBackendAreARuntimeError) {
  if (built_with_cuda()) GTEST_SKIP() << "this build has the CUDA kernels";
  static float fake[12];
  Tensor x = Tensor::from_blob(fake, {4, 3}, DType::f32, memory::Device::cuda(0));
  Tensor y = Tensor::from_blob(fake, {4, 3}, DType::f32, memory::Device::cuda(0));
  try {
    gelu_forward(x, y);
    FAIL() << "no exception";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  Tensor cpu = Tensor::zeros({4, 3});
  EXPECT_THROW(add(x, cpu, y), std::invalid_argument);  // mixed devices
}

TEST(Dispatch, ThreadCount) {
  const int before = num_threads();
  EXPECT_GE(before, 1);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(before);
  EXPECT_EQ(num_threads(), before);
}

// cuBLAS and cuBLASLt are opened on the first GPU product, not linked: a process that
// computes on the CPU maps neither (cuBLASLt's initializers had cost every CPU rank, the
// launcher and the Python module 150 MB and 65 ms).
TEST(Dispatch, CpuWorkLoadsNoCudaLibrary) {
  if (!built_with_cuda()) GTEST_SKIP() << "the CUDA backend is not built";
  Tensor a = Tensor::full({8, 8}, 0.5), b = Tensor::full({8, 8}, 2.0), c = Tensor::empty({8, 8});
  matmul(a, false, b, false, c, 1.0, 0.0);
  EXPECT_EQ(c.span<float>()[0], 8.0f);
  // Nor cuDNN or a shared CUDA runtime, whose sonames another library's copies (PyTorch's)
  // would then resolve to in the same process.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    for (const char* lib : {"libcublas", "libcudnn", "libcudart"})
      EXPECT_EQ(line.find(lib), std::string::npos) << "a CPU process mapped " << line;
}

}  // namespace
}  // namespace baton::kernels::test
