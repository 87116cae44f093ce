// The ops' dispatch: checks arguments once for every backend, then sends CPU tensors to
// kernels/cpu and CUDA tensors to kernels/cuda (when built with it; otherwise a CUDA
// tensor is a RuntimeError that says so).
#include "kernels/ops.h"

#include <climits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/detail/check.h"
#include "kernels/fused.h"
#include "kernels/grad_scale.h"
#include "kernels/mixed_precision.h"
#include "kernels/random.h"

#ifdef BATON_KERNELS_CUDA
#include "kernels/cuda/ops_cuda.h"
#define BATON_ON_CUDA(dev, call) \
  if ((dev).is_cuda()) return cuda::call
#else
#define BATON_ON_CUDA(dev, call) \
  if ((dev).is_cuda()) detail::no_cuda(__func__, dev)
#endif

namespace baton::kernels {

using namespace detail;
using memory::DType;
using memory::Shape;

namespace {

void check_blas_size(const char* op, int64_t v) {
  BATON_NEED(v < INT_MAX, op, "dimension " + std::to_string(v) + " exceeds BLAS's 32-bit sizes");
}

void check_block(const char* op, const char* name, const Tensor& t, const Block& where) {
  if (where.global_shape.empty()) {
    for (int64_t o : where.offsets)
      BATON_NEED(o == 0, op, "a block without global_shape must have zero offsets");
    return;
  }
  BATON_NEED(t.dim() <= cpu::kMaxBlockRank, op,
             std::string(name) + " " + t.str() + ": blocks of more than " +
                 std::to_string(cpu::kMaxBlockRank) + " dimensions are not supported");
  BATON_NEED(int64_t(where.global_shape.size()) == t.dim() &&
                 where.offsets.size() == where.global_shape.size(),
             op,
             std::string(name) + " " + t.str() + " is a block of " +
                 memory::shape_str(where.global_shape) + " at offsets " +
                 memory::shape_str(where.offsets) + ": ranks differ");
  for (int64_t d = 0; d < t.dim(); ++d)
    BATON_NEED(where.offsets[size_t(d)] >= 0 &&
                   where.offsets[size_t(d)] + t.size(d) <= where.global_shape[size_t(d)],
               op,
               std::string(name) + " " + t.str() + " at offsets " +
                   memory::shape_str(where.offsets) + " does not fit in " +
                   memory::shape_str(where.global_shape));
}

cpu::BlockRuns runs_of(const Tensor& t, const Block& where) {
  return cpu::block_runs(t.shape(), where.global_shape, where.offsets);
}

int64_t rows_of(const Tensor& t) {
  return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1);
}

}  // namespace

// ---- threads ----

void set_num_threads(int n) {
  BATON_NEED(n >= 1, "set_num_threads",
             "thread count must be at least 1, got " + std::to_string(n));
  cpu::set_thread_count(n);
}

void configure_cpu_runtime(char** argv, bool computes) {
  cpu::configure_cpu_runtime(argv, computes);
}

int num_threads() {
  return cpu::thread_count();
}

bool built_with_cuda() {
#ifdef BATON_KERNELS_CUDA
  return true;
#else
  return false;
#endif
}

// ---- GEMM ----

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha,
            double beta) {
  const char* op = "matmul";
  check_float(op, "a", a);
  check_like(op, "b", b, "a", a);
  check_like(op, "c", c, "a", a);
  BATON_NEED(a.dim() >= 2, op, "a must have at least 2 dimensions, got " + a.str());
  BATON_NEED(c.dim() == a.dim(), op, "c must have the rank of a (" + a.str() + "), got " + c.str());
  BATON_NEED(b.dim() == 2 || b.dim() == a.dim(), op,
             "b must be 2-D or have the rank of a (" + a.str() + "), got " + b.str());
  const bool b_shared = b.dim() == 2 && a.dim() > 2;
  if (!b_shared)
    BATON_NEED(std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin()), op,
               "batch dimensions of a " + a.str() + " and b " + b.str() + " differ");
  const int64_t m = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2), n = trans_b ? b.size(-2) : b.size(-1);
  BATON_NEED(k == kb, op,
             "inner dimensions differ: op(a) of " + a.str() + " is [" + std::to_string(m) + ", " +
                 std::to_string(k) + "], op(b) of " + b.str() + " is [" + std::to_string(kb) +
                 ", " + std::to_string(n) + "]");
  check_leading_then(op, "c", c, "a", a, 2, {m, n});
  int64_t batch = 1;
  for (int64_t d = 0; d + 2 < a.dim(); ++d) batch *= a.size(d);
  for (int64_t v : {m * (b_shared && !trans_a ? batch : 1), n, k}) check_blas_size(op, v);
  BATON_NEED(!overlaps(c, a) && !overlaps(c, b), op, "c must not overlap a or b");
  const auto dev = common_device(op, {&a, &b, &c});
  BATON_ON_CUDA(dev, matmul(a, trans_a, b, trans_b, c, alpha, beta));
  on_float(op, a.dtype(), [&]<class T>(T) {
    cpu::matmul<T>(a.data<T>(), trans_a, b.data<T>(), trans_b, c.data<T>(), batch, m, n, k,
                   b_shared, T(alpha), T(beta));
  });
}

// ---- linear ----

namespace {
// in and out of a weight in the given layout.
std::pair<int64_t, int64_t> weight_dims(const char* op, const Tensor& w, WeightLayout layout) {
  BATON_NEED(w.dim() == 2, op, "w must be 2-D, got " + w.str());
  return layout == WeightLayout::in_out ? std::pair{w.size(0), w.size(1)}
                                        : std::pair{w.size(1), w.size(0)};
}
}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout,
                    Tensor& y) {
  const char* op = "linear_forward";
  check_float(op, "x", x);
  check_like(op, "w", w, "x", x);
  check_like(op, "y", y, "x", x);
  // Not a structured binding: clang 14 cannot capture those in the lambdas below.
  const auto dims = weight_dims(op, w, layout);
  const int64_t in = dims.first, out = dims.second;
  BATON_NEED(last_dim(op, "x", x) == in, op, "x " + x.str() + " does not match w " + w.str());
  check_leading_then(op, "y", y, "x", x, 1, {out});
  if (bias.defined()) {
    check_like(op, "bias", bias, "x", x);
    check_dims(op, "bias", bias, {out});
  }
  const int64_t rows = rows_of(x);
  for (int64_t v : {rows, in, out}) check_blas_size(op, v);
  const auto dev = common_device(op, {&x, &w, &bias, &y});
  BATON_ON_CUDA(dev, linear_forward(x, w, bias, layout, y));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::linear_forward<T>(x.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr,
                           layout == WeightLayout::in_out, y.data<T>(), rows, in, out);
  });
}

void linear_backward_input(const Tensor& dy, const Tensor& w, WeightLayout layout, Tensor& dx,
                           bool accumulate) {
  const char* op = "linear_backward_input";
  check_float(op, "dy", dy);
  check_like(op, "w", w, "dy", dy);
  check_like(op, "dx", dx, "dy", dy);
  // Not a structured binding: clang 14 cannot capture those in the lambdas below.
  const auto dims = weight_dims(op, w, layout);
  const int64_t in = dims.first, out = dims.second;
  BATON_NEED(last_dim(op, "dy", dy) == out, op, "dy " + dy.str() + " does not match w " + w.str());
  check_leading_then(op, "dx", dx, "dy", dy, 1, {in});
  const int64_t rows = rows_of(dy);
  for (int64_t v : {rows, in, out}) check_blas_size(op, v);
  const auto dev = common_device(op, {&dy, &w, &dx});
  BATON_ON_CUDA(dev, linear_backward_input(dy, w, layout, dx, accumulate));
  on_float(op, dy.dtype(), [&]<class T>(T) {
    cpu::linear_backward_input<T>(dy.data<T>(), w.data<T>(), layout == WeightLayout::in_out,
                                  dx.data<T>(), rows, in, out, accumulate);
  });
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, WeightLayout layout, Tensor& dw,
                            Tensor& dbias, bool accumulate) {
  const char* op = "linear_backward_weight";
  check_float(op, "dy", dy);
  check_like(op, "x", x, "dy", dy);
  check_like(op, "dw", dw, "dy", dy);
  // Not a structured binding: clang 14 cannot capture those in the lambdas below.
  const auto dims = weight_dims(op, dw, layout);
  const int64_t in = dims.first, out = dims.second;
  BATON_NEED(last_dim(op, "x", x) == in && last_dim(op, "dy", dy) == out, op,
             "x " + x.str() + " and dy " + dy.str() + " do not match dw " + dw.str());
  check_leading_then(op, "dy", dy, "x", x, 1, {out});
  if (dbias.defined()) {
    check_like(op, "dbias", dbias, "dy", dy);
    check_dims(op, "dbias", dbias, {out});
  }
  const int64_t rows = rows_of(dy);
  for (int64_t v : {rows, in, out}) check_blas_size(op, v);
  const auto dev = common_device(op, {&dy, &x, &dw, &dbias});
  BATON_ON_CUDA(dev, linear_backward_weight(dy, x, layout, dw, dbias, accumulate));
  on_float(op, dy.dtype(), [&]<class T>(T) {
    cpu::linear_backward_weight<T>(dy.data<T>(), x.data<T>(), layout == WeightLayout::in_out,
                                   dw.data<T>(), dbias.defined() ? dbias.data<T>() : nullptr, rows,
                                   in, out, accumulate);
  });
}

// ---- elementwise ----

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  check_float(op, "a", a);
  check_like(op, "b", b, "a", a);
  check_like(op, "out", out, "a", a);
  check_same_shape(op, "b", b, "a", a);
  check_same_shape(op, "out", out, "a", a);
  const auto dev = common_device(op, {&a, &b, &out});
  BATON_ON_CUDA(dev, add(a, b, out));
  on_float(op, a.dtype(),
           [&]<class T>(T) { cpu::add<T>(a.data<T>(), b.data<T>(), out.data<T>(), a.numel()); });
}

void add_inplace(Tensor& acc, const Tensor& x) {
  const char* op = "add_inplace";
  check_float(op, "acc", acc);
  check_like(op, "x", x, "acc", acc);
  check_same_shape(op, "x", x, "acc", acc);
  const auto dev = common_device(op, {&acc, &x});
  BATON_ON_CUDA(dev, add_inplace(acc, x));
  on_float(op, acc.dtype(),
           [&]<class T>(T) { cpu::add_inplace<T>(acc.data<T>(), x.data<T>(), acc.numel()); });
}

void scale_inplace(Tensor& t, double s) {
  const char* op = "scale_inplace";
  check_float(op, "t", t);
  const auto dev = common_device(op, {&t});
  BATON_ON_CUDA(dev, scale_inplace(t, s));
  on_float(op, t.dtype(), [&]<class T>(T) { cpu::scale_inplace<T>(t.data<T>(), T(s), t.numel()); });
}

void bias_add_inplace(Tensor& y, const Tensor& bias) {
  const char* op = "bias_add_inplace";
  check_float(op, "y", y);
  check_like(op, "bias", bias, "y", y);
  check_dims(op, "bias", bias, {last_dim(op, "y", y)});
  const auto dev = common_device(op, {&y, &bias});
  BATON_ON_CUDA(dev, bias_add_inplace(y, bias));
  on_float(op, y.dtype(), [&]<class T>(T) {
    cpu::bias_add_inplace<T>(y.data<T>(), bias.data<T>(), rows_of(y), y.size(-1));
  });
}

void bias_backward(const Tensor& dy, Tensor& dbias, bool accumulate) {
  const char* op = "bias_backward";
  check_float(op, "dy", dy);
  check_like(op, "dbias", dbias, "dy", dy);
  check_dims(op, "dbias", dbias, {last_dim(op, "dy", dy)});
  const auto dev = common_device(op, {&dy, &dbias});
  BATON_ON_CUDA(dev, bias_backward(dy, dbias, accumulate));
  on_float(op, dy.dtype(), [&]<class T>(T) {
    cpu::bias_backward<T>(dy.data<T>(), dbias.data<T>(), rows_of(dy), dy.size(-1), accumulate);
  });
}

// ---- activations ----

namespace {
void check_unary(const char* op, const Tensor& x, const Tensor& y) {
  check_float(op, "x", x);
  check_like(op, "y", y, "x", x);
  check_same_shape(op, "y", y, "x", x);
}
void check_unary_backward(const char* op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  check_float(op, "x", x);
  check_like(op, "dy", dy, "x", x);
  check_like(op, "dx", dx, "x", x);
  check_same_shape(op, "dy", dy, "x", x);
  check_same_shape(op, "dx", dx, "x", x);
}
}  // namespace

void silu_forward(const Tensor& x, Tensor& y) {
  check_unary("silu_forward", x, y);
  const auto dev = common_device("silu_forward", {&x, &y});
  BATON_ON_CUDA(dev, silu_forward(x, y));
  on_float("silu_forward", x.dtype(),
           [&]<class T>(T) { cpu::silu_forward<T>(x.data<T>(), y.data<T>(), x.numel()); });
}

void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  check_unary_backward("silu_backward", x, dy, dx);
  const auto dev = common_device("silu_backward", {&x, &dy, &dx});
  BATON_ON_CUDA(dev, silu_backward(x, dy, dx, accumulate));
  on_float("silu_backward", x.dtype(), [&]<class T>(T) {
    cpu::silu_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel(), accumulate);
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const char* op = "swiglu_forward";
  check_float(op, "gate", gate);
  check_like(op, "up", up, "gate", gate);
  check_same_shape(op, "up", up, "gate", gate);
  check_like(op, "y", y, "gate", gate);
  check_same_shape(op, "y", y, "gate", gate);
  const auto dev = common_device(op, {&gate, &up, &y});
  BATON_ON_CUDA(dev, swiglu_forward(gate, up, y));
  on_float(op, gate.dtype(), [&]<class T>(T) {
    cpu::swiglu_forward<T>(gate.data<T>(), up.data<T>(), y.data<T>(), gate.numel());
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                     Tensor& dup, bool acc_gate, bool acc_up) {
  const char* op = "swiglu_backward";
  check_float(op, "gate", gate);
  for (auto [name, t] : {std::pair{"up", &up}, {"dy", &dy}, {"dgate", &dgate}, {"dup", &dup}}) {
    if (!t->defined() && (t == &dgate || t == &dup)) continue;
    check_like(op, name, *t, "gate", gate);
    check_same_shape(op, name, *t, "gate", gate);
  }
  const auto dev = common_device(op, {&gate, &up, &dy, &dgate, &dup});
  BATON_ON_CUDA(dev, swiglu_backward(gate, up, dy, dgate, dup, acc_gate, acc_up));
  on_float(op, gate.dtype(), [&]<class T>(T) {
    cpu::swiglu_backward<T>(
        gate.data<T>(), up.data<T>(), dy.data<T>(), dgate.defined() ? dgate.data<T>() : nullptr,
        dup.defined() ? dup.data<T>() : nullptr, gate.numel(), acc_gate, acc_up);
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  check_unary("gelu_forward", x, y);
  const auto dev = common_device("gelu_forward", {&x, &y});
  BATON_ON_CUDA(dev, gelu_forward(x, y));
  on_float("gelu_forward", x.dtype(),
           [&]<class T>(T) { cpu::gelu_forward<T>(x.data<T>(), y.data<T>(), x.numel()); });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  check_unary_backward("gelu_backward", x, dy, dx);
  const auto dev = common_device("gelu_backward", {&x, &dy, &dx});
  BATON_ON_CUDA(dev, gelu_backward(x, dy, dx, accumulate));
  on_float("gelu_backward", x.dtype(), [&]<class T>(T) {
    cpu::gelu_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel(), accumulate);
  });
}

void bias_gelu_forward(const Tensor& x, const Tensor& bias, Tensor& h, Tensor& y) {
  const char* op = "bias_gelu_forward";
  check_float(op, "x", x);
  check_like(op, "bias", bias, "x", x);
  check_dims(op, "bias", bias, {last_dim(op, "x", x)});
  for (auto [name, t] : {std::pair{"h", &h}, {"y", &y}}) {
    check_like(op, name, *t, "x", x);
    check_same_shape(op, name, *t, "x", x);
  }
  const auto dev = common_device(op, {&x, &bias, &h, &y});
  BATON_ON_CUDA(dev, bias_gelu_forward(x, bias, h, y));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::bias_gelu_forward<T>(x.data<T>(), bias.data<T>(), h.data<T>(), y.data<T>(), rows_of(x),
                              x.size(-1));
  });
}

void relu_forward(const Tensor& x, Tensor& y) {
  check_unary("relu_forward", x, y);
  const auto dev = common_device("relu_forward", {&x, &y});
  BATON_ON_CUDA(dev, relu_forward(x, y));
  on_float("relu_forward", x.dtype(),
           [&]<class T>(T) { cpu::relu_forward<T>(x.data<T>(), y.data<T>(), x.numel()); });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, bool accumulate) {
  check_unary_backward("relu_backward", x, dy, dx);
  const auto dev = common_device("relu_backward", {&x, &dy, &dx});
  BATON_ON_CUDA(dev, relu_backward(x, dy, dx, accumulate));
  on_float("relu_backward", x.dtype(), [&]<class T>(T) {
    cpu::relu_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel(), accumulate);
  });
}

// ---- dropout ----

void dropout_forward(const Tensor& x, Tensor& y, double p, uint64_t seed, uint64_t stream,
                     const Block& where) {
  const char* op = "dropout_forward";
  check_unary(op, x, y);
  BATON_NEED(p >= 0 && p <= 1, op, "p must lie in [0, 1], got " + std::to_string(p));
  check_block(op, "x", x, where);
  const auto dev = common_device(op, {&x, &y});
  BATON_ON_CUDA(dev, dropout_forward(x, y, p, seed, stream, where));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::dropout_forward<T>(x.data<T>(), y.data<T>(), p, seed, stream, runs_of(x, where));
  });
}

void dropout_backward(const Tensor& dy, Tensor& dx, double p, uint64_t seed, uint64_t stream,
                      const Block& where, bool accumulate) {
  const char* op = "dropout_backward";
  check_float(op, "dy", dy);
  check_like(op, "dx", dx, "dy", dy);
  check_same_shape(op, "dx", dx, "dy", dy);
  BATON_NEED(p >= 0 && p <= 1, op, "p must lie in [0, 1], got " + std::to_string(p));
  check_block(op, "dy", dy, where);
  const auto dev = common_device(op, {&dy, &dx});
  BATON_ON_CUDA(dev, dropout_backward(dy, dx, p, seed, stream, where, accumulate));
  on_float(op, dy.dtype(), [&]<class T>(T) {
    cpu::dropout_backward<T>(dy.data<T>(), dx.data<T>(), p, seed, stream, runs_of(dy, where),
                             accumulate);
  });
}

// ---- normalisation ----

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  check_float(op, "x", x);
  const int64_t c = last_dim(op, "x", x), rows = rows_of(x);
  for (auto [name, t] : {std::pair{"weight", &weight}, {"bias", &bias}}) {
    check_like(op, name, *t, "x", x);
    check_dims(op, name, *t, {c});
  }
  check_like(op, "y", y, "x", x);
  check_same_shape(op, "y", y, "x", x);
  for (auto [name, t] : {std::pair{"mean", &mean}, {"rstd", &rstd}}) {
    check_like(op, name, *t, "x", x);
    check_numel(op, name, *t, rows);
  }
  BATON_NEED(eps >= 0, op, "eps must not be negative");
  const auto dev = common_device(op, {&x, &weight, &bias, &y, &mean, &rstd});
  BATON_ON_CUDA(dev, layernorm_forward(x, weight, bias, eps, y, mean, rstd));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::layernorm_forward<T>(x.data<T>(), weight.data<T>(), bias.data<T>(), eps, y.data<T>(),
                              mean.data<T>(), rstd.data<T>(), rows, c);
  });
}

namespace {
void check_layernorm_saved(const char* op, const Tensor& dy, const Tensor& x, const Tensor& mean,
                           const Tensor& rstd) {
  check_float(op, "x", x);
  check_like(op, "dy", dy, "x", x);
  check_same_shape(op, "dy", dy, "x", x);
  for (auto [name, t] : {std::pair{"mean", &mean}, {"rstd", &rstd}}) {
    check_like(op, name, *t, "x", x);
    check_numel(op, name, *t, rows_of(x));
  }
}
}  // namespace

void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "layernorm_backward_input";
  check_layernorm_saved(op, dy, x, mean, rstd);
  const int64_t c = last_dim(op, "x", x);
  check_like(op, "weight", weight, "x", x);
  check_dims(op, "weight", weight, {c});
  check_like(op, "dx", dx, "x", x);
  check_same_shape(op, "dx", dx, "x", x);
  const auto dev = common_device(op, {&dy, &x, &weight, &mean, &rstd, &dx});
  BATON_ON_CUDA(dev, layernorm_backward_input(dy, x, weight, mean, rstd, dx, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::layernorm_backward_input<T>(dy.data<T>(), x.data<T>(), weight.data<T>(), mean.data<T>(),
                                     rstd.data<T>(), dx.data<T>(), rows_of(x), c, accumulate);
  });
}

void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& weight,
                           const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                           Tensor& rstd) {
  const char* op = "add_layernorm_forward";
  check_float(op, "a", a);
  const int64_t c = last_dim(op, "a", a), rows = rows_of(a);
  for (auto [name, t] : {std::pair{"b", &b}, {"s", &s}, {"y", &y}}) {
    check_like(op, name, *t, "a", a);
    check_same_shape(op, name, *t, "a", a);
  }
  for (auto [name, t] : {std::pair{"weight", &weight}, {"bias", &bias}}) {
    check_like(op, name, *t, "a", a);
    check_dims(op, name, *t, {c});
  }
  for (auto [name, t] : {std::pair{"mean", &mean}, {"rstd", &rstd}}) {
    check_like(op, name, *t, "a", a);
    check_numel(op, name, *t, rows);
  }
  BATON_NEED(eps >= 0, op, "eps must not be negative");
  const auto dev = common_device(op, {&a, &b, &weight, &bias, &s, &y, &mean, &rstd});
  BATON_ON_CUDA(dev, add_layernorm_forward(a, b, weight, bias, eps, s, y, mean, rstd));
  on_float(op, a.dtype(), [&]<class T>(T) {
    cpu::add_layernorm_forward<T>(a.data<T>(), b.data<T>(), weight.data<T>(), bias.data<T>(), eps,
                                  s.data<T>(), y.data<T>(), mean.data<T>(), rstd.data<T>(), rows,
                                  c);
  });
}

void add_layernorm_backward_input(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                  Tensor& dx, bool accumulate) {
  const char* op = "add_layernorm_backward_input";
  check_layernorm_saved(op, dy, s, mean, rstd);
  const int64_t c = last_dim(op, "x", s);
  check_like(op, "weight", weight, "x", s);
  check_dims(op, "weight", weight, {c});
  check_like(op, "dx", dx, "x", s);
  check_same_shape(op, "dx", dx, "x", s);
  if (ds.defined()) {
    check_like(op, "ds", ds, "x", s);
    check_same_shape(op, "ds", ds, "x", s);
  }
  const auto dev = common_device(op, {&dy, &s, &weight, &mean, &rstd, &dx});
  BATON_ON_CUDA(dev, add_layernorm_backward_input(dy, ds, s, weight, mean, rstd, dx, accumulate));
  on_float(op, s.dtype(), [&]<class T>(T) {
    cpu::add_layernorm_backward_input<T>(dy.data<T>(), ds.defined() ? ds.data<T>() : nullptr,
                                         s.data<T>(), weight.data<T>(), mean.data<T>(),
                                         rstd.data<T>(), dx.data<T>(), rows_of(s), c, accumulate);
  });
}

void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias,
                               bool accumulate) {
  const char* op = "layernorm_backward_weight";
  check_layernorm_saved(op, dy, x, mean, rstd);
  const int64_t c = last_dim(op, "x", x);
  BATON_NEED(dweight.defined() || dbias.defined(), op, "dweight and dbias are both undefined");
  for (auto [name, t] : {std::pair{"dweight", &dweight}, {"dbias", &dbias}}) {
    if (!t->defined()) continue;
    check_like(op, name, *t, "x", x);
    check_dims(op, name, *t, {c});
  }
  const auto dev = common_device(op, {&dy, &x, &mean, &rstd, &dweight, &dbias});
  BATON_ON_CUDA(dev, layernorm_backward_weight(dy, x, mean, rstd, dweight, dbias, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::layernorm_backward_weight<T>(dy.data<T>(), x.data<T>(), mean.data<T>(), rstd.data<T>(),
                                      dweight.defined() ? dweight.data<T>() : nullptr,
                                      dbias.defined() ? dbias.data<T>() : nullptr, rows_of(x), c,
                                      accumulate);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  check_float(op, "x", x);
  const int64_t c = last_dim(op, "x", x), rows = rows_of(x);
  check_like(op, "weight", weight, "x", x);
  check_dims(op, "weight", weight, {c});
  check_like(op, "y", y, "x", x);
  check_same_shape(op, "y", y, "x", x);
  check_like(op, "rstd", rstd, "x", x);
  check_numel(op, "rstd", rstd, rows);
  BATON_NEED(eps >= 0, op, "eps must not be negative");
  const auto dev = common_device(op, {&x, &weight, &y, &rstd});
  BATON_ON_CUDA(dev, rmsnorm_forward(x, weight, eps, y, rstd));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::rmsnorm_forward<T>(x.data<T>(), weight.data<T>(), eps, y.data<T>(), rstd.data<T>(), rows,
                            c);
  });
}

namespace {
void check_rmsnorm_saved(const char* op, const Tensor& dy, const Tensor& x, const Tensor& rstd) {
  check_float(op, "x", x);
  last_dim(op, "x", x);
  check_like(op, "dy", dy, "x", x);
  check_same_shape(op, "dy", dy, "x", x);
  check_like(op, "rstd", rstd, "x", x);
  check_numel(op, "rstd", rstd, rows_of(x));
}
}  // namespace

void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "rmsnorm_backward_input";
  check_rmsnorm_saved(op, dy, x, rstd);
  const int64_t c = x.size(-1);
  check_like(op, "weight", weight, "x", x);
  check_dims(op, "weight", weight, {c});
  check_like(op, "dx", dx, "x", x);
  check_same_shape(op, "dx", dx, "x", x);
  const auto dev = common_device(op, {&dy, &x, &weight, &rstd, &dx});
  BATON_ON_CUDA(dev, rmsnorm_backward_input(dy, x, weight, rstd, dx, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::rmsnorm_backward_input<T>(dy.data<T>(), x.data<T>(), weight.data<T>(), rstd.data<T>(),
                                   dx.data<T>(), rows_of(x), c, accumulate);
  });
}

void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dweight,
                             bool accumulate) {
  const char* op = "rmsnorm_backward_weight";
  check_rmsnorm_saved(op, dy, x, rstd);
  const int64_t c = x.size(-1);
  check_like(op, "dweight", dweight, "x", x);
  check_dims(op, "dweight", dweight, {c});
  const auto dev = common_device(op, {&dy, &x, &rstd, &dweight});
  BATON_ON_CUDA(dev, rmsnorm_backward_weight(dy, x, rstd, dweight, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::rmsnorm_backward_weight<T>(dy.data<T>(), x.data<T>(), rstd.data<T>(), dweight.data<T>(),
                                    rows_of(x), c, accumulate);
  });
}

void softmax_forward(const Tensor& x, Tensor& y) {
  const char* op = "softmax_forward";
  check_unary(op, x, y);
  last_dim(op, "x", x);
  const auto dev = common_device(op, {&x, &y});
  BATON_ON_CUDA(dev, softmax_forward(x, y));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::softmax_forward<T>(x.data<T>(), y.data<T>(), rows_of(x), x.size(-1));
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool accumulate) {
  const char* op = "softmax_backward";
  check_unary_backward(op, y, dy, dx);
  last_dim(op, "y", y);
  const auto dev = common_device(op, {&y, &dy, &dx});
  BATON_ON_CUDA(dev, softmax_backward(y, dy, dx, accumulate));
  on_float(op, y.dtype(), [&]<class T>(T) {
    cpu::softmax_backward<T>(y.data<T>(), dy.data<T>(), dx.data<T>(), rows_of(y), y.size(-1),
                             accumulate);
  });
}

// ---- attention ----

namespace {
cpu::AttentionShape check_attention(const char* op, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const AttentionOptions& opt) {
  check_float(op, "qkv", qkv);
  BATON_NEED(qkv.dim() == 3, op, "qkv must be [B, T, (H + 2 KV) * D], got " + qkv.str());
  BATON_NEED(opt.heads >= 1, op, "heads must be at least 1, got " + std::to_string(opt.heads));
  const int64_t kv = opt.kv_heads > 0 ? opt.kv_heads : opt.heads;
  const int64_t cols = opt.heads + 2 * kv;
  BATON_NEED(qkv.size(2) % cols == 0, op,
             "qkv's last dimension must be a multiple of heads + 2 * kv_heads = " +
                 std::to_string(cols) + ", got " + qkv.str());
  const cpu::AttentionShape s{qkv.size(0), qkv.size(1), opt.heads, qkv.size(2) / cols, kv};
  BATON_NEED(opt.kv_offset >= -1 && opt.group >= 0, op, "kv_offset or group is negative");
  {
    BATON_NEED(opt.group > 0 || opt.heads % kv == 0, op,
               "heads " + std::to_string(opt.heads) + " must be a multiple of kv_heads " +
                   std::to_string(kv) + " (or give group)");
    const int64_t group = opt.group > 0 ? opt.group : opt.heads / kv;
    const int64_t kv0 = opt.kv_offset >= 0 ? opt.kv_offset : opt.head_offset / group;
    const int64_t first = opt.head_offset / group - kv0;
    const int64_t last = (opt.head_offset + opt.heads - 1) / group - kv0;
    BATON_NEED(first >= 0 && last < kv, op,
               "query heads " + std::to_string(opt.head_offset) + ".. read key/value heads " +
                   std::to_string(first + kv0) + ".." + std::to_string(last + kv0) +
                   " outside the local ones " + std::to_string(kv0) + ".." +
                   std::to_string(kv0 + kv - 1));
  }
  check_like(op, "out", out, "qkv", qkv);
  check_dims(op, "out", out, {s.batch, s.seq, s.heads * s.head_dim});
  check_like(op, "lse", lse, "qkv", qkv);
  check_dims(op, "lse", lse, {s.batch, s.heads, s.seq});
  BATON_NEED(opt.dropout >= 0 && opt.dropout < 1, op,
             "dropout must lie in [0, 1), got " + std::to_string(opt.dropout));
  BATON_NEED(opt.scale.value_or(0) >= 0, op, "scale must not be negative");
  BATON_NEED(opt.batch_offset >= 0 && opt.head_offset >= 0, op, "offsets must not be negative");
  if (opt.global_batch > 0)
    BATON_NEED(opt.batch_offset + s.batch <= opt.global_batch, op,
               "local batch " + std::to_string(s.batch) + " at offset " +
                   std::to_string(opt.batch_offset) + " exceeds global_batch " +
                   std::to_string(opt.global_batch));
  if (opt.global_heads > 0)
    BATON_NEED(opt.head_offset + s.heads <= opt.global_heads, op,
               "local heads " + std::to_string(s.heads) + " at offset " +
                   std::to_string(opt.head_offset) + " exceed global_heads " +
                   std::to_string(opt.global_heads));
  else
    BATON_NEED(opt.head_offset == 0, op, "head_offset without global_heads");
  check_blas_size(op, qkv.size(2));
  return s;
}
}  // namespace

void attention_forward(const Tensor& qkv, const AttentionOptions& opt, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  const auto s = check_attention(op, qkv, out, lse, opt);
  const auto dev = common_device(op, {&qkv, &out, &lse});
  BATON_ON_CUDA(dev, attention_forward(qkv, opt, out, lse));
  on_float(op, qkv.dtype(), [&]<class T>(T) {
    cpu::attention_forward<T>(qkv.data<T>(), out.data<T>(), lse.data<T>(), s, opt);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& opt, Tensor& dqkv, bool accumulate) {
  const char* op = "attention_backward";
  const auto s = check_attention(op, qkv, out, lse, opt);
  check_like(op, "dout", dout, "qkv", qkv);
  check_same_shape(op, "dout", dout, "out", out);
  check_like(op, "dqkv", dqkv, "qkv", qkv);
  check_same_shape(op, "dqkv", dqkv, "qkv", qkv);
  const auto dev = common_device(op, {&qkv, &out, &lse, &dout, &dqkv});
  BATON_ON_CUDA(dev, attention_backward(qkv, out, lse, dout, opt, dqkv, accumulate));
  on_float(op, qkv.dtype(), [&]<class T>(T) {
    cpu::attention_backward<T>(qkv.data<T>(), out.data<T>(), lse.data<T>(), dout.data<T>(),
                               dqkv.data<T>(), s, opt, accumulate);
  });
}

// ---- rotary position embeddings ----

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& sc) {
  const char* op = "rope_inv_freq";
  BATON_NEED(head_dim >= 2 && head_dim % 2 == 0, op,
             "head_dim must be even and positive, got " + std::to_string(head_dim));
  BATON_NEED(theta > 0, op, "theta must be positive");
  BATON_NEED(sc.factor > 0, op, "rope_scaling factor must be positive");
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
  if (sc.kind == RopeScaling::Kind::linear) {
    for (double& v : f) v /= sc.factor;
  } else if (sc.kind == RopeScaling::Kind::llama3) {
    BATON_NEED(sc.high_freq_factor > sc.low_freq_factor && sc.low_freq_factor > 0, op,
               "llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    const double old_len = sc.original_max_position_embeddings;
    const double low_wavelen = old_len / sc.low_freq_factor;
    const double high_wavelen = old_len / sc.high_freq_factor;
    const double pi = 3.14159265358979323846;
    for (double& v : f) {
      const double wavelen = 2 * pi / v;
      if (wavelen > low_wavelen) {
        v /= sc.factor;                      // low frequencies: scaled
      } else if (wavelen >= high_wavelen) {  // between: a smooth blend
        const double smooth =
            (old_len / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
        v = (1 - smooth) * v / sc.factor + smooth * v;
      }  // high frequencies: kept
    }
  }
  return f;
}

namespace {
cpu::RotaryShape check_rotary(const char* op, const Tensor& x, const char* dst_name,
                              const Tensor& dst, int64_t dst_col, const RotaryOptions& opt) {
  check_float(op, "x", x);
  BATON_NEED(x.dim() == 3, op, "x must be [B, T, heads * D], got " + x.str());
  BATON_NEED(opt.heads >= 1 && x.size(2) % opt.heads == 0, op,
             "x's last dimension must be a multiple of heads = " + std::to_string(opt.heads) +
                 ", got " + x.str());
  const int64_t d = x.size(2) / opt.heads;
  BATON_NEED(d % 2 == 0, op, "the head size must be even, got " + std::to_string(d));
  BATON_NEED(opt.inv_freq != nullptr && int64_t(opt.inv_freq->size()) == d / 2, op,
             "inv_freq must hold head_dim / 2 = " + std::to_string(d / 2) + " values");
  check_like(op, dst_name, dst, "x", x);
  BATON_NEED(dst.dim() == 3 && dst.size(0) == x.size(0) && dst.size(1) == x.size(1) &&
                 dst_col >= 0 && dst_col + x.size(2) <= dst.size(2),
             op,
             std::string(dst_name) + " " + dst.str() + " must be [B, T, C] holding columns " +
                 std::to_string(dst_col) + ".." + std::to_string(dst_col + x.size(2)) +
                 " beside x " + x.str());
  BATON_NEED(opt.position_offset >= 0, op, "position_offset must not be negative");
  BATON_NEED(!overlaps(x, dst), op, "x and the fused tensor overlap");
  return cpu::RotaryShape{x.size(0), x.size(1), opt.heads, d, dst.size(2), dst_col};
}
}  // namespace

void rotary_forward(const Tensor& x, const RotaryOptions& opt, Tensor& dst, int64_t dst_col) {
  const char* op = "rotary_forward";
  const auto s = check_rotary(op, x, "dst", dst, dst_col, opt);
  const auto dev = common_device(op, {&x, &dst});
  BATON_ON_CUDA(dev, rotary_forward(x, opt, dst, dst_col));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::rotary_forward<T>(x.data<T>(), dst.data<T>(), s, opt.inv_freq->data(),
                           opt.position_offset);
  });
}

void rotary_backward(const Tensor& ddst, int64_t dst_col, const RotaryOptions& opt, Tensor& dx,
                     bool accumulate) {
  const char* op = "rotary_backward";
  const auto s = check_rotary(op, dx, "ddst", ddst, dst_col, opt);
  const auto dev = common_device(op, {&ddst, &dx});
  BATON_ON_CUDA(dev, rotary_backward(ddst, dst_col, opt, dx, accumulate));
  on_float(op, dx.dtype(), [&]<class T>(T) {
    cpu::rotary_backward<T>(ddst.data<T>(), dx.data<T>(), s, opt.inv_freq->data(),
                            opt.position_offset, accumulate);
  });
}

// ---- embedding ----

void embedding_forward(const Tensor& ids, const Tensor& table, int64_t row_offset, Tensor& out,
                       bool accumulate) {
  const char* op = "embedding_forward";
  check_ids(op, "ids", ids);
  check_float(op, "table", table);
  BATON_NEED(table.dim() == 2, op, "table must be [rows, C], got " + table.str());
  check_like(op, "out", out, "table", table);
  check_leading_then(op, "out", out, "ids", ids, 0, {table.size(1)});
  const auto dev = common_device(op, {&ids, &table, &out});
  BATON_ON_CUDA(dev, embedding_forward(ids, table, row_offset, out, accumulate));
  on_float(op, table.dtype(), [&]<class T>(T) {
    on_index(op, ids.dtype(), [&]<class I>(I) {
      cpu::embedding_forward<T, I>(ids.data<I>(), table.data<T>(), table.size(0), row_offset,
                                   out.data<T>(), ids.numel(), table.size(1), accumulate);
    });
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t row_offset, Tensor& dtable,
                        int64_t padding_idx) {
  const char* op = "embedding_backward";
  check_ids(op, "ids", ids);
  check_float(op, "dtable", dtable);
  BATON_NEED(dtable.dim() == 2, op, "dtable must be [rows, C], got " + dtable.str());
  check_like(op, "dout", dout, "dtable", dtable);
  check_leading_then(op, "dout", dout, "ids", ids, 0, {dtable.size(1)});
  const auto dev = common_device(op, {&ids, &dout, &dtable});
  BATON_ON_CUDA(dev, embedding_backward(ids, dout, row_offset, dtable, padding_idx));
  on_float(op, dtable.dtype(), [&]<class T>(T) {
    on_index(op, ids.dtype(), [&]<class I>(I) {
      cpu::embedding_backward<T, I>(ids.data<I>(), dout.data<T>(), dtable.size(0), row_offset,
                                    dtable.data<T>(), ids.numel(), dtable.size(1), padding_idx);
    });
  });
}

// ---- cross-entropy ----

namespace {
// logits [..., V]; every per-row tensor has one element per row.
int64_t check_ce(const char* op, const Tensor& logits,
                 std::initializer_list<std::pair<const char*, const Tensor*>> per_row) {
  check_float(op, "logits", logits);
  last_dim(op, "logits", logits);
  const int64_t rows = rows_of(logits);
  for (auto [name, t] : per_row) {
    if (std::string_view(name) == "targets")
      check_ids(op, name, *t);
    else
      check_like(op, name, *t, "logits", logits);
    check_numel(op, name, *t, rows);
  }
  return rows;
}
}  // namespace

void ce_row_max(const Tensor& logits, Tensor& row_max) {
  const char* op = "ce_row_max";
  const int64_t rows = check_ce(op, logits, {{"row_max", &row_max}});
  const auto dev = common_device(op, {&logits, &row_max});
  BATON_ON_CUDA(dev, ce_row_max(logits, row_max));
  on_float(op, logits.dtype(), [&]<class T>(T) {
    cpu::ce_row_max<T>(logits.data<T>(), row_max.data<T>(), rows, logits.size(-1));
  });
}

void ce_sum_exp(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "ce_sum_exp";
  const int64_t rows = check_ce(op, logits,
                                {{"targets", &targets},
                                 {"row_max", &row_max},
                                 {"sum_exp", &sum_exp},
                                 {"target_logit", &target_logit}});
  const auto dev = common_device(op, {&logits, &targets, &row_max, &sum_exp, &target_logit});
  BATON_ON_CUDA(dev, ce_sum_exp(logits, targets, vocab_offset, row_max, sum_exp, target_logit));
  on_float(op, logits.dtype(), [&]<class T>(T) {
    on_index(op, targets.dtype(), [&]<class I>(I) {
      cpu::ce_sum_exp<T, I>(logits.data<T>(), targets.data<I>(), vocab_offset, row_max.data<T>(),
                            sum_exp.data<T>(), target_logit.data<T>(), rows, logits.size(-1));
    });
  });
}

namespace {
// The losses' optional gradient output: the logits' dtype and shape, written in place or
// apart from them.
void check_dlogits(const char* op, const Tensor& dlogits, const Tensor& logits) {
  if (!dlogits.defined()) return;
  check_like(op, "dlogits", dlogits, "logits", logits);
  check_same_shape(op, "dlogits", dlogits, "logits", logits);
  BATON_NEED(dlogits.raw_data() == logits.raw_data() || !overlaps(dlogits, logits), op,
             "dlogits must be logits itself or not overlap it");
}
}  // namespace

void ce_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
               const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
               double grad_scale, Tensor& losses, Tensor& dlogits) {
  const char* op = "ce_finish";
  const int64_t rows = check_ce(op, logits,
                                {{"targets", &targets},
                                 {"row_max", &row_max},
                                 {"sum_exp", &sum_exp},
                                 {"target_logit", &target_logit},
                                 {"losses", &losses}});
  check_dlogits(op, dlogits, logits);
  const auto dev =
      common_device(op, {&logits, &targets, &row_max, &sum_exp, &target_logit, &losses, &dlogits});
  BATON_ON_CUDA(dev, ce_finish(logits, targets, vocab_offset, row_max, sum_exp, target_logit,
                               grad_scale, losses, dlogits));
  on_float(op, logits.dtype(), [&]<class T>(T) {
    on_index(op, targets.dtype(), [&]<class I>(I) {
      cpu::ce_finish<T, I>(logits.data<T>(), targets.data<I>(), vocab_offset, row_max.data<T>(),
                           sum_exp.data<T>(), target_logit.data<T>(), grad_scale, losses.data<T>(),
                           dlogits.defined() ? dlogits.data<T>() : nullptr, rows, logits.size(-1));
    });
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, double grad_scale,
                           Tensor& losses, Tensor& dlogits) {
  const char* op = "cross_entropy_forward";
  const int64_t rows = check_ce(op, logits, {{"targets", &targets}, {"losses", &losses}});
  check_dlogits(op, dlogits, logits);
  const auto dev = common_device(op, {&logits, &targets, &losses, &dlogits});
  BATON_ON_CUDA(dev, cross_entropy_forward(logits, targets, grad_scale, losses, dlogits));
  // The vocabulary is whole here, so a target past it is a caller's bug, not another
  // rank's column (the sliced steps take it as one): it would give a loss below zero.
  const int64_t vocab = logits.size(-1);
  on_index(op, targets.dtype(), [&]<class I>(I) {
    const I* t = targets.data<I>();
    for (int64_t r = 0; r < rows; ++r)
      BATON_NEED(int64_t(t[r]) < vocab, op,
                 "targets must be below the vocabulary size " + std::to_string(vocab) +
                     " (negative: ignored), found " + std::to_string(int64_t(t[r])) + " at row " +
                     std::to_string(r));
  });
  on_float(op, logits.dtype(), [&]<class T>(T) {
    on_index(op, targets.dtype(), [&]<class I>(I) {
      cpu::cross_entropy_forward<T, I>(
          logits.data<T>(), targets.data<I>(), grad_scale, losses.data<T>(),
          dlogits.defined() ? dlogits.data<T>() : nullptr, rows, logits.size(-1));
    });
  });
}

void loss_sum(const Tensor& losses, double denom, Tensor& out) {
  const char* op = "loss_sum";
  check_float(op, "losses", losses);
  BATON_NEED(out.numel() == 1 && out.dtype() == DType::f64, op,
             "out must be one f64, got " + out.str());
  const auto dev = common_device(op, {&losses, &out});
  BATON_ON_CUDA(dev, loss_sum(losses, denom, out));
  double sum = 0;
  on_float(op, losses.dtype(), [&]<class T>(T) {
    const T* x = losses.contiguous().data<T>();
    for (int64_t i = 0; i < losses.numel(); ++i) sum += double(x[i]);
  });
  out.data<double>()[0] = sum / denom;
}

namespace {
[[noreturn]] void ce_local_no_cuda(const char* op) {
  throw RuntimeError(std::string("kernels::") + op +
                     ": no CUDA kernel yet (run ce_row_max, ce_sum_exp and ce_finish)");
}
}  // namespace

void ce_local_forward(const Tensor& logits, const Tensor& targets, int64_t vocab_offset,
                      double grad_scale, Tensor& local_max, Tensor& local_sum, Tensor& target_logit,
                      Tensor& dlogits) {
  const char* op = "ce_local_forward";
  const int64_t rows = check_ce(op, logits,
                                {{"targets", &targets},
                                 {"local_max", &local_max},
                                 {"local_sum", &local_sum},
                                 {"target_logit", &target_logit}});
  check_dlogits(op, dlogits, logits);
  const auto dev =
      common_device(op, {&logits, &targets, &local_max, &local_sum, &target_logit, &dlogits});
  if (dev.is_cuda()) ce_local_no_cuda(op);
  on_float(op, logits.dtype(), [&]<class T>(T) {
    on_index(op, targets.dtype(), [&]<class I>(I) {
      cpu::ce_local_forward<T, I>(logits.data<T>(), targets.data<I>(), vocab_offset, grad_scale,
                                  local_max.data<T>(), local_sum.data<T>(), target_logit.data<T>(),
                                  dlogits.defined() ? dlogits.data<T>() : nullptr, rows,
                                  logits.size(-1));
    });
  });
}

void ce_local_share(const Tensor& local_max, const Tensor& local_sum, const Tensor& row_max,
                    Tensor& share) {
  const char* op = "ce_local_share";
  check_float(op, "local_max", local_max);
  const int64_t rows = local_max.numel();
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"local_sum", &local_sum},
                         {"row_max", &row_max},
                         {"share", &share}}) {
    check_like(op, name, *t, "local_max", local_max);
    check_numel(op, name, *t, rows);
  }
  const auto dev = common_device(op, {&local_max, &local_sum, &row_max, &share});
  if (dev.is_cuda()) ce_local_no_cuda(op);
  on_float(op, local_max.dtype(), [&]<class T>(T) {
    cpu::ce_local_share<T>(local_max.data<T>(), local_sum.data<T>(), row_max.data<T>(),
                           share.data<T>(), rows);
  });
}

void ce_local_finish(const Tensor& targets, int64_t vocab_offset, const Tensor& local_max,
                     const Tensor& local_sum, const Tensor& row_max, const Tensor& sum_exp,
                     const Tensor& target_logit, double grad_scale, Tensor& losses,
                     Tensor& dlogits) {
  const char* op = "ce_local_finish";
  check_float(op, "local_max", local_max);
  check_ids(op, "targets", targets);
  const int64_t rows = local_max.numel();
  check_numel(op, "targets", targets, rows);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"local_sum", &local_sum},
                         {"row_max", &row_max},
                         {"sum_exp", &sum_exp},
                         {"target_logit", &target_logit},
                         {"losses", &losses}}) {
    check_like(op, name, *t, "local_max", local_max);
    check_numel(op, name, *t, rows);
  }
  int64_t vocab = 0;
  if (dlogits.defined()) {
    check_like(op, "dlogits", dlogits, "local_max", local_max);
    vocab = last_dim(op, "dlogits", dlogits);
    check_numel(op, "dlogits", dlogits, rows * vocab);
  }
  const auto dev = common_device(
      op, {&targets, &local_max, &local_sum, &row_max, &sum_exp, &target_logit, &losses, &dlogits});
  if (dev.is_cuda()) ce_local_no_cuda(op);
  on_float(op, local_max.dtype(), [&]<class T>(T) {
    on_index(op, targets.dtype(), [&]<class I>(I) {
      cpu::ce_local_finish<T, I>(targets.data<I>(), vocab_offset, local_max.data<T>(),
                                 local_sum.data<T>(), row_max.data<T>(), sum_exp.data<T>(),
                                 target_logit.data<T>(), grad_scale, losses.data<T>(),
                                 dlogits.defined() ? dlogits.data<T>() : nullptr, rows, vocab);
    });
  });
}

// ---- random initialisation ----

void random_normal(Tensor& out, double mean, double std, uint64_t seed, uint64_t stream,
                   const Block& where) {
  const char* op = "random_normal";
  check_float(op, "out", out);
  check_block(op, "out", out, where);
  const auto dev = common_device(op, {&out});
  BATON_ON_CUDA(dev, random_normal(out, mean, std, seed, stream, where));
  on_float(op, out.dtype(), [&]<class T>(T) {
    cpu::random_normal<T>(out.data<T>(), mean, std, seed, stream, runs_of(out, where));
  });
}

uint64_t stream_of(std::string_view name) {
  return random::stream_hash(name);
}

// ---- optimizers ----

double sum_squares(const Tensor& t) {
  const char* op = "sum_squares";
  check_float(op, "t", t);
  const auto dev = common_device(op, {&t});
  BATON_ON_CUDA(dev, sum_squares(t));
  return on_float(op, t.dtype(),
                  [&]<class T>(T) { return cpu::sum_squares<T>(t.data<T>(), t.numel()); });
}

std::vector<double> sum_squares_each(const std::vector<Tensor>& ts) {
  const char* op = "sum_squares_each";
  if (ts.empty()) return {};
  const memory::Device dev = ts[0].device();
  for (const Tensor& t : ts) {
    check_float(op, "ts", t);
    BATON_NEED(t.device() == dev, op, "tensors on one device: " + ts[0].str() + " and " + t.str());
  }
  BATON_ON_CUDA(dev, sum_squares_each(ts));
  std::vector<double> out;
  for (const Tensor& t : ts) out.push_back(sum_squares(t));
  return out;
}

Tensor sum_squares_grouped(const std::vector<Tensor>& ts, const std::vector<int>& group,
                           int groups) {
  const char* op = "sum_squares_grouped";
  BATON_NEED(group.size() == ts.size(), op,
             "one group per tensor: " + std::to_string(ts.size()) + " tensors, " +
                 std::to_string(group.size()) + " groups");
  for (int k : group)
    BATON_NEED(k >= 0 && k < groups, op,
               "groups from 0 to " + std::to_string(groups - 1) + ", got " + std::to_string(k));
  if (!ts.empty()) BATON_ON_CUDA(ts[0].device(), sum_squares_grouped(ts, group, groups));
  std::vector<double> by_group(size_t(std::max(groups, 0)), 0.0);
  const std::vector<double> each = sum_squares_each(ts);
  for (size_t k = 0; k < each.size(); ++k) by_group[size_t(group[k])] += each[k];
  double total = 0;
  for (double g : by_group) total += g;
  return Tensor::from_vector(std::vector<double>{total}, {1});
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamW& cfg,
                int64_t step, double grad_scale) {
  const char* op = "adamw_step";
  check_float(op, "param", param);
  for (auto [name, t] : {std::pair{"grad", &grad}, {"m", &m}, {"v", &v}}) {
    check_like(op, name, *t, "param", param);
    check_same_shape(op, name, *t, "param", param);
  }
  BATON_NEED(step >= 1, op, "step counts from 1, got " + std::to_string(step));
  const auto dev = common_device(op, {&param, &grad, &m, &v});
  BATON_ON_CUDA(dev, adamw_step(param, grad, m, v, cfg, step, grad_scale));
  on_float(op, param.dtype(), [&]<class T>(T) {
    cpu::adamw_step<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(),
                       cfg, step, grad_scale);
  });
}

void adamw_step_each(std::vector<AdamWTensors>& ts, const AdamW& cfg, int64_t step,
                     const GradScale& grad_scale) {
  const char* op = "adamw_step_each";
  if (ts.empty()) return;
  const memory::Device dev = ts[0].param.device();
  bool same_device = true;
  for (const AdamWTensors& t : ts) {
    same_device &= t.param.device() == dev;
    if (t.working.defined()) {
      same_device &= t.working.device() == dev;
      BATON_NEED(t.working.numel() == t.param.numel(), op, "working has param's size");
    }
  }
  const Tensor& norm2 = grad_scale.sum_squares;
  if (norm2.defined())
    BATON_NEED(
        norm2.numel() == 1 && norm2.dtype() == memory::DType::f64 && norm2.device() == dev, op,
        "the squared norm must be one f64 element on the tensors' device, got " + norm2.str());
  BATON_NEED(same_device, op, "tensors on one device");
  BATON_ON_CUDA(dev, adamw_step_each(ts, cfg, step, grad_scale));
  double scale = grad_scale.value;
  if (norm2.defined()) {
    const ClipDecision d =
        clip_decision(norm2.to_vector<double>()[0], grad_scale.grad_clip, grad_scale.loss_scale);
    if (!d.apply) return;
    scale = d.grad_scale;
  }
  for (AdamWTensors& t : ts) {
    AdamW c = cfg;
    c.weight_decay = t.weight_decay;
    adamw_step(t.param, t.grad, t.m, t.v, c, step, scale);
    if (t.working.defined()) cast(t.param, t.working);
  }
}

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Sgd& cfg,
              double grad_scale) {
  const char* op = "sgd_step";
  check_float(op, "param", param);
  check_like(op, "grad", grad, "param", param);
  check_same_shape(op, "grad", grad, "param", param);
  if (cfg.momentum != 0) {
    check_like(op, "momentum_buf", momentum_buf, "param", param);
    check_same_shape(op, "momentum_buf", momentum_buf, "param", param);
  }
  const auto dev = common_device(op, {&param, &grad, &momentum_buf});
  BATON_ON_CUDA(dev, sgd_step(param, grad, momentum_buf, cfg, grad_scale));
  on_float(op, param.dtype(), [&]<class T>(T) {
    cpu::sgd_step<T>(param.data<T>(), grad.data<T>(),
                     cfg.momentum != 0 ? momentum_buf.data<T>() : nullptr, param.numel(), cfg,
                     grad_scale);
  });
}

}  // namespace baton::kernels
