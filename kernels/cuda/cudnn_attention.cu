// cuDNN's fused attention forward through its graph (backend) API, for comparison with
// our flash kernels (attention.cu chooses; set_attention_impl(cudnn) forces it). The
// graph is the one cuDNN's fused flash-attention engines match: S = Q K^T, scaled, the
// causal mask (generated row and column indices, row >= col, -inf elsewhere), softmax
// as max / subtract / exp / sum / divide with the statistics M + log(sum) written out
// (the same natural-log log-sum-exp of the scaled scores as our kernels, so either
// backward can follow), then O = P V. Q, K and V are strided views of the packed qkv
// [B, T, 3, H, D] and O of out [B, T, H, D]: no copies. And the fused backward
// (build_backward below). One plan per (device, shape, type, scale) and direction, built
// on first use per thread and kept; the workspace comes from the caching allocator.
// Built when cuDNN's headers and library are found (BATON_HAVE_CUDNN).
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/ops_cuda.h"

#ifdef BATON_HAVE_CUDNN

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/cudnn_graph.cuh"
#include "kernels/cuda/host_log.h"

namespace baton::kernels::cuda {

namespace {

using namespace cudnn;

// Tensor uids of the variant packs.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  // the backward's
  kDO,
  kDQ,
  kDK,
  kDV,
  kOne,
  kSoftmaxSum,
  kDQAccum
};

cudnnDataType_t cudnn_type(DType t) {
  return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// x where the row (query) index >= the column (key) index, -inf elsewhere: generated
// indices, CMP_GE, BINARY_SELECT, the form cuDNN's fused engines match.
const Desc& causal_mask(Builder& b, const Desc& x, const Desc& neg_inf,
                        std::array<int64_t, 4> dims) {
  const Desc& row = b.virt(dims, CUDNN_DATA_INT32);
  b.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, nullptr, 2);
  const Desc& col = b.virt(dims, CUDNN_DATA_INT32);
  b.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, nullptr, 3);
  const Desc& keep = b.virt(dims, CUDNN_DATA_BOOLEAN);
  b.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep);
  const Desc& masked = b.virt(dims);
  b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, masked, &keep);
  return masked;
}

void build_forward(Graph& g, cudnnHandle_t h, const AttnGeometry& geo, DType dt) {
  const int64_t B = geo.B, H = geo.H, T = geo.T, D = geo.D, ld = geo.ld(), ldo = geo.ldo();
  const cudnnDataType_t io = cudnn_type(dt);
  Builder b(g);
  // [B, H, T, D] views of the packed rows; K^T as [B, H, D, T].
  const Desc& q = b.tensor(kQ, io, {B, H, T, D}, {T * ld, D, ld, 1});
  const Desc& kt = b.tensor(kK, io, {B, H, D, T}, {T * ld, D, 1, ld});
  const Desc& v = b.tensor(kV, io, {B, H, T, D}, {T * ld, D, ld, 1});
  const Desc& o = b.tensor(kO, io, {B, H, T, D}, {T * ldo, D, ldo, 1});
  const Desc& stats = b.tensor(kStats, CUDNN_DATA_FLOAT, {B, H, T, 1}, {H * T, T, 1, 1});
  const Desc& scale = b.tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  const Desc& neg_inf =
      b.tensor(kNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);

  const Desc& s = b.virt({B, H, T, T});
  b.matmul(q, kt, s);
  const Desc& scaled = b.pointwise(CUDNN_POINTWISE_MUL, s, &scale, {B, H, T, T});
  const Desc& masked = causal_mask(b, scaled, neg_inf, {B, H, T, T});
  const Desc& m = b.virt({B, H, T, 1});
  b.reduce(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  const Desc& shifted = b.pointwise(CUDNN_POINTWISE_SUB, masked, &m, {B, H, T, T});
  const Desc& e = b.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, {B, H, T, T});
  const Desc& z = b.virt({B, H, T, 1});
  b.reduce(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Desc& logz = b.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, {B, H, T, 1});
  b.pointwise(CUDNN_POINTWISE_ADD, m, &logz, stats);
  const Desc& p = b.virt({B, H, T, T}, io);
  b.pointwise(CUDNN_POINTWISE_DIV, e, &z, p);
  b.matmul(p, v, o);
  g.ok = b.plan(h);
}

// The backward as the graph cuDNN's fused flash-attention backward engines match (the
// one cuDNN's frontend builds for its SDPA backward, here for the causal, dropout-free
// case): softmax_sum = rowsum(dO * O) into a workspace; P recomputed as exp(S * scale -
// stats) under the causal mask; dV = P^T dO; dS = P * (dO V^T - softmax_sum) * scale;
// dK = dS^T Q; dQ = dS K through an f32 accumulator, then cast into dqkv. The transposes
// of P and dS (and K from K^T) are reshape operations. dq, dk, dv are strided views of
// the packed dqkv, as q, k, v of qkv.
void build_backward(Graph& g, cudnnHandle_t h, const AttnGeometry& geo, DType dt) {
  const int64_t B = geo.B, H = geo.H, T = geo.T, D = geo.D, ld = geo.ld(), ldo = geo.ldo();
  const cudnnDataType_t io = cudnn_type(dt), f32 = CUDNN_DATA_FLOAT;
  Builder b(g);
  const std::array<int64_t, 4> qkv_dims{B, H, T, D}, qkv_strides{T * ld, D, ld, 1};
  const std::array<int64_t, 4> t_dims{B, H, D, T}, t_strides{T * ld, D, 1, ld};
  const std::array<int64_t, 4> o_strides{T * ldo, D, ldo, 1};
  const std::array<int64_t, 4> row_dims{B, H, T, 1}, row_strides{H * T, T, 1, 1};
  const std::array<int64_t, 4> tt_dims{B, H, T, T}, tt_transposed{H * T * T, T * T, 1, T};
  const Desc& q = b.tensor(kQ, io, qkv_dims, qkv_strides);
  const Desc& kt = b.tensor(kK, io, t_dims, t_strides);
  const Desc& vt = b.tensor(kV, io, t_dims, t_strides);
  const Desc& o = b.tensor(kO, io, qkv_dims, o_strides);
  const Desc& dO = b.tensor(kDO, io, qkv_dims, o_strides);
  const Desc& stats = b.tensor(kStats, f32, row_dims, row_strides);
  const Desc& dq = b.tensor(kDQ, io, qkv_dims, qkv_strides);
  const Desc& dk = b.tensor(kDK, io, qkv_dims, qkv_strides);
  const Desc& dv = b.tensor(kDV, io, qkv_dims, qkv_strides);
  const std::array<int64_t, 4> one4{1, 1, 1, 1};
  const Desc& scale = b.tensor(kScale, f32, one4, one4, false, true);
  const Desc& neg_inf = b.tensor(kNegInf, f32, one4, one4, false, true);
  const Desc& one = b.tensor(kOne, f32, one4, one4, false, true);
  const Desc& softmax_sum = b.tensor(kSoftmaxSum, f32, row_dims, row_strides);
  const Desc& dq_accum = b.tensor(kDQAccum, f32, qkv_dims, {H * T * D, T * D, D, 1});

  // softmax_sum = rowsum(dO * O)
  const Desc& dOo = b.virt(qkv_dims, {H * T * D, T * D, H * D, 1}, f32);
  b.pointwise(CUDNN_POINTWISE_MUL, dO, &o, dOo);
  const Desc& rows = b.virt(row_dims);
  b.reduce(CUDNN_REDUCE_TENSOR_ADD, dOo, rows);
  b.pointwise(CUDNN_POINTWISE_MUL, rows, &one, softmax_sum);

  // P = exp(S * scale - stats), causal
  const Desc& s = b.virt(tt_dims);
  b.matmul(q, kt, s);
  const Desc& scaled = b.pointwise(CUDNN_POINTWISE_MUL, s, &scale, tt_dims);
  const Desc& shifted = b.pointwise(CUDNN_POINTWISE_SUB, scaled, &stats, tt_dims);
  const Desc& masked = causal_mask(b, shifted, neg_inf, tt_dims);
  const Desc& p = b.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, tt_dims);

  // dV = P^T dO
  const Desc& pt = b.virt(tt_dims, tt_transposed, io);
  b.reshape(p, pt);
  b.matmul(pt, dO, dv);

  // dS = P * (dO V^T - softmax_sum) * scale
  const Desc& dp = b.virt(tt_dims);
  b.matmul(dO, vt, dp);
  const Desc& centred = b.pointwise(CUDNN_POINTWISE_SUB, dp, &softmax_sum, tt_dims);
  const Desc& ds_unscaled = b.pointwise(CUDNN_POINTWISE_MUL, centred, &p, tt_dims);
  const Desc& ds = b.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, &scale, tt_dims);

  // dK = dS^T Q
  const Desc& dst = b.virt(tt_dims, tt_transposed, io);
  b.reshape(ds, dst);
  b.matmul(dst, q, dk);

  // dQ = dS K, accumulated in f32
  const Desc& k = b.virt(qkv_dims, qkv_strides, io);
  b.reshape(kt, k);
  b.matmul(ds, k, dq_accum);
  b.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  g.ok = b.plan(h);
}

struct Key {
  int device;
  int64_t B, T, H, D;
  int dtype;
  float scale;
  auto operator<=>(const Key&) const = default;
};

thread_local std::map<Key, std::unique_ptr<Graph>> t_graphs, t_backward_graphs;

// The graph of a key, built on first use (a graph without an engine is kept too, so
// cuDNN is not asked again). A build that throws (libcudnn cannot be opened, a cuDNN 9
// older than the headers refuses an attribute) is a graph without an engine as well:
// automatic attention then runs the flash kernels instead of failing every call.
template <class Build>
Graph& graph_of(std::map<Key, std::unique_ptr<Graph>>& cache, const Key& key, Build build) {
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto graph = std::make_unique<Graph>();
    try {
      build(*graph);
    } catch (const std::exception& e) {
      graph = std::make_unique<Graph>();  // ok false: no engine
      static std::once_flag warned;
      std::call_once(warned, [&] {
        log_warning(std::string("cuDNN's fused attention is unavailable (") + e.what() +
                    "); attention runs without it");
      });
    }
    it = cache.emplace(key, std::move(graph)).first;
  }
  return *it->second;
}

}  // namespace

bool cudnn_built() {
  return true;
}

bool cudnn_attention_forward(const Tensor& qkv, const AttnGeometry& g, float scale,
                             const AttnDropout& dr, Tensor& out, Tensor& lse, const Launch& l) {
  if (!is_float16ish(qkv.dtype()) || lse.dtype() != DType::f32 || out.dtype() != qkv.dtype() ||
      dr.on)
    return false;
  if (g.D % 8 != 0 || g.D > 256) return false;
  const Key key{l.device, g.B, g.T, g.H, g.D, int(qkv.dtype()), scale};
  Graph& graph =
      graph_of(t_graphs, key, [&](Graph& gr) { build_forward(gr, handle(l), g, qkv.dtype()); });
  if (!graph.ok) return false;
  const size_t es = memory::dtype_size(qkv.dtype());
  char* base = static_cast<char*>(qkv.raw_data());
  float neg_inf = -std::numeric_limits<float>::infinity();
  execute(graph, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {base, base + size_t(g.H * g.D) * es, base + size_t(2 * g.H * g.D) * es, out.raw_data(),
           lse.raw_data(), &scale, &neg_inf},
          l);
  return true;
}

bool cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttnGeometry& g, float scale,
                              const AttnDropout& dr, Tensor& dqkv, bool accumulate,
                              const Launch& l) {
  if (!is_float16ish(qkv.dtype()) || lse.dtype() != DType::f32 || out.dtype() != qkv.dtype() ||
      dout.dtype() != qkv.dtype() || dqkv.dtype() != qkv.dtype() || dr.on || accumulate)
    return false;
  if (g.D % 8 != 0 || g.D > 256) return false;
  const Key key{l.device, g.B, g.T, g.H, g.D, int(qkv.dtype()), scale};
  Graph& graph = graph_of(t_backward_graphs, key,
                          [&](Graph& gr) { build_backward(gr, handle(l), g, qkv.dtype()); });
  if (!graph.ok) return false;
  const size_t es = memory::dtype_size(qkv.dtype());
  const auto part = [&](const Tensor& t, int64_t which) {
    return static_cast<char*>(t.raw_data()) + size_t(which * g.H * g.D) * es;
  };
  // Workspaces of the graph's own: the rows' dO.O sums and dQ's f32 accumulator (zeroed,
  // as cuDNN before 9.6 required of its user).
  Tensor softmax_sum = scratch({g.B, g.H, g.T}, DType::f32, l.device);
  Tensor dq_accum = scratch({g.B, g.H, g.T, g.D}, DType::f32, l.device);
  BATON_CUDA_CHECK(cudaMemsetAsync(dq_accum.raw_data(), 0, dq_accum.nbytes(), l.stream));
  float neg_inf = -std::numeric_limits<float>::infinity(), one = 1.f;
  execute(
      graph,
      {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kNegInf, kOne, kSoftmaxSum, kDQAccum},
      {part(qkv, 0), part(qkv, 1), part(qkv, 2), out.raw_data(), dout.raw_data(), lse.raw_data(),
       part(dqkv, 0), part(dqkv, 1), part(dqkv, 2), &scale, &neg_inf, &one, softmax_sum.raw_data(),
       dq_accum.raw_data()},
      l);
  return true;
}

}  // namespace baton::kernels::cuda

#else  // built without cuDNN

namespace baton::kernels::cuda {

bool cudnn_built() {
  return false;
}
bool cudnn_attention_forward(const Tensor&, const AttnGeometry&, float, const AttnDropout&, Tensor&,
                             Tensor&, const Launch&) {
  return false;
}
bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const AttnGeometry&, float, const AttnDropout&, Tensor&, bool,
                              const Launch&) {
  return false;
}

}  // namespace baton::kernels::cuda

#endif
