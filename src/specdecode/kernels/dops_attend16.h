// Attention's 16-lane walk (AVX-512F): the 8-lane walk's bits, two queries and 16 keys at a time.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_attend8.h"

namespace {

#if DOPS_X86
#define DOPS_512 __attribute__((target("avx512f,avx2,fma,f16c")))
DOPS_512 inline __m512 load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
DOPS_512 inline __m512 load16(const BFloat16* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// 8 values of key a's and of key b's row (at p, q) side by side, widened: [a | b]
DOPS_512 inline __m512 load8x2(const Half* p, const Half* q) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
}
DOPS_512 inline __m512 load8x2(const BFloat16* p, const BFloat16* q) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// _mm256_hadd_ps in each 128-bit lane of 512 bits: (x0 + x1, x2 + x3, y0 + y1, y2 + y3)
DOPS_512 inline __m512 hadd_512(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

// hsum8x8 of each 256-bit half of eight vectors at once: [hsum8x8(lows) | hsum8x8(highs)], the same additions in
// the same association (a 128-bit lane's hadd is its even and odd elements added), in half the instructions of
// two ymm calls and their eight extractions.
DOPS_512 inline __m512 hsum8x8_512(const __m512* a) {
  // L[k] = (a[k].q0, a[k+4].q0 | a[k].q2, a[k+4].q2), H[k] the odd quarters: each half's permute2f128 pair
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  __m512 b[4];
  for (int k = 0; k < 4; ++k) {
    const __m512 s = _mm512_add_ps(_mm512_permutex2var_ps(a[k], lo, a[k + 4]), _mm512_permutex2var_ps(a[k], hi, a[k + 4]));
    b[k] = _mm512_permute_ps(s, 0xD8);
  }
  return hadd_512(hadd_512(b[0], b[1]), hadd_512(b[2], b[3]));
}

// exp8 in 16 lanes: the same operations lane by lane, so the same bits
DOPS_512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(n));
}

// softmax_numer with its exponentials 16 lanes at a time (a pass's scores: ~10% of a 9-token pass's attention at
// 2,048 keys as exp8); the sum still adds 8-lane chunks in order into one 8-lane accumulator, so the same bits.
DOPS_512 float softmax_numer_512(float* s, int64_t n) {
  int64_t j = 0;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  float mx = hmax8(mv);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  const __m512 m16 = _mm512_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m16));
    _mm512_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  if (j + 8 <= n) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm512_castps512_ps256(m16)));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
    j += 8;
  }
  float sum = hsum8(acc);
  for (; j < n; ++j) {
    s[j] = exp1(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// attend_grouped_t's arithmetic, bit for bit, in 16 lanes (fp16 / bf16 storage, head_dim a multiple of 16). Why: on
// AVX-512 a 256-bit FMA does half the work of a 512-bit one in the same issue slot, and past the cache's misses a
// pass of several tokens is bound by these FMAs (1.7B shape, 2,048 keys, both walks prefetching: 5 / 9 tokens
// 1.12x / 1.13x the 8-lane walk's whole pass, one token the same; 512 keys 1.03x). Each lane does what a lane
// of the 8-wide walk does, in the same order: a score's 8 lanes sum its D / 8 chunks one after another, so two keys
// share a register (key k in lanes 0-7, key k + 8 in lanes 8-15 of a 16-key block: the K tile is widened in that
// order), and hsum8x8 reduces each half; the weighted sum of V takes 16 dimensions a register. Keys outside whole
// 16-key blocks take the 8-wide code on the same tile.
template <int NV, typename T>
DOPS_512 void attend_grouped_512(const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base,
                                 int64_t nq, const T* kbase, const T* vbase, int64_t n_keys, float scale, float* S,
                                 float* acc_buf, float* const* outs) {
  static_assert(NV % 2 == 0, "16-lane walk: head_dim a multiple of 16");
  constexpr int64_t D = NV * 8;
  const __m256 sc = _mm256_set1_ps(scale);
  const __m512 sc16 = _mm512_set1_ps(scale);
  alignas(64) float tbuf[kKeyTile * D];
  // key j of the tile (j < 32): block j / 16, pair p = j % 8, half h = (j % 16) / 8; chunk i's 8 values at
  // ((block * 8 + p) * NV + i) * 16 + 8h
  auto kat = [&](int64_t j, int64_t i) { return tbuf + (((j / 16) * 8 + j % 8) * NV + i) * 16 + 8 * ((j % 16) / 8); };
  int64_t used = 0;
  for (int64_t qi = 0; qi < nq; ++qi) used = std::max(used, nkeys[qi]);
  for (int64_t j0 = 0; j0 < used; j0 += kKeyTile) {
    const int64_t nt = std::min(kKeyTile, used - j0);
    prefetch_tile(kbase, j0 + kPrefetchTiles * kKeyTile, used, D);
    for (int64_t p0 = 0; p0 < nt; p0 += 16)  // pairs (p0 + p, p0 + 8 + p); a missing partner reads key p0 + p again
      for (int64_t p = 0; p < 8 && p0 + p < nt; ++p) {
        const T* a = kbase + (j0 + p0 + p) * D;
        const T* b = p0 + 8 + p < nt ? a + 8 * D : a;
        for (int i = 0; i < NV; ++i) _mm512_store_ps(kat(p0 + p, i), load8x2(a + 8 * i, b + 8 * i));
      }
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t j1 = std::min(j0 + kKeyTile, nkeys[qi]);
      const float* q = Q + qi * D;
      float* s = S + qi * n_keys;
      int64_t j = j0;
      for (; j + 16 <= j1; j += 16) {
        const float* blk = tbuf + (j - j0) / 16 * 8 * NV * 16;  // pair kk's chunk i at (kk * NV + i) * 16
        __m512 acc[8];
        for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm512_setzero_ps();
        for (int i = 0; i < NV; ++i) {
          const __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + 8 * i))));
          for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm512_fmadd_ps(qv, _mm512_load_ps(blk + (kk * NV + i) * 16), acc[kk]);
        }
        _mm512_storeu_ps(s + j, _mm512_mul_ps(hsum8x8_512(acc), sc16));
      }
      for (; j + 8 <= j1; j += 8) {  // a half block (keys j - j0 .. + 7 are one half of 8 pairs)
        const float* half = kat(j - j0, 0);
        __m256 acc[8];
        for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_setzero_ps();
        for (int i = 0; i < NV; ++i) {
          const __m256 qv = _mm256_loadu_ps(q + 8 * i);
          for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_fmadd_ps(qv, _mm256_load_ps(half + (kk * NV + i) * 16), acc[kk]);
        }
        _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(acc), sc));
      }
      for (; j < j1; ++j) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < NV; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), _mm256_load_ps(kat(j - j0, i)), acc);
        s[j] = hsum8(acc) * scale;
      }
    }
  }
  std::vector<float> inv(nq);
  for (int64_t qi = 0; qi < nq; ++qi) {
    float* s = S + qi * n_keys;
    int64_t m = nkeys[qi];
    if (extra != nullptr) {
      const float* q = Q + qi * D;
      for (uint64_t e = extra[qi]; e; e &= e - 1) {
        const T* kb = kbase + (extra_base + __builtin_ctzll(e)) * D;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < NV; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), load8(kb + 8 * i), acc);
        s[m++] = hsum8(acc) * scale;
      }
    }
    inv[qi] = 1.0f / softmax_numer_512(s, m);
  }
  std::fill(acc_buf, acc_buf + nq * D, 0.f);
  constexpr int CH = NV / 2 > 8 ? 8 : NV / 2;  // 16-lane accumulators a walk over the tile's keys (16 dimensions each)
  static_assert((NV / 2) % CH == 0, "whole chunks");
  for (int64_t j0 = 0; j0 < used; j0 += kKeyTile) {
    const int64_t nt = std::min(kKeyTile, used - j0);
    prefetch_tile(vbase, j0 + kPrefetchTiles * kKeyTile, used, D);
    for (int64_t k = 0; k < nt * D; k += 16) _mm512_store_ps(tbuf + k, load16(vbase + j0 * D + k));
    // two queries at a time: each key's FMAs feed two sets of chains, so the FMA latency no longer binds (one
    // query's CH chains took a key every 4 cycles); each query still adds its keys in ascending order
    int64_t qi = 0;
    for (; qi + 1 < nq; qi += 2) {
      const int64_t ja = std::min(j0 + kKeyTile, nkeys[qi]), jb = std::min(j0 + kKeyTile, nkeys[qi + 1]);
      const float* sa = S + qi * n_keys;
      const float* sb = sa + n_keys;
      float* aa = acc_buf + qi * D;
      float* ab = aa + D;
      const int64_t both = std::min(ja, jb);
      for (int c0 = 0; c0 < NV / 2; c0 += CH) {
        __m512 acc[CH], acc2[CH];
        for (int i = 0; i < CH; ++i) {
          acc[i] = _mm512_loadu_ps(aa + 16 * (c0 + i));
          acc2[i] = _mm512_loadu_ps(ab + 16 * (c0 + i));
        }
        int64_t j = j0;
        for (; j < both; ++j) {
          const __m512 wa = _mm512_set1_ps(sa[j]), wb = _mm512_set1_ps(sb[j]);
          const float* vj = tbuf + (j - j0) * D + 16 * c0;
          for (int i = 0; i < CH; ++i) {
            const __m512 v = _mm512_load_ps(vj + 16 * i);
            acc[i] = _mm512_fmadd_ps(wa, v, acc[i]);
            acc2[i] = _mm512_fmadd_ps(wb, v, acc2[i]);
          }
        }
        for (int64_t k = j; k < ja; ++k) {  // a later query's keys past the earlier one's (causal rows)
          const __m512 wa = _mm512_set1_ps(sa[k]);
          const float* vj = tbuf + (k - j0) * D + 16 * c0;
          for (int i = 0; i < CH; ++i) acc[i] = _mm512_fmadd_ps(wa, _mm512_load_ps(vj + 16 * i), acc[i]);
        }
        for (int64_t k = j; k < jb; ++k) {
          const __m512 wb = _mm512_set1_ps(sb[k]);
          const float* vj = tbuf + (k - j0) * D + 16 * c0;
          for (int i = 0; i < CH; ++i) acc2[i] = _mm512_fmadd_ps(wb, _mm512_load_ps(vj + 16 * i), acc2[i]);
        }
        for (int i = 0; i < CH; ++i) {
          _mm512_storeu_ps(aa + 16 * (c0 + i), acc[i]);
          _mm512_storeu_ps(ab + 16 * (c0 + i), acc2[i]);
        }
      }
    }
    for (; qi < nq; ++qi) {
      const int64_t j1 = std::min(j0 + kKeyTile, nkeys[qi]);
      if (j1 <= j0) continue;
      const float* s = S + qi * n_keys;
      float* a = acc_buf + qi * D;
      for (int c0 = 0; c0 < NV / 2; c0 += CH) {
        __m512 acc[CH];
        for (int i = 0; i < CH; ++i) acc[i] = _mm512_loadu_ps(a + 16 * (c0 + i));
        for (int64_t j = j0; j < j1; ++j) {
          const __m512 wj = _mm512_set1_ps(s[j]);
          const float* vj = tbuf + (j - j0) * D + 16 * c0;
          for (int i = 0; i < CH; ++i) acc[i] = _mm512_fmadd_ps(wj, _mm512_load_ps(vj + 16 * i), acc[i]);
        }
        for (int i = 0; i < CH; ++i) _mm512_storeu_ps(a + 16 * (c0 + i), acc[i]);
      }
    }
  }
  if (extra != nullptr) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const float* s = S + qi * n_keys;
      float* a = acc_buf + qi * D;
      int64_t m = nkeys[qi];
      for (uint64_t e = extra[qi]; e; e &= e - 1) axpy(s[m++], vbase + (extra_base + __builtin_ctzll(e)) * D, a, D);
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const __m256 iv = _mm256_set1_ps(inv[qi]);
    for (int i = 0; i < NV; ++i)
      _mm256_storeu_ps(outs[qi] + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(acc_buf + qi * D + 8 * i), iv));
  }
}
#endif

}  // namespace
