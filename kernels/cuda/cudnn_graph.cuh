// cuDNN's graph (backend) API, the pieces its users share (cudnn_attention.cu,
// cudnn_conv.cu): checked calls, descriptors that free themselves, a builder of tensors
// and operations that finalizes the graph into the first execution plan cuDNN's
// heuristics give, the per-thread handle and the execution of a plan. Only built with
// cuDNN (BATON_HAVE_CUDNN).
#pragma once

#ifdef BATON_HAVE_CUDNN

#include <cudnn.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace baton::kernels::cuda::cudnn {

// The cuDNN functions baton calls, from the library of the headers' major version, opened
// on the first cuDNN graph (dynamic_library.h): a process that runs none loads no cuDNN.
struct Api {
  decltype(&cudnnCreate) create;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error_string;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
};
// Opened once per process; a RuntimeError naming the library where it cannot be.
const Api& api();

[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file,
                                           int line) {
  char last[512] = {0};
  api().last_error_string(last, sizeof last);
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                     api().error_string(st) + (last[0] ? std::string(" (") + last + ")" : ""));
}

#define BATON_CUDNN_CHECK(call)                                      \
  do {                                                               \
    cudnnStatus_t baton_cudnn_st_ = (call);                          \
    if (baton_cudnn_st_ != CUDNN_STATUS_SUCCESS)                     \
      throw_cudnn_error(baton_cudnn_st_, #call, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    BATON_CUDNN_CHECK(api().create_descriptor(type, &d_));
  }
  ~Desc() {
    if (d_ != nullptr) (void)api().destroy_descriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values,
            int64_t count = 1) {
    BATON_CUDNN_CHECK(api().set_attribute(d_, name, type, count, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &o);
  }
  Desc& finalize() {
    BATON_CUDNN_CHECK(api().finalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::unique_ptr<Desc>;

struct Graph {
  std::vector<DescPtr> keep;  // every descriptor the plan refers to
  DescPtr plan;
  int64_t workspace = 0;
  bool ok = false;  // false: cuDNN has no engine for it (cached, so not asked again)
};

class Builder {
 public:
  // The uids of virtual tensors; the graph's own tensors take smaller ones.
  static constexpr int64_t kFirstVirtualUid = 1000;
  explicit Builder(Graph& g) : g_(g) {}

  const Desc& tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                     std::array<int64_t, 4> strides, bool is_virtual = false,
                     bool by_value = false) {
    auto d = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4)
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual)
        .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value)
        .finalize();
    return push(std::move(d));
  }
  // A virtual f32 tensor of `dims` (row-major), for the graph's intermediate values.
  const Desc& virt(std::array<int64_t, 4> dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    std::array<int64_t, 4> st{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    return virt(dims, st, type);
  }
  // One with strides of its own (a transposed view's, as a reshape makes).
  const Desc& virt(std::array<int64_t, 4> dims, std::array<int64_t, 4> strides,
                   cudnnDataType_t type) {
    return tensor(kFirstVirtualUid + next_virtual_++, type, dims, strides, true);
  }

  // y = x under y's dims and strides (a transpose of the last two, for attention's
  // backward).
  void reshape(const Desc& x, const Desc& y) {
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)
        .finalize();
    ops_.push_back(&push(std::move(op)));
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    auto m = std::make_unique<Desc>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    m->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp).finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *m)
        .finalize();
    push(std::move(m));
    ops_.push_back(&push(std::move(op)));
  }

  // y = mode(x[, b][, t]); `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y,
                 const Desc* t = nullptr, int64_t axis = -1) {
    auto pw = std::make_unique<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw->finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y).finalize();
    push(std::move(pw));
    ops_.push_back(&push(std::move(op)));
  }

  // pointwise() into a new virtual tensor of `dims` (f32 unless given): the graph's
  // intermediate values.
  const Desc& pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                        std::array<int64_t, 4> dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    const Desc& y = virt(dims, type);
    pointwise(mode, x, b, y);
    return y;
  }

  void reduce(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y) {
    auto r = std::make_unique<Desc>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    r->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp)
        .finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *r)
        .finalize();
    push(std::move(r));
    ops_.push_back(&push(std::move(op)));
  }

  // A 2-D convolution (cross-correlation, as torch's) with f32 accumulation: y = conv(x,
  // w) forward, dx from dy and w (data), dw from dy and x (filter); out = alpha * result +
  // beta * out (beta 1 accumulates). Groups follow from x's channels over w's.
  enum class ConvKind { forward, data, filter };
  void conv(ConvKind kind, const Desc& x, const Desc& w, const Desc& y,
            std::array<int64_t, 2> stride, std::array<int64_t, 2> pre_pad,
            std::array<int64_t, 2> post_pad, std::array<int64_t, 2> dilation, float beta) {
    auto c = std::make_unique<Desc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2;
    c->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp)
        .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
        .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims)
        .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride.data(), 2)
        .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pre_pad.data(), 2)
        .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, post_pad.data(), 2)
        .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation.data(), 2)
        .finalize();
    const float alpha = 1.f;
    auto op = std::make_unique<Desc>(
        kind == ConvKind::forward ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
        : kind == ConvKind::data  ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                  : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
    if (kind == ConvKind::forward) {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, *c)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, &beta);
    } else if (kind == ConvKind::data) {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, *c)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, &beta);
    } else {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, *c)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, &beta);
    }
    op->finalize();
    push(std::move(c));
    ops_.push_back(&push(std::move(op)));
  }

  // The operation graph, cuDNN's heuristics (mode A), and the first engine config that
  // finalizes into a plan. False when none does.
  bool plan(cudnnHandle_t h) {
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Desc* d : ops_) ops.push_back(d->get());
    auto graph = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph
        ->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
              int64_t(ops.size()))
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
    if (api().finalize(graph->get()) != CUDNN_STATUS_SUCCESS) return false;
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    if (api().finalize(heur.get()) != CUDNN_STATUS_SUCCESS) return false;
    constexpr int kMaxConfigs = 8;
    std::vector<DescPtr> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kMaxConfigs; ++i) {
      cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    int64_t found = 0;
    if (api().get_attribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                            CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &found,
                            raw.data()) != CUDNN_STATUS_SUCCESS)
      return false;
    push(std::move(graph));
    for (int64_t i = 0; i < found; ++i) {
      auto p = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      p->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h)
          .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[size_t(i)]);
      if (api().finalize(p->get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t ws = 0, n = 0;
      BATON_CUDNN_CHECK(api().get_attribute(p->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                            CUDNN_TYPE_INT64, 1, &n, &ws));
      g_.workspace = ws;
      g_.plan = std::move(p);
      for (auto& c : cfgs) g_.keep.push_back(std::move(c));
      return true;
    }
    return false;
  }

 private:
  const Desc& push(DescPtr d) {
    g_.keep.push_back(std::move(d));
    return *g_.keep.back();
  }
  Graph& g_;
  std::vector<const Desc*> ops_;
  int64_t next_virtual_ = 0;
};

// The calling thread's handle for the launch's device, on its stream (never destroyed,
// as the cuBLAS handles: at exit the CUDA context may be gone first).
cudnnHandle_t handle(const Launch& l);

// Runs the plan on the tensors of the variant pack (uid, pointer pairs), with a
// workspace from the caching allocator.
void execute(const Graph& g, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             const Launch& l);

}  // namespace baton::kernels::cuda::cudnn

#endif
