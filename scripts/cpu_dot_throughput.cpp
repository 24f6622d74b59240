// What one core of this CPU can do for a verify pass's matrix products, and whether AMX is usable.
//
// Why: at the bundled target's size (27M parameters) a pass over n tokens is bound by arithmetic once
// n is past a few tokens, so v(n) -- and with it how wide a draft tree may grow -- follows the core's
// multiply-add rate. This prints the issue rate of the two AVX-512 instructions our bf16 kernel can use
// (vdpbf16ps: 32 bf16 multiply-adds; vfmadd231ps: 16 fp32 ones), 16 independent accumulators so
// latency is hidden, and whether the OS lets a process use AMX tiles (ARCH_REQ_XCOMP_PERM).
// Missing instruction sets are reported as absent; the program runs on any x86-64 CPU.
//
//   g++ -O2 -o /tmp/cpu_dot_throughput scripts/cpu_dot_throughput.cpp && taskset -c 0 /tmp/cpu_dot_throughput
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace {
constexpr long kIters = 20000000;

__attribute__((target("avx512f,avx512bf16"), noinline)) float dpbf16_loop(long n) {
  __m512 a[16];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = x;
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_dpbf16_ps(a[j], x, y);
    asm volatile("" : "+v"(x));
  }
  __m512 s = a[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"), noinline)) float fma512_loop(long n) {
  __m512 a[16];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(x, y, a[j]);
    asm volatile("" : "+v"(x));
  }
  __m512 s = a[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"), noinline)) float fma256_loop(long n) {
  __m256 a[12];
  for (auto& v : a) v = _mm256_setzero_ps();
  __m256 x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(x, y, a[j]);
    asm volatile("" : "+v"(x));
  }
  float out[8];
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  _mm256_storeu_ps(out, s);
  return out[0];
}

template <typename F>
void report(const char* name, bool present, int per_iter, int macs_per_instr, F loop) {
  if (!present) {
    std::printf("%-12s absent on this CPU\n", name);
    return;
  }
  loop(kIters / 10);  // warm up (frequency, page faults)
  const auto t0 = std::chrono::steady_clock::now();
  volatile float sink = loop(kIters);
  (void)sink;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double instr = double(kIters) * per_iter / s;
  std::printf("%-12s %.2f G instructions/s = %.1f G multiply-adds/s (fp32 accumulate)\n", name, instr / 1e9,
              instr * macs_per_instr / 1e9);
}
}  // namespace

int main() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool bf16 = avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u);
  report("vdpbf16ps", bf16, 16, 32, dpbf16_loop);
  report("fma zmm", avx512, 16, 16, fma512_loop);
  report("fma ymm", avx2, 12, 8, fma256_loop);
  // AMX: CPUID.(7,0):EDX bit 24 (AMX-TILE); Linux also needs XTILEDATA (xfeature 18) granted per process
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const bool amx_cpu = (d >> 24) & 1u;
  unsigned long supported = 0;
  const long got = syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_SUPP */, &supported);
  const bool os_has = got == 0 && ((supported >> 18) & 1ul);
  std::printf("AMX tiles    CPU %s; kernel offers XTILEDATA: %s (ARCH_GET_XCOMP_SUPP = %#lx)\n",
              amx_cpu ? "reports AMX-TILE" : "has no AMX", os_has ? "yes" : "no", supported);
  return 0;
}
