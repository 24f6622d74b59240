// Embedding lookup, argmax and sampling over rows of logits.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_common.h"

namespace {

// ------------------------------------------------------------------ embedding
// tokens [B, T] int64 -> rows of the (fp32 or bf16) embedding matrix as a new fp32 [B, T, dim]
// tensor (the residual stream the stack updates in place); one call for what is three ops in Python.
at::Tensor embed(const at::Tensor& tokens, const at::Tensor& table) {
  TORCH_CHECK(tokens.device().is_cpu() && tokens.scalar_type() == at::kLong && tokens.dim() == 2,
              "decode_ops: tokens must be an int64 [B, T] CPU tensor");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() &&
                  (table.scalar_type() == at::kFloat || table.scalar_type() == at::kBFloat16),
              "decode_ops: the embedding must be a contiguous fp32 or bf16 [vocab, dim] tensor");
  const int64_t B = tokens.size(0), T = tokens.size(1), V = table.size(0), Dm = table.size(1);
  at::Tensor out = at::empty({B, T, Dm}, tokens.options().dtype(at::kFloat));
  const at::Tensor tok = tokens.contiguous();
  const int64_t* ids = tok.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t id = ids[r];
    TORCH_CHECK(id >= 0 && id < V, "decode_ops: token id ", id, " is outside the vocabulary of ", V);
    if (table.scalar_type() == at::kFloat) {
      const float* src = table.data_ptr<float>() + id * Dm;
      std::copy(src, src + Dm, op + r * Dm);
    } else {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(table.data_ptr<at::BFloat16>()) + id * Dm;
      for (int64_t k = 0; k < Dm; ++k) {
        const uint32_t bits = static_cast<uint32_t>(src[k]) << 16;
        std::memcpy(op + r * Dm + k, &bits, sizeof(float));
      }
    }
  }
  return out;
}

// ------------------------------------------------------------------ argmax
// Index of the first maximum of x[0, n), NaN counting as the maximum (torch.argmax's rule).
// Why: greedy decoding takes an argmax over the vocabulary for every verified row and draft
// step, and ATen's costs 9 us per 8192-entry row here, against a draft step of ~100 us.
DOPS_AVX2 int64_t argmax_row(const float* x, int64_t n) {
  int64_t j = 0;
  float mx = -INFINITY;
#if DOPS_X86
  __m256 mv = _mm256_set1_ps(-INFINITY);
  __m256 nan = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    mv = _mm256_max_ps(mv, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan)) {
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return i;
  }
  mx = hmax8(mv);
#endif
  for (; j < n; ++j) {
    if (std::isnan(x[j])) return j;
    mx = std::max(mx, x[j]);
  }
  j = 0;
#if DOPS_X86
  const __m256 m8 = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), m8, _CMP_EQ_OQ));
    if (mask) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
#endif
  for (; j < n; ++j)
    if (x[j] == mx) return j;
  return 0;  // n == 0 or every entry -inf below the first: torch returns 0 for an all -inf row too
}

// Per row of a 2-D fp32 tensor [R, n] (contiguous rows): the argmax indices as a Python list.
std::vector<int64_t> argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) > 0 &&
                  x.stride(1) == 1,
              "decode_ops: argmax_rows needs a CPU fp32 [rows, n] tensor with contiguous rows");
  std::vector<int64_t> out(x.size(0));
  const float* p = x.data_ptr<float>();
  for (int64_t r = 0; r < x.size(0); ++r) out[r] = argmax_row(p + r * x.stride(0), x.size(1));
  return out;
}

// ------------------------------------------------------------------ sampling
// One draw per row of non-negative weights [R, n] (not necessarily normalised) by inverse CDF:
// the first index whose cumulative weight (summed in double) exceeds u[r] * total, u in [0, 1).
// Returns -1 for a row whose weights are negative, inf or nan somewhere, or sum to zero.
// Why: torch.multinomial costs ~180 us per 8192-entry row on this CPU and torch's cumsum ~10 us.
// Sum of p[0, n) in double with independent partial sums (a chain of dependent adds would cost
// 4 cycles per entry); false in ok when an entry is negative, inf or nan.
inline double checked_sum(const float* p, int64_t n, bool& ok) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  bool good = true;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) {
      good &= p[j + k] >= 0.f && p[j + k] < INFINITY;  // false for nan
      part[k] += p[j + k];
    }
  for (; j < n; ++j) {
    good &= p[j] >= 0.f && p[j] < INFINITY;
    part[0] += p[j];
  }
  ok = good;
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

std::vector<int64_t> sample_rows(const at::Tensor& w, const std::vector<double>& u) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.size(1) > 0 &&
                  w.stride(1) == 1 && static_cast<int64_t>(u.size()) == w.size(0),
              "decode_ops: sample_rows needs CPU fp32 weights [rows, n] with contiguous rows and one u per row");
  constexpr int64_t kBlock = 32;
  const int64_t R = w.size(0), n = w.size(1);
  std::vector<int64_t> out(R, -1);
  for (int64_t r = 0; r < R; ++r) {
    const float* p = w.data_ptr<float>() + r * w.stride(0);
    bool ok = true;
    const double total = checked_sum(p, n, ok);
    if (!ok || !(total > 0.0)) continue;
    // the cumulative weight, whole blocks at a time until the block that crosses u * total
    const double target = u[r] * total;
    double cum = 0.0;
    int64_t last = -1;
    for (int64_t b = 0; b < n && out[r] < 0; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool unused = true;
      const double bs = checked_sum(p + b, e - b, unused);
      if (bs > 0.0) last = b;  // a block holding weight (refined below if the walk ends without a hit)
      if (cum + bs <= target) {
        cum += bs;
        continue;
      }
      for (int64_t j = b; j < e; ++j) {
        cum += p[j];
        if (cum > target) {
          out[r] = j;
          break;
        }
      }
    }
    if (out[r] < 0) {  // u * total rounded up past the walk's sum: the last entry with weight
      for (int64_t j = std::min(n, last + kBlock) - 1; j >= 0; --j)
        if (p[j] > 0.f) {
          out[r] = j;
          break;
        }
    }
  }
  return out;
}

}  // namespace
