// Max, average and global average pooling over the planes of NCHW tensors: one plane per
// task, so the backward scatter of a plane never races with another's and results do not
// depend on the thread count.
#include <algorithm>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vision_cpu.h"

namespace baton::kernels::cpu {

namespace {
template <class F>
void over_planes(const PoolGeometry& g, int64_t cost, F&& f) {
  parallel_for(g.planes, row_grain(cost), [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) f(p);
  });
}
}  // namespace

template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolGeometry& g) {
  over_planes(g, g.oh * g.ow * g.kh * g.kw, [&](int64_t p) {
    const T* in = x + p * g.h * g.w;
    T* out = y + p * g.oh * g.ow;
    int32_t* idx = argmax + p * g.oh * g.ow;
    for (int64_t i = 0; i < g.oh; ++i)
      for (int64_t j = 0; j < g.ow; ++j) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t at = -1;
        for (int64_t a = 0; a < g.kh; ++a) {
          const int64_t r = i * g.sh - g.ph + a;
          if (r < 0 || r >= g.h) continue;
          for (int64_t b = 0; b < g.kw; ++b) {
            const int64_t s = j * g.sw - g.pw + b;
            if (s < 0 || s >= g.w) continue;
            const T v = in[r * g.w + s];
            // NaN propagates (as torch's does): a NaN is taken and never replaced.
            if (at < 0 || v > best || (v != v && best == best)) {
              best = v;
              at = r * g.w + s;
            }
          }
        }
        out[i * g.ow + j] = best;
        idx[i * g.ow + j] = int32_t(at);
      }
  });
}

template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolGeometry& g,
                        bool accumulate) {
  over_planes(g, g.h * g.w + g.oh * g.ow, [&](int64_t p) {
    T* out = dx + p * g.h * g.w;
    if (!accumulate)
      for (int64_t k = 0; k < g.h * g.w; ++k) out[k] = T(0);
    const T* d = dy + p * g.oh * g.ow;
    const int32_t* idx = argmax + p * g.oh * g.ow;
    for (int64_t k = 0; k < g.oh * g.ow; ++k)
      if (idx[k] >= 0) out[idx[k]] += d[k];
  });
}

void maxpool2d_argmax_rows(const int32_t* argmax, int32_t* out, int64_t n, int64_t width,
                           int64_t first, int64_t rows) {
  const int64_t lo = first * width, hi = (first + rows) * width;
  parallel_for(n, row_grain(1), [&](int64_t s, int64_t e) {
    for (int64_t k = s; k < e; ++k) {
      const int64_t a = argmax[k];
      out[k] = a >= 0 && a >= lo && a < hi ? int32_t(a - lo) : -1;
    }
  });
}

namespace {
// The divisor of window (i, j): the whole window, or the part inside the image.
inline int64_t window_count(const PoolGeometry& g, int64_t i, int64_t j) {
  if (g.count_include_pad) {
    // torch counts padding but not the part of a window beyond it.
    const int64_t r0 = i * g.sh - g.ph, s0 = j * g.sw - g.pw;
    const int64_t r1 = std::min(r0 + g.kh, g.h + g.ph), s1 = std::min(s0 + g.kw, g.w + g.pw);
    return (r1 - r0) * (s1 - s0);
  }
  const int64_t r0 = std::max<int64_t>(i * g.sh - g.ph, 0),
                s0 = std::max<int64_t>(j * g.sw - g.pw, 0);
  const int64_t r1 = std::min(i * g.sh - g.ph + g.kh, g.h),
                s1 = std::min(j * g.sw - g.pw + g.kw, g.w);
  return std::max<int64_t>(r1 - r0, 0) * std::max<int64_t>(s1 - s0, 0);
}
}  // namespace

template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolGeometry& g) {
  over_planes(g, g.oh * g.ow * g.kh * g.kw, [&](int64_t p) {
    const T* in = x + p * g.h * g.w;
    T* out = y + p * g.oh * g.ow;
    for (int64_t i = 0; i < g.oh; ++i)
      for (int64_t j = 0; j < g.ow; ++j) {
        T acc = T(0);
        for (int64_t a = 0; a < g.kh; ++a) {
          const int64_t r = i * g.sh - g.ph + a;
          if (r < 0 || r >= g.h) continue;
          for (int64_t b = 0; b < g.kw; ++b) {
            const int64_t s = j * g.sw - g.pw + b;
            if (s >= 0 && s < g.w) acc += in[r * g.w + s];
          }
        }
        const int64_t cnt = window_count(g, i, j);
        out[i * g.ow + j] = cnt > 0 ? acc / T(cnt) : T(0);
      }
  });
}

template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolGeometry& g, bool accumulate) {
  over_planes(g, g.h * g.w + g.oh * g.ow * g.kh * g.kw, [&](int64_t p) {
    T* out = dx + p * g.h * g.w;
    if (!accumulate)
      for (int64_t k = 0; k < g.h * g.w; ++k) out[k] = T(0);
    const T* d = dy + p * g.oh * g.ow;
    for (int64_t i = 0; i < g.oh; ++i)
      for (int64_t j = 0; j < g.ow; ++j) {
        const int64_t cnt = window_count(g, i, j);
        if (cnt <= 0) continue;
        const T v = d[i * g.ow + j] / T(cnt);
        for (int64_t a = 0; a < g.kh; ++a) {
          const int64_t r = i * g.sh - g.ph + a;
          if (r < 0 || r >= g.h) continue;
          for (int64_t b = 0; b < g.kw; ++b) {
            const int64_t s = j * g.sw - g.pw + b;
            if (s >= 0 && s < g.w) out[r * g.w + s] += v;
          }
        }
      }
  });
}

template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t planes, int64_t plane) {
  parallel_for(planes, row_grain(plane), [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      double acc = 0;
      const T* in = x + p * plane;
      for (int64_t k = 0; k < plane; ++k) acc += double(in[k]);
      y[p] = T(acc / double(plane));
    }
  });
}

template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t planes, int64_t plane, bool accumulate) {
  parallel_for(planes, row_grain(plane), [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const T v = T(double(dy[p]) / double(plane));
      T* out = dx + p * plane;
      if (accumulate)
        for (int64_t k = 0; k < plane; ++k) out[k] += v;
      else
        for (int64_t k = 0; k < plane; ++k) out[k] = v;
    }
  });
}

#define BATON_INSTANTIATE(T)                                                                    \
  template void maxpool2d_forward<T>(const T*, T*, int32_t*, const PoolGeometry&);              \
  template void maxpool2d_backward<T>(const T*, const int32_t*, T*, const PoolGeometry&, bool); \
  template void avgpool2d_forward<T>(const T*, T*, const PoolGeometry&);                        \
  template void avgpool2d_backward<T>(const T*, T*, const PoolGeometry&, bool);                 \
  template void global_avgpool_forward<T>(const T*, T*, int64_t, int64_t);                      \
  template void global_avgpool_backward<T>(const T*, T*, int64_t, int64_t, bool);
BATON_INSTANTIATE(float)
BATON_INSTANTIATE(double)
#undef BATON_INSTANTIATE

}  // namespace baton::kernels::cpu
