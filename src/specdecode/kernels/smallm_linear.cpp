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

#include "sm_common.h"
#include "sm_avx2.h"
#include "sm_avx512.h"
#include "sm_amx.h"

namespace {

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
void run(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y, int64_t N, int isa,
         bool one) {
  const int64_t tile = isa >= ISA_AVX512 ? TILE_N512 : TILE_N;
  const int64_t ntiles = (N + tile - 1) / tile;
  // At least ~32k multiply-adds per task so tiny layers do not pay for a thread wake-up.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, tile * K * M));
  at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
    const int64_t nb = tb * tile, ne = std::min(N, te * tile);
#if SMALLM_X86
    if (isa >= ISA_AVX512) {
      rows_avx512<WT>(x, M, K, w, bias, y, N, nb, ne, one);
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
                 int isa, bool one) {
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
      if (n16 < N) rows_bf16dot(xb, Kp, M, K, w, bias, y, N, n16, N, one);  // the last rows: the same path at any M
      return;
    }
#endif
    const int64_t ntiles = (N + TILE_N512 - 1) / TILE_N512;
    // vdpbf16ps does twice the work of an fp32 FMA: twice the grain
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, TILE_N512 * K * M));
    at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
      rows_bf16dot(xb, Kp, M, K, w, bias, y, N, tb * TILE_N512, std::min(N, te * TILE_N512), one);
    });
    return;
  }
#endif
  // the same math on the fp32 kernels: an FMA of two bf16 values only rounds the sum
  at::Tensor xr_t = at::empty({M * K}, at::TensorOptions().dtype(at::kFloat));
  float* xr = xr_t.data_ptr<float>();
  for (int64_t i = 0; i < M * K; ++i) xr[i] = round_to_bf16(x[i]);
  run<uint16_t>(xr, M, K, w, bias, y, N, isa, one);
}

// The kernel proper on 2-D fp32 x [M, K]; checks everything, never falls back.
at::Tensor smallm_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                         bool force_scalar, bool bf16_dot, const std::optional<std::string>& isa_arg,
                         int64_t streams = 0) {
  TORCH_CHECK(streams == 0 || streams == 1 || streams == 4, "smallm_linear: streams must be 0, 1 or 4, got ", streams);
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
  const bool one = one_stream_call(M, static_cast<int>(streams));
  if (w.scalar_type() == at::kFloat) {
    run<float>(x.data_ptr<float>(), M, K, w.data_ptr<float>(), bp, y.data_ptr<float>(), N, isa, one);
  } else {
    const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
    if (bf16_dot) {
      run_bf16dot(x.data_ptr<float>(), M, K, wp, bp, y.data_ptr<float>(), N, isa, one);
    } else {
      run<uint16_t>(x.data_ptr<float>(), M, K, wp, bp, y.data_ptr<float>(), N, isa, one);
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

// Drop-in for F.linear(x, weight, bias): the kernel when it applies, else eager (streams: smallm_linear's).
at::Tensor linear_streams(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                          bool bf16_dot, int64_t streams) {
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
    y = smallm_linear(x2, w, bias, false, bf16_dot, std::nullopt, streams);
  } else {
    y = at::empty({M, w.size(0)}, x2.options());
    for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
      const int64_t n = std::min(MAX_M, M - m0);
      y.narrow(0, m0, n).copy_(smallm_linear(x2.narrow(0, m0, n), w, bias, false, bf16_dot, std::nullopt, streams));
    }
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.view(shape);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, bool bf16_dot) {
  return linear_streams(x, w, bias, bf16_dot, 0);
}

// A model whose weights a decode step reads from memory (past the last-level cache) on a CPU that follows one
// stream best: its calls of up to kOneStreamMaxRows rows read one stream whatever the process setting.
at::Tensor linear_one(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, bool bf16_dot) {
  return linear_streams(x, w, bias, bf16_dot, 1);
}

at::Tensor linear_bf16_dot(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  return linear(x, w, bias, true);
}

at::Tensor linear_bf16_dot_one(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  return linear_one(x, w, bias, true);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode small-M CPU linear kernel (AVX-512 / AVX2 / scalar, fp32 or bf16 weights, bf16-dot mode)";
  m.def("linear", &linear, "F.linear drop-in: the small-M kernel when it applies, else eager",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("bf16_dot") = false, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("linear_one", &linear_one, "linear with one weight stream for calls of up to 6 token rows (a model's own)",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("bf16_dot") = false, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("linear_bf16_dot_one", &linear_bf16_dot_one, "linear_bf16_dot with linear_one's one weight stream",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("linear_bf16_dot", &linear_bf16_dot,
        "linear(..., bf16_dot=True): a bf16 weight meets x rounded to bf16 (exact products, fp32 sums)",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("smallm_linear", &smallm_linear,
        "The kernel on 2-D fp32 x [M<=64, K]; raises if it does not apply. isa: None (the current one), "
        "'auto', 'scalar', 'avx2', 'avx512', 'avx512bf16'",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("force_scalar") = false, pybind11::arg("bf16_dot") = false,
        pybind11::arg("isa") = pybind11::none(), pybind11::arg("streams") = 0,
        pybind11::call_guard<pybind11::gil_scoped_release>());
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
  m.def("linear_address", [](bool one) {
    using Fn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool);
    return reinterpret_cast<uintptr_t>(static_cast<Fn>(one ? &linear_one : &linear));
  }, "address of linear(input, weight, bias, bf16_dot) (one: linear_one's) as a C++ function pointer",
  pybind11::arg("one") = false);
}
