// Small-M linear for the CPU: y[M, N] = x[M, K] @ W[N, K]^T (+ b), M in 1..64.
//
// Why: eager F.linear with a handful of rows (the target verifying gamma+1
// draft tokens) streams the weight matrix from memory about once per row.
// Here every weight element is loaded once per call: the output rows N are cut
// into tiles of TILE_N weight rows, and for each tile the M token rows are
// processed in register blocks of at most 6 rows, so each 8-float chunk of W
// loaded into a register feeds one FMA per token row of the block, and the tile
// stays in L1/L2 between register blocks (M > 6 takes 2-3 passes over a tile,
// only the first from memory). While the first pass works on a tile it
// prefetches the next tile into L2, so DRAM streaming overlaps the FMAs.
//
// W may be fp32 or bf16 (bf16 is widened to fp32 in registers: a 16-bit shift).
// x, y and the bias are fp32; accumulation is fp32.
//
// The AVX2/FMA code is compiled with per-function target attributes rather than
// -mavx2 for the whole file, so the rest of the module is plain x86-64 and the
// runtime check (__builtin_cpu_supports) really protects hosts without AVX2;
// those get the portable scalar path.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#if defined(__x86_64__) || defined(__i386__)
#define SMALLM_X86 1
#include <immintrin.h>
#else
#define SMALLM_X86 0
#endif

namespace {

constexpr int64_t MAX_M = 64;  // a batched server step verifies up to rows x (gamma+1) tokens
constexpr int64_t TILE_N = 12;   // weight rows per task unit; multiple of every NB below
constexpr int64_t MAX_MB = 6;    // token rows per register block

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
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
  for (; n + NB <= n_end; n += NB)
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

bool detect_avx2() {
#if SMALLM_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const bool kHasAvx2 = detect_avx2();

template <typename WT>
void run(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y, int64_t N,
         bool use_avx2) {
  const int64_t ntiles = (N + TILE_N - 1) / TILE_N;
  // At least ~32k multiply-adds per task so tiny layers do not pay for a thread wake-up.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, TILE_N * K * M));
  at::parallel_for(0, ntiles, grain, [&](int64_t tb, int64_t te) {
    const int64_t nb = tb * TILE_N, ne = std::min(N, te * TILE_N);
#if SMALLM_X86
    if (use_avx2) {
      rows_avx2<WT>(x, M, K, w, bias, y, N, nb, ne);
      return;
    }
#endif
    rows_scalar<WT>(x, M, K, w, bias, y, N, nb, ne);
  });
}

// The kernel proper on 2-D fp32 x [M, K]; checks everything, never falls back.
at::Tensor smallm_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                         bool force_scalar) {
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
  at::Tensor y = at::empty({M, N}, x.options());
  const bool use_avx2 = kHasAvx2 && !force_scalar;
  if (w.scalar_type() == at::kFloat) {
    run<float>(x.data_ptr<float>(), M, K, w.data_ptr<float>(), bp, y.data_ptr<float>(), N, use_avx2);
  } else {
    run<uint16_t>(x.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()),
                  bp, y.data_ptr<float>(), N, use_avx2);
  }
  return y;
}

// Reference path: F.linear, with the weight/bias cast to x's dtype when they differ
// (e.g. fp32 activations with a bf16 weight).
at::Tensor eager_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  at::Tensor wc = w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
  std::optional<at::Tensor> bc = bias;
  if (bias.has_value() && bias->defined() && bias->scalar_type() != x.scalar_type())
    bc = bias->to(x.scalar_type());
  return at::linear(x, wc, bc);
}

// Drop-in for F.linear(x, weight, bias): the kernel when it applies, else eager.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
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
    ok = K > 0 && M >= 1 && M <= MAX_M;
  }
  if (ok && at::GradMode::is_enabled()) {  // no backward here: let autograd see eager ops
    ok = !x.requires_grad() && !w.requires_grad() && !(has_bias && bias->requires_grad());
  }
  if (!ok) return eager_linear(x, w, bias);
  at::Tensor x2 = x.reshape({M, K}).contiguous();
  at::Tensor y = smallm_linear(x2, w, bias, false);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.view(shape);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode small-M CPU linear kernel (AVX2/FMA, fp32 or bf16 weights)";
  m.def("linear", &linear, "F.linear drop-in: the small-M kernel when it applies, else eager",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("smallm_linear", &smallm_linear, "The kernel on 2-D fp32 x [M<=64, K]; raises if it does not apply",
        pybind11::arg("input"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("force_scalar") = false, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("has_avx2", []() { return kHasAvx2; }, "whether the AVX2/FMA path is used on this CPU");
  m.attr("MAX_M") = MAX_M;
}
