// The small-M dense linear's AVX2 path.
// Part of smallm_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "sm_common.h"

namespace {

// ------------------------------------------------------------------ AVX2 path
#if SMALLM_X86
#define SMALLM_AVX2 __attribute__((target("avx2,fma")))

SMALLM_AVX2 inline __m256 load_w8(const float* p) { return _mm256_loadu_ps(p); }
SMALLM_AVX2 inline __m256 load_w8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

SMALLM_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One register block: token rows [m0, m0+MB) x weight rows [n0, n0+NB), full K.
template <int MB, int NB, typename WT>
SMALLM_AVX2 __attribute__((noinline)) void block_avx2(const float* x, int64_t K, const WT* w,
                                                      const float* bias, float* y, int64_t N,
                                                      int64_t m0, int64_t n0, const WT* pf) {
  __m256 acc[MB][NB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_setzero_ps();

  const float* xr = x + m0 * K;
  const WT* wr = w + n0 * K;
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    if (pf && (k & (64 / sizeof(WT) - 1)) == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(pf + j * K + k), _MM_HINT_T1);
    }
    __m256 wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = load_w8(wr + j * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 xv = _mm256_loadu_ps(xr + m * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    for (int j = 0; j < NB; ++j) {
      float s = hsum8(acc[m][j]);
      for (int64_t k = K8; k < K; ++k) s += xr[m * K + k] * load_w_scalar(wr + j * K + k);
      if (bias) s += bias[n0 + j];
      y[(m0 + m) * N + n0 + j] = s;
    }
  }
}

// Weight rows per register block for a given token block size; MB*NB + spare
// registers fits the 16 ymm registers, and every NB divides TILE_N.
template <int MB> struct NBFor;
template <> struct NBFor<1> { static constexpr int value = 12; };
template <> struct NBFor<2> { static constexpr int value = 6; };
template <> struct NBFor<3> { static constexpr int value = 4; };
template <> struct NBFor<4> { static constexpr int value = 3; };
template <> struct NBFor<5> { static constexpr int value = 2; };
template <> struct NBFor<6> { static constexpr int value = 2; };

template <int MB, typename WT>
SMALLM_AVX2 void mblock_avx2(const float* x, int64_t K, const WT* w, const float* bias, float* y,
                             int64_t N, int64_t m0, int64_t n_begin, int64_t n_end, const WT* pf) {
  constexpr int NB = NBFor<MB>::value;
  int64_t n = n_begin;
  // pf: the same rows one tile further on (prefetched into L2 during this pass), or null
  for (; n + NB <= n_end; n += NB)  // no one-stream walk: its rows' horizontal sums cost more than it saves
    block_avx2<MB, NB, WT>(x, K, w, bias, y, N, m0, n, pf ? pf + (n - n_begin) * K : nullptr);
  for (; n < n_end; ++n)
    block_avx2<MB, 1, WT>(x, K, w, bias, y, N, m0, n, pf ? pf + (n - n_begin) * K : nullptr);
}

template <typename WT>
void rows_avx2(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y,
               int64_t N, int64_t n_begin, int64_t n_end) {
  // Split M into ceil(M/6) register blocks of near-equal size (M=7 -> 4+3, 9 -> 5+4, 16 -> 6+5+5).
  const int64_t nblocks = (M + MAX_MB - 1) / MAX_MB;
  for (int64_t t = n_begin; t < n_end; t += TILE_N) {
    const int64_t te = std::min(n_end, t + TILE_N);
    int64_t m0 = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t mb = (M - m0) / (nblocks - b) + (((M - m0) % (nblocks - b)) ? 1 : 0);
      // the first pass over a tile prefetches the next tile (whole rows only)
      const WT* pf = (b == 0 && te + TILE_N <= n_end) ? w + te * K : nullptr;
      switch (mb) {
        case 1: mblock_avx2<1, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
        case 2: mblock_avx2<2, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
        case 3: mblock_avx2<3, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
        case 4: mblock_avx2<4, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
        case 5: mblock_avx2<5, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
        default: mblock_avx2<6, WT>(x, K, w, bias, y, N, m0, t, te, pf); break;
      }
      m0 += mb;
    }
  }
}
#endif  // SMALLM_X86

}  // namespace
