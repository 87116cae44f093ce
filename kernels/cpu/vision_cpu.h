// The CPU backend of kernels/vision.h: plain functions over contiguous NCHW buffers,
// templated on float and double. kernels/vision.cpp checks the arguments and calls these.
#pragma once

#include <cstdint>

namespace baton::kernels::cpu {

// The geometry of one convolution, every size resolved.
struct ConvGeometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // output channels, kernel
  int64_t oh, ow;      // output
  int64_t sh, sw, pt, pb, pl, pr, dh, dw, groups;
};

// ---- conv_ref.cpp: the naive reference, f32 and f64 ----
template <class T>
void conv2d_forward_ref(const T* x, const T* w, const T* bias, T* y, const ConvGeometry& g);
template <class T>
void conv2d_backward_input_ref(const T* dy, const T* w, T* dx, const ConvGeometry& g,
                               bool accumulate);
// dbias may be null.
template <class T>
void conv2d_backward_weight_ref(const T* dy, const T* x, T* dw, T* dbias, const ConvGeometry& g,
                                bool accumulate);

// ---- conv_onednn.cpp: f32 through oneDNN (primitives cached per geometry and thread) ----
bool have_onednn();
void conv2d_forward_onednn(const float* x, const float* w, const float* bias, float* y,
                           const ConvGeometry& g);
void conv2d_backward_input_onednn(const float* dy, const float* w, float* dx, const ConvGeometry& g,
                                  bool accumulate);
void conv2d_backward_weight_onednn(const float* dy, const float* x, float* dw, float* dbias,
                                   const ConvGeometry& g, bool accumulate);

// ---- batchnorm.cpp: per channel over n images of `plane` elements each ----
template <class T>
void batchnorm_forward_train(const T* x, const T* w, const T* b, double eps, double momentum, T* y,
                             T* mean, T* rstd, T* running_mean, T* running_var, int64_t n,
                             int64_t c, int64_t plane);
template <class T>
void batchnorm_forward_eval(const T* x, const T* w, const T* b, const T* running_mean,
                            const T* running_var, double eps, T* y, int64_t n, int64_t c,
                            int64_t plane);
template <class T>
void batchnorm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                              T* dx, int64_t n, int64_t c, int64_t plane, bool accumulate);
// dw or db may be null.
template <class T>
void batchnorm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                               int64_t n, int64_t c, int64_t plane, bool accumulate);
template <class T>
void batchnorm_backward_input_sums(const T* dy, const T* x, const T* w, const T* mean,
                                   const T* rstd, const T* sum_dy, const T* sum_dy_xhat,
                                   double count, T* dx, int64_t n, int64_t c, int64_t plane,
                                   bool accumulate);

// ---- pool.cpp: over n * c planes ----
struct PoolGeometry {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};
template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolGeometry& g);
template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolGeometry& g,
                        bool accumulate);
void maxpool2d_argmax_rows(const int32_t* argmax, int32_t* out, int64_t n, int64_t width,
                           int64_t first, int64_t rows);
template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolGeometry& g);
template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolGeometry& g, bool accumulate);
template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t planes, int64_t plane);
template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t planes, int64_t plane, bool accumulate);

}  // namespace baton::kernels::cpu
