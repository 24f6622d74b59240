// q4k / q5k (GGUF Q4_K / Q5_K as stored): every path.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_walk.h"

namespace {

// ------------------------------------------------------------------ q4k (GGUF Q4_K, as stored)
// Per (token row m, weight row n), every path, bit for bit: with I_b the exact integer dot of sub-block b's
// nibbles v (0..15) and row m's int8 activations, t_b = float(S_b) * d_x (S_b: the activations' block sum;
// one per token row and block, qx.t, shared by every column), ds = d * sc_b and dm = dmin * m_b (exact in fp32),
//   acc = 0; for b: acc = fma(float(I_b), ds * d_x, acc); acc = fma(-t_b, dm, acc); y = acc + bias
// (the SIMD paths write the second as fnmadd(t_b, dm, acc): the same exact value, rounded once).

void cols_scalar_q4k(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        int32_t isum = 0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) isum += L.q4k_v(w, n, k) * int32_t(xq[k]);
        float ds, dm;
        L.q4k_scales(w, n, b, ds, dm);
        const float dx = qx.d[m * qx.nb + b];
        acc = std::fmaf(static_cast<float>(isum), ds * dx, acc);
        acc = std::fmaf(-qx.t[m * qx.nb + b], dm, acc);
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths); HI: q5k's 5th bits
template <bool HI>
void group_scalar_q4k(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < qx.nb; ++b) {
      const uint8_t* base = grp + (b / 8) * k4_group_sb<HI>();
      const uint8_t* wb = base + (b % 8) * 256;
      const uint8_t* hb = base + kQ5kQh + (b % 8) * 64;  // read only for q5k
      const int8_t* xb = xq + b * 32;
      int32_t isum[G] = {};
      for (int s = 0; s < 4; ++s)
        for (int c = 0; c < G; ++c)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = wb[s * 64 + c * 4 + i];
            const int lo5 = HI ? ((hb[c * 4 + i] >> s) & 1) << 4 : 0, hi5 = HI ? ((hb[c * 4 + i] >> (s + 4)) & 1) << 4 : 0;
            isum[c] += int32_t((byte & 0xf) | lo5) * xb[4 * s + i] + int32_t((byte >> 4) | hi5) * xb[16 + 4 * s + i];
          }
      const float dx = qx.d[m * qx.nb + b], tx = qx.t[m * qx.nb + b];
      for (int c = 0; c < G; ++c) {
        uint16_t d, dmin;
        std::memcpy(&d, base + kQ4kD + 2 * c, 2);
        std::memcpy(&dmin, base + kQ4kDmin + 2 * c, 2);
        const float ds = half_to_float(d) * static_cast<float>(base[kQ4kSc + (b % 8) * G + c]);
        const float dm = half_to_float(dmin) * static_cast<float>(base[kQ4kMin + (b % 8) * G + c]);
        acc[c] = std::fmaf(static_cast<float>(isum[c]), ds * dx, acc[c]);
        acc[c] = std::fmaf(-tx, dm, acc[c]);
      }
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86

// q4k streams prefetch 4 KiB ahead, not kStreamPrefetch's 2 (2048 x 8192 from memory, one thread: against 32 KiB,
// 1 row 0.37 -> 0.32 ms on VNNI-512 and 0.50 -> 0.27 ms on AVX2; at 2 KiB 0.31 / 0.37 ms: a super-block's scale
// lines come in at each group's start, so they need the longer lead).
constexpr int64_t kQ4kPrefetch = 4 * 1024;
// The lines of a group's super-block past its quants (scales, mins, d, dmin: 320 bytes, not line aligned),
// kQ4kPrefetch ahead; the sub-blocks' loops prefetch the quants' lines.
// (q5k: and its planes)
template <bool HI = false, int64_t AHEAD = kQ4kPrefetch>
__attribute__((always_inline)) inline void prefetch_q4k_scales(const uint8_t* base) {
  constexpr int64_t end = HI ? kQ5kQh + 8 * 64 : kQ4kGroupSb;
  for (int64_t o = kQ4kSc - 1; o < end + 63; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(base + std::min(o, end - 1) + AHEAD), _MM_HINT_T0);
}

// A group's 16 fp16 d and dmin as fp32 (dd[0..15]: d, dd[16..31]: dmin), once per super-block
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void q4k_d_avx2(const uint8_t* base, float* dd) {
  for (int h = 0; h < 4; ++h)
    _mm256_store_ps(dd + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kQ4kD + 16 * h))));
}

// The float tail of one sub-block (jb) of one group for MB token rows, 8 columns a ymm (AVX2 and AVX-VNNI):
// isum[j][h] are the exact integer dots, dd the group's d and dmin (q4k_d_avx2).
template <int MB>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void q4k_tail_avx2(const QX& qx, int64_t m0, int64_t b,
                                                                                 const uint8_t* base, int64_t jb,
                                                                                 const float* dd, __m256i (*isum)[2],
                                                                                 __m256 (*acc)[2]) {
  const int64_t nb = qx.nb;
  // 8 bytes widened straight from memory (vpmovzxbd ymm, m64)
  const auto widen = [](const uint8_t* p) __attribute__((target("avx2"))) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  };
  const uint8_t* sc = base + kQ4kSc + jb * G;
  const uint8_t* mn = base + kQ4kMin + jb * G;
  const __m256 ds0 = _mm256_mul_ps(_mm256_load_ps(dd), widen(sc));
  const __m256 ds1 = _mm256_mul_ps(_mm256_load_ps(dd + 8), widen(sc + 8));
  const __m256 dm0 = _mm256_mul_ps(_mm256_load_ps(dd + 16), widen(mn));
  const __m256 dm1 = _mm256_mul_ps(_mm256_load_ps(dd + 24), widen(mn + 8));
  for (int j = 0; j < MB; ++j) {
    const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]), tx = _mm256_set1_ps(qx.t[(m0 + j) * nb + b]);
    const __m256 a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][0]), _mm256_mul_ps(ds0, dx), acc[j][0]);
    const __m256 a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][1]), _mm256_mul_ps(ds1, dx), acc[j][1]);
    acc[j][0] = _mm256_fnmadd_ps(tx, dm0, a0);
    acc[j][1] = _mm256_fnmadd_ps(tx, dm1, a1);
  }
}

// Step s of one half group as unsigned bytes: q4k's low and high nibbles; q5k (HI) with their 5th bits from the
// half group's plane qh merged in (b32_merge256)
template <bool HI>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void k4_step256(__m256i raw, __m256i qh, int s,
                                                                              __m256i& lo, __m256i& hi) {
  if constexpr (HI) {
    switch (s) {
      case 0: b32_merge256<0>(raw, qh, lo, hi); break;
      case 1: b32_merge256<1>(raw, qh, lo, hi); break;
      case 2: b32_merge256<2>(raw, qh, lo, hi); break;
      default: b32_merge256<3>(raw, qh, lo, hi); break;
    }
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    lo = _mm256_and_si256(raw, low4);
    hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  }
}

// Half group h's plane of sub-block jb (q5k), or nothing (q4k)
template <bool HI>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256i k4_plane256(const uint8_t* base, int64_t jb,
                                                                                  int h) {
  if constexpr (HI) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + kQ5kQh + jb * 64 + 32 * h));
  return _mm256_setzero_si256();
}

// AVX2: NS groups side by side (more DRAM lines in flight, as groups_avx2_m1), both half groups per activation
// broadcast (groups_rows_q4_avx2's walk), MB token rows in registers. Integer dot: maddubs(v, x) summed in int16
// over the sub-block (8 * 2 * 15 * 127 < 32768), madd to int32; no correction (v is what Q4_K multiplies). q5k
// (HI, v up to 31): summed in int16 over one step's two halves (2 * 2 * 31 * 128 < 32768), madd every step.
template <int MB, int NS, bool HI>
__attribute__((target("avx2,fma,f16c"))) void q4k_rows_avx2(const Layout& L, const QX& qx, int64_t m0,
                                                           const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int64_t ahead = stream_ahead<NS, MB>(kQ4kPrefetch, kQ4kPrefetch);
  alignas(32) float dd[NS][2 * G];
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b >> 3, jb = b & 7;
    for (int i = 0; i < NS; ++i) {
      const uint8_t* base = L.group(w, g0 + i) + sb * k4_group_sb<HI>();
      const uint8_t* wb = base + jb * 256;
      if (jb == 0) {
        prefetch_q4k_scales<HI, ahead>(base);
        q4k_d_avx2(base, dd[i]);
      }
      __m256i p16[MB][2], isum[MB][2];
      if constexpr (MB == 1) {  // a decode step: one half group at a time (fewer live registers)
        const int8_t* xb = qx.q.data() + m0 * Kp + b * 32;
        for (int s = 0; s < 4; ++s)
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + ahead), _MM_HINT_T0);
        for (int h = 0; h < 2; ++h) {
          const __m256i qh = k4_plane256<HI>(base, jb, h);
          __m256i p = _mm256_setzero_si256(), p32 = _mm256_setzero_si256();
          for (int s = 0; s < 4; ++s) {
            const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32 * h));
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            __m256i lo, hi;
            k4_step256<HI>(r, qh, s, lo, hi);
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
            if constexpr (HI) {
              p32 = _mm256_add_epi32(p32, _mm256_madd_epi16(p, ones));
              p = _mm256_setzero_si256();
            }
          }
          isum[0][h] = HI ? p32 : _mm256_madd_epi16(p, ones);
        }
        q4k_tail_avx2<MB>(qx, m0, b, base, jb, dd[i], isum, acc[i]);
        continue;
      }
      for (int j = 0; j < MB; ++j) {
        p16[j][0] = p16[j][1] = _mm256_setzero_si256();
        isum[j][0] = isum[j][1] = _mm256_setzero_si256();
      }
      const __m256i qh0 = k4_plane256<HI>(base, jb, 0), qh1 = k4_plane256<HI>(base, jb, 1);
      for (int s = 0; s < 4; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + ahead), _MM_HINT_T0);
        const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32));
        __m256i lo0, hi0, lo1, hi1;
        k4_step256<HI>(r0, qh0, s, lo0, hi0);
        k4_step256<HI>(r1, qh1, s, lo1, hi1);
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
          if constexpr (HI) {
            isum[j][0] = _mm256_add_epi32(isum[j][0], _mm256_madd_epi16(p16[j][0], ones));
            isum[j][1] = _mm256_add_epi32(isum[j][1], _mm256_madd_epi16(p16[j][1], ones));
            p16[j][0] = p16[j][1] = _mm256_setzero_si256();
          }
        }
      }
      if constexpr (!HI)
        for (int j = 0; j < MB; ++j) {
          isum[j][0] = _mm256_madd_epi16(p16[j][0], ones);
          isum[j][1] = _mm256_madd_epi16(p16[j][1], ones);
        }
      q4k_tail_avx2<MB>(qx, m0, b, base, jb, dd[i], isum, acc[i]);
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

// AVX-VNNI: q4k_rows_avx2's walk with one 256-bit vpdpbusd per 4 inputs, half group and token row
template <int MB, int NS, bool HI>
__attribute__((target(QL_VNNI256))) void q4k_rows_vnni256(const Layout& L, const QX& qx, int64_t m0,
                                                         const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  alignas(32) float dd[NS][2 * G];
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b >> 3, jb = b & 7;
    for (int i = 0; i < NS; ++i) {
      const uint8_t* base = L.group(w, g0 + i) + sb * k4_group_sb<HI>();
      const uint8_t* wb = base + jb * 256;
      if (jb == 0) {
        prefetch_q4k_scales<HI>(base);
        q4k_d_avx2(base, dd[i]);
      }
      __m256i isum[MB][2];
      if constexpr (MB == 1) {  // a decode step: one half group at a time (fewer live registers)
        const int8_t* xb = qx.q.data() + m0 * Kp + b * 32;
        for (int s = 0; s < 4; ++s)
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kQ4kPrefetch), _MM_HINT_T0);
        for (int h = 0; h < 2; ++h) {
          const __m256i qh = k4_plane256<HI>(base, jb, h);
          __m256i a = _mm256_setzero_si256();
          for (int s = 0; s < 4; ++s) {
            const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32 * h));
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            __m256i lo, hi;
            k4_step256<HI>(r, qh, s, lo, hi);
            a = _mm256_dpbusd_avx_epi32(a, lo, _mm256_set1_epi32(xl));
            a = _mm256_dpbusd_avx_epi32(a, hi, _mm256_set1_epi32(xh));
          }
          isum[0][h] = a;
        }
        q4k_tail_avx2<MB>(qx, m0, b, base, jb, dd[i], isum, acc[i]);
        continue;
      }
      for (int j = 0; j < MB; ++j) isum[j][0] = isum[j][1] = _mm256_setzero_si256();
      const __m256i qh0 = k4_plane256<HI>(base, jb, 0), qh1 = k4_plane256<HI>(base, jb, 1);
      for (int s = 0; s < 4; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kQ4kPrefetch), _MM_HINT_T0);
        const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32));
        __m256i lo0, hi0, lo1, hi1;
        k4_step256<HI>(r0, qh0, s, lo0, hi0);
        k4_step256<HI>(r1, qh1, s, lo1, hi1);
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
      q4k_tail_avx2<MB>(qx, m0, b, base, jb, dd[i], isum, acc[i]);
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

// ns (kStreamsAvx2 or 1) full groups from g0, all token rows in register blocks of up to 4 (AVX2 / AVX-VNNI)
template <bool VNNI, bool HI>
void q4k_groups_256(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                    int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
#define QL_Q4K_CALL(MB, NS) \
  (VNNI ? q4k_rows_vnni256<MB, NS, HI>(L, qx, m0, w, g0, out) : q4k_rows_avx2<MB, NS, HI>(L, qx, m0, w, g0, out))
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2) {
      switch (mb) {
        case 1: QL_Q4K_CALL(1, kStreamsAvx2); break;
        case 2: QL_Q4K_CALL(2, kStreamsAvx2); break;
        case 3: QL_Q4K_CALL(3, kStreamsAvx2); break;
        default: QL_Q4K_CALL(4, kStreamsAvx2); break;
      }
    } else {
      switch (mb) {
        case 1: QL_Q4K_CALL(1, 1); break;
        case 2: QL_Q4K_CALL(2, 1); break;
        case 3: QL_Q4K_CALL(3, 1); break;
        default: QL_Q4K_CALL(4, 1); break;
      }
    }
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
#undef QL_Q4K_CALL
}

// AVX-512 VNNI: groups_vnni_mb's walk (NS groups side by side, one zmm lane per weight row, MB token rows per
// weight vector), int4's nibble handling without the correction: the high nibbles' chain sums 16x its dot.
// A group's d and dmin are converted once per super-block (kept in registers).
template <int MB, int NS, bool HI>
__attribute__((target(QL_512))) void q4k_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                int64_t g0, float* out, int64_t rstride = G) {
  const int64_t nb = qx.nb, xstride = qx.Kp / 4;
  const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8(static_cast<char>(0xf0));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  // a stream's prefetch past its group's end goes on in the group it reads next (NS groups on): int4's choice
  constexpr int64_t ahead = stream_ahead<NS, MB>(kQ4kPrefetch, kQ4kPrefetch);
  const int64_t gbytes = G * L.rb, skip = (NS - 1) * gbytes;
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* base[NS];
    const uint8_t* pf[NS];  // what the prefetches add ``ahead`` to
    const bool past = (sb + 1) * k4_group_sb<HI>() + ahead > gbytes;
    alignas(64) float dd[NS][G], dn[NS][G];  // through L1: in registers they crowd out a register block's sums
    for (int i = 0; i < NS; ++i) {
      base[i] = L.group(w, g0 + i) + sb * k4_group_sb<HI>();
      pf[i] = base[i] + (past ? skip : 0);
      prefetch_q4k_scales<HI, ahead>(pf[i]);
      _mm512_store_ps(dd[i], _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base[i] + kQ4kD))));
      _mm512_store_ps(dn[i], _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base[i] + kQ4kDmin))));
    }
    for (int64_t jb = 0; jb < 8; ++jb) {
      const int64_t b = sb * 8 + jb;
      for (int i = 0; i < NS; ++i) {
        const uint8_t* wb = base[i] + jb * 256;
        __m512i lo[4], hi16[4];  // q4k: the high nibbles in place (16 v); q5k: merged to bytes 0..31
        for (int s = 0; s < 4; ++s)
          _mm_prefetch(reinterpret_cast<const char*>(pf[i] + jb * 256 + s * 64 + ahead), _MM_HINT_T0);
        if constexpr (HI) {
          const __m512i qh = _mm512_loadu_si512(base[i] + kQ5kQh + jb * 64);
          b32_merge512<0>(_mm512_loadu_si512(wb), qh, lo[0], hi16[0]);
          b32_merge512<1>(_mm512_loadu_si512(wb + 64), qh, lo[1], hi16[1]);
          b32_merge512<2>(_mm512_loadu_si512(wb + 128), qh, lo[2], hi16[2]);
          b32_merge512<3>(_mm512_loadu_si512(wb + 192), qh, lo[3], hi16[3]);
        } else if constexpr (MB == 1) {  // one row: the high nibbles in place, their chain's sum shifted once
          for (int s = 0; s < 4; ++s) {
            const __m512i raw = _mm512_loadu_si512(wb + s * 64);
            lo[s] = _mm512_and_si512(raw, low4);
            hi16[s] = _mm512_and_si512(raw, high4);
          }
        } else {  // several rows: shifted down once here, not once a row
          for (int s = 0; s < 4; ++s) {
            const __m512i raw = _mm512_loadu_si512(wb + s * 64);
            lo[s] = _mm512_and_si512(raw, low4);
            hi16[s] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
          }
        }
        constexpr bool values = HI || MB > 1;  // hi16 holds the high values themselves, else 16x them
        __m512i isum[MB];
        for (int j = 0; j < MB; ++j) {  // two chains of 4 (exact integer sums)
          const int32_t* xb = xq32 + j * xstride + b * 8;
          __m512i a = _mm512_setzero_si512(), a2 = _mm512_setzero_si512();
          for (int s = 0; s < 4; ++s) {
            a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
            a2 = _mm512_dpbusd_epi32(a2, hi16[s], _mm512_set1_epi32(xb[4 + s]));
          }
          isum[j] = _mm512_add_epi32(a, values ? a2 : _mm512_srai_epi32(a2, 4));
        }
        const __m512 ds = _mm512_mul_ps(_mm512_load_ps(dd[i]), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(base[i] + kQ4kSc + jb * G)))));
        const __m512 dm = _mm512_mul_ps(_mm512_load_ps(dn[i]), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(base[i] + kQ4kMin + jb * G)))));
        for (int j = 0; j < MB; ++j) {
          const __m512 dx = _mm512_set1_ps(qx.d[(m0 + j) * nb + b]), tx = _mm512_set1_ps(qx.t[(m0 + j) * nb + b]);
          const __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(ds, dx), acc[i][j]);
          acc[i][j] = _mm512_fnmadd_ps(tx, dm, a);
        }
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + i * 8 * G + j * rstride, acc[i][j]);
}

template <int NS, bool HI>
void q4k_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb, const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: q4k_vnni_mb<1, NS, HI>(L, qx, m0, w, g0, out); break;
    case 2: q4k_vnni_mb<2, NS, HI>(L, qx, m0, w, g0, out); break;
    case 3: q4k_vnni_mb<3, NS, HI>(L, qx, m0, w, g0, out); break;
    case 4: q4k_vnni_mb<4, NS, HI>(L, qx, m0, w, g0, out); break;
    case 5: q4k_vnni_mb<5, NS, HI>(L, qx, m0, w, g0, out); break;
    case 6: q4k_vnni_mb<6, NS, HI>(L, qx, m0, w, g0, out); break;
    case 7: q4k_vnni_mb<7, NS, HI>(L, qx, m0, w, g0, out); break;
    default: q4k_vnni_mb<8, NS, HI>(L, qx, m0, w, g0, out); break;
  }
}

// Up to 8 token rows (one register block) over the full groups [g0, g1) as one stream, sums stored straight into
// y (no bias): q4k_vnni_mb<MB, 1> inlined into the loop (groups_vnni_run_fmt's note: the per-group call at short rows)
template <bool HI>
struct Q4kRun {
  template <int MB>
  struct Rows {
    __attribute__((target(QL_512), flatten)) static void run(const Layout& L, const QX& qx, const uint8_t* w, float* y,
                                                             int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) q4k_vnni_mb<MB, 1, HI>(L, qx, 0, w, g, y + g * G, L.N);
    }
  };
};

// ns (kStreams or 1) full groups from g0, all token rows (register blocks of up to 8)
template <bool HI>
void q4k_groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                     int ns) {
  alignas(64) float out[kStreams * 8 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 8);
    if (ns == kStreams)
      q4k_vnni_rows<kStreams, HI>(L, qx, m0, mb, w, g0, out);
    else
      q4k_vnni_rows<1, HI>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 8, ns, m0, mb, g0, bias, y);
  }
}
#endif  // QL_X86

template <bool HI>
void k4_units(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0, int64_t u1,
              int isa, int streams) {
  for (int64_t u = u0; u < u1; ++u) {
    if (u == L.ng) {
      cols_scalar_q4k(L, qx, w, bias, y, L.ng * G, L.N);
      continue;
    }
#if QL_X86
    if (isa == ISA_VNNI512 && qx.M <= 8 && streams == 1 && bias == nullptr) {  // one stream, one register block
      const int64_t ge = std::min(u1, L.ng);
      by_rows<Q4kRun<HI>::template Rows>(qx.M, L, qx, w, y, u, ge);
      u = ge - 1;
      continue;
    }
    if (isa == ISA_VNNI512) {
      const int ns = streams > 1 && u + kStreams <= std::min(u1, L.ng) ? kStreams : 1;
      q4k_groups_vnni<HI>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
    if (isa == ISA_AVX2 || isa == ISA_AVXVNNI) {
      // side by side streams for a decode step and short verification passes (int4's measured choice)
      const bool side = streams > 1 && qx.M <= kMaxRowsQ4StreamsAvx2 && u + kStreamsAvx2 <= std::min(u1, L.ng);
      const int ns = side ? kStreamsAvx2 : 1;
      if (isa == ISA_AVXVNNI)
        q4k_groups_256<true, HI>(L, qx, w, bias, y, u, ns);
      else
        q4k_groups_256<false, HI>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
#endif
    group_scalar_q4k<HI>(L, qx, w, bias, y, u);
  }
}

// q4k's (or q5k's) column groups [u0, u1) (and the tail rows as unit L.ng) on path ``isa``
void q4k_units(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0, int64_t u1,
               int isa, int streams) {
  if (L.fmt == FMT_Q5K)
    k4_units<true>(L, qx, w, bias, y, u0, u1, isa, streams);
  else
    k4_units<false>(L, qx, w, bias, y, u0, u1, isa, streams);
}

}  // namespace
