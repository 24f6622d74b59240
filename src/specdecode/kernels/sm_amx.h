// The small-M dense linear's AMX path (bf16 tiles), where the compiler and the CPU have it.
// Part of smallm_linear.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "sm_avx512.h"

namespace {

#if SMALLM_X86
// ------------------------------------------------------------------- AMX path
// AMX intrinsics need GCC 11 or clang 12; an older compiler builds the rest and reports no AMX.
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SMALLM_HAS_AMX 1
#else
#define SMALLM_HAS_AMX 0
#endif
#if SMALLM_HAS_AMX
#define SMALLM_AMX \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

constexpr int64_t AMX_ROWS = 16;  // weight rows per tile (C rows) and token rows per C tile (C columns)
constexpr int64_t AMX_K = 32;     // bf16 values of K per tile row

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: A (16 weight rows x 32 values), tmm1: B (16 value pairs x 16 token rows), tmm2..5: C (16 x 16 fp32)
SMALLM_AMX void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 6; ++t) {
    cfg.rows[t] = AMX_ROWS;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// x [M, Kp] bf16 (x_to_bf16) -> per block of 16 token rows, K/2 rows of 16 (pair of values) entries:
// B_j[p][m] = (x[16j + m][2p], x[16j + m][2p + 1]), zero past M.
void amx_pack_x(const uint16_t* xb, int64_t Kp, int64_t M, int64_t K, uint32_t* packed) {
  const int64_t mb = (M + AMX_ROWS - 1) / AMX_ROWS, pairs = K / 2;
  if (M % AMX_ROWS) std::memset(packed, 0, sizeof(uint32_t) * mb * pairs * AMX_ROWS);  // token rows past M: zero
  for (int64_t m = 0; m < M; ++m) {
    uint32_t* out = packed + (m / AMX_ROWS) * pairs * AMX_ROWS + (m % AMX_ROWS);
    const uint16_t* row = xb + m * Kp;
    for (int64_t p = 0; p < pairs; ++p) {
      uint32_t v;
      std::memcpy(&v, row + 2 * p, sizeof(v));
      out[p * AMX_ROWS] = v;
    }
  }
}

// Weight rows [n_begin, n_end) (multiples of 16) for MB blocks of 16 token rows; K a multiple of 32.
template <int MB>
SMALLM_AMX void amx_rows(const uint32_t* packed, int64_t M, int64_t K, const uint16_t* w, const float* bias,
                         float* y, int64_t N, int64_t n_begin, int64_t n_end) {
  alignas(64) float out[AMX_ROWS * AMX_ROWS];
  const int64_t pairs = K / 2, wstride = K * 2;
  amx_configure();
  for (int64_t n0 = n_begin; n0 < n_end; n0 += AMX_ROWS) {
    _tile_zero(2);
    if constexpr (MB > 1) _tile_zero(3);
    if constexpr (MB > 2) _tile_zero(4);
    if constexpr (MB > 3) _tile_zero(5);
    const uint16_t* wb = w + n0 * K;
    // no software prefetch: the hardware's streams keep pace here, and prefetching one block ahead (into L1
    // or L2, 1 to 4 blocks on) made a one-row pass 4-15% slower on a Sapphire Rapids-class Xeon
    for (int64_t k0 = 0; k0 < K; k0 += AMX_K) {
      _tile_loadd(0, wb + k0, wstride);
      const uint32_t* b = packed + (k0 / 2) * AMX_ROWS;
      _tile_loadd(1, b, 64);
      _tile_dpbf16ps(2, 0, 1);
      if constexpr (MB > 1) {
        _tile_loadd(1, b + pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(3, 0, 1);
      }
      if constexpr (MB > 2) {
        _tile_loadd(1, b + 2 * pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(4, 0, 1);
      }
      if constexpr (MB > 3) {
        _tile_loadd(1, b + 3 * pairs * AMX_ROWS, 64);
        _tile_dpbf16ps(5, 0, 1);
      }
    }
    for (int j = 0; j < MB; ++j) {
      switch (j) {  // tile numbers are immediates
        case 0: _tile_stored(2, out, 64); break;
        case 1: _tile_stored(3, out, 64); break;
        case 2: _tile_stored(4, out, 64); break;
        default: _tile_stored(5, out, 64); break;
      }
      const int64_t rows = std::min<int64_t>(AMX_ROWS, M - j * AMX_ROWS);
      for (int64_t n = 0; n < AMX_ROWS; ++n) {
        const float b = bias ? bias[n0 + n] : 0.f;
        for (int64_t m = 0; m < rows; ++m) y[(j * AMX_ROWS + m) * N + n0 + n] = out[n * AMX_ROWS + m] + b;
      }
    }
  }
  _tile_release();
}

#endif  // SMALLM_HAS_AMX

// Whether this process may use the AMX tile state: Linux grants it on request (arch_prctl).
bool amx_permitted() {
#if SMALLM_HAS_AMX && defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}
#endif  // SMALLM_X86

}  // namespace
