// Tiles, weight element types and the scalar path of the small-M dense linear.
// Part of smallm_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

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

// With SPECDECODE_KERNEL_STREAMS=1 (or a model's own choice: linear_one) a short call (a decode step, up to
// kOneStreamMaxRows rows) on the AVX-512 paths reads its weight rows one after another, one sequential stream,
// which Zen's prefetchers follow best (Zen 5 EPYC, SmolLM2-135M with bf16 weights, a plain step against blocks of
// rows side by side: bf16-dot 1.3x, fp32-widening 1.3x at 1 thread, 1.2-1.5x at 2; the bundled bf16 code model
// 1.1-1.4x). AVX2 keeps its blocks (one row at a time ran 0.6x there:
// its horizontal sums). The same bits either way (each row's sum walks K in the same order whatever block).
std::atomic<bool> g_one_stream{false};

// Only for a matrix past L2's size: one that stays in cache is bound by arithmetic, where one row at a time pays a
// horizontal sum per row (576 x 576 bf16 called again and again: 12.6 against 7.7 us; 49,152 x 576 streamed from
// DRAM: 1.03 against 1.72 ms). A small model's whole step is such (the tests' tiny models ran slower).
constexpr int64_t kOneStreamMinBytes = int64_t(1) << 20;

// Token rows up to which a call reads one stream: a short verification pass too, else a one-stream decode step
// makes every draft look dear (the bundled code model, bf16: one token 1.2 ms, 2-6 tokens in blocks 1.4-1.9 ms,
// so v(1) ~1.4 and a near break-even draft was switched off). Zen 5 EPYC, 1 thread, every matrix of a model once,
// one stream against blocks: SmolLM2-135M bf16 2 / 4 / 6 rows 6.3-6.6 / 6.7-6.9 / 6.9-7.2 ms against 8.3-8.8 /
// 9.0 / 8.5-8.6, 7 rows 7.5-7.7 / 8.1, 8 rows 8.3-8.6 / 7.4-7.6; the code model 2-5 rows 1.22-1.43 against
// 1.4-1.9 ms; 9+ rows (two register blocks, each re-reading the weights from cache by rows) 2.2 against 1.6-1.8.
constexpr int64_t kOneStreamMaxRows = 6;

// A call's choice: one stream (1), the measured blocks (4), or the process setting (0: g_one_stream); only a call
// of at most kOneStreamMaxRows token rows on a matrix past kOneStreamMinBytes reads one stream.
inline bool one_stream_call(int64_t M, int streams) {
  return M <= kOneStreamMaxRows && (streams == 1 || (streams == 0 && g_one_stream.load(std::memory_order_relaxed)));
}

inline bool one_stream(bool one, int64_t weight_bytes) { return one && weight_bytes >= kOneStreamMinBytes; }

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

}  // namespace
