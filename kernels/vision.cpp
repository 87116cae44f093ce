// Dispatch of kernels/vision.h: checks every argument once, then sends CPU tensors to
// kernels/cpu (oneDNN for f32 convolutions, the reference loops for f64) and CUDA tensors
// to kernels/cuda (convolutions on cuDNN) when the build has it.
#include "kernels/vision.h"

#include <climits>

#include "kernels/cpu/vision_cpu.h"
#include "kernels/detail/check.h"

#ifdef BATON_KERNELS_CUDA
#include "kernels/cuda/vision_cuda.h"
#define BATON_VISION_ON_CUDA(dev, call) \
  if ((dev).is_cuda()) return cuda::call
#else
#define BATON_VISION_ON_CUDA(dev, call) \
  if ((dev).is_cuda()) detail::no_cuda(__func__, dev)
#endif

namespace baton::kernels {

using namespace detail;
using memory::DType;

namespace {
std::string str(int64_t v) {
  return std::to_string(v);
}
}  // namespace

bool built_with_onednn() {
  return cpu::have_onednn();
}

// ---- convolution ----

Conv2dOptions Conv2dOptions::symmetric(int64_t stride_h, int64_t stride_w, int64_t pad_h,
                                       int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                                       int64_t groups) {
  Conv2dOptions o;
  o.stride_h = stride_h;
  o.stride_w = stride_w;
  o.pad_top = o.pad_bottom = pad_h;
  o.pad_left = o.pad_right = pad_w;
  o.dilation_h = dilation_h;
  o.dilation_w = dilation_w;
  o.groups = groups;
  return o;
}

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_before,
                         int64_t pad_after, int64_t dilation) {
  const int64_t span = in + pad_before + pad_after - dilation * (kernel - 1) - 1;
  if (span < 0) return 0;
  return span / stride + 1;
}

namespace {

// x [N, C, H, W] (or its gradient), w [O, C/groups, KH, KW], y [N, O, OH, OW].
cpu::ConvGeometry check_conv(const char* op, const char* xn, const Tensor& x, const char* wn,
                             const Tensor& w, const char* yn, const Tensor& y,
                             const Conv2dOptions& o) {
  check_float(op, xn, x);
  check_like(op, wn, w, xn, x);
  check_like(op, yn, y, xn, x);
  BATON_NEED(x.dim() == 4, op, std::string(xn) + " must be [N, C, H, W], got " + x.str());
  BATON_NEED(w.dim() == 4, op,
             std::string(wn) + " must be [O, C / groups, KH, KW], got " + w.str());
  BATON_NEED(
      o.stride_h >= 1 && o.stride_w >= 1 && o.dilation_h >= 1 && o.dilation_w >= 1 && o.groups >= 1,
      op, "stride, dilation and groups must be at least 1");
  BATON_NEED(o.pad_top >= 0 && o.pad_bottom >= 0 && o.pad_left >= 0 && o.pad_right >= 0, op,
             "padding must not be negative");
  cpu::ConvGeometry g{};
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.o = w.size(0);
  g.kh = w.size(2);
  g.kw = w.size(3);
  g.sh = o.stride_h;
  g.sw = o.stride_w;
  g.pt = o.pad_top;
  g.pb = o.pad_bottom;
  g.pl = o.pad_left;
  g.pr = o.pad_right;
  g.dh = o.dilation_h;
  g.dw = o.dilation_w;
  g.groups = o.groups;
  BATON_NEED(g.c % g.groups == 0 && g.o % g.groups == 0, op,
             "groups " + str(g.groups) + " must divide the input channels of " + x.str() +
                 " and the output channels of " + w.str());
  BATON_NEED(w.size(1) == g.c / g.groups, op,
             std::string(wn) + " " + w.str() + " must have C / groups = " + str(g.c / g.groups) +
                 " input channels (" + xn + " " + x.str() + ", groups " + str(g.groups) + ")");
  g.oh = conv_output_size(g.h, g.kh, g.sh, g.pt, g.pb, g.dh);
  g.ow = conv_output_size(g.w, g.kw, g.sw, g.pl, g.pr, g.dw);
  BATON_NEED(g.oh >= 1 && g.ow >= 1, op,
             "the kernel of " + w.str() + " (dilation " + str(g.dh) + "x" + str(g.dw) +
                 ") does not fit the padded image " + x.str());
  check_dims(op, yn, y, {g.n, g.o, g.oh, g.ow});
  BATON_NEED(x.numel() < INT_MAX && y.numel() < INT_MAX, op,
             "tensors of 2^31 elements or more are not supported");
  return g;
}

void check_bias(const char* op, const char* name, const Tensor& b, const Tensor& like,
                int64_t channels) {
  if (!b.defined()) return;
  check_like(op, name, b, "x", like);
  check_dims(op, name, b, {channels});
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                    Tensor& y) {
  const char* op = "conv2d_forward";
  const auto g = check_conv(op, "x", x, "w", w, "y", y, o);
  check_bias(op, "bias", bias, x, g.o);
  BATON_NEED(!overlaps(y, x) && !overlaps(y, w), op, "y must not overlap x or w");
  const auto dev = common_device(op, {&x, &w, &bias, &y});
  BATON_VISION_ON_CUDA(dev, conv2d_forward(x, w, bias, o, y));
  const bool b = bias.defined();
  if (x.dtype() == DType::f32)
    return cpu::conv2d_forward_onednn(x.data<float>(), w.data<float>(),
                                      b ? bias.data<float>() : nullptr, y.data<float>(), g);
  cpu::conv2d_forward_ref<double>(x.data<double>(), w.data<double>(),
                                  b ? bias.data<double>() : nullptr, y.data<double>(), g);
}

void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Conv2dOptions& o, Tensor& dx,
                           bool accumulate) {
  const char* op = "conv2d_backward_input";
  const auto g = check_conv(op, "dx", dx, "w", w, "dy", dy, o);
  BATON_NEED(!overlaps(dx, dy) && !overlaps(dx, w), op, "dx must not overlap dy or w");
  const auto dev = common_device(op, {&dy, &w, &dx});
  BATON_VISION_ON_CUDA(dev, conv2d_backward_input(dy, w, o, dx, accumulate));
  if (dx.dtype() == DType::f32)
    return cpu::conv2d_backward_input_onednn(dy.data<float>(), w.data<float>(), dx.data<float>(), g,
                                             accumulate);
  cpu::conv2d_backward_input_ref<double>(dy.data<double>(), w.data<double>(), dx.data<double>(), g,
                                         accumulate);
}

void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Conv2dOptions& o, Tensor& dw,
                            Tensor& dbias, bool accumulate) {
  const char* op = "conv2d_backward_weight";
  const auto g = check_conv(op, "x", x, "dw", dw, "dy", dy, o);
  check_bias(op, "dbias", dbias, x, g.o);
  BATON_NEED(!overlaps(dw, x) && !overlaps(dw, dy), op, "dw must not overlap x or dy");
  const auto dev = common_device(op, {&dy, &x, &dw, &dbias});
  BATON_VISION_ON_CUDA(dev, conv2d_backward_weight(dy, x, o, dw, dbias, accumulate));
  const bool b = dbias.defined();
  if (x.dtype() == DType::f32)
    return cpu::conv2d_backward_weight_onednn(dy.data<float>(), x.data<float>(), dw.data<float>(),
                                              b ? dbias.data<float>() : nullptr, g, accumulate);
  cpu::conv2d_backward_weight_ref<double>(dy.data<double>(), x.data<double>(), dw.data<double>(),
                                          b ? dbias.data<double>() : nullptr, g, accumulate);
}

// ---- batch normalisation ----

namespace {
struct BnDims {
  int64_t n, c, plane;
};
BnDims check_bn(const char* op, const Tensor& x,
                std::initializer_list<std::pair<const char*, const Tensor*>> per_channel) {
  check_float(op, "x", x);
  BATON_NEED(x.dim() >= 2, op, "x must be [N, C, ...], got " + x.str());
  BnDims d{x.size(0), x.size(1), 1};
  for (int64_t i = 2; i < x.dim(); ++i) d.plane *= x.size(i);
  for (auto [name, t] : per_channel) {
    if (!t->defined()) continue;
    check_like(op, name, *t, "x", x);
    check_dims(op, name, *t, {d.c});
  }
  return d;
}
template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
}  // namespace

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             double momentum, Tensor& y, Tensor& mean, Tensor& rstd,
                             Tensor& running_mean, Tensor& running_var) {
  const char* op = "batchnorm_forward_train";
  BATON_NEED(weight.defined() && bias.defined() && mean.defined() && rstd.defined(), op,
             "weight, bias, mean and rstd are required");
  BATON_NEED(running_mean.defined() == running_var.defined(), op,
             "running_mean and running_var come together");
  const auto d = check_bn(op, x,
                          {{"weight", &weight},
                           {"bias", &bias},
                           {"mean", &mean},
                           {"rstd", &rstd},
                           {"running_mean", &running_mean},
                           {"running_var", &running_var}});
  check_like(op, "y", y, "x", x);
  check_same_shape(op, "y", y, "x", x);
  BATON_NEED(eps > 0 && momentum >= 0 && momentum <= 1, op,
             "eps must be positive and momentum in [0, 1]");
  BATON_NEED(d.n * d.plane > 0, op, "x " + x.str() + " has no elements per channel");
  const auto dev =
      common_device(op, {&x, &weight, &bias, &y, &mean, &rstd, &running_mean, &running_var});
  BATON_VISION_ON_CUDA(dev, batchnorm_forward_train(x, weight, bias, eps, momentum, y, mean, rstd,
                                                    running_mean, running_var));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::batchnorm_forward_train<T>(x.data<T>(), weight.data<T>(), bias.data<T>(), eps, momentum,
                                    y.data<T>(), mean.data<T>(), rstd.data<T>(),
                                    ptr<T>(running_mean), ptr<T>(running_var), d.n, d.c, d.plane);
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double eps,
                            Tensor& y) {
  const char* op = "batchnorm_forward_eval";
  BATON_NEED(weight.defined() && bias.defined() && running_mean.defined() && running_var.defined(),
             op, "weight, bias, running_mean and running_var are required");
  const auto d = check_bn(op, x,
                          {{"weight", &weight},
                           {"bias", &bias},
                           {"running_mean", &running_mean},
                           {"running_var", &running_var}});
  check_like(op, "y", y, "x", x);
  check_same_shape(op, "y", y, "x", x);
  BATON_NEED(eps > 0, op, "eps must be positive");
  const auto dev = common_device(op, {&x, &weight, &bias, &running_mean, &running_var, &y});
  BATON_VISION_ON_CUDA(dev,
                       batchnorm_forward_eval(x, weight, bias, running_mean, running_var, eps, y));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::batchnorm_forward_eval<T>(x.data<T>(), weight.data<T>(), bias.data<T>(),
                                   running_mean.data<T>(), running_var.data<T>(), eps, y.data<T>(),
                                   d.n, d.c, d.plane);
  });
}

void batchnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate) {
  const char* op = "batchnorm_backward_input";
  BATON_NEED(weight.defined() && mean.defined() && rstd.defined(), op,
             "weight, mean and rstd are required");
  const auto d = check_bn(op, x, {{"weight", &weight}, {"mean", &mean}, {"rstd", &rstd}});
  for (auto [name, t] : {std::pair{"dy", &dy}, {"dx", &dx}}) {
    check_like(op, name, *t, "x", x);
    check_same_shape(op, name, *t, "x", x);
  }
  const auto dev = common_device(op, {&dy, &x, &weight, &mean, &rstd, &dx});
  BATON_VISION_ON_CUDA(dev, batchnorm_backward_input(dy, x, weight, mean, rstd, dx, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::batchnorm_backward_input<T>(dy.data<T>(), x.data<T>(), weight.data<T>(), mean.data<T>(),
                                     rstd.data<T>(), dx.data<T>(), d.n, d.c, d.plane, accumulate);
  });
}

void batchnorm_backward_input_sums(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xhat, double count, Tensor& dx,
                                   bool accumulate) {
  const char* op = "batchnorm_backward_input_sums";
  BATON_NEED(count > 0, op, "count must be positive");
  const auto d = check_bn(op, x,
                          {{"weight", &weight},
                           {"mean", &mean},
                           {"rstd", &rstd},
                           {"sum_dy", &sum_dy},
                           {"sum_dy_xhat", &sum_dy_xhat}});
  for (auto [name, t] : {std::pair{"dy", &dy}, {"dx", &dx}}) {
    check_like(op, name, *t, "x", x);
    check_same_shape(op, name, *t, "x", x);
  }
  const auto dev = common_device(op, {&dy, &x, &weight, &mean, &rstd, &sum_dy, &sum_dy_xhat, &dx});
  BATON_VISION_ON_CUDA(dev, batchnorm_backward_input_sums(dy, x, weight, mean, rstd, sum_dy,
                                                          sum_dy_xhat, count, dx, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::batchnorm_backward_input_sums<T>(dy.data<T>(), x.data<T>(), weight.data<T>(),
                                          mean.data<T>(), rstd.data<T>(), sum_dy.data<T>(),
                                          sum_dy_xhat.data<T>(), count, dx.data<T>(), d.n, d.c,
                                          d.plane, accumulate);
  });
}

void batchnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias,
                               bool accumulate) {
  const char* op = "batchnorm_backward_weight";
  BATON_NEED(mean.defined() && rstd.defined(), op, "mean and rstd are required");
  BATON_NEED(dweight.defined() || dbias.defined(), op, "dweight and dbias are both undefined");
  const auto d =
      check_bn(op, x, {{"mean", &mean}, {"rstd", &rstd}, {"dweight", &dweight}, {"dbias", &dbias}});
  check_like(op, "dy", dy, "x", x);
  check_same_shape(op, "dy", dy, "x", x);
  const auto dev = common_device(op, {&dy, &x, &mean, &rstd, &dweight, &dbias});
  BATON_VISION_ON_CUDA(dev,
                       batchnorm_backward_weight(dy, x, mean, rstd, dweight, dbias, accumulate));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::batchnorm_backward_weight<T>(dy.data<T>(), x.data<T>(), mean.data<T>(), rstd.data<T>(),
                                      ptr<T>(dweight), ptr<T>(dbias), d.n, d.c, d.plane,
                                      accumulate);
  });
}

// ---- pooling ----

namespace {
cpu::PoolGeometry check_pool(const char* op, const char* xn, const Tensor& x, const char* yn,
                             const Tensor& y, const Pool2dOptions& o) {
  check_float(op, xn, x);
  check_like(op, yn, y, xn, x);
  BATON_NEED(x.dim() == 4, op, std::string(xn) + " must be [N, C, H, W], got " + x.str());
  BATON_NEED(o.kernel_h >= 1 && o.kernel_w >= 1 && o.stride_h >= 1 && o.stride_w >= 1, op,
             "kernel and stride must be at least 1");
  BATON_NEED(o.pad_h >= 0 && o.pad_w >= 0 && 2 * o.pad_h <= o.kernel_h && 2 * o.pad_w <= o.kernel_w,
             op,
             "padding must lie in [0, kernel / 2], got " + str(o.pad_h) + "x" + str(o.pad_w) +
                 " for a kernel of " + str(o.kernel_h) + "x" + str(o.kernel_w));
  cpu::PoolGeometry g{};
  g.planes = x.size(0) * x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.kh = o.kernel_h;
  g.kw = o.kernel_w;
  g.sh = o.stride_h;
  g.sw = o.stride_w;
  g.ph = o.pad_h;
  g.pw = o.pad_w;
  g.count_include_pad = o.count_include_pad;
  g.oh = conv_output_size(g.h, g.kh, g.sh, g.ph, g.ph, 1);
  g.ow = conv_output_size(g.w, g.kw, g.sw, g.pw, g.pw, 1);
  BATON_NEED(g.oh >= 1 && g.ow >= 1, op,
             "a window of " + str(g.kh) + "x" + str(g.kw) + " does not fit " + x.str());
  check_dims(op, yn, y, {x.size(0), x.size(1), g.oh, g.ow});
  BATON_NEED(g.h * g.w < INT_MAX, op, "planes of 2^31 elements or more are not supported");
  return g;
}
}  // namespace

void maxpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y, Tensor& argmax) {
  const char* op = "maxpool2d_forward";
  const auto g = check_pool(op, "x", x, "y", y, o);
  check_tensor(op, "argmax", argmax);
  BATON_NEED(argmax.dtype() == DType::i32, op, "argmax must be i32, got " + argmax.str());
  check_same_shape(op, "argmax", argmax, "y", y);
  const auto dev = common_device(op, {&x, &y, &argmax});
  BATON_VISION_ON_CUDA(dev, maxpool2d_forward(x, o, y, argmax));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::maxpool2d_forward<T>(x.data<T>(), y.data<T>(), argmax.data<int32_t>(), g);
  });
}

void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx, bool accumulate) {
  const char* op = "maxpool2d_backward";
  check_float(op, "dy", dy);
  check_like(op, "dx", dx, "dy", dy);
  check_tensor(op, "argmax", argmax);
  BATON_NEED(argmax.dtype() == DType::i32, op, "argmax must be i32, got " + argmax.str());
  check_same_shape(op, "argmax", argmax, "dy", dy);
  BATON_NEED(dy.dim() == 4 && dx.dim() == 4 && dx.size(0) == dy.size(0) && dx.size(1) == dy.size(1),
             op, "dy " + dy.str() + " and dx " + dx.str() + " must be [N, C, *, *] alike");
  cpu::PoolGeometry g{};
  g.planes = dy.size(0) * dy.size(1);
  g.h = dx.size(2);
  g.w = dx.size(3);
  g.oh = dy.size(2);
  g.ow = dy.size(3);
  const auto dev = common_device(op, {&dy, &argmax, &dx});
  BATON_VISION_ON_CUDA(dev, maxpool2d_backward(dy, argmax, dx, accumulate));
  on_float(op, dy.dtype(), [&]<class T>(T) {
    cpu::maxpool2d_backward<T>(dy.data<T>(), argmax.data<int32_t>(), dx.data<T>(), g, accumulate);
  });
}

void maxpool2d_argmax_rows(const Tensor& argmax, int64_t width, int64_t first, int64_t rows,
                           Tensor& out) {
  const char* op = "maxpool2d_argmax_rows";
  check_tensor(op, "argmax", argmax);
  check_tensor(op, "out", out);
  BATON_NEED(argmax.dtype() == DType::i32 && out.dtype() == DType::i32, op,
             "argmax and out must be i32, got " + argmax.str() + " and " + out.str());
  check_same_shape(op, "out", out, "argmax", argmax);
  BATON_NEED(width >= 1 && rows >= 1, op,
             "width and rows must be at least 1, got " + str(width) + " and " + str(rows));
  const auto dev = common_device(op, {&argmax, &out});
  if (!dev.is_cpu()) {
    // A device's argmax through the host: these are the few border rows of a tile.
    Tensor a = argmax.to(memory::Device::cpu());
    Tensor o = Tensor::empty(out.shape(), DType::i32);
    cpu::maxpool2d_argmax_rows(a.data<int32_t>(), o.data<int32_t>(), a.numel(), width, first, rows);
    out.copy_from(o);
    return;
  }
  cpu::maxpool2d_argmax_rows(argmax.data<int32_t>(), out.data<int32_t>(), argmax.numel(), width,
                             first, rows);
}

void avgpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y) {
  const char* op = "avgpool2d_forward";
  const auto g = check_pool(op, "x", x, "y", y, o);
  const auto dev = common_device(op, {&x, &y});
  BATON_VISION_ON_CUDA(dev, avgpool2d_forward(x, o, y));
  on_float(op, x.dtype(),
           [&]<class T>(T) { cpu::avgpool2d_forward<T>(x.data<T>(), y.data<T>(), g); });
}

void avgpool2d_backward(const Tensor& dy, const Pool2dOptions& o, Tensor& dx, bool accumulate) {
  const char* op = "avgpool2d_backward";
  const auto g = check_pool(op, "dx", dx, "dy", dy, o);
  const auto dev = common_device(op, {&dy, &dx});
  BATON_VISION_ON_CUDA(dev, avgpool2d_backward(dy, o, dx, accumulate));
  on_float(op, dx.dtype(), [&]<class T>(T) {
    cpu::avgpool2d_backward<T>(dy.data<T>(), dx.data<T>(), g, accumulate);
  });
}

void global_avgpool_forward(const Tensor& x, Tensor& y) {
  const char* op = "global_avgpool_forward";
  check_float(op, "x", x);
  check_like(op, "y", y, "x", x);
  BATON_NEED(x.dim() == 4, op, "x must be [N, C, H, W], got " + x.str());
  check_dims(op, "y", y, {x.size(0), x.size(1)});
  const auto dev = common_device(op, {&x, &y});
  BATON_VISION_ON_CUDA(dev, global_avgpool_forward(x, y));
  on_float(op, x.dtype(), [&]<class T>(T) {
    cpu::global_avgpool_forward<T>(x.data<T>(), y.data<T>(), x.size(0) * x.size(1),
                                   x.size(2) * x.size(3));
  });
}

void global_avgpool_backward(const Tensor& dy, Tensor& dx, bool accumulate) {
  const char* op = "global_avgpool_backward";
  check_float(op, "dx", dx);
  check_like(op, "dy", dy, "dx", dx);
  BATON_NEED(dx.dim() == 4, op, "dx must be [N, C, H, W], got " + dx.str());
  check_dims(op, "dy", dy, {dx.size(0), dx.size(1)});
  const auto dev = common_device(op, {&dy, &dx});
  BATON_VISION_ON_CUDA(dev, global_avgpool_backward(dy, dx, accumulate));
  on_float(op, dx.dtype(), [&]<class T>(T) {
    cpu::global_avgpool_backward<T>(dy.data<T>(), dx.data<T>(), dx.size(0) * dx.size(1),
                                    dx.size(2) * dx.size(3), accumulate);
  });
}

}  // namespace baton::kernels
