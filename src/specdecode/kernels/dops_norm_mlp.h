// RMSNorm and the SiLU-gated MLP's activation.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_common.h"

namespace {

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

}  // namespace
