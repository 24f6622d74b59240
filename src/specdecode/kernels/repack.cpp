// GGUF blocks as stored -> the quantized kernel's packed layouts, moving bytes only.
//
// Why in C++: the same moves written as torch views and copies (kernels/quant.py, quant_b32.py, which stay the
// reference the tests compare against) make several temporaries a weight; a 1 GB Q4_K_M file spent ~6 s of its
// load there, much of it in page faults. Here each output byte is written once, straight from the mapped file,
// groups of 16 rows in parallel, into memory advised for transparent huge pages (fewer faults on load, fewer TLB
// misses when a decode step streams the weights).
//
// Layouts (quant_linear.cpp reads them; the Python packers document them field by field; q5k is q4k's with the
// fifth bits after each group's super-block, quant_q5k.py). A group of G = 16
// rows is stored together, interleaved 4 inputs at a time per row; the last N % 16 rows stay plain.
//   int8 / int4 (Q8_0 / Q4_0): per block and step of 4 inputs, 16 rows x 4 bytes; then per block 16 fp16 d;
//     rows padded to a multiple of 4 bytes (zeros).
//   q4k (Q4_K): per super-block: 8 sub-blocks x 4 steps x 16 rows x 4 bytes of nibble pairs, 8 x 16 scales,
//     8 x 16 mins, 2 x 16 fp16 (d, dmin).
//   q6k (Q6_K): per super-block: nibbles as q4k, 8 x 2 x 16 x 4 bytes of 2-bit high parts, 16 x 16 int8 scales,
//     16 fp16 d, 32 zero bytes.
//   q5_0 / q4_1 / q5_1: per block and step 16 rows x 4 nibble bytes; then per block a 5th-bit plane (16 x 4),
//     16 fp16 d, 16 fp16 m (each where the format has it).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int64_t G = 16;
using Rows = const uint8_t* const*;

// ---- int8 / int4: GGUF Q8_0 (fp16 d + 32 int8) and Q4_0 (fp16 d + 16 bytes of nibble pairs) ----

struct B0 {
  int64_t quant;  // quant bytes a block: 32 (Q8_0) or 16 (Q4_0)
  int64_t blocks;
  int64_t row_bytes;  // ours: quant bytes + 2 a block, padded to 4
  int64_t src_block() const { return quant + 2; }
};

void group_b0(const B0& f, Rows rows, uint8_t* out) {
  const int64_t steps = f.quant / 4, qb = f.blocks * f.quant;
  for (int64_t b = 0; b < f.blocks; ++b)
    for (int64_t r = 0; r < G; ++r) {
      const uint8_t* src = rows[r] + b * f.src_block();
      for (int64_t s = 0; s < steps; ++s) std::memcpy(out + ((b * steps + s) * G + r) * 4, src + 2 + 4 * s, 4);
      std::memcpy(out + G * qb + (b * G + r) * 2, src, 2);
    }
  std::memset(out + G * (qb + 2 * f.blocks), 0, G * (f.row_bytes - qb - 2 * f.blocks));
}

void tail_b0(const B0& f, const uint8_t* src, uint8_t* out) {
  const int64_t qb = f.blocks * f.quant;
  for (int64_t b = 0; b < f.blocks; ++b) {
    std::memcpy(out + b * f.quant, src + b * f.src_block() + 2, f.quant);
    std::memcpy(out + qb + 2 * b, src + b * f.src_block(), 2);
  }
  std::memset(out + qb + 2 * f.blocks, 0, f.row_bytes - qb - 2 * f.blocks);
}

// ---- q4k: GGUF Q4_K super-blocks (fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles) ----

constexpr int64_t kQ4kSrc = 144, kQ4kOurs = 148;

// Scales, mins and the nibble pairs of one super-block (its 128 nibble bytes at ``qs``): q[j][t] holds inputs
// 32j + t (low) and 32j + 16 + t (high).
void q4k_fields(const uint8_t* src, const uint8_t* qs, uint8_t sc[8], uint8_t mn[8], uint8_t q[8][16]) {
  const uint8_t* s = src + 4;
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[4 + j] & 63;
    sc[4 + j] = (s[8 + j] & 15) | ((s[j] >> 2) & 48);
    mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 48);
  }
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 16; ++t) {
      const uint8_t a = qs[32 * c + t], b = qs[32 * c + 16 + t];
      q[2 * c][t] = (a & 15) | (b << 4);
      q[2 * c + 1][t] = (a >> 4) | (b & 0xF0);
    }
}

// ---- q5k: GGUF Q5_K super-blocks (Q4_K's fields with 32 bytes of fifth bits before the nibbles) ----

constexpr int64_t kQ5kSrc = 176, kQ5kOurs = 184, kQ5kPlanes = G * 148;  // the planes follow q4k's group bytes

// Sub-block j's plane byte i of one row: at bit s + 4h the fifth bit of input 16h + 4s + i (bit j of qh[that input])
inline uint8_t q5k_plane(const uint8_t* qh, int j, int i) {
  uint8_t v = 0;
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s) v |= static_cast<uint8_t>(((qh[16 * h + 4 * s + i] >> j) & 1) << (s + 4 * h));
  return v;
}

// q4k and q5k (Q5: the fifth bits' planes after q4k's group bytes, GGUF's qh after a tail row's q4k bytes)
template <bool Q5>
void group_k4(int64_t nsb, Rows rows, uint8_t* out) {
  constexpr int64_t src_sb = Q5 ? kQ5kSrc : kQ4kSrc, ours = Q5 ? kQ5kOurs : kQ4kOurs, qs_at = Q5 ? 48 : 16;
  uint8_t sc[8], mn[8], q[8][16];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    uint8_t* base = out + sb * G * ours;
    for (int64_t r = 0; r < G; ++r) {
      const uint8_t* src = rows[r] + sb * src_sb;
      q4k_fields(src, src + qs_at, sc, mn, q);
      for (int j = 0; j < 8; ++j) {
        for (int s = 0; s < 4; ++s) std::memcpy(base + ((j * 4 + s) * G + r) * 4, q[j] + 4 * s, 4);
        base[2048 + j * G + r] = sc[j];
        base[2176 + j * G + r] = mn[j];
        if constexpr (Q5)
          for (int i = 0; i < 4; ++i) base[kQ5kPlanes + (j * G + r) * 4 + i] = q5k_plane(src + 16, j, i);
      }
      std::memcpy(base + 2304 + r * 2, src, 2);
      std::memcpy(base + 2304 + (G + r) * 2, src + 2, 2);
    }
    if constexpr (Q5) std::memset(base + kQ5kPlanes + 8 * G * 4, 0, G * kQ5kOurs - kQ5kPlanes - 8 * G * 4);
  }
}

template <bool Q5>
void tail_k4(int64_t nsb, const uint8_t* row, uint8_t* out) {
  constexpr int64_t src_sb = Q5 ? kQ5kSrc : kQ4kSrc, ours = Q5 ? kQ5kOurs : kQ4kOurs, qs_at = Q5 ? 48 : 16;
  uint8_t sc[8], mn[8], q[8][16];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* src = row + sb * src_sb;
    uint8_t* base = out + sb * ours;
    q4k_fields(src, src + qs_at, sc, mn, q);
    std::memcpy(base, q, 128);
    std::memcpy(base + 128, sc, 8);
    std::memcpy(base + 136, mn, 8);
    std::memcpy(base + 144, src, 4);
    if constexpr (Q5) {
      std::memcpy(base + 148, src + 16, 32);
      std::memset(base + 180, 0, 4);
    }
  }
}

// ---- q6k: GGUF Q6_K super-blocks (128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales, fp16 d) ----

constexpr int64_t kQ6kSrc = 210, kQ6kOurs = 212;

// The 256 6-bit values of one super-block in GGUF's order.
void q6k_values(const uint8_t* src, uint8_t q[256]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = src + 64 * h;
    const uint8_t* qh = src + 128 + 32 * h;
    uint8_t* o = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      o[l] = (ql[l] & 15) | (((qh[l] >> 0) & 3) << 4);
      o[32 + l] = (ql[32 + l] & 15) | (((qh[l] >> 2) & 3) << 4);
      o[64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
      o[96 + l] = (ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4);
    }
  }
}

inline uint8_t q6k_nib(const uint8_t q[256], int j, int t) {  // inputs 32j + t (low) and 32j + 16 + t (high)
  return (q[32 * j + t] & 15) | ((q[32 * j + 16 + t] & 15) << 4);
}

void group_q6k(int64_t nsb, Rows rows, uint8_t* out) {
  uint8_t q[256];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    uint8_t* base = out + sb * G * kQ6kOurs;
    for (int64_t r = 0; r < G; ++r) {
      const uint8_t* src = rows[r] + sb * kQ6kSrc;
      q6k_values(src, q);
      for (int j = 0; j < 8; ++j) {
        for (int s = 0; s < 4; ++s)
          for (int i = 0; i < 4; ++i) base[((j * 4 + s) * G + r) * 4 + i] = q6k_nib(q, j, 4 * s + i);
        // high parts: per step pair p, byte i holds inputs 8p + 4e + i of each half h at bits 4e + 2h
        for (int p = 0; p < 2; ++p)
          for (int i = 0; i < 4; ++i) {
            const int x = 32 * j + 8 * p + i;
            base[2048 + ((j * 2 + p) * G + r) * 4 + i] = static_cast<uint8_t>(
                (q[x] >> 4) | ((q[x + 16] >> 4) << 2) | ((q[x + 4] >> 4) << 4) | ((q[x + 20] >> 4) << 6));
          }
      }
      for (int k = 0; k < 16; ++k) base[3072 + k * G + r] = src[192 + k];
      std::memcpy(base + 3328 + r * 2, src + 208, 2);
    }
    std::memset(base + 3360, 0, G * kQ6kOurs - 3360);
  }
}

void tail_q6k(int64_t nsb, const uint8_t* row, uint8_t* out) {
  uint8_t q[256];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* src = row + sb * kQ6kSrc;
    uint8_t* base = out + sb * kQ6kOurs;
    q6k_values(src, q);
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 16; ++t) base[j * 16 + t] = q6k_nib(q, j, t);
    for (int k = 0; k < 64; ++k)
      base[128 + k] = static_cast<uint8_t>((q[4 * k] >> 4) | ((q[4 * k + 1] >> 4) << 2) |
                                           ((q[4 * k + 2] >> 4) << 4) | ((q[4 * k + 3] >> 4) << 6));
    std::memcpy(base + 192, src + 192, 18);
    base[210] = base[211] = 0;
  }
}

// ---- q5_0 / q4_1 / q5_1: GGUF's other blocks of 32 (fp16 d, [fp16 m], [4 bytes of 5th bits], 16 of nibbles) ----

struct B32 {
  int64_t bytes, d, m, qh, qs;  // block bytes and field offsets (-1: absent)
  int64_t blocks;
};

// A block's 5th bits as our plane: byte i holds at bit s + 4h the 5th bit of element 16h + 4s + i.
void b32_plane(const uint8_t* qh, uint8_t plane[4]) {
  for (int i = 0; i < 4; ++i) {
    uint8_t v = 0;
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s) {
        const int e = 16 * h + 4 * s + i;
        v |= static_cast<uint8_t>(((qh[e / 8] >> (e % 8)) & 1) << (s + 4 * h));
      }
    plane[i] = v;
  }
}

void group_b32(const B32& f, Rows rows, uint8_t* out) {
  const int64_t nb = f.blocks;
  uint8_t* plane = out + 256 * nb;
  uint8_t* d = plane + (f.qh >= 0 ? 64 * nb : 0);
  uint8_t* m = d + 32 * nb;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < G; ++r) {
      const uint8_t* src = rows[r] + b * f.bytes;
      for (int s = 0; s < 4; ++s) std::memcpy(out + ((b * 4 + s) * G + r) * 4, src + f.qs + 4 * s, 4);
      if (f.qh >= 0) b32_plane(src + f.qh, plane + (b * G + r) * 4);
      std::memcpy(d + (b * G + r) * 2, src + f.d, 2);
      if (f.m >= 0) std::memcpy(m + (b * G + r) * 2, src + f.m, 2);
    }
}

void tail_b32(const B32& f, const uint8_t* row, uint8_t* out) {
  const int64_t nb = f.blocks;
  uint8_t* qh = out + 16 * nb;
  uint8_t* d = qh + (f.qh >= 0 ? 4 * nb : 0);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src = row + b * f.bytes;
    std::memcpy(out + 16 * b, src + f.qs, 16);
    if (f.qh >= 0) std::memcpy(qh + 4 * b, src + f.qh, 4);
    std::memcpy(d + 2 * b, src + f.d, 2);
    if (f.m >= 0) std::memcpy(d + 2 * nb + 2 * b, src + f.m, 2);
  }
}

// Ask for transparent huge pages over the whole pages inside [p, p + n), before anything touches them.
void advise_huge(void* p, int64_t n) {
#ifdef MADV_HUGEPAGE
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n)) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only: ignore a refusal
#else
  (void)p;
  (void)n;
#endif
}

// Map the source's pages in one call before reading them (Linux 5.14+'s MADV_POPULATE_READ): faulting a 1.8 GB
// file in page by page took 1.4 s, populating it 0.13 s. A part at a time, so the file's pages never all count
// toward the process's memory at once (the loader drops each tensor's pages once it is packed).
void populate(const uint8_t* p, int64_t n) {
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ, absent from older headers
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, kPopulateRead);  // advice only: older kernels refuse
}

// The stacked matrix's source rows: part p's rows in order, or in ``index``'s order (llama.cpp's q/k rows).
std::vector<const uint8_t*> source_rows(const std::vector<int64_t>& bases, const std::vector<int64_t>& counts,
                                        const std::vector<torch::Tensor>& index,
                                        const std::vector<int64_t>& row_bytes) {
  if (bases.size() != counts.size() || bases.size() != index.size() || bases.size() != row_bytes.size())
    throw std::invalid_argument("repack: bases, counts and index name one entry per part");
  std::vector<const uint8_t*> rows;
  for (size_t p = 0; p < bases.size(); ++p) {
    const auto* base = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(bases[p]));
    const int64_t n = counts[p], src_row_bytes = row_bytes[p];
    populate(base, n * src_row_bytes);
    if (index[p].numel() == 0) {
      for (int64_t r = 0; r < n; ++r) rows.push_back(base + r * src_row_bytes);
      continue;
    }
    auto idx = index[p].contiguous();
    if (idx.scalar_type() != torch::kLong || idx.numel() != n)
      throw std::invalid_argument("repack: a part's index is int64 with one entry a row");
    const int64_t* ix = idx.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
      if (ix[r] < 0 || ix[r] >= n) throw std::invalid_argument("repack: a row index is out of range");
      rows.push_back(base + ix[r] * src_row_bytes);
    }
  }
  return rows;
}

}  // namespace

// Rows of a GGUF matrix (the parts stacked: q|k|v, gate|up) in the kernel's layout for ``kind`` ("Q8_0", "Q4_0",
// "Q4_K", "Q6_K", "Q5_0", "Q4_1", "Q5_1"). ``bases``: each part's first stored byte (the mapped file; the caller
// keeps it alive); ``counts``: its rows; ``index``: its row order (an empty tensor: as stored); ``k``: inputs a
// row; ``row_bytes``: stored bytes a row, every part's (checked against ``k``: the bytes read are the bytes held).
// Returns [N, our row bytes] uint8.
torch::Tensor repack(const std::string& kind, const std::vector<int64_t>& bases, const std::vector<int64_t>& counts,
                     const std::vector<torch::Tensor>& index, int64_t k, int64_t row_bytes) {
  int64_t src_rb = 0, out_rb = 0;
  B0 b0{0, 0, 0};
  B32 b32{0, -1, -1, -1, 0, 0};
  int which = -1;  // 0: B0, 1: q4k, 2: q6k, 3: B32, 4: q5k
  if (kind == "Q8_0" || kind == "Q4_0") {
    if (k % 32) throw std::invalid_argument(kind + " rows have a multiple of 32 inputs");
    const int64_t quant = kind == "Q8_0" ? 32 : 16, nb = k / 32;
    b0 = B0{quant, nb, (nb * quant + 2 * nb + 3) / 4 * 4};
    src_rb = nb * (quant + 2), out_rb = b0.row_bytes, which = 0;
  } else if (kind == "Q4_K" || kind == "Q6_K" || kind == "Q5_K") {
    if (k % 256) throw std::invalid_argument(kind + " rows have a multiple of 256 inputs");
    const bool q4 = kind == "Q4_K", q5 = kind == "Q5_K";
    src_rb = k / 256 * (q4 ? kQ4kSrc : q5 ? kQ5kSrc : kQ6kSrc);
    out_rb = k / 256 * (q4 ? kQ4kOurs : q5 ? kQ5kOurs : kQ6kOurs);
    which = q4 ? 1 : q5 ? 4 : 2;
  } else if (kind == "Q5_0" || kind == "Q4_1" || kind == "Q5_1") {
    if (k % 32) throw std::invalid_argument(kind + " rows have a multiple of 32 inputs");
    if (kind == "Q5_0") b32 = B32{22, 0, -1, 2, 6, k / 32};
    if (kind == "Q4_1") b32 = B32{20, 0, 2, -1, 4, k / 32};
    if (kind == "Q5_1") b32 = B32{24, 0, 2, 4, 8, k / 32};
    src_rb = out_rb = b32.blocks * b32.bytes, which = 3;
  } else {
    throw std::invalid_argument("repack: no kernel layout for GGUF type " + kind);
  }
  if (k <= 0 || src_rb != row_bytes)
    throw std::invalid_argument(kind + " rows of " + std::to_string(k) + " inputs hold " + std::to_string(src_rb) +
                                " bytes, not " + std::to_string(row_bytes));
  const std::vector<const uint8_t*> rows =
      source_rows(bases, counts, index, std::vector<int64_t>(bases.size(), src_rb));
  const int64_t n = static_cast<int64_t>(rows.size()), full = n / G * G;
  auto out = torch::empty({n, out_rb}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  advise_huge(o, n * out_rb);
  const int64_t nsb = k / 256;
  at::parallel_for(0, full / G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      Rows r = rows.data() + g * G;
      uint8_t* dst = o + g * G * out_rb;
      if (which == 0) group_b0(b0, r, dst);
      else if (which == 1) group_k4<false>(nsb, r, dst);
      else if (which == 2) group_q6k(nsb, r, dst);
      else if (which == 4) group_k4<true>(nsb, r, dst);
      else group_b32(b32, r, dst);
    }
  });
  for (int64_t i = full; i < n; ++i) {
    uint8_t* dst = o + i * out_rb;
    if (which == 0) tail_b0(b0, rows[i], dst);
    else if (which == 1) tail_k4<false>(nsb, rows[i], dst);
    else if (which == 2) tail_q6k(nsb, rows[i], dst);
    else if (which == 4) tail_k4<true>(nsb, rows[i], dst);
    else tail_b32(b32, rows[i], dst);
  }
  return out;
}

namespace {

// ---- decode and round once: a matrix whose parts' types differ (a Q4_K_M file's q|k in Q4_K, v in Q6_K) ----
// Each stored row is decoded to fp32 exactly as the ``gguf`` package decodes it (the products are exact in fp32;
// a subtraction or addition rounds once, in the same order; no FMA, since the build targets no FMA ISA), then
// rounded to int8 as ``quant.quantize`` rounds: d = fp16(max|w| / 127), q = round-half-even(w / d) in -127..127,
// a block whose d is not positive all zeros.

inline float half_at(const uint8_t* p) {
  c10::Half h;
  std::memcpy(&h.x, p, 2);
  return static_cast<float>(h);
}

int64_t stored_row_bytes(const std::string& kind, int64_t k) {
  static const std::pair<const char*, std::pair<int64_t, int64_t>> kSizes[] = {
      {"F32", {1, 4}}, {"F16", {1, 2}}, {"BF16", {1, 2}}, {"Q8_0", {32, 34}}, {"Q4_0", {32, 18}},
      {"Q5_0", {32, 22}}, {"Q4_1", {32, 20}}, {"Q5_1", {32, 24}}, {"Q4_K", {256, 144}}, {"Q5_K", {256, 176}},
      {"Q6_K", {256, 210}}};
  for (const auto& [name, size] : kSizes)
    if (kind == name) {
      if (k <= 0 || k % size.first)
        throw std::invalid_argument(kind + " rows have a multiple of " + std::to_string(size.first) + " inputs");
      return k / size.first * size.second;
    }
  throw std::invalid_argument("round_int8: cannot decode GGUF type " + kind);
}

void decode_row(const std::string& kind, const uint8_t* src, int64_t k, float* w) {
  if (kind == "F32") {
    std::memcpy(w, src, 4 * k);
  } else if (kind == "F16") {
    for (int64_t i = 0; i < k; ++i) w[i] = half_at(src + 2 * i);
  } else if (kind == "BF16") {
    for (int64_t i = 0; i < k; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
      std::memcpy(w + i, &bits, 4);
    }
  } else if (kind == "Q8_0") {
    for (int64_t b = 0; b < k / 32; ++b, src += 34) {
      const float d = half_at(src);
      for (int i = 0; i < 32; ++i) w[32 * b + i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
    }
  } else if (kind == "Q4_K" || kind == "Q5_K") {  // Q5_K: the fifth bit of input 32j + e is bit j of qh[e]
    const bool q5 = kind == "Q5_K";
    uint8_t sc[8], mn[8], q[8][16];
    for (int64_t sb = 0; sb < k / 256; ++sb, src += q5 ? kQ5kSrc : kQ4kSrc) {
      q4k_fields(src, src + (q5 ? 48 : 16), sc, mn, q);
      const float d = half_at(src), dmin = half_at(src + 2);
      for (int j = 0; j < 8; ++j) {
        const float ds = d * static_cast<float>(sc[j]), dm = dmin * static_cast<float>(mn[j]);
        float* o = w + 256 * sb + 32 * j;
        for (int t = 0; t < 16; ++t) {
          const int lo = q5 ? ((src[16 + t] >> j) & 1) << 4 : 0, hi = q5 ? ((src[32 + t] >> j) & 1) << 4 : 0;
          o[t] = ds * static_cast<float>((q[j][t] & 15) | lo) - dm;
          o[16 + t] = ds * static_cast<float>((q[j][t] >> 4) | hi) - dm;
        }
      }
    }
  } else if (kind == "Q6_K") {
    uint8_t q[256];
    for (int64_t sb = 0; sb < k / 256; ++sb, src += kQ6kSrc) {
      q6k_values(src, q);
      const float d = half_at(src + 208);
      for (int e = 0; e < 256; ++e)
        w[256 * sb + e] = d * static_cast<float>(static_cast<int8_t>(src[192 + e / 16])) *
                          static_cast<float>(static_cast<int>(q[e]) - 32);
    }
  } else {  // Q4_0, Q5_0, Q4_1, Q5_1: blocks of 32, element t from qs[t] (low), t + 16 (high), 5th bit t of qh
    const bool q4 = kind == "Q4_0" || kind == "Q4_1", has_m = kind == "Q4_1" || kind == "Q5_1";
    const int64_t bytes = kind == "Q4_0" ? 18 : kind == "Q5_0" ? 22 : kind == "Q4_1" ? 20 : 24;
    const int64_t qh_at = kind == "Q5_0" ? 2 : 4, qs_at = bytes - 16;
    const float offset = has_m ? 0.0f : (q4 ? 8.0f : 16.0f);
    for (int64_t b = 0; b < k / 32; ++b, src += bytes) {
      const float d = half_at(src), m = has_m ? half_at(src + 2) : 0.0f;
      uint32_t qh = 0;
      if (!q4) std::memcpy(&qh, src + qh_at, 4);
      for (int t = 0; t < 32; ++t) {
        const uint8_t byte = src[qs_at + (t % 16)];
        const int v = (t < 16 ? byte & 15 : byte >> 4) | (q4 ? 0 : static_cast<int>((qh >> t) & 1) << 4);
        w[32 * b + t] = has_m ? d * static_cast<float>(v) + m : d * (static_cast<float>(v) - offset);
      }
    }
  }
}

// One row of fp32 weights (k a multiple of 32) as Q8_0 blocks, rounded as ``quant.quantize`` rounds to int8.
void round_row(const float* w, int64_t k, uint8_t* blocks) {
  for (int64_t b = 0; b < k / 32; ++b, w += 32, blocks += 34) {
    float amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < 32; ++i) {
      nan |= std::isnan(w[i]);
      amax = std::max(amax, std::fabs(w[i]));
    }
    const c10::Half d(nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f);
    std::memcpy(blocks, &d.x, 2);
    const float df = static_cast<float>(d);
    for (int i = 0; i < 32; ++i) {
      float q = df > 0.0f ? std::nearbyint(w[i] / df) : 0.0f;
      q = std::isnan(q) ? 0.0f : std::min(127.0f, std::max(-127.0f, q));
      blocks[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

}  // namespace

// The matrix stacking ``kinds``' parts (types may differ), decoded and rounded once to int8 in the kernel's layout
// ([N, row bytes] uint8, the ``quant.quantize`` bytes). ``bases``, ``counts``, ``index``, ``k``: as ``repack``.
torch::Tensor round_int8(const std::vector<std::string>& kinds, const std::vector<int64_t>& bases,
                         const std::vector<int64_t>& counts, const std::vector<torch::Tensor>& index, int64_t k,
                         const std::vector<int64_t>& row_bytes) {
  if (kinds.size() != bases.size() || row_bytes.size() != bases.size())
    throw std::invalid_argument("round_int8: kinds, bases and row_bytes name one entry per part");
  std::vector<int> row_kind;
  for (size_t p = 0; p < kinds.size(); ++p) {
    const int64_t want = stored_row_bytes(kinds[p], k);
    if (want != row_bytes[p])
      throw std::invalid_argument(kinds[p] + " rows of " + std::to_string(k) + " inputs hold " +
                                  std::to_string(want) + " bytes, not " + std::to_string(row_bytes[p]));
    if (k % 32) throw std::invalid_argument("round_int8 takes rows of a multiple of 32 inputs");
    row_kind.insert(row_kind.end(), counts[p], static_cast<int>(p));
  }
  const std::vector<const uint8_t*> rows = source_rows(bases, counts, index, row_bytes);
  const int64_t n = static_cast<int64_t>(rows.size()), full = n / G * G, nb = k / 32;
  const B0 b0{32, nb, (nb * 32 + 2 * nb + 3) / 4 * 4};
  auto out = torch::empty({n, b0.row_bytes}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  advise_huge(o, n * b0.row_bytes);
  auto rounded = [&](int64_t i, std::vector<float>& w, uint8_t* blocks) {
    decode_row(kinds[row_kind[i]], rows[i], k, w.data());
    round_row(w.data(), k, blocks);
  };
  at::parallel_for(0, full / G, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> w(k);
    std::vector<uint8_t> blocks(G * nb * 34);
    const uint8_t* ptrs[G];
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t r = 0; r < G; ++r) {
        rounded(g * G + r, w, blocks.data() + r * nb * 34);
        ptrs[r] = blocks.data() + r * nb * 34;
      }
      group_b0(b0, ptrs, o + g * G * b0.row_bytes);
    }
  });
  std::vector<float> w(k);
  std::vector<uint8_t> blocks(nb * 34);
  for (int64_t i = full; i < n; ++i) {
    rounded(i, w, blocks.data());
    tail_b0(b0, blocks.data(), o + i * b0.row_bytes);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("repack", &repack, "GGUF rows as stored -> the quantized kernel's layout (uint8 [N, row bytes])",
        pybind11::arg("kind"), pybind11::arg("bases"), pybind11::arg("counts"), pybind11::arg("index"),
        pybind11::arg("k"), pybind11::arg("row_bytes"));
  m.def("round_int8", &round_int8, "GGUF rows of any decodable types, decoded and rounded once to int8 (uint8 [N, row "
        "bytes])", pybind11::arg("kinds"), pybind11::arg("bases"), pybind11::arg("counts"), pybind11::arg("index"),
        pybind11::arg("k"), pybind11::arg("row_bytes"));
}
