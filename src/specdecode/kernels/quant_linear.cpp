// Quantized-weight linear for the CPU: y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ b).
//
// Why: a decode step of a real-sized model streams every weight byte from DRAM, so bytes per
// weight set the speed. These are llama.cpp's Q8_0 and Q4_0 formats in arithmetic (blocks of 32
// weights sharing one fp16 scale; 8.5 and 4.5 bits per weight), with the activations quantized
// to int8 per row and block of 32 at call time and the block dot products done in integers, as
// llama.cpp does: the multiply-adds run 4x (int8) wider than fp32 ones and the weights are never
// widened to floats.
//
// Packed weight (made by kernels/quant.py at load time; one row per output feature):
//   Kp = K rounded up to 64 (two blocks: a "pair"), nb = Kp / 32 blocks, zero padded;
//   row = [quants][nb fp16 scales][zero padding to a multiple of 64 bytes]
//   int8 (tensor dtype int8):  quants = Kp signed bytes q in [-127, 127], w ~= d * q
//   int4 (tensor dtype uint8): quants = Kp / 2 bytes; a pair of blocks (64 values v0..v63) is 32
//       bytes, byte j = v_j | v_{j+32} << 4, v in 0..15, w ~= d * (v - 8) (llama.cpp's Q4_0 math;
//       this pair layout unpacks to two blocks with one shift and one mask)
// The dtype says the format, and the row length is checked against K (from x).
//
// Activations (every path, scalar code, so every ISA sees the same int8 values): per row m and
// block b, d_x = max|x| / 127, q_x = round-half-even(x * 127 / max|x|) in [-127, 127].
// y[m, n] = sum_b d_w[n, b] * d_x[m, b] * (integer dot of block b) (+ b[n]), accumulated in fp32
// lanes in block order, then one fixed horizontal sum.
//
// Paths, chosen at runtime (SPECDECODE_KERNEL_ISA read at load: scalar | avx2 | avx512* -> the
// best of these the CPU has; set_isa() later; quant_linear(isa=) per call):
//   scalar   portable C++
//   avx2     AVX2: _mm256_maddubs_epi16 on |w| and sign(x, w), then _mm256_madd_epi16 (llama.cpp's
//            sign trick: maddubs wants one unsigned operand)
//   vnni512  AVX-512F/BW/VL + AVX512_VNNI: vpdpbusd on unsigned activations (q_x ^ 0x80 = q_x + 128,
//            made once per call) and signed weights, two blocks per zmm; the accumulator starts at
//            -128 * (sum of the weights in each lane), one vpdpbusd per weight pair shared by all
//            token rows, so each block's integer dot is exact and a token row costs one 64-byte
//            activation load, one scale load and four ALU ops per 64 weights
// AVX-VNNI without AVX-512 (Alder Lake) takes the avx2 path. Paths agree to fp32 rounding
// (their lanes group the same exact integer block sums differently), not bit for bit.
//
// Batch invariance (every path): y[m, n] depends only on x[m, :], W[n, :], b[n] and the path: the
// activation quantization is per row, each (row, weight row) accumulator walks the blocks in the
// same order whatever the register block of rows it lands in, and threads split output columns
// only. So verifying gamma+1 tokens gives bit-identical logits to decoding them one at a time,
// and speculative decoding is exact relative to the quantized model it runs.
//
// Cost (measured on Zen 4, 1 thread): a token row costs 4 vector ops per 64 weights (vpdpbusd, scale
// multiply, int->float, FMA) against 2 for the bf16 kernel's vdpbf16ps, so the gain is bytes: at
// M = 1 with weights streaming from DRAM, int8 / int4 steps of the 0.5B shape take ~0.7 / ~0.55 of
// bf16's; with several rows (verification) the per-block float work dominates and v(k) grows
// faster than bf16's on AVX512_BF16 CPUs (on AVX2-only CPUs bf16 pays widening + fp32 FMAs too).
//
// Dense (fp32/bf16) weights in the same model (embeddings kept dense, a bf16 head) go to the
// small-M kernel through its address (set_dense_linear), so one function pointer serves the
// fused decode ops' whole-stack loop for every projection.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define QL_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define QL_X86 0
#endif

namespace {

enum Fmt : int { FMT_Q8 = 0, FMT_Q4 = 1 };
enum Isa : int { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_VNNI512 = 2 };
constexpr int64_t TILE_N = 16;  // output columns per task unit
constexpr int64_t kPrefetchRows = 16;  // weight rows ahead that the SIMD paths prefetch
constexpr int64_t kMaxBlocks = 4096;  // K <= 131072 on the vnni512 path (larger K: the avx2 path)

const char* isa_name(int isa) {
  switch (isa) {
    case ISA_AVX2: return "avx2";
    case ISA_VNNI512: return "vnni512";
    default: return "scalar";
  }
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline int64_t padded_k(int64_t K) { return (K + 63) & ~int64_t(63); }
inline int64_t quant_bytes(int fmt, int64_t Kp) { return fmt == FMT_Q8 ? Kp : Kp / 2; }
// rows padded to whole cache lines: a 64-byte load of an unaligned row splits across two lines
inline int64_t row_bytes(int fmt, int64_t K) {
  const int64_t Kp = padded_k(K);
  return (quant_bytes(fmt, Kp) + 2 * (Kp / 32) + 63) & ~int64_t(63);
}

// Quantized activations: per row, Kp int8 values and nb float scales.
struct QX {
  int64_t M = 0, Kp = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
};

void quantize_x(const float* x, int64_t M, int64_t K, QX& out) {
  out.M = M;
  out.Kp = padded_k(K);
  out.nb = out.Kp / 32;
  out.q.assign(M * out.Kp, 0);
  out.d.assign(M * out.nb, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    for (int64_t b = 0; b < out.nb; ++b) {
      const int64_t k0 = b * 32, k1 = std::min(K, k0 + 32);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xr[k]));
      int8_t* q = out.q.data() + m * out.Kp + k0;
      if (amax > 0.f) {
        const float id = 127.f / amax;
        for (int64_t k = k0; k < k1; ++k) {
          const int v = static_cast<int>(std::nearbyint(xr[k] * id));
          q[k - k0] = static_cast<int8_t>(std::max(-127, std::min(127, v)));
        }
      }
      out.d[m * out.nb + b] = amax / 127.f;
    }
  }
}

// ------------------------------------------------------------------ scalar
void rows_scalar(int fmt, const QX& qx, const uint8_t* w, int64_t rb, const float* bias, float* y, int64_t N,
                 int64_t nb_, int64_t ne_) {
  const int64_t Kp = qx.Kp, nb = qx.nb, qb = quant_bytes(fmt, Kp);
  int8_t wv[64];
  for (int64_t n = nb_; n < ne_; ++n) {
    const uint8_t* row = w + n * rb;
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(row + qb);
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * Kp;
      const float* xd = qx.d.data() + m * nb;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t p = 0; p < nb / 2; ++p) {
        if (fmt == FMT_Q8) {
          std::memcpy(wv, row + p * 64, 64);
        } else {
          for (int j = 0; j < 32; ++j) {
            const uint8_t byte = row[p * 32 + j];
            wv[j] = static_cast<int8_t>((byte & 0xf) - 8);
            wv[j + 32] = static_cast<int8_t>((byte >> 4) - 8);
          }
        }
        for (int h = 0; h < 2; ++h) {
          const int64_t b = 2 * p + h;
          const float s = half_to_float(ws[b]) * xd[b];
          for (int l = 0; l < 8; ++l) {  // 8 lanes of 4, as the SIMD paths group them
            int32_t isum = 0;
            for (int j = 0; j < 4; ++j) isum += int32_t(wv[h * 32 + 4 * l + j]) * int32_t(xq[b * 32 + 4 * l + j]);
            acc[l] += float(isum) * s;
          }
        }
      }
      float t = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
      y[m * N + n] = t + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86
// ------------------------------------------------------------------ AVX2
__attribute__((target("avx2,fma,f16c"))) inline float hsum256(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                     // lanes l + l+4
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));            // (0+4)+(2+6), (1+5)+(3+7)
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

template <int MB>
__attribute__((target("avx2,fma,f16c"))) void block_avx2(int fmt, const QX& qx, int64_t m0, const uint8_t* row,
                                                        int64_t rb, int64_t qb, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(row + qb);
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < 2 * nb; b += 64)  // a later row's scales (see block_vnni)
    _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchRows * rb + qb + b), _MM_HINT_T0);
  __m256 acc[MB];
  for (int j = 0; j < MB; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < nb / 2; ++p) {
    __m256i wb[2];
    _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchRows * rb + p * (fmt == FMT_Q8 ? 64 : 32)), _MM_HINT_T0);
    if (fmt == FMT_Q8) {
      wb[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 64));
      wb[1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 64 + 32));
    } else {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 32));
      wb[0] = _mm256_sub_epi8(_mm256_and_si256(v, low4), eight);
      wb[1] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), eight);
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * p + h;
      const __m256i aw = _mm256_sign_epi8(wb[h], wb[h]);
      const float dw = _cvtsh_ss(ws[b]);
      for (int j = 0; j < MB; ++j) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx.q.data() + (m0 + j) * Kp + b * 32));
        const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wb[h])), ones);
        const __m256 s = _mm256_set1_ps(dw * qx.d[(m0 + j) * nb + b]);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), s, acc[j]);
      }
    }
  }
  for (int j = 0; j < MB; ++j) out[j] = hsum256(acc[j]);
}

void rows_avx2(int fmt, const QX& qx, const uint8_t* w, int64_t rb, const float* bias, float* y, int64_t N,
               int64_t nb_, int64_t ne_) {
  const int64_t qb = quant_bytes(fmt, qx.Kp);
  float out[6];
  for (int64_t n = nb_; n < ne_; ++n) {
    const uint8_t* row = w + n * rb;
    for (int64_t m0 = 0; m0 < qx.M; m0 += 6) {
      const int64_t mb = std::min<int64_t>(6, qx.M - m0);
      switch (mb) {
        case 1: block_avx2<1>(fmt, qx, m0, row, rb, qb, out); break;
        case 2: block_avx2<2>(fmt, qx, m0, row, rb, qb, out); break;
        case 3: block_avx2<3>(fmt, qx, m0, row, rb, qb, out); break;
        case 4: block_avx2<4>(fmt, qx, m0, row, rb, qb, out); break;
        case 5: block_avx2<5>(fmt, qx, m0, row, rb, qb, out); break;
        default: block_avx2<6>(fmt, qx, m0, row, rb, qb, out); break;
      }
      for (int64_t j = 0; j < mb; ++j) y[(m0 + j) * N + n] = out[j] + (bias ? bias[n] : 0.f);
    }
  }
}

// ------------------------------------------------------------------ AVX-512 VNNI
// Per activation row: the quants made unsigned (q + 128) and, per pair of blocks, the x scales
// spread over the pair's lanes (8 + 8).
struct QXPairs {
  std::vector<uint8_t> xu;  // [M, Kp]
  std::vector<float> scale;   // [M, nb/2, 16]
};

void pairs_for(const QX& qx, QXPairs& out) {
  const int64_t np = qx.nb / 2;
  out.xu.resize(qx.q.size());
  for (size_t i = 0; i < qx.q.size(); ++i) out.xu[i] = static_cast<uint8_t>(qx.q[i]) ^ 0x80u;
  out.scale.assign(qx.M * np * 16, 0.f);
  for (int64_t m = 0; m < qx.M; ++m)
    for (int64_t p = 0; p < np; ++p) {
      float* sp = out.scale.data() + (m * np + p) * 16;
      for (int l = 0; l < 8; ++l) {
        sp[l] = qx.d[m * qx.nb + 2 * p];
        sp[8 + l] = qx.d[m * qx.nb + 2 * p + 1];
      }
    }
}

#define QL_512 "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,avx2"

__attribute__((target(QL_512))) inline float hsum512(__m512 v) {
  // fixed tree: 16 -> 8 -> (the avx2 tree)
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 a = _mm256_castps256_ps128(s8), b = _mm256_extractf128_ps(s8, 1);
  __m128 s = _mm_add_ps(a, b);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

// R weight rows x MB token rows per call (rows_vnni uses R = 1, see there): each weight pair is
// unpacked once for MB token rows and each activation load serves R weight rows. Every (token
// row, weight row) accumulator runs the same instruction sequence whatever R and MB are (the same
// pairs in the same order, one fixed horizontal sum), so results do not depend on the batch.
template <int R, int MB>
__attribute__((target(QL_512))) void block_vnni(int fmt, const QX& qx, const QXPairs& px, int64_t m0,
                                               const uint8_t* w, int64_t rb, int64_t qb, float* out) {
  const int64_t Kp = qx.Kp, np = qx.nb / 2;
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  const __m256i low4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  // the rows' fp16 scales as floats, 16 at a time (a row has at most kMaxBlocks blocks)
  alignas(64) float wsf[R][kMaxBlocks + 16];
  for (int r = 0; r < R; ++r) {
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(w + r * rb + qb);
    // the scales a later call reads first: a demand miss per row otherwise (the loop below
    // prefetches only the quants)
    for (int64_t b = 0; b < 2 * qx.nb; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + kPrefetchRows) * rb + qb + b), _MM_HINT_T0);
    for (int64_t b = 0; b < qx.nb; b += 16) {  // masked: never read past the row's last scale
      const __mmask16 live = qx.nb - b >= 16 ? __mmask16(0xffff) : __mmask16((1u << (qx.nb - b)) - 1);
      _mm512_store_ps(wsf[r] + b, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, ws + b)));
    }
  }
  const uint8_t* xu = px.xu.data() + m0 * Kp;
  const float* xs = px.scale.data() + m0 * np * 16;
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < MB; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    __m512i ws8[R], init[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w + r * rb;
      // DRAM latency, not bandwidth, limits a single stream of rows: fetch the same bytes of the
      // row kPrefetchRows further on while this one computes (prefetches never fault)
      _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchRows * rb + p * (fmt == FMT_Q8 ? 64 : 32)),
                   _MM_HINT_T0);
      if (fmt == FMT_Q8) {
        ws8[r] = _mm512_loadu_si512(row + p * 64);
      } else {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 32));
        ws8[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_sub_epi8(_mm256_and_si256(v, low4), eight)),
                                    _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), eight), 1);
      }
      // (x + 128) . w - 128 * sum(w) = x . w, per lane of four
      init[r] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c128, ws8[r]));
      dw[r] = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(wsf[r] + 2 * p)))));
    }
    for (int j = 0; j < MB; ++j) {
      const __m512i xv = _mm512_loadu_si512(xu + j * Kp + p * 64);
      const __m512 sx = _mm512_loadu_ps(xs + (j * np + p) * 16);
      for (int r = 0; r < R; ++r) {
        const __m512i isum = _mm512_dpbusd_epi32(init[r], xv, ws8[r]);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[r], sx), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < MB; ++j) out[r * 8 + j] = hsum512(acc[r][j]);
}

template <int R>
void vnni_rows(int fmt, const QX& qx, const QXPairs& px, int64_t m0, int64_t mb, const uint8_t* w, int64_t rb,
               int64_t qb, float* out) {
  switch (mb) {
    case 1: return block_vnni<R, 1>(fmt, qx, px, m0, w, rb, qb, out);
    case 2: return block_vnni<R, 2>(fmt, qx, px, m0, w, rb, qb, out);
    case 3: return block_vnni<R, 3>(fmt, qx, px, m0, w, rb, qb, out);
    case 4: return block_vnni<R, 4>(fmt, qx, px, m0, w, rb, qb, out);
    case 5: return block_vnni<R, 5>(fmt, qx, px, m0, w, rb, qb, out);
    case 6: return block_vnni<R, 6>(fmt, qx, px, m0, w, rb, qb, out);
    case 7: return block_vnni<R, 7>(fmt, qx, px, m0, w, rb, qb, out);
    default: return block_vnni<R, 8>(fmt, qx, px, m0, w, rb, qb, out);
  }
}

void rows_vnni(int fmt, const QX& qx, const QXPairs& px, const uint8_t* w, int64_t rb, const float* bias, float* y,
               int64_t N, int64_t nb_, int64_t ne_) {
  // One weight row per call (R = 1): with weights streaming from DRAM, R = 2 or 4 interleaved rows
  // measured 20-70% slower on Zen 4 (9728 x 896, M = 1 and 5) than one row with prefetching, and
  // the activations of up to 8 token rows stay in L1 anyway.
  const int64_t qb = quant_bytes(fmt, qx.Kp);
  float out[8];
  for (int64_t m0 = 0; m0 < qx.M; m0 += 8) {
    const int64_t mb = std::min<int64_t>(8, qx.M - m0);
    for (int64_t n = nb_; n < ne_; ++n) {
      vnni_rows<1>(fmt, qx, px, m0, mb, w + n * rb, rb, qb, out);
      for (int64_t j = 0; j < mb; ++j) y[(m0 + j) * N + n] = out[j] + (bias ? bias[n] : 0.f);
    }
  }
}
#endif  // QL_X86

// ------------------------------------------------------------------ runtime choice
struct Cpu {
  bool avx2 = false, vnni512 = false;
};

Cpu detect() {
  Cpu c;
#if QL_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  unsigned a = 0, b = 0, cx = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &cx, &d) && ((cx >> 29) & 1u);
  c.avx2 = c.avx2 && f16c;
  c.vnni512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vnni");
#endif
  return c;
}

const Cpu kCpu = detect();
const int kBest = kCpu.vnni512 ? ISA_VNNI512 : kCpu.avx2 ? ISA_AVX2 : ISA_SCALAR;

// "scalar" | "avx2" | "vnni512" (or any "avx512..." name: the best AVX-512 path here) -> level;
// "auto" / "" -> -1; else -2.
int parse_isa(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s.empty() || s == "auto") return -1;
  if (s == "scalar") return ISA_SCALAR;
  if (s == "avx2") return ISA_AVX2;
  if (s == "vnni512" || s.rfind("avx512", 0) == 0) return ISA_VNNI512;
  return -2;
}

int isa_from_env() {
  const char* v = std::getenv("SPECDECODE_KERNEL_ISA");
  const int req = v ? parse_isa(v) : -1;
  return req < 0 ? kBest : std::min(req, kBest);
}

std::atomic<int> g_isa{isa_from_env()};
std::atomic<uintptr_t> g_dense{0};  // the small-M kernel's linear(x, w, bias, bf16_dot), or 0: at::linear

std::string set_isa(const std::string& name) {
  int req = parse_isa(name);
  TORCH_CHECK(req != -2, "quant set_isa: unknown ISA '", name, "' (auto, scalar, avx2, vnni512)");
  if (req == -1) req = kBest;
  TORCH_CHECK(req <= kBest, "quant set_isa: this CPU does not support ", isa_name(req), " (best: ",
              isa_name(kBest), ")");
  return isa_name(g_isa.exchange(req));
}

int format_of(const at::Tensor& w) {
  if (w.scalar_type() == at::kChar) return FMT_Q8;
  if (w.scalar_type() == at::kByte) return FMT_Q4;
  return -1;
}

// The kernel on 2-D contiguous fp32 x [M, K] and a packed weight.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                        const std::optional<std::string>& isa_arg) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "quant_linear: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "quant_linear: x must be a contiguous fp32 [M, K] tensor");
  const int fmt = format_of(w);
  TORCH_CHECK(fmt >= 0 && w.dim() == 2 && w.is_contiguous(),
              "quant_linear: weight must be a contiguous packed int8 (Q8) or uint8 (Q4) [N, row bytes] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), rb = row_bytes(fmt, K);
  TORCH_CHECK(w.size(1) == rb, "quant_linear: a packed ", fmt == FMT_Q8 ? "int8" : "int4", " weight for K=", K,
              " has ", rb, " bytes per row, got ", w.size(1));
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->dim() == 1 &&
                    bias->size(0) == N,
                "quant_linear: bias must be a contiguous fp32 [N] tensor");
    bp = bias->data_ptr<float>();
  }
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa_arg.has_value()) {
    const int req = parse_isa(*isa_arg);
    TORCH_CHECK(req != -2, "quant_linear: unknown isa '", *isa_arg, "' (auto, scalar, avx2, vnni512)");
    isa = req == -1 ? kBest : req;
    TORCH_CHECK(isa <= kBest, "quant_linear: this CPU does not support ", isa_name(isa));
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M * N == 0) return y;
  QX qx;
  quantize_x(x.data_ptr<float>(), M, K, qx);
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  const int64_t ntiles = (N + TILE_N - 1) / TILE_N;
  // ~64k integer multiply-adds per task, so small layers do not wake threads for nothing
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, TILE_N * qx.Kp * M));
#if QL_X86
  QXPairs px;
  if (isa == ISA_VNNI512 && qx.nb > kMaxBlocks) isa = ISA_AVX2;
  if (isa == ISA_VNNI512) pairs_for(qx, px);
#endif
  at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
    const int64_t nb_ = tb * TILE_N, ne_ = std::min(N, te * TILE_N);
#if QL_X86
    if (isa == ISA_VNNI512) return rows_vnni(fmt, qx, px, wp, rb, bp, yp, N, nb_, ne_);
    if (isa == ISA_AVX2) return rows_avx2(fmt, qx, wp, rb, bp, yp, N, nb_, ne_);
#endif
    rows_scalar(fmt, qx, wp, rb, bp, yp, N, nb_, ne_);
  });
  return y;
}

using LinearFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool);

// F.linear drop-in for a model with packed weights: packed -> the kernel (any leading shape, any
// number of rows); fp32/bf16 -> the small-M kernel (or eager at::linear when none is set).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, bool bf16_dot) {
  if (format_of(w) < 0) {
    const uintptr_t dense = g_dense.load(std::memory_order_relaxed);
    if (dense) return reinterpret_cast<LinearFn>(dense)(x, w, bias, bf16_dot);
    const at::Tensor wc = w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
    std::optional<at::Tensor> bc = bias;
    if (bc.has_value() && bc->defined() && bc->scalar_type() != x.scalar_type()) bc = bc->to(x.scalar_type());
    return at::linear(x, wc, bc);
  }
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat,
              "quantized weights need fp32 activations (load the model with dtype fp32)");
  const int64_t K = x.size(-1);
  at::Tensor x2 = x.reshape({-1, K}).contiguous();
  at::Tensor y = quant_linear(x2, w, bias, std::nullopt);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.view(shape);
}

// Reference: the same quantized activations and weights, dequantized, multiplied in fp64 (tests).
at::Tensor reference(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "reference: fp32 [M, K] x");
  const int fmt = format_of(w);
  TORCH_CHECK(fmt >= 0 && w.is_contiguous(), "reference: packed weight");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), rb = row_bytes(fmt, K);
  TORCH_CHECK(w.size(1) == rb, "reference: row bytes");
  QX qx;
  quantize_x(x.data_ptr<float>(), M, K, qx);
  at::Tensor y = at::zeros({M, N}, x.options().dtype(at::kDouble));
  double* yp = y.data_ptr<double>();
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  const int64_t qb = quant_bytes(fmt, qx.Kp);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = wp + n * rb;
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(row + qb);
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < qx.Kp; ++k) {
        int wv;
        if (fmt == FMT_Q8) {
          wv = static_cast<int8_t>(row[k]);
        } else {
          const int64_t p = k / 64, j = k % 64;
          const uint8_t byte = row[p * 32 + (j % 32)];
          wv = (j < 32 ? (byte & 0xf) : (byte >> 4)) - 8;
        }
        acc += double(half_to_float(ws[k / 32])) * wv * double(qx.d[m * qx.nb + k / 32]) * qx.q[m * qx.Kp + k];
      }
      yp[m * N + n] = acc;
    }
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode quantized-weight CPU linear (Q8_0 / Q4_0 blocks, int8 activations; VNNI-512 / AVX2 / scalar)";
  m.def("linear", &linear, "F.linear drop-in: packed int8/int4 weights -> the kernel, dense -> the small-M kernel",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("bf16_dot") = true, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("quant_linear", &quant_linear, "the kernel on fp32 x [M, K] and a packed weight; isa: None, auto, scalar, "
        "avx2, vnni512", pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("isa") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("reference", &reference, "fp64 product of the dequantized int8 activations and weights (tests)",
        pybind11::arg("input"), pybind11::arg("weight"));
  m.def("row_bytes", [](int64_t K, bool int4) { return row_bytes(int4 ? FMT_Q4 : FMT_Q8, K); },
        "bytes per packed row for K inputs", pybind11::arg("k"), pybind11::arg("int4"));
  m.def("has_avx2", []() { return kCpu.avx2; }, "whether this CPU has AVX2/FMA/F16C");
  m.def("has_vnni512", []() { return kCpu.vnni512; }, "whether this CPU has AVX-512 VNNI (vpdpbusd)");
  m.def("best_isa", []() { return std::string(isa_name(kBest)); }, "the best path this CPU supports");
  m.def("isa", []() { return std::string(isa_name(g_isa.load())); }, "the path linear() uses now");
  m.def("set_isa", &set_isa, "use another path ('auto' = the best); returns the previous one", pybind11::arg("isa"));
  m.def("set_dense_linear", [](uintptr_t fn) { g_dense.store(fn); },
        "address of the dense small-M linear(x, w, bias, bf16_dot) that non-packed weights go to (0: at::linear)",
        pybind11::arg("address"));
  m.def("linear_address", []() {
    return reinterpret_cast<uintptr_t>(static_cast<LinearFn>(&linear));
  }, "address of linear(input, weight, bias, bf16_dot) as a C++ function pointer");
}
