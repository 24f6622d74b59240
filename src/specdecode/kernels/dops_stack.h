// The whole decoder stack as one call.
// Part of decode_ops.cpp's one translation unit (included there, in order; never compiled alone).
#pragma once

#include "dops_attention.h"
#include "dops_norm_mlp.h"

namespace {

// ------------------------------------------------------------------ whole decoder stack
// A Llama-family stack's weights, gathered once (the Python side caches it per model), so a
// forward is one call: a small model's step otherwise spends a third of its time going back
// and forth between Python and ~10 C++ calls per layer.
struct Stack {
  // bqkv entries may be undefined; so may wv's: where defined, v's rows held apart from q|k's (another format)
  std::vector<at::Tensor> wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv;
  at::Tensor final_norm;
};

using LinearFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool);

// The small-M kernel through its address (0: eager at::linear, weights widened to x's dtype).
at::Tensor lin(uintptr_t fn, bool bf16_dot, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const std::optional<at::Tensor> bias = b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
  if (fn) return reinterpret_cast<LinearFn>(fn)(x, w, bias, bf16_dot);
  const at::Tensor wc = w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
  std::optional<at::Tensor> bc = bias;
  if (bc.has_value() && bc->scalar_type() != x.scalar_type()) bc = bc->to(x.scalar_type());
  return at::linear(x, wc, bc);
}

// x [B, T, dim] fp32 (updated in place: the residual stream); returns the final-normed hidden
// state [B, T or 1, dim] for the output projection. Same ops, same order as the Python loop.
// ``states`` (when not null) gets, for each capture[k], a copy of the residual stream after
// that layer ([B, T or 1, dim], following last_only).
at::Tensor stack_run(const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers, int64_t row0,
                     const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D, double eps, double scale,
                     bool last_only, uintptr_t linear_fn, bool bf16_dot, const TreeArgs& tree,
                     const std::vector<int64_t>& capture, std::vector<at::Tensor>* states) {
  const size_t n = st.wqkv.size();
  TORCH_CHECK(n > 0 && k_layers.size() == n && v_layers.size() == n, "decode_ops: one cache per layer");
  for (const int64_t c : capture)
    TORCH_CHECK(c >= 0 && c < static_cast<int64_t>(n), "decode_ops: layer ", c, " outside 0..", n - 1);
  if (states != nullptr) states->assign(capture.size(), at::Tensor());
  at::Tensor h = rms_norm(x, st.attn_norm[0], eps);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor qkv;
    if (st.wv[i].defined()) {  // q|k and v apart, joined; the bias after the join (the kernel's one fp32 add)
      qkv = at::cat({lin(linear_fn, bf16_dot, h, st.wqkv[i], at::Tensor()),
                     lin(linear_fn, bf16_dot, h, st.wv[i], at::Tensor())}, -1);
      if (st.bqkv[i].defined()) qkv.add_(st.bqkv[i]);
    } else {
      qkv = lin(linear_fn, bf16_dot, h, st.wqkv[i], st.bqkv[i]);
    }
    at::Tensor kc = k_layers[i], vc = v_layers[i];
    at::Tensor attn = attention_impl(qkv, cos, sin, kc, vc, row0, starts, H, KV, D, scale, tree);
    h = add_rms_norm_(x, lin(linear_fn, bf16_dot, attn, st.wo[i], at::Tensor()), st.mlp_norm[i], eps);
    at::Tensor down = lin(linear_fn, bf16_dot, silu_mul(lin(linear_fn, bf16_dot, h, st.w13[i], at::Tensor())),
                          st.w2[i], at::Tensor());
    if (i + 1 < n) {
      h = add_rms_norm_(x, down, st.attn_norm[i + 1], eps);
    } else if (!last_only) {
      h = add_rms_norm_(x, down, st.final_norm, eps);
    } else {
      x.add_(down);
      h = rms_norm(x.narrow(1, x.size(1) - 1, 1).contiguous(), st.final_norm, eps);
    }
    if (states != nullptr)
      for (size_t k = 0; k < capture.size(); ++k)
        if (capture[k] == static_cast<int64_t>(i))
          (*states)[k] = (last_only ? x.narrow(1, x.size(1) - 1, 1) : x).clone();
  }
  return h;
}

// The blocks the Llama stack above lacks (Gemma 3's, Qwen 3's): per layer, optionally, q and k norms (each head,
// before RoPE), norms after attention and after the MLP (Gemma's sandwich), a GELU-tanh gate, a sliding window
// and the local RoPE tables. The ops and their order are LlamaModel._forward_blocks' (models/llama.py), so the
// bits are too: one call instead of ~15 from Python a layer.
struct BlockStack {
  // per layer; bqkv, wv, q_norm, k_norm, post_attn and post_mlp entries may be undefined
  std::vector<at::Tensor> wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv, q_norm, k_norm, post_attn, post_mlp;
  std::vector<int64_t> window;  // 0: attends over the whole cache
  std::vector<bool> local_rope, gelu;
  at::Tensor final_norm;
};

at::Tensor blocks_forward(const BlockStack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& cos_local, const at::Tensor& sin_local,
                          const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers,
                          int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D,
                          double eps, double scale, bool last_only, uintptr_t linear_fn, bool bf16_dot,
                          const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  const size_t n = st.wqkv.size();
  TORCH_CHECK(n > 0 && k_layers.size() == n && v_layers.size() == n, "decode_ops: one cache per layer");
  const TreeArgs tree = tree_args(positions, tree_mask, starts, x.size(1));
  at::Tensor h = rms_norm(x, st.attn_norm[0], eps);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor qkv;
    if (st.wv[i].defined()) {
      qkv = at::cat({lin(linear_fn, bf16_dot, h, st.wqkv[i], at::Tensor()),
                     lin(linear_fn, bf16_dot, h, st.wv[i], at::Tensor())}, -1);
      if (st.bqkv[i].defined()) qkv.add_(st.bqkv[i]);
    } else {
      qkv = lin(linear_fn, bf16_dot, h, st.wqkv[i], st.bqkv[i]);
    }
    if (st.q_norm[i].defined() && st.k_norm[i].defined()) {
      at::Tensor heads = qkv.view({qkv.size(0), qkv.size(1), H + 2 * KV, D});
      heads.narrow(2, 0, H).copy_(rms_norm(heads.narrow(2, 0, H).contiguous(), st.q_norm[i], eps));
      heads.narrow(2, H, KV).copy_(rms_norm(heads.narrow(2, H, KV).contiguous(), st.k_norm[i], eps));
    }
    at::Tensor kc = k_layers[i], vc = v_layers[i];
    const bool local = st.local_rope[i];
    at::Tensor attn = attention_impl(qkv, local ? cos_local : cos, local ? sin_local : sin, kc, vc, row0, starts, H,
                                     KV, D, scale, tree, st.window[i]);
    at::Tensor out = lin(linear_fn, bf16_dot, attn, st.wo[i], at::Tensor());
    if (st.post_attn[i].defined()) out = rms_norm(out, st.post_attn[i], eps);
    h = add_rms_norm_(x, out, st.mlp_norm[i], eps);
    at::Tensor gate_up = lin(linear_fn, bf16_dot, h, st.w13[i], at::Tensor());
    at::Tensor act;
    if (st.gelu[i]) {
      const int64_t ffn = gate_up.size(-1) / 2;
      act = at::gelu(gate_up.narrow(-1, 0, ffn), "tanh") * gate_up.narrow(-1, ffn, ffn);
    } else {
      act = silu_mul(gate_up);
    }
    at::Tensor down = lin(linear_fn, bf16_dot, act, st.w2[i], at::Tensor());
    if (st.post_mlp[i].defined()) down = rms_norm(down, st.post_mlp[i], eps);
    if (i + 1 < n)
      h = add_rms_norm_(x, down, st.attn_norm[i + 1], eps);
    else
      x.add_(down);
  }
  return rms_norm((last_only ? x.narrow(1, x.size(1) - 1, 1) : x).contiguous(), st.final_norm, eps);
}

at::Tensor stack_forward(const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers,
                         int64_t row0, const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D,
                         double eps, double scale, bool last_only, uintptr_t linear_fn, bool bf16_dot,
                         const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  return stack_run(st, x, cos, sin, k_layers, v_layers, row0, starts, H, KV, D, eps, scale, last_only, linear_fn,
                   bf16_dot, tree_args(positions, tree_mask, starts, x.size(1)), {}, nullptr);
}

// stack_forward that also returns the residual stream after each layer in ``capture``.
std::pair<at::Tensor, std::vector<at::Tensor>> stack_forward_states(
    const Stack& st, at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
    const std::vector<at::Tensor>& k_layers, const std::vector<at::Tensor>& v_layers, int64_t row0,
    const std::vector<int64_t>& starts, int64_t H, int64_t KV, int64_t D, double eps, double scale, bool last_only,
    uintptr_t linear_fn, bool bf16_dot, const std::optional<at::Tensor>& positions,
    const std::optional<at::Tensor>& tree_mask, const std::vector<int64_t>& capture) {
  TORCH_CHECK(x.dim() == 3, "decode_ops: x must be [B, T, dim]");
  std::vector<at::Tensor> states;
  at::Tensor h = stack_run(st, x, cos, sin, k_layers, v_layers, row0, starts, H, KV, D, eps, scale, last_only,
                           linear_fn, bf16_dot, tree_args(positions, tree_mask, starts, x.size(1)), capture,
                           &states);
  return {h, states};
}

}  // namespace
