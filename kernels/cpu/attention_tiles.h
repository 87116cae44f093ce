// Register-blocked float micro-kernels for attention's products when the head size is a
// multiple of 16 (a whole number of vectors, kLanes floats each: 16 with AVX-512, 8 with
// AVX2). Attention multiplies small matrices (64 query
// rows, head size 32..128) many times; OpenBLAS spends much of that time packing and
// in call overhead, while here operands are read in place: q/k/v rows straight from the
// strided qkv layout, keys transposed once per head.
//
//   scores_tile:  epilogue(r, n, sum_d A[r][d] Bt[d][nL..(n+1)L))       (S = Q K^T, dP = dO V^T)
//   rows_tile:    C[r][0..LW) (+)= alpha * sum_k A(r, k) B[k][0..LW)  (P V, P^T dO, dS K, dS^T Q)
//
// with L = kLanes<float>. Tile sizes follow the register file: about three quarters of
// the vector registers hold accumulators (24 of AVX-512's 32, 12 of AVX2's 16), the rest
// the loaded operands, so nothing spills.
#pragma once

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cpu/vec_math.h"

namespace baton::kernels::cpu::tiles {

constexpr int64_t kL = kLanes<float>;
constexpr int kAccumulators = kVecRegs * 3 / 4;
constexpr int64_t kScoreCols = 2 * kL;  // columns of a scores tile: two vectors
constexpr int kScoreRows = kAccumulators / 2 >= 8 ? 8 : kAccumulators / 2;  // 8 or 6 rows

// epi(r, n, acc) with acc[c] = sum_{d < depth} A[r * lda + d] * Bt[d * ldb + kL n + c] for
// r < R, n < N (N = 2, or 1 for the last keys of a causal row block): the epilogue stores
// the tile, or what the caller derives from it while it is in registers. Not inlined:
// inlined into its caller beside the other row counts, GCC 12 spilled a B vector to the
// stack and read it back for every FMA (AVX-512; 10-15% of the forward).
template <int R, int N, class Epilogue>
__attribute__((noinline)) void scores_tile(const float* A, int64_t lda, const float* Bt,
                                           int64_t ldb, int64_t depth, const Epilogue& epi) {
  static_assert(N == 1 || N == 2);
  // Unrolled loops over r and n, so that the accumulators live in registers from the
  // start (otherwise GCC zeroes an array on the stack with memset and stores them there
  // at the end).
  vfloat acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int n = 0; n < N; ++n) acc[r][n] = vfloat{};
  for (int64_t d = 0; d < depth; ++d) {
    vfloat b[N];
#pragma GCC unroll 2
    for (int n = 0; n < N; ++n) b[n] = load(Bt + d * ldb + kL * n);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float a = A[r * lda + d];
#pragma GCC unroll 2
      for (int n = 0; n < N; ++n) acc[r][n] += a * b[n];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int n = 0; n < N; ++n) epi(r, n, acc[r][n]);
}

// The plain epilogue: C[r][nL + c] = alpha * acc[c].
struct StoreScaled {
  float alpha;
  float* C;
  int64_t ldc;
  void operator()(int r, int n, vfloat acc) const { store(C + r * ldc + kL * n, acc * alpha); }
};

template <class F, int... I>
inline bool with_count_of(int64_t n, F& f, std::integer_sequence<int, I...>) {
  // Only the term whose I + 1 is n calls f.
  return ((n == I + 1 && (f(std::integral_constant<int, I + 1>{}), true)) || ...);
}

// Calls f(std::integral_constant<int, N>{}) for n = N in 1..8 (a run-time count as the
// compile-time one a tile kernel takes) and returns true; false for any other n.
template <class F>
inline bool with_count_1_to_8(int64_t n, F&& f) {
  return with_count_of(n, f, std::make_integer_sequence<int, 8>{});
}

// scores_tile for any row count 1..kScoreRows, two vectors of columns (one when `one`).
template <class Epilogue>
inline void scores_tile_n(int rows, bool one, const float* A, int64_t lda, const float* Bt,
                          int64_t ldb, int64_t depth, const Epilogue& epi) {
  // Callers pass 1..kScoreRows.
  with_count_1_to_8(rows, [&](auto r) {
    constexpr int R = std::min(decltype(r)::value, kScoreRows);
    if (one)
      scores_tile<R, 1>(A, lda, Bt, ldb, depth, epi);
    else
      scores_tile<R, 2>(A, lda, Bt, ldb, depth, epi);
  });
}

// Rows per rows_tile for W vectors per row: about kAccumulators accumulators, at most 8
// rows (zero_row_tail in attention.cpp relies on that).
template <int W>
constexpr int rows_per_tile() {
  return std::clamp(kAccumulators / W, 1, 8);
}

// The widest column block, in vectors, that rows_product runs at once: a divisor of W
// with at least three rows per tile (each loaded B vector then feeds three FMAs).
template <int W>
constexpr int block_width() {
  int wb = W;
  while (wb > 1 && (W % wb != 0 || kAccumulators / wb < 3)) --wb;
  return wb;
}

// C[r][0..LW) = (accumulate ? C : 0) + alpha_r * sum_{k in [k0, k1)} A[r * ar + k * ak] *
// B[k * ldb + 0..LW), for r < R, alpha_r = row_alpha[r] if RowAlpha, else alpha (chosen
// at compile time, so that the backward's tiles keep the code they had).
template <int W, int R, bool RowAlpha>
inline void rows_tile(const float* A, int64_t ar, int64_t ak, int64_t k0, int64_t k1,
                      const float* B, int64_t ldb, float alpha, float* C, int64_t ldc,
                      bool accumulate, const float* row_alpha) {
  vfloat acc[R][W] = {};
  for (int64_t k = k0; k < k1; ++k) {
    float a[R];
    for (int r = 0; r < R; ++r) a[r] = A[r * ar + k * ak];
    for (int w = 0; w < W; ++w) {
      const vfloat b = load(B + k * ldb + kL * w);
      for (int r = 0; r < R; ++r) acc[r][w] += a[r] * b;
    }
  }
  for (int r = 0; r < R; ++r) {
    const float a = RowAlpha ? row_alpha[r] : alpha;
    for (int w = 0; w < W; ++w) {
      float* c = C + r * ldc + kL * w;
      store(c, accumulate ? load(c) + acc[r][w] * a : acc[r][w] * a);
    }
  }
}

// rows_tile over `rows` rows in tiles, W vectors of columns in blocks of block_width<W>();
// k_range(r0, n) gives the [k0, k1) that rows r0..r0+n-1 need (the causal structure
// makes the rest zero). row_alpha as in rows_tile, when not null.
template <int W, class KRange>
inline void rows_product(int64_t rows, const float* A, int64_t ar, int64_t ak, KRange&& k_range,
                         const float* B, int64_t ldb, float alpha, float* C, int64_t ldc,
                         bool accumulate, const float* row_alpha = nullptr) {
  constexpr int Wb = block_width<W>();
  constexpr int R = rows_per_tile<Wb>();
  auto tile = [&]<int N>(std::integral_constant<int, N>, int64_t r0, int64_t k0, int64_t k1) {
    for (int w0 = 0; w0 < W; w0 += Wb) {
      const float* a = A + r0 * ar;
      float* c = C + r0 * ldc + kL * w0;
      if (row_alpha)
        rows_tile<Wb, N, true>(a, ar, ak, k0, k1, B + kL * w0, ldb, alpha, c, ldc, accumulate,
                               row_alpha + r0);
      else
        rows_tile<Wb, N, false>(a, ar, ak, k0, k1, B + kL * w0, ldb, alpha, c, ldc, accumulate,
                                nullptr);
    }
  };
  int64_t r0 = 0;
  for (; r0 + R <= rows; r0 += R) {
    const auto [k0, k1] = k_range(r0, int64_t(R));
    tile(std::integral_constant<int, R>{}, r0, k0, k1);
  }
  if (r0 == rows) return;
  const int n = int(rows - r0);  // the remaining rows, in one narrower tile
  const auto [k0, k1] = k_range(r0, int64_t(n));
  // n < R <= 8; min(N, R) keeps the instantiations to the row counts a tile can have.
  with_count_1_to_8(n, [&, k0 = k0, k1 = k1](auto rn) {
    tile(std::integral_constant<int, std::min(decltype(rn)::value, R)>{}, r0, k0, k1);
  });
}

#if defined(__AVX512F__)
// GCC 12 reports its own intrinsics' _mm512_undefined_* as uninitialised at -O3.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// out[c * ldo + r] = in[r * ldi + c] for a 16 x 16 block: 64 shuffles instead of 256
// strided scalar moves.
inline void transpose16(const float* in, int64_t ldi, float* out, int64_t ldo) {
  __m512 r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ldi);
  for (int k = 0; k < 8; ++k) {  // pairs of rows, interleaved within 128-bit lanes
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int m = 0; m < 4; ++m) {  // u[4m + x], lane L: rows 4m..4m+3 at column 4L + x
    u[4 * m + 0] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0x44);
    u[4 * m + 1] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0xEE);
    u[4 * m + 2] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0x44);
    u[4 * m + 3] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0xEE);
  }
  for (int x = 0; x < 4; ++x) {  // 4 x 4 transpose of 128-bit lanes
    const __m512 v0 = _mm512_shuffle_f32x4(u[x], u[4 + x], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[x], u[4 + x], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0x88);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0xDD);
    _mm512_storeu_ps(out + (0 + x) * ldo, _mm512_shuffle_f32x4(v0, v2, 0x88));
    _mm512_storeu_ps(out + (4 + x) * ldo, _mm512_shuffle_f32x4(v1, v3, 0x88));
    _mm512_storeu_ps(out + (8 + x) * ldo, _mm512_shuffle_f32x4(v0, v2, 0xDD));
    _mm512_storeu_ps(out + (12 + x) * ldo, _mm512_shuffle_f32x4(v1, v3, 0xDD));
  }
}
#pragma GCC diagnostic pop
constexpr int64_t kTransposeBlock = 16;
inline void transpose_block(const float* in, int64_t ldi, float* out, int64_t ldo) {
  transpose16(in, ldi, out, ldo);
}
#elif defined(__AVX__)
// out[c * ldo + r] = in[r * ldi + c] for an 8 x 8 block, the AVX form of transpose16.
inline void transpose8(const float* in, int64_t ldi, float* out, int64_t ldo) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * ldi);
  for (int k = 0; k < 4; ++k) {  // pairs of rows, interleaved within 128-bit lanes
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int m = 0; m < 2; ++m) {  // u[4m + x]: rows 4m..4m+3 at column x (low), x + 4 (high)
    u[4 * m + 0] = _mm256_shuffle_ps(t[4 * m], t[4 * m + 2], 0x44);
    u[4 * m + 1] = _mm256_shuffle_ps(t[4 * m], t[4 * m + 2], 0xEE);
    u[4 * m + 2] = _mm256_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0x44);
    u[4 * m + 3] = _mm256_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0xEE);
  }
  for (int x = 0; x < 4; ++x) {
    _mm256_storeu_ps(out + x * ldo, _mm256_permute2f128_ps(u[x], u[4 + x], 0x20));
    _mm256_storeu_ps(out + (x + 4) * ldo, _mm256_permute2f128_ps(u[x], u[4 + x], 0x31));
  }
}
constexpr int64_t kTransposeBlock = 8;
inline void transpose_block(const float* in, int64_t ldi, float* out, int64_t ldo) {
  transpose8(in, ldi, out, ldo);
}
#else
constexpr int64_t kTransposeBlock = 0;  // no vector transpose: element by element
inline void transpose_block(const float*, int64_t, float*, int64_t) {}
#endif

// Bt[d][j] = M[j * ld + d] for j < n, zero for n <= j < n_padded: a [n, D] block of
// rows (keys or values of one head, D a multiple of 16) transposed, so scores_tile reads
// columns as vectors.
inline void transpose_rows(const float* M, int64_t ld, int64_t n, int64_t D, float* Bt,
                           int64_t n_padded) {
  for (int64_t d = 0; d < D; ++d) std::fill(Bt + d * n_padded + n, Bt + (d + 1) * n_padded, 0.0f);
  int64_t j0 = 0;
  if constexpr (kTransposeBlock > 0)
    for (; j0 + kTransposeBlock <= n; j0 += kTransposeBlock)
      for (int64_t d0 = 0; d0 < D; d0 += kTransposeBlock)
        transpose_block(M + j0 * ld + d0, ld, Bt + d0 * n_padded + j0, n_padded);
  for (int64_t j = j0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) Bt[d * n_padded + j] = M[j * ld + d];
}

}  // namespace baton::kernels::cpu::tiles
