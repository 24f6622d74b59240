// The small-M dense linear's AVX-512 paths (fp32 and the AVX512_BF16 dot).
// Part of smallm_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "sm_common.h"

namespace {

// --------------------------------------------------------------- AVX-512 path
#if SMALLM_X86
#define SMALLM_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))
#define SMALLM_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

SMALLM_AVX512 inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
SMALLM_AVX512 inline __m512 load_w16(const float* p) { return _mm512_loadu_ps(p); }
SMALLM_AVX512 inline __m512 load_w16(const uint16_t* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// the first popcount(mask) of 16 elements, zeros after (masked lanes are never read)
SMALLM_AVX512 inline __m512 load_w16_tail(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
SMALLM_AVX512 inline __m512 load_w16_tail(const uint16_t* p, __mmask16 mask) {
  return widen_bf16(_mm256_maskz_loadu_epi16(mask, p));
}

// The sums of the 16 lanes of four accumulators, each by the same fixed tree:
// lane i + lane i+8, then i + i+4, then i + i+2, then i + i+1. A lane's sum never
// depends on the other three accumulators (zeros may pad a group), so the
// result for one (token row, weight row) is the same in every block shape.
SMALLM_AVX512 inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // [a: c0..c7 | b: c0..c7] with c_i = v_i + v_{i+8}
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // [a: d0..d3 | b: d0..d3 | c: d0..d3 | d: d0..d3] with d_i = c_i + c_{i+4}
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  // per 128-bit lane: [d0 + d2, d1 + d3, ...], then [(d0 + d2) + (d1 + d3), ...]
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 s = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, s));
}

// Horizontal sums of a register block's accumulators (+ bias) into y.
template <int MB, int NB>
SMALLM_AVX512 inline void store_block(const __m512 (&acc)[MB][NB], const float* bias, float* y, int64_t N,
                                      int64_t m0, int64_t n0) {
  constexpr int T = MB * NB;
  const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int g = 0; g < T; g += 4) {
    const __m512 a0 = acc[g / NB][g % NB];
    const __m512 a1 = g + 1 < T ? acc[(g + 1) / NB][(g + 1) % NB] : z;
    const __m512 a2 = g + 2 < T ? acc[(g + 2) / NB][(g + 2) % NB] : z;
    const __m512 a3 = g + 3 < T ? acc[(g + 3) / NB][(g + 3) % NB] : z;
    alignas(16) float s[4];
    _mm_store_ps(s, reduce4(a0, a1, a2, a3));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      if (g + i < T) {
        const int m = (g + i) / NB, j = (g + i) % NB;
        y[(m0 + m) * N + n0 + j] = bias ? s[i] + bias[n0 + j] : s[i];
      }
    }
  }
}

// One register block, fp32 x: token rows [m0, m0+MB) x weight rows [n0, n0+NB), full K
// in steps of 16, the K tail with masked (zero-filled) loads.
template <int MB, int NB, typename WT>
SMALLM_AVX512 __attribute__((noinline)) void block_avx512(const float* x, int64_t K, const WT* w,
                                                          const float* bias, float* y, int64_t N,
                                                          int64_t m0, int64_t n0, const WT* pf, int64_t pk0,
                                                          int64_t pk1) {
  __m512 acc[MB][NB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();

  const float* xr = x + m0 * K;
  const WT* wr = w + n0 * K;
  const int64_t K16 = K & ~int64_t(15);
  for (int64_t k = 0; k < K16; k += 16) {
    if (pf && (k & (64 / sizeof(WT) - 1)) == 0 && k >= pk0 && k < pk1) {
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(pf + j * K + k), _MM_HINT_T1);
    }
    __m512 wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = load_w16(wr + j * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_loadu_ps(xr + m * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  if (K16 < K) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - K16)) - 1u);
    __m512 wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = load_w16_tail(wr + j * K + K16, mask);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xr + m * K + K16);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  store_block<MB, NB>(acc, bias, y, N, m0, n0);
}

// One register block in bf16-dot mode: xb is x rounded to bf16, [M, Kp] with Kp a
// multiple of 32 and zeros past K; vdpbf16ps multiplies pairs along K (lane i of
// an accumulator takes elements 2i and 2i+1 of each 32-element step). The K tail
// of the weights is a masked load, so the zero padding never meets stray data.
template <int MB, int NB>
SMALLM_BF16 __attribute__((noinline)) void block_bf16dot(const uint16_t* xb, int64_t Kp, int64_t K,
                                                         const uint16_t* w, const float* bias, float* y,
                                                         int64_t N, int64_t m0, int64_t n0, const uint16_t* pf,
                                                         int64_t pk0, int64_t pk1) {
  __m512 acc[MB][NB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();

  const uint16_t* xr = xb + m0 * Kp;
  const uint16_t* wr = w + n0 * K;
  const int64_t K32 = K & ~int64_t(31);
  for (int64_t k = 0; k < K32; k += 32) {
    if (pf && k >= pk0 && k < pk1) {
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(pf + j * K + k), _MM_HINT_T1);
    }
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(wr + j * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xr + m * Kp + k);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, (__m512bh)wv[j]);
    }
  }
  if (K32 < K) {
    const __mmask32 mask = static_cast<__mmask32>((1u << (K - K32)) - 1u);
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_maskz_loadu_epi16(mask, wr + j * K + K32);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xr + m * Kp + K32);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, (__m512bh)wv[j]);
    }
  }
  store_block<MB, NB>(acc, bias, y, N, m0, n0);
}

// x [M, K] fp32 -> xb [M, Kp] bf16 (round to nearest even), zero-padded to Kp.
SMALLM_BF16 void x_to_bf16(const float* x, int64_t M, int64_t K, int64_t Kp, uint16_t* xb) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    uint16_t* out = xb + m * Kp;
    for (int64_t k = 0; k < Kp; k += 32) {
      const int64_t rem = K - k;
      const __mmask16 lo = rem >= 16 ? __mmask16(0xffff) : rem > 0 ? __mmask16((1u << rem) - 1u) : __mmask16(0);
      const __mmask16 hi = rem >= 32 ? __mmask16(0xffff)
                           : rem > 16 ? __mmask16((1u << (rem - 16)) - 1u)
                                      : __mmask16(0);
      const __m512 a = _mm512_maskz_loadu_ps(lo, xr + k);
      const __m512 b = _mm512_maskz_loadu_ps(hi, xr + k + 16);
      // bf16 elements 0..15 from the second operand, 16..31 from the first
      _mm512_storeu_si512(out + k, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

// Weight rows per register block for a given token block size (fp32 x): MB*NB
// accumulators + min(MB, NB) + 1 fit the 32 zmm registers, and every NB divides
// TILE_N512. Chosen by measurement on Zen 4 (cold bf16 weights, K = 512, 1408 and
// 4096; the differences are mostly within 10-15%): with one or two token rows the
// kernel is bound by memory, where fewer concurrent row streams did better.
template <int MB> struct NB512For;
template <> struct NB512For<1> { static constexpr int value = 3; };
template <> struct NB512For<2> { static constexpr int value = 4; };
template <> struct NB512For<3> { static constexpr int value = 4; };
template <> struct NB512For<4> { static constexpr int value = 6; };
template <> struct NB512For<5> { static constexpr int value = 4; };
template <> struct NB512For<6> { static constexpr int value = 4; };
template <> struct NB512For<7> { static constexpr int value = 3; };
template <> struct NB512For<8> { static constexpr int value = 3; };
// The same for the bf16-dot blocks (64 bytes of each weight row per step).
template <int MB> struct NBDotFor;
template <> struct NBDotFor<1> { static constexpr int value = 8; };
template <> struct NBDotFor<2> { static constexpr int value = 8; };
template <> struct NBDotFor<3> { static constexpr int value = 6; };
template <> struct NBDotFor<4> { static constexpr int value = 4; };
template <> struct NBDotFor<5> { static constexpr int value = 4; };
template <> struct NBDotFor<6> { static constexpr int value = 4; };
template <> struct NBDotFor<7> { static constexpr int value = 3; };
template <> struct NBDotFor<8> { static constexpr int value = 3; };

template <int MB, typename WT>
SMALLM_AVX512 void mblock_avx512(const float* x, int64_t K, const WT* w, const float* bias, float* y,
                                 int64_t N, int64_t m0, int64_t n_begin, int64_t n_end, int64_t pf_rows,
                                 int64_t pf_end, int64_t pk0, int64_t pk1, bool one) {
  constexpr int NB = NB512For<MB>::value;
  int64_t n = n_begin;
  // a block prefetches the rows pf_rows further on (while they are below pf_end); one stream: all by the row loop
  const int64_t blocks_end = one_stream(one, N * K * int64_t(sizeof(WT))) ? n : n_end - (n_end - n) % NB;
  for (; n < blocks_end; n += NB)
    block_avx512<MB, NB, WT>(x, K, w, bias, y, N, m0, n,
                             pf_rows && n + pf_rows + NB <= pf_end ? w + (n + pf_rows) * K : nullptr, pk0, pk1);
  for (; n < n_end; ++n)
    block_avx512<MB, 1, WT>(x, K, w, bias, y, N, m0, n,
                            pf_rows && n + pf_rows + 1 <= pf_end ? w + (n + pf_rows) * K : nullptr, pk0, pk1);
}

template <int MB>
SMALLM_BF16 void mblock_bf16dot(const uint16_t* xb, int64_t Kp, int64_t K, const uint16_t* w, const float* bias,
                                float* y, int64_t N, int64_t m0, int64_t n_begin, int64_t n_end,
                                int64_t pf_rows, int64_t pf_end, int64_t pk0, int64_t pk1, bool one) {
  constexpr int NB = NBDotFor<MB>::value;
  int64_t n = n_begin;
  const int64_t blocks_end = one_stream(one, N * K * 2) ? n : n_end - (n_end - n) % NB;  // one stream: the row loop
  for (; n < blocks_end; n += NB)
    block_bf16dot<MB, NB>(xb, Kp, K, w, bias, y, N, m0, n,
                          pf_rows && n + pf_rows + NB <= pf_end ? w + (n + pf_rows) * K : nullptr, pk0, pk1);
  for (; n < n_end; ++n)
    block_bf16dot<MB, 1>(xb, Kp, K, w, bias, y, N, m0, n,
                         pf_rows && n + pf_rows + 1 <= pf_end ? w + (n + pf_rows) * K : nullptr, pk0, pk1);
}

// Token rows split into ceil(M/8) register blocks of near-equal size (9 -> 5+4, 17 -> 6+6+5).
inline int64_t block_rows(int64_t M, int64_t m0, int64_t b, int64_t nblocks) {
  return (M - m0) / (nblocks - b) + (((M - m0) % (nblocks - b)) ? 1 : 0);
}

template <typename WT>
SMALLM_AVX512 void rows_avx512(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y,
                               int64_t N, int64_t n_begin, int64_t n_end, bool one) {
  const int64_t nblocks = (M + MAX_MB512 - 1) / MAX_MB512;
  for (int64_t t = n_begin; t < n_end; t += TILE_N512) {
    const int64_t te = std::min(n_end, t + TILE_N512);
    int64_t m0 = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t mb = block_rows(M, m0, b, nblocks);
      // every pass prefetches its share of K of the rows pf_rows further on
      const int64_t pf_rows = kSpreadPrefetch || b == 0 ? kPrefetchRows512 : 0;
      const int64_t pk0 = kSpreadPrefetch ? K * b / nblocks : 0, pk1 = kSpreadPrefetch ? K * (b + 1) / nblocks : K;
      switch (mb) {
        case 1: mblock_avx512<1, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 2: mblock_avx512<2, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 3: mblock_avx512<3, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 4: mblock_avx512<4, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 5: mblock_avx512<5, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 6: mblock_avx512<6, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 7: mblock_avx512<7, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        default: mblock_avx512<8, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
      }
      m0 += mb;
    }
  }
}

SMALLM_BF16 void rows_bf16dot(const uint16_t* xb, int64_t Kp, int64_t M, int64_t K, const uint16_t* w,
                              const float* bias, float* y, int64_t N, int64_t n_begin, int64_t n_end, bool one) {
  const int64_t nblocks = (M + MAX_MB512 - 1) / MAX_MB512;
  for (int64_t t = n_begin; t < n_end; t += TILE_N512) {
    const int64_t te = std::min(n_end, t + TILE_N512);
    int64_t m0 = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t mb = block_rows(M, m0, b, nblocks);
      const int64_t pf_rows = kSpreadPrefetch || b == 0 ? kPrefetchRowsDot : 0;
      const int64_t pk0 = kSpreadPrefetch ? K * b / nblocks : 0, pk1 = kSpreadPrefetch ? K * (b + 1) / nblocks : K;
      switch (mb) {
        case 1: mblock_bf16dot<1>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 2: mblock_bf16dot<2>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 3: mblock_bf16dot<3>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 4: mblock_bf16dot<4>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 5: mblock_bf16dot<5>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 6: mblock_bf16dot<6>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        case 7: mblock_bf16dot<7>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
        default: mblock_bf16dot<8>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1, one); break;
      }
      m0 += mb;
    }
  }
}
#endif  // SMALLM_X86

}  // namespace
