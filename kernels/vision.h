// The ops of convolutional networks, forward and backward, on tensors of any backend (the
// same conventions as kernels/ops.h: contiguous tensors on one device, caller-allocated
// outputs, `accumulate` adds into the output, std::invalid_argument for bad arguments).
//
// Images are NCHW: x [N, C, H, W]. On the CPU, f32 convolutions run on oneDNN (its
// primitives cached per shape and thread); f64 and the reference the tests compare
// oneDNN with are plain loops (cpu/conv_ref.cpp). Batch normalisation and pooling are
// direct loops in both dtypes (memory-bound; see docs/kernels.md).
#pragma once

#include <cstdint>

#include "memory/tensor.h"

namespace baton::kernels {

using memory::Tensor;

// ---- 2-D convolution ----
// y[n, o, i, j] = bias[o] + sum over c of group(o), kh, kw of
//   x[n, c, i * stride_h - pad_top + kh * dilation_h, j * stride_w - pad_left + kw * dilation_w]
//   * w[o, c - first channel of group(o), kh, kw]
// with zeros outside the image. x: [N, C, H, W], w: [O, C / groups, KH, KW], bias: [O] or
// undefined, y: [N, O, OH, OW]. Padding may differ per side (a spatial tile pads only at the
// image's edges).
struct Conv2dOptions {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  // The same padding on both sides of each dimension.
  static Conv2dOptions symmetric(int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                 int64_t dilation_h, int64_t dilation_w, int64_t groups);
};
// The output size of one dimension: floor((in + pads - dilation (kernel - 1) - 1) / stride) + 1
// (0 or less when the kernel does not fit).
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_before,
                         int64_t pad_after, int64_t dilation);

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                    Tensor& y);
// dx from dy and w (the data gradient, B).
void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Conv2dOptions& o, Tensor& dx,
                           bool accumulate);
// dw (and dbias unless undefined) from dy and x (W).
void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Conv2dOptions& o, Tensor& dw,
                            Tensor& dbias, bool accumulate);

// ---- batch normalisation over N and the spatial dimensions ----
// x: [N, C, ...]; weight, bias, mean, rstd, running_mean, running_var: [C].
// Training: mean and rstd = 1 / sqrt(var + eps) of the batch (biased variance) are written
// for backward; when running_mean and running_var are defined they move towards the batch
// statistics as torch's do: r = (1 - momentum) r + momentum * s, with the unbiased
// variance (var * count / (count - 1), count = N * spatial).
void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             double momentum, Tensor& y, Tensor& mean, Tensor& rstd,
                             Tensor& running_mean, Tensor& running_var);
// Evaluation: the running statistics normalise.
void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double eps,
                            Tensor& y);
// The gradient of the training forward (batch statistics depend on x).
void batchnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate);
// The gradient when the statistics came from a larger batch than x (a spatial tile, or
// replicas synchronising batch norm): sum_dy and sum_dy_xhat [C] are the whole batch's
// sums (batchnorm_backward_weight's dbias and dweight, reduced), count its elements per
// channel.
void batchnorm_backward_input_sums(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xhat, double count, Tensor& dx,
                                   bool accumulate);
// dweight = sum dy * xhat, dbias = sum dy per channel; one of them may be undefined.
void batchnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias, bool accumulate);

// ---- pooling over [N, C, H, W] ----
struct Pool2dOptions {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;   // each side; padding counts as -inf (max) or 0 (average)
  bool count_include_pad = true;  // average: divide by the whole window (torch's default)
};
// argmax: i32 [N, C, OH, OW], the index in the H * W plane of each window's maximum (the
// first one on ties), for backward.
void maxpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y, Tensor& argmax);
void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx, bool accumulate);
// The argmax of max pooling over a strip of rows, re-based onto a plane of `rows` rows of
// the same width whose row 0 is the strip's row `first` (negative when the plane starts
// above the strip): out = argmax - first * W where the maximum lies in the plane, -1
// (which maxpool2d_backward skips) where it does not. argmax and out: i32 of one shape
// [N, C, OH, OW]; `width` the strip's W. The spatial split's pooling uses it for the rows
// it recomputes from the halo (stages/ops/vision.cpp).
void maxpool2d_argmax_rows(const Tensor& argmax, int64_t width, int64_t first, int64_t rows,
                           Tensor& out);
void avgpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y);
void avgpool2d_backward(const Tensor& dy, const Pool2dOptions& o, Tensor& dx, bool accumulate);
// y[n, c] = mean over H, W of x[n, c]: x [N, C, H, W], y [N, C].
void global_avgpool_forward(const Tensor& x, Tensor& y);
void global_avgpool_backward(const Tensor& dy, Tensor& dx, bool accumulate);

// True when this build's f32 CPU convolutions run on oneDNN (otherwise on the reference).
bool built_with_onednn();

}  // namespace baton::kernels
