// Matrix products through cuBLAS (strided-batched GemmEx, f32 accumulation) and the
// linear layer's bias GEMMs through cuBLASLt, whose epilogues add the bias (forward) and
// sum the bias gradient (weight gradient) inside the GEMM, each saving a pass.
//
// Both libraries are opened on the first GPU product (dynamic_library.h), not linked:
// a CPU-only rank, launcher or Python import had paid cuBLASLt's 230 MB RSS where 16 do.
#include <array>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/dynamic_library.h"
#include "kernels/cuda/ops_cuda.h"

namespace baton::kernels::cuda {

namespace {

// The cuBLAS and cuBLASLt functions this file calls, from the libraries of the headers'
// major version (the _v2 names: cublas_v2.h maps cublasCreate and the like onto them).
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  // Named by its type: C++ sees an inline overload (a cudaDataType compute type) too.
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
  decltype(&cublasLtCreate) lt_create;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

const std::string kCublas = "cuBLAS " BATON_CUDA_STR(CUBLAS_VER_MAJOR);

template <class F>
void find(void* lib, const char* lib_name, const char* symbol, F& out) {
  find_cuda_symbol(lib, lib_name, symbol, out, kCublas);
}

// Opened once per process, on first use (a function-local static: thread-safe).
const CublasApi& api() {
  static const CublasApi loaded = [] {
    const char* lt_name = "libcublasLt.so." BATON_CUDA_STR(CUBLAS_VER_MAJOR);
    const char* blas_name = "libcublas.so." BATON_CUDA_STR(CUBLAS_VER_MAJOR);
    const std::string what = kCublas + ", which the GPU's matrix products need";
    void* lt = open_cuda_library(lt_name, what);
    void* blas = open_cuda_library(blas_name, what);
    CublasApi a{};
    find(blas, blas_name, "cublasCreate_v2", a.create);
    find(blas, blas_name, "cublasSetStream_v2", a.set_stream);
    find(blas, blas_name, "cublasSetWorkspace_v2", a.set_workspace);
    find(blas, blas_name, "cublasGemmStridedBatchedEx", a.gemm_strided_batched);
    find(blas, blas_name, "cublasGetStatusName", a.status_name);
    find(blas, blas_name, "cublasGetStatusString", a.status_string);
    find(lt, lt_name, "cublasLtCreate", a.lt_create);
    find(lt, lt_name, "cublasLtMatmulDescCreate", a.desc_create);
    find(lt, lt_name, "cublasLtMatmulDescDestroy", a.desc_destroy);
    find(lt, lt_name, "cublasLtMatmulDescSetAttribute", a.desc_set);
    find(lt, lt_name, "cublasLtMatrixLayoutCreate", a.layout_create);
    find(lt, lt_name, "cublasLtMatrixLayoutDestroy", a.layout_destroy);
    find(lt, lt_name, "cublasLtMatmulPreferenceCreate", a.pref_create);
    find(lt, lt_name, "cublasLtMatmulPreferenceDestroy", a.pref_destroy);
    find(lt, lt_name, "cublasLtMatmulPreferenceSetAttribute", a.pref_set);
    find(lt, lt_name, "cublasLtMatmulAlgoGetHeuristic", a.heuristic);
    find(lt, lt_name, "cublasLtMatmul", a.matmul);
    return a;
  }();
  return loaded;
}

std::atomic<bool> g_allow_tf32{false};
constexpr int kMaxDevices = 64;
constexpr size_t kLtWorkspace = size_t(32) << 20;

std::atomic<uint64_t> g_lt_bias{0}, g_gemm_bias{0}, g_lt_bias_grad{0}, g_colsum_bias_grad{0};

// One handle per thread and device: handles are not to be shared by threads that set
// different streams, and one thread per device is the common case.
// Never destroyed: at process exit the CUDA context may already be gone, and a destroy
// call then fails or crashes; the driver frees everything with the process.
struct Handles {
  std::array<cublasHandle_t, kMaxDevices> blas{};
  std::array<cublasLtHandle_t, kMaxDevices> lt{};
};
thread_local Handles t_handles;

// One workspace per stream (and so per device): two streams running GEMMs at once must
// not share scratch memory, while the GEMMs of one stream run in order and can. Shared
// by every thread, kept for the process (a stream created later at the same address is
// the only one using it then).
void* stream_workspace(const Launch& l) {
  static std::mutex mu;
  static auto* spaces = new std::map<std::pair<int, cudaStream_t>, void*>();
  std::lock_guard lock(mu);
  void*& w = (*spaces)[{l.device, l.stream}];
  if (w == nullptr) BATON_CUDA_CHECK(cudaMalloc(&w, kLtWorkspace));
  return w;
}

cublasHandle_t blas_handle(const Launch& l) {
  cublasHandle_t& h = t_handles.blas.at(size_t(l.device));
  if (h == nullptr) BATON_CUBLAS_CHECK(api().create(&h));
  // cublasSetStream resets the workspace to cuBLAS's default: the stream's own follows.
  BATON_CUBLAS_CHECK(api().set_stream(h, l.stream));
  BATON_CUBLAS_CHECK(api().set_workspace(h, stream_workspace(l), kLtWorkspace));
  return h;
}

cublasLtHandle_t lt_handle(const Launch& l) {
  cublasLtHandle_t& h = t_handles.lt.at(size_t(l.device));
  if (h == nullptr) BATON_CUBLAS_CHECK(api().lt_create(&h));
  return h;
}

cublasComputeType_t compute_type(DType ab) {
  if (ab == DType::f32)
    return g_allow_tf32.load() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return CUBLAS_COMPUTE_32F;
}

int64_t batch_of(const Tensor& t) {
  int64_t b = 1;
  for (int64_t d = 0; d + 2 < t.dim(); ++d) b *= t.size(d);
  return b;
}

void check_gemm_types(const char* op, DType ab, DType other_ab, DType c) {
  require(is_cuda_float(ab), op, "inputs must be f32, bf16 or f16");
  require(ab == other_ab, op, "both inputs must have one dtype");
  require(c == ab || c == DType::f32, op, "the output must have the inputs' dtype or f32");
}

}  // namespace

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  // A status comes from a call through the loaded table, so api() is there already.
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                     " failed: " + api().status_name(st) + ": " + api().status_string(st));
}

cudaDataType_t cuda_type(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f64:
      return CUDA_R_64F;
    default:
      fail(op, "no CUDA data type for " + std::string(memory::dtype_name(t)));
  }
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
}
bool allow_tf32() {
  return g_allow_tf32.load();
}

LinearBiasPaths linear_bias_paths() {
  return {g_lt_bias.load(), g_gemm_bias.load(), g_lt_bias_grad.load(), g_colsum_bias_grad.load()};
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
void gemm(const Gemm& g, const Launch& l, const char* op) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  cublasHandle_t h = blas_handle(l);
  const cudaDataType_t ab = cuda_type(g.ab_type, op), ct = cuda_type(g.c_type, op);
  BATON_CUBLAS_CHECK(api().gemm_strided_batched(
      h, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.n),
      int(g.m), int(g.k), &g.alpha, g.b, ab, int(g.ldb), g.stride_b, g.a, ab, int(g.lda),
      g.stride_a, &g.beta, g.c, ct, int(g.ldc), g.stride_c, int(g.batch), compute_type(g.ab_type),
      CUBLAS_GEMM_DEFAULT));
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
            double beta) {
  const char* op = "matmul";
  require_cuda(op, "a", a);
  require_cuda(op, "b", b);
  require_cuda(op, "c", c);
  check_gemm_types(op, a.dtype(), b.dtype(), c.dtype());
  require(a.dim() >= 2 && b.dim() >= 2 && c.dim() == a.dim(), op,
          "a, c: [..., rows, cols]; b 2-D or batched like a");
  const int64_t m = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2), n = trans_b ? b.size(-2) : b.size(-1);
  const int64_t batch = batch_of(a);
  const bool b_shared = b.dim() == 2;
  require(k == kb && c.size(-2) == m && c.size(-1) == n && batch_of(c) == batch &&
              (b_shared || batch_of(b) == batch),
          op,
          "shapes " + a.str() + (trans_a ? "^T" : "") + " x " + b.str() + (trans_b ? "^T" : "") +
              " -> " + c.str() + " do not match");
  Launch l(c);
  Gemm g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m, g.n = n, g.k = k, g.batch = batch;
  g.a = a.raw_data(), g.lda = a.size(-1), g.stride_a = m * k;
  g.b = b.raw_data(), g.ldb = b.size(-1), g.stride_b = b_shared ? 0 : k * n;
  g.c = c.raw_data(), g.ldc = n, g.stride_c = m * n;
  g.ab_type = a.dtype(), g.c_type = c.dtype();
  g.alpha = float(alpha), g.beta = float(beta);
  gemm(g, l, op);
}

namespace {

// One cuBLASLt product, column-major: D (m x n) = op(A) (m x k) op(B) (k x n) + beta D,
// with an epilogue on `vec`: BIAS adds it (m values) to every column; BGRADA / BGRADB
// write into it A's rows / B's columns summed over k (a bias gradient, read from the
// operand as the GEMM loads it, instead of a second pass over dy).
struct LtCall {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  cudaDataType_t ab = CUDA_R_32F, dt = CUDA_R_32F;
  cublasComputeType_t comp = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  void* vec = nullptr;
  float beta = 0;
};

// Per device: a heuristic's algorithm is chosen for one device's architecture and
// memory, and one thread may drive several devices.
struct LtKey {
  int device;
  int64_t m, n, k;
  int ta, tb, ab, dt, comp, epi;
  bool beta;
  auto operator<=>(const LtKey&) const = default;
};
thread_local std::map<LtKey, std::pair<bool, cublasLtMatmulAlgo_t>> t_lt_algos;

struct LtDesc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~LtDesc() {
    if (a) (void)api().layout_destroy(a);
    if (b) (void)api().layout_destroy(b);
    if (d) (void)api().layout_destroy(d);
    if (op) (void)api().desc_destroy(op);
  }
};

template <class V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  BATON_CUBLAS_CHECK(api().desc_set(d, a, &v, sizeof v));
}

// Returns false when Lt has no algorithm for the case (the caller takes another path).
bool lt_matmul(const LtCall& c, const Launch& l) {
  cublasLtHandle_t h = lt_handle(l);
  LtDesc d;
  BATON_CUBLAS_CHECK(api().desc_create(&d.op, c.comp, CUDA_R_32F));
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSA, c.ta);
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSB, c.tb);
  if (c.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    set_attr(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, c.epi);
    set_attr(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.vec);
  }
  const bool na = c.ta == CUBLAS_OP_N, nb = c.tb == CUBLAS_OP_N;
  BATON_CUBLAS_CHECK(
      api().layout_create(&d.a, c.ab, uint64_t(na ? c.m : c.k), uint64_t(na ? c.k : c.m), c.lda));
  BATON_CUBLAS_CHECK(
      api().layout_create(&d.b, c.ab, uint64_t(nb ? c.k : c.n), uint64_t(nb ? c.n : c.k), c.ldb));
  BATON_CUBLAS_CHECK(api().layout_create(&d.d, c.dt, uint64_t(c.m), uint64_t(c.n), c.ldd));

  const LtKey key{l.device,  c.m,       c.n,         c.k,        int(c.ta),    int(c.tb),
                  int(c.ab), int(c.dt), int(c.comp), int(c.epi), c.beta != 0.f};
  auto it = t_lt_algos.find(key);
  if (it == t_lt_algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    BATON_CUBLAS_CHECK(api().pref_create(&pref));
    BATON_CUBLAS_CHECK(api().pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kLtWorkspace,
                                      sizeof kLtWorkspace));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    cublasStatus_t st = api().heuristic(h, d.op, d.a, d.b, d.d, d.d, pref, 1, &res, &found);
    (void)api().pref_destroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) BATON_CUBLAS_CHECK(st);
    it = t_lt_algos.emplace(key, std::make_pair(st == CUBLAS_STATUS_SUCCESS && found > 0, res.algo))
             .first;
  }
  if (!it->second.first) return false;
  const float alpha = 1.f;
  BATON_CUBLAS_CHECK(api().matmul(h, d.op, &alpha, c.a, d.a, c.b, d.b, &c.beta, c.d, d.d, c.d, d.d,
                                  &it->second.second, stream_workspace(l), kLtWorkspace, l.stream));
  return true;
}

// Lt's heuristics assume 256-byte aligned operands (whole tensors from the caching
// allocator are); views at other offsets take the plain GEMM paths.
bool lt_aligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 256 != 0) return false;
  return true;
}

// y = x op(W) + bias with the bias added in the GEMM's epilogue.
bool lt_linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, bool in_out, Tensor& y,
                    int64_t rows, int64_t in, int64_t out, const Launch& l) {
  const char* op = "linear_forward";
  // D (out x rows) = op(W) (out x in) * x (in x rows) + bias[out].
  LtCall c;
  c.ta = in_out ? CUBLAS_OP_N : CUBLAS_OP_T;
  c.m = out, c.n = rows, c.k = in;
  c.a = w.raw_data(), c.lda = in_out ? out : in;
  c.b = x.raw_data(), c.ldb = in;
  c.d = y.raw_data(), c.ldd = out;
  c.ab = cuda_type(x.dtype(), op), c.dt = cuda_type(y.dtype(), op);
  c.comp = compute_type(x.dtype());
  c.epi = CUBLASLT_EPILOGUE_BIAS;
  c.vec = const_cast<void*>(bias.raw_data());
  if (!lt_matmul(c, l)) return false;
  g_lt_bias++;
  return true;
}

// BATON_CUDA_BIAS_GRAD=colsum keeps the bias gradient in its own kernel (to time both);
// epilogue (or unset) sums it in the weight GEMM.
bool bias_grad_in_gemm() {
  static const bool on = [] {
    const char* v = std::getenv("BATON_CUDA_BIAS_GRAD");
    const std::string s = v == nullptr ? "" : v;
    require(s.empty() || s == "epilogue" || s == "colsum", "linear_backward_weight",
            "BATON_CUDA_BIAS_GRAD: expected epilogue or colsum, found '" + s + "'");
    return s != "colsum";
  }();
  return on;
}

// x, y: [..., in] and [..., out], seen as [rows, in] and [rows, out].
struct LinearDims {
  int64_t rows, in, out;
};
LinearDims check_linear(const char* op, const Tensor& x, const Tensor& w, bool in_out,
                        const Tensor& y) {
  require(x.dim() >= 1 && w.dim() == 2 && y.dim() >= 1, op, "x [..., in], w 2-D, y [..., out]");
  const int64_t in = x.size(-1), out = y.size(-1);
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  require(y.numel() == rows * out && w.size(0) == (in_out ? in : out) &&
              w.size(1) == (in_out ? out : in),
          op, "shapes x " + x.str() + ", w " + w.str() + ", y " + y.str() + " do not match");
  return {rows, in, out};
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout,
                    Tensor& y) {
  const char* op = "linear_forward";
  require_cuda(op, "x", x);
  require_cuda(op, "w", w);
  require_cuda(op, "y", y);
  check_gemm_types(op, x.dtype(), w.dtype(), y.dtype());
  const bool in_out = layout == WeightLayout::in_out;
  const auto [rows, in, out] = check_linear(op, x, w, in_out, y);
  Launch l(y);
  if (bias.defined()) {
    require_cuda(op, "bias", bias);
    require(bias.numel() == out, op, "bias must have y's column count");
    if (lt_aligned({&x, &w, &bias, &y}) && bias.dtype() == y.dtype() && rows > 0 &&
        lt_linear_bias(x, w, bias, in_out, y, rows, in, out, l))
      return;
  }
  Gemm g;
  g.trans_b = !in_out;
  g.m = rows, g.n = out, g.k = in;
  g.a = x.raw_data(), g.lda = in;
  g.b = w.raw_data(), g.ldb = in_out ? out : in;
  g.c = y.raw_data(), g.ldc = out;
  g.ab_type = x.dtype(), g.c_type = y.dtype();
  gemm(g, l, op);
  if (bias.defined()) {
    bias_add_inplace(y, bias);
    g_gemm_bias++;
  }
}

void linear_backward_input(const Tensor& dy, const Tensor& w, WeightLayout layout, Tensor& dx,
                           bool accumulate) {
  const char* op = "linear_backward_input";
  require_cuda(op, "dy", dy);
  require_cuda(op, "w", w);
  require_cuda(op, "dx", dx);
  check_gemm_types(op, dy.dtype(), w.dtype(), dx.dtype());
  const bool in_out = layout == WeightLayout::in_out;
  const auto [rows, in, out] = check_linear(op, dx, w, in_out, dy);
  Launch l(dx);
  // dx [rows, in] = dy [rows, out] * W [out, in]   (in_out: * W[in, out]^T)
  Gemm g;
  g.trans_b = in_out;
  g.m = rows, g.n = in, g.k = out;
  g.a = dy.raw_data(), g.lda = out;
  g.b = w.raw_data(), g.ldb = in_out ? out : in;
  g.c = dx.raw_data(), g.ldc = in;
  g.ab_type = dy.dtype(), g.c_type = dx.dtype();
  g.beta = accumulate ? 1.f : 0.f;
  gemm(g, l, op);
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, WeightLayout layout, Tensor& dw,
                            Tensor& dbias, bool accumulate) {
  const char* op = "linear_backward_weight";
  require_cuda(op, "dy", dy);
  require_cuda(op, "x", x);
  require_cuda(op, "dw", dw);
  check_gemm_types(op, dy.dtype(), x.dtype(), dw.dtype());
  const bool in_out = layout == WeightLayout::in_out;
  const auto [rows, in, out] = check_linear(op, x, dw, in_out, dy);
  Launch l(dw);
  if (dbias.defined() && bias_grad_in_gemm() && rows > 0 && dbias.dtype() == dw.dtype() &&
      dbias.numel() == out && lt_aligned({&dy, &x, &dw, &dbias})) {
    // The bias gradient from the GEMM's epilogue, in D's type (Lt's rule). Lt writes it:
    // accumulating, it goes to a scratch vector added after.
    Tensor vec = accumulate ? scratch({out}, dbias.dtype(), l.device) : dbias;
    LtCall c;
    c.vec = lt_aligned({&vec}) ? vec.raw_data() : nullptr;
    c.tb = CUBLAS_OP_T;
    c.k = rows;
    if (in_out) {  // D (out x in) = dy (out x rows) * x^T; dy's rows summed over k: BGRADA
      c.m = out, c.n = in;
      c.a = dy.raw_data(), c.lda = out;
      c.b = x.raw_data(), c.ldb = in;
      c.epi = CUBLASLT_EPILOGUE_BGRADA;
    } else {  // D (in x out) = x (in x rows) * dy^T; dy^T's columns summed over k: BGRADB
      c.m = in, c.n = out;
      c.a = x.raw_data(), c.lda = in;
      c.b = dy.raw_data(), c.ldb = out;
      c.epi = CUBLASLT_EPILOGUE_BGRADB;
    }
    c.d = dw.raw_data(), c.ldd = c.m;
    c.ab = cuda_type(dy.dtype(), op), c.dt = cuda_type(dw.dtype(), op);
    c.comp = compute_type(dy.dtype());
    c.beta = accumulate ? 1.f : 0.f;
    if (c.vec != nullptr && lt_matmul(c, l)) {
      if (accumulate) add_inplace(dbias, vec);
      g_lt_bias_grad++;
      return;
    }
  }
  Gemm g;
  g.trans_a = true;
  g.k = rows;
  if (in_out) {  // dW [in, out] = x^T dy
    g.m = in, g.n = out;
    g.a = x.raw_data(), g.lda = in;
    g.b = dy.raw_data(), g.ldb = out;
  } else {  // dW [out, in] = dy^T x
    g.m = out, g.n = in;
    g.a = dy.raw_data(), g.lda = out;
    g.b = x.raw_data(), g.ldb = in;
  }
  g.c = dw.raw_data(), g.ldc = g.n;
  g.ab_type = dy.dtype(), g.c_type = dw.dtype();
  g.beta = accumulate ? 1.f : 0.f;
  gemm(g, l, op);
  if (dbias.defined()) {
    bias_backward(dy, dbias, accumulate);
    g_colsum_bias_grad++;
  }
}

}  // namespace baton::kernels::cuda
