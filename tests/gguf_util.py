"""Tiny GGUF files written the way llama.cpp's converter writes them (no downloads).

A tiny Hugging Face checkpoint (``tiny.build_model``) is written with the ``gguf`` package: the
tokenizer's vocabulary and merges, the config as ``{arch}.*`` keys, and every matrix in the type
asked for (q/k rows permuted for llama, as ``convert_hf_to_gguf.py`` does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tiny import build_model

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_dir: Path, out: Path, qtype: str = "F16", arch: str = "llama", pre: str = "gpt2",
               chat_template: Optional[str] = CHAT_TEMPLATE, head_qtype: Optional[str] = None) -> Path:
    """``hf_dir``'s checkpoint as a GGUF file whose matrices are ``qtype`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1...)."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(out), arch)
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "gemma3":  # llama.cpp's converter: the global RoPE base and the window; the rest is in its code
        w.add_sliding_window(cfg["sliding_window"])
        cfg["rope_theta"] = cfg["rope_parameters"]["full_attention"]["rope_theta"]
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = tok["model"]["vocab"]
    added = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    tokens = [""] * cfg["vocab_size"]
    for t, i in {**vocab, **added}.items():
        tokens[i] = t
    types = [gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL for t in tokens]
    for i, t in enumerate(tokens):
        if not t:  # ids past the tokenizer's vocabulary (the model's table is larger)
            tokens[i], types[i] = f"[PAD{i}]", gguf.TokenType.UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    qt = gguf.GGMLQuantizationType[qtype]
    layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    if arch == "gemma3":  # gguf-py's tensor_mapping for Gemma 2/3
        layer.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    for name, arr in sd.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            parts = name.split(".")  # model.layers.i.<module...>.weight|bias
            gname = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        if arch == "gemma3" and name.endswith("norm.weight"):  # llama.cpp stores Gemma's 1 + w
            arr = arr + 1
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            arr = _permute(arr, n_heads if "q_proj" in name else n_kv)
        is_head = gname in ("token_embd.weight", "output.weight")
        t = gguf.GGMLQuantizationType[head_qtype] if head_qtype and is_head else qt
        if arr.ndim == 2 and t not in (gguf.GGMLQuantizationType.F32,):
            if t == gguf.GGMLQuantizationType.F16:
                w.add_tensor(gname, arr.astype(np.float16))
            else:
                w.add_tensor(gname, gguf.quants.quantize(arr.astype(np.float32), t), raw_dtype=t)
        else:
            w.add_tensor(gname, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def tiny_gguf(tmp: Path, qtype: str = "F16", arch: str = "llama", seed: int = 0, **kw: object) -> tuple[Path, Path]:
    """(HF directory, GGUF file) of one tiny random model; dimensions are multiples of 32 for block types."""
    hf = build_model(tmp / f"hf-{arch}-{seed}", arch=arch, seed=seed, intermediate_size=128)
    if not (tmp / f"{arch}-{seed}-{qtype}.gguf").exists():
        write_gguf(hf, tmp / f"{arch}-{seed}-{qtype}.gguf", qtype, arch, **kw)  # type: ignore[arg-type]
    return hf, tmp / f"{arch}-{seed}-{qtype}.gguf"


def greedy(model: object, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of ``ids`` (no cache tricks: one full forward per token)."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out])).logits[0, -1]  # type: ignore[operator]
            out.append(int(logits.argmax()))
    return out[len(ids):]
