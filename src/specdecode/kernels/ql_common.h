// Formats, the packed layout, quantized activations: what every path of the quantized linear shares.
// Part of quant_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

namespace {


// weight groups a call reads side by side (kStreams; a decode step on AMD reads one: decode_streams_default)
constexpr int kStreamsDefault = 4;

enum Fmt : int { FMT_Q8 = 0, FMT_Q4 = 1, FMT_Q4K = 2, FMT_Q6K = 3, FMT_Q5_0 = 4, FMT_Q4_1 = 5, FMT_Q5_1 = 6, FMT_Q5K = 7 };
// q4k and q5k: the Q4_K super-block, q5k with a 5th-bit plane (the "q4k" section below)
inline bool k4_fmt(int fmt) { return fmt == FMT_Q4K || fmt == FMT_Q5K; }
// the blocks-of-32 formats stored as GGUF has them (q5_0, q4_1, q5_1): int4's nibbles, a 5th-bit plane (q5_0, q5_1),
// fp16 d and, for q4_1 / q5_1, an fp16 min m per block (the "b32" section below has the layout)
inline bool b32_fmt(int fmt) { return fmt == FMT_Q5_0 || fmt == FMT_Q4_1 || fmt == FMT_Q5_1; }
inline bool b32_hi(int fmt) { return fmt == FMT_Q5_0 || fmt == FMT_Q5_1; }
inline bool b32_min(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q5_1; }
// not an order: a CPU may have AVX-512 VNNI without AVX-VNNI (Zen 4) or the reverse (Alder Lake); see supported()
enum Isa : int { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_VNNI512 = 2, ISA_AVXVNNI = 3 };
constexpr int64_t G = 16;  // weight rows (output columns) interleaved per group: one zmm lane each
// q4k (GGUF Q4_K as stored): per row and super-block of 256 weights, 128 quant bytes, 8 scales, 8 mins, fp16 d
// and dmin; a group's super-block is G times that, laid out [quants 8 x 256][sc 8 x 16][m 8 x 16][d 16][dmin 16]
constexpr int64_t QK_K = 256;
constexpr int64_t kQ4kRowSb = 148;
constexpr int64_t kQ4kGroupSb = G * kQ4kRowSb;  // 2368
constexpr int64_t kQ4kSc = 2048, kQ4kMin = 2176, kQ4kD = 2304, kQ4kDmin = 2336;  // offsets in a group's super-block
// q5k (GGUF Q5_K as stored): q4k's super-block, then the 5th-bit planes (8 x 64) and 64 zero bytes; a plain row's
// super-block is q4k's 148 bytes, GGUF's 32 qh bytes and 4 zero bytes (184: 8-byte rows for the int64 marker)
constexpr int64_t kQ5kRowSb = 184;
constexpr int64_t kQ5kGroupSb = G * kQ5kRowSb;  // 2944
constexpr int64_t kQ5kQh = kQ4kGroupSb;  // the planes' offset in a group's super-block
template <bool HI>
constexpr int64_t k4_group_sb() { return HI ? kQ5kGroupSb : kQ4kGroupSb; }
// q6k (GGUF Q6_K as stored): per row and super-block, 128 nibble bytes, 64 bytes of 2-bit high parts, 16 int8 scales,
// fp16 d, 2 zero bytes (212: a group's super-block is 53 whole 64-byte lines); a group's super-block is
// [nibbles 8 x 256][high bits 8 x 128][sc 16 x 16][d 16][zero 32]
constexpr int64_t kQ6kRowSb = 212;
constexpr int64_t kQ6kGroupSb = G * kQ6kRowSb;  // 3392
constexpr int64_t kQ6kQh = 2048, kQ6kSc = 3072, kQ6kD = 3328;  // offsets in a group's super-block

const char* isa_name(int isa) {
  switch (isa) {
    case ISA_AVX2: return "avx2";
    case ISA_VNNI512: return "vnni512";
    case ISA_AVXVNNI: return "avxvnni";
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

inline int64_t padded_k(int64_t K) { return (K + 31) & ~int64_t(31); }
inline int64_t quant_bytes(int fmt, int64_t Kp) { return fmt == FMT_Q8 ? Kp : Kp / 2; }
// a multiple of 4, so a group of G rows is a whole number of 64-byte lines
inline int64_t row_bytes(int fmt, int64_t K) {
  if (fmt == FMT_Q4K) return K / QK_K * kQ4kRowSb;  // K % 256 == 0 (checked by the callers)
  if (fmt == FMT_Q5K) return K / QK_K * kQ5kRowSb;
  if (fmt == FMT_Q6K) return K / QK_K * kQ6kRowSb;
  const int64_t Kp = padded_k(K);
  if (b32_fmt(fmt)) return Kp / 32 * (16 + 4 * b32_hi(fmt) + 2 + 2 * b32_min(fmt));  // GGUF's own block bytes
  return (quant_bytes(fmt, Kp) + 2 * (Kp / 32) + 3) & ~int64_t(3);
}

// The layout, in one place: where weight (n, k)'s quant and block scale live.
struct Layout {
  int fmt;
  int64_t N, Kp, nb, qb, rb, ng;  // ng full groups; rows n >= ng * G are plain tail rows
  Layout(int f, int64_t n, int64_t K)
      : fmt(f), N(n), Kp(padded_k(K)), nb(Kp / 32), qb(quant_bytes(f, Kp)), rb(row_bytes(f, K)), ng(n / G) {}
  const uint8_t* group(const uint8_t* w, int64_t g) const { return w + g * G * rb; }
  // the integer weight (int8: q; int4: v - 8)
  int wq(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t b = k / 32, j = k % 32;
    if (n < ng * G) {
      const uint8_t* grp = group(w, n / G);
      const int64_t c = n % G;
      if (fmt == FMT_Q8) return static_cast<int8_t>(grp[b * 512 + (j / 4) * 64 + c * 4 + j % 4]);
      const int64_t s = (j % 16) / 4;
      const uint8_t byte = grp[b * 256 + s * 64 + c * 4 + j % 4];
      return (j < 16 ? (byte & 0xf) : (byte >> 4)) - 8;
    }
    const uint8_t* row = w + n * rb;
    if (fmt == FMT_Q8) return static_cast<int8_t>(row[k]);
    const uint8_t byte = row[b * 16 + j % 16];
    return (j < 16 ? (byte & 0xf) : (byte >> 4)) - 8;
  }
  // q4k / q5k: the unsigned v (0..15, q5k 0..31) of weight (n, k); the weight is d * sc * v - dmin * m (q4k_scales)
  int64_t k4_group_stride() const { return fmt == FMT_Q5K ? kQ5kGroupSb : kQ4kGroupSb; }
  int64_t k4_row_stride() const { return fmt == FMT_Q5K ? kQ5kRowSb : kQ4kRowSb; }
  int q4k_v(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t b = k / 32, j = k % 32, sb = b / 8, s = (j % 16) / 4;
    int bit = 0;
    uint8_t byte;
    if (n < ng * G) {
      const uint8_t* base = group(w, n / G) + sb * k4_group_stride();
      byte = base[(b % 8) * 256 + s * 64 + (n % G) * 4 + j % 4];
      if (fmt == FMT_Q5K) bit = (base[kQ5kQh + (b % 8) * 64 + (n % G) * 4 + j % 4] >> (s + 4 * (j / 16))) & 1;
    } else {
      const uint8_t* base = w + n * rb + sb * k4_row_stride();
      byte = base[(b % 8) * 16 + j % 16];
      if (fmt == FMT_Q5K) bit = (base[148 + j] >> (b % 8)) & 1;
    }
    return (j < 16 ? (byte & 0xf) : (byte >> 4)) | (bit << 4);
  }
  // q4k: the exact fp32 d * sc[b] and dmin * m[b] of row n's sub-block b (11-bit by 6-bit mantissas)
  void q4k_scales(const uint8_t* w, int64_t n, int64_t b, float& ds, float& dm) const {
    const int64_t sb = b / 8, j = b % 8;
    uint16_t d, dmin;
    uint8_t sc, mn;
    if (n < ng * G) {
      const uint8_t* base = group(w, n / G) + sb * k4_group_stride();
      const int64_t c = n % G;
      sc = base[kQ4kSc + j * G + c];
      mn = base[kQ4kMin + j * G + c];
      std::memcpy(&d, base + kQ4kD + 2 * c, 2);
      std::memcpy(&dmin, base + kQ4kDmin + 2 * c, 2);
    } else {
      const uint8_t* base = w + n * rb + sb * k4_row_stride();
      sc = base[128 + j];
      mn = base[136 + j];
      std::memcpy(&d, base + 144, 2);
      std::memcpy(&dmin, base + 146, 2);
    }
    ds = half_to_float(d) * static_cast<float>(sc);
    dm = half_to_float(dmin) * static_cast<float>(mn);
  }
  // q6k: the 6-bit q (0..63) of weight (n, k); the weight is (d * sc[k / 16]) * (q - 32) (q6k_ds)
  int q6k_q(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t b = k / 32, j = k % 32, sb = b / 8, s = (j % 16) / 4, hh = j / 16;
    uint8_t byte, hb;
    int shift;
    if (n < ng * G) {
      const uint8_t* base = group(w, n / G) + sb * kQ6kGroupSb;
      const int64_t c = n % G;
      byte = base[(b % 8) * 256 + s * 64 + c * 4 + j % 4];
      hb = base[kQ6kQh + (b % 8) * 128 + (s / 2) * 64 + c * 4 + j % 4];
      shift = int(4 * (s % 2) + 2 * hh);
    } else {
      const uint8_t* base = w + n * rb + sb * kQ6kRowSb;
      byte = base[(b % 8) * 16 + j % 16];
      hb = base[128 + (k % QK_K) / 4];
      shift = int(2 * (k % 4));
    }
    return (hh ? (byte >> 4) : (byte & 0xf)) | (((hb >> shift) & 3) << 4);
  }
  // q6k: the exact fp32 d * sc[t] of row n's 16-weight sub-block t (11-bit by 8-bit)
  float q6k_ds(const uint8_t* w, int64_t n, int64_t t) const {
    const int64_t sb = t / 16, j = t % 16;
    uint16_t d;
    int8_t sc;
    if (n < ng * G) {
      const uint8_t* base = group(w, n / G) + sb * kQ6kGroupSb;
      sc = static_cast<int8_t>(base[kQ6kSc + j * G + n % G]);
      std::memcpy(&d, base + kQ6kD + 2 * (n % G), 2);
    } else {
      const uint8_t* base = w + n * rb + sb * kQ6kRowSb;
      sc = static_cast<int8_t>(base[192 + j]);
      std::memcpy(&d, base + 208, 2);
    }
    return half_to_float(d) * static_cast<float>(sc);
  }
  // b32 (q5_0 / q4_1 / q5_1): the unsigned q of weight (n, k): 0..15 (q4_1) or 0..31 with the plane's 5th bit
  int b32_q(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t b = k / 32, j = k % 32, h = j / 16;
    int v, bit = 0;
    if (n < ng * G) {
      const uint8_t* grp = group(w, n / G);
      const int64_t c = n % G, s = (j % 16) / 4, i = j % 4;
      const uint8_t byte = grp[b * 256 + s * 64 + c * 4 + i];
      v = h ? byte >> 4 : byte & 0xf;
      if (b32_hi(fmt)) bit = (grp[G * qb + b * 64 + c * 4 + i] >> (s + 4 * h)) & 1;
    } else {
      const uint8_t* row = w + n * rb;
      const uint8_t byte = row[b * 16 + j % 16];
      v = h ? byte >> 4 : byte & 0xf;
      if (b32_hi(fmt)) bit = (row[nb * 16 + b * 4 + j / 8] >> (j % 8)) & 1;
    }
    return v | (bit << 4);
  }
  // b32: block b's fp16 d (min = false) or m (min = true) of row n
  uint16_t b32_half(const uint8_t* w, int64_t n, int64_t b, bool min) const {
    uint16_t h;
    if (n < ng * G)
      std::memcpy(&h, group(w, n / G) + G * qb + (b32_hi(fmt) ? 64 * nb : 0) + (min ? 32 * nb : 0) + (b * G + n % G) * 2, 2);
    else
      std::memcpy(&h, w + n * rb + 16 * nb + (b32_hi(fmt) ? 4 * nb : 0) + (min ? 2 * nb : 0) + 2 * b, 2);
    return h;
  }
  uint16_t scale(const uint8_t* w, int64_t n, int64_t b) const {
    uint16_t h;
    if (n < ng * G)
      std::memcpy(&h, group(w, n / G) + G * qb + (b * G + n % G) * 2, 2);
    else
      std::memcpy(&h, w + n * rb + qb + 2 * b, 2);
    return h;
  }
  // weight (n, k) in fp32 as kernels/quant.py's ``dequantize`` computes it (a packed table's rows looked up). Where
  // an addition follows, the product is exact (at most 22 bits), so a fused multiply-add rounds as the two do
  float weight(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t b = k / 32;
    if (k4_fmt(fmt)) {
      float ds, dm;
      q4k_scales(w, n, b, ds, dm);
      return static_cast<float>(q4k_v(w, n, k)) * ds - dm;
    }
    if (fmt == FMT_Q6K) return q6k_ds(w, n, k / 16) * static_cast<float>(q6k_q(w, n, k) - 32);
    if (b32_fmt(fmt)) {
      const float d = half_to_float(b32_half(w, n, b, false)), q = static_cast<float>(b32_q(w, n, k));
      return b32_min(fmt) ? d * q + half_to_float(b32_half(w, n, b, true)) : d * (q - 16.f);
    }
    return static_cast<float>(wq(w, n, k)) * half_to_float(scale(w, n, b));
  }
};

// Quantized activations: per row, Kp int8 values, nb float scales and nb integer corrections
// (-128 * block sum for int8, -8 * block sum for int4: the SIMD paths multiply unsigned weights).
// q4k: corr is the block sum S_b itself, and t = float(S_b) * d_x (the min term's per-row factor).
struct QX {
  int64_t M = 0, Kp = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> corr;
  std::vector<float> t;
  std::vector<int32_t> hc;  // q6k: per row and block, -32 * S_lo, -32 * S_hi (the half blocks' activation sums)
};

// One row's blocks: q_x = round-half-even(x / d_x) with d_x = max|x| / 127, written as x * (127 / max|x|)
// rounded in the current (default: nearest-even) mode, clamped to [-127, 127]; a block's unused
// tail (K not a multiple of 32) and an all-zero block quantize to 0. The vector rows below give
// the same bytes: the same float multiply, and cvtps rounds in the same mode as nearbyint.
void quantize_row_scalar(int32_t off, const float* xr, int64_t K, int8_t* q, float* d, int32_t* corr) {
  const int64_t nb = padded_k(K) / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * 32, k1 = std::min(K, k0 + 32);
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xr[k]));
    int32_t sum = 0;
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    for (int64_t k = k0; k < k0 + 32; ++k) {
      int v = 0;
      if (k < k1 && amax > 0.f) v = std::max(-127, std::min(127, static_cast<int>(std::nearbyint(xr[k] * id))));
      q[k] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = amax / 127.f;
    corr[b] = -off * sum;
  }
}

#if QL_X86
#define QL_512 "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,avx2"

__attribute__((target(QL_512))) void quantize_row_512(int32_t off, const float* xr, int64_t K, int8_t* q, float* d,
                                                     int32_t* corr) {
  const int64_t nb = padded_k(K) / 32;
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = b * 32, n = std::min<int64_t>(32, K - k0);
    const __mmask16 m0 = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    const __mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? static_cast<__mmask16>((1u << (n - 16)) - 1) : 0;
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, xr + k0), v1 = _mm512_maskz_loadu_ps(m1, xr + k0 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, magnitude), _mm512_and_ps(v1, magnitude)));
    int32_t sum = 0;
    if (amax > 0.f) {
      const __m512 id = _mm512_set1_ps(127.f / amax);
      const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), lo), hi);
      const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)), lo), hi);
      sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0 + 16), _mm512_cvtepi32_epi8(q1));
    } else {
      std::memset(q + k0, 0, 32);
    }
    d[b] = amax / 127.f;
    corr[b] = -off * sum;
  }
}

__attribute__((target("avx2,fma,f16c"))) void quantize_row_avx2(int32_t off, const float* xr, int64_t K, int8_t* q,
                                                               float* d, int32_t* corr) {
  const int64_t full = K / 32;  // whole blocks here; a partial last block takes the scalar row
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (int64_t b = 0; b < full; ++b) {
    const float* xb = xr + b * 32;
    __m256 v[4], a = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      a = _mm256_max_ps(a, _mm256_and_ps(v[i], magnitude));
    }
    __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
    a4 = _mm_max_ss(a4, _mm_shuffle_ps(a4, a4, 1));
    const float amax = _mm_cvtss_f32(a4);
    int32_t sum = 0;
    if (amax > 0.f) {
      const __m256 id = _mm256_set1_ps(127.f / amax);
      __m256i acc = _mm256_setzero_si256();
      alignas(32) int32_t qi[32];
      for (int i = 0; i < 4; ++i) {
        const __m256i qv = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)), lo), hi);
        acc = _mm256_add_epi32(acc, qv);
        _mm256_store_si256(reinterpret_cast<__m256i*>(qi + 8 * i), qv);
      }
      for (int i = 0; i < 32; ++i) q[b * 32 + i] = static_cast<int8_t>(qi[i]);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      sum = _mm_cvtsi128_si32(s4);
    } else {
      std::memset(q + b * 32, 0, 32);
    }
    d[b] = amax / 127.f;
    corr[b] = -off * sum;
  }
  if (full * 32 < K) quantize_row_scalar(off, xr + full * 32, K - full * 32, q + full * 32, d + full, corr + full);
}
#endif  // QL_X86

// Quantizes every row of x; ``isa`` picks the row code (all give the same bytes). Every element of
// ``out`` is written, so a reused QX needs no clearing.
void quantize_x(int fmt, const float* x, int64_t M, int64_t K, QX& out, int isa = 0) {
  out.M = M;
  out.Kp = padded_k(K);
  out.nb = out.Kp / 32;
  out.q.resize(M * out.Kp);
  out.d.resize(M * out.nb);
  out.corr.resize(M * out.nb);
  // corr = -off * block sum: int8 -128 * sum, int4 -8 * sum, q5_0 -16 * sum, q4k / q4_1 / q5_1 +sum (S_b, the
  // min term's multiplier)
  const bool with_min = k4_fmt(fmt) || b32_min(fmt);
  const int32_t off = fmt == FMT_Q8 ? 128 : fmt == FMT_Q4 ? 8 : fmt == FMT_Q5_0 ? 16 : with_min ? -1 : 0;
  for (int64_t m = 0; m < M; ++m) {
    int8_t* q = out.q.data() + m * out.Kp;
    float* d = out.d.data() + m * out.nb;
    int32_t* corr = out.corr.data() + m * out.nb;
#if QL_X86
    if (isa == ISA_VNNI512) {
      quantize_row_512(off, x + m * K, K, q, d, corr);
      continue;
    }
    if (isa == ISA_AVX2 || isa == ISA_AVXVNNI) {
      quantize_row_avx2(off, x + m * K, K, q, d, corr);
      continue;
    }
#endif
    quantize_row_scalar(off, x + m * K, K, q, d, corr);
  }
  if (with_min) {
    out.t.resize(M * out.nb);
    for (int64_t i = 0; i < M * out.nb; ++i) out.t[i] = static_cast<float>(out.corr[i]) * out.d[i];
  }
  if (fmt == FMT_Q6K) {
    out.hc.resize(M * out.nb * 2);
    for (int64_t i = 0; i < M * out.nb; ++i) {
      const int8_t* q = out.q.data() + i * 32;
      int32_t lo = 0, hi = 0;
      for (int k = 0; k < 16; ++k) {
        lo += q[k];
        hi += q[16 + k];
      }
      out.hc[2 * i] = -32 * lo;
      out.hc[2 * i + 1] = -32 * hi;
    }
  }
}

}  // namespace
