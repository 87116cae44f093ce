// The naive 2-D convolution: the definition as loops, in f32 and f64. It is what f64
// models (the finite-difference checks) compute with and what the tests compare oneDNN's
// f32 results against. Each output (forward), input image (data gradient) or output
// channel (weight gradient) is one task, so results do not depend on the thread count.
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vision_cpu.h"

namespace baton::kernels::cpu {

template <class T>
void conv2d_forward_ref(const T* x, const T* w, const T* bias, T* y, const ConvGeometry& g) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  parallel_tasks(g.n * g.o, [&](int64_t task) {
    const int64_t n = task / g.o, o = task % g.o, c0 = (o / og) * cg;
    T* out = y + task * g.oh * g.ow;
    for (int64_t i = 0; i < g.oh; ++i)
      for (int64_t j = 0; j < g.ow; ++j) {
        T acc = bias != nullptr ? bias[o] : T(0);
        for (int64_t c = 0; c < cg; ++c) {
          const T* img = x + (n * g.c + c0 + c) * g.h * g.w;
          const T* ker = w + (o * cg + c) * g.kh * g.kw;
          for (int64_t a = 0; a < g.kh; ++a) {
            const int64_t r = i * g.sh - g.pt + a * g.dh;
            if (r < 0 || r >= g.h) continue;
            for (int64_t b = 0; b < g.kw; ++b) {
              const int64_t s = j * g.sw - g.pl + b * g.dw;
              if (s < 0 || s >= g.w) continue;
              acc += img[r * g.w + s] * ker[a * g.kw + b];
            }
          }
        }
        out[i * g.ow + j] = acc;
      }
  });
}

template <class T>
void conv2d_backward_input_ref(const T* dy, const T* w, T* dx, const ConvGeometry& g,
                               bool accumulate) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  // One task per input plane (n, c): it gathers from the outputs its pixels reach.
  parallel_tasks(g.n * g.c, [&](int64_t task) {
    const int64_t n = task / g.c, c = task % g.c, grp = c / cg, cl = c % cg;
    T* out = dx + task * g.h * g.w;
    if (!accumulate)
      for (int64_t k = 0; k < g.h * g.w; ++k) out[k] = T(0);
    for (int64_t oo = 0; oo < og; ++oo) {
      const int64_t o = grp * og + oo;
      const T* d = dy + (n * g.o + o) * g.oh * g.ow;
      const T* ker = w + (o * cg + cl) * g.kh * g.kw;
      for (int64_t i = 0; i < g.oh; ++i)
        for (int64_t a = 0; a < g.kh; ++a) {
          const int64_t r = i * g.sh - g.pt + a * g.dh;
          if (r < 0 || r >= g.h) continue;
          for (int64_t j = 0; j < g.ow; ++j)
            for (int64_t b = 0; b < g.kw; ++b) {
              const int64_t s = j * g.sw - g.pl + b * g.dw;
              if (s < 0 || s >= g.w) continue;
              out[r * g.w + s] += d[i * g.ow + j] * ker[a * g.kw + b];
            }
        }
    }
  });
}

template <class T>
void conv2d_backward_weight_ref(const T* dy, const T* x, T* dw, T* dbias, const ConvGeometry& g,
                                bool accumulate) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  parallel_tasks(g.o, [&](int64_t o) {
    const int64_t c0 = (o / og) * cg;
    for (int64_t c = 0; c < cg; ++c)
      for (int64_t a = 0; a < g.kh; ++a)
        for (int64_t b = 0; b < g.kw; ++b) {
          T acc = T(0);
          for (int64_t n = 0; n < g.n; ++n) {
            const T* d = dy + (n * g.o + o) * g.oh * g.ow;
            const T* img = x + (n * g.c + c0 + c) * g.h * g.w;
            for (int64_t i = 0; i < g.oh; ++i) {
              const int64_t r = i * g.sh - g.pt + a * g.dh;
              if (r < 0 || r >= g.h) continue;
              for (int64_t j = 0; j < g.ow; ++j) {
                const int64_t s = j * g.sw - g.pl + b * g.dw;
                if (s < 0 || s >= g.w) continue;
                acc += d[i * g.ow + j] * img[r * g.w + s];
              }
            }
          }
          T& slot = dw[((o * cg + c) * g.kh + a) * g.kw + b];
          slot = accumulate ? slot + acc : acc;
        }
    if (dbias != nullptr) {
      T acc = T(0);
      for (int64_t n = 0; n < g.n; ++n) {
        const T* d = dy + (n * g.o + o) * g.oh * g.ow;
        for (int64_t k = 0; k < g.oh * g.ow; ++k) acc += d[k];
      }
      dbias[o] = accumulate ? dbias[o] + acc : acc;
    }
  });
}

#define BATON_INSTANTIATE(T)                                                                     \
  template void conv2d_forward_ref<T>(const T*, const T*, const T*, T*, const ConvGeometry&);    \
  template void conv2d_backward_input_ref<T>(const T*, const T*, T*, const ConvGeometry&, bool); \
  template void conv2d_backward_weight_ref<T>(const T*, const T*, T*, T*, const ConvGeometry&,   \
                                              bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
