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
//            side (groups_vnni: more DRAM streams in flight), or one stream (AMD), where a call of up to
//            8 rows with no bias walks its groups in one loop (groups_vnni_run; every format likewise)
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

#include "ql_common.h"
#include "ql_walk.h"
#include "ql_int_avx2.h"
#include "ql_int_vnni.h"
#include "ql_q4k.h"
#include "ql_q6k.h"
#include "ql_b32.h"

namespace {

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
      if (isa == ISA_VNNI512 && u < L.ng && M <= 8 && streams == 1 && bp == nullptr) {  // one stream, one block
        const int64_t ge = std::min(u1, L.ng);
        groups_vnni_run(L, qx, wp, u, ge, yp);
        u = ge - 1;
        continue;
      }
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

}  // namespace

#include "ql_matrix.h"  // a packed matrix as numbers: a table's rows, the fp64 reference

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
  m.def("dequantize_rows", &dequantize_rows, "fp32 rows ids of the matrix a packed weight stands for (a table)",
        pybind11::arg("weight"), pybind11::arg("ids"), pybind11::arg("k"));
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
