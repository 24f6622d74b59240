// Quantized-weight linear for the CPU: y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ b).
//
// Why: a decode step of a real-sized model streams every weight byte from DRAM, so bytes per
// weight set the speed. These are llama.cpp's Q8_0 and Q4_0 formats in arithmetic (blocks of 32
// weights sharing one fp16 scale; 8.5 and 4.5 bits per weight), with the activations quantized
// to int8 per row and block of 32 once per call and the block dot products done in integers.
//
// Packed weight (made by kernels/quant.py at load time), a [N, rb] int8 (Q8) or uint8 (Q4) tensor:
//   Kp = K rounded up to 32, nb = Kp / 32 blocks (zero padded), qb = Kp (int8) or Kp / 2 (int4),
//   rb = qb + 2 * nb rounded up to 4 bytes.
//   Rows come in groups of G = 16 (rows 16g .. 16g + 15 fill bytes [16g * rb, (16g + 16) * rb)),
//   interleaved so that one 64-byte vector holds 4 consecutive inputs of all 16 rows (one int32
//   lane per output column, as llama.cpp's repacked "8x8" Q4_0 kernels do):
//     quants: per block b, int8: 8 steps s of [row c: q[c, 32b + 4s + i], i < 4] (512 bytes);
//             int4: 4 steps s of [row c: v[c, 32b + 4s + i] | v[c, 32b + 16 + 4s + i] << 4] (256 bytes)
//     then the scales: per block b, the 16 rows' fp16 d (32 bytes); then zero padding.
//   The last N % 16 rows are plain: [quants in input order (int4: byte j of block b =
//   v[32b + j] | v[32b + 16 + j] << 4)][nb fp16 scales][padding].
//   int8: w ~= d * q, q in [-127, 127]; int4: w ~= d * (v - 8), v in 0..15 (Q4_0's math).
//
// q4k: GGUF Q4_K as stored (kernels/quant.py pack_q4k moves its bytes), a [N, rb / 2] int16 tensor over rb =
//   K / 256 * 148 bytes a row (4.625 bits per weight; K a multiple of 256). Q4_K's super-block of 256 weights has
//   fp16 d and dmin, 6-bit sc[j] and m[j] per sub-block j of 32 and nibbles v; w = d * sc[j] * v - dmin * m[j]
//   (d * sc[j] and dmin * m[j] exact in fp32). A group's super-block sb fills bytes [sb * 2368, sb * 2368 + 2368)
//   of the group: per sub-block j, int4's 4 steps of 64 bytes (row c: v[32j + 4s + i] | v[32j + 16 + 4s + i] << 4,
//   2048 bytes), then sc[j] of the 16 rows per j (128), m[j] likewise (128), the rows' fp16 d (32), dmin (32).
//   A plain tail row's super-block: [128 nibble bytes, int4's plain order][8 sc][8 m][fp16 d][fp16 dmin].
//   Arithmetic, every path: int4's I_b on unsigned v (no -8 correction), then per sub-block
//   acc = fma(float(I_b), (d * sc_b) * d_x, acc); acc = fma(-t_b, dmin * m_b, acc), t_b = float(S_b) * d_x with
//   S_b the block's activation sum (once per token row and block, shared by all columns).
//
// q5k: GGUF Q5_K as stored (kernels/quant_q5k.py pack_q5k), a [N, rb / 8] int64 tensor over rb = K / 256 * 184:
//   q4k's super-block with the 5th bits of v (0..31) after it: a group's super-block sb fills [sb * 2944, +2944) as
//   q4k's 2368 bytes, then per sub-block j a 64-byte plane (row c's byte 4c + i holding at bit s + 4h the 5th bit of
//   input 32j + 16h + 4s + i, the b32 plane), then 64 zero bytes (46 whole lines). A plain tail row's super-block:
//   q4k's 148 bytes, GGUF's 32 qh bytes (input 32j + e's 5th bit at bit j of byte e), 4 zero bytes. Arithmetic: q4k's.
//
// q6k: GGUF Q6_K as stored (kernels/quant.py pack_q6k moves and splits its bytes), a [N, rb / 4] int32 tensor over
//   rb = K / 256 * 212 bytes a row (6.625 bits per weight; K a multiple of 256). Q6_K's super-block of 256 weights
//   has q in 0..63 (a 4-bit and a 2-bit part), an int8 scale sc[t] per sub-block t of 16 and fp16 d;
//   w = (d * sc[t]) * (q - 32) (d * sc[t] exact in fp32). A group's super-block sb fills bytes
//   [sb * 3392, sb * 3392 + 3392) of the group: per block j of 32, int4's 4 steps of 64 bytes of low nibbles
//   (row c: lo4(q[32j + 4s + i]) | lo4(q[32j + 16 + 4s + i]) << 4; 2048 bytes), then per block j 2 vectors p of
//   64 high-bit bytes (row c, byte 4c + i: bits 4e + 2h hold q >> 4 of input 32j + 16h + 4(2p + e) + i; 1024),
//   then sc[t] of the 16 rows per t (256), the rows' fp16 d (32) and 32 zero bytes (53 whole 64-byte lines).
//   A plain tail row's super-block: [128 nibble bytes, int4's plain order][64 bytes: q >> 4 of input k at byte
//   k / 4, bits 2 (k % 4)][16 sc][fp16 d][2 zero bytes].
//   Arithmetic, every path: per block of 32 the exact integer dots I_lo, I_hi of unsigned q with the first and
//   second 16 activations, S_lo, S_hi their activation sums (once per token row and block), then
//   acc = fma(float(I_lo - 32 * S_lo), (d * sc_lo) * d_x, acc); acc = fma(float(I_hi - 32 * S_hi), (d * sc_hi) * d_x, acc).
//
// b32: GGUF Q5_0, Q4_1, Q5_1 as stored (kernels/quant_b32.py pack_b32 moves their bytes and 5th bits), a [N, rb / e]
//   uint16 (q5_0), uint32 (q4_1) or uint64 (q5_1) tensor over GGUF's own rb = K / 32 * 22, 20 or 24 bytes a row
//   (K a multiple of 32). Per block of 32: q (0..31 for q5_0 / q5_1, 0..15 for q4_1), fp16 d and, for q4_1 / q5_1,
//   an fp16 min m; w = d * (q - 16) (q5_0) or d * q + m (fp32, as GGUF dequantizes). A group of 16 rows, nb blocks:
//   [quants: int4's 256 bytes a block, of q's low 4 bits][plane (q5_0, q5_1): 64 bytes a block, row c's byte 4c + i
//   holding at bit s + 4h the 5th bit of input 16h + 4s + i][the rows' fp16 d, 32 bytes a block][m likewise].
//   A plain tail row: [GGUF's qs per block (int4's plain order)][GGUF's qh per block][d per block][m per block].
//   Arithmetic, every path: I_b the exact dot of the unsigned q with the int8 activations (q5_0: from -16 * S_b,
//   so of q - 16), acc = fma(float(I_b), d * d_x, acc); q4_1 / q5_1 then acc = fma(t_b, m, acc), t_b = float(S_b) * d_x.
//
// Arithmetic (every path, bit for bit): activations per row m and block b: d_x = max|x| / 127,
// q_x = round-half-even(x * (127 / max|x|)) (each path quantizes with its own vector width, to the
// same bytes; a decode step quantizes ~24k activations, which a scalar loop made ~10% of an int4
// step of the bundled target); then per (m, n)
//   acc = 0; for b in order: acc = fma(float(I_b), d_w[n, b] * d_x[m, b], acc); y = acc + bias[n]
// with I_b the exact integer block dot. A group's 16 output columns are 16 vector lanes, so a
// block costs per token row one int->float, one multiply and one FMA for 16 columns (512 weights)
// and no horizontal sums; the integer work per token row is one vpdpbusd per 64 weights.
//
// Paths, chosen at runtime (SPECDECODE_KERNEL_ISA read at load: scalar | avx2 | avxvnni | avx512* -> the
// best of these the CPU has; set_isa() later; quant_linear(isa=) per call):
//   scalar   portable C++
//   avx2     AVX2, 8 columns per ymm: int8 |w| * sign(x, w) with maddubs + madd (maddubs wants one
//            unsigned operand); int4 maddubs(v, x) summed in int16 over a block, -8 * sum(x) once; a
//            decode step reads 4 groups side by side (groups_avx2_m1), and so does an int8 pass of 5 or
//            more token rows (groups_avx2_q8_rows, register blocks of up to 8 rows)
//   vnni512  AVX-512F/BW/VL + AVX512_VNNI: vpdpbusd(unsigned weights, broadcast signed activation
//            bytes) with the block sum starting at -128 * sum(x) (int8, weights q ^ 0x80 = q + 128)
//            or -8 * sum(x) (int4 nibbles), so it is the exact signed dot; it reads 4 groups side by
//            side (groups_vnni: more DRAM streams in flight)
//   avxvnni  AVX2 + AVX-VNNI (Alder Lake and later client cores, no AVX-512 needed): the avx2 layout
//            with 256-bit vpdpbusd as vnni512 uses it (one instruction per 4 inputs and token row)
// On a CPU with both VNNI kinds vnni512 is the default; SPECDECODE_KERNEL_ISA=avxvnni forces the other.
//
// Batch invariance (every path): y[m, n] depends only on x[m, :], W[n, :], b[n]: activation
// quantization is per row, each (row, column) lane runs the same operations whatever register
// block of token rows it lands in, and threads split column groups only. So verifying gamma + 1
// tokens gives bit-identical logits to decoding them one at a time, and speculative decoding is
// exact relative to the quantized model it runs. Token rows are register-blocked (8 on vnni512,
// 4 on avx2, 8 for int8 passes of 5+ rows there) so each weight vector is loaded and unpacked once
// for all of them.
//
// q4k and q5k run natively on all four paths (q4k_units, the 5th bits merged as the b32 formats merge them: vnni512 4 groups side by side in register blocks of up to 8
// token rows; avx2 / avxvnni 4 groups side by side for 1-5 rows, else one, in register blocks of up to 4).
// q6k likewise (q6k_units, the same walks): the high-bit vector of two steps is merged into the nibbles with
// 16-bit shifts and masks (q as bytes 0..63, the unsigned operand); vpdpbusd chains start at -32 * S (vnni512,
// avxvnni); avx2 sums maddubs over two steps in int16 (4 * 63 * 127 < 32768), then madd.
//
// The b32 formats (b32_units) take q6k's walks on every path; the 5th bits are merged into the nibbles with 16-bit
// shifts and masks (q as bytes 0..31); avx2 sums maddubs over a block's 4 steps in int16 per half (4 * 2 * 31 * 127
// < 32768).
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

// Every path computes, per (token row m, weight row n), exactly
//   acc = 0; for b in blocks: acc = fma(float(I_b), d_w[n, b] * d_x[m, b], acc);  y = acc + bias[n]
// with I_b the exact integer dot of block b, so the paths agree bit for bit and a row's result
// never depends on the other rows of the batch.

// ------------------------------------------------------------------ scalar
void cols_scalar(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                 int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        int32_t isum = 0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) isum += L.wq(w, n, k) * int32_t(xq[k]);
        const float s = half_to_float(L.scale(w, n, b)) * qx.d[m * qx.nb + b];
        acc = std::fmaf(static_cast<float>(isum), s, acc);
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths)
void group_scalar(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < qx.nb; ++b) {
      int32_t isum[G] = {};
      const int8_t* xb = xq + b * 32;
      if (L.fmt == FMT_Q8) {
        const int8_t* wb = reinterpret_cast<const int8_t*>(grp + b * 512);
        for (int s = 0; s < 8; ++s)
          for (int c = 0; c < G; ++c)
            for (int i = 0; i < 4; ++i) isum[c] += int32_t(wb[s * 64 + c * 4 + i]) * xb[4 * s + i];
      } else {
        const uint8_t* wb = grp + b * 256;
        for (int s = 0; s < 4; ++s)
          for (int c = 0; c < G; ++c)
            for (int i = 0; i < 4; ++i) {
              const uint8_t byte = wb[s * 64 + c * 4 + i];
              isum[c] += (int32_t(byte & 0xf) - 8) * xb[4 * s + i] + (int32_t(byte >> 4) - 8) * xb[16 + 4 * s + i];
            }
      }
      const float dx = qx.d[m * qx.nb + b];
      for (int c = 0; c < G; ++c)
        acc[c] = std::fmaf(static_cast<float>(isum[c]), half_to_float(ws[b * G + c]) * dx, acc[c]);
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

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
// ------------------------------------------------------------------ AVX2
// Half a group (8 weight rows, one ymm lane each) for MB token rows. int8: |w| times sign(x, w)
// (maddubs wants one unsigned operand; |w| <= 127 keeps its pair sums in int16), then madd to
// int32. int4: the nibbles are unsigned already: maddubs(v, x), summed in int16 over the block
// (8 steps * 2 * 15 * 127 < 32768), and the -8 * sum(x) correction added once per block.
template <int MB>
__attribute__((target("avx2,fma,f16c"))) void half_avx2(const Layout& L, const QX& qx, int64_t m0,
                                                       const uint8_t* grp, int h, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
  // the next group's same bytes, into L2 (_MM_HINT_T1): DRAM latency wants many lines in flight, and a
  // group (16 rows, 15-80 KB here) fetched into L1 one group ahead evicts the current one (measured:
  // T0 made int8 / int4 steps at the 0.5B shape ~1.15 / 1.5x slower at M = 1, ~1.9 / 1.45x at M = 5)
  const int64_t kPrefetch = G * L.rb;
  if (h == 0)
    for (int64_t o = G * L.qb; o < G * L.qb + 2 * G * nb; o += 64)  // and its scales (the loop fetches quants)
      _mm_prefetch(reinterpret_cast<const char*>(grp + kPrefetch + o), _MM_HINT_T1);
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[MB];
  for (int j = 0; j < MB; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i isum[MB];
    if (L.fmt == FMT_Q8) {
      const uint8_t* wb = grp + b * 512 + h * 32;
      for (int j = 0; j < MB; ++j) isum[j] = _mm256_setzero_si256();
      for (int s = 0; s < 8; ++s) {
        if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetch), _MM_HINT_T1);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int j = 0; j < MB; ++j) {
          int32_t x4;
          std::memcpy(&x4, qx.q.data() + (m0 + j) * Kp + b * 32 + 4 * s, 4);
          const __m256i xv = _mm256_set1_epi32(x4);
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
          isum[j] = _mm256_add_epi32(isum[j], p);
        }
      }
    } else {
      const uint8_t* wb = grp + b * 256 + h * 32;
      __m256i p16[MB];
      for (int j = 0; j < MB; ++j) p16[j] = _mm256_setzero_si256();
      for (int s = 0; s < 4; ++s) {
        if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetch), _MM_HINT_T1);
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        for (int j = 0; j < MB; ++j) {
          const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
          int32_t xl, xh;
          std::memcpy(&xl, xb + 4 * s, 4);
          std::memcpy(&xh, xb + 16 + 4 * s, 4);
          p16[j] = _mm256_add_epi16(p16[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
          p16[j] = _mm256_add_epi16(p16[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
        }
      }
      for (int j = 0; j < MB; ++j)
        isum[j] = _mm256_add_epi32(_mm256_madd_epi16(p16[j], ones), _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]));
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
    for (int j = 0; j < MB; ++j) {
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(qx.d[(m0 + j) * nb + b]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, acc[j]);
    }
  }
  for (int j = 0; j < MB; ++j) _mm256_storeu_ps(out + j * G + h * 8, acc[j]);
}

// One token row (a decode step) against kStreamsAvx2 consecutive groups at once, block by block, each
// stream prefetching kStreamPrefetch bytes ahead (why: groups_vnni's note; one stream keeps too few
// DRAM lines in flight). Only the decode step: 16 ymm registers leave no room for several token rows
// per stream. Each column runs half_avx2<1>'s arithmetic in the same order (bit-identical results).
constexpr int kStreamsAvx2 = 4;
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

template <int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_avx2_m1(const Layout& L, const QX& qx, const uint8_t* w,
                                                            const float* bias, float* y, int64_t g0) {
  const int64_t nb = qx.nb;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][2];
  for (int i = 0; i < NS; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xb = qx.q.data() + b * 32;
    const __m256 dx = _mm256_set1_ps(qx.d[b]);
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * (L.fmt == FMT_Q8 ? 512 : 256);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), NS * G * L.rb);
      for (int s = 0; s < (L.fmt == FMT_Q8 ? 8 : 4); ++s)
        _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + (NS == 1 ? kOneStreamPrefetch : kStreamPrefetch)),
                     _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = wb0 + h * 32;
        __m256i isum;
        if (L.fmt == FMT_Q8) {
          isum = _mm256_setzero_si256();
          for (int s = 0; s < 8; ++s) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            int32_t x4;
            std::memcpy(&x4, xb + 4 * s, 4);
            const __m256i xv = _mm256_set1_epi32(x4);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)), ones);
            isum = _mm256_add_epi32(isum, p);
          }
        } else {
          __m256i p16 = _mm256_setzero_si256();
          for (int s = 0; s < 4; ++s) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
          }
          isum = _mm256_add_epi32(_mm256_madd_epi16(p16, ones), _mm256_set1_epi32(qx.corr[b]));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[i][h]);
      }
    }
  }
  alignas(32) float out[NS * G];
  for (int i = 0; i < NS; ++i) {
    _mm256_store_ps(out + i * G, acc[i][0]);
    _mm256_store_ps(out + i * G + 8, acc[i][1]);
  }
  write_groups(L, out, 1, NS, 0, 1, g0, bias, y);
}

__attribute__((target("avx2,fma,f16c"))) void group_avx2(const Layout& L, const QX& qx, const uint8_t* w,
                                                        const float* bias, float* y, int64_t g) {
  const uint8_t* grp = L.group(w, g);
  alignas(32) float out[4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    for (int h = 0; h < 2; ++h) {
      switch (mb) {
        case 1: half_avx2<1>(L, qx, m0, grp, h, out); break;
        case 2: half_avx2<2>(L, qx, m0, grp, h, out); break;
        case 3: half_avx2<3>(L, qx, m0, grp, h, out); break;
        default: half_avx2<4>(L, qx, m0, grp, h, out); break;
      }
    }
    write_groups(L, out, 4, 1, m0, mb, g, bias, y);
  }
}

// Five or more token rows of an int8 weight (a verification pass, a prefill) against NS groups side by
// side, block by block, as the decode step reads them (groups_avx2_m1: more DRAM lines in flight),
// with the float sums in an L1 buffer instead of registers: the 16 ymm registers then hold the integer
// sums of a register block of up to 8 token rows besides the weight vector, its |w| and the ones. A
// weight vector is loaded and made |w| once per register block and used by each of its rows; a second
// register block (9-16 rows) rereads the tile from L1. Rows go in walks of kRowsAvx2 over a chunk.
// Measured against group_avx2 (SmolLM2-135M shapes, 30 layers + the head, AVX2 forced, 1 thread, the
// paths interleaved in one process, 6 runs on a shared 2-core EPYC): at 5-16 rows a median ratio of
// ~0.95 (0.87-1.12 per run and row count; identical code read +-10% there), slower at 2-4 rows; for
// int4 group_avx2 was as fast or faster at every row count, also against a tile of both half groups
// sharing each activation broadcast (level), so int4 stays there.
// A per-row floor is the reason the gains are small: AVX2 has no int8 dot-product instruction, so each
// 32 int8 products cost a row 4 vector operations (sign, maddubs, madd, add; int4: 2 per 32), and past
// ~4 rows the pass is bound by that arithmetic, not by the weight stream. Each (row, column) runs
// half_avx2<1>'s arithmetic in the same order, so results are bit-identical to the decode step's.
constexpr int kRowsAvx2 = 16;     // token rows per walk of a chunk of groups (the float buffer)
constexpr int kTileRowsAvx2 = 8;  // token rows per register block
constexpr int kMinRowsQ8Avx2 = 5;  // from this many rows, int8 takes groups_avx2_q8_rows (measured above)

// An empty asm that "changes" v: without it GCC reassociates a register block's integer sums across the
// unrolled steps (all products first, then the adds) and spills most of them to the stack.
#define QL_KEEP(v) asm volatile("" : "+x"(v))

// One block of one half group (8 columns, 32 inputs) for MB token rows; acc[j * G + c] += row j's sum.
template <int MB>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void tile_q8_avx2(const uint8_t* wb, const int8_t* xq,
                                                                                int64_t Kp, const float* dx,
                                                                                int64_t nb, __m256 dw, float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum[MB];
  for (int j = 0; j < MB; ++j) isum[j] = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
    const __m256i aw = _mm256_sign_epi8(wv, wv);
    for (int j = 0; j < MB; ++j) {
      int32_t x4;
      std::memcpy(&x4, xq + j * Kp + 4 * s, 4);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(x4), wv)), ones);
      isum[j] = _mm256_add_epi32(isum[j], p);
      QL_KEEP(isum[j]);
    }
  }
  for (int j = 0; j < MB; ++j) {
    const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(dx[j * nb]));
    _mm256_storeu_ps(acc + j * G, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, _mm256_loadu_ps(acc + j * G)));
  }
}

// One register block of MB token rows (from m0) against ns groups from g0, every block; acc[i][j][c]:
// row m0 + j, column c of group g0 + i. Only the first register block of a chunk prefetches.
template <int MB>
__attribute__((target("avx2,fma,f16c"))) void rows_q8_avx2(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                          int64_t g0, int ns, bool prefetch,
                                                          float (*acc)[kRowsAvx2][G]) {
  const int64_t nb = qx.nb, Kp = qx.Kp;
  const int8_t* xq = qx.q.data() + m0 * Kp;
  const float* dx = qx.d.data() + m0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < ns; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * 512;
      if (prefetch)
        for (int s = 0; s < 8; ++s)
          _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + kStreamPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        tile_q8_avx2<MB>(wb0 + h * 32, xq + b * 32, Kp, dx + b, nb, dw, &acc[i][0][h * 8]);
      }
    }
  }
}

// ns (1..kStreamsAvx2) full groups from g0 of an int8 weight, all token rows
__attribute__((target("avx2,fma,f16c"))) void groups_avx2_q8_rows(const Layout& L, const QX& qx, const uint8_t* w,
                                                                 const float* bias, float* y, int64_t g0, int ns) {
  alignas(32) float acc[kStreamsAvx2][kRowsAvx2][G];
  for (int64_t mc = 0; mc < qx.M; mc += kRowsAvx2) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowsAvx2, qx.M - mc));
    const int nblk = (rows + kTileRowsAvx2 - 1) / kTileRowsAvx2;  // register blocks as even as they come
    std::memset(acc, 0, sizeof(acc));
    for (int k = 0; k < nblk; ++k) {
      const int j0 = k * rows / nblk, mb = (k + 1) * rows / nblk - j0;
      auto* a = reinterpret_cast<float (*)[kRowsAvx2][G]>(&acc[0][j0][0]);
      const bool pf = mc == 0 && k == 0;
      switch (mb) {
        case 1: rows_q8_avx2<1>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 2: rows_q8_avx2<2>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 3: rows_q8_avx2<3>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 4: rows_q8_avx2<4>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 5: rows_q8_avx2<5>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 6: rows_q8_avx2<6>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        case 7: rows_q8_avx2<7>(L, qx, mc + j0, w, g0, ns, pf, a); break;
        default: rows_q8_avx2<8>(L, qx, mc + j0, w, g0, ns, pf, a); break;
      }
    }
    write_groups(L, &acc[0][0][0], kRowsAvx2, ns, mc, rows, g0, bias, y);
  }
}

// int4, 2-5 token rows (a verification pass): NS groups side by side, both halves per activation broadcast
// (groups_rows_vnni256's walk with maddubs), each row's int16 block sums for both halves in registers.
// Against group_avx2 on an AVX-VNNI Xeon (bench kernel-ab, AVX2 forced, 0.5B-shape matrices, 1 thread):
// 1.13x at 2 rows, 1.10 at 3, 1.08 at 4, 1.06 at 5, 0.98 at 8, 0.93 at 16, so longer passes (prefill) stay
// with group_avx2. Session 24 read a both-halves tile level with group_avx2 on a Zen 4 EPYC.
constexpr int kMaxRowsQ4StreamsAvx2 = 5;
template <int MB, int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_rows_q4_avx2(const Layout& L, const QX& qx, int64_t m0,
                                                                 const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb = grp + b * 256;
      __m256i p16[MB][2];
      for (int j = 0; j < MB; ++j) p16[j][0] = p16[j][1] = _mm256_setzero_si256();
      for (int s = 0; s < 4; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kStreamPrefetch), _MM_HINT_T0);
        const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
        const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32));
        const __m256i lo0 = _mm256_and_si256(r0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), low4);
        const __m256i lo1 = _mm256_and_si256(r1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), low4);
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
        }
      }
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G)));
      const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + 8)));
      for (int j = 0; j < MB; ++j) {
        const __m256i corr = _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
        const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
        const __m256i i0 = _mm256_add_epi32(_mm256_madd_epi16(p16[j][0], ones), corr);
        const __m256i i1 = _mm256_add_epi32(_mm256_madd_epi16(p16[j][1], ones), corr);
        acc[i][j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dw0, dx), acc[i][j][0]);
        acc[i][j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dw1, dx), acc[i][j][1]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

template <int NS>
__attribute__((target("avx2,fma,f16c"))) void groups_q4_avx2(const Layout& L, const QX& qx, const uint8_t* w,
                                                            const float* bias, float* y, int64_t g0) {
  alignas(32) float out[NS * 4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    switch (mb) {
      case 1: groups_rows_q4_avx2<1, NS>(L, qx, m0, w, g0, out); break;
      case 2: groups_rows_q4_avx2<2, NS>(L, qx, m0, w, g0, out); break;
      case 3: groups_rows_q4_avx2<3, NS>(L, qx, m0, w, g0, out); break;
      default: groups_rows_q4_avx2<4, NS>(L, qx, m0, w, g0, out); break;
    }
    write_groups(L, out, 4, NS, m0, mb, g0, bias, y);
  }
}

// ------------------------------------------------------------------ AVX-VNNI (256-bit vpdpbusd, VEX)
// The AVX2 layout and register budget (8 columns a ymm, 16 registers) with AVX-VNNI's vpdpbusd, which
// Intel's client cores have since Alder Lake without AVX-512: per 4 inputs and token row one instruction
// (u8 weights times a broadcast of the row's 4 signed activation bytes, summed into int32) where AVX2
// needs maddubs + add (int4; + madd a block) or sign + sign + maddubs + madd + add (int8). As in
// groups_vnni_mb, int8 weights are made unsigned (q ^ 0x80) and int4 nibbles are unsigned already, and a
// block's sum starts at the row's correction (-128 or -8 times its activation sum): the exact integer
// dot the other paths compute, then their float tail in the same order, so the bits are theirs.
#define QL_VNNI256 "avxvnni,avx2,fma,f16c"

// NS groups side by side (groups_vnni_mb's streams), each whole (both halves: 16 columns in two ymm), for
// MB token rows: each broadcast of a row's 4 activation bytes feeds both halves' vpdpbusd, so a
// multiply-add costs half a broadcast load (with one half at a time, AVX2's walk, the broadcasts bound the
// pass: measured v(8) 2.53 against AVX2's 2.75 on SmolLM2 int4, where vpdpbusd halves the arithmetic).
template <int MB, int NS>
__attribute__((target(QL_VNNI256))) void groups_rows_vnni256(const Layout& L, const QX& qx, int64_t m0,
                                                            const uint8_t* w, int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80)), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), NS * G * L.rb);
      __m256i isum[MB][2];
      for (int j = 0; j < MB; ++j) isum[j][0] = isum[j][1] = _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
      if (L.fmt == FMT_Q8) {
        const uint8_t* wb = grp + b * 512;
        for (int s = 0; s < 8; ++s) {
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kStreamPrefetch), _MM_HINT_T0);
          const __m256i w0 =
              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), c128);
          const __m256i w1 =
              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32)), c128);
          for (int j = 0; j < MB; ++j) {
            int32_t x4;
            std::memcpy(&x4, qx.q.data() + (m0 + j) * Kp + b * 32 + 4 * s, 4);
            const __m256i xv = _mm256_set1_epi32(x4);
            isum[j][0] = _mm256_dpbusd_avx_epi32(isum[j][0], w0, xv);
            isum[j][1] = _mm256_dpbusd_avx_epi32(isum[j][1], w1, xv);
          }
        }
      } else {
        const uint8_t* wb = grp + b * 256;
        for (int s = 0; s < 4; ++s) {
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kStreamPrefetch), _MM_HINT_T0);
          const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
          const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64 + 32));
          const __m256i lo0 = _mm256_and_si256(r0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), low4);
          const __m256i lo1 = _mm256_and_si256(r1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), low4);
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
      }
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G)));
      const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + 8)));
      for (int j = 0; j < MB; ++j) {
        const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
        acc[i][j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][0]), _mm256_mul_ps(dw0, dx), acc[i][j][0]);
        acc[i][j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j][1]), _mm256_mul_ps(dw1, dx), acc[i][j][1]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

template <int NS>
__attribute__((target(QL_VNNI256))) void groups_rows_vnni256_mb(const Layout& L, const QX& qx, int64_t m0, int64_t mb,
                                                               const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: groups_rows_vnni256<1, NS>(L, qx, m0, w, g0, out); break;
    case 2: groups_rows_vnni256<2, NS>(L, qx, m0, w, g0, out); break;
    case 3: groups_rows_vnni256<3, NS>(L, qx, m0, w, g0, out); break;
    default: groups_rows_vnni256<4, NS>(L, qx, m0, w, g0, out); break;
  }
}

// One token row against kStreamsAvx2 groups side by side (groups_avx2_m1's streams, groups_rows_vnni256<1, 1>'s
// arithmetic).
__attribute__((target(QL_VNNI256))) void groups_vnni256_m1(const Layout& L, const QX& qx, const uint8_t* w,
                                                          const float* bias, float* y, int64_t g0) {
  const int64_t nb = qx.nb;
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80)), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[kStreamsAvx2][2];
  for (int i = 0; i < kStreamsAvx2; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xb = qx.q.data() + b * 32;
    const __m256 dx = _mm256_set1_ps(qx.d[b]);
    const __m256i corr = _mm256_set1_epi32(qx.corr[b]);
    for (int i = 0; i < kStreamsAvx2; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(grp + G * L.qb);
      const uint8_t* wb0 = grp + b * (L.fmt == FMT_Q8 ? 512 : 256);
      prefetch_scales(grp + G * L.qb, b, nb, scale_ahead(L.fmt), kStreamsAvx2 * G * L.rb);
      for (int s = 0; s < (L.fmt == FMT_Q8 ? 8 : 4); ++s)
        _mm_prefetch(reinterpret_cast<const char*>(wb0 + s * 64 + kStreamPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = wb0 + h * 32;
        __m256i isum = corr;
        if (L.fmt == FMT_Q8) {
          for (int s = 0; s < 8; ++s) {
            const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), c128);
            int32_t x4;
            std::memcpy(&x4, xb + 4 * s, 4);
            isum = _mm256_dpbusd_avx_epi32(isum, wv, _mm256_set1_epi32(x4));
          }
        } else {
          for (int s = 0; s < 4; ++s) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64));
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            isum = _mm256_dpbusd_avx_epi32(isum, _mm256_and_si256(raw, low4), _mm256_set1_epi32(xl));
            isum = _mm256_dpbusd_avx_epi32(isum, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                                           _mm256_set1_epi32(xh));
          }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + b * G + h * 8)));
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[i][h]);
      }
    }
  }
  alignas(32) float out[kStreamsAvx2 * G];
  for (int i = 0; i < kStreamsAvx2; ++i) {
    _mm256_store_ps(out + i * G, acc[i][0]);
    _mm256_store_ps(out + i * G + 8, acc[i][1]);
  }
  write_groups(L, out, 1, kStreamsAvx2, 0, 1, g0, bias, y);
}

// ns (kStreamsAvx2 or 1) full groups from g0, all token rows, in register blocks of up to 4
__attribute__((target(QL_VNNI256))) void groups_vnni256(const Layout& L, const QX& qx, const uint8_t* w,
                                                       const float* bias, float* y, int64_t g0, int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2)
      groups_rows_vnni256_mb<kStreamsAvx2>(L, qx, m0, mb, w, g0, out);
    else
      groups_rows_vnni256_mb<1>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
}

// ------------------------------------------------------------------ AVX-512 VNNI

// NS consecutive groups (16 weight rows each, one zmm lane per row) for MB token rows: per 4 inputs,
// one weight vector (made unsigned: int8 q ^ 0x80 = q + 128, int4 nibbles v as they are), loaded once
// for all MB rows, and per token row one broadcast of its 4 signed activation bytes and one vpdpbusd.
// The block's integer sums start at the row's correction (-128 or -8 times the block's activation
// sum), so they are exact dots. Why NS = kStreams groups side by side: one thread's DRAM bandwidth is
// bounded by how many cache lines are in flight, and a single sequential stream (a group at a time)
// keeps too few of them busy. Reading 4 groups block by block, each stream prefetching
// kStreamPrefetch bytes ahead into L2, streamed the 0.5B shape's matrices 1.14-1.3x faster (int8)
// and 1.2-1.3x (int4) at one token row on an AVX512-VNNI Xeon, 1 thread (llama.cpp's AMX/VNNI
// kernels also read 4 groups of 16 columns side by side). NS = 1 serves the groups left over. Each
// (row, column) does the same operations in the same order whatever NS and MB, so results do not
// depend on the batch or on which chunk a group falls in (tests compare the paths bit for bit).
constexpr int kStreams = kStreamsDefault;  // kStreamPrefetch: with groups_avx2_m1

// Blocks [b0, b1) only, the float sums carried in ``out`` (row stride ``ostride``): loaded there unless b0 == 0,
// stored back after b1 (groups_vnni's K segments; exact fp32 values, so the same bits as one walk).
template <int MB, int NS>
__attribute__((target(QL_512))) void groups_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                   int64_t g0, float* out, int64_t b0, int64_t b1,
                                                   int64_t ostride) {
  const int64_t nb = qx.nb, xstride = qx.Kp / 4;
  const uint8_t* grp[NS];
  const uint16_t* ws[NS];
  for (int i = 0; i < NS; ++i) {
    grp[i] = L.group(w, g0 + i);
    ws[i] = reinterpret_cast<const uint16_t*>(grp[i] + G * L.qb);
  }
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80)), low4 = _mm512_set1_epi8(0x0f);
  const __m512i high4 = _mm512_set1_epi8(static_cast<char>(0xf0));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  // int4: a stream's prefetch past its group's end goes on in the group it reads next (NS groups on), not in the
  // neighbour stream's, already being read: short rows (10-40 KB a group) otherwise start each call's streams cold
  constexpr int64_t ahead_bytes = stream_ahead<NS, MB>(kStreamPrefetch, kOneStreamPrefetch);
  const int64_t gbytes = G * L.rb, skip = (NS - 1) * gbytes;
  const int64_t sahead = MB > 1 && NS == 1 ? ahead_bytes / (L.fmt == FMT_Q8 ? 512 : 256) : scale_ahead(L.fmt);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = b0 ? _mm512_loadu_ps(out + (i * ostride + j) * G) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    for (int i = 0; i < NS; ++i) {
      prefetch_scales(reinterpret_cast<const uint8_t*>(ws[i]), b, nb, sahead, NS * gbytes);
      __m512i isum[MB];
      if (L.fmt == FMT_Q8) {
        const uint8_t* wb = grp[i] + b * 512;
        __m512i wv[8];
        for (int s = 0; s < 8; ++s) {
          _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + ahead_bytes), _MM_HINT_T0);
          wv[s] = _mm512_xor_si512(_mm512_loadu_si512(wb + s * 64), c128);
        }
        for (int j = 0; j < MB; ++j) {
          const int32_t* xb = xq32 + j * xstride + b * 8;
          __m512i a = _mm512_set1_epi32(qx.corr[(m0 + j) * nb + b]), a2 = _mm512_setzero_si512();
          for (int s = 0; s < 8; s += 2) {  // two chains of 4: half the latency of one (exact sums either way)
            a = _mm512_dpbusd_epi32(a, wv[s], _mm512_set1_epi32(xb[s]));
            a2 = _mm512_dpbusd_epi32(a2, wv[s + 1], _mm512_set1_epi32(xb[s + 1]));
          }
          isum[j] = _mm512_add_epi32(a, a2);
        }
      } else {
        const uint8_t* wb = grp[i] + b * 256;
        __m512i lo[4], hi16[4];  // high nibbles kept in place: that chain sums 16x the dot, shifted back once per block
        const int64_t ahead = b * 256 + ahead_bytes;
        const uint8_t* pf = grp[i] + ahead + (ahead + 192 >= gbytes ? skip : 0);
        for (int s = 0; s < 4; ++s) {
          _mm_prefetch(reinterpret_cast<const char*>(pf + s * 64), _MM_HINT_T0);
          const __m512i raw = _mm512_loadu_si512(wb + s * 64);
          lo[s] = _mm512_and_si512(raw, low4);
          hi16[s] = _mm512_and_si512(raw, high4);
        }
        for (int j = 0; j < MB; ++j) {
          const int32_t* xb = xq32 + j * xstride + b * 8;
          __m512i a = _mm512_set1_epi32(qx.corr[(m0 + j) * nb + b]), a2 = _mm512_setzero_si512();
          for (int s = 0; s < 4; ++s) {
            a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
            a2 = _mm512_dpbusd_epi32(a2, hi16[s], _mm512_set1_epi32(xb[4 + s]));
          }
          isum[j] = _mm512_add_epi32(a, _mm512_srai_epi32(a2, 4));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws[i] + b * G)));
      for (int j = 0; j < MB; ++j) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(qx.d[(m0 + j) * nb + b]));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), s, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (i * ostride + j) * G, acc[i][j]);
}

template <int NS>
__attribute__((target(QL_512))) void groups_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb,
                                                     const uint8_t* w, int64_t g0, float* out, int64_t b0,
                                                     int64_t b1, int64_t ostride) {
  switch (mb) {
    case 1: groups_vnni_mb<1, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 2: groups_vnni_mb<2, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 3: groups_vnni_mb<3, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 4: groups_vnni_mb<4, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 5: groups_vnni_mb<5, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 6: groups_vnni_mb<6, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    case 7: groups_vnni_mb<7, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
    default: groups_vnni_mb<8, NS>(L, qx, m0, w, g0, out, b0, b1, ostride); break;
  }
}

// Bytes of weights a K segment of kStreams groups spans when several register blocks of token rows share it:
// each block then rereads the segment from L1. Whole-K walks per register block reread the groups from L2 at
// best (139-557 KB a unit at 2048-8192 inputs), and a 9-row pass (5 + 4 rows) of a 1.7B-shape file cost 1.5-2x a
// 5-row one, by a varying amount from run to run; per segment the second block pays its arithmetic.
constexpr int64_t kSegmentBytes = 16 * 1024;

// ns (kStreams or 1) full groups from g0, all token rows (register blocks of up to 8; with several blocks, K in
// segments of kSegmentBytes, every block over a segment before the next)
__attribute__((target(QL_512))) void groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias,
                                                float* y, int64_t g0, int ns) {
  const int64_t nb = qx.nb;
  if (qx.M <= 8) {
    alignas(64) float out[kStreams * 8 * G];
    if (ns == kStreams)
      groups_vnni_rows<kStreams>(L, qx, 0, qx.M, w, g0, out, 0, nb, 8);
    else
      groups_vnni_rows<1>(L, qx, 0, qx.M, w, g0, out, 0, nb, 8);
    write_groups(L, out, 8, ns, 0, qx.M, g0, bias, y);
    return;
  }
  thread_local std::vector<float> sums;  // [group][row][column]: every row's carried float sums
  sums.resize(static_cast<size_t>(kStreams * qx.M * G));
  float* out = sums.data();
  const int64_t seg = std::max<int64_t>(1, kSegmentBytes / (kStreams * G * (L.fmt == FMT_Q8 ? 32 : 16)));
  for (int64_t b0 = 0; b0 < nb; b0 += seg) {
    const int64_t b1 = std::min(nb, b0 + seg);
    for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
      mb = block_rows(qx.M, m0, 8);
      if (ns == kStreams)
        groups_vnni_rows<kStreams>(L, qx, m0, mb, w, g0, out + m0 * G, b0, b1, qx.M);
      else
        groups_vnni_rows<1>(L, qx, m0, mb, w, g0, out + m0 * G, b0, b1, qx.M);
    }
  }
  write_groups(L, out, qx.M, ns, 0, qx.M, g0, bias, y);
}
#endif  // QL_X86

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
                                                int64_t g0, float* out) {
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
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (i * 8 + j) * G, acc[i][j]);
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
                                                int64_t g0, float* out) {
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
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (i * 8 + j) * G, acc[i][j]);
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

// ------------------------------------------------------------------ b32: GGUF Q5_0, Q4_1, Q5_1 (as stored)
// Per (token row m, weight row n), every path, bit for bit: per block b of 32, I_b the exact integer dot of the
// unsigned q (q4_1: 0..15; q5_0, q5_1: 0..31) with row m's int8 activations, for q5_0 less 16 * S_b (its chain
// starts at qx.corr = -16 * S_b, so I_b is the dot of q - 16), d_w and m_w the block's fp16 d and min:
//   acc = 0; for b: acc = fma(float(I_b), d_w * d_x, acc);  [q4_1, q5_1: acc = fma(t_b, m_w, acc)];  y = acc + bias
// with t_b = float(S_b) * d_x as for q4k (qx.t). Q4_0's arithmetic with a 5th bit and Q4_K's min term.

void cols_scalar_b32(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  const bool mn = b32_min(L.fmt);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < qx.M; ++m) {
      const int8_t* xq = qx.q.data() + m * qx.Kp;
      float acc = 0.f;
      for (int64_t b = 0; b < qx.nb; ++b) {
        int32_t isum = mn ? 0 : qx.corr[m * qx.nb + b];
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) isum += L.b32_q(w, n, k) * int32_t(xq[k]);
        const float dx = qx.d[m * qx.nb + b];
        acc = std::fmaf(static_cast<float>(isum), half_to_float(L.b32_half(w, n, b, false)) * dx, acc);
        if (mn) acc = std::fmaf(qx.t[m * qx.nb + b], half_to_float(L.b32_half(w, n, b, true)), acc);
      }
      y[m * L.N + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// one full group, all token rows (scalar; the layout walk of the SIMD paths)
void group_scalar_b32(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g) {
  const bool hi = b32_hi(L.fmt), mn = b32_min(L.fmt);
  const int64_t nb = qx.nb;
  const uint8_t* grp = L.group(w, g);
  const uint8_t* plane = grp + G * L.qb;
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(plane + (hi ? 64 * nb : 0));
  const uint16_t* ms = ds + G * nb;
  for (int64_t m = 0; m < qx.M; ++m) {
    const int8_t* xq = qx.q.data() + m * qx.Kp;
    float acc[G] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wb = grp + b * 256;
      const uint8_t* hb = plane + b * 64;
      const int8_t* xb = xq + b * 32;
      int32_t isum[G];
      for (int c = 0; c < G; ++c) isum[c] = mn ? 0 : qx.corr[m * nb + b];
      for (int s = 0; s < 4; ++s)
        for (int c = 0; c < G; ++c)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = wb[s * 64 + c * 4 + i];
            int32_t vl = byte & 0xf, vh = byte >> 4;
            if (hi) {
              vl |= ((hb[c * 4 + i] >> s) & 1) << 4;
              vh |= ((hb[c * 4 + i] >> (s + 4)) & 1) << 4;
            }
            isum[c] += vl * xb[4 * s + i] + vh * xb[16 + 4 * s + i];
          }
      const float dx = qx.d[m * nb + b];
      for (int c = 0; c < G; ++c) {
        acc[c] = std::fmaf(static_cast<float>(isum[c]), half_to_float(ds[b * G + c]) * dx, acc[c]);
        if (mn) acc[c] = std::fmaf(qx.t[m * nb + b], half_to_float(ms[b * G + c]), acc[c]);
      }
    }
    for (int c = 0; c < G; ++c) {
      const int64_t n = g * G + c;
      y[m * L.N + n] = acc[c] + (bias ? bias[n] : 0.f);
    }
  }
}

#if QL_X86
// b32 streams prefetch kB32Prefetch bytes of quants ahead, and the plane and scales as many blocks ahead: q6k's
// measured distance (kQ6kPrefetch), where 32 KiB was 1.1-3x slower from DRAM
constexpr int64_t kB32Prefetch = 4096;

// Group grp's lines kB32Prefetch ahead of block b in each of its regions: quants (4 lines a block), the plane
// (1 line), d and m (a line per 2 blocks); past the group's end, the same lines of the group ``next`` bytes on,
// the one this stream reads next (prefetch_scales's reason: at short rows each region was too short for the
// hardware prefetcher, and a group's first 16 blocks of every region were demand misses)
template <bool HI, bool MIN, int64_t AHEAD = kB32Prefetch>
__attribute__((always_inline)) inline void prefetch_b32(const uint8_t* grp, int64_t nb, int64_t b, int64_t next) {
  int64_t a = b + AHEAD / 256;
  if (a >= nb) {
    grp += next;
    a -= nb;
  }
  const uint8_t* wb = grp + a * 256;
  for (int s = 0; s < 4; ++s) _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64), _MM_HINT_T0);
  const uint8_t* p = grp + G * 16 * nb;
  if (HI) {
    _mm_prefetch(reinterpret_cast<const char*>(p + a * 64), _MM_HINT_T0);
    p += 64 * nb;
  }
  if ((b & 1) == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(p + a * 32), _MM_HINT_T0);
    if (MIN) _mm_prefetch(reinterpret_cast<const char*>(p + 32 * nb + a * 32), _MM_HINT_T0);
  }
}

// AVX-512 VNNI: groups_vnni_mb's walk (NS groups side by side, one zmm lane per weight row, MB token rows per
// weight vector). q5_0 / q5_1: q merged to bytes 0..31 (b32_merge512), one vpdpbusd per step and row per half;
// q4_1: int4's nibbles (the high ones in place, their chain shifted back once per block).
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target(QL_512))) void b32_vnni_mb(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                int64_t g0, float* out) {
  const int64_t nb = qx.nb, xstride = qx.Kp / 4;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  const __m512i low4 = _mm512_set1_epi8(0x0f), high4 = _mm512_set1_epi8(static_cast<char>(0xf0));
  const int32_t* xq32 = reinterpret_cast<const int32_t*>(qx.q.data() + m0 * qx.Kp);
  const uint8_t* grp[NS];
  for (int i = 0; i < NS; ++i) grp[i] = L.group(w, g0 + i);
  __m512 acc[NS][MB];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      prefetch_b32<HI, MIN, stream_ahead<NS, MB>(kB32Prefetch, kB32Prefetch)>(grp[i], nb, b, NS * G * L.rb);
      const uint8_t* wb = grp[i] + b * 256;
      __m512i lo[4], hi[4];
      if constexpr (HI) {
        const __m512i qh = _mm512_loadu_si512(grp[i] + hoff + b * 64);
        b32_merge512<0>(_mm512_loadu_si512(wb), qh, lo[0], hi[0]);
        b32_merge512<1>(_mm512_loadu_si512(wb + 64), qh, lo[1], hi[1]);
        b32_merge512<2>(_mm512_loadu_si512(wb + 128), qh, lo[2], hi[2]);
        b32_merge512<3>(_mm512_loadu_si512(wb + 192), qh, lo[3], hi[3]);
      } else {
        for (int s = 0; s < 4; ++s) {
          const __m512i raw = _mm512_loadu_si512(wb + s * 64);
          lo[s] = _mm512_and_si512(raw, low4);
          hi[s] = _mm512_and_si512(raw, high4);
        }
      }
      __m512i isum[MB];
      for (int j = 0; j < MB; ++j) {
        const int32_t* xb = xq32 + j * xstride + b * 8;
        __m512i a = MIN ? _mm512_setzero_si512() : _mm512_set1_epi32(qx.corr[(m0 + j) * nb + b]);
        __m512i a2 = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s) {
          a = _mm512_dpbusd_epi32(a, lo[s], _mm512_set1_epi32(xb[s]));
          a2 = _mm512_dpbusd_epi32(a2, hi[s], _mm512_set1_epi32(xb[4 + s]));
        }
        isum[j] = _mm512_add_epi32(a, HI ? a2 : _mm512_srai_epi32(a2, 4));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[i] + doff + b * 32)));
      __m512 mw = _mm512_setzero_ps();
      if constexpr (MIN)
        mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[i] + moff + b * 32)));
      for (int j = 0; j < MB; ++j) {
        const __m512 dx = _mm512_set1_ps(qx.d[(m0 + j) * nb + b]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dw, dx), acc[i][j]);
        if constexpr (MIN) acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(qx.t[(m0 + j) * nb + b]), mw, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (i * 8 + j) * G, acc[i][j]);
}

template <int NS, bool HI, bool MIN>
void b32_vnni_rows(const Layout& L, const QX& qx, int64_t m0, int64_t mb, const uint8_t* w, int64_t g0, float* out) {
  switch (mb) {
    case 1: b32_vnni_mb<1, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 2: b32_vnni_mb<2, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 3: b32_vnni_mb<3, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 4: b32_vnni_mb<4, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 5: b32_vnni_mb<5, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 6: b32_vnni_mb<6, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    case 7: b32_vnni_mb<7, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
    default: b32_vnni_mb<8, NS, HI, MIN>(L, qx, m0, w, g0, out); break;
  }
}

// ns (kStreams or 1) full groups from g0, all token rows (register blocks of up to 8)
template <bool HI, bool MIN>
void b32_groups_vnni(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                     int ns) {
  alignas(64) float out[kStreams * 8 * G];
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 8);
    if (ns == kStreams)
      b32_vnni_rows<kStreams, HI, MIN>(L, qx, m0, mb, w, g0, out);
    else
      b32_vnni_rows<1, HI, MIN>(L, qx, m0, mb, w, g0, out);
    write_groups(L, out, 8, ns, m0, mb, g0, bias, y);
  }
}

// b32_merge256 at step s (a constant wherever the callers' 4-step loops are unrolled); q4_1: the two nibbles, the
// high one shifted down
template <bool HI>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void b32_step256(const uint8_t* wb, __m256i qh, int s,
                                                                               __m256i& lo, __m256i& hi) {
  k4_step256<HI>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + s * 64)), qh, s, lo, hi);
}

// The float tail of block b of one half group (h) for MB token rows, 8 columns a ymm: isum[j] the exact dots,
// dp / mp the half group's 8 fp16 d / m
template <int MB, bool MIN>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void b32_tail256(const QX& qx, int64_t m0, int64_t b,
                                                                               const uint8_t* dp, const uint8_t* mp,
                                                                               const __m256i* isum, __m256 (*acc)[2],
                                                                               int h) {
  const int64_t nb = qx.nb;
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp)));
  __m256 mw = _mm256_setzero_ps();
  if constexpr (MIN) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp)));
  for (int j = 0; j < MB; ++j) {
    const __m256 dx = _mm256_set1_ps(qx.d[(m0 + j) * nb + b]);
    acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dw, dx), acc[j][h]);
    if constexpr (MIN) acc[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(qx.t[(m0 + j) * nb + b]), mw, acc[j][h]);
  }
}

// AVX2: NS groups side by side, one half group (8 rows) a ymm, MB token rows (q6k_rows_avx2's walk). maddubs(q, x)
// summed in int16 over the block's 4 steps, the low and high halves apart for 5-bit q (4 * 2 * 31 * 127 < 32768),
// together for q4_1 (8 * 2 * 15 * 127 < 32768), then madd to int32.
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target("avx2,fma,f16c"))) void b32_rows_avx2(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                           int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      prefetch_b32<HI, MIN>(grp, nb, b, NS * G * L.rb);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = grp + b * 256 + 32 * h;
        const __m256i qh = HI ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + hoff + b * 64 + 32 * h))
                              : _mm256_setzero_si256();
        __m256i p[MB], p2[MB], isum[MB];
        for (int j = 0; j < MB; ++j) p[j] = p2[j] = _mm256_setzero_si256();
        for (int s = 0; s < 4; ++s) {
          __m256i lo, hi;
          b32_step256<HI>(wb, qh, s, lo, hi);
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
            if constexpr (HI)
              p2[j] = _mm256_add_epi16(p2[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
            else
              p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
          }
        }
        for (int j = 0; j < MB; ++j) {
          __m256i a = _mm256_madd_epi16(p[j], ones);
          if constexpr (HI) a = _mm256_add_epi32(a, _mm256_madd_epi16(p2[j], ones));
          if constexpr (!MIN) a = _mm256_add_epi32(a, _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]));
          isum[j] = a;
        }
        b32_tail256<MB, MIN>(qx, m0, b, grp + doff + b * 32 + 16 * h, grp + moff + b * 32 + 16 * h, isum, acc[i], h);
      }
    }
  }
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) {
      _mm256_storeu_ps(out + (i * 4 + j) * G, acc[i][j][0]);
      _mm256_storeu_ps(out + (i * 4 + j) * G + 8, acc[i][j][1]);
    }
}

// AVX-VNNI: b32_rows_avx2's walk with one 256-bit vpdpbusd per step, half group, half block and token row
template <int MB, int NS, bool HI, bool MIN>
__attribute__((target(QL_VNNI256))) void b32_rows_vnni256(const Layout& L, const QX& qx, int64_t m0, const uint8_t* w,
                                                         int64_t g0, float* out) {
  const int64_t Kp = qx.Kp, nb = qx.nb;
  const int64_t hoff = G * L.qb, doff = hoff + (HI ? 64 * nb : 0), moff = doff + 32 * nb;
  __m256 acc[NS][MB][2];
  for (int i = 0; i < NS; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < NS; ++i) {
      const uint8_t* grp = L.group(w, g0 + i);
      prefetch_b32<HI, MIN>(grp, nb, b, NS * G * L.rb);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* wb = grp + b * 256 + 32 * h;
        const __m256i qh = HI ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + hoff + b * 64 + 32 * h))
                              : _mm256_setzero_si256();
        __m256i a[MB], a2[MB];
        for (int j = 0; j < MB; ++j) {
          a[j] = MIN ? _mm256_setzero_si256() : _mm256_set1_epi32(qx.corr[(m0 + j) * nb + b]);
          a2[j] = _mm256_setzero_si256();
        }
        for (int s = 0; s < 4; ++s) {
          __m256i lo, hi;
          b32_step256<HI>(wb, qh, s, lo, hi);
          for (int j = 0; j < MB; ++j) {
            const int8_t* xb = qx.q.data() + (m0 + j) * Kp + b * 32;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 4 * s, 4);
            std::memcpy(&xh, xb + 16 + 4 * s, 4);
            a[j] = _mm256_dpbusd_avx_epi32(a[j], lo, _mm256_set1_epi32(xl));
            a2[j] = _mm256_dpbusd_avx_epi32(a2[j], hi, _mm256_set1_epi32(xh));
          }
        }
        for (int j = 0; j < MB; ++j) a[j] = _mm256_add_epi32(a[j], a2[j]);
        b32_tail256<MB, MIN>(qx, m0, b, grp + doff + b * 32 + 16 * h, grp + moff + b * 32 + 16 * h, a, acc[i], h);
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
template <bool VNNI, bool HI, bool MIN>
void b32_groups_256(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t g0,
                    int ns) {
  alignas(32) float out[kStreamsAvx2 * 4 * G];
#define QL_B32_CALL(MB, NS)                                           \
  (VNNI ? b32_rows_vnni256<MB, NS, HI, MIN>(L, qx, m0, w, g0, out) \
        : b32_rows_avx2<MB, NS, HI, MIN>(L, qx, m0, w, g0, out))
  for (int64_t m0 = 0, mb = 0; m0 < qx.M; m0 += mb) {
    mb = block_rows(qx.M, m0, 4);
    if (ns == kStreamsAvx2) {
      switch (mb) {
        case 1: QL_B32_CALL(1, kStreamsAvx2); break;
        case 2: QL_B32_CALL(2, kStreamsAvx2); break;
        case 3: QL_B32_CALL(3, kStreamsAvx2); break;
        default: QL_B32_CALL(4, kStreamsAvx2); break;
      }
    } else {
      switch (mb) {
        case 1: QL_B32_CALL(1, 1); break;
        case 2: QL_B32_CALL(2, 1); break;
        case 3: QL_B32_CALL(3, 1); break;
        default: QL_B32_CALL(4, 1); break;
      }
    }
    write_groups(L, out, 4, ns, m0, mb, g0, bias, y);
  }
#undef QL_B32_CALL
}
#endif  // QL_X86

// the b32 formats' column groups [u0, u1) (and the tail rows as unit L.ng) on path ``isa``
template <bool HI, bool MIN>
void b32_units_t(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0,
                 int64_t u1, int isa, int streams) {
  for (int64_t u = u0; u < u1; ++u) {
    if (u == L.ng) {
      cols_scalar_b32(L, qx, w, bias, y, L.ng * G, L.N);
      continue;
    }
#if QL_X86
    if (isa == ISA_VNNI512) {
      const int ns = streams > 1 && u + kStreams <= std::min(u1, L.ng) ? kStreams : 1;
      b32_groups_vnni<HI, MIN>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
    if (isa == ISA_AVX2 || isa == ISA_AVXVNNI) {
      // AVX2's b32 walk keeps its 4 streams on AMD too (SmolLM2-135M Q4_1, Zen 5, 1 thread: 1 stream 0.92-0.97x)
      const bool side = qx.M <= kMaxRowsQ4StreamsAvx2 && u + kStreamsAvx2 <= std::min(u1, L.ng);
      const int ns = side ? kStreamsAvx2 : 1;
      if (isa == ISA_AVXVNNI)
        b32_groups_256<true, HI, MIN>(L, qx, w, bias, y, u, ns);
      else
        b32_groups_256<false, HI, MIN>(L, qx, w, bias, y, u, ns);
      u += ns - 1;
      continue;
    }
#endif
    group_scalar_b32(L, qx, w, bias, y, u);
  }
}

void b32_units(const Layout& L, const QX& qx, const uint8_t* w, const float* bias, float* y, int64_t u0, int64_t u1,
               int isa, int streams) {
  if (L.fmt == FMT_Q5_0)
    b32_units_t<true, false>(L, qx, w, bias, y, u0, u1, isa, streams);
  else if (L.fmt == FMT_Q4_1)
    b32_units_t<false, true>(L, qx, w, bias, y, u0, u1, isa, streams);
  else
    b32_units_t<true, true>(L, qx, w, bias, y, u0, u1, isa, streams);
}

// ------------------------------------------------------------------ runtime choice
struct Cpu {
  bool avx2 = false, vnni512 = false, avxvnni = false;
  bool amd = false;  // the vendor: which stream layout a decode step reads fastest (decode_streams_default)
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
  c.avxvnni = c.avx2 && __builtin_cpu_supports("avxvnni");
  unsigned vendor[3] = {0, 0, 0};
  if (__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]))
    c.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
#endif
  return c;
}

const Cpu kCpu = detect();
const int kBest = kCpu.vnni512 ? ISA_VNNI512 : kCpu.avxvnni ? ISA_AVXVNNI : kCpu.avx2 ? ISA_AVX2 : ISA_SCALAR;

bool supported(int isa) {
  switch (isa) {
    case ISA_SCALAR: return true;
    case ISA_AVX2: return kCpu.avx2;
    case ISA_AVXVNNI: return kCpu.avxvnni;
    case ISA_VNNI512: return kCpu.vnni512;
    default: return false;
  }
}

// the next path down where a CPU lacks one: vnni512 -> avxvnni -> avx2 -> scalar
int step_down(int isa) { return isa == ISA_VNNI512 ? ISA_AVXVNNI : isa == ISA_AVXVNNI ? ISA_AVX2 : ISA_SCALAR; }

// "scalar" | "avx2" | "avxvnni" | "vnni512" (or any "avx512..." name: the best AVX-512 path here) -> path;
// "auto" / "" -> -1; else -2.
int parse_isa(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s.empty() || s == "auto") return -1;
  if (s == "scalar") return ISA_SCALAR;
  if (s == "avx2") return ISA_AVX2;
  if (s == "avxvnni" || s == "avx-vnni" || s == "vnni256") return ISA_AVXVNNI;
  if (s == "vnni512" || s.rfind("avx512", 0) == 0) return ISA_VNNI512;
  return -2;
}

// SPECDECODE_KERNEL_ISA, or the best path here; a path this CPU lacks steps down to one it has
int isa_from_env() {
  const char* v = std::getenv("SPECDECODE_KERNEL_ISA");
  int req = v ? parse_isa(v) : -1;
  if (req < 0) return kBest;
  while (!supported(req)) req = step_down(req);
  return req;
}

std::atomic<int> g_isa{isa_from_env()};

// Weight streams a call reads side by side: 4 groups block by block on an Intel Xeon (1.14-1.3x one stream there
// at one token row, groups_vnni_mb's note), 1 on AMD, whose prefetchers follow one sequential stream best (Zen 5
// EPYC, one thread, whole models against the 4-stream walk, one token row: VNNI-512 SmolLM2-135M Q4_1 1.2-1.3x,
// 360M Q8_0 1.18x, 360M Q4_0 1.05-1.08x, 1.7B Q4_K_M 1.14x; AVX2 1.7B Q4_K_M 1.29x, 360M Q4_0 1.11x, its b32 walk
// excepted). Passes of several token rows read one stream there too, kRowsPrefetch ahead (1.7B-shape matrices from
// DRAM, VNNI-512, 9 rows against 4 streams: q4k 1.38x, q6k 1.3x, int8 1.25x, q4_1 1.3x; 64 rows q4k 1.38x; AVX2 as
// fast or faster). SPECDECODE_KERNEL_STREAMS=1|4 overrides; either walk gives the same bits (each row and column
// does the same operations in the same order).
int decode_streams_default() {
  const char* v = std::getenv("SPECDECODE_KERNEL_STREAMS");
  if (v && std::string(v) == "1") return 1;
  if (v && std::string(v) == std::to_string(kStreamsDefault)) return kStreamsDefault;
  return kCpu.amd ? 1 : kStreamsDefault;
}

std::atomic<int> g_streams{decode_streams_default()};

// 1 or kStreamsDefault as given, 0 this CPU's default; else an error naming ``who``
int checked_streams(const char* who, int64_t n) {
  TORCH_CHECK(n == 0 || n == 1 || n == kStreamsDefault, who, ": streams must be 1, ", kStreamsDefault,
              " or 0 (this CPU's default), got ", n);
  return n == 0 ? decode_streams_default() : static_cast<int>(n);
}
std::atomic<uintptr_t> g_dense{0};  // the small-M kernel's linear(x, w, bias, bf16_dot), or 0: at::linear

std::string set_isa(const std::string& name) {
  int req = parse_isa(name);
  TORCH_CHECK(req != -2, "quant set_isa: unknown ISA '", name, "' (auto, scalar, avx2, avxvnni, vnni512)");
  if (req == -1) req = kBest;
  TORCH_CHECK(supported(req), "quant set_isa: this CPU does not support ", isa_name(req), " (best: ",
              isa_name(kBest), ")");
  return isa_name(g_isa.exchange(req));
}

int format_of(const at::Tensor& w) {
  if (w.scalar_type() == at::kChar) return FMT_Q8;
  if (w.scalar_type() == at::kByte) return FMT_Q4;
  if (w.scalar_type() == at::kShort) return FMT_Q4K;
  if (w.scalar_type() == at::kInt) return FMT_Q6K;
  if (w.scalar_type() == at::ScalarType::UInt16) return FMT_Q5_0;
  if (w.scalar_type() == at::ScalarType::UInt32) return FMT_Q4_1;
  if (w.scalar_type() == at::ScalarType::UInt64) return FMT_Q5_1;
  if (w.scalar_type() == at::kLong) return FMT_Q5K;
  return -1;
}

const char* fmt_name(int fmt) {
  switch (fmt) {
    case FMT_Q8: return "int8";
    case FMT_Q4: return "int4";
    case FMT_Q4K: return "q4k";
    case FMT_Q6K: return "q6k";
    case FMT_Q5_0: return "q5_0";
    case FMT_Q4_1: return "q4_1";
    case FMT_Q5K: return "q5k";
    default: return "q5_1";
  }
}

// the packed weight's checks against K; its bytes per row
int64_t check_packed(const char* who, const at::Tensor& w, int fmt, int64_t K) {
  TORCH_CHECK(fmt >= 0 && w.dim() == 2 && w.is_contiguous(), who,
              ": weight must be a contiguous packed int8 (Q8), uint8 (Q4), int16 (q4k), int32 (q6k), uint16 (q5_0), "
              "uint32 (q4_1), uint64 (q5_1) or int64 (q5k) [N, row bytes] tensor");
  TORCH_CHECK(fmt != FMT_Q4K || K % QK_K == 0, who, ": a q4k (GGUF Q4_K) weight needs K a multiple of 256, got K=", K);
  TORCH_CHECK(fmt != FMT_Q5K || K % QK_K == 0, who, ": a q5k (GGUF Q5_K) weight needs K a multiple of 256, got K=", K);
  TORCH_CHECK(fmt != FMT_Q6K || K % QK_K == 0, who, ": a q6k (GGUF Q6_K) weight needs K a multiple of 256, got K=", K);
  TORCH_CHECK(!b32_fmt(fmt) || K % 32 == 0, who, ": a ", fmt_name(fmt), " weight needs K a multiple of 32, got K=", K);
  const int64_t rb = row_bytes(fmt, K);
  TORCH_CHECK(w.size(1) * w.element_size() == rb, who, ": a packed ", fmt_name(fmt), " weight for K=", K, " has ", rb,
              " bytes per row, got ", w.size(1) * w.element_size());
  return rb;
}

// The kernel on 2-D contiguous fp32 x [M, K] and a packed weight.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                        const std::optional<std::string>& isa_arg, std::optional<int64_t> streams_arg) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "quant_linear: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "quant_linear: x must be a contiguous fp32 [M, K] tensor");
  const int fmt = format_of(w);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_packed("quant_linear", w, fmt, K);
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
    TORCH_CHECK(req != -2, "quant_linear: unknown isa '", *isa_arg, "' (auto, scalar, avx2, avxvnni, vnni512)");
    isa = req == -1 ? kBest : req;
    TORCH_CHECK(supported(isa), "quant_linear: this CPU does not support ", isa_name(isa));
  }
  // the stream layout, the same for a decode step, a verification pass and a prefill (decode_streams_default)
  const int streams = streams_arg.has_value() ? checked_streams("quant_linear", *streams_arg) : g_streams.load();
  at::Tensor y = at::empty({M, N}, x.options());
  if (M * N == 0) return y;
  const Layout L(fmt, N, K);
  // reused: a decode step makes ~30 calls, each would allocate three buffers. A reference, so the
  // workers below read the calling thread's buffer (a thread_local named in the lambda would be theirs)
  thread_local QX qx_buffer;
  const QX& qx = qx_buffer;
  quantize_x(fmt, x.data_ptr<float>(), M, K, qx_buffer, isa);
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  // work units: the full groups, then the tail rows (fewer than G) as one unit
  const int64_t units = L.ng + (N > L.ng * G ? 1 : 0);
  // ~64k integer multiply-adds per task, so small layers do not wake threads for nothing
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, G * qx.Kp * M));
  if (k4_fmt(fmt)) {
    at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) { q4k_units(L, qx, wp, bp, yp, u0, u1, isa, streams); });
    return y;
  }
  if (fmt == FMT_Q6K) {
    at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) { q6k_units(L, qx, wp, bp, yp, u0, u1, isa, streams); });
    return y;
  }
  if (b32_fmt(fmt)) {
    at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) { b32_units(L, qx, wp, bp, yp, u0, u1, isa, streams); });
    return y;
  }
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
#if QL_X86
      if (isa == ISA_VNNI512 && u < L.ng) {  // several weight streams at once where kStreams groups remain
        const int ns = streams > 1 && u + kStreams <= std::min(u1, L.ng) ? kStreams : 1;
        groups_vnni(L, qx, wp, bp, yp, u, ns);
        u += ns - 1;
        continue;
      }
#endif
      if (u == L.ng) {
        cols_scalar(L, qx, wp, bp, yp, L.ng * G, N);
        continue;
      }
#if QL_X86
      if (isa == ISA_AVX2 && M == 1 && streams > 1 && u + kStreamsAvx2 <= std::min(u1, L.ng)) {  // several streams
        groups_avx2_m1<kStreamsAvx2>(L, qx, wp, bp, yp, u);
        u += kStreamsAvx2 - 1;
        continue;
      }
      if (isa == ISA_AVX2 && M == 1 && streams == 1) {  // one stream, further ahead (decode_streams_default)
        groups_avx2_m1<1>(L, qx, wp, bp, yp, u);
        continue;
      }
      if (isa == ISA_AVX2 && fmt == FMT_Q8 && M >= kMinRowsQ8Avx2) {  // a verification pass, several streams
        const int ns = static_cast<int>(std::min<int64_t>(kStreamsAvx2, std::min(u1, L.ng) - u));
        groups_avx2_q8_rows(L, qx, wp, bp, yp, u, ns);
        u += ns - 1;
        continue;
      }
      if (isa == ISA_AVX2 && fmt == FMT_Q4 && M > 1 && M <= kMaxRowsQ4StreamsAvx2) {
        if (u + kStreamsAvx2 <= std::min(u1, L.ng)) {
          groups_q4_avx2<kStreamsAvx2>(L, qx, wp, bp, yp, u);
          u += kStreamsAvx2 - 1;
        } else {
          groups_q4_avx2<1>(L, qx, wp, bp, yp, u);
        }
        continue;
      }
      if (isa == ISA_AVX2) {
        group_avx2(L, qx, wp, bp, yp, u);
        continue;
      }
      if (isa == ISA_AVXVNNI && M == 1 && u + kStreamsAvx2 <= std::min(u1, L.ng)) {
        groups_vnni256_m1(L, qx, wp, bp, yp, u);
        u += kStreamsAvx2 - 1;
        continue;
      }
      if (isa == ISA_AVXVNNI) {  // several weight streams at once where kStreamsAvx2 groups remain
        const int ns = u + kStreamsAvx2 <= std::min(u1, L.ng) ? kStreamsAvx2 : 1;
        groups_vnni256(L, qx, wp, bp, yp, u, ns);
        u += ns - 1;
        continue;
      }
#endif
      group_scalar(L, qx, wp, bp, yp, u);
    }
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
  at::Tensor y = quant_linear(x2, w, bias, std::nullopt, std::nullopt);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.view(shape);
}

// Reference: the same quantized activations and weights, dequantized, multiplied in fp64 (tests).
at::Tensor reference(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "reference: fp32 [M, K] x");
  const int fmt = format_of(w);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_packed("reference", w, fmt, K);
  const Layout L(fmt, N, K);
  QX qx;
  quantize_x(fmt, x.data_ptr<float>(), M, K, qx);
  at::Tensor y = at::zeros({M, N}, x.options().dtype(at::kDouble));
  double* yp = y.data_ptr<double>();
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      if (k4_fmt(fmt)) {  // the dequantized weight d * sc * v - dmin * m (exact in fp64)
        for (int64_t k = 0; k < qx.Kp; ++k) {
          float ds, dm;
          L.q4k_scales(wp, n, k / 32, ds, dm);
          acc += (double(ds) * L.q4k_v(wp, n, k) - double(dm)) * double(qx.d[m * qx.nb + k / 32]) * qx.q[m * qx.Kp + k];
        }
        yp[m * N + n] = acc;
        continue;
      }
      if (b32_fmt(fmt)) {  // the dequantized weight d * (q - 16) (q5_0) or d * q + m (q4_1, q5_1), exact in fp64
        for (int64_t k = 0; k < qx.Kp; ++k) {
          const double d = half_to_float(L.b32_half(wp, n, k / 32, false)), q = L.b32_q(wp, n, k);
          const double wv = b32_min(fmt) ? d * q + double(half_to_float(L.b32_half(wp, n, k / 32, true))) : d * (q - 16);
          acc += wv * double(qx.d[m * qx.nb + k / 32]) * qx.q[m * qx.Kp + k];
        }
        yp[m * N + n] = acc;
        continue;
      }
      if (fmt == FMT_Q6K) {  // the dequantized weight (d * sc) * (q - 32) (exact in fp64)
        for (int64_t k = 0; k < qx.Kp; ++k)
          acc += double(L.q6k_ds(wp, n, k / 16)) * (L.q6k_q(wp, n, k) - 32) * double(qx.d[m * qx.nb + k / 32]) *
                 qx.q[m * qx.Kp + k];
        yp[m * N + n] = acc;
        continue;
      }
      for (int64_t k = 0; k < qx.Kp; ++k)
        acc += double(half_to_float(L.scale(wp, n, k / 32))) * L.wq(wp, n, k) * double(qx.d[m * qx.nb + k / 32]) *
               qx.q[m * qx.Kp + k];
      yp[m * N + n] = acc;
    }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode quantized-weight CPU linear (Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 blocks, Q4_K / Q6_K super-blocks, int8 activations; VNNI-512 / AVX-VNNI / AVX2 / scalar)";
  m.def("linear", &linear, "F.linear drop-in: packed int8/int4 weights -> the kernel, dense -> the small-M kernel",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("bf16_dot") = true, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("quant_linear", &quant_linear, "the kernel on fp32 x [M, K] and a packed weight; isa: None, auto, scalar, "
        "avx2, avxvnni, vnni512; streams: None, or the weight streams the call reads (1, 4; 0: this CPU's "
        "default)", pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("isa") = pybind11::none(), pybind11::arg("streams") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("reference", &reference, "fp64 product of the dequantized int8 activations and weights (tests)",
        pybind11::arg("input"), pybind11::arg("weight"));
  m.def("row_bytes", [](int64_t K, bool int4) { return row_bytes(int4 ? FMT_Q4 : FMT_Q8, K); },
        "bytes per packed row for K inputs", pybind11::arg("k"), pybind11::arg("int4"));
  m.def("q4k_row_bytes", [](int64_t K) {
    TORCH_CHECK(K % QK_K == 0, "q4k_row_bytes: K must be a multiple of 256, got ", K);
    return row_bytes(FMT_Q4K, K);
  }, "bytes per packed q4k row for K inputs (a multiple of 256)", pybind11::arg("k"));
  m.def("q6k_row_bytes", [](int64_t K) {
    TORCH_CHECK(K % QK_K == 0, "q6k_row_bytes: K must be a multiple of 256, got ", K);
    return row_bytes(FMT_Q6K, K);
  }, "bytes per packed q6k row for K inputs (a multiple of 256)", pybind11::arg("k"));
  m.def("packed_row_bytes", [](int64_t K, const std::string& fmt) {
    const char* names[] = {"int8", "int4", "q4k", "q6k", "q5_0", "q4_1", "q5_1", "q5k"};
    int f = -1;
    for (int i = 0; i < 8; ++i)
      if (fmt == names[i]) f = i;
    TORCH_CHECK(f >= 0, "packed_row_bytes: unknown format '", fmt, "'");
    TORCH_CHECK((!k4_fmt(f) && f != FMT_Q6K) || K % QK_K == 0, "packed_row_bytes: ", fmt, " needs K a multiple of 256");
    TORCH_CHECK(!b32_fmt(f) || K % 32 == 0, "packed_row_bytes: ", fmt, " needs K a multiple of 32");
    return row_bytes(f, K);
  }, "bytes per packed row of format fmt for K inputs", pybind11::arg("k"), pybind11::arg("fmt"));
  m.def("has_avx2", []() { return kCpu.avx2; }, "whether this CPU has AVX2/FMA/F16C");
  m.def("has_vnni512", []() { return kCpu.vnni512; }, "whether this CPU has AVX-512 VNNI (vpdpbusd)");
  m.def("has_avxvnni", []() { return kCpu.avxvnni; }, "whether this CPU has AVX-VNNI (256-bit vpdpbusd, VEX)");
  m.def("supported_isas", []() {
    std::vector<std::string> out;
    for (int isa : {ISA_SCALAR, ISA_AVX2, ISA_AVXVNNI, ISA_VNNI512})
      if (supported(isa)) out.emplace_back(isa_name(isa));
    return out;
  }, "the paths this CPU has, slowest first");
  m.def("best_isa", []() { return std::string(isa_name(kBest)); }, "the best path this CPU supports");
  m.def("isa", []() { return std::string(isa_name(g_isa.load())); }, "the path linear() uses now");
  m.def("set_isa", &set_isa, "use another path ('auto' = the best); returns the previous one", pybind11::arg("isa"));
  m.def("streams", []() { return g_streams.load(); }, "weight streams a call reads side by side");
  m.def("set_streams", [](int64_t n) { return g_streams.exchange(checked_streams("set_streams", n)); },
        "1 or 4 weight streams a call reads (0: this CPU's default); returns the previous", pybind11::arg("n"));
  m.def("is_amd", []() { return kCpu.amd; }, "whether this CPU is AMD's (one weight stream by default)");
  m.def("set_dense_linear", [](uintptr_t fn) { g_dense.store(fn); },
        "address of the dense small-M linear(x, w, bias, bf16_dot) that non-packed weights go to (0: at::linear)",
        pybind11::arg("address"));
  m.def("linear_address", []() {
    return reinterpret_cast<uintptr_t>(static_cast<LinearFn>(&linear));
  }, "address of linear(input, weight, bias, bf16_dot) as a C++ function pointer");
}
