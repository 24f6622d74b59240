// Fused decode-step ops for Llama-family layers on the CPU (fp32 activations).
//
// Why: a small model's decode step on a CPU is mostly dispatch, not arithmetic.
// The eager layer runs ~50 ATen ops (RoPE alone is a cat, a neg, two muls and an
// add; the KV write is two slice-assigns; attention is SDPA with a mask), each
// costing microseconds of Python and dispatcher time, for a few thousand FLOPs.
// Here a layer's non-matmul work is three calls: rms_norm, attention (RoPE on q
// and k, the KV-cache write and causal GQA attention over the cache in one
// pass) and silu_mul; the residual adds fuse into the norm that follows them.
//
// Every query is computed on its own, in the same order whatever the batch, the
// number of queries or the other rows: results are batch-invariant bit for bit,
// like the small-M linear kernel, so verification logits equal one-at-a-time
// logits exactly.
//
// Tree drafts: attention and stack_forward take optional positions (RoPE) and an
// optional tree mask over the new tokens (at most 64: one 64-bit ancestor set per
// query). A query then attends to its row's keys before the pass plus the new
// keys of its ancestors and itself, gathered in slot order, so its arithmetic is
// that of the same tokens fed as a plain chain: a tree node's output equals its
// root-to-node path's bit for bit, and a chain-shaped tree equals the causal pass.
//
// KV cache storage: fp32, fp16 or bf16 (``KVCache``'s dtype, chosen per model). The cache write
// rounds k and v once to the storage type (nearest even, as torch's own conversion does), and
// attention widens each stored key/value back to fp32 (exactly: every fp16/bf16 value is an
// fp32 value) and computes in fp32 as before. Why: at long context a decode step is mostly
// streaming the KV cache from memory, and half the bytes is about half that time.
//
// Only AVX2/FMA/F16C hosts use this (the Python side checks has_avx2(); every AVX2 CPU has
// F16C); the vector code carries per-function target attributes so the module itself loads on
// any x86-64 CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define DOPS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define DOPS_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define DOPS_X86 0
#define DOPS_AVX2
#endif

#include "dops_common.h"
#include "dops_norm_mlp.h"
#include "dops_attend8.h"
#include "dops_attend16.h"
#include "dops_attention.h"
#include "dops_rows.h"
#include "dops_stack.h"
#include "dops_eagle.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdecode fused decode-step ops for Llama-family layers (fp32; KV cache fp32/fp16/bf16; AVX2/FMA/F16C, "
            "attention 16 lanes wide on AVX-512F)";
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim", pybind11::arg("x"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("add_rms_norm_", &add_rms_norm_, "x += delta in place; returns rms_norm(x)", pybind11::arg("x"),
        pybind11::arg("delta"), pybind11::arg("weight"), pybind11::arg("eps"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("silu_mul", &silu_mul, "silu(gate) * up from the fused [..., 2F] gate/up projection",
        pybind11::arg("gate_up"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("attention", &attention,
        "RoPE + KV-cache write + GQA attention for new tokens (causal, or over a tree mask of at most 64)",
        pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("k_cache"),
        pybind11::arg("v_cache"), pybind11::arg("row0"), pybind11::arg("starts"), pybind11::arg("n_heads"),
        pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("scale"),
        pybind11::arg("positions") = pybind11::none(), pybind11::arg("tree_mask") = pybind11::none(),
        pybind11::arg("window") = 0, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("has_avx2", []() { return kHasAvx2; }, "whether this CPU has AVX2/FMA/F16C (required)");
  m.def("has_avx512", []() { return detect_avx512(); }, "whether this CPU has AVX-512F (grouped attention's 16 lanes)");
  m.def("attention_isa", []() { return std::string(g_attention_512.load() ? "avx512" : "avx2"); },
        "the grouped attention walk in use: avx512 (16 lanes) or avx2 (8); the same bits either way");
  m.def("set_attention_isa", [](const std::string& isa) {
          TORCH_CHECK(isa == "auto" || isa == "avx2" || isa == "avx512", "set_attention_isa: isa must be auto, avx2 "
                      "or avx512, got '", isa, "'");
          TORCH_CHECK(isa != "avx512" || detect_avx512(), "set_attention_isa: this CPU lacks AVX-512F");
          const bool prev = g_attention_512.exchange(isa == "auto" ? attention_512_default() : isa == "avx512");
          return std::string(prev ? "avx512" : "avx2");
        }, "the grouped attention walk: auto (this CPU's best; SPECDECODE_KERNEL_ISA=avx2 asks for 8 lanes), avx2 or "
        "avx512; returns the previous", pybind11::arg("isa"));
  m.def("sample_rows", &sample_rows, "inverse-CDF draw per row of CPU fp32 weights [rows, n] (-1: invalid row)",
        pybind11::arg("w"), pybind11::arg("u"));
  m.def("argmax_rows", &argmax_rows, "first argmax of each row of a CPU fp32 [rows, n] tensor (NaN = max)",
        pybind11::arg("x"));
  m.def("embed", &embed, "embedding rows for int64 tokens [B, T] as a new fp32 [B, T, dim] tensor",
        pybind11::arg("tokens"), pybind11::arg("table"), pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<Stack>(m, "Stack", "a decoder stack's weights, gathered once for stack_forward")
      .def(pybind11::init([](std::vector<at::Tensor> wqkv, std::vector<std::optional<at::Tensor>> bqkv,
                             std::vector<at::Tensor> wo, std::vector<at::Tensor> w13, std::vector<at::Tensor> w2,
                             std::vector<at::Tensor> attn_norm, std::vector<at::Tensor> mlp_norm,
                             at::Tensor final_norm, std::vector<std::optional<at::Tensor>> wv) {
        Stack st;
        st.wqkv = std::move(wqkv);
        for (auto& b : bqkv) st.bqkv.push_back(b.has_value() ? *b : at::Tensor());
        st.wo = std::move(wo);
        st.w13 = std::move(w13);
        st.w2 = std::move(w2);
        st.attn_norm = std::move(attn_norm);
        st.mlp_norm = std::move(mlp_norm);
        st.final_norm = std::move(final_norm);
        for (auto& v : wv) st.wv.push_back(v.has_value() ? *v : at::Tensor());
        const size_t n = st.wqkv.size();
        TORCH_CHECK(st.bqkv.size() == n && st.wo.size() == n && st.w13.size() == n && st.w2.size() == n &&
                        st.attn_norm.size() == n && st.mlp_norm.size() == n && st.wv.size() == n,
                    "decode_ops: every per-layer list needs one entry per layer");
        return st;
      }));
  pybind11::class_<BlockStack>(m, "BlockStack", "the weights and per-layer flags of blocks_forward's layers")
      .def(pybind11::init([](std::vector<std::vector<std::optional<at::Tensor>>> tensors, at::Tensor final_norm,
                             std::vector<int64_t> window, std::vector<bool> local_rope, std::vector<bool> gelu) {
        // tensors: wqkv, bqkv, wo, w13, w2, attn_norm, mlp_norm, wv, q_norm, k_norm, post_attn, post_mlp
        TORCH_CHECK(tensors.size() == 12, "decode_ops: BlockStack takes 12 per-layer lists");
        BlockStack st;
        std::vector<at::Tensor>* out[12] = {&st.wqkv, &st.bqkv, &st.wo, &st.w13, &st.w2, &st.attn_norm,
                                            &st.mlp_norm, &st.wv, &st.q_norm, &st.k_norm, &st.post_attn,
                                            &st.post_mlp};
        const size_t n = tensors[0].size();
        for (int k = 0; k < 12; ++k) {
          TORCH_CHECK(tensors[k].size() == n, "decode_ops: every per-layer list needs one entry per layer");
          for (auto& t : tensors[k]) out[k]->push_back(t.has_value() ? *t : at::Tensor());
        }
        for (int k : {0, 2, 3, 4, 5, 6})
          for (const auto& t : *out[k]) TORCH_CHECK(t.defined(), "decode_ops: a layer lacks a required tensor");
        TORCH_CHECK(window.size() == n && local_rope.size() == n && gelu.size() == n,
                    "decode_ops: one window, RoPE choice and activation per layer");
        st.window = std::move(window);
        st.local_rope = std::move(local_rope);
        st.gelu = std::move(gelu);
        st.final_norm = std::move(final_norm);
        return st;
      }));
  m.def("blocks_forward", &blocks_forward,
        "decoder blocks with q/k norms, sandwich norms, GELU and sliding windows (Gemma 3, Qwen 3) for new tokens; "
        "returns the final-normed hidden",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("cos_local"), pybind11::arg("sin_local"), pybind11::arg("k_layers"), pybind11::arg("v_layers"),
        pybind11::arg("row0"), pybind11::arg("starts"), pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"),
        pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("scale"), pybind11::arg("last_only"),
        pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"), pybind11::arg("positions") = pybind11::none(),
        pybind11::arg("tree_mask") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("stack_forward", &stack_forward, "the whole decoder stack for new tokens; returns the final-normed hidden",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_layers"), pybind11::arg("v_layers"), pybind11::arg("row0"), pybind11::arg("starts"),
        pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"),
        pybind11::arg("scale"), pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::arg("positions") = pybind11::none(), pybind11::arg("tree_mask") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("stack_forward_states", &stack_forward_states,
        "stack_forward, also returning copies of the residual stream after the layers in capture",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_layers"), pybind11::arg("v_layers"), pybind11::arg("row0"), pybind11::arg("starts"),
        pybind11::arg("n_heads"), pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"),
        pybind11::arg("scale"), pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::arg("positions"), pybind11::arg("tree_mask"), pybind11::arg("capture"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<EagleLayer>(m, "EagleLayer", "an EAGLE-3 draft layer's weights, gathered once for eagle_layer")
      .def(pybind11::init([](at::Tensor input_norm, at::Tensor hidden_norm, at::Tensor wqkv, at::Tensor wo,
                             at::Tensor post_norm, at::Tensor w13, at::Tensor w2, at::Tensor norm, at::Tensor lm_head) {
        for (const at::Tensor* t : {&input_norm, &hidden_norm, &post_norm, &norm})
          TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                          t->size(0) == input_norm.size(0),
                      "decode_ops: EAGLE norm weights must be contiguous fp32 [dim]");
        return EagleLayer{input_norm, hidden_norm, wqkv, wo, post_norm, w13, w2, norm, lm_head};
      }));
  m.def("eagle_layer", &eagle_layer,
        "one EAGLE-3 draft layer over tree nodes (or an ingestion); writes outputs to out, returns logits",
        pybind11::arg("layer"), pybind11::arg("table"), pybind11::arg("tokens"), pybind11::arg("feats"),
        pybind11::arg("src"), pybind11::arg("out"), pybind11::arg("dst"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("row"), pybind11::arg("prefix"),
        pybind11::arg("slot0"), pybind11::arg("positions"), pybind11::arg("ancestors"), pybind11::arg("n_heads"),
        pybind11::arg("n_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("scale"),
        pybind11::arg("last_only"), pybind11::arg("linear_fn"), pybind11::arg("bf16_dot"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("topk_softmax", &topk_softmax, "per row: the top-k indices (largest first) and their softmax probabilities",
        pybind11::arg("logits"), pybind11::arg("k"), pybind11::call_guard<pybind11::gil_scoped_release>());
}
