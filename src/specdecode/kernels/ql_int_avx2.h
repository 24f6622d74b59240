// int8 / int4 (GGUF Q8_0 / Q4_0): the scalar reference walk and the AVX2 walks.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_walk.h"

namespace {

// int8 / int4: every path computes, per (token row m, weight row n), exactly
//   acc = 0; for b in blocks: acc = fma(float(I_b), d_w[n, b] * d_x[m, b], acc);  y = acc + bias[n]
// with I_b the exact integer dot of block b, so the paths agree bit for bit and a row's result
// never depends on the other rows of the batch.

// ------------------------------------------------------------------ scalar
void cols_scalar(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                 int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        int32_t isum = 0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) isum += L.wq(w, n, k) * int32_t(xq[k]);
        const float s = half_to_float(L.scale(w, n, b)) * qx.d[m * qx.nb + b];
        acc = std::fmaf(static_cast<float>(isum), s, acc);
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths)
void group_scalar(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < qx.nb; ++b) {
      int32_t isum[G] = {};
      const int8_t* xb = xq + b * 32;
      if (L.fmt == FMT_Q8) {
        const int8_t* wb = reinterpret_cast<const int8_t*>(grp + b * 512);
        for (int s = 0; s < 8; ++s)
          for (int c = 0; c < G; ++c)
            for (int i = 0; i < 4; ++i) isum[c] += int32_t(wb[s * 64 + c * 4 + i]) * xb[4 * s + i];
      } else {
        const uint8_t* wb = grp + b * 256;
        for (int s = 0; s < 4; ++s)
          for (int c = 0; c < G; ++c)
            for (int i = 0; i < 4; ++i) {
              const uint8_t byte = wb[s * 64 + c * 4 + i];
              isum[c] += (int32_t(byte & 0xf) - 8) * xb[4 * s + i] + (int32_t(byte >> 4) - 8) * xb[16 + 4 * s + i];
            }
      }
      const float dx = qx.d[m * qx.nb + b];
      for (int c = 0; c < G; ++c)
        acc[c] = std::fmaf(static_cast<float>(isum[c]), half_to_float(ws[b * G + c]) * dx, acc[c]);
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86
// ------------------------------------------------------------------ AVX2
// Half a group (8 weight rows, one ymm lane each) for MB token rows. int8: |w| times sign(x, w)
// (maddubs wants one unsigned operand; |w| <= 127 keeps its pair sums in int16), then madd to
// int32. int4: the nibbles are unsigned already: maddubs(v, x), summed in int16 over the block
// (8 steps * 2 * 15 * 127 < 32768), and the -8 * sum(x) correction added once per block.
template <int MB>
__attribute__((target("avx2,fma,f16c"))) void half_avx2(const Layout& L, const QX& qx, int64_t m0,
                                                       const uint8_t* grp, int h, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
  // the next group's same bytes, into L2 (_MM_HINT_T1): DRAM latency wants many lines in flight, and a
  // group (16 rows, 15-80 KB here) fetched into L1 one group ahead evicts the current one (measured:
  // T0 made int8 / int4 steps at the 0.5B shape ~1.15 / 1.5x slower at M = 1, ~1.9 / 1.45x at M = 5)
  const int64_t kPrefetch = G * L.rb;
  if (h == 0)
    for (int64_t o = G * L.qb; o < G * L.qb + 2 * G * nb; o += 64)  // and its scales (the loop fetches quants)
      _mm_prefetch(reinterpret_cast<const char*>(grp + kPrefetch + o), _MM_HINT_T1);
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[MB];
  for (int j = 0; j < MB; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i isum[MB];
    if (L.fmt == FMT_Q8) {
      const uint8_t* wb = grp + b * 512 + h * 32;
      for (int j = 0; j < MB; ++j) isum[j] = _mm256_setzero_si256();
      for (int s = 0; s < 8; ++s) {
        if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetch), _MM_HINT_T1);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int j = 0; j < MB; ++j) {
          int32_t x4;
          std::memcpy(&x4, qx.q.data() + (m0 + j) * Kp + b * 32 + 4 * s, 4);
          const __m256i xv = _mm256_set1_epi32(x4);
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
          isum[j] = _mm256_add_epi32(isum[j], p);
        }
      }
    } else {
      const uint8_t* wb = grp + b * 256 + h * 32;
      __m256i p16[MB];
      for (int j = 0; j < MB; ++j) p16[j] = _mm256_setzero_si256();
      for (int s = 0; s < 4; ++s) {
        if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetch), _MM_HINT_T1);
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        for (int j = 0; j < MB; ++j) {
          const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
          int32_t xl, xh;
          std::memcpy(&xl, xb + 4 * s, 4);
          std::memcpy(&xh, xb + 16 + 4 * s, 4);
          p16[j] = _mm256_add_epi16(p16[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
          p16[j] = _mm256_add_epi16(p16[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
        }
      }
      for (int j = 0; j < MB; ++j)
        isum[j] = _mm256_add_epi32(_mm256_madd_epi16(p16[j], ones), _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]));
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
    for (int j = 0; j < MB; ++j) {
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(qx.d[(m0 + j) * nb + b]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, acc[j]);
    }
  }
  for (int j = 0; j < MB; ++j) _mm256_storeu_ps(out + j * G + h * 8, acc[j]);
}

// One token row (a decode step) against kStreamsAvx2 consecutive groups at once, block by block, each
// stream prefetching kStreamPrefetch bytes ahead (why: groups_vnni's note; one stream keeps too few
// DRAM lines in flight). Only the decode step: 16 ymm registers leave no room for several token rows
// per stream. Each column runs half_avx2<1>'s arithmetic in the same order (bit-identical results).
constexpr int kStreamsAvx2 = 4;

template <int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_avx2_m1(const Layout& L, const QX& qx, const uint8_t* w,
                                                            const float* bias, float* y, int64_t g0) {
  const int64_t nb = qx.nb;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][2];
  for (int i = 0; i < NS; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xb = qx.q.data() + b * 32;
    const __m256 dx = _mm256_set1_ps(qx.d[b]);
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * (L.fmt == FMT_Q8 ? 512 : 256);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), NS * G * L.rb);
      for (int s = 0; s < (L.fmt == FMT_Q8 ? 8 : 4); ++s)
        _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + (NS == 1 ? kOneStreamPrefetch : kStreamPrefetch)),
                     _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = wb0 + h * 32;
        __m256i isum;
        if (L.fmt == FMT_Q8) {
          isum = _mm256_setzero_si256();
          for (int s = 0; s < 8; ++s) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            int32_t x4;
            std::memcpy(&x4, xb + 4 * s, 4);
            const __m256i xv = _mm256_set1_epi32(x4);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)), ones);
            isum = _mm256_add_epi32(isum, p);
          }
        } else {
          __m256i p16 = _mm256_setzero_si256();
          for (int s = 0; s < 4; ++s) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
          }
          isum = _mm256_add_epi32(_mm256_madd_epi16(p16, ones), _mm256_set1_epi32(qx.corr[b]));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[i][h]);
      }
    }
  }
  alignas(32) float out[NS * G];
  for (int i = 0; i < NS; ++i) {
    _mm256_store_ps(out + i * G, acc[i][0]);
    _mm256_store_ps(out + i * G + 8, acc[i][1]);
  }
  write_groups(L, out, 1, NS, 0, 1, g0, bias, y);
}

__attribute__((target("avx2,fma,f16c"))) void group_avx2(const Layout& L, const QX& qx, const uint8_t* w,
                                                        const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  alignas(32) float out[4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    for (int h = 0; h < 2; ++h) {
      switch (mb) {
        case 1: half_avx2<1>(L, qx, m0, grp, h, out); break;
        case 2: half_avx2<2>(L, qx, m0, grp, h, out); break;
        case 3: half_avx2<3>(L, qx, m0, grp, h, out); break;
        default: half_avx2<4>(L, qx, m0, grp, h, out); break;
      }
    }
    write_groups(L, out, 4, 1, m0, mb, g, bias, y);
  }
}

// Five or more token rows of an int8 weight (a verification pass, a prefill) against NS groups side by
// side, block by block, as the decode step reads them (groups_avx2_m1: more DRAM lines in flight),
// with the float sums in an L1 buffer instead of registers: the 16 ymm registers then hold the integer
// sums of a register block of up to 8 token rows besides the weight vector, its |w| and the ones. A
// weight vector is loaded and made |w| once per register block and used by each of its rows; a second
// register block (9-16 rows) rereads the tile from L1. Rows go in walks of kRowsAvx2 over a chunk.
// Measured against group_avx2 (SmolLM2-135M shapes, 30 layers + the head, AVX2 forced, 1 thread, the
// paths interleaved in one process, 6 runs on a shared 2-core EPYC): at 5-16 rows a median ratio of
// ~0.95 (0.87-1.12 per run and row count; identical code read +-10% there), slower at 2-4 rows; for
// int4 group_avx2 was as fast or faster at every row count, also against a tile of both half groups
// sharing each activation broadcast (level), so int4 stays there.
// A per-row floor is the reason the gains are small: AVX2 has no int8 dot-product instruction, so each
// 32 int8 products cost a row 4 vector operations (sign, maddubs, madd, add; int4: 2 per 32), and past
// ~4 rows the pass is bound by that arithmetic, not by the weight stream. Each (row, column) runs
// half_avx2<1>'s arithmetic in the same order, so results are bit-identical to the decode step's.
constexpr int kRowsAvx2 = 16;     // token rows per walk of a chunk of groups (the float buffer)
constexpr int kTileRowsAvx2 = 8;  // token rows per register block
constexpr int kMinRowsQ8Avx2 = 5;  // from this many rows, int8 takes groups_avx2_q8_rows (measured above)

// An empty asm that "changes" v: without it GCC reassociates a register block's integer sums across the
// unrolled steps (all products first, then the adds) and spills most of them to the stack.
#define QL_KEEP(v) asm volatile("" : "+x"(v))

// One block of one half group (8 columns, 32 inputs) for MB token rows; acc[j * G + c] += row j's sum.
template <int MB>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void tile_q8_avx2(const uint8_t* wb, const int8_t* xq,
                                                                                int64_t Kp, const float* dx,
                                                                                int64_t nb, __m256 dw, float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum[MB];
  for (int j = 0; j < MB; ++j) isum[j] = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
    const __m256i aw = _mm256_sign_epi8(wv, wv);
    for (int j = 0; j < MB; ++j) {
      int32_t x4;
      std::memcpy(&x4, xq + j * Kp + 4 * s, 4);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(x4), wv)), ones);
      isum[j] = _mm256_add_epi32(isum[j], p);
      QL_KEEP(isum[j]);
    }
  }
  for (int j = 0; j < MB; ++j) {
    const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(dx[j * nb]));
    _mm256_storeu_ps(acc + j * G, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, _mm256_loadu_ps(acc + j * G)));
  }
}

// One register block of MB token rows (from m0) against ns groups from g0, every block; acc[i][j][c]:
// row m0 + j, column c of group g0 + i. Only the first register block of a chunk prefetches.
template <int MB>
__attribute__((target("avx2,fma,f16c"))) void rows_q8_avx2(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                          int64_t g0, int ns, bool prefetch,
                                                          float (*acc)[kRowsAvx2][G]) {
  const int64_t nb = qx.nb, Kp = qx.Kp;
  const int8_t* xq = qx.q.data() + m0 * Kp;
  const float* dx = qx.d.data() + m0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < ns; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * 512;
      if (prefetch)
        for (int s = 0; s < 8; ++s)
          _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + kStreamPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        tile_q8_avx2<MB>(wb0 + h * 32, xq + b * 32, Kp, dx + b, nb, dw, &acc[i][0][h * 8]);
      }
    }
  }
}

// ns (1..kStreamsAvx2) full groups from g0 of an int8 weight, all token rows
__attribute__((target("avx2,fma,f16c"))) void groups_avx2_q8_rows(const Layout& L, const QX& qx, const uint8_t* w,
                                                                 const float* bias, float* y, int64_t g0, int ns) {
  alignas(32) float acc[kStreamsAvx2][kRowsAvx2][G];
  for (int64_t mc = 0; mc < qx.M; mc += kRowsAvx2) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowsAvx2, qx.M - mc));
    const int nblk = (rows + kTileRowsAvx2 - 1) / kTileRowsAvx2;  // register blocks as even as they come
    std::memset(acc, 0, sizeof(acc));
    for (int k = 0; k < nblk; ++k) {
      const int j0 = k * rows / nblk, mb = (k + 1) * rows / nblk - j0;
      auto* a = reinterpret_cast<float (*)[kRowsAvx2][G]>(&acc[0][j0][0]);
      const bool pf = mc == 0 && k == 0;
      switch (mb) {
        case 1: rows_q8_avx2<1>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 2: rows_q8_avx2<2>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 3: rows_q8_avx2<3>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 4: rows_q8_avx2<4>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 5: rows_q8_avx2<5>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 6: rows_q8_avx2<6>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 7: rows_q8_avx2<7>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        default: rows_q8_avx2<8>(L, qx, mc + j0, w, g0, ns, pf, a); break;
      }
    }
    write_groups(L, &acc[0][0][0], kRowsAvx2, ns, mc, rows, g0, bias, y);
  }
}

// int4, 2-5 token rows (a verification pass): NS groups side by side, both halves per activation broadcast
// (groups_rows_vnni256's walk with maddubs), each row's int16 block sums for both halves in registers.
// Against group_avx2 on an AVX-VNNI Xeon (bench kernel-ab, AVX2 forced, 0.5B-shape matrices, 1 thread):
// 1.13x at 2 rows, 1.10 at 3, 1.08 at 4, 1.06 at 5, 0.98 at 8, 0.93 at 16, so longer passes (prefill) stay
// with group_avx2. Session 24 read a both-halves tile level with group_avx2 on a Zen 4 EPYC.
constexpr int kMaxRowsQ4StreamsAvx2 = 5;
template <int MB, int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_rows_q4_avx2(const Layout& L, const QX& qx, int64_t m0,
                                                                 const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb = grp + b * 256;
      __m256i p16[MB][2];
      for (int j = 0; j < MB; ++j) p16[j][0] = p16[j][1] = _mm256_setzero_si256();
      for (int s = 0; s < 4; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kStreamPrefetch), _MM_HINT_T0);
        const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32));
        const __m256i lo0 = _mm256_and_si256(r0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), low4);
        const __m256i lo1 = _mm256_and_si256(r1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), low4);
        for (int j = 0; j < MB; ++j) {
          const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
          int32_t xl, xh;
          std::memcpy(&xl, xb + 4 * s, 4);
          std::memcpy(&xh, xb + 16 + 4 * s, 4);
          const __m256i xlv = _mm256_set1_epi32(xl), xhv = _mm256_set1_epi32(xh);
          p16[j][0] = _mm256_add_epi16(p16[j][0], _mm256_maddubs_epi16(lo0, xlv));
          p16[j][1] = _mm256_add_epi16(p16[j][1], _mm256_maddubs_epi16(lo1, xlv));
          p16[j][0] = _mm256_add_epi16(p16[j][0], _mm256_maddubs_epi16(hi0, xhv));
          p16[j][1] = _mm256_add_epi16(p16[j][1], _mm256_maddubs_epi16(hi1, xhv));
        }
      }
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G)));
      const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + 8)));
      for (int j = 0; j < MB; ++j) {
        const __m256i corr = _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
        const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
        const __m256i i0 = _mm256_add_epi32(_mm256_madd_epi16(p16[j][0], ones), corr);
        const __m256i i1 = _mm256_add_epi32(_mm256_madd_epi16(p16[j][1], ones), corr);
        acc[i][j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dw0, dx), acc[i][j][0]);
        acc[i][j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dw1, dx), acc[i][j][1]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

template <int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_q4_avx2(const Layout& L, const QX& qx, const uint8_t* w,
                                                            const float* bias, float* y, int64_t g0) {
  alignas(32) float out[NS * 4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    switch (mb) {
      case 1: groups_rows_q4_avx2<1, NS>(L, qx, m0, w, g0, out); break;
      case 2: groups_rows_q4_avx2<2, NS>(L, qx, m0, w, g0, out); break;
      case 3: groups_rows_q4_avx2<3, NS>(L, qx, m0, w, g0, out); break;
      default: groups_rows_q4_avx2<4, NS>(L, qx, m0, w, g0, out); break;
    }
    write_groups(L, out, 4, NS, m0, mb, g0, bias, y);
  }
}

#endif  // QL_X86

}  // namespace
