// b32 (GGUF Q5_0, Q4_1, Q5_1 as stored): every path.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_walk.h"

namespace {

// ------------------------------------------------------------------ b32: GGUF Q5_0, Q4_1, Q5_1 (as stored)
// Per (token row m, weight row n), every path, bit for bit: per block b of 32, I_b the exact integer dot of the
// unsigned q (q4_1: 0..15; q5_0, q5_1: 0..31) with row m's int8 activations, for q5_0 less 16 * S_b (its chain
// starts at qx.corr = -16 * S_b, so I_b is the dot of q - 16), d_w and m_w the block's fp16 d and min:
//   acc = 0; for b: acc = fma(float(I_b), d_w * d_x, acc);  [q4_1, q5_1: acc = fma(t_b, m_w, acc)];  y = acc + bias
// with t_b = float(S_b) * d_x as for q4k (qx.t). Q4_0's arithmetic with a 5th bit and Q4_K's min term.

void cols_scalar_b32(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  const bool mn = b32_min(L.fmt);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        int32_t isum = mn ? 0 : qx.corr[m * qx.nb + b];
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) isum += L.b32_q(w, n, k) * int32_t(xq[k]);
        const float dx = qx.d[m * qx.nb + b];
        acc = std::fmaf(static_cast<float>(isum), half_to_float(L.b32_half(w, n, b, false)) * dx, acc);
        if (mn) acc = std::fmaf(qx.t[m * qx.nb + b], half_to_float(L.b32_half(w, n, b, true)), acc);
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths)
void group_scalar_b32(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const bool hi = b32_hi(L.fmt), mn = b32_min(L.fmt);
  const int64_t nb = qx.nb;
  const uint8_t* grp = L.group(w, g);
  const uint8_t* plane = grp + G * L.qb;
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(plane + (hi ? 64 * nb : 0));
  const uint16_t* ms = ds + G * nb;
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wb = grp + b * 256;
      const uint8_t* hb = plane + b * 64;
      const int8_t* xb = xq + b * 32;
      int32_t isum[G];
      for (int c = 0; c < G; ++c) isum[c] = mn ? 0 : qx.corr[m * nb + b];
      for (int s = 0; s < 4; ++s)
        for (int c = 0; c < G; ++c)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = wb[s * 64 + c * 4 + i];
            int32_t vl = byte & 0xf, vh = byte >> 4;
            if (hi) {
              vl |= ((hb[c * 4 + i] >> s) & 1) << 4;
              vh |= ((hb[c * 4 + i] >> (s + 4)) & 1) << 4;
            }
            isum[c] += vl * xb[4 * s + i] + vh * xb[16 + 4 * s + i];
          }
      const float dx = qx.d[m * nb + b];
      for (int c = 0; c < G; ++c) {
        acc[c] = std::fmaf(static_cast<float>(isum[c]), half_to_float(ds[b * G + c]) * dx, acc[c]);
        if (mn) acc[c] = std::fmaf(qx.t[m * nb + b], half_to_float(ms[b * G + c]), acc[c]);
      }
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86
// b32 streams prefetch kB32Prefetch bytes of quants ahead, and the plane and scales as many blocks ahead: q6k's
// measured distance (kQ6kPrefetch), where 32 KiB was 1.1-3x slower from DRAM
constexpr int64_t kB32Prefetch = 4096;

// Group grp's lines kB32Prefetch ahead of block b in each of its regions: quants (4 lines a block), the plane
// (1 line), d and m (a line per 2 blocks); past the group's end, the same lines of the group ``next`` bytes on,
// the one this stream reads next (prefetch_scales's reason: at short rows each region was too short for the
// hardware prefetcher, and a group's first 16 blocks of every region were demand misses)
template <bool HI, bool MIN, int64_t AHEAD = kB32Prefetch>
__attribute__((always_inline)) inline void prefetch_b32(const uint8_t* grp, int64_t nb, int64_t b, int64_t next) {
  int64_t a = b + AHEAD / 256;
  if (a >= nb) {
    grp += next;
    a -= nb;
  }
  const uint8_t* wb = grp + a * 256;
  for (int s = 0; s < 4; ++s) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64), _MM_HINT_T0);
  const uint8_t* p = grp + G * 16 * nb;
  if (HI) {
    _mm_prefetch(reinterpret_cast<const char*>(p + a * 64), _MM_HINT_T0);
    p += 64 * nb;
  }
  if ((b & 1) == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(p + a * 32), _MM_HINT_T0);
    if (MIN) _mm_prefetch(reinterpret_cast<const char*>(p + 32 * nb + a * 32), _MM_HINT_T0);
  }
}

// AVX-512 VNNI: groups_vnni_mb's walk (NS groups side by side, one zmm lane per weight row, MB token rows per
// weight vector). q5_0 / q5_1: q merged to bytes 0..31 (b32_merge512), one vpdpbusd per step and row per half;
// q4_1: int4's nibbles (the high ones in place, their chain shifted back once per block).
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target(QL_512))) void b32_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                int64_t g0, float* out, int64_t rstride = G) {
  const int64_t nb = qx.nb, xstride = qx.Kp / 4;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8(static_cast<char>(0xf0));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  const uint8_t* grp[NS];
  for (int i = 0; i < NS; ++i) grp[i] = L.group(w, g0 + i);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      prefetch_b32<HI, MIN, stream_ahead<NS, MB>(kB32Prefetch, kB32Prefetch)>(grp[i], nb, b, NS * G * L.rb);
      const uint8_t* wb = grp[i] + b * 256;
      __m512i lo[4], hi[4];
      if constexpr (HI) {
        const __m512i qh = _mm512_loadu_si512(grp[i] + hoff + b * 64);
        b32_merge512<0>(_mm512_loadu_si512(wb), qh, lo[0], hi[0]);
        b32_merge512<1>(_mm512_loadu_si512(wb + 64), qh, lo[1], hi[1]);
        b32_merge512<2>(_mm512_loadu_si512(wb + 128), qh, lo[2], hi[2]);
        b32_merge512<3>(_mm512_loadu_si512(wb + 192), qh, lo[3], hi[3]);
      } else {
        for (int s = 0; s < 4; ++s) {
          const __m512i raw = _mm512_loadu_si512(wb + s * 64);
          lo[s] = _mm512_and_si512(raw, low4);
          hi[s] = _mm512_and_si512(raw, high4);
        }
      }
      __m512i isum[MB];
      for (int j = 0; j < MB; ++j) {
        const int32_t* xb = xq32 + j * xstride + b * 8;
        __m512i a = MIN ? _mm512_setzero_si512() : _mm512_set1_epi32(qx.corr[(m0 + j) * nb + b]);
        __m512i a2 = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s) {
          a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
          a2 = _mm512_dpbusd_epi32(a2, hi[s], _mm512_set1_epi32(xb[4 + s]));
        }
        isum[j] = _mm512_add_epi32(a, HI ? a2 : _mm512_srai_epi32(a2, 4));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[i] + doff + b * 32)));
      __m512 mw = _mm512_setzero_ps();
      if constexpr (MIN)
        mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[i] + moff + b * 32)));
      for (int j = 0; j < MB; ++j) {
        const __m512 dx = _mm512_set1_ps(qx.d[(m0 + j) * nb + b]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dw, dx), acc[i][j]);
        if constexpr (MIN) acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(qx.t[(m0 + j) * nb + b]), mw, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + i * 8 * G + j * rstride, acc[i][j]);
}

template <int NS, bool HI, bool MIN>
void b32_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb, const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: b32_vnni_mb<1, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 2: b32_vnni_mb<2, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 3: b32_vnni_mb<3, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 4: b32_vnni_mb<4, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 5: b32_vnni_mb<5, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 6: b32_vnni_mb<6, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 7: b32_vnni_mb<7, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    default: b32_vnni_mb<8, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
  }
}

// Up to 8 token rows (one register block) over the full groups [g0, g1) as one stream, sums stored straight into
// y (no bias): b32_vnni_mb<MB, 1> inlined into the loop (groups_vnni_run_fmt's note: the per-group call at short rows)
template <bool HI, bool MIN>
struct B32Run {
  template <int MB>
  struct Rows {
    __attribute__((target(QL_512), flatten)) static void run(const Layout& L, const QX& qx, const uint8_t* w, float* y,
                                                             int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) b32_vnni_mb<MB, 1, HI, MIN>(L, qx, 0, w, g, y + g * G, L.N);
    }
  };
};

// ns (kStreams or 1) full groups from g0, all token rows (register blocks of up to 8)
template <bool HI, bool MIN>
void b32_groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                     int ns) {
  alignas(64) float out[kStreams * 8 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 8);
    if (ns == kStreams)
      b32_vnni_rows<kStreams, HI, MIN>(L, qx, m0, mb, w, g0, out);
    else
      b32_vnni_rows<1, HI, MIN>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 8, ns, m0, mb, g0, bias, y);
  }
}

// b32_merge256 at step s (a constant wherever the callers' 4-step loops are unrolled); q4_1: the two nibbles, the
// high one shifted down
template <bool HI>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void b32_step256(const uint8_t* wb, __m256i qh, int s,
                                                                               __m256i& lo, __m256i& hi) {
  k4_step256<HI>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), qh, s, lo, hi);
}

// The float tail of block b of one half group (h) for MB token rows, 8 columns a ymm: isum[j] the exact dots,
// dp / mp the half group's 8 fp16 d / m
template <int MB, bool MIN>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void b32_tail256(const QX& qx, int64_t m0, int64_t b,
                                                                               const uint8_t* dp, const uint8_t* mp,
                                                                               const __m256i* isum, __m256 (*acc)[2],
                                                                               int h) {
  const int64_t nb = qx.nb;
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp)));
  __m256 mw = _mm256_setzero_ps();
  if constexpr (MIN) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp)));
  for (int j = 0; j < MB; ++j) {
    const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
    acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dw, dx), acc[j][h]);
    if constexpr (MIN) acc[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(qx.t[(m0 + j) * nb + b]), mw, acc[j][h]);
  }
}

// AVX2: NS groups side by side, one half group (8 rows) a ymm, MB token rows (q6k_rows_avx2's walk). maddubs(q, x)
// summed in int16 over the block's 4 steps, the low and high halves apart for 5-bit q (4 * 2 * 31 * 127 < 32768),
// together for q4_1 (8 * 2 * 15 * 127 < 32768), then madd to int32.
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target("avx2,fma,f16c"))) void b32_rows_avx2(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                           int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      prefetch_b32<HI, MIN>(grp, nb, b, NS * G * L.rb);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = grp + b * 256 + 32 * h;
        const __m256i qh = HI ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + hoff + b * 64 + 32 * h))
                              : _mm256_setzero_si256();
        __m256i p[MB], p2[MB], isum[MB];
        for (int j = 0; j < MB; ++j) p[j] = p2[j] = _mm256_setzero_si256();
        for (int s = 0; s < 4; ++s) {
          __m256i lo, hi;
          b32_step256<HI>(wb, qh, s, lo, hi);
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            if constexpr (HI)
              p2[j] = _mm256_add_epi16(p2[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
            else
              p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
          }
        }
        for (int j = 0; j < MB; ++j) {
          __m256i a = _mm256_madd_epi16(p[j], ones);
          if constexpr (HI) a = _mm256_add_epi32(a, _mm256_madd_epi16(p2[j], ones));
          if constexpr (!MIN) a = _mm256_add_epi32(a, _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]));
          isum[j] = a;
        }
        b32_tail256<MB, MIN>(qx, m0, b, grp + doff + b * 32 + 16 * h, grp + moff + b * 32 + 16 * h, isum, acc[i], h);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

// AVX-VNNI: b32_rows_avx2's walk with one 256-bit vpdpbusd per step, half group, half block and token row
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target(QL_VNNI256))) void b32_rows_vnni256(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                         int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      prefetch_b32<HI, MIN>(grp, nb, b, NS * G * L.rb);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = grp + b * 256 + 32 * h;
        const __m256i qh = HI ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + hoff + b * 64 + 32 * h))
                              : _mm256_setzero_si256();
        __m256i a[MB], a2[MB];
        for (int j = 0; j < MB; ++j) {
          a[j] = MIN ? _mm256_setzero_si256() : _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
          a2[j] = _mm256_setzero_si256();
        }
        for (int s = 0; s < 4; ++s) {
          __m256i lo, hi;
          b32_step256<HI>(wb, qh, s, lo, hi);
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            a[j] = _mm256_dpbusd_avx_epi32(a[j], lo, _mm256_set1_epi32(xl));
            a2[j] = _mm256_dpbusd_avx_epi32(a2[j], hi, _mm256_set1_epi32(xh));
          }
        }
        for (int j = 0; j < MB; ++j) a[j] = _mm256_add_epi32(a[j], a2[j]);
        b32_tail256<MB, MIN>(qx, m0, b, grp + doff + b * 32 + 16 * h, grp + moff + b * 32 + 16 * h, a, acc[i], h);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

// ns (kStreamsAvx2 or 1) full groups from g0, all token rows in register blocks of up to 4
template <bool VNNI, bool HI, bool MIN>
void b32_groups_256(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                    int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
#define QL_B32_CALL(MB, NS)                                           \
  (VNNI ? b32_rows_vnni256<MB, NS, HI, MIN>(L, qx, m0, w, g0, out) \
        : b32_rows_avx2<MB, NS, HI, MIN>(L, qx, m0, w, g0, out))
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2) {
      switch (mb) {
        case 1: QL_B32_CALL(1, kStreamsAvx2); break;
        case 2: QL_B32_CALL(2, kStreamsAvx2); break;
        case 3: QL_B32_CALL(3, kStreamsAvx2); break;
        default: QL_B32_CALL(4, kStreamsAvx2); break;
      }
    } else {
      switch (mb) {
        case 1: QL_B32_CALL(1, 1); break;
        case 2: QL_B32_CALL(2, 1); break;
        case 3: QL_B32_CALL(3, 1); break;
        default: QL_B32_CALL(4, 1); break;
      }
    }
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
#undef QL_B32_CALL
}
#endif  // QL_X86

// the b32 formats' column groups [u0, u1) (and the tail rows as unit L.ng) on path ``isa``
template <bool HI, bool MIN>
void b32_units_t(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0,
                 int64_t u1, int isa, int streams) {
  for (int64_t u = u0; u < u1; ++u) {
    if (u == L.ng) {
      cols_scalar_b32(L, qx, w, bias, y, L.ng * G, L.N);
      continue;
    }
#if QL_X86
    if (isa == ISA_VNNI512 && qx.M <= 8 && streams == 1 && bias == nullptr) {  // one stream, one register block
      const int64_t ge = std::min(u1, L.ng);
      by_rows<B32Run<HI, MIN>::template Rows>(qx.M, L, qx, w, y, u, ge);
      u = ge - 1;
      continue;
    }
    if (isa == ISA_VNNI512) {
      const int ns = streams > 1 && u + kStreams <= std::min(u1, L.ng) ? kStreams : 1;
      b32_groups_vnni<HI, MIN>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
    if (isa == ISA_AVX2 || isa == ISA_AVXVNNI) {
      // AVX2's b32 walk keeps its 4 streams on AMD too (SmolLM2-135M Q4_1, Zen 5, 1 thread: 1 stream 0.92-0.97x)
      const bool side = qx.M <= kMaxRowsQ4StreamsAvx2 && u + kStreamsAvx2 <= std::min(u1, L.ng);
      const int ns = side ? kStreamsAvx2 : 1;
      if (isa == ISA_AVXVNNI)
        b32_groups_256<true, HI, MIN>(L, qx, w, bias, y, u, ns);
      else
        b32_groups_256<false, HI, MIN>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
#endif
    group_scalar_b32(L, qx, w, bias, y, u);
  }
}

void b32_units(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0, int64_t u1,
               int isa, int streams) {
  if (L.fmt == FMT_Q5_0)
    b32_units_t<true, false>(L, qx, w, bias, y, u0, u1, isa, streams);
  else if (L.fmt == FMT_Q4_1)
    b32_units_t<false, true>(L, qx, w, bias, y, u0, u1, isa, streams);
  else
    b32_units_t<true, true>(L, qx, w, bias, y, u0, u1, isa, streams);
}

}  // namespace
