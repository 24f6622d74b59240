// RoPE and attention's 8-lane walk (AVX2; the reference the 16-lane walk matches bit for bit).
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_common.h"

namespace {

// ------------------------------------------------------------------ attention
// RoPE, rotate-half convention (transformers'): out[i] = x[i]*cos[i] - x[i+h]*sin[i],
// out[i+h] = x[i+h]*cos[i+h] + x[i]*sin[i+h].
void rope(const float* x, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    out[i] = x[i] * cos[i] - x[i + h] * sin[i];
    out[i + h] = x[i + h] * cos[i + h] + x[i] * sin[i + h];
  }
}

// KV cache element types: fp32, or fp16/bf16 storage widened to fp32 on load (exactly).
using at::BFloat16;
using at::Half;

#if DOPS_X86
DOPS_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
DOPS_AVX2 inline __m256 load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
DOPS_AVX2 inline __m256 load8(const BFloat16* p) {  // bf16 is the top half of an fp32
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#endif
inline float widen(float x) { return x; }
inline float widen(Half x) { return static_cast<float>(x); }
inline float widen(BFloat16 x) { return static_cast<float>(x); }

// y[0, n) = x rounded to the storage type (c10's conversions: nearest even, as torch's .to()).
// Scalar on purpose: a step writes a few hundred values per layer, and this keeps the fused
// write bit-identical to the eager path's ``cache[...] = k``.
template <typename T>
inline void store_kv(const float* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(x, x + n, y);
  } else {
    for (int64_t k = 0; k < n; ++k) y[k] = static_cast<T>(x[k]);
  }
}

// dst[0, n) = src widened to fp32 (n a multiple of 8).
template <typename T>
DOPS_AVX2 inline void widen_rows(const T* src, float* dst, int64_t n) {
#if DOPS_X86
  for (int64_t k = 0; k < n; k += 8) _mm256_storeu_ps(dst + k, load8(src + k));
#endif
}

template <typename T>
DOPS_AVX2 inline float dot(const float* a, const T* b, int64_t D) {
  int64_t k = 0;
  float s = 0.f;
#if DOPS_X86
  __m256 acc = _mm256_setzero_ps();
  for (; k + 8 <= D; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), load8(b + k), acc);
  s = hsum8(acc);
#endif
  for (; k < D; ++k) s += a[k] * widen(b[k]);
  return s;
}

template <typename T>
DOPS_AVX2 inline void axpy(float a, const T* x, float* y, int64_t D) {
  int64_t k = 0;
#if DOPS_X86
  const __m256 av = _mm256_set1_ps(a);
  for (; k + 8 <= D; k += 8) _mm256_storeu_ps(y + k, _mm256_fmadd_ps(av, load8(x + k), _mm256_loadu_ps(y + k)));
#endif
  for (; k < D; ++k) y[k] += a * widen(x[k]);
}

// In place: s[j] = exp(s[j] - max) for j < n; returns the sum.
DOPS_AVX2 float softmax_numer(float* s, int64_t n) {
  float mx = -INFINITY;
  int64_t j = 0;
#if DOPS_X86
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  mx = hmax8(mv);
#endif
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.f;
  j = 0;
#if DOPS_X86
  const __m256 m8 = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m8));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum8(acc);
#endif
  for (; j < n; ++j) {
    s[j] = exp1(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// One query (already rotated) against keys [0, n) of one kv head, then the keys at slots
// extra_base + j for each bit j of ``extra`` (a tree query's ancestors; 0 for a chain), in that
// order: out = softmax(q.K^T * scale) V. K and V are stored as T (see load8).
template <typename T>
DOPS_AVX2 void attend_one(const float* q, const T* kbase, const T* vbase, int64_t kstride, int64_t n,
                          uint64_t extra, int64_t extra_base, int64_t D, float scale, float* scores, float* out) {
  for (int64_t j = 0; j < n; ++j) scores[j] = dot(q, kbase + j * kstride, D) * scale;
  int64_t m = n;
  for (uint64_t e = extra; e; e &= e - 1) scores[m++] = dot(q, kbase + (extra_base + __builtin_ctzll(e)) * kstride, D) * scale;
  const float inv = 1.0f / softmax_numer(scores, m);
  for (int64_t i = 0; i < D; ++i) out[i] = 0.f;
  for (int64_t j = 0; j < n; ++j) axpy(scores[j], vbase + j * kstride, out, D);
  m = n;
  for (uint64_t e = extra; e; e &= e - 1) axpy(scores[m++], vbase + (extra_base + __builtin_ctzll(e)) * kstride, out, D);
  for (int64_t i = 0; i < D; ++i) out[i] *= inv;
}

// All queries of one kv head (nq of them, rotated, [nq][NV*8]; query qi attends keys
// [0, nkeys[qi]), then, when ``extra`` is given, the keys at slots extra_base + j for each bit j
// of extra[qi], ascending) against keys [0, n_keys); n_keys is also the stride of S's rows.
//
// Why tiled: the queries of one kv head (every token of the pass times the heads sharing it)
// all read the same K and V rows. Query by query, each would stream them from L2 again (8
// cache lines per key at head_dim 64, the bottleneck of a verification pass); in tiles of
// kKeyTile keys, the tile stays in L1 while every query works on it.
//
// Bits: each score is one dot product as 8-lane FMAs then the hsum8 lane tree, times scale
// (keys in blocks of 8 reduce together with hsum8x8, which gives the same bits); the softmax
// is per query over its whole row; the weighted sum of V runs over keys in ascending order per
// query, its accumulators parked in ``acc_buf`` between tiles. That is attend_one's arithmetic,
// so a query's result is identical to it bit for bit, whatever other queries share the call. A
// tree query's extra keys come after its prefix, scored into the next entries of its row of S
// and summed after the prefix's tiles: the order of the same tokens fed as a chain.
//
// fp16/bf16 storage (T): each tile of K (then of V) is widened once into an fp32 tile that all
// the queries read, instead of every query converting every key again; the widening is exact, so
// the arithmetic, and the bits, are those of an fp32 cache holding the same values.
constexpr int64_t kKeyTile = 32;

#if DOPS_X86
// Each tile prefetches the next one's rows (K while scoring, V while summing): a pass reads a head's few KiB of
// cache once, and its first loads were DRAM misses (perf: most of the 16-lane walk's samples). 1.7B shape, 2,048
// keys, fp16, the 8-lane walk against the build before: a 9-token pass 134-137 -> 109-110 ms; two tiles ahead no
// better.
constexpr int64_t kPrefetchTiles = 1;
// the rows of keys [j, j + kKeyTile) (below ``used``) on their way to L1
template <typename T>
inline void prefetch_tile(const T* base, int64_t j, int64_t used, int64_t D) {
  if (j >= used) return;
  const char* p = reinterpret_cast<const char*>(base + j * D);
  const int64_t bytes = (std::min(j + kKeyTile, used) - j) * D * int64_t(sizeof(T));
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}
#endif

// A tile's keys as fp32: the cache itself (fp32 storage) or ``buf`` filled from it. Returns
// a pointer p such that key j (j0 <= j < j1) is at p + (j - j0) * D.
template <typename T>
DOPS_AVX2 inline const float* tile_f32(const T* base, int64_t j0, int64_t j1, int64_t D, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return base + j0 * D;
  } else {
    widen_rows(base + j0 * D, buf, (j1 - j0) * D);
    return buf;
  }
}

template <int NV, typename T>
DOPS_AVX2 void attend_grouped_t(const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base,
                                int64_t nq, const T* kbase, const T* vbase, int64_t n_keys, float scale,
                                float* S, float* acc_buf, float* const* outs) {
#if DOPS_X86
  constexpr int64_t D = NV * 8;
  const __m256 sc = _mm256_set1_ps(scale);
  alignas(32) float tbuf[std::is_same_v<T, float> ? 1 : kKeyTile * D];
  int64_t used = 0;  // keys any query reads: the tiles past it are not widened
  for (int64_t qi = 0; qi < nq; ++qi) used = std::max(used, nkeys[qi]);
  for (int64_t j0 = 0; j0 < used; j0 += kKeyTile) {
    prefetch_tile(kbase, j0 + kPrefetchTiles * kKeyTile, used, D);
    const float* kt = tile_f32(kbase, j0, std::min(j0 + kKeyTile, used), D, tbuf);
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t j1 = std::min(j0 + kKeyTile, nkeys[qi]);
      const float* q = Q + qi * D;
      float* s = S + qi * n_keys;
      int64_t j = j0;
      for (; j + 8 <= j1; j += 8) {
        __m256 acc[8];
        for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_setzero_ps();
        const float* kb = kt + (j - j0) * D;
        for (int i = 0; i < NV; ++i) {
          const __m256 qv = _mm256_loadu_ps(q + 8 * i);
          for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kb + kk * D + 8 * i), acc[kk]);
        }
        _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(acc), sc));
      }
      for (; j < j1; ++j) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < NV; ++i)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), _mm256_loadu_ps(kt + (j - j0) * D + 8 * i), acc);
        s[j] = hsum8(acc) * scale;
      }
    }
  }
  std::vector<float> inv(nq);
  if (extra != nullptr) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const float* q = Q + qi * D;
      float* s = S + qi * n_keys;
      int64_t m = nkeys[qi];
      for (uint64_t e = extra[qi]; e; e &= e - 1) {
        const T* kb = kbase + (extra_base + __builtin_ctzll(e)) * D;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < NV; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), load8(kb + 8 * i), acc);
        s[m++] = hsum8(acc) * scale;
      }
      inv[qi] = 1.0f / softmax_numer(s, m);
    }
  } else {
    for (int64_t qi = 0; qi < nq; ++qi) inv[qi] = 1.0f / softmax_numer(S + qi * n_keys, nkeys[qi]);
  }
  std::fill(acc_buf, acc_buf + nq * D, 0.f);
  for (int64_t j0 = 0; j0 < used; j0 += kKeyTile) {
    prefetch_tile(vbase, j0 + kPrefetchTiles * kKeyTile, used, D);
    const float* vt = tile_f32(vbase, j0, std::min(j0 + kKeyTile, used), D, tbuf);
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t j1 = std::min(j0 + kKeyTile, nkeys[qi]);
      if (j1 <= j0) continue;
      const float* s = S + qi * n_keys;
      float* a = acc_buf + qi * D;
      // at head_dim 128 / 256 the row's accumulators (16 / 32 ymm) do not fit AVX2's 16 registers and spilled on
      // every key: the tile's keys are walked once per 64 dimensions instead (each lane's sum in the same order)
      constexpr int CH = NV > 8 && NV % 8 == 0 ? 8 : NV;
      for (int c0 = 0; c0 < NV; c0 += CH) {
        __m256 acc[CH];
        for (int i = 0; i < CH; ++i) acc[i] = _mm256_loadu_ps(a + 8 * (c0 + i));
        for (int64_t j = j0; j < j1; ++j) {
          const __m256 wj = _mm256_set1_ps(s[j]);
          const float* vj = vt + (j - j0) * D + 8 * c0;
          for (int i = 0; i < CH; ++i) acc[i] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 8 * i), acc[i]);
        }
        for (int i = 0; i < CH; ++i) _mm256_storeu_ps(a + 8 * (c0 + i), acc[i]);
      }
    }
  }
  if (extra != nullptr) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const float* s = S + qi * n_keys;
      float* a = acc_buf + qi * D;
      __m256 acc[NV];
      for (int i = 0; i < NV; ++i) acc[i] = _mm256_loadu_ps(a + 8 * i);
      int64_t m = nkeys[qi];
      for (uint64_t e = extra[qi]; e; e &= e - 1) {
        const T* vb = vbase + (extra_base + __builtin_ctzll(e)) * D;
        const __m256 wj = _mm256_set1_ps(s[m++]);
        for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(wj, load8(vb + 8 * i), acc[i]);
      }
      for (int i = 0; i < NV; ++i) _mm256_storeu_ps(a + 8 * i, acc[i]);
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const __m256 iv = _mm256_set1_ps(inv[qi]);
    for (int i = 0; i < NV; ++i)
      _mm256_storeu_ps(outs[qi] + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(acc_buf + qi * D + 8 * i), iv));
  }
#endif
}

}  // namespace
