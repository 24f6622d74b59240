// How the SIMD walks read a group: register blocks of token rows, prefetch distances, the 5th-bit merges.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "ql_common.h"

namespace {

// y's rows m0 .. m0 + mb of groups g0 .. g0 + ns: the float sums in out (group i, row j from
// out[(i * row_stride + j) * G]) plus the bias. Every SIMD path ends with it.
// The token rows of register block starting at m0: blocks of at most ``cap`` rows, balanced (9 rows: 5 + 4, not
// 8 + 1; 5 rows on a 4-row path: 3 + 2): each block streams the weights again (from cache after the first) and
// pays a block's fixed work per sub-block, which one row alone amortizes worst. Rows are independent (batch
// invariance), so the blocks change no bit.
inline int64_t block_rows(int64_t M, int64_t m0, int64_t cap) {
  const int64_t blocks = (M + cap - 1) / cap, base = M / blocks, extra = M % blocks;
  return m0 < extra * (base + 1) ? base + 1 : base;
}

// F<MB>::run(args...) for MB = m (1..8; more: 8), the register block a call of m token rows takes as one
template <template <int> class F, typename... A>
void by_rows(int64_t m, const A&... a) {
  switch (m) {
    case 1: F<1>::run(a...); break;
    case 2: F<2>::run(a...); break;
    case 3: F<3>::run(a...); break;
    case 4: F<4>::run(a...); break;
    case 5: F<5>::run(a...); break;
    case 6: F<6>::run(a...); break;
    case 7: F<7>::run(a...); break;
    default: F<8>::run(a...); break;
  }
}

inline void write_groups(const Layout& L, const float* out, int64_t row_stride, int ns, int64_t m0, int64_t mb,
                         int64_t g0, const float* bias, float* y) {
  for (int i = 0; i < ns; ++i)
    for (int64_t j = 0; j < mb; ++j)
      for (int c = 0; c < G; ++c) {
        const int64_t n = (g0 + i) * G + c;
        y[(m0 + j) * L.N + n] = out[(i * row_stride + j) * G + c] + (bias ? bias[n] : 0.f);
      }
}

#if QL_X86
// Into L1 (_MM_HINT_T0): a stream's lines are due a few KiB later, 4 streams x 2 KiB sit well inside a 48 KiB L1,
// and the L2 hint left each line's last hop on the critical path (bench kernel-ab, EPYC Zen 5, 1 thread, T0
// against T1 on every stream: 1 row int8 / int4 / q4k / q5k 1.08-1.21x on VNNI-512, 1.02-1.2x on AVX2 and
// AVX-VNNI, nothing slower beyond noise). Not a group ahead, as half_avx2 fetches: that far ahead, T0 evicts the
// lines in use (one stream: 1.15-1.9x slower), so that one stays in L2.
// How far ahead: 2 KiB (2048 x 8192 from memory, one thread: against 32 KiB, int8 1 row 0.655 -> 0.59 ms and
// int4 5 rows 0.56 -> 0.37 ms on VNNI-512, int4 1 row 0.44 -> 0.32 ms on AVX2; 1 KiB and 4-8 KiB are slower).
// Far ahead, lines arrive before they are due and crowd out the ones in use.
constexpr int64_t kStreamPrefetch = 2 * 1024;
// A stream read alone (a decode step on AMD, decode_streams_default; the groups left over) prefetches further ahead:
// on a Zen 5 EPYC (KVM, one thread) a decode step's int8 matrices at SmolLM2-360M's shapes read 26-28 GB/s as 4
// streams 2 KiB ahead and as 1 stream 2 KiB ahead, up to 30-31 GB/s as 1 stream 4-6 KiB ahead (bench kernel-ab;
// 4 streams 4 KiB ahead: 0.86-0.97x); 16 KiB 27.
constexpr int64_t kOneStreamPrefetch = 4 * 1024;
// A pass of several token rows read as one stream (a verification pass on AMD) prefetches further still: each line
// takes its rows' arithmetic, so a decode step's distance runs out of lead and the reads stop overlapping it. On
// the Zen 5 EPYC (KVM, one thread, 1.7B-shape matrices from DRAM) a 5-row q4k pass took 1.37x a 1-row one as 4
// streams 4 KiB ahead, 1.50x as 1 stream 4 KiB ahead, 1.05-1.10x as 1 stream 8-32 KiB ahead (T0; T1 / T2 no
// better), and 9 rows 2.45x, 2.31x and 1.84x. AVX2's q4k / q6k walks likewise (bound by arithmetic sooner: 3 rows
// 1.08-1.09x, 5 rows 1.05-1.06x faster than at 4 KiB; 1.7B Q4_K_M v(1) 1.23-1.27 -> 1.10-1.12).
constexpr int64_t kRowsPrefetch = 16 * 1024;
// How far ahead a walk of NS groups side by side with MB token rows prefetches: ``side`` (NS > 1), ``one`` (one
// stream, one row) or kRowsPrefetch (one stream, several rows)
template <int NS, int MB>
constexpr int64_t stream_ahead(int64_t side, int64_t one) {
  return NS > 1 ? side : MB > 1 ? kRowsPrefetch : one;
}

// A group's block scales (32 bytes a block) sit after its quants: a second stream per group, under a KiB at short
// rows (K = 960: 30 blocks), too short for the hardware prefetcher to learn, so each of its lines was a demand
// miss (int4 at K = 960 read 19-21 GB/s against 26-29 at K = 8192). The line ``ahead`` blocks past block b
// (as far ahead in time as the quants' prefetch), past the group's end in the group ``next`` bytes on (the one
// this stream reads next). Prefetching it took int4 at K = 960 to 25-26 GB/s (bench kernel-ab: 0.5B shapes,
// VNNI-512, int4 1 / 5 rows 1.20 / 1.50x, int8 5 rows 1.29x, int8 1 row unchanged).
__attribute__((always_inline)) inline void prefetch_scales(const uint8_t* scales, int64_t b, int64_t nb, int64_t ahead,
                                                           int64_t next) {
  const int64_t sb = b + ahead;
  _mm_prefetch(reinterpret_cast<const char*>(scales + (sb < nb ? sb * 32 : next + (sb - nb) * 32)), _MM_HINT_T0);
}

// kStreamPrefetch's worth of blocks: int8 blocks are 512 bytes a group, int4 256
inline int64_t scale_ahead(int fmt) { return kStreamPrefetch / (fmt == FMT_Q8 ? 512 : 256); }

// Step S's q as bytes from its nibble vector and the block's plane: the low nibbles (inputs 4S + i) with plane
// bit S, the high ones (16 + 4S + i) with bit S + 4, each moved to bit 4 (16-bit shifts by at most 4 keep bit 4
// within its byte); (a & c) | b is ternary-logic 0xEC
template <int S>
__attribute__((target(QL_512), always_inline)) inline void b32_merge512(__m512i raw, __m512i qh, __m512i& lo,
                                                                       __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
  lo = _mm512_ternarylogic_epi32(raw, _mm512_and_si512(_mm512_slli_epi16(qh, 4 - S), m10), low4, 0xEC);
  hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), _mm512_and_si512(_mm512_srli_epi16(qh, S), m10), low4,
                                 0xEC);
}

// 256-bit paths: step S of one half group as q bytes (b32_merge512's arithmetic, with or and and)
template <int S>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void b32_merge256(__m256i raw, __m256i qh, __m256i& lo,
                                                                                __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
  lo = _mm256_or_si256(_mm256_and_si256(raw, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4 - S), m10));
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                       _mm256_and_si256(_mm256_srli_epi16(qh, S), m10));
}
#endif  // QL_X86

}  // namespace
