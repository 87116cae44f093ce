// cuDNN's fused attention forward through its graph (backend) API, for comparison with
// our flash kernels (attention.cu chooses; set_attention_impl(cudnn) forces it). The
// graph is the one cuDNN's fused flash-attention engines match: S = Q K^T, scaled, the
// causal mask (generated row and column indices, row >= col, -inf elsewhere), softmax
// as max / subtract / exp / sum / divide with the statistics M + log(sum) written out
// (the same natural-log log-sum-exp of the scaled scores as our kernels, so either
// backward can follow), then O = P V. Q, K and V are strided views of the packed qkv
// [B, T, 3, H, D] and O of out [B, T, H, D]: no copies. One plan per (device, shape,
// type, scale), built on first use per thread and kept; the workspace comes from the
// caching allocator. The backward stays on our kernels (flash where covered, else
// cuBLAS). Built when cuDNN's headers and library are found (BATON_HAVE_CUDNN).
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/ops_cuda.h"

#ifdef BATON_HAVE_CUDNN

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/cuda/cudnn_graph.cuh"

namespace baton::kernels::cuda {

namespace {

using namespace cudnn;

// Tensor uids of the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf };

cudnnDataType_t cudnn_type(DType t) {
  return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
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
  const Desc& scaled = b.virt({B, H, T, T});
  b.pointwise(CUDNN_POINTWISE_MUL, s, &scale, scaled);
  const Desc& row = b.virt({B, H, T, T}, CUDNN_DATA_INT32);
  b.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, row, nullptr, 2);
  const Desc& col = b.virt({B, H, T, T}, CUDNN_DATA_INT32);
  b.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, col, nullptr, 3);
  const Desc& keep = b.virt({B, H, T, T}, CUDNN_DATA_BOOLEAN);
  b.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep);
  const Desc& masked = b.virt({B, H, T, T});
  b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, &neg_inf, masked, &keep);
  const Desc& m = b.virt({B, H, T, 1});
  b.reduce(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  const Desc& shifted = b.virt({B, H, T, T});
  b.pointwise(CUDNN_POINTWISE_SUB, masked, &m, shifted);
  const Desc& e = b.virt({B, H, T, T});
  b.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  const Desc& z = b.virt({B, H, T, 1});
  b.reduce(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Desc& logz = b.virt({B, H, T, 1});
  b.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, logz);
  b.pointwise(CUDNN_POINTWISE_ADD, m, &logz, stats);
  const Desc& p = b.virt({B, H, T, T}, io);
  b.pointwise(CUDNN_POINTWISE_DIV, e, &z, p);
  b.matmul(p, v, o);
  g.ok = b.plan(h);
}

struct Key {
  int device;
  int64_t B, T, H, D;
  int dtype;
  float scale;
  auto operator<=>(const Key&) const = default;
};

thread_local std::map<Key, std::unique_ptr<Graph>> t_graphs;

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
  auto it = t_graphs.find(key);
  if (it == t_graphs.end()) {
    auto graph = std::make_unique<Graph>();
    build_forward(*graph, handle(l), g, qkv.dtype());
    it = t_graphs.emplace(key, std::move(graph)).first;
  }
  Graph& graph = *it->second;
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

}  // namespace baton::kernels::cuda

#endif
