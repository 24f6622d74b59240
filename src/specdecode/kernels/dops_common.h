// CPU detection, fp16 / bf16 storage types and the vector helpers every fused op shares.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

namespace {


bool detect_avx2() {
#if DOPS_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);  // not a __builtin_cpu_supports name
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

const bool kHasAvx2 = detect_avx2();

bool detect_avx512() {
#if DOPS_X86 && (defined(__GNUC__) || defined(__clang__))
  return kHasAvx2 && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Grouped attention's 16-lane walk (attend_grouped_512) where the CPU has AVX-512F and SPECDECODE_KERNEL_ISA does not
// ask for AVX2; set_attention_isa() later. The same bits either way.
bool attention_512_default() {
  const char* v = std::getenv("SPECDECODE_KERNEL_ISA");
  return detect_avx512() && !(v && std::string(v) == "avx2");
}
std::atomic<bool> g_attention_512{attention_512_default()};

#if DOPS_X86
DOPS_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// hsum8 of eight vectors at once: r[k] = hsum8(a[k]) bit for bit (the same additions in the same
// association, ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))), in 11 shuffles/adds instead of 40.
DOPS_AVX2 inline __m256 hsum8x8(const __m256* a) {
  __m256 b[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 lo = _mm256_permute2f128_ps(a[k], a[k + 4], 0x20);  // [low half of a[k], of a[k+4]]
    const __m256 hi = _mm256_permute2f128_ps(a[k], a[k + 4], 0x31);  // [high halves]
    b[k] = _mm256_permute_ps(_mm256_add_ps(lo, hi), 0xD8);  // per 128-bit lane: (p0, p2, p1, p3)
  }
  const __m256 c01 = _mm256_hadd_ps(b[0], b[1]);  // (p0+p2, p1+p3) of k = 0, 1 | of k = 4, 5
  const __m256 c23 = _mm256_hadd_ps(b[2], b[3]);
  return _mm256_hadd_ps(c01, c23);  // (r0, r1, r2, r3 | r4, r5, r6, r7)
}

DOPS_AVX2 inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 lanes, Cephes' expf polynomial (about 1 ulp on the range softmax uses).
DOPS_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
#endif

// The scalar twin of exp8 (tails shorter than 8 lanes), same polynomial.
inline float exp1(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  x = x - fx * 0.693359375f;
  x = x - fx * -2.12194440e-4f;
  float y = 1.9875691500E-4f;
  y = y * x + 1.3981999507E-3f;
  y = y * x + 8.3334519073E-3f;
  y = y * x + 4.1665795894E-2f;
  y = y * x + 1.6666665459E-1f;
  y = y * x + 5.0000001201E-1f;
  y = y * (x * x) + (x + 1.0f);
  return std::ldexp(y, static_cast<int>(fx));
}

}  // namespace
