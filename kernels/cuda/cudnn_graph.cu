// cuDNN's graph API, the shared pieces that are not templates (cudnn_graph.cuh).
#include "kernels/cuda/cudnn_graph.cuh"

#ifdef BATON_HAVE_CUDNN

#include "kernels/cuda/dynamic_library.h"

namespace baton::kernels::cuda::cudnn {

namespace {
thread_local std::array<cudnnHandle_t, 64> t_handles{};
}  // namespace

const Api& api() {
  static const Api loaded = [] {
    const std::string version = "cuDNN " BATON_CUDA_STR(CUDNN_MAJOR);
    const char* name = "libcudnn.so." BATON_CUDA_STR(CUDNN_MAJOR);
    void* lib = open_cuda_library(name, version +
                                            ", which the GPU's convolutions and cudnn "
                                            "attention need");
    Api a{};
    find_cuda_symbol(lib, name, "cudnnCreate", a.create, version);
    find_cuda_symbol(lib, name, "cudnnSetStream", a.set_stream, version);
    find_cuda_symbol(lib, name, "cudnnGetErrorString", a.error_string, version);
    find_cuda_symbol(lib, name, "cudnnGetLastErrorString", a.last_error_string, version);
    find_cuda_symbol(lib, name, "cudnnBackendCreateDescriptor", a.create_descriptor, version);
    find_cuda_symbol(lib, name, "cudnnBackendDestroyDescriptor", a.destroy_descriptor, version);
    find_cuda_symbol(lib, name, "cudnnBackendSetAttribute", a.set_attribute, version);
    find_cuda_symbol(lib, name, "cudnnBackendGetAttribute", a.get_attribute, version);
    find_cuda_symbol(lib, name, "cudnnBackendFinalize", a.finalize, version);
    find_cuda_symbol(lib, name, "cudnnBackendExecute", a.execute, version);
    return a;
  }();
  return loaded;
}

cudnnHandle_t handle(const Launch& l) {
  cudnnHandle_t& h = t_handles.at(size_t(l.device));
  if (h == nullptr) BATON_CUDNN_CHECK(api().create(&h));
  BATON_CUDNN_CHECK(api().set_stream(h, l.stream));
  return h;
}

void execute(const Graph& g, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             const Launch& l) {
  Tensor ws;
  void* ws_ptr = nullptr;
  if (g.workspace > 0) {
    ws = scratch({(g.workspace + 3) / 4}, DType::i32, l.device);
    ws_ptr = ws.raw_data();
  }
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(),
           int64_t(ptrs.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws_ptr)
      .finalize();
  BATON_CUDNN_CHECK(api().execute(handle(l), g.plan->get(), pack.get()));
}

}  // namespace baton::kernels::cuda::cudnn

#endif
