#include "kernels/cuda/common.cuh"

namespace baton::kernels::cuda {

void fail(const std::string& op, const std::string& what) {
  throw std::logic_error("kernels::cuda::" + op + ": " + what);
}

void require_cuda(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (!t.device().is_cuda())
    fail(op, std::string(name) + " is " + t.str() + ", not on a CUDA device");
  if (!t.is_contiguous()) fail(op, std::string(name) + " (" + t.str() + ") is not contiguous");
}

bool is_float16ish(DType t) {
  return t == DType::bf16 || t == DType::f16;
}
bool is_cuda_float(DType t) {
  return t == DType::f32 || is_float16ish(t);
}

Launch::Launch(const Tensor& t)
    : guard(t.device().index),
      device(t.device().index),
      stream(static_cast<cudaStream_t>(memory::cuda::current_stream(t.device().index))) {}

Tensor scratch(const memory::Shape& shape, DType dtype, int device) {
  return Tensor::empty(shape, dtype, memory::Device::cuda(device));
}

BlockMap block_map(const memory::Shape& local_shape, const std::vector<int64_t>& global_shape,
                   const std::vector<int64_t>& offsets, const char* op) {
  BlockMap m;
  if (global_shape.empty()) return m;
  const size_t rank = local_shape.size();
  if (global_shape.size() != rank || offsets.size() != rank)
    fail(op, "Block of rank " + std::to_string(global_shape.size()) + " for a tensor of rank " +
                 std::to_string(rank));
  if (rank > size_t(BlockMap::kMaxDims)) fail(op, "Block of more than 8 dimensions");
  m.dims = int(rank);
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    if (offsets[d] < 0 || offsets[d] + local_shape[d] > global_shape[d])
      fail(op, "the block does not fit its global shape in dimension " + std::to_string(d));
    m.local[d] = local_shape[d];
    m.gstride[d] = stride;
    m.base += offsets[d] * stride;
    stride *= global_shape[d];
  }
  return m;
}

}  // namespace baton::kernels::cuda
