// The CUDA backend of kernels/vision.h: the same functions for tensors on a CUDA device,
// called by the dispatch in kernels/vision.cpp (which has checked shapes and options).
// Convolutions run on cuDNN's graph API (cudnn_conv.cu; without cuDNN in the build they
// fail naming it); batch normalisation and pooling are kernels of ours (vision.cu).
// Element types: f32, bf16, f16; per-channel tensors (weight, bias, statistics, running
// statistics, their gradients) f32 or the activation type; computation in f32, batch
// statistics summed in double in a fixed order (deterministic, as on the CPU).
#pragma once

#include "kernels/vision.h"

namespace baton::kernels::cuda {

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                    Tensor& y);
void conv2d_backward_input(const Tensor& dy, const Tensor& w, const Conv2dOptions& o, Tensor& dx,
                           bool accumulate);
void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Conv2dOptions& o, Tensor& dw,
                            Tensor& dbias, bool accumulate);

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             double momentum, Tensor& y, Tensor& mean, Tensor& rstd,
                             Tensor& running_mean, Tensor& running_var);
void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double eps,
                            Tensor& y);
void batchnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, bool accumulate);
void batchnorm_backward_input_sums(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xhat, double count, Tensor& dx,
                                   bool accumulate);
void batchnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, Tensor& dweight, Tensor& dbias, bool accumulate);

void maxpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y, Tensor& argmax);
void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx, bool accumulate);
void avgpool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor& y);
void avgpool2d_backward(const Tensor& dy, const Pool2dOptions& o, Tensor& dx, bool accumulate);
void global_avgpool_forward(const Tensor& x, Tensor& y);
void global_avgpool_backward(const Tensor& dy, Tensor& dx, bool accumulate);

// ---- inside the backend (vision.cu calls cudnn_conv.cu) ----
enum class ConvPass { forward, data, filter };
// forward: y = conv(x, w); data: x = the data gradient of y (dy) through w; filter: w =
// the filter gradient from x and y (dy). beta 1 adds into the output, 0 overwrites.
void cudnn_convolution(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                       const Conv2dOptions& o, float beta);
bool cudnn_conv_built();

}  // namespace baton::kernels::cuda
