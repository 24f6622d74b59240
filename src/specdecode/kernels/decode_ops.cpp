// Fused decode-step ops for Llama-family layers on the CPU (fp32 activations).
//
// Why: a small model's decode step on a CPU is mostly dispatch, not arithmetic.
// The eager layer runs ~50 ATen ops (RoPE alone is a cat, a neg, two muls and an
// add; the KV write is two slice-assigns; attention is SDPA with a mask), each
// costing microseconds of Python and dispatcher time, for a few thousand FLOPs.
// Here a layer's non-matmul work is three calls: rms_norm, attention (RoPE on q
// and k, the KV-cache write and causal GQA attention over the cache in one
// pass) and silu_mul; the residual adds fuse into the norm that follows them.
//
// Every query is computed on its own, in the same order whatever the batch, the
// number of queries or the other rows: results are batch-invariant bit for bit,
// like the small-M linear kernel, so verification logits equal one-at-a-time
// logits exactly.
//
// Tree drafts: attention and stack_forward take optional positions (RoPE) and an
// optional tree mask over the new tokens (at most 64: one 64-bit ancestor set per
// query). A query then attends to its row's keys before the pass plus the new
// keys of its ancestors and itself, gathered in slot order, so its arithmetic is
// that of the same tokens fed as a plain chain: a tree node's output equals its
// root-to-node path's bit for bit, and a chain-shaped tree equals the causal pass.
//
// KV cache storage: fp32, fp16 or bf16 (``KVCache``'s dtype, chosen per model). The cache write
// rounds k and v once to the storage type (nearest even, as torch's own conversion does), and
// attention widens each stored key/value back to fp32 (exactly: every fp16/bf16 value is an
// fp32 value) and computes in fp32 as before. Why: at long context a decode step is mostly
// streaming the KV cache from memory, and half the bytes is about half that time.
//
// Only AVX2/FMA/F16C hosts use this (the Python side checks has_avx2(); every AVX2 CPU has
// F16C); the vector code carries per-function target attributes so the module itself loads on
// any x86-64 CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define DOPS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define DOPS_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define DOPS_X86 0
#define DOPS_AVX2
#endif

namespace {

bool detect_avx2() {
#if DOPS_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);  // not a __builtin_cpu_supports name
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

const bool kHasAvx2 = detect_avx2();

bool detect_avx512() {
#if DOPS_X86 && (defined(__GNUC__) || defined(__clang__))
  return kHasAvx2 && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Grouped attention's 16-lane walk (attend_grouped_512) where the CPU has AVX-512F and SPECDECODE_KERNEL_ISA does not
// ask for AVX2; set_attention_isa() later. The same bits either way.
bool attention_512_default() {
  const char* v = std::getenv("SPECDECODE_KERNEL_ISA");
  return detect_avx512() && !(v && std::string(v) == "avx2");
}
std::atomic<bool> g_attention_512{attention_512_default()};

#if DOPS_X86
DOPS_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// hsum8 of eight vectors at once: r[k] = hsum8(a[k]) bit for bit (the same additions in the same
// association, ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))), in 11 shuffles/adds instead of 40.
DOPS_AVX2 inline __m256 hsum8x8(const __m256* a) {
  __m256 b[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 lo = _mm256_permute2f128_ps(a[k], a[k + 4], 0x20);  // [low half of a[k], of a[k+4]]
    const __m256 hi = _mm256_permute2f128_ps(a[k], a[k + 4], 0x31);  // [high halves]
    b[k] = _mm256_permute_ps(_mm256_add_ps(lo, hi), 0xD8);  // per 128-bit lane: (p0, p2, p1, p3)
  }
  const __m256 c01 = _mm256_hadd_ps(b[0], b[1]);  // (p0+p2, p1+p3) of k = 0, 1 | of k = 4, 5
  const __m256 c23 = _mm256_hadd_ps(b[2], b[3]);
  return _mm256_hadd_ps(c01, c23);  // (r0, r1, r2, r3 | r4, r5, r6, r7)
}

DOPS_AVX2 inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 lanes, Cephes' expf polynomial (about 1 ulp on the range softmax uses).
DOPS_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
#endif

// The scalar twin of exp8 (tails shorter than 8 lanes), same polynomial.
inline float exp1(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  x = x - fx * 0.693359375f;
  x = x - fx * -2.12194440e-4f;
  float y = 1.9875691500E-4f;
  y = y * x + 1.3981999507E-3f;
  y = y * x + 8.3334519073E-3f;
  y = y * x + 4.1665795894E-2f;
  y = y * x + 1.6666665459E-1f;
  y = y * x + 5.0000001201E-1f;
  y = y * (x * x) + (x + 1.0f);
  return std::ldexp(y, static_cast<int>(fx));
}

// ------------------------------------------------------------------ RMSNorm
DOPS_AVX2 void rms_row(const float* x, const float* w, float eps, float* y, int64_t D) {
  int64_t k = 0;
  float ss = 0.f;
#if DOPS_X86
  __m256 acc = _mm256_setzero_ps();
  for (; k + 8 <= D; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  ss = hsum8(acc);
#endif
  for (; k < D; ++k) ss += x[k] * x[k];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
  k = 0;
#if DOPS_X86
  const __m256 rv = _mm256_set1_ps(r);
  for (; k + 8 <= D; k += 8)
    _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), rv), _mm256_loadu_ps(w + k)));
#endif
  for (; k < D; ++k) y[k] = x[k] * r * w[k];
}

DOPS_AVX2 void add_row(float* x, const float* d, int64_t D) {
  int64_t k = 0;
#if DOPS_X86
  for (; k + 8 <= D; k += 8)
    _mm256_storeu_ps(x + k, _mm256_add_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(d + k)));
#endif
  for (; k < D; ++k) x[k] += d[k];
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1,
              "decode_ops: ", name, " must be a contiguous fp32 CPU tensor");
}

void check_norm_weight(const at::Tensor& w, int64_t D) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 1 &&
                  w.size(0) == D,
              "decode_ops: the norm weight must be a contiguous fp32 [", D, "] tensor");
}

// y = x * rsqrt(mean(x^2) + eps) * w over the last dim.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  const int64_t D = x.size(-1), R = x.numel() / std::max<int64_t>(D, 1);
  check_norm_weight(w, D);
  at::Tensor y = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) rms_row(xp + r * D, wp, static_cast<float>(eps), yp + r * D, D);
  return y;
}

// x += delta (in place), then return rms_norm(x): the residual add and the next norm in one pass.
at::Tensor add_rms_norm_(at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(delta, "delta");
  TORCH_CHECK(delta.sizes() == x.sizes(), "decode_ops: delta and x differ in shape");
  const int64_t D = x.size(-1), R = x.numel() / std::max<int64_t>(D, 1);
  check_norm_weight(w, D);
  at::Tensor y = at::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float *dp = delta.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    add_row(xp + r * D, dp + r * D, D);
    rms_row(xp + r * D, wp, static_cast<float>(eps), yp + r * D, D);
  }
  return y;
}

// ------------------------------------------------------------------ SiLU-gated MLP
DOPS_AVX2 void silu_mul_row(const float* g, const float* u, float* y, int64_t F) {
  int64_t k = 0;
#if DOPS_X86
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; k + 8 <= F; k += 8) {
    const __m256 gv = _mm256_loadu_ps(g + k);
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_xor_ps(gv, sign))));
    _mm256_storeu_ps(y + k, _mm256_mul_ps(s, _mm256_loadu_ps(u + k)));
  }
#endif
  for (; k < F; ++k) y[k] = g[k] / (1.0f + exp1(-g[k])) * u[k];
}

// gu [..., 2F] holds gate then up (the fused gate/up projection); returns silu(gate) * up [..., F].
at::Tensor silu_mul(const at::Tensor& gu) {
  check_rows(gu, "gate_up");
  const int64_t F2 = gu.size(-1);
  TORCH_CHECK(F2 % 2 == 0, "decode_ops: gate_up's last dim must be even");
  const int64_t F = F2 / 2, R = gu.numel() / std::max<int64_t>(F2, 1);
  std::vector<int64_t> shape(gu.sizes().begin(), gu.sizes().end());
  shape.back() = F;
  at::Tensor y = at::empty(shape, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) silu_mul_row(gp + r * F2, gp + r * F2 + F, yp + r * F, F);
  return y;
}

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

// The 16-lane walk where it applies (AVX-512, fp16 / bf16 storage, NV even), else the 8-lane one
template <int NV, typename T>
void attend_grouped_nv(const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base, int64_t nq,
                       const T* kbase, const T* vbase, int64_t n_keys, float scale, float* S, float* acc_buf,
                       float* const* outs) {
#if DOPS_X86
  if constexpr (NV % 2 == 0 && !std::is_same_v<T, float>) {
    if (g_attention_512.load(std::memory_order_relaxed)) {
      attend_grouped_512<NV, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs);
      return;
    }
  }
#endif
  attend_grouped_t<NV, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs);
}

template <typename T>
void attend_grouped(int64_t nv, const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base,
                    int64_t nq, const T* kbase, const T* vbase, int64_t n_keys, float scale, float* S,
                    float* acc_buf, float* const* outs) {
  switch (nv) {
#define DOPS_CASE(N) \
  case N: attend_grouped_nv<N, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs); break;
    DOPS_CASE(1) DOPS_CASE(2) DOPS_CASE(3) DOPS_CASE(4) DOPS_CASE(5) DOPS_CASE(6) DOPS_CASE(7) DOPS_CASE(8)
    DOPS_CASE(9) DOPS_CASE(10) DOPS_CASE(11) DOPS_CASE(12) DOPS_CASE(13) DOPS_CASE(14) DOPS_CASE(15) DOPS_CASE(16)
    DOPS_CASE(32)  // head_dim 256 (Gemma 3)
#undef DOPS_CASE
    default: TORCH_CHECK(false, "decode_ops: grouped attention needs head_dim/8 in 1..16 or 32");
  }
}

// The optional tree arguments as raw arrays, checked once per pass (stack_forward: not per layer).
struct TreeArgs {
  at::Tensor positions;  // int64 [B, T] contiguous, or undefined
  std::vector<int64_t> depth_pos;  // a tree's default positions: start + depth (ancestors), when none given
  std::vector<uint64_t> anc;  // per (b, t): bit j = new token j is t itself or an ancestor; empty = causal chain
  const int64_t* pos() const {
    return positions.defined() ? positions.data_ptr<int64_t>() : depth_pos.empty() ? nullptr : depth_pos.data();
  }
  const uint64_t* bits() const { return anc.empty() ? nullptr : anc.data(); }
};

TreeArgs tree_args(const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask,
                   const std::vector<int64_t>& starts, int64_t T) {
  const int64_t B = static_cast<int64_t>(starts.size());
  TreeArgs a;
  if (positions.has_value() && positions->defined()) {
    const at::Tensor& p = *positions;
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == at::kLong && p.dim() == 2 && p.size(0) == B &&
                    p.size(1) == T,
                "decode_ops: positions must be an int64 [B, T] CPU tensor (B = ", B, ", T = ", T, ")");
    a.positions = p.contiguous();
  }
  if (tree_mask.has_value() && tree_mask->defined()) {
    const at::Tensor& m = *tree_mask;
    TORCH_CHECK(T <= 64, "decode_ops: a tree mask covers at most 64 new tokens per pass, got ", T,
                " (use the eager path or a smaller tree)");
    TORCH_CHECK(m.device().is_cpu() && (m.scalar_type() == at::kBool || m.scalar_type() == at::kByte) &&
                    ((m.dim() == 3 && m.size(0) == B && m.size(1) == T && m.size(2) == T) ||
                     (m.dim() == 2 && m.size(0) == T && m.size(1) == T)),
                "decode_ops: tree_mask must be a bool [B, T, T] or [T, T] CPU tensor (B = ", B, ", T = ", T, ")");
    const at::Tensor mc = m.contiguous();
    const uint8_t* mp = static_cast<const uint8_t*>(mc.data_ptr());
    const bool shared = m.dim() == 2;
    a.anc.resize(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        const uint8_t* r = mp + ((shared ? 0 : b) * T + i) * T;
        uint64_t bits = uint64_t(1) << i;  // a token always sees itself
        for (int64_t j = 0; j < T; ++j)
          if (r[j]) bits |= uint64_t(1) << j;
        a.anc[b * T + i] = bits;
      }
    if (!a.positions.defined()) {
      a.depth_pos.resize(B * T);
      for (int64_t i = 0; i < B * T; ++i) a.depth_pos[i] = starts[i / T] + __builtin_popcountll(a.anc[i]) - 1;
    }
  }
  return a;
}

// The KV storage types attention reads and writes (KVCache's dtype).
bool kv_dtype_ok(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

template <typename T>
at::Tensor attention_typed(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H,
                           int64_t KV, int64_t D, double scale, const TreeArgs& tree, int64_t window);

// qkv [B, T, (H + 2*KV) * D] (q heads, then k heads, then v heads, as the fused projection
// writes them); cos/sin [max_len, D]; k_cache/v_cache [rows, KV, max_len, D] (one layer).
// For batch row b and token t at slot p = starts[b] + t: rotates q and k with RoPE at
// pos[b, t] (default p), writes k and v into cache row row0 + b at slot p, then attends every
// q head to the keys at slots 0..p of its kv head, or with a tree, to slots [0, starts[b]) and
// starts[b] + j for each ancestor-or-self j of t. Returns [B, T, H * D]. The cache is fp32, fp16 or
// bf16 (k and v alike): new keys/values are rounded to it once, stored ones widened exactly.
// ``window`` > 0 (a sliding-window layer, Gemma 3's): a query at position r also skips the cached keys
// at slots below r - window + 1 (transformers' kv > q - window). The cache before a pass is a chain
// (slot = position), and a tree's own keys sit within any window wider than the pass. Such a call
// takes the per-query path, whose sum over keys in ascending order is the same for any first key.
at::Tensor attention_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                          at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV,
                          int64_t D, double scale, const TreeArgs& tree, int64_t window = 0) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * D, "decode_ops: qkv must be [B, T, (H+2KV)*D]");
  TORCH_CHECK(H % KV == 0 && D % 2 == 0, "decode_ops: heads must be a multiple of kv heads and head_dim even");
  const int64_t B = qkv.size(0), T = qkv.size(1);
  TORCH_CHECK(static_cast<int64_t>(starts.size()) == B, "decode_ops: one start per batch row");
  for (const at::Tensor* c : {&k_cache, &v_cache}) {
    TORCH_CHECK(c->device().is_cpu() && kv_dtype_ok(c->scalar_type()) && c->dim() == 4 && c->size(1) == KV &&
                    c->size(3) == D && c->stride(3) == 1 && c->stride(2) == D,
                "decode_ops: the KV cache must be fp32, fp16 or bf16 [rows, KV, max_len, D] with contiguous "
                "positions");
  }
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "decode_ops: k and v caches differ in layout or dtype");
  const int64_t L = k_cache.size(2);
  TORCH_CHECK(row0 >= 0 && row0 + B <= k_cache.size(0), "decode_ops: cache rows out of range");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == D && sin.sizes() == cos.sizes(), "decode_ops: cos/sin must be [max_len, D]");
  const int64_t* pos = tree.pos();
  const int64_t max_pos = pos ? L : std::min(L, cos.size(0));
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(starts[b] >= 0 && starts[b] + T <= max_pos,
                "decode_ops: positions ", starts[b], "..", starts[b] + T, " exceed the cache or RoPE table");
  if (pos != nullptr)
    for (int64_t i = 0; i < B * T; ++i)
      TORCH_CHECK(pos[i] >= 0 && pos[i] < cos.size(0), "decode_ops: position ", pos[i], " outside the RoPE table");
  TORCH_CHECK(window <= 0 || tree.bits() == nullptr || window > T,
              "decode_ops: a sliding window must be wider than a tree pass (", window, " <= ", T, ")");
  switch (k_cache.scalar_type()) {
    case at::kHalf:
      return attention_typed<Half>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
    case at::kBFloat16:
      return attention_typed<BFloat16>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
    default:
      return attention_typed<float>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
  }
}

// attention_impl after its checks, for KV storage T.
template <typename T>
at::Tensor attention_typed(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H,
                           int64_t KV, int64_t D, double scale, const TreeArgs& tree, int64_t window) {
  const int64_t B = qkv.size(0), NT = qkv.size(1);
  const int64_t* pos = tree.pos();
  const uint64_t* anc = tree.bits();
  const int64_t W = (H + 2 * KV) * D;
  const float* src = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  T* kc = static_cast<T*>(k_cache.data_ptr());
  T* vc = static_cast<T*>(v_cache.data_ptr());
  const int64_t s_row = k_cache.stride(0), s_head = k_cache.stride(1);

  // 1) RoPE on k and the cache writes (rounded once to the storage type), for all new tokens
  // (later queries attend to earlier new keys, as stored).
  std::vector<float> krot(D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < NT; ++t) {
      const int64_t p = starts[b] + t, r = pos ? pos[b * NT + t] : p;
      const float* tok = src + (b * NT + t) * W;
      for (int64_t g = 0; g < KV; ++g) {
        const int64_t off = (row0 + b) * s_row + g * s_head + p * D;
        rope(tok + (H + g) * D, cp + r * D, sp + r * D, krot.data(), D);
        store_kv(krot.data(), kc + off, D);
        store_kv(tok + (H + KV + g) * D, vc + off, D);
      }
    }
  }
  // 2) Attention. Head dims that are a multiple of 8 (up to 128, or 256): one unit per (row, kv head)
  // with all its queries together (each key is loaded once for all of them, outputs stay in
  // registers); anything else: one query at a time. Both do each query's arithmetic in the
  // same order, so a query's result does not depend on which other queries share the call.
  // A sliding-window layer takes the grouped walk where its queries share their first key: a
  // one-token chain step (its first key shifted to the window's), or a pass no key of which is
  // outside any query's window; else the per-query walk, which skips keys query by query.
  at::Tensor out = at::empty({B, NT, H * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const int64_t group = H / KV;
  const int64_t max_keys = *std::max_element(starts.begin(), starts.end()) + NT;
  const bool one_step = NT == 1 && anc == nullptr && pos == nullptr;  // every query of a unit at one position
  const bool window_whole = window <= 0 || one_step || (anc == nullptr && pos == nullptr && max_keys <= window);
  const bool grouped = D % 8 == 0 && (D <= 128 || D == 256) && window_whole;
  const int64_t work = grouped ? B * KV : B * NT * H;
  const int64_t per_unit = (grouped ? NT * group : 1) * max_keys * D * 2;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, per_unit));
  at::parallel_for(0, work, grain, [&](int64_t w0, int64_t w1) {
    if (grouped) {
      // queries in blocks of tokens so the score buffer stays bounded (~4 MB) on long prefills;
      // a query's result does not depend on the block it is in
      const int64_t tb = std::max<int64_t>(1, std::min<int64_t>(NT, (int64_t(1) << 20) / (group * max_keys)));
      std::vector<float> qbuf(tb * group * D), scores(tb * group * max_keys), acc_buf(tb * group * D);
      std::vector<int64_t> nkeys(tb * group);
      std::vector<uint64_t> extra(anc ? tb * group : 0);
      std::vector<float*> outs(tb * group);
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / KV, g = w % KV;
        // a windowed one-token step: its keys from the window's first (attend_one's lo), for every query alike
        const int64_t lo = window > 0 && one_step ? std::max<int64_t>(0, starts[b] - window + 1) : 0;
        const int64_t off = (row0 + b) * s_row + g * s_head + lo * D;
        for (int64_t t0 = 0; t0 < NT; t0 += tb) {
          const int64_t t1 = std::min(NT, t0 + tb);
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t p = starts[b] + t, r = pos ? pos[b * NT + t] : p;
            for (int64_t hh = 0; hh < group; ++hh) {
              const int64_t qi = (t - t0) * group + hh, h = g * group + hh;
              rope(src + (b * NT + t) * W + h * D, cp + r * D, sp + r * D, qbuf.data() + qi * D, D);
              nkeys[qi] = (anc ? starts[b] : p + 1) - lo;
              if (anc) extra[qi] = anc[b * NT + t];
              outs[qi] = op + (b * NT + t) * H * D + h * D;
            }
          }
          // a tree query may read any of the pass's keys (prefix + at most NT): that bounds its row of scores
          attend_grouped(D / 8, qbuf.data(), nkeys.data(), anc ? extra.data() : nullptr, starts[b] - lo,
                         (t1 - t0) * group, kc + off, vc + off, starts[b] - lo + (anc ? NT : t1),
                         static_cast<float>(scale), scores.data(), acc_buf.data(), outs.data());
        }
      }
      return;
    }
    std::vector<float> scores(max_keys);
    std::vector<float> q(D);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (NT * H), t = (w / H) % NT, h = w % H;
      const int64_t p = starts[b] + t, g = h / group, r = pos ? pos[b * NT + t] : p;
      rope(src + (b * NT + t) * W + h * D, cp + r * D, sp + r * D, q.data(), D);
      const int64_t n = anc ? starts[b] : p + 1;
      const int64_t lo = window > 0 ? std::min(n, std::max<int64_t>(0, r - window + 1)) : 0;
      const int64_t off = (row0 + b) * s_row + g * s_head + lo * D;
      attend_one(q.data(), kc + off, vc + off, D, n - lo, anc ? anc[b * NT + t] : 0, starts[b] - lo, D,
                 static_cast<float>(scale), scores.data(), op + (b * NT + t) * H * D + h * D);
    }
  });
  return out;
}

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV,
                     int64_t D, double scale, const std::optional<at::Tensor>& positions,
                     const std::optional<at::Tensor>& tree_mask, int64_t window) {
  TORCH_CHECK(qkv.dim() == 3, "decode_ops: qkv must be [B, T, (H+2KV)*D]");
  return attention_impl(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale,
                        tree_args(positions, tree_mask, starts, qkv.size(1)), window);
}

// ------------------------------------------------------------------ embedding
// tokens [B, T] int64 -> rows of the (fp32 or bf16) embedding matrix as a new fp32 [B, T, dim]
// tensor (the residual stream the stack updates in place); one call for what is three ops in Python.
at::Tensor embed(const at::Tensor& tokens, const at::Tensor& table) {
  TORCH_CHECK(tokens.device().is_cpu() && tokens.scalar_type() == at::kLong && tokens.dim() == 2,
              "decode_ops: tokens must be an int64 [B, T] CPU tensor");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() &&
                  (table.scalar_type() == at::kFloat || table.scalar_type() == at::kBFloat16),
              "decode_ops: the embedding must be a contiguous fp32 or bf16 [vocab, dim] tensor");
  const int64_t B = tokens.size(0), T = tokens.size(1), V = table.size(0), Dm = table.size(1);
  at::Tensor out = at::empty({B, T, Dm}, tokens.options().dtype(at::kFloat));
  const at::Tensor tok = tokens.contiguous();
  const int64_t* ids = tok.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t id = ids[r];
    TORCH_CHECK(id >= 0 && id < V, "decode_ops: token id ", id, " is outside the vocabulary of ", V);
    if (table.scalar_type() == at::kFloat) {
      const float* src = table.data_ptr<float>() + id * Dm;
      std::copy(src, src + Dm, op + r * Dm);
    } else {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(table.data_ptr<at::BFloat16>()) + id * Dm;
      for (int64_t k = 0; k < Dm; ++k) {
        const uint32_t bits = static_cast<uint32_t>(src[k]) << 16;
        std::memcpy(op + r * Dm + k, &bits, sizeof(float));
      }
    }
  }
  return out;
}

// ------------------------------------------------------------------ argmax
// Index of the first maximum of x[0, n), NaN counting as the maximum (torch.argmax's rule).
// Why: greedy decoding takes an argmax over the vocabulary for every verified row and draft
// step, and ATen's costs 9 us per 8192-entry row here, against a draft step of ~100 us.
DOPS_AVX2 int64_t argmax_row(const float* x, int64_t n) {
  int64_t j = 0;
  float mx = -INFINITY;
#if DOPS_X86
  __m256 mv = _mm256_set1_ps(-INFINITY);
  __m256 nan = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    mv = _mm256_max_ps(mv, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan)) {
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return i;
  }
  mx = hmax8(mv);
#endif
  for (; j < n; ++j) {
    if (std::isnan(x[j])) return j;
    mx = std::max(mx, x[j]);
  }
  j = 0;
#if DOPS_X86
  const __m256 m8 = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), m8, _CMP_EQ_OQ));
    if (mask) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
#endif
  for (; j < n; ++j)
    if (x[j] == mx) return j;
  return 0;  // n == 0 or every entry -inf below the first: torch returns 0 for an all -inf row too
}

// Per row of a 2-D fp32 tensor [R, n] (contiguous rows): the argmax indices as a Python list.
std::vector<int64_t> argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) > 0 &&
                  x.stride(1) == 1,
              "decode_ops: argmax_rows needs a CPU fp32 [rows, n] tensor with contiguous rows");
  std::vector<int64_t> out(x.size(0));
  const float* p = x.data_ptr<float>();
  for (int64_t r = 0; r < x.size(0); ++r) out[r] = argmax_row(p + r * x.stride(0), x.size(1));
  return out;
}

// ------------------------------------------------------------------ sampling
// One draw per row of non-negative weights [R, n] (not necessarily normalised) by inverse CDF:
// the first index whose cumulative weight (summed in double) exceeds u[r] * total, u in [0, 1).
// Returns -1 for a row whose weights are negative, inf or nan somewhere, or sum to zero.
// Why: torch.multinomial costs ~180 us per 8192-entry row on this CPU and torch's cumsum ~10 us.
// Sum of p[0, n) in double with independent partial sums (a chain of dependent adds would cost
// 4 cycles per entry); false in ok when an entry is negative, inf or nan.
inline double checked_sum(const float* p, int64_t n, bool& ok) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  bool good = true;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) {
      good &= p[j + k] >= 0.f && p[j + k] < INFINITY;  // false for nan
      part[k] += p[j + k];
    }
  for (; j < n; ++j) {
    good &= p[j] >= 0.f && p[j] < INFINITY;
    part[0] += p[j];
  }
  ok = good;
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

std::vector<int64_t> sample_rows(const at::Tensor& w, const std::vector<double>& u) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.size(1) > 0 &&
                  w.stride(1) == 1 && static_cast<int64_t>(u.size()) == w.size(0),
              "decode_ops: sample_rows needs CPU fp32 weights [rows, n] with contiguous rows and one u per row");
  constexpr int64_t kBlock = 32;
  const int64_t R = w.size(0), n = w.size(1);
  std::vector<int64_t> out(R, -1);
  for (int64_t r = 0; r < R; ++r) {
    const float* p = w.data_ptr<float>() + r * w.stride(0);
    bool ok = true;
    const double total = checked_sum(p, n, ok);
    if (!ok || !(total > 0.0)) continue;
    // the cumulative weight, whole blocks at a time until the block that crosses u * total
    const double target = u[r] * total;
    double cum = 0.0;
    int64_t last = -1;
    for (int64_t b = 0; b < n && out[r] < 0; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool unused = true;
      const double bs = checked_sum(p + b, e - b, unused);
      if (bs > 0.0) last = b;  // a block holding weight (refined below if the walk ends without a hit)
      if (cum + bs <= target) {
        cum += bs;
        continue;
      }
      for (int64_t j = b; j < e; ++j) {
        cum += p[j];
        if (cum > target) {
          out[r] = j;
          break;
        }
      }
    }
    if (out[r] < 0) {  // u * total rounded up past the walk's sum: the last entry with weight
      for (int64_t j = std::min(n, last + kBlock) - 1; j >= 0; --j)
        if (p[j] > 0.f) {
          out[r] = j;
          break;
        }
    }
  }
  return out;
}

// ------------------------------------------------------------------ whole decoder stack
// A Llama-family stack's weights, gathered once (the Python side caches it per model), so a
// forward is one call: a small model's step otherwise spends a third of its time going back
// and forth between Python and ~10 C++ calls per layer.
struct Stack {
  // bqkv entries may be undefined; so may wv's: where defined, v's rows held apart from q|k's (another format)
  std::vector<at::Tensor> wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv;
  at::Tensor final_norm;
};

using LinearFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool);

// The small-M kernel through its address (0: eager at::linear, weights widened to x's dtype).
at::Tensor lin(uintptr_t fn, bool bf16_dot, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const std::optional<at::Tensor> bias = b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
  if (fn) return reinterpret_cast<LinearFn>(fn)(x, w, bias, bf16_dot);
  const at::Tensor wc = w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
  std::optional<at::Tensor> bc = bias;
  if (bc.has_value() && bc->scalar_type() != x.scalar_type()) bc = bc->to(x.scalar_type());
  return at::linear(x, wc, bc);
}

// x [B, T, dim] fp32 (updated in place: the residual stream); returns the final-normed hidden
// state [B, T or 1, dim] for the output projection. Same ops, same order as the Python loop.
// ``states`` (when not null) gets, for each capture[k], a copy of the residual stream after
// that layer ([B, T or 1, dim], following last_only).
at::Tensor stack_run(const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers, int64_t row0,
                     const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D, double eps, double scale,
                     bool last_only, uintptr_t linear_fn, bool bf16_dot, const TreeArgs& tree,
                     const std::vector<int64_t>& capture, std::vector<at::Tensor>* states) {
  const size_t n = st.wqkv.size();
  TORCH_CHECK(n > 0 && k_layers.size() == n && v_layers.size() == n, "decode_ops: one cache per layer");
  for (const int64_t c : capture)
    TORCH_CHECK(c >= 0 && c < static_cast<int64_t>(n), "decode_ops: layer ", c, " outside 0..", n - 1);
  if (states != nullptr) states->assign(capture.size(), at::Tensor());
  at::Tensor h = rms_norm(x, st.attn_norm[0], eps);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor qkv;
    if (st.wv[i].defined()) {  // q|k and v apart, joined; the bias after the join (the kernel's one fp32 add)
      qkv = at::cat({lin(linear_fn, bf16_dot, h, st.wqkv[i], at::Tensor()),
                     lin(linear_fn, bf16_dot, h, st.wv[i], at::Tensor())}, -1);
      if (st.bqkv[i].defined()) qkv.add_(st.bqkv[i]);
    } else {
      qkv = lin(linear_fn, bf16_dot, h, st.wqkv[i], st.bqkv[i]);
    }
    at::Tensor kc = k_layers[i], vc = v_layers[i];
    at::Tensor attn = attention_impl(qkv, cos, sin, kc, vc, row0, starts, H, KV, D, scale, tree);
    h = add_rms_norm_(x, lin(linear_fn, bf16_dot, attn, st.wo[i], at::Tensor()), st.mlp_norm[i], eps);
    at::Tensor down = lin(linear_fn, bf16_dot, silu_mul(lin(linear_fn, bf16_dot, h, st.w13[i], at::Tensor())),
                          st.w2[i], at::Tensor());
    if (i + 1 < n) {
      h = add_rms_norm_(x, down, st.attn_norm[i + 1], eps);
    } else if (!last_only) {
      h = add_rms_norm_(x, down, st.final_norm, eps);
    } else {
      x.add_(down);
      h = rms_norm(x.narrow(1, x.size(1) - 1, 1).contiguous(), st.final_norm, eps);
    }
    if (states != nullptr)
      for (size_t k = 0; k < capture.size(); ++k)
        if (capture[k] == static_cast<int64_t>(i))
          (*states)[k] = (last_only ? x.narrow(1, x.size(1) - 1, 1) : x).clone();
  }
  return h;
}

// The blocks the Llama stack above lacks (Gemma 3's, Qwen 3's): per layer, optionally, q and k norms (each head,
// before RoPE), norms after attention and after the MLP (Gemma's sandwich), a GELU-tanh gate, a sliding window
// and the local RoPE tables. The ops and their order are LlamaModel._forward_blocks' (models/llama.py), so the
// bits are too: one call instead of ~15 from Python a layer.
struct BlockStack {
  // per layer; bqkv, wv, q_norm, k_norm, post_attn and post_mlp entries may be undefined
  std::vector<at::Tensor> wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv, q_norm, k_norm, post_attn, post_mlp;
  std::vector<int64_t> window;  // 0: attends over the whole cache
  std::vector<bool> local_rope, gelu;
  at::Tensor final_norm;
};

at::Tensor blocks_forward(const BlockStack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& cos_local, const at::Tensor& sin_local,
                          const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers,
                          int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D,
                          double eps, double scale, bool last_only, uintptr_t linear_fn, bool bf16_dot,
                          const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  const size_t n = st.wqkv.size();
  TORCH_CHECK(n > 0 && k_layers.size() == n && v_layers.size() == n, "decode_ops: one cache per layer");
  const TreeArgs tree = tree_args(positions, tree_mask, starts, x.size(1));
  at::Tensor h = rms_norm(x, st.attn_norm[0], eps);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor qkv;
    if (st.wv[i].defined()) {
      qkv = at::cat({lin(linear_fn, bf16_dot, h, st.wqkv[i], at::Tensor()),
                     lin(linear_fn, bf16_dot, h, st.wv[i], at::Tensor())}, -1);
      if (st.bqkv[i].defined()) qkv.add_(st.bqkv[i]);
    } else {
      qkv = lin(linear_fn, bf16_dot, h, st.wqkv[i], st.bqkv[i]);
    }
    if (st.q_norm[i].defined() && st.k_norm[i].defined()) {
      at::Tensor heads = qkv.view({qkv.size(0), qkv.size(1), H + 2 * KV, D});
      heads.narrow(2, 0, H).copy_(rms_norm(heads.narrow(2, 0, H).contiguous(), st.q_norm[i], eps));
      heads.narrow(2, H, KV).copy_(rms_norm(heads.narrow(2, H, KV).contiguous(), st.k_norm[i], eps));
    }
    at::Tensor kc = k_layers[i], vc = v_layers[i];
    const bool local = st.local_rope[i];
    at::Tensor attn = attention_impl(qkv, local ? cos_local : cos, local ? sin_local : sin, kc, vc, row0, starts, H,
                                     KV, D, scale, tree, st.window[i]);
    at::Tensor out = lin(linear_fn, bf16_dot, attn, st.wo[i], at::Tensor());
    if (st.post_attn[i].defined()) out = rms_norm(out, st.post_attn[i], eps);
    h = add_rms_norm_(x, out, st.mlp_norm[i], eps);
    at::Tensor gate_up = lin(linear_fn, bf16_dot, h, st.w13[i], at::Tensor());
    at::Tensor act;
    if (st.gelu[i]) {
      const int64_t ffn = gate_up.size(-1) / 2;
      act = at::gelu(gate_up.narrow(-1, 0, ffn), "tanh") * gate_up.narrow(-1, ffn, ffn);
    } else {
      act = silu_mul(gate_up);
    }
    at::Tensor down = lin(linear_fn, bf16_dot, act, st.w2[i], at::Tensor());
    if (st.post_mlp[i].defined()) down = rms_norm(down, st.post_mlp[i], eps);
    if (i + 1 < n)
      h = add_rms_norm_(x, down, st.attn_norm[i + 1], eps);
    else
      x.add_(down);
  }
  return rms_norm((last_only ? x.narrow(1, x.size(1) - 1, 1) : x).contiguous(), st.final_norm, eps);
}

at::Tensor stack_forward(const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers,
                         int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D,
                         double eps, double scale, bool last_only, uintptr_t linear_fn, bool bf16_dot,
                         const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  return stack_run(st, x, cos, sin, k_layers, v_layers, row0, starts, H, KV, D, eps, scale, last_only, linear_fn,
                   bf16_dot, tree_args(positions, tree_mask, starts, x.size(1)), {}, nullptr);
}

// stack_forward that also returns the residual stream after each layer in ``capture``.
std::pair<at::Tensor, std::vector<at::Tensor>> stack_forward_states(
    const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
    const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers, int64_t row0,
    const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D, double eps, double scale, bool last_only,
    uintptr_t linear_fn, bool bf16_dot, const std::optional<at::Tensor>& positions,
    const std::optional<at::Tensor>& tree_mask, const std::vector<int64_t>& capture) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  std::vector<at::Tensor> states;
  at::Tensor h = stack_run(st, x, cos, sin, k_layers, v_layers, row0, starts, H, KV, D, eps, scale, last_only,
                           linear_fn, bf16_dot, tree_args(positions, tree_mask, starts, x.size(1)), capture,
                           &states);
  return {h, states};
}


// ------------------------------------------------------------------ EAGLE draft layer
// An EAGLE-3 draft layer (drafters/eagle.py) as one call per tree level. Why: the layer runs over a
// handful of tree nodes per level, where ~60 eager ops cost ~0.4 of a target pass in dispatch
// alone; here it is the same fused pieces as a Llama layer (RMSNorm, RoPE + cache write +
// attention, SiLU-gating, the small-M linear through its address).
//
// Its cache has one slot per key, not per position (RoPE positions are explicit): the prefix is
// slots [0, prefix) (the verified positions' keys), then up to 64 scratch slots for tree nodes,
// so a node attends the prefix plus its ancestors written by earlier levels' calls, which the
// target's tree attention (ancestors within one pass) cannot express.
struct EagleLayer {
  at::Tensor input_norm, hidden_norm, wqkv, wo, post_norm, w13, w2, norm, lm_head;
};

// qkv [m, (H+2KV)*D]; cache row ``row`` of k_cache/v_cache [rows, KV, L, D]. Token t's k (RoPE at
// pos[t]) and v go to slot slot0 + t. Queries from q0 on: without ``anc`` (a chain: ingestion)
// query t attends slots [0, slot0 + t]; with it, slots [0, prefix), then prefix + j for each bit j
// of anc[t] | its own bit (slot0 + t - prefix), ascending. Returns [m - q0, H * D].
at::Tensor eagle_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row, int64_t prefix, int64_t slot0,
                           const std::vector<int64_t>& pos, const std::vector<uint64_t>& anc, int64_t q0, int64_t H,
                           int64_t KV, int64_t D, double scale) {
  check_rows(qkv, "qkv");
  const int64_t m = qkv.size(0), W = (H + 2 * KV) * D, group = H / KV;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == W, "decode_ops: eagle qkv must be [m, (H+2KV)*D]");
  TORCH_CHECK(static_cast<int64_t>(pos.size()) == m && (anc.empty() || static_cast<int64_t>(anc.size()) == m) &&
                  q0 >= 0 && q0 < m,
              "decode_ops: eagle attention needs one position (and ancestor set) per token");
  for (const at::Tensor* c : {&k_cache, &v_cache})
    TORCH_CHECK(c->device().is_cpu() && c->scalar_type() == at::kFloat && c->dim() == 4 && c->size(1) == KV &&
                    c->size(3) == D && c->stride(3) == 1 && c->stride(2) == D,
                "decode_ops: the KV cache must be fp32 [rows, KV, max_len, D] with contiguous positions");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(),
              "decode_ops: k and v caches differ in layout");
  const int64_t L = k_cache.size(2);
  TORCH_CHECK(row >= 0 && row < k_cache.size(0) && slot0 >= 0 && slot0 + m <= L, "decode_ops: eagle slots out of range");
  const bool tree = !anc.empty();
  if (tree)
    TORCH_CHECK(prefix >= 0 && slot0 >= prefix && slot0 + m - prefix <= 64 && prefix + 64 <= L,
                "decode_ops: eagle tree slots must lie in the 64 after the prefix");
  for (const int64_t p : pos) TORCH_CHECK(p >= 0 && p < cos.size(0), "decode_ops: position ", p, " outside the RoPE table");
  const float* src = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t s_row = k_cache.stride(0), s_head = k_cache.stride(1);
  for (int64_t t = 0; t < m; ++t) {
    const float* tok = src + t * W;
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t off = row * s_row + g * s_head + (slot0 + t) * D;
      rope(tok + (H + g) * D, cp + pos[t] * D, sp + pos[t] * D, kc + off, D);
      std::copy(tok + (H + KV + g) * D, tok + (H + KV + g + 1) * D, vc + off);
    }
  }
  const int64_t nq = m - q0;
  std::vector<uint64_t> bits(tree ? m : 0);
  int64_t n_keys = slot0 + m;  // a query's keys plus extras bound its row of scores
  if (tree) {
    n_keys = prefix;
    for (int64_t t = 0; t < m; ++t) {
      bits[t] = anc[t] | (uint64_t(1) << (slot0 + t - prefix));
      TORCH_CHECK(slot0 + m - prefix == 64 || (bits[t] >> (slot0 + m - prefix)) == 0,
                  "decode_ops: an eagle ancestor slot is not written yet");
      n_keys = std::max<int64_t>(n_keys, prefix + __builtin_popcountll(bits[t]));
    }
  }
  at::Tensor out = at::empty({nq, H * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const bool grouped = D % 8 == 0 && D <= 128;
  at::parallel_for(0, KV, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> qbuf(nq * group * D), scores(nq * group * n_keys), acc_buf(nq * group * D);
    std::vector<int64_t> nkeys(nq * group);
    std::vector<uint64_t> extra(tree ? nq * group : 0);
    std::vector<float*> outs(nq * group);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t off = row * s_row + g * s_head;
      for (int64_t t = q0; t < m; ++t)
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t qi = (t - q0) * group + hh, h = g * group + hh;
          rope(src + t * W + h * D, cp + pos[t] * D, sp + pos[t] * D, qbuf.data() + qi * D, D);
          nkeys[qi] = tree ? prefix : slot0 + t + 1;
          if (tree) extra[qi] = bits[t];
          outs[qi] = op + (t - q0) * H * D + h * D;
        }
      if (grouped) {
        attend_grouped(D / 8, qbuf.data(), nkeys.data(), tree ? extra.data() : nullptr, prefix, nq * group, kc + off,
                       vc + off, n_keys, static_cast<float>(scale), scores.data(), acc_buf.data(), outs.data());
      } else {
        for (int64_t qi = 0; qi < nq * group; ++qi)
          attend_one(qbuf.data() + qi * D, kc + off, vc + off, D, nkeys[qi], tree ? extra[qi] : 0, prefix, D,
                     static_cast<float>(scale), scores.data(), outs[qi]);
      }
    }
  });
  return out;
}

// One draft level (or an ingestion): for token t, the input is [input_norm(embed(tokens[t])) ;
// hidden_norm(feature)], the feature being row src[t] of ``feats`` (empty src: row t); the
// residual stream starts at the feature. Outputs (the layer's pre-norm result) go to rows dst, dst+1,
// ... of ``out`` (only the last token's with ``last_only``); returns their draft-vocabulary logits.
at::Tensor eagle_layer(const EagleLayer& w, const at::Tensor& table, const std::vector<int64_t>& tokens,
                       const at::Tensor& feats, const std::vector<int64_t>& src, at::Tensor& out, int64_t dst,
                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                       int64_t row, int64_t prefix, int64_t slot0, const std::vector<int64_t>& pos,
                       const std::vector<uint64_t>& anc, int64_t H, int64_t KV, int64_t D, double eps, double scale,
                       bool last_only, uintptr_t linear_fn, bool bf16_dot) {
  const int64_t m = static_cast<int64_t>(tokens.size());
  check_rows(feats, "feats");
  check_rows(out, "out");
  TORCH_CHECK(m > 0 && feats.dim() == 2 && out.dim() == 2 && out.size(1) == feats.size(1),
              "decode_ops: eagle features must be [rows, dim] and tokens non-empty");
  TORCH_CHECK(src.empty() || static_cast<int64_t>(src.size()) == m, "decode_ops: one feature row per token");
  const int64_t Dm = feats.size(1), R = feats.size(0), q0 = last_only ? m - 1 : 0;
  TORCH_CHECK(dst >= 0 && dst + (m - q0) <= out.size(0), "decode_ops: eagle output rows out of range");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() && table.size(1) == Dm &&
                  (table.scalar_type() == at::kFloat || table.scalar_type() == at::kBFloat16),
              "decode_ops: the embedding must be a contiguous fp32 or bf16 [vocab, dim] tensor");
  check_norm_weight(w.input_norm, Dm);
  check_norm_weight(w.hidden_norm, Dm);
  const float eps_f = static_cast<float>(eps);
  at::Tensor x = at::empty({m, 2 * Dm}, feats.options());
  at::Tensor res = at::empty({m - q0, Dm}, feats.options());
  std::vector<float> e(Dm);
  float* xp = x.data_ptr<float>();
  const float* fp = feats.data_ptr<float>();
  for (int64_t t = 0; t < m; ++t) {
    const int64_t id = tokens[t], r = src.empty() ? t : src[t];
    TORCH_CHECK(id >= 0 && id < table.size(0), "decode_ops: token id ", id, " is outside the vocabulary");
    TORCH_CHECK(r >= 0 && r < R, "decode_ops: eagle feature row ", r, " out of range");
    if (table.scalar_type() == at::kFloat) {
      std::copy(table.data_ptr<float>() + id * Dm, table.data_ptr<float>() + (id + 1) * Dm, e.data());
    } else {
      const uint16_t* sb = reinterpret_cast<const uint16_t*>(table.data_ptr<at::BFloat16>()) + id * Dm;
      for (int64_t k = 0; k < Dm; ++k) {
        const uint32_t b = static_cast<uint32_t>(sb[k]) << 16;
        std::memcpy(&e[k], &b, sizeof(float));
      }
    }
    rms_row(e.data(), w.input_norm.data_ptr<float>(), eps_f, xp + t * 2 * Dm, Dm);
    rms_row(fp + r * Dm, w.hidden_norm.data_ptr<float>(), eps_f, xp + t * 2 * Dm + Dm, Dm);
    if (t >= q0) std::copy(fp + r * Dm, fp + (r + 1) * Dm, res.data_ptr<float>() + (t - q0) * Dm);
  }
  const at::Tensor none;
  at::Tensor qkv = lin(linear_fn, bf16_dot, x, w.wqkv, none);
  at::Tensor attn = eagle_attention(qkv, cos, sin, k_cache, v_cache, row, prefix, slot0, pos, anc, q0, H, KV, D, scale);
  at::Tensor h = add_rms_norm_(res, lin(linear_fn, bf16_dot, attn, w.wo, none), w.post_norm, eps);
  at::Tensor down = lin(linear_fn, bf16_dot, silu_mul(lin(linear_fn, bf16_dot, h, w.w13, none)), w.w2, none);
  h = add_rms_norm_(res, down, w.norm, eps);
  out.narrow(0, dst, m - q0).copy_(res);
  return lin(linear_fn, bf16_dot, h, w.lm_head, none);
}


// Per row of logits [R, n]: the k largest entries' indices (largest first; ties: the lower index)
// and their softmax probabilities. Why: a tree level's children are a top-k of its nodes' draft
// laws, and softmax + topk + two tolist calls cost more than a tenth of the level itself.
std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<double>>> topk_softmax(const at::Tensor& logits,
                                                                                          int64_t k) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
                  logits.size(1) > 0 && logits.stride(1) == 1,
              "decode_ops: topk_softmax needs a CPU fp32 [rows, n] tensor with contiguous rows");
  const int64_t R = logits.size(0), n = logits.size(1);
  k = std::max<int64_t>(1, std::min(k, n));
  std::vector<std::vector<int64_t>> ids(R);
  std::vector<std::vector<double>> probs(R);
  std::vector<float> e(n);
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.data_ptr<float>() + r * logits.stride(0);
    std::vector<int64_t> top;  // indices, largest value first
    for (int64_t j = 0; j < n; ++j) {
      if (static_cast<int64_t>(top.size()) == k && !(x[j] > x[top.back()])) continue;
      int64_t at = static_cast<int64_t>(top.size());
      while (at > 0 && x[j] > x[top[at - 1]]) --at;
      top.insert(top.begin() + at, j);
      if (static_cast<int64_t>(top.size()) > k) top.pop_back();
    }
    std::copy(x, x + n, e.begin());
    const float sum = softmax_numer(e.data(), n);  // exp(x - max), its max being x[top[0]]
    for (const int64_t j : top) {
      ids[r].push_back(j);
      probs[r].push_back(static_cast<double>(e[j]) / static_cast<double>(sum));
    }
  }
  return {ids, probs};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode fused decode-step ops for Llama-family layers (fp32; KV cache fp32/fp16/bf16; AVX2/FMA/F16C, "
            "attention 16 lanes wide on AVX-512F)";
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim", pybind11::arg("x"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("add_rms_norm_", &add_rms_norm_, "x += delta in place; returns rms_norm(x)", pybind11::arg("x"),
        pybind11::arg("delta"), pybind11::arg("weight"), pybind11::arg("eps"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("silu_mul", &silu_mul, "silu(gate) * up from the fused [..., 2F] gate/up projection",
        pybind11::arg("gate_up"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("attention", &attention,
        "RoPE + KV-cache write + GQA attention for new tokens (causal, or over a tree mask of at most 64)",
        pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("k_cache"),
        pybind11::arg("v_cache"), pybind11::arg("row0"), pybind11::arg("starts"), pybind11::arg("n_heads"),
        pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("scale"),
        pybind11::arg("positions") = pybind11::none(), pybind11::arg("tree_mask") = pybind11::none(),
        pybind11::arg("window") = 0, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("has_avx2", []() { return kHasAvx2; }, "whether this CPU has AVX2/FMA/F16C (required)");
  m.def("has_avx512", []() { return detect_avx512(); }, "whether this CPU has AVX-512F (grouped attention's 16 lanes)");
  m.def("attention_isa", []() { return std::string(g_attention_512.load() ? "avx512" : "avx2"); },
        "the grouped attention walk in use: avx512 (16 lanes) or avx2 (8); the same bits either way");
  m.def("set_attention_isa", [](const std::string& isa) {
          TORCH_CHECK(isa == "auto" || isa == "avx2" || isa == "avx512", "set_attention_isa: isa must be auto, avx2 "
                      "or avx512, got '", isa, "'");
          TORCH_CHECK(isa != "avx512" || detect_avx512(), "set_attention_isa: this CPU lacks AVX-512F");
          const bool prev = g_attention_512.exchange(isa == "auto" ? attention_512_default() : isa == "avx512");
          return std::string(prev ? "avx512" : "avx2");
        }, "the grouped attention walk: auto (this CPU's best; SPECDECODE_KERNEL_ISA=avx2 asks for 8 lanes), avx2 or "
        "avx512; returns the previous", pybind11::arg("isa"));
  m.def("sample_rows", &sample_rows, "inverse-CDF draw per row of CPU fp32 weights [rows, n] (-1: invalid row)",
        pybind11::arg("w"), pybind11::arg("u"));
  m.def("argmax_rows", &argmax_rows, "first argmax of each row of a CPU fp32 [rows, n] tensor (NaN = max)",
        pybind11::arg("x"));
  m.def("embed", &embed, "embedding rows for int64 tokens [B, T] as a new fp32 [B, T, dim] tensor",
        pybind11::arg("tokens"), pybind11::arg("table"), pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<Stack>(m, "Stack", "a decoder stack's weights, gathered once for stack_forward")
      .def(pybind11::init([](std::vector<at::Tensor> wqkv, std::vector<std::optional<at::Tensor>> bqkv,
                             std::vector<at::Tensor> wo, std::vector<at::Tensor> w13, std::vector<at::Tensor> w2,
                             std::vector<at::Tensor> attn_norm, std::vector<at::Tensor> mlp_norm,
                             at::Tensor final_norm, std::vector<std::optional<at::Tensor>> wv) {
        Stack st;
        st.wqkv = std::move(wqkv);
        for (auto& b : bqkv) st.bqkv.push_back(b.has_value() ? *b : at::Tensor());
        st.wo = std::move(wo);
        st.w13 = std::move(w13);
        st.w2 = std::move(w2);
        st.attn_norm = std::move(attn_norm);
        st.mlp_norm = std::move(mlp_norm);
        st.final_norm = std::move(final_norm);
        for (auto& v : wv) st.wv.push_back(v.has_value() ? *v : at::Tensor());
        const size_t n = st.wqkv.size();
        TORCH_CHECK(st.bqkv.size() == n && st.wo.size() == n && st.w13.size() == n && st.w2.size() == n &&
                        st.attn_norm.size() == n && st.mlp_norm.size() == n && st.wv.size() == n,
                    "decode_ops: every per-layer list needs one entry per layer");
        return st;
      }));
  pybind11::class_<BlockStack>(m, "BlockStack", "the weights and per-layer flags of blocks_forward's layers")
      .def(pybind11::init([](std::vector<std::vector<std::optional<at::Tensor>>> tensors, at::Tensor final_norm,
                             std::vector<int64_t> window, std::vector<bool> local_rope, std::vector<bool> gelu) {
        // tensors: wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv, q_norm, k_norm, post_attn, post_mlp
        TORCH_CHECK(tensors.size() == 12, "decode_ops: BlockStack takes 12 per-layer lists");
        BlockStack st;
        std::vector<at::Tensor>* out[12] = {&st.wqkv, &st.bqkv, &st.wo, &st.w13, &st.w2, &st.attn_norm,
                                            &st.mlp_norm, &st.wv, &st.q_norm, &st.k_norm, &st.post_attn,
                                            &st.post_mlp};
        const size_t n = tensors[0].size();
        for (int k = 0; k < 12; ++k) {
          TORCH_CHECK(tensors[k].size() == n, "decode_ops: every per-layer list needs one entry per layer");
          for (auto& t : tensors[k]) out[k]->push_back(t.has_value() ? *t : at::Tensor());
        }
        for (int k : {0, 2, 3, 4, 5, 6})
          for (const auto& t : *out[k]) TORCH_CHECK(t.defined(), "decode_ops: a layer lacks a required tensor");
        TORCH_CHECK(window.size() == n && local_rope.size() == n && gelu.size() == n,
                    "decode_ops: one window, RoPE choice and activation per layer");
        st.window = std::move(window);
        st.local_rope = std::move(local_rope);
        st.gelu = std::move(gelu);
        st.final_norm = std::move(final_norm);
        return st;
      }));
  m.def("blocks_forward", &blocks_forward,
        "decoder blocks with q/k norms, sandwich norms, GELU and sliding windows (Gemma 3, Qwen 3) for new tokens; "
        "returns the final-normed hidden",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("cos_local"), pybind11::arg("sin_local"), pybind11::arg("k_layers"), pybind11::arg("v_layers"),
        pybind11::arg("row0"), pybind11::arg("starts"), pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"),
        pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("scale"), pybind11::arg("last_only"),
        pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"), pybind11::arg("positions") = pybind11::none(),
        pybind11::arg("tree_mask") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("stack_forward", &stack_forward, "the whole decoder stack for new tokens; returns the final-normed hidden",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_layers"), pybind11::arg("v_layers"), pybind11::arg("row0"), pybind11::arg("starts"),
        pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"),
        pybind11::arg("scale"), pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::arg("positions") = pybind11::none(), pybind11::arg("tree_mask") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("stack_forward_states", &stack_forward_states,
        "stack_forward, also returning copies of the residual stream after the layers in capture",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_layers"), pybind11::arg("v_layers"), pybind11::arg("row0"), pybind11::arg("starts"),
        pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"),
        pybind11::arg("scale"), pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::arg("positions"), pybind11::arg("tree_mask"), pybind11::arg("capture"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<EagleLayer>(m, "EagleLayer", "an EAGLE-3 draft layer's weights, gathered once for eagle_layer")
      .def(pybind11::init([](at::Tensor input_norm, at::Tensor hidden_norm, at::Tensor wqkv, at::Tensor wo,
                             at::Tensor post_norm, at::Tensor w13, at::Tensor w2, at::Tensor norm, at::Tensor lm_head) {
        for (const at::Tensor* t : {&input_norm, &hidden_norm, &post_norm, &norm})
          TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                          t->size(0) == input_norm.size(0),
                      "decode_ops: EAGLE norm weights must be contiguous fp32 [dim]");
        return EagleLayer{input_norm, hidden_norm, wqkv, wo, post_norm, w13, w2, norm, lm_head};
      }));
  m.def("eagle_layer", &eagle_layer,
        "one EAGLE-3 draft layer over tree nodes (or an ingestion); writes outputs to out, returns logits",
        pybind11::arg("layer"), pybind11::arg("table"), pybind11::arg("tokens"), pybind11::arg("feats"),
        pybind11::arg("src"), pybind11::arg("out"), pybind11::arg("dst"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("row"), pybind11::arg("prefix"),
        pybind11::arg("slot0"), pybind11::arg("positions"), pybind11::arg("ancestors"), pybind11::arg("n_heads"),
        pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("scale"),
        pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("topk_softmax", &topk_softmax, "per row: the top-k indices (largest first) and their softmax probabilities",
        pybind11::arg("logits"), pybind11::arg("k"), pybind11::call_guard<pybind11::gil_scoped_release>());
}
