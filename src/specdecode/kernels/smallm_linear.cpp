// Small-M linear for the CPU: y[M, N] = x[M, K] @ W[N, K]^T (+ b), M in 1..64.
//
// Why: eager F.linear with a handful of rows (the target verifying gamma+1
// draft tokens) streams the weight matrix from memory about once per row.
// Here every weight element is loaded once per call: the output rows N are cut
// into tiles of TILE_N weight rows, and for each tile the M token rows are
// processed in register blocks of at most MAX_MB rows, so each chunk of W
// loaded into a register feeds one FMA per token row of the block, and the tile
// stays in L1/L2 between register blocks (a larger M takes 2-3 passes over a
// tile, only the first from memory). While the first pass works on a tile it
// prefetches the next tile into L2, so DRAM streaming overlaps the FMAs (AVX-512:
// the weight rows TILE_N512 further on, each pass prefetching its share of K).
//
// W may be fp32 or bf16 (bf16 is widened to fp32 in registers: a 16-bit shift).
// x, y and the bias are fp32; accumulation is fp32.
//
// Instruction sets, chosen at runtime (best the CPU has, or SPECDECODE_KERNEL_ISA
// = scalar | avx2 | avx512 | avx512bf16 | amx | auto, read once when the module loads,
// clamped to what the CPU supports; set_isa() changes it later, and
// smallm_linear() takes a per-call isa):
//   scalar      portable C++
//   avx2        AVX2/FMA, 16 ymm: blocks of up to 6 token rows (TILE_N 12)
//   avx512      AVX-512F/BW/VL/DQ, 32 zmm: blocks of up to 8 token rows (TILE_N 24)
//   avx512bf16  avx512 plus AVX512_BF16 (vdpbf16ps) for the bf16-dot mode
//   amx         avx512bf16 plus AMX-BF16 tiles for the bf16-dot mode (K a multiple of 32;
//               other K, fp32 weights and plain bf16 weights take the avx512bf16 path)
//
// amx (Sapphire Rapids and later, where Linux grants the tile state): one TDPBF16PS
// multiplies a 16 x 32 block of W (16 weight rows, tile A, loaded straight from the
// [N, K] matrix) by 32 values of up to 16 token rows (tile B: x rounded to bf16 and
// laid out in the pairs the instruction reads), 8,192 multiply-adds at once. A block
// of 16 weight rows is read from memory once for up to 64 token rows (4 C tiles), so
// a pass over 16 tokens costs about what one costs while the weights stream from DRAM:
// the AVX512_BF16 path's v(8) is 1.8 on a Xeon whose vdpbf16ps issues at a quarter
// of the FMA rate. Each C element accumulates its K blocks in order, independently of
// the other token rows in its tile, so rows stay batch-invariant.
//
// bf16-dot mode (bf16_dot=true, bf16 weights only; fp32 weights ignore it): x is
// rounded to bf16 (round-to-nearest-even) and the products x*w, exact in fp32,
// are accumulated in fp32. With avx512bf16 this is vdpbf16ps on the bf16
// weights as stored (32 multiply-adds per instruction, no widening), else the
// same math on the other paths (x rounded first, then the fp32 kernel: an FMA
// of two bf16 values rounds only the sum). Results of different paths agree to
// fp32 rounding, not bit for bit.
//
// Batch invariance (every path, both modes): the value of y[m, n] depends only
// on x[m, :], W[n, :] and b[n], never on M or on the other rows of x, because
// each (token row, weight row) accumulator walks K in the same order whatever
// register block it lands in, K tails are handled per accumulator the same way,
// and the AVX-512 horizontal sums use one fixed lane tree. Speculative
// verification of gamma+1 tokens therefore gives bit-identical logits to
// one-token-at-a-time decoding (for a fixed ISA and mode).
//
// The SIMD code is compiled with per-function target attributes rather than
// -mavx2/-mavx512f for the whole file, so the rest of the module is plain x86-64
// and the runtime checks (__builtin_cpu_supports, cpuid) really protect hosts
// without those extensions; those get the portable scalar path.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define SMALLM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define SMALLM_X86 0
#endif

namespace {

constexpr int64_t MAX_M = 64;  // a batched server step verifies up to rows x (gamma+1) tokens
constexpr int64_t TILE_N = 12;   // weight rows per task unit (scalar, AVX2); multiple of every NB below
constexpr int64_t MAX_MB = 6;    // token rows per AVX2 register block
constexpr int64_t TILE_N512 = 24;  // weight rows per task unit (AVX-512); multiple of every NB512
constexpr int64_t MAX_MB512 = 8;   // token rows per AVX-512 register block
// AVX-512: every pass over a tile prefetches a share (a K range) of the rows one
// prefetch distance further on, not only the first pass; distances in weight rows
// (24 measured best on Zen 4 among 8..48 for K = 512 and 1408).
constexpr bool kSpreadPrefetch = true;
constexpr int64_t kPrefetchRows512 = TILE_N512;  // fp32-x blocks
constexpr int64_t kPrefetchRowsDot = TILE_N512;  // bf16-dot blocks

enum Isa : int { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512BF16 = 3, ISA_AMX = 4 };

// With SPECDECODE_KERNEL_STREAMS=1 a one-token call (a decode step) on the AVX-512 paths reads its weight rows one
// after another, one sequential stream, which Zen's prefetchers follow best (Zen 5 EPYC, SmolLM2-135M with bf16
// weights, a plain step against blocks of rows side by side: bf16-dot 1.3x, fp32-widening 1.3x at 1 thread,
// 1.2-1.5x at 2; the bundled bf16 code model 1.1-1.4x). AVX2 keeps its blocks (one row at a time ran 0.6x there:
// its horizontal sums). The same bits either way (each row's sum walks K in the same order whatever block).
std::atomic<bool> g_one_stream{false};

// Only for a matrix past L2's size: one that stays in cache is bound by arithmetic, where one row at a time pays a
// horizontal sum per row (576 x 576 bf16 called again and again: 12.6 against 7.7 us; 49,152 x 576 streamed from
// DRAM: 1.03 against 1.72 ms). A small model's whole step is such (the tests' tiny models ran slower).
constexpr int64_t kOneStreamMinBytes = int64_t(1) << 20;

inline bool one_stream(int mb, int64_t weight_bytes) {
  return mb == 1 && weight_bytes >= kOneStreamMinBytes && g_one_stream.load(std::memory_order_relaxed);
}

const char* isa_name(int isa) {
  switch (isa) {
    case ISA_AVX2: return "avx2";
    case ISA_AVX512: return "avx512";
    case ISA_AVX512BF16: return "avx512bf16";
    case ISA_AMX: return "amx";
    default: return "scalar";
  }
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// fp32 -> the nearest bf16 value (ties to even), as fp32; NaN stays NaN (quiet).
inline float round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u = (u | 0x00400000u) & 0xffff0000u;
  } else {
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  }
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename WT>
inline float load_w_scalar(const WT* p);
template <>
inline float load_w_scalar<float>(const float* p) { return *p; }
template <>
inline float load_w_scalar<uint16_t>(const uint16_t* p) { return bf16_to_float(*p); }

// ---------------------------------------------------------------- scalar path
// Rows [n_begin, n_end) of y for all M token rows; each weight row is read once
// (it stays in L1 while the M accumulators walk over it).
template <typename WT>
void rows_scalar(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y,
                 int64_t N, int64_t n_begin, int64_t n_end) {
  float acc[MAX_M];
  for (int64_t n = n_begin; n < n_end; ++n) {
    const WT* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) acc[m] = 0.f;
    for (int64_t k = 0; k < K; ++k) {
      const float wv = load_w_scalar(wr + k);
      for (int64_t m = 0; m < M; ++m) acc[m] += x[m * K + k] * wv;
    }
    const float b = bias ? bias[n] : 0.f;
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = acc[m] + b;
  }
}

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
                                 int64_t pf_end, int64_t pk0, int64_t pk1) {
  constexpr int NB = NB512For<MB>::value;
  int64_t n = n_begin;
  // a block prefetches the rows pf_rows further on (while they are below pf_end); one stream: all by the row loop
  const int64_t blocks_end = one_stream(MB, N * K * int64_t(sizeof(WT))) ? n : n_end - (n_end - n) % NB;
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
                                int64_t pf_rows, int64_t pf_end, int64_t pk0, int64_t pk1) {
  constexpr int NB = NBDotFor<MB>::value;
  int64_t n = n_begin;
  const int64_t blocks_end = one_stream(MB, N * K * 2) ? n : n_end - (n_end - n) % NB;  // one stream: the row loop
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
                               int64_t N, int64_t n_begin, int64_t n_end) {
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
        case 1: mblock_avx512<1, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 2: mblock_avx512<2, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 3: mblock_avx512<3, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 4: mblock_avx512<4, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 5: mblock_avx512<5, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 6: mblock_avx512<6, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 7: mblock_avx512<7, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        default: mblock_avx512<8, WT>(x, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
      }
      m0 += mb;
    }
  }
}

SMALLM_BF16 void rows_bf16dot(const uint16_t* xb, int64_t Kp, int64_t M, int64_t K, const uint16_t* w,
                              const float* bias, float* y, int64_t N, int64_t n_begin, int64_t n_end) {
  const int64_t nblocks = (M + MAX_MB512 - 1) / MAX_MB512;
  for (int64_t t = n_begin; t < n_end; t += TILE_N512) {
    const int64_t te = std::min(n_end, t + TILE_N512);
    int64_t m0 = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t mb = block_rows(M, m0, b, nblocks);
      const int64_t pf_rows = kSpreadPrefetch || b == 0 ? kPrefetchRowsDot : 0;
      const int64_t pk0 = kSpreadPrefetch ? K * b / nblocks : 0, pk1 = kSpreadPrefetch ? K * (b + 1) / nblocks : K;
      switch (mb) {
        case 1: mblock_bf16dot<1>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 2: mblock_bf16dot<2>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 3: mblock_bf16dot<3>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 4: mblock_bf16dot<4>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 5: mblock_bf16dot<5>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 6: mblock_bf16dot<6>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        case 7: mblock_bf16dot<7>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
        default: mblock_bf16dot<8>(xb, Kp, K, w, bias, y, N, m0, t, te, pf_rows, n_end, pk0, pk1); break;
      }
      m0 += mb;
    }
  }
}

// ------------------------------------------------------------------- AMX path
// AMX intrinsics need GCC 11 or clang 12; an older compiler builds the rest and reports no AMX.
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SMALLM_HAS_AMX 1
#else
#define SMALLM_HAS_AMX 0
#endif
#if SMALLM_HAS_AMX
#define SMALLM_AMX \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

constexpr int64_t AMX_ROWS = 16;  // weight rows per tile (C rows) and token rows per C tile (C columns)
constexpr int64_t AMX_K = 32;     // bf16 values of K per tile row

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: A (16 weight rows x 32 values), tmm1: B (16 value pairs x 16 token rows), tmm2..5: C (16 x 16 fp32)
SMALLM_AMX void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 6; ++t) {
    cfg.rows[t] = AMX_ROWS;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// x [M, Kp] bf16 (x_to_bf16) -> per block of 16 token rows, K/2 rows of 16 (pair of values) entries:
// B_j[p][m] = (x[16j + m][2p], x[16j + m][2p + 1]), zero past M.
void amx_pack_x(const uint16_t* xb, int64_t Kp, int64_t M, int64_t K, uint32_t* packed) {
  const int64_t mb = (M + AMX_ROWS - 1) / AMX_ROWS, pairs = K / 2;
  if (M % AMX_ROWS) std::memset(packed, 0, sizeof(uint32_t) * mb * pairs * AMX_ROWS);  // token rows past M: zero
  for (int64_t m = 0; m < M; ++m) {
    uint32_t* out = packed + (m / AMX_ROWS) * pairs * AMX_ROWS + (m % AMX_ROWS);
    const uint16_t* row = xb + m * Kp;
    for (int64_t p = 0; p < pairs; ++p) {
      uint32_t v;
      std::memcpy(&v, row + 2 * p, sizeof(v));
      out[p * AMX_ROWS] = v;
    }
  }
}

// Weight rows [n_begin, n_end) (multiples of 16) for MB blocks of 16 token rows; K a multiple of 32.
template <int MB>
SMALLM_AMX void amx_rows(const uint32_t* packed, int64_t M, int64_t K, const uint16_t* w, const float* bias,
                         float* y, int64_t N, int64_t n_begin, int64_t n_end) {
  alignas(64) float out[AMX_ROWS * AMX_ROWS];
  const int64_t pairs = K / 2, wstride = K * 2;
  amx_configure();
  for (int64_t n0 = n_begin; n0 < n_end; n0 += AMX_ROWS) {
    _tile_zero(2);
    if constexpr (MB > 1) _tile_zero(3);
    if constexpr (MB > 2) _tile_zero(4);
    if constexpr (MB > 3) _tile_zero(5);
    const uint16_t* wb = w + n0 * K;
    // no software prefetch: the hardware's streams keep pace here, and prefetching one block ahead (into L1
    // or L2, 1 to 4 blocks on) made a one-row pass 4-15% slower on a Sapphire Rapids-class Xeon
    for (int64_t k0 = 0; k0 < K; k0 += AMX_K) {
      _tile_loadd(0, wb + k0, wstride);
      const uint32_t* b = packed + (k0 / 2) * AMX_ROWS;
      _tile_loadd(1, b, 64);
      _tile_dpbf16ps(2, 0, 1);
      if constexpr (MB > 1) {
        _tile_loadd(1, b + pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(3, 0, 1);
      }
      if constexpr (MB > 2) {
        _tile_loadd(1, b + 2 * pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(4, 0, 1);
      }
      if constexpr (MB > 3) {
        _tile_loadd(1, b + 3 * pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(5, 0, 1);
      }
    }
    for (int j = 0; j < MB; ++j) {
      switch (j) {  // tile numbers are immediates
        case 0: _tile_stored(2, out, 64); break;
        case 1: _tile_stored(3, out, 64); break;
        case 2: _tile_stored(4, out, 64); break;
        default: _tile_stored(5, out, 64); break;
      }
      const int64_t rows = std::min<int64_t>(AMX_ROWS, M - j * AMX_ROWS);
      for (int64_t n = 0; n < AMX_ROWS; ++n) {
        const float b = bias ? bias[n0 + n] : 0.f;
        for (int64_t m = 0; m < rows; ++m) y[(j * AMX_ROWS + m) * N + n0 + n] = out[n * AMX_ROWS + m] + b;
      }
    }
  }
  _tile_release();
}

#endif  // SMALLM_HAS_AMX

// Whether this process may use the AMX tile state: Linux grants it on request (arch_prctl).
bool amx_permitted() {
#if SMALLM_HAS_AMX && defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}
#endif  // SMALLM_X86

// ------------------------------------------------------------ runtime choice
struct CpuIsa {
  bool avx2 = false, avx512 = false, avx512bf16 = false, amx = false;
  bool amd = false;  // the vendor: a decode step reads one weight stream there (g_one_stream)
};

CpuIsa detect_isa() {
  CpuIsa c;
#if SMALLM_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // __builtin_cpu_supports also checks that the OS saves the zmm state (XCR0)
  c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  unsigned a = 0, b = 0, cx = 0, d = 0;
  // CPUID.(EAX=7, ECX=1):EAX bit 5 = AVX512_BF16
  c.avx512bf16 = c.avx512 && __get_cpuid_count(7, 1, &a, &b, &cx, &d) && ((a >> 5) & 1u);
  // CPUID.(EAX=7, ECX=0):EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE; then the OS must grant the tile state
  c.amx = c.avx512bf16 && __get_cpuid_count(7, 0, &a, &b, &cx, &d) && ((d >> 22) & 1u) && ((d >> 24) & 1u) &&
          amx_permitted();
  unsigned vendor[3] = {0, 0, 0};
  if (__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]))
    c.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
#endif
  return c;
}

const CpuIsa kCpu = detect_isa();
const bool kHasAvx2 = kCpu.avx2;
const int kBestIsa = kCpu.amx          ? ISA_AMX
                    : kCpu.avx512bf16 ? ISA_AVX512BF16
                    : kCpu.avx512     ? ISA_AVX512
                    : kCpu.avx2       ? ISA_AVX2
                                      : ISA_SCALAR;

// "scalar" | "avx2" | "avx512" | "avx512bf16" -> level; "auto" or "" -> -1; anything else -> -2.
int parse_isa(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s.empty() || s == "auto") return -1;
  if (s == "scalar") return ISA_SCALAR;
  if (s == "avx2") return ISA_AVX2;
  // the quantized kernel's AVX-VNNI path names a CPU with AVX2 and no AVX-512 (Alder Lake): AVX2 here
  if (s == "avxvnni" || s == "avx-vnni" || s == "vnni256") return ISA_AVX2;
  if (s == "avx512") return ISA_AVX512;
  if (s == "avx512bf16" || s == "avx512_bf16") return ISA_AVX512BF16;
  if (s == "amx" || s == "amxbf16" || s == "amx-bf16") return ISA_AMX;
  return -2;
}

// SPECDECODE_KERNEL_ISA, read once at load; unknown values mean auto, and a
// request above what the CPU has is clamped to the best it has.
int isa_from_env() {
  const char* v = std::getenv("SPECDECODE_KERNEL_ISA");
  const int req = v ? parse_isa(v) : -1;
  return req < 0 ? kBestIsa : std::min(req, kBestIsa);
}

std::atomic<int> g_isa{isa_from_env()};

// SPECDECODE_KERNEL_STREAMS=1: one stream; else the measured blocks. Not AMD's default (the quantized kernel's is):
// a model whose weights stay in cache runs slower so (the bundled 2-block draft model's steps 0.85-0.9x: its
// 2 MiB head passes kOneStreamMinBytes but never leaves L3), and made a model's own choice (weights past the
// last-level cache) it sped plain decoding but left the bundled pair near break-even, where a first request's
// early rejections kept it plain (docs/cpu.md).
bool one_stream_default() {
  const char* v = std::getenv("SPECDECODE_KERNEL_STREAMS");
  return v && std::string(v) == "1";
}

const bool kOneStreamSet = (g_one_stream.store(one_stream_default()), true);

// 1: one stream, 4: the measured blocks, 0: this CPU's default; returns the previous (1 or 4)
int64_t set_streams(int64_t n) {
  TORCH_CHECK(n == 0 || n == 1 || n == 4, "set_streams: streams must be 1, 4 or 0 (this CPU's default), got ", n);
  return g_one_stream.exchange(n == 0 ? one_stream_default() : n == 1) ? 1 : 4;
}

std::string get_isa() { return isa_name(g_isa.load(std::memory_order_relaxed)); }

// Sets the ISA used by linear() and by smallm_linear() without an isa; returns the previous one.
std::string set_isa(const std::string& name) {
  int req = parse_isa(name);
  TORCH_CHECK(req != -2, "set_isa: unknown ISA '", name, "' (auto, scalar, avx2, avx512, avx512bf16, amx)");
  if (req == -1) req = kBestIsa;
  TORCH_CHECK(req <= kBestIsa, "set_isa: this CPU does not support ", isa_name(req), " (best: ",
              isa_name(kBestIsa), ")");
  return isa_name(g_isa.exchange(req));
}

template <typename WT>
void run(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y, int64_t N, int isa) {
  const int64_t tile = isa >= ISA_AVX512 ? TILE_N512 : TILE_N;
  const int64_t ntiles = (N + tile - 1) / tile;
  // At least ~32k multiply-adds per task so tiny layers do not pay for a thread wake-up.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, tile * K * M));
  at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
    const int64_t nb = tb * tile, ne = std::min(N, te * tile);
#if SMALLM_X86
    if (isa >= ISA_AVX512) {
      rows_avx512<WT>(x, M, K, w, bias, y, N, nb, ne);
      return;
    }
    if (isa == ISA_AVX2) {
      rows_avx2<WT>(x, M, K, w, bias, y, N, nb, ne);
      return;
    }
#endif
    rows_scalar<WT>(x, M, K, w, bias, y, N, nb, ne);
  });
}

// bf16-dot mode (bf16 weights): x rounded to bf16, exact products, fp32 sums.
void run_bf16dot(const float* x, int64_t M, int64_t K, const uint16_t* w, const float* bias, float* y, int64_t N,
                 int isa) {
#if SMALLM_X86
  if (isa >= ISA_AVX512BF16) {
    const int64_t Kp = (K + 31) & ~int64_t(31);
    at::Tensor xb_t = at::empty({M * Kp}, at::TensorOptions().dtype(at::kBFloat16));
    uint16_t* xb = reinterpret_cast<uint16_t*>(xb_t.data_ptr<at::BFloat16>());
    x_to_bf16(x, M, K, Kp, xb);
#if SMALLM_HAS_AMX
    if (isa >= ISA_AMX && K % AMX_K == 0) {  // decided by K alone, never by M: rows stay batch-invariant
      const int64_t mb = (M + AMX_ROWS - 1) / AMX_ROWS, n16 = N - N % AMX_ROWS;
      thread_local std::vector<uint32_t> packed_buf;  // reused: no allocation per call
      packed_buf.resize(std::max<size_t>(packed_buf.size(), size_t(mb * (K / 2) * AMX_ROWS)));
      uint32_t* packed = packed_buf.data();
      amx_pack_x(xb, Kp, M, K, packed);
      const int64_t nblocks = n16 / AMX_ROWS;
      const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, AMX_ROWS * K * M));
      at::parallel_for(0, nblocks, grain, [&](int64_t b0, int64_t b1) {
        const int64_t nb = b0 * AMX_ROWS, ne = b1 * AMX_ROWS;
        switch (mb) {
          case 1: amx_rows<1>(packed, M, K, w, bias, y, N, nb, ne); break;
          case 2: amx_rows<2>(packed, M, K, w, bias, y, N, nb, ne); break;
          case 3: amx_rows<3>(packed, M, K, w, bias, y, N, nb, ne); break;
          default: amx_rows<4>(packed, M, K, w, bias, y, N, nb, ne); break;
        }
      });
      if (n16 < N) rows_bf16dot(xb, Kp, M, K, w, bias, y, N, n16, N);  // the last rows: the same path at any M
      return;
    }
#endif
    const int64_t ntiles = (N + TILE_N512 - 1) / TILE_N512;
    // vdpbf16ps does twice the work of an fp32 FMA: twice the grain
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, TILE_N512 * K * M));
    at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
      rows_bf16dot(xb, Kp, M, K, w, bias, y, N, tb * TILE_N512, std::min(N, te * TILE_N512));
    });
    return;
  }
#endif
  // the same math on the fp32 kernels: an FMA of two bf16 values only rounds the sum
  at::Tensor xr_t = at::empty({M * K}, at::TensorOptions().dtype(at::kFloat));
  float* xr = xr_t.data_ptr<float>();
  for (int64_t i = 0; i < M * K; ++i) xr[i] = round_to_bf16(x[i]);
  run<uint16_t>(xr, M, K, w, bias, y, N, isa);
}

// The kernel proper on 2-D fp32 x [M, K]; checks everything, never falls back.
at::Tensor smallm_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                         bool force_scalar, bool bf16_dot, const std::optional<std::string>& isa_arg) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "smallm_linear: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "smallm_linear: x must be a contiguous fp32 [M, K] tensor");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "smallm_linear: weight must be a contiguous fp32 or bf16 [N, K] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= MAX_M, "smallm_linear: 1 <= M <= 64 rows, got ", M);
  TORCH_CHECK(w.size(1) == K, "smallm_linear: x has K=", K, " but weight has ", w.size(1));
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->dim() == 1 && bias->size(0) == N,
                "smallm_linear: bias must be a contiguous fp32 [N] tensor");
    bp = bias->data_ptr<float>();
  }
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa_arg.has_value()) {
    const int req = parse_isa(*isa_arg);
    TORCH_CHECK(req != -2, "smallm_linear: unknown isa '", *isa_arg, "' (auto, scalar, avx2, avx512, avx512bf16, amx)");
    isa = req == -1 ? kBestIsa : req;
    TORCH_CHECK(isa <= kBestIsa, "smallm_linear: this CPU does not support ", isa_name(isa));
  }
  if (force_scalar) isa = ISA_SCALAR;
  at::Tensor y = at::empty({M, N}, x.options());
  if (M * N == 0) return y;
  if (K == 0) return bp ? y.copy_(bias->unsqueeze(0).expand({M, N})) : y.zero_();
  if (w.scalar_type() == at::kFloat) {
    run<float>(x.data_ptr<float>(), M, K, w.data_ptr<float>(), bp, y.data_ptr<float>(), N, isa);
  } else {
    const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
    if (bf16_dot) {
      run_bf16dot(x.data_ptr<float>(), M, K, wp, bp, y.data_ptr<float>(), N, isa);
    } else {
      run<uint16_t>(x.data_ptr<float>(), M, K, wp, bp, y.data_ptr<float>(), N, isa);
    }
  }
  return y;
}

// Reference path: F.linear, with the weight/bias cast to x's dtype when they differ
// (e.g. fp32 activations with a bf16 weight). In bf16-dot mode an fp32 x meeting a
// bf16 weight is rounded to bf16 first, as the kernel does.
at::Tensor eager_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                        bool bf16_dot) {
  at::Tensor xc = x;
  if (bf16_dot && x.scalar_type() == at::kFloat && w.scalar_type() == at::kBFloat16)
    xc = x.to(at::kBFloat16).to(at::kFloat);
  at::Tensor wc = w.scalar_type() == xc.scalar_type() ? w : w.to(xc.scalar_type());
  std::optional<at::Tensor> bc = bias;
  if (bias.has_value() && bias->defined() && bias->scalar_type() != xc.scalar_type())
    bc = bias->to(xc.scalar_type());
  return at::linear(xc, wc, bc);
}

// Drop-in for F.linear(x, weight, bias): the kernel when it applies, else eager.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, bool bf16_dot) {
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t K = x.dim() >= 1 ? x.size(-1) : 0;
  bool ok = kHasAvx2 && x.dim() >= 1 && x.device().is_cpu() && w.device().is_cpu() &&
            x.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous() && w.size(1) == K &&
            (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) &&
            x.layout() == at::kStrided && w.layout() == at::kStrided;
  if (ok && has_bias) {
    ok = bias->device().is_cpu() && bias->layout() == at::kStrided && bias->scalar_type() == at::kFloat &&
         bias->dim() == 1 && bias->size(0) == w.size(0) && bias->is_contiguous();
  }
  int64_t M = 0;
  if (ok) {
    M = K > 0 ? x.numel() / K : 0;
    // More rows than a call takes (a prefill): bf16 weights go through the kernel in MAX_M-row
    // chunks (rows are batch-invariant, so chunking changes no bit, and eager would first widen
    // the whole weight to fp32); fp32 weights are left to the BLAS GEMM.
    ok = K > 0 && M >= 1 && (M <= MAX_M || w.scalar_type() == at::kBFloat16);
  }
  if (ok && at::GradMode::is_enabled()) {  // no backward here: let autograd see eager ops
    ok = !x.requires_grad() && !w.requires_grad() && !(has_bias && bias->requires_grad());
  }
  if (!ok) return eager_linear(x, w, bias, bf16_dot);
  at::Tensor x2 = x.reshape({M, K}).contiguous();
  at::Tensor y;
  if (M <= MAX_M) {
    y = smallm_linear(x2, w, bias, false, bf16_dot, std::nullopt);
  } else {
    y = at::empty({M, w.size(0)}, x2.options());
    for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
      const int64_t n = std::min(MAX_M, M - m0);
      y.narrow(0, m0, n).copy_(smallm_linear(x2.narrow(0, m0, n), w, bias, false, bf16_dot, std::nullopt));
    }
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.view(shape);
}

at::Tensor linear_bf16_dot(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  return linear(x, w, bias, true);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode small-M CPU linear kernel (AVX-512 / AVX2 / scalar, fp32 or bf16 weights, bf16-dot mode)";
  m.def("linear", &linear, "F.linear drop-in: the small-M kernel when it applies, else eager",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("bf16_dot") = false, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("linear_bf16_dot", &linear_bf16_dot,
        "linear(..., bf16_dot=True): a bf16 weight meets x rounded to bf16 (exact products, fp32 sums)",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("smallm_linear", &smallm_linear,
        "The kernel on 2-D fp32 x [M<=64, K]; raises if it does not apply. isa: None (the current one), "
        "'auto', 'scalar', 'avx2', 'avx512', 'avx512bf16'",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("force_scalar") = false, pybind11::arg("bf16_dot") = false,
        pybind11::arg("isa") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("has_avx2", []() { return kHasAvx2; }, "whether this CPU has AVX2/FMA");
  m.def("has_avx512", []() { return kCpu.avx512; }, "whether this CPU has AVX-512 F/BW/VL/DQ");
  m.def("has_avx512_bf16", []() { return kCpu.avx512bf16; }, "whether this CPU has AVX512_BF16 (vdpbf16ps)");
  m.def("has_amx", []() { return kCpu.amx; }, "whether this CPU has AMX-BF16 and the OS granted its tile state");
  m.def("best_isa", []() { return std::string(isa_name(kBestIsa)); }, "the best path this CPU supports");
  m.def("streams", []() { return g_one_stream.load() ? 1 : 4; },
        "a one-token call's weight streams: 1 (one row after another; AMD's default) or 4 (blocks of rows)");
  m.def("set_streams", &set_streams, "1, 4 or 0 (this CPU's default); returns the previous", pybind11::arg("n"));
  m.def("is_amd", []() { return kCpu.amd; }, "whether this CPU is AMD's (one weight stream by default)");
  m.def("isa", &get_isa, "the path linear() uses now (SPECDECODE_KERNEL_ISA at load, else the best)");
  m.def("set_isa", &set_isa, "use another path ('auto' = the best); returns the previous one",
        pybind11::arg("isa"));
  m.attr("MAX_M") = MAX_M;
  // For other extensions (the fused decode ops' whole-forward loop): the address of ``linear`` as a
  // plain function pointer, so C++ can call the kernel without a round trip through Python.
  m.def("linear_address", []() {
    using Fn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool);
    return reinterpret_cast<uintptr_t>(static_cast<Fn>(&linear));
  }, "address of linear(input, weight, bias, bf16_dot) as a C++ function pointer");
}
