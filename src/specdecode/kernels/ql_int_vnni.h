// int8 / int4 (GGUF Q8_0 / Q4_0): the AVX-VNNI (256-bit) and AVX-512 VNNI walks.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_walk.h"

namespace {

#if QL_X86
// ------------------------------------------------------------------ AVX-VNNI (256-bit vpdpbusd, VEX)
// The AVX2 layout and register budget (8 columns a ymm, 16 registers) with AVX-VNNI's vpdpbusd, which
// Intel's client cores have since Alder Lake without AVX-512: per 4 inputs and token row one instruction
// (u8 weights times a broadcast of the row's 4 signed activation bytes, summed into int32) where AVX2
// needs maddubs + add (int4; + madd a block) or sign + sign + maddubs + madd + add (int8). As in
// groups_vnni_mb, int8 weights are made unsigned (q ^ 0x80) and int4 nibbles are unsigned already, and a
// block's sum starts at the row's correction (-128 or -8 times its activation sum): the exact integer
// dot the other paths compute, then their float tail in the same order, so the bits are theirs.
#define QL_VNNI256 "avxvnni,avx2,fma,f16c"

// NS groups side by side (groups_vnni_mb's streams), each whole (both halves: 16 columns in two ymm), for
// MB token rows: each broadcast of a row's 4 activation bytes feeds both halves' vpdpbusd, so a
// multiply-add costs half a broadcast load (with one half at a time, AVX2's walk, the broadcasts bound the
// pass: measured v(8) 2.53 against AVX2's 2.75 on SmolLM2 int4, where vpdpbusd halves the arithmetic).
template <int MB, int NS>
__attribute__((target(QL_VNNI256))) void groups_rows_vnni256(const Layout& L, const QX& qx, int64_t m0,
                                                            const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80)), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), NS * G * L.rb);
      __m256i isum[MB][2];
      for (int j = 0; j < MB; ++j) isum[j][0] = isum[j][1] = _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
      if (L.fmt == FMT_Q8) {
        const uint8_t* wb = grp + b * 512;
        for (int s = 0; s < 8; ++s) {
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kStreamPrefetch), _MM_HINT_T0);
          const __m256i w0 =
              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), c128);
          const __m256i w1 =
              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32)), c128);
          for (int j = 0; j < MB; ++j) {
            int32_t x4;
            std::memcpy(&x4, qx.q.data() + (m0 + j) * Kp + b * 32 + 4 * s, 4);
            const __m256i xv = _mm256_set1_epi32(x4);
            isum[j][0] = _mm256_dpbusd_avx_epi32(isum[j][0], w0, xv);
            isum[j][1] = _mm256_dpbusd_avx_epi32(isum[j][1], w1, xv);
          }
        }
      } else {
        const uint8_t* wb = grp + b * 256;
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
            isum[j][0] = _mm256_dpbusd_avx_epi32(isum[j][0], lo0, xlv);
            isum[j][1] = _mm256_dpbusd_avx_epi32(isum[j][1], lo1, xlv);
            isum[j][0] = _mm256_dpbusd_avx_epi32(isum[j][0], hi0, xhv);
            isum[j][1] = _mm256_dpbusd_avx_epi32(isum[j][1], hi1, xhv);
          }
        }
      }
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G)));
      const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + 8)));
      for (int j = 0; j < MB; ++j) {
        const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
        acc[i][j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][0]), _mm256_mul_ps(dw0, dx), acc[i][j][0]);
        acc[i][j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][1]), _mm256_mul_ps(dw1, dx), acc[i][j][1]);
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
__attribute__((target(QL_VNNI256))) void groups_rows_vnni256_mb(const Layout& L, const QX& qx, int64_t m0, int64_t mb,
                                                               const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: groups_rows_vnni256<1, NS>(L, qx, m0, w, g0, out); break;
    case 2: groups_rows_vnni256<2, NS>(L, qx, m0, w, g0, out); break;
    case 3: groups_rows_vnni256<3, NS>(L, qx, m0, w, g0, out); break;
    default: groups_rows_vnni256<4, NS>(L, qx, m0, w, g0, out); break;
  }
}

// One token row against kStreamsAvx2 groups side by side (groups_avx2_m1's streams, groups_rows_vnni256<1, 1>'s
// arithmetic).
__attribute__((target(QL_VNNI256))) void groups_vnni256_m1(const Layout& L, const QX& qx, const uint8_t* w,
                                                          const float* bias, float* y, int64_t g0) {
  const int64_t nb = qx.nb;
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80)), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[kStreamsAvx2][2];
  for (int i = 0; i < kStreamsAvx2; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xb = qx.q.data() + b * 32;
    const __m256 dx = _mm256_set1_ps(qx.d[b]);
    const __m256i corr = _mm256_set1_epi32(qx.corr[b]);
    for (int i = 0; i < kStreamsAvx2; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * (L.fmt == FMT_Q8 ? 512 : 256);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), kStreamsAvx2 * G * L.rb);
      for (int s = 0; s < (L.fmt == FMT_Q8 ? 8 : 4); ++s)
        _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + kStreamPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = wb0 + h * 32;
        __m256i isum = corr;
        if (L.fmt == FMT_Q8) {
          for (int s = 0; s < 8; ++s) {
            const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), c128);
            int32_t x4;
            std::memcpy(&x4, xb + 4 * s, 4);
            isum = _mm256_dpbusd_avx_epi32(isum, wv, _mm256_set1_epi32(x4));
          }
        } else {
          for (int s = 0; s < 4; ++s) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            isum = _mm256_dpbusd_avx_epi32(isum, _mm256_and_si256(raw, low4), _mm256_set1_epi32(xl));
            isum = _mm256_dpbusd_avx_epi32(isum, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                                           _mm256_set1_epi32(xh));
          }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[i][h]);
      }
    }
  }
  alignas(32) float out[kStreamsAvx2 * G];
  for (int i = 0; i < kStreamsAvx2; ++i) {
    _mm256_store_ps(out + i * G, acc[i][0]);
    _mm256_store_ps(out + i * G + 8, acc[i][1]);
  }
  write_groups(L, out, 1, kStreamsAvx2, 0, 1, g0, bias, y);
}

// ns (kStreamsAvx2 or 1) full groups from g0, all token rows, in register blocks of up to 4
__attribute__((target(QL_VNNI256))) void groups_vnni256(const Layout& L, const QX& qx, const uint8_t* w,
                                                       const float* bias, float* y, int64_t g0, int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2)
      groups_rows_vnni256_mb<kStreamsAvx2>(L, qx, m0, mb, w, g0, out);
    else
      groups_rows_vnni256_mb<1>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
}

// ------------------------------------------------------------------ AVX-512 VNNI

// NS consecutive groups (16 weight rows each, one zmm lane per row) for MB token rows: per 4 inputs,
// one weight vector (made unsigned: int8 q ^ 0x80 = q + 128, int4 nibbles v as they are), loaded once
// for all MB rows, and per token row one broadcast of its 4 signed activation bytes and one vpdpbusd.
// The block's integer sums start at the row's correction (-128 or -8 times the block's activation
// sum), so they are exact dots. Why NS = kStreams groups side by side: one thread's DRAM bandwidth is
// bounded by how many cache lines are in flight, and a single sequential stream (a group at a time)
// keeps too few of them busy. Reading 4 groups block by block, each stream prefetching
// kStreamPrefetch bytes ahead into L2, streamed the 0.5B shape's matrices 1.14-1.3x faster (int8)
// and 1.2-1.3x (int4) at one token row on an AVX512-VNNI Xeon, 1 thread (llama.cpp's AMX/VNNI
// kernels also read 4 groups of 16 columns side by side). NS = 1 serves the groups left over. Each
// (row, column) does the same operations in the same order whatever NS and MB, so results do not
// depend on the batch or on which chunk a group falls in (tests compare the paths bit for bit).
constexpr int kStreams = kStreamsDefault;  // kStreamPrefetch: with groups_avx2_m1

// Block b's exact integer dots for MB token rows (from m0) against one group's 16 weight rows, each row's sum from
// its correction. int8: the block's 512 bytes at wb, each line prefetched ``ahead`` bytes on
template <int MB>
__attribute__((target(QL_512), always_inline)) inline void q8_block_dots(const uint8_t* wb, const uint8_t* pf,
                                                                        const QX& qx, int64_t m0, int64_t b,
                                                                        __m512i* isum) {
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  __m512i wv[8];
  for (int s = 0; s < 8; ++s) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + s * 64), _MM_HINT_T0);
    wv[s] = _mm512_xor_si512(_mm512_loadu_si512(wb + s * 64), c128);
  }
  for (int j = 0; j < MB; ++j) {
    const int32_t* xb = xq32 + j * (qx.Kp / 4) + b * 8;
    __m512i a = _mm512_set1_epi32(qx.corr[(m0 + j) * qx.nb + b]), a2 = _mm512_setzero_si512();
    for (int s = 0; s < 8; s += 2) {  // two chains of 4: half the latency of one (exact sums either way)
      a = _mm512_dpbusd_epi32(a, wv[s], _mm512_set1_epi32(xb[s]));
      a2 = _mm512_dpbusd_epi32(a2, wv[s + 1], _mm512_set1_epi32(xb[s + 1]));
    }
    isum[j] = _mm512_add_epi32(a, a2);
  }
}

// int4: the block's 256 bytes at wb (prefetching pf's 4 lines)
template <int MB>
__attribute__((target(QL_512), always_inline)) inline void q4_block_dots(const uint8_t* wb, const uint8_t* pf,
                                                                        const QX& qx, int64_t m0, int64_t b,
                                                                        __m512i* isum) {
  const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8(static_cast<char>(0xf0));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  __m512i lo[4], hi16[4];  // high nibbles kept in place: that chain sums 16x the dot, shifted back once per block
  for (int s = 0; s < 4; ++s) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + s * 64), _MM_HINT_T0);
    const __m512i raw = _mm512_loadu_si512(wb + s * 64);
    lo[s] = _mm512_and_si512(raw, low4);
    hi16[s] = _mm512_and_si512(raw, high4);
  }
  for (int j = 0; j < MB; ++j) {
    const int32_t* xb = xq32 + j * (qx.Kp / 4) + b * 8;
    __m512i a = _mm512_set1_epi32(qx.corr[(m0 + j) * qx.nb + b]), a2 = _mm512_setzero_si512();
    for (int s = 0; s < 4; ++s) {
      a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
      a2 = _mm512_dpbusd_epi32(a2, hi16[s], _mm512_set1_epi32(xb[4 + s]));
    }
    isum[j] = _mm512_add_epi32(a, _mm512_srai_epi32(a2, 4));
  }
}

// Blocks [b0, b1) only, the float sums carried in ``out`` (row stride ``ostride``): loaded there unless b0 == 0,
// stored back after b1 (groups_vnni's K segments; exact fp32 values, so the same bits as one walk).
template <int MB, int NS>
__attribute__((target(QL_512))) void groups_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                   int64_t g0, float* out, int64_t b0, int64_t b1,
                                                   int64_t ostride) {
  const int64_t nb = qx.nb;
  const uint8_t* grp[NS];
  const uint16_t* ws[NS];
  for (int i = 0; i < NS; ++i) {
    grp[i] = L.group(w, g0 + i);
    ws[i] = reinterpret_cast<const uint16_t*>(grp[i] + G * L.qb);
  }
  // int4: a stream's prefetch past its group's end goes on in the group it reads next (NS groups on), not in the
  // neighbour stream's, already being read: short rows (10-40 KB a group) otherwise start each call's streams cold
  constexpr int64_t ahead_bytes = stream_ahead<NS, MB>(kStreamPrefetch, kOneStreamPrefetch);
  const int64_t gbytes = G * L.rb, skip = (NS - 1) * gbytes;
  const int64_t sahead = MB > 1 && NS == 1 ? ahead_bytes / (L.fmt == FMT_Q8 ? 512 : 256) : scale_ahead(L.fmt);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = b0 ? _mm512_loadu_ps(out + (i * ostride + j) * G) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    for (int i = 0; i < NS; ++i) {
      prefetch_scales(reinterpret_cast<const uint8_t*>(ws[i]), b, nb, sahead, NS * gbytes);
      __m512i isum[MB];
      if (L.fmt == FMT_Q8) {
        const uint8_t* wb = grp[i] + b * 512;
        q8_block_dots<MB>(wb, wb + ahead_bytes, qx, m0, b, isum);
      } else {
        const int64_t ahead = b * 256 + ahead_bytes;
        q4_block_dots<MB>(grp[i] + b * 256, grp[i] + ahead + (ahead + 192 >= gbytes ? skip : 0), qx, m0, b, isum);
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws[i] + b * G)));
      for (int j = 0; j < MB; ++j) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(qx.d[(m0 + j) * nb + b]));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), s, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (i * ostride + j) * G, acc[i][j]);
}

// MB token rows (one register block) over the full groups [g0, g1) read as one stream (a decode step or a short
// verification pass on AMD), each group's sums stored straight into y (no bias): groups_vnni_mb<MB, 1>'s arithmetic
// and prefetches in a loop of its own. At short rows the per-group call, stack buffer and scalar write-back of
// groups_vnni were a large share: Gemma 3's 262,144 x 640 output matrix (20 blocks a group) read 28-29 GB/s at one
// row where long rows read 40 (now 1.08-1.12x faster).
template <int FMT, int MB>
__attribute__((target(QL_512))) void groups_vnni_run_fmt(const Layout& L, const QX& qx, const uint8_t* w, int64_t g0,
                                                        int64_t g1, float* y) {
  constexpr int64_t block_bytes = FMT == FMT_Q8 ? 512 : 256;
  constexpr int64_t ahead = stream_ahead<1, MB>(kStreamPrefetch, kOneStreamPrefetch);
  const int64_t nb = qx.nb, gbytes = G * L.rb, sahead = MB > 1 ? ahead / block_bytes : scale_ahead(FMT);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* grp = L.group(w, g);
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
    __m512 acc[MB];
    for (int j = 0; j < MB; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_scales(reinterpret_cast<const uint8_t*>(ws), b, nb, sahead, gbytes);
      const uint8_t* wb = grp + b * block_bytes;
      __m512i isum[MB];
      if (FMT == FMT_Q8)
        q8_block_dots<MB>(wb, wb + ahead, qx, 0, b, isum);
      else
        q4_block_dots<MB>(wb, wb + ahead, qx, 0, b, isum);
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + b * G)));
      for (int j = 0; j < MB; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dw, _mm512_set1_ps(qx.d[j * nb + b])),
                                 acc[j]);
    }
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(y + j * L.N + g * G, acc[j]);
  }
}

template <int FMT>
struct IntRun {
  template <int MB>
  struct Rows {
    static void run(const Layout& L, const QX& qx, const uint8_t* w, int64_t g0, int64_t g1, float* y) {
      groups_vnni_run_fmt<FMT, MB>(L, qx, w, g0, g1, y);
    }
  };
};

// up to 8 token rows (qx.M), int8 or int4, over the full groups [g0, g1), one stream, no bias
__attribute__((target(QL_512))) void groups_vnni_run(const Layout& L, const QX& qx, const uint8_t* w, int64_t g0,
                                                    int64_t g1, float* y) {
  if (L.fmt == FMT_Q8)
    by_rows<IntRun<FMT_Q8>::template Rows>(qx.M, L, qx, w, g0, g1, y);
  else
    by_rows<IntRun<FMT_Q4>::template Rows>(qx.M, L, qx, w, g0, g1, y);
}

template <int NS>
__attribute__((target(QL_512))) void groups_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb,
                                                     const uint8_t* w, int64_t g0, float* out, int64_t b0,
                                                     int64_t b1, int64_t ostride) {
  switch (mb) {
    case 1: groups_vnni_mb<1, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 2: groups_vnni_mb<2, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 3: groups_vnni_mb<3, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 4: groups_vnni_mb<4, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 5: groups_vnni_mb<5, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 6: groups_vnni_mb<6, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 7: groups_vnni_mb<7, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    default: groups_vnni_mb<8, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
  }
}

// Bytes of weights a K segment of kStreams groups spans when several register blocks of token rows share it:
// each block then rereads the segment from L1. Whole-K walks per register block reread the groups from L2 at
// best (139-557 KB a unit at 2048-8192 inputs), and a 9-row pass (5 + 4 rows) of a 1.7B-shape file cost 1.5-2x a
// 5-row one, by a varying amount from run to run; per segment the second block pays its arithmetic.
constexpr int64_t kSegmentBytes = 16 * 1024;

// ns (kStreams or 1) full groups from g0, all token rows (register blocks of up to 8; with several blocks, K in
// segments of kSegmentBytes, every block over a segment before the next)
__attribute__((target(QL_512))) void groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias,
                                                float* y, int64_t g0, int ns) {
  const int64_t nb = qx.nb;
  if (qx.M <= 8) {
    alignas(64) float out[kStreams * 8 * G];
    if (ns == kStreams)
      groups_vnni_rows<kStreams>(L, qx, 0, qx.M, w, g0, out, 0, nb, 8);
    else
      groups_vnni_rows<1>(L, qx, 0, qx.M, w, g0, out, 0, nb, 8);
    write_groups(L, out, 8, ns, 0, qx.M, g0, bias, y);
    return;
  }
  thread_local std::vector<float> sums;  // [group][row][column]: every row's carried float sums
  sums.resize(static_cast<size_t>(kStreams * qx.M * G));
  float* out = sums.data();
  const int64_t seg = std::max<int64_t>(1, kSegmentBytes / (kStreams * G * (L.fmt == FMT_Q8 ? 32 : 16)));
  for (int64_t b0 = 0; b0 < nb; b0 += seg) {
    const int64_t b1 = std::min(nb, b0 + seg);
    for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
      mb = block_rows(qx.M, m0, 8);
      if (ns == kStreams)
        groups_vnni_rows<kStreams>(L, qx, m0, mb, w, g0, out + m0 * G, b0, b1, qx.M);
      else
        groups_vnni_rows<1>(L, qx, m0, mb, w, g0, out + m0 * G, b0, b1, qx.M);
    }
  }
  write_groups(L, out, qx.M, ns, 0, qx.M, g0, bias, y);
}
#endif  // QL_X86

}  // namespace
