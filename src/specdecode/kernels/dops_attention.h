// The attention op: walk choice, head-dimension dispatch, RoPE and the cache write, trees and windows.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_attend16.h"

namespace {

// The 16-lane walk where it applies (AVX-512, fp16 / bf16 storage, NV even), else the 8-lane one
template <int NV, typename T>
void attend_grouped_nv(const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base, int64_t nq,
                       const T* kbase, const T* vbase, int64_t n_keys, float scale, float* S, float* acc_buf,
                       float* const* outs) {
#if DOPS_X86
  if constexpr (NV % 2 == 0 && !std::is_same_v<T, float>) {
    if (g_attention_512.load(std::memory_order_relaxed)) {
      attend_grouped_512<NV, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs);
      return;
    }
  }
#endif
  attend_grouped_t<NV, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs);
}

template <typename T>
void attend_grouped(int64_t nv, const float* Q, const int64_t* nkeys, const uint64_t* extra, int64_t extra_base,
                    int64_t nq, const T* kbase, const T* vbase, int64_t n_keys, float scale, float* S,
                    float* acc_buf, float* const* outs) {
  switch (nv) {
#define DOPS_CASE(N) \
  case N: attend_grouped_nv<N, T>(Q, nkeys, extra, extra_base, nq, kbase, vbase, n_keys, scale, S, acc_buf, outs); break;
    DOPS_CASE(1) DOPS_CASE(2) DOPS_CASE(3) DOPS_CASE(4) DOPS_CASE(5) DOPS_CASE(6) DOPS_CASE(7) DOPS_CASE(8)
    DOPS_CASE(9) DOPS_CASE(10) DOPS_CASE(11) DOPS_CASE(12) DOPS_CASE(13) DOPS_CASE(14) DOPS_CASE(15) DOPS_CASE(16)
    DOPS_CASE(32)  // head_dim 256 (Gemma 3)
#undef DOPS_CASE
    default: TORCH_CHECK(false, "decode_ops: grouped attention needs head_dim/8 in 1..16 or 32");
  }
}

// The optional tree arguments as raw arrays, checked once per pass (stack_forward: not per layer).
struct TreeArgs {
  at::Tensor positions;  // int64 [B, T] contiguous, or undefined
  std::vector<int64_t> depth_pos;  // a tree's default positions: start + depth (ancestors), when none given
  std::vector<uint64_t> anc;  // per (b, t): bit j = new token j is t itself or an ancestor; empty = causal chain
  const int64_t* pos() const {
    return positions.defined() ? positions.data_ptr<int64_t>() : depth_pos.empty() ? nullptr : depth_pos.data();
  }
  const uint64_t* bits() const { return anc.empty() ? nullptr : anc.data(); }
};

TreeArgs tree_args(const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask,
                   const std::vector<int64_t>& starts, int64_t T) {
  const int64_t B = static_cast<int64_t>(starts.size());
  TreeArgs a;
  if (positions.has_value() && positions->defined()) {
    const at::Tensor& p = *positions;
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == at::kLong && p.dim() == 2 && p.size(0) == B &&
                    p.size(1) == T,
                "decode_ops: positions must be an int64 [B, T] CPU tensor (B = ", B, ", T = ", T, ")");
    a.positions = p.contiguous();
  }
  if (tree_mask.has_value() && tree_mask->defined()) {
    const at::Tensor& m = *tree_mask;
    TORCH_CHECK(T <= 64, "decode_ops: a tree mask covers at most 64 new tokens per pass, got ", T,
                " (use the eager path or a smaller tree)");
    TORCH_CHECK(m.device().is_cpu() && (m.scalar_type() == at::kBool || m.scalar_type() == at::kByte) &&
                    ((m.dim() == 3 && m.size(0) == B && m.size(1) == T && m.size(2) == T) ||
                     (m.dim() == 2 && m.size(0) == T && m.size(1) == T)),
                "decode_ops: tree_mask must be a bool [B, T, T] or [T, T] CPU tensor (B = ", B, ", T = ", T, ")");
    const at::Tensor mc = m.contiguous();
    const uint8_t* mp = static_cast<const uint8_t*>(mc.data_ptr());
    const bool shared = m.dim() == 2;
    a.anc.resize(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        const uint8_t* r = mp + ((shared ? 0 : b) * T + i) * T;
        uint64_t bits = uint64_t(1) << i;  // a token always sees itself
        for (int64_t j = 0; j < T; ++j)
          if (r[j]) bits |= uint64_t(1) << j;
        a.anc[b * T + i] = bits;
      }
    if (!a.positions.defined()) {
      a.depth_pos.resize(B * T);
      for (int64_t i = 0; i < B * T; ++i) a.depth_pos[i] = starts[i / T] + __builtin_popcountll(a.anc[i]) - 1;
    }
  }
  return a;
}

// The KV storage types attention reads and writes (KVCache's dtype).
bool kv_dtype_ok(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

template <typename T>
at::Tensor attention_typed(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H,
                           int64_t KV, int64_t D, double scale, const TreeArgs& tree, int64_t window);

// qkv [B, T, (H + 2*KV) * D] (q heads, then k heads, then v heads, as the fused projection
// writes them); cos/sin [max_len, D]; k_cache/v_cache [rows, KV, max_len, D] (one layer).
// For batch row b and token t at slot p = starts[b] + t: rotates q and k with RoPE at
// pos[b, t] (default p), writes k and v into cache row row0 + b at slot p, then attends every
// q head to the keys at slots 0..p of its kv head, or with a tree, to slots [0, starts[b]) and
// starts[b] + j for each ancestor-or-self j of t. Returns [B, T, H * D]. The cache is fp32, fp16 or
// bf16 (k and v alike): new keys/values are rounded to it once, stored ones widened exactly.
// ``window`` > 0 (a sliding-window layer, Gemma 3's): a query at position r also skips the cached keys
// at slots below r - window + 1 (transformers' kv > q - window). The cache before a pass is a chain
// (slot = position), and a tree's own keys sit within any window wider than the pass. Such a call
// takes the per-query path, whose sum over keys in ascending order is the same for any first key.
at::Tensor attention_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                          at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV,
                          int64_t D, double scale, const TreeArgs& tree, int64_t window = 0) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * D, "decode_ops: qkv must be [B, T, (H+2KV)*D]");
  TORCH_CHECK(H % KV == 0 && D % 2 == 0, "decode_ops: heads must be a multiple of kv heads and head_dim even");
  const int64_t B = qkv.size(0), T = qkv.size(1);
  TORCH_CHECK(static_cast<int64_t>(starts.size()) == B, "decode_ops: one start per batch row");
  for (const at::Tensor* c : {&k_cache, &v_cache}) {
    TORCH_CHECK(c->device().is_cpu() && kv_dtype_ok(c->scalar_type()) && c->dim() == 4 && c->size(1) == KV &&
                    c->size(3) == D && c->stride(3) == 1 && c->stride(2) == D,
                "decode_ops: the KV cache must be fp32, fp16 or bf16 [rows, KV, max_len, D] with contiguous "
                "positions");
  }
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "decode_ops: k and v caches differ in layout or dtype");
  const int64_t L = k_cache.size(2);
  TORCH_CHECK(row0 >= 0 && row0 + B <= k_cache.size(0), "decode_ops: cache rows out of range");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == D && sin.sizes() == cos.sizes(), "decode_ops: cos/sin must be [max_len, D]");
  const int64_t* pos = tree.pos();
  const int64_t max_pos = pos ? L : std::min(L, cos.size(0));
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(starts[b] >= 0 && starts[b] + T <= max_pos,
                "decode_ops: positions ", starts[b], "..", starts[b] + T, " exceed the cache or RoPE table");
  if (pos != nullptr)
    for (int64_t i = 0; i < B * T; ++i)
      TORCH_CHECK(pos[i] >= 0 && pos[i] < cos.size(0), "decode_ops: position ", pos[i], " outside the RoPE table");
  TORCH_CHECK(window <= 0 || tree.bits() == nullptr || window > T,
              "decode_ops: a sliding window must be wider than a tree pass (", window, " <= ", T, ")");
  switch (k_cache.scalar_type()) {
    case at::kHalf:
      return attention_typed<Half>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
    case at::kBFloat16:
      return attention_typed<BFloat16>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
    default:
      return attention_typed<float>(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale, tree, window);
  }
}

// attention_impl after its checks, for KV storage T.
template <typename T>
at::Tensor attention_typed(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H,
                           int64_t KV, int64_t D, double scale, const TreeArgs& tree, int64_t window) {
  const int64_t B = qkv.size(0), NT = qkv.size(1);
  const int64_t* pos = tree.pos();
  const uint64_t* anc = tree.bits();
  const int64_t W = (H + 2 * KV) * D;
  const float* src = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  T* kc = static_cast<T*>(k_cache.data_ptr());
  T* vc = static_cast<T*>(v_cache.data_ptr());
  const int64_t s_row = k_cache.stride(0), s_head = k_cache.stride(1);

  // 1) RoPE on k and the cache writes (rounded once to the storage type), for all new tokens
  // (later queries attend to earlier new keys, as stored).
  std::vector<float> krot(D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < NT; ++t) {
      const int64_t p = starts[b] + t, r = pos ? pos[b * NT + t] : p;
      const float* tok = src + (b * NT + t) * W;
      for (int64_t g = 0; g < KV; ++g) {
        const int64_t off = (row0 + b) * s_row + g * s_head + p * D;
        rope(tok + (H + g) * D, cp + r * D, sp + r * D, krot.data(), D);
        store_kv(krot.data(), kc + off, D);
        store_kv(tok + (H + KV + g) * D, vc + off, D);
      }
    }
  }
  // 2) Attention. Head dims that are a multiple of 8 (up to 128, or 256): one unit per (row, kv head)
  // with all its queries together (each key is loaded once for all of them, outputs stay in
  // registers); anything else: one query at a time. Both do each query's arithmetic in the
  // same order, so a query's result does not depend on which other queries share the call.
  // A sliding-window layer takes the grouped walk where its queries share their first key: a
  // one-token chain step (its first key shifted to the window's), or a pass no key of which is
  // outside any query's window; else the per-query walk, which skips keys query by query.
  at::Tensor out = at::empty({B, NT, H * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const int64_t group = H / KV;
  const int64_t max_keys = *std::max_element(starts.begin(), starts.end()) + NT;
  const bool one_step = NT == 1 && anc == nullptr && pos == nullptr;  // every query of a unit at one position
  const bool window_whole = window <= 0 || one_step || (anc == nullptr && pos == nullptr && max_keys <= window);
  const bool grouped = D % 8 == 0 && (D <= 128 || D == 256) && window_whole;
  const int64_t work = grouped ? B * KV : B * NT * H;
  const int64_t per_unit = (grouped ? NT * group : 1) * max_keys * D * 2;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, per_unit));
  at::parallel_for(0, work, grain, [&](int64_t w0, int64_t w1) {
    if (grouped) {
      // queries in blocks of tokens so the score buffer stays bounded (~4 MB) on long prefills;
      // a query's result does not depend on the block it is in
      const int64_t tb = std::max<int64_t>(1, std::min<int64_t>(NT, (int64_t(1) << 20) / (group * max_keys)));
      std::vector<float> qbuf(tb * group * D), scores(tb * group * max_keys), acc_buf(tb * group * D);
      std::vector<int64_t> nkeys(tb * group);
      std::vector<uint64_t> extra(anc ? tb * group : 0);
      std::vector<float*> outs(tb * group);
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / KV, g = w % KV;
        // a windowed one-token step: its keys from the window's first (attend_one's lo), for every query alike
        const int64_t lo = window > 0 && one_step ? std::max<int64_t>(0, starts[b] - window + 1) : 0;
        const int64_t off = (row0 + b) * s_row + g * s_head + lo * D;
        for (int64_t t0 = 0; t0 < NT; t0 += tb) {
          const int64_t t1 = std::min(NT, t0 + tb);
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t p = starts[b] + t, r = pos ? pos[b * NT + t] : p;
            for (int64_t hh = 0; hh < group; ++hh) {
              const int64_t qi = (t - t0) * group + hh, h = g * group + hh;
              rope(src + (b * NT + t) * W + h * D, cp + r * D, sp + r * D, qbuf.data() + qi * D, D);
              nkeys[qi] = (anc ? starts[b] : p + 1) - lo;
              if (anc) extra[qi] = anc[b * NT + t];
              outs[qi] = op + (b * NT + t) * H * D + h * D;
            }
          }
          // a tree query may read any of the pass's keys (prefix + at most NT): that bounds its row of scores
          attend_grouped(D / 8, qbuf.data(), nkeys.data(), anc ? extra.data() : nullptr, starts[b] - lo,
                         (t1 - t0) * group, kc + off, vc + off, starts[b] - lo + (anc ? NT : t1),
                         static_cast<float>(scale), scores.data(), acc_buf.data(), outs.data());
        }
      }
      return;
    }
    std::vector<float> scores(max_keys);
    std::vector<float> q(D);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (NT * H), t = (w / H) % NT, h = w % H;
      const int64_t p = starts[b] + t, g = h / group, r = pos ? pos[b * NT + t] : p;
      rope(src + (b * NT + t) * W + h * D, cp + r * D, sp + r * D, q.data(), D);
      const int64_t n = anc ? starts[b] : p + 1;
      const int64_t lo = window > 0 ? std::min(n, std::max<int64_t>(0, r - window + 1)) : 0;
      const int64_t off = (row0 + b) * s_row + g * s_head + lo * D;
      attend_one(q.data(), kc + off, vc + off, D, n - lo, anc ? anc[b * NT + t] : 0, starts[b] - lo, D,
                 static_cast<float>(scale), scores.data(), op + (b * NT + t) * H * D + h * D);
    }
  });
  return out;
}

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV,
                     int64_t D, double scale, const std::optional<at::Tensor>& positions,
                     const std::optional<at::Tensor>& tree_mask, int64_t window) {
  TORCH_CHECK(qkv.dim() == 3, "decode_ops: qkv must be [B, T, (H+2KV)*D]");
  return attention_impl(qkv, cos, sin, k_cache, v_cache, row0, starts, H, KV, D, scale,
                        tree_args(positions, tree_mask, starts, qkv.size(1)), window);
}

}  // namespace
