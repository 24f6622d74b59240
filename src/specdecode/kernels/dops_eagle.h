// An EAGLE-3 draft layer as one call per tree level.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_attention.h"
#include "dops_norm_mlp.h"
#include "dops_rows.h"

namespace {

// ------------------------------------------------------------------ EAGLE draft layer
// An EAGLE-3 draft layer (drafters/eagle.py) as one call per tree level. Why: the layer runs over a
// handful of tree nodes per level, where ~60 eager ops cost ~0.4 of a target pass in dispatch
// alone; here it is the same fused pieces as a Llama layer (RMSNorm, RoPE + cache write +
// attention, SiLU-gating, the small-M linear through its address).
//
// Its cache has one slot per key, not per position (RoPE positions are explicit): the prefix is
// slots [0, prefix) (the verified positions' keys), then up to 64 scratch slots for tree nodes,
// so a node attends the prefix plus its ancestors written by earlier levels' calls, which the
// target's tree attention (ancestors within one pass) cannot express.
struct EagleLayer {
  at::Tensor input_norm, hidden_norm, wqkv, wo, post_norm, w13, w2, norm, lm_head;
};

// qkv [m, (H+2KV)*D]; cache row ``row`` of k_cache/v_cache [rows, KV, L, D]. Token t's k (RoPE at
// pos[t]) and v go to slot slot0 + t. Queries from q0 on: without ``anc`` (a chain: ingestion)
// query t attends slots [0, slot0 + t]; with it, slots [0, prefix), then prefix + j for each bit j
// of anc[t] | its own bit (slot0 + t - prefix), ascending. Returns [m - q0, H * D].
at::Tensor eagle_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                           at::Tensor& v_cache, int64_t row, int64_t prefix, int64_t slot0,
                           const std::vector<int64_t>& pos, const std::vector<uint64_t>& anc, int64_t q0, int64_t H,
                           int64_t KV, int64_t D, double scale) {
  check_rows(qkv, "qkv");
  const int64_t m = qkv.size(0), W = (H + 2 * KV) * D, group = H / KV;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == W, "decode_ops: eagle qkv must be [m, (H+2KV)*D]");
  TORCH_CHECK(static_cast<int64_t>(pos.size()) == m && (anc.empty() || static_cast<int64_t>(anc.size()) == m) &&
                  q0 >= 0 && q0 < m,
              "decode_ops: eagle attention needs one position (and ancestor set) per token");
  for (const at::Tensor* c : {&k_cache, &v_cache})
    TORCH_CHECK(c->device().is_cpu() && c->scalar_type() == at::kFloat && c->dim() == 4 && c->size(1) == KV &&
                    c->size(3) == D && c->stride(3) == 1 && c->stride(2) == D,
                "decode_ops: the KV cache must be fp32 [rows, KV, max_len, D] with contiguous positions");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(),
              "decode_ops: k and v caches differ in layout");
  const int64_t L = k_cache.size(2);
  TORCH_CHECK(row >= 0 && row < k_cache.size(0) && slot0 >= 0 && slot0 + m <= L, "decode_ops: eagle slots out of range");
  const bool tree = !anc.empty();
  if (tree)
    TORCH_CHECK(prefix >= 0 && slot0 >= prefix && slot0 + m - prefix <= 64 && prefix + 64 <= L,
                "decode_ops: eagle tree slots must lie in the 64 after the prefix");
  for (const int64_t p : pos) TORCH_CHECK(p >= 0 && p < cos.size(0), "decode_ops: position ", p, " outside the RoPE table");
  const float* src = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t s_row = k_cache.stride(0), s_head = k_cache.stride(1);
  for (int64_t t = 0; t < m; ++t) {
    const float* tok = src + t * W;
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t off = row * s_row + g * s_head + (slot0 + t) * D;
      rope(tok + (H + g) * D, cp + pos[t] * D, sp + pos[t] * D, kc + off, D);
      std::copy(tok + (H + KV + g) * D, tok + (H + KV + g + 1) * D, vc + off);
    }
  }
  const int64_t nq = m - q0;
  std::vector<uint64_t> bits(tree ? m : 0);
  int64_t n_keys = slot0 + m;  // a query's keys plus extras bound its row of scores
  if (tree) {
    n_keys = prefix;
    for (int64_t t = 0; t < m; ++t) {
      bits[t] = anc[t] | (uint64_t(1) << (slot0 + t - prefix));
      TORCH_CHECK(slot0 + m - prefix == 64 || (bits[t] >> (slot0 + m - prefix)) == 0,
                  "decode_ops: an eagle ancestor slot is not written yet");
      n_keys = std::max<int64_t>(n_keys, prefix + __builtin_popcountll(bits[t]));
    }
  }
  at::Tensor out = at::empty({nq, H * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const bool grouped = D % 8 == 0 && D <= 128;
  at::parallel_for(0, KV, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> qbuf(nq * group * D), scores(nq * group * n_keys), acc_buf(nq * group * D);
    std::vector<int64_t> nkeys(nq * group);
    std::vector<uint64_t> extra(tree ? nq * group : 0);
    std::vector<float*> outs(nq * group);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t off = row * s_row + g * s_head;
      for (int64_t t = q0; t < m; ++t)
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t qi = (t - q0) * group + hh, h = g * group + hh;
          rope(src + t * W + h * D, cp + pos[t] * D, sp + pos[t] * D, qbuf.data() + qi * D, D);
          nkeys[qi] = tree ? prefix : slot0 + t + 1;
          if (tree) extra[qi] = bits[t];
          outs[qi] = op + (t - q0) * H * D + h * D;
        }
      if (grouped) {
        attend_grouped(D / 8, qbuf.data(), nkeys.data(), tree ? extra.data() : nullptr, prefix, nq * group, kc + off,
                       vc + off, n_keys, static_cast<float>(scale), scores.data(), acc_buf.data(), outs.data());
      } else {
        for (int64_t qi = 0; qi < nq * group; ++qi)
          attend_one(qbuf.data() + qi * D, kc + off, vc + off, D, nkeys[qi], tree ? extra[qi] : 0, prefix, D,
                     static_cast<float>(scale), scores.data(), outs[qi]);
      }
    }
  });
  return out;
}

// One draft level (or an ingestion): for token t, the input is [input_norm(embed(tokens[t])) ;
// hidden_norm(feature)], the feature being row src[t] of ``feats`` (empty src: row t); the
// residual stream starts at the feature. Outputs (the layer's pre-norm result) go to rows dst, dst+1,
// ... of ``out`` (only the last token's with ``last_only``); returns their draft-vocabulary logits.
at::Tensor eagle_layer(const EagleLayer& w, const at::Tensor& table, const std::vector<int64_t>& tokens,
                       const at::Tensor& feats, const std::vector<int64_t>& src, at::Tensor& out, int64_t dst,
                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                       int64_t row, int64_t prefix, int64_t slot0, const std::vector<int64_t>& pos,
                       const std::vector<uint64_t>& anc, int64_t H, int64_t KV, int64_t D, double eps, double scale,
                       bool last_only, uintptr_t linear_fn, bool bf16_dot) {
  const int64_t m = static_cast<int64_t>(tokens.size());
  check_rows(feats, "feats");
  check_rows(out, "out");
  TORCH_CHECK(m > 0 && feats.dim() == 2 && out.dim() == 2 && out.size(1) == feats.size(1),
              "decode_ops: eagle features must be [rows, dim] and tokens non-empty");
  TORCH_CHECK(src.empty() || static_cast<int64_t>(src.size()) == m, "decode_ops: one feature row per token");
  const int64_t Dm = feats.size(1), R = feats.size(0), q0 = last_only ? m - 1 : 0;
  TORCH_CHECK(dst >= 0 && dst + (m - q0) <= out.size(0), "decode_ops: eagle output rows out of range");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() && table.size(1) == Dm &&
                  (table.scalar_type() == at::kFloat || table.scalar_type() == at::kBFloat16),
              "decode_ops: the embedding must be a contiguous fp32 or bf16 [vocab, dim] tensor");
  check_norm_weight(w.input_norm, Dm);
  check_norm_weight(w.hidden_norm, Dm);
  const float eps_f = static_cast<float>(eps);
  at::Tensor x = at::empty({m, 2 * Dm}, feats.options());
  at::Tensor res = at::empty({m - q0, Dm}, feats.options());
  std::vector<float> e(Dm);
  float* xp = x.data_ptr<float>();
  const float* fp = feats.data_ptr<float>();
  for (int64_t t = 0; t < m; ++t) {
    const int64_t id = tokens[t], r = src.empty() ? t : src[t];
    TORCH_CHECK(id >= 0 && id < table.size(0), "decode_ops: token id ", id, " is outside the vocabulary");
    TORCH_CHECK(r >= 0 && r < R, "decode_ops: eagle feature row ", r, " out of range");
    if (table.scalar_type() == at::kFloat) {
      std::copy(table.data_ptr<float>() + id * Dm, table.data_ptr<float>() + (id + 1) * Dm, e.data());
    } else {
      const uint16_t* sb = reinterpret_cast<const uint16_t*>(table.data_ptr<at::BFloat16>()) + id * Dm;
      for (int64_t k = 0; k < Dm; ++k) {
        const uint32_t b = static_cast<uint32_t>(sb[k]) << 16;
        std::memcpy(&e[k], &b, sizeof(float));
      }
    }
    rms_row(e.data(), w.input_norm.data_ptr<float>(), eps_f, xp + t * 2 * Dm, Dm);
    rms_row(fp + r * Dm, w.hidden_norm.data_ptr<float>(), eps_f, xp + t * 2 * Dm + Dm, Dm);
    if (t >= q0) std::copy(fp + r * Dm, fp + (r + 1) * Dm, res.data_ptr<float>() + (t - q0) * Dm);
  }
  const at::Tensor none;
  at::Tensor qkv = lin(linear_fn, bf16_dot, x, w.wqkv, none);
  at::Tensor attn = eagle_attention(qkv, cos, sin, k_cache, v_cache, row, prefix, slot0, pos, anc, q0, H, KV, D, scale);
  at::Tensor h = add_rms_norm_(res, lin(linear_fn, bf16_dot, attn, w.wo, none), w.post_norm, eps);
  at::Tensor down = lin(linear_fn, bf16_dot, silu_mul(lin(linear_fn, bf16_dot, h, w.w13, none)), w.w2, none);
  h = add_rms_norm_(res, down, w.norm, eps);
  out.narrow(0, dst, m - q0).copy_(res);
  return lin(linear_fn, bf16_dot, h, w.lm_head, none);
}


// Per row of logits [R, n]: the k largest entries' indices (largest first; ties: the lower index)
// and their softmax probabilities. Why: a tree level's children are a top-k of its nodes' draft
// laws, and softmax + topk + two tolist calls cost more than a tenth of the level itself.
std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<double>>> topk_softmax(const at::Tensor& logits,
                                                                                          int64_t k) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
                  logits.size(1) > 0 && logits.stride(1) == 1,
              "decode_ops: topk_softmax needs a CPU fp32 [rows, n] tensor with contiguous rows");
  const int64_t R = logits.size(0), n = logits.size(1);
  k = std::max<int64_t>(1, std::min(k, n));
  std::vector<std::vector<int64_t>> ids(R);
  std::vector<std::vector<double>> probs(R);
  std::vector<float> e(n);
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.data_ptr<float>() + r * logits.stride(0);
    std::vector<int64_t> top;  // indices, largest value first
    for (int64_t j = 0; j < n; ++j) {
      if (static_cast<int64_t>(top.size()) == k && !(x[j] > x[top.back()])) continue;
      int64_t at = static_cast<int64_t>(top.size());
      while (at > 0 && x[j] > x[top[at - 1]]) --at;
      top.insert(top.begin() + at, j);
      if (static_cast<int64_t>(top.size()) > k) top.pop_back();
    }
    std::copy(x, x + n, e.begin());
    const float sum = softmax_numer(e.data(), n);  // exp(x - max), its max being x[top[0]]
    for (const int64_t j : top) {
      ids[r].push_back(j);
      probs[r].push_back(static_cast<double>(e[j]) / static_cast<double>(sum));
    }
  }
  return {ids, probs};
}

}  // namespace
