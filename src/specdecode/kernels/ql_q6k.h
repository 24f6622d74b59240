// q6k (GGUF Q6_K as stored): every path.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_walk.h"

namespace {

// ------------------------------------------------------------------ q6k (GGUF Q6_K, as stored)
// Per (token row m, weight row n), every path, bit for bit: per block b of 32 inputs (two 16-weight sub-blocks
// 2b, 2b + 1 of Q6_K with scales sc_lo, sc_hi), I_lo / I_hi the exact integer dots of the unsigned q (0..63)
// with the int8 activations over the block's first / second 16 inputs, S_lo / S_hi their activation sums
// (qx.hc holds -32 * S), ds = d * sc (exact in fp32):
//   acc = 0; for b: acc = fma(float(I_lo - 32 * S_lo), ds_lo * d_x, acc);
//                   acc = fma(float(I_hi - 32 * S_hi), ds_hi * d_x, acc);   y = acc + bias

void cols_scalar_q6k(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        const float dx = qx.d[m * qx.nb + b];
        for (int64_t h = 0; h < 2; ++h) {
          int32_t isum = qx.hc[(m * qx.nb + b) * 2 + h];
          for (int64_t k = b * 32 + 16 * h; k < b * 32 + 16 * h + 16; ++k) isum += L.q6k_q(w, n, k) * int32_t(xq[k]);
          acc = std::fmaf(static_cast<float>(isum), L.q6k_ds(w, n, 2 * b + h) * dx, acc);
        }
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths)
void group_scalar_q6k(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < qx.nb; ++b) {
      const uint8_t* base = grp + (b / 8) * kQ6kGroupSb;
      const uint8_t* wb = base + (b % 8) * 256;
      const uint8_t* hb = base + kQ6kQh + (b % 8) * 128;
      const int8_t* xb = xq + b * 32;
      int32_t isum[2][G];
      for (int c = 0; c < G; ++c) {
        isum[0][c] = qx.hc[(m * qx.nb + b) * 2];
        isum[1][c] = qx.hc[(m * qx.nb + b) * 2 + 1];
      }
      for (int s = 0; s < 4; ++s)
        for (int c = 0; c < G; ++c)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = wb[s * 64 + c * 4 + i], h = hb[(s / 2) * 64 + c * 4 + i];
            const int sh = 4 * (s % 2);
            isum[0][c] += int32_t((byte & 0xf) | (((h >> sh) & 3) << 4)) * xb[4 * s + i];
            isum[1][c] += int32_t((byte >> 4) | (((h >> (sh + 2)) & 3) << 4)) * xb[16 + 4 * s + i];
          }
      const float dx = qx.d[m * qx.nb + b];
      for (int c = 0; c < G; ++c) {
        uint16_t d;
        std::memcpy(&d, base + kQ6kD + 2 * c, 2);
        const float df = half_to_float(d);
        for (int h = 0; h < 2; ++h) {
          const float ds = df * static_cast<float>(static_cast<int8_t>(base[kQ6kSc + (2 * (b % 8) + h) * G + c]));
          acc[c] = std::fmaf(static_cast<float>(isum[h][c]), ds * dx, acc[c]);
        }
      }
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86
// q6k streams prefetch kQ6kPrefetch bytes ahead (about one group super-block), not kStreamPrefetch: one thread,
// 2048 x 8192 / 8192 x 2048 / 4096 x 4096 / 1536 x 4864 from DRAM, 1 token row, 4096 ran 1.1-3x faster than 32 KiB
// (vnni512 2048 x 8192: 0.46 vs 0.65 ms) and than 1-2 KiB; 3392-16384 were within ~10% of it.
constexpr int64_t kQ6kPrefetch = 4096;

// A group's super-block's lines past its nibbles (high bits, scales, d: 1344 bytes), kQ6kPrefetch ahead, spread
// over its 8 blocks (block jb: its 2 high-bit lines, and for jb < 5 one of the 5 scale / d lines) rather than all
// 21 at a super-block's start (4 groups: 84 at once; 1 token row, vnni512 2048 x 8192: 0.67 vs 0.46 ms)
template <int64_t AHEAD = kQ6kPrefetch>
__attribute__((always_inline)) inline void prefetch_q6k_spread(const uint8_t* base, int64_t jb) {
  _mm_prefetch(reinterpret_cast<const char*>(base + kQ6kQh + jb * 128 + AHEAD), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(base + kQ6kQh + jb * 128 + 64 + AHEAD), _MM_HINT_T0);
  if (jb < 5) _mm_prefetch(reinterpret_cast<const char*>(base + kQ6kSc + jb * 64 + AHEAD), _MM_HINT_T0);
}

// AVX-512 VNNI: NS groups side by side, one zmm lane per weight row, MB token rows per weight vector. A step s's
// 64 nibble bytes and its high-bit vector give q of the block's first 16 inputs (low nibbles) and second 16
// (high nibbles) as bytes 0..63; vpdpbusd chains start at -32 * S_lo / -32 * S_hi.
template <int MB, int NS>
__attribute__((target(QL_512))) void q6k_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                int64_t g0, float* out, int64_t rstride = G) {
  const int64_t nb = qx.nb, xstride = qx.Kp / 4;
  const __m512i low4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  // a stream's prefetch past its group's end goes on in the group it reads next (NS groups on): q4k's choice
  constexpr int64_t ahead = stream_ahead<NS, MB>(kQ6kPrefetch, kQ6kPrefetch);
  const int64_t gbytes = G * L.rb, skip = (NS - 1) * gbytes;
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* base[NS];
    const uint8_t* pf[NS];  // what the prefetches add ``ahead`` to
    const bool past = (sb + 1) * kQ6kGroupSb + ahead > gbytes;
    alignas(64) float dd[NS][G];
    for (int i = 0; i < NS; ++i) {
      base[i] = L.group(w, g0 + i) + sb * kQ6kGroupSb;
      pf[i] = base[i] + (past ? skip : 0);
      _mm512_store_ps(dd[i], _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base[i] + kQ6kD))));
    }
    for (int64_t jb = 0; jb < 8; ++jb) {
      const int64_t b = sb * 8 + jb;
      for (int i = 0; i < NS; ++i) {
        const uint8_t* wb = base[i] + jb * 256;
        const uint8_t* hb = base[i] + kQ6kQh + jb * 128;
        prefetch_q6k_spread<ahead>(pf[i], jb);
        __m512i lo[4], hi[4];
        for (int p = 0; p < 2; ++p) {
          const __m512i qh = _mm512_loadu_si512(hb + p * 64);
          for (int e = 0; e < 2; ++e) {
            const int s = 2 * p + e;
            _mm_prefetch(reinterpret_cast<const char*>(pf[i] + jb * 256 + s * 64 + ahead), _MM_HINT_T0);
            const __m512i raw = _mm512_loadu_si512(wb + s * 64);
            const __m512i hl = e == 0 ? _mm512_slli_epi16(qh, 4) : qh;
            const __m512i hh = e == 0 ? _mm512_slli_epi16(qh, 2) : _mm512_srli_epi16(qh, 2);
            // (a & 0x0f) | b (0xEC) with b the 2-bit field masked to bits 4-5
            lo[s] = _mm512_ternarylogic_epi32(raw, _mm512_and_si512(hl, m30), low4, 0xEC);
            hi[s] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), _mm512_and_si512(hh, m30), low4, 0xEC);
          }
        }
        const __m512 d = _mm512_load_ps(dd[i]);
        const __m512 ds0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(base[i] + kQ6kSc + 2 * jb * G)))));
        const __m512 ds1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(base[i] + kQ6kSc + (2 * jb + 1) * G)))));
        for (int j = 0; j < MB; ++j) {
          const int32_t* xb = xq32 + j * xstride + b * 8;
          const int32_t* hc = qx.hc.data() + ((m0 + j) * nb + b) * 2;
          __m512i a = _mm512_set1_epi32(hc[0]), a2 = _mm512_set1_epi32(hc[1]);
          for (int s = 0; s < 4; ++s) {
            a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
            a2 = _mm512_dpbusd_epi32(a2, hi[s], _mm512_set1_epi32(xb[4 + s]));
          }
          const __m512 dx = _mm512_set1_ps(qx.d[(m0 + j) * nb + b]);
          const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(ds0, dx), acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2), _mm512_mul_ps(ds1, dx), t);
        }
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + i * 8 * G + j * rstride, acc[i][j]);
}

template <int NS>
void q6k_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb, const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: q6k_vnni_mb<1, NS>(L, qx, m0, w, g0, out); break;
    case 2: q6k_vnni_mb<2, NS>(L, qx, m0, w, g0, out); break;
    case 3: q6k_vnni_mb<3, NS>(L, qx, m0, w, g0, out); break;
    case 4: q6k_vnni_mb<4, NS>(L, qx, m0, w, g0, out); break;
    case 5: q6k_vnni_mb<5, NS>(L, qx, m0, w, g0, out); break;
    case 6: q6k_vnni_mb<6, NS>(L, qx, m0, w, g0, out); break;
    case 7: q6k_vnni_mb<7, NS>(L, qx, m0, w, g0, out); break;
    default: q6k_vnni_mb<8, NS>(L, qx, m0, w, g0, out); break;
  }
}

// Up to 8 token rows (one register block) over the full groups [g0, g1) as one stream, sums stored straight into
// y (no bias): q6k_vnni_mb<MB, 1> inlined into the loop (groups_vnni_run_fmt's note: the per-group call at short rows)
template <int MB>
struct Q6kRows {
  __attribute__((target(QL_512), flatten)) static void run(const Layout& L, const QX& qx, const uint8_t* w, float* y,
                                                           int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) q6k_vnni_mb<MB, 1>(L, qx, 0, w, g, y + g * G, L.N);
  }
};

void q6k_groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                     int ns) {
  alignas(64) float out[kStreams * 8 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 8);
    if (ns == kStreams)
      q6k_vnni_rows<kStreams>(L, qx, m0, mb, w, g0, out);
    else
      q6k_vnni_rows<1>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 8, ns, m0, mb, g0, bias, y);
  }
}

// AVX2 / AVX-VNNI: NS groups side by side, one half group (8 rows) a ymm, MB token rows. AVX-VNNI: 256-bit
// vpdpbusd per step; AVX2 (the same walk, compiled without VNNI): maddubs(q, x) summed in int16 over two steps
// (2 * 2 * 63 * 127 < 32768), madd to int32 added to the chain.
template <int MB, int NS>
__attribute__((target("avx2,fma,f16c"))) void q6k_rows_avx2(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                     int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i low4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b >> 3, jb = b & 7;
    for (int i = 0; i < NS; ++i) {
      const uint8_t* base = L.group(w, g0 + i) + sb * kQ6kGroupSb;
      const uint8_t* wb = base + jb * 256;
      const uint8_t* hb = base + kQ6kQh + jb * 128;
      prefetch_q6k_spread<stream_ahead<NS, MB>(kQ6kPrefetch, kQ6kPrefetch)>(base, jb);
      for (int s = 0; s < 4; ++s) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + stream_ahead<NS, MB>(kQ6kPrefetch, kQ6kPrefetch)), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        __m256i a[MB], a2[MB], p[MB], p2[MB];
        for (int j = 0; j < MB; ++j) {
          const int32_t* hc = qx.hc.data() + ((m0 + j) * nb + b) * 2;
          a[j] = _mm256_set1_epi32(hc[0]);
          a2[j] = _mm256_set1_epi32(hc[1]);
          p[j] = p2[j] = _mm256_setzero_si256();
        }
        for (int s = 0; s < 4; ++s) {
          const int e = s & 1;
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hb + (s >> 1) * 64 + 32 * h));
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32 * h));
          const __m256i hl = e == 0 ? _mm256_slli_epi16(qh, 4) : qh;
          const __m256i hh = e == 0 ? _mm256_slli_epi16(qh, 2) : _mm256_srli_epi16(qh, 2);
          const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, low4), _mm256_and_si256(hl, m30));
          const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), _mm256_and_si256(hh, m30));
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            p2[j] = _mm256_add_epi16(p2[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
            if (e == 1) {
              a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(p[j], ones));
              a2[j] = _mm256_add_epi32(a2[j], _mm256_madd_epi16(p2[j], ones));
              p[j] = p2[j] = _mm256_setzero_si256();
            }
          }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kQ6kD + 16 * h)));
        const auto widen = [](const uint8_t* q) __attribute__((target("avx2"))) {
          return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
        };
        const __m256 ds0 = _mm256_mul_ps(d, widen(base + kQ6kSc + 2 * jb * G + 8 * h));
        const __m256 ds1 = _mm256_mul_ps(d, widen(base + kQ6kSc + (2 * jb + 1) * G + 8 * h));
        for (int j = 0; j < MB; ++j) {
          const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[j]), _mm256_mul_ps(ds0, dx), acc[i][j][h]);
          acc[i][j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a2[j]), _mm256_mul_ps(ds1, dx), t);
        }
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

template <int MB, int NS>
__attribute__((target(QL_VNNI256))) void q6k_rows_vnni256(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                     int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i low4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b >> 3, jb = b & 7;
    for (int i = 0; i < NS; ++i) {
      const uint8_t* base = L.group(w, g0 + i) + sb * kQ6kGroupSb;
      const uint8_t* wb = base + jb * 256;
      const uint8_t* hb = base + kQ6kQh + jb * 128;
      prefetch_q6k_spread(base, jb);
      for (int s = 0; s < 4; ++s) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kQ6kPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        __m256i a[MB], a2[MB];
        for (int j = 0; j < MB; ++j) {
          const int32_t* hc = qx.hc.data() + ((m0 + j) * nb + b) * 2;
          a[j] = _mm256_set1_epi32(hc[0]);
          a2[j] = _mm256_set1_epi32(hc[1]);
        }
        for (int s = 0; s < 4; ++s) {
          const int e = s & 1;
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hb + (s >> 1) * 64 + 32 * h));
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32 * h));
          const __m256i hl = e == 0 ? _mm256_slli_epi16(qh, 4) : qh;
          const __m256i hh = e == 0 ? _mm256_slli_epi16(qh, 2) : _mm256_srli_epi16(qh, 2);
          const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, low4), _mm256_and_si256(hl, m30));
          const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), _mm256_and_si256(hh, m30));
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            a[j] = _mm256_dpbusd_avx_epi32(a[j], lo, _mm256_set1_epi32(xl));
            a2[j] = _mm256_dpbusd_avx_epi32(a2[j], hi, _mm256_set1_epi32(xh));
          }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kQ6kD + 16 * h)));
        const auto widen = [](const uint8_t* q) __attribute__((target("avx2"))) {
          return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
        };
        const __m256 ds0 = _mm256_mul_ps(d, widen(base + kQ6kSc + 2 * jb * G + 8 * h));
        const __m256 ds1 = _mm256_mul_ps(d, widen(base + kQ6kSc + (2 * jb + 1) * G + 8 * h));
        for (int j = 0; j < MB; ++j) {
          const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[j]), _mm256_mul_ps(ds0, dx), acc[i][j][h]);
          acc[i][j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a2[j]), _mm256_mul_ps(ds1, dx), t);
        }
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
template <bool VNNI>
void q6k_groups_256(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                    int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
#define QL_Q6K_CALL(MB, NS) \
  (VNNI ? q6k_rows_vnni256<MB, NS>(L, qx, m0, w, g0, out) : q6k_rows_avx2<MB, NS>(L, qx, m0, w, g0, out))
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2) {
      switch (mb) {
        case 1: QL_Q6K_CALL(1, kStreamsAvx2); break;
        case 2: QL_Q6K_CALL(2, kStreamsAvx2); break;
        case 3: QL_Q6K_CALL(3, kStreamsAvx2); break;
        default: QL_Q6K_CALL(4, kStreamsAvx2); break;
      }
    } else {
      switch (mb) {
        case 1: QL_Q6K_CALL(1, 1); break;
        case 2: QL_Q6K_CALL(2, 1); break;
        case 3: QL_Q6K_CALL(3, 1); break;
        default: QL_Q6K_CALL(4, 1); break;
      }
    }
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
#undef QL_Q6K_CALL
}
#endif  // QL_X86

// q6k's column groups [u0, u1) (and the tail rows as unit L.ng) on path ``isa``
void q6k_units(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0, int64_t u1,
               int isa, int streams) {
  for (int64_t u = u0; u < u1; ++u) {
    if (u == L.ng) {
      cols_scalar_q6k(L, qx, w, bias, y, L.ng * G, L.N);
      continue;
    }
#if QL_X86
    if (isa == ISA_VNNI512 && qx.M <= 8 && streams == 1 && bias == nullptr) {  // one stream, one register block
      const int64_t ge = std::min(u1, L.ng);
      by_rows<Q6kRows>(qx.M, L, qx, w, y, u, ge);
      u = ge - 1;
      continue;
    }
    if (isa == ISA_VNNI512) {
      const int ns = streams > 1 && u + kStreams <= std::min(u1, L.ng) ? kStreams : 1;
      q6k_groups_vnni(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
    if (isa == ISA_AVX2 || isa == ISA_AVXVNNI) {
      const bool side = streams > 1 && qx.M <= kMaxRowsQ4StreamsAvx2 && u + kStreamsAvx2 <= std::min(u1, L.ng);
      const int ns = side ? kStreamsAvx2 : 1;
      if (isa == ISA_AVXVNNI)
        q6k_groups_256<true>(L, qx, w, bias, y, u, ns);
      else
        q6k_groups_256<false>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
#endif
    group_scalar_q6k(L, qx, w, bias, y, u);
  }
}

}  // namespace
