// 2-D convolutions on cuDNN's graph API: one operation (forward, data gradient or filter
// gradient) per graph, NCHW tensors as they are (cuDNN picks its internal layout), f32
// accumulation; grouped convolutions follow from x's channels over w's. One plan per
// (device, pass, shapes, options, dtype, beta), built on first use per thread and kept.
#include "kernels/cuda/cudnn_graph.cuh"
#include "kernels/cuda/vision_cuda.h"

#ifdef BATON_HAVE_CUDNN

#include <map>
#include <tuple>

namespace baton::kernels::cuda {

namespace {

using namespace cudnn;

enum ConvUid : int64_t { kX = 1, kW, kY };

cudnnDataType_t conv_type(DType t) {
  return t == DType::f32    ? CUDNN_DATA_FLOAT
         : t == DType::bf16 ? CUDNN_DATA_BFLOAT16
                            : CUDNN_DATA_HALF;
}

std::array<int64_t, 4> nchw_strides(const Tensor& t) {
  return {t.size(1) * t.size(2) * t.size(3), t.size(2) * t.size(3), t.size(3), 1};
}
std::array<int64_t, 4> dims_of(const Tensor& t) {
  return {t.size(0), t.size(1), t.size(2), t.size(3)};
}

struct ConvKey {
  int device, pass, dtype;
  std::array<int64_t, 4> x, w, y;
  std::array<int64_t, 8> opts;
  float beta;
  auto operator<=>(const ConvKey&) const = default;
};

thread_local std::map<ConvKey, std::unique_ptr<Graph>> t_conv_graphs;

Builder::ConvKind kind_of(ConvPass p) {
  return p == ConvPass::forward ? Builder::ConvKind::forward
         : p == ConvPass::data  ? Builder::ConvKind::data
                                : Builder::ConvKind::filter;
}

}  // namespace

bool cudnn_conv_built() {
  return true;
}

void cudnn_convolution(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                       const Conv2dOptions& o, float beta) {
  const char* op = pass == ConvPass::forward ? "conv2d_forward"
                   : pass == ConvPass::data  ? "conv2d_backward_input"
                                             : "conv2d_backward_weight";
  if (x.numel() == 0 || w.numel() == 0 || y.numel() == 0) return;
  const Launch l(pass == ConvPass::forward ? y : pass == ConvPass::data ? x : w);
  const ConvKey key{l.device,
                    int(pass),
                    int(x.dtype()),
                    dims_of(x),
                    dims_of(w),
                    dims_of(y),
                    {o.stride_h, o.stride_w, o.pad_top, o.pad_left, o.pad_bottom, o.pad_right,
                     o.dilation_h, o.dilation_w},
                    beta};
  auto it = t_conv_graphs.find(key);
  if (it == t_conv_graphs.end()) {
    auto graph = std::make_unique<Graph>();
    Builder b(*graph);
    const cudnnDataType_t io = conv_type(x.dtype());
    const Desc& xd = b.tensor(kX, io, dims_of(x), nchw_strides(x));
    const Desc& wd = b.tensor(kW, io, dims_of(w), nchw_strides(w));
    const Desc& yd = b.tensor(kY, io, dims_of(y), nchw_strides(y));
    b.conv(kind_of(pass), xd, wd, yd, {o.stride_h, o.stride_w}, {o.pad_top, o.pad_left},
           {o.pad_bottom, o.pad_right}, {o.dilation_h, o.dilation_w}, beta);
    graph->ok = b.plan(handle(l));
    it = t_conv_graphs.emplace(key, std::move(graph)).first;
  }
  const Graph& graph = *it->second;
  require(graph.ok, op, "cuDNN has no engine for " + x.str() + " * " + w.str() + " -> " + y.str());
  execute(graph, {kX, kW, kY}, {x.raw_data(), w.raw_data(), y.raw_data()}, l);
}

}  // namespace baton::kernels::cuda

#else  // built without cuDNN

namespace baton::kernels::cuda {

bool cudnn_conv_built() {
  return false;
}
void cudnn_convolution(ConvPass pass, const Tensor&, const Tensor&, const Tensor&,
                       const Conv2dOptions&, float) {
  fail(pass == ConvPass::forward ? "conv2d_forward"
       : pass == ConvPass::data  ? "conv2d_backward_input"
                                 : "conv2d_backward_weight",
       "baton was built without cuDNN, which runs its CUDA convolutions (set CUDNN_HOME)");
}

}  // namespace baton::kernels::cuda

#endif
