// Softmax cross-entropy in the three steps of the vocabulary-parallel form: row maxima,
// sums of exponentials and target logits, then losses and (optionally) the gradient,
// written in place over the logits when the caller wants to save the memory; on one
// device all three in one call, one read of the logits and one exp per logit; and the
// vocabulary-parallel form with one read of the local logits (ce_local_*).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu {

// Rows cost about four element-steps per logit (exp and the passes around it).
template <class T>
void ce_row_max(const T* logits, T* row_max, int64_t rows, int64_t vocab) {
  parallel_for(rows, row_grain(4 * vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* l = logits + r * vocab;
      row_max[r] = reduce_max(l, vocab);
    }
  });
}

template <class T, class I>
void ce_sum_exp(const T* logits, const I* targets, int64_t vocab_offset, const T* row_max,
                T* sum_exp, T* target_logit, int64_t rows, int64_t vocab) {
  parallel_for(rows, row_grain(4 * vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* l = logits + r * vocab;
      const T mx = row_max[r];
      sum_exp[r] = exp_shifted_sum(l, mx, vocab);
      const int64_t t = int64_t(targets[r]) - vocab_offset;
      target_logit[r] = targets[r] >= 0 && t >= 0 && t < vocab ? l[t] : T(0);
    }
  });
}

template <class T, class I>
void ce_finish(const T* logits, const I* targets, int64_t vocab_offset, const T* row_max,
               const T* sum_exp, const T* target_logit, double grad_scale, T* losses, T* dlogits,
               int64_t rows, int64_t vocab) {
  parallel_for(rows, row_grain(4 * vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bool ignored = targets[r] < 0;
      const T mx = row_max[r];
      // M - target first, as torch does: they cancel exactly when the target is the max,
      // where log S + M would round log S to M's spacing (1e-3 at logits of 1e4).
      losses[r] = ignored ? T(0) : T(std::log(sum_exp[r])) + (mx - target_logit[r]);
      if (dlogits == nullptr) continue;
      T* d = dlogits + r * vocab;
      if (ignored) {
        std::fill(d, d + vocab, T(0));
        continue;
      }
      const T* l = logits + r * vocab;
      const T scale = T(grad_scale) / sum_exp[r];
      exp_shifted_scaled(l, mx, scale, d, vocab);
      const int64_t t = int64_t(targets[r]) - vocab_offset;
      if (t >= 0 && t < vocab) d[t] -= T(grad_scale);
    }
  });
}

// The target logits are read first (dlogits may be the logits), each row's statistics
// kept as they arrive and its loss's log taken after the row loop (a call to log inside
// it held the loop's next step back: 12% at 256 columns), the one-hot subtracted once
// the row is scaled.
template <class T, class I>
void cross_entropy_forward(const T* logits, const I* targets, double grad_scale, T* losses,
                           T* dlogits, int64_t rows, int64_t vocab) {
  parallel_for(rows, row_grain(4 * vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = int64_t(targets[r]);
      losses[r] = t >= 0 && t < vocab ? logits[r * vocab + t] : T(0);
    }
    // Blocks of rows, each row's max and sum kept on the stack (no allocation per call).
    constexpr int64_t kBlock = 128;
    T stats[2 * kBlock];
    for (int64_t b0 = r0; b0 < r1; b0 += kBlock) {
      const int64_t n = std::min(kBlock, r1 - b0);
      softmax_rows(logits + b0 * vocab, dlogits != nullptr ? dlogits + b0 * vocab : nullptr,
                   T(grad_scale), n, vocab, [&](int64_t i, T mx, T sum) {
                     stats[2 * i] = mx;
                     stats[2 * i + 1] = sum;
                   });
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = b0 + i;
        losses[r] =
            targets[r] < 0 ? T(0) : T(std::log(stats[2 * i + 1])) + (stats[2 * i] - losses[r]);
      }
    }
    if (dlogits == nullptr) return;
    for (int64_t r = r0; r < r1; ++r) {
      T* d = dlogits + r * vocab;
      const int64_t t = int64_t(targets[r]);
      if (t < 0)
        std::fill(d, d + vocab, T(0));
      else if (t < vocab)
        d[t] -= T(grad_scale);
    }
  });
}

// The local part of the vocabulary-parallel form in one read: the target logits first
// (dlogits may be the logits), then softmax's row loop gives each row's local max and sum
// and, with dlogits, grad_scale * exp(l - local max) / local sum.
template <class T, class I>
void ce_local_forward(const T* logits, const I* targets, int64_t vocab_offset, double grad_scale,
                      T* local_max, T* local_sum, T* target_logit, T* dlogits, int64_t rows,
                      int64_t vocab) {
  parallel_for(rows, row_grain(4 * vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = int64_t(targets[r]) - vocab_offset;
      target_logit[r] = targets[r] >= 0 && t >= 0 && t < vocab ? logits[r * vocab + t] : T(0);
    }
    softmax_rows(logits + r0 * vocab, dlogits != nullptr ? dlogits + r0 * vocab : nullptr,
                 T(grad_scale), r1 - r0, vocab, [&](int64_t i, T mx, T sum) {
                   local_max[r0 + i] = mx;
                   local_sum[r0 + i] = sum;
                 });
  });
}

// This rank's share of a row's sum of exponentials against the global max (written in the
// same expression where ce_local_finish needs it again).
template <class T>
inline T ce_share_of(T local_max, T local_sum, T row_max) {
  return local_max == row_max ? local_sum : local_sum * vexp_nonpositive(T(local_max - row_max));
}

template <class T>
void ce_local_share(const T* local_max, const T* local_sum, const T* row_max, T* share,
                    int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) share[r] = ce_share_of(local_max[r], local_sum[r], row_max[r]);
}

template <class T, class I>
void ce_local_finish(const I* targets, int64_t vocab_offset, const T* local_max, const T* local_sum,
                     const T* row_max, const T* sum_exp, const T* target_logit, double grad_scale,
                     T* losses, T* dlogits, int64_t rows, int64_t vocab) {
  parallel_for(rows, row_grain(vocab + 1), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bool ignored = targets[r] < 0;
      losses[r] = ignored ? T(0) : T(std::log(sum_exp[r])) + (row_max[r] - target_logit[r]);
      if (dlogits == nullptr) continue;
      T* d = dlogits + r * vocab;
      if (ignored) {
        std::fill(d, d + vocab, T(0));
        continue;
      }
      // d holds grad_scale * exp(l - local max) / local sum: times this rank's share of
      // the whole sum it is grad_scale * softmax (no rescaling when the share is all).
      const T f = ce_share_of(local_max[r], local_sum[r], row_max[r]) / sum_exp[r];
      if (f != T(1)) {
#pragma GCC ivdep
        for (int64_t c = 0; c < vocab; ++c) d[c] *= f;
      }
      const int64_t t = int64_t(targets[r]) - vocab_offset;
      if (t >= 0 && t < vocab) d[t] -= T(grad_scale);
    }
  });
}

#define BATON_INSTANTIATE_T(T)                                 \
  template void ce_row_max<T>(const T*, T*, int64_t, int64_t); \
  template void ce_local_share<T>(const T*, const T*, const T*, T*, int64_t);
#define BATON_INSTANTIATE(T, I)                                                                    \
  template void ce_sum_exp<T, I>(const T*, const I*, int64_t, const T*, T*, T*, int64_t, int64_t); \
  template void ce_finish<T, I>(const T*, const I*, int64_t, const T*, const T*, const T*, double, \
                                T*, T*, int64_t, int64_t);                                         \
  template void cross_entropy_forward<T, I>(const T*, const I*, double, T*, T*, int64_t, int64_t); \
  template void ce_local_forward<T, I>(const T*, const I*, int64_t, double, T*, T*, T*, T*,        \
                                       int64_t, int64_t);                                          \
  template void ce_local_finish<T, I>(const I*, int64_t, const T*, const T*, const T*, const T*,   \
                                      const T*, double, T*, T*, int64_t, int64_t);
BATON_INSTANTIATE_T(float)
BATON_INSTANTIATE_T(double)
BATON_INSTANTIATE(float, int32_t)
BATON_INSTANTIATE(float, int64_t)
BATON_INSTANTIATE(double, int32_t)
BATON_INSTANTIATE(double, int64_t)
#undef BATON_INSTANTIATE
#undef BATON_INSTANTIATE_T

}  // namespace baton::kernels::cpu
