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

#include <cudnn.h>

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace baton::kernels::cuda {

namespace {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file,
                                    int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                     cudnnGetErrorString(st) + (last[0] ? std::string(" (") + last + ")" : ""));
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
    BATON_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_ != nullptr) (void)cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values,
            int64_t count = 1) {
    BATON_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &o);
  }
  Desc& finalize() {
    BATON_CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::unique_ptr<Desc>;

// Tensor uids of the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kVirtual = 100 };

struct Graph {
  std::vector<DescPtr> keep;  // every descriptor the plan refers to
  DescPtr plan;
  int64_t workspace = 0;
  bool ok = false;  // false: cuDNN has no engine for it (cached, so not asked again)
};

class Builder {
 public:
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
    return tensor(kVirtual + next_virtual_++, type, dims, st, true);
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
    if (cudnnBackendFinalize(graph->get()) != CUDNN_STATUS_SUCCESS) return false;
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return false;
    constexpr int kMaxConfigs = 8;
    std::vector<DescPtr> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kMaxConfigs; ++i) {
      cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    int64_t found = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &found,
                                 raw.data()) != CUDNN_STATUS_SUCCESS)
      return false;
    push(std::move(graph));
    for (int64_t i = 0; i < found; ++i) {
      auto p = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      p->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h)
          .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[size_t(i)]);
      if (cudnnBackendFinalize(p->get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t ws = 0, n = 0;
      BATON_CUDNN_CHECK(cudnnBackendGetAttribute(p->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
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

struct PerThread {
  std::array<cudnnHandle_t, 64> handles{};
  std::map<Key, std::unique_ptr<Graph>> graphs;
};
thread_local PerThread t_cudnn;  // handles never destroyed, as the cuBLAS ones (gemm.cu)

cudnnHandle_t handle(const Launch& l) {
  cudnnHandle_t& h = t_cudnn.handles.at(size_t(l.device));
  if (h == nullptr) BATON_CUDNN_CHECK(cudnnCreate(&h));
  BATON_CUDNN_CHECK(cudnnSetStream(h, l.stream));
  return h;
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
  cudnnHandle_t h = handle(l);
  const Key key{l.device, g.B, g.T, g.H, g.D, int(qkv.dtype()), scale};
  auto it = t_cudnn.graphs.find(key);
  if (it == t_cudnn.graphs.end()) {
    auto graph = std::make_unique<Graph>();
    build_forward(*graph, h, g, qkv.dtype());
    it = t_cudnn.graphs.emplace(key, std::move(graph)).first;
  }
  Graph& graph = *it->second;
  if (!graph.ok) return false;
  const size_t es = memory::dtype_size(qkv.dtype());
  char* base = static_cast<char*>(qkv.raw_data());
  float neg_inf = -std::numeric_limits<float>::infinity();
  std::array<int64_t, 7> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  std::array<void*, 7> ptrs{base,
                            base + size_t(g.H * g.D) * es,
                            base + size_t(2 * g.H * g.D) * es,
                            out.raw_data(),
                            lse.raw_data(),
                            &scale,
                            &neg_inf};
  Tensor ws;
  void* ws_ptr = nullptr;
  if (graph.workspace > 0) {
    ws = Tensor::empty({(graph.workspace + 3) / 4}, DType::i32, memory::Device::cuda(l.device));
    ws_ptr = ws.raw_data();
  }
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(),
           int64_t(ptrs.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws_ptr)
      .finalize();
  BATON_CUDNN_CHECK(cudnnBackendExecute(h, graph.plan->get(), pack.get()));
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
