"""GGUF files as an input format: config, tensors, tokenizer and chat template from one file.

We read the file's header ourselves (a few lines; see ``_Cursor``) and let the ``gguf`` package,
llama.cpp's own Python library, dequantize the block formats we have no kernel for. What we add is
the mapping onto our runtime:

- **Config** from the ``{arch}.*`` metadata (llama, mistral, qwen2, qwen3, gemma3; others are refused by name).
- **Tensors.** F32/F16/BF16 are used as stored. Q8_0 and Q4_0 are llama.cpp's blocks of 32 with an
  fp16 scale, which is exactly our int8/int4 arithmetic, so with ``weight_dtype`` int8/int4 they are
  packed for our kernel as stored, without re-rounding (``kernels.quant.pack_gguf``). Q4_K (most of a
  Q4_K_M file), Q5_K (most of a Q5_K_M file), Q6_K, Q5_0, Q4_1 and Q5_1 have kernel formats of their own
  (``OWN_FORMAT``) and are computed as stored whatever the quantized ``weight_dtype``. Every other type
  (Q2_K, Q3_K, the IQ types...), and a fused matrix whose parts mix types, is dequantized and then rounded once to
  the ``weight_dtype`` asked for; but a q|k|v whose v alone differs (a K-quant file's Q6_K v) keeps v apart, both
  as stored (``_v_apart``, ``LlamaBlock.wv``).
- **Memory.** A quantized load (``read_packed``) goes tensor by tensor from the memory-mapped file to
  the packed form (one C++ pass a matrix, ``kernels/repack.py``), and keeps the embedding table in its stored format
  (``models/tables.py``): it peaks near the size of what it holds, never at a dense copy of the model.
- **q/k rows.** llama.cpp's converter permutes the q and k rows of llama-family models for its RoPE
  layout (pairs interleaved); we use transformers' layout (halves), so the rows are put back.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .config import UnsupportedModelError
from .gguf_file import DENSE_TYPES, GGUFError, GGUFTensor, parse_gguf
from .tables import PACKED_KINDS

GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# llama.cpp permutes q/k rows for these (its LlamaModel converter); qwen2 keeps transformers' layout
PERMUTED = {"llama", "mistral"}
STORED_AS = {"Q8_0": "int8", "Q4_0": "int4"}  # block types our int8/int4 kernels read as stored
# block types with a kernel format of their own, used as stored under any quantized ``weight_dtype``
OWN_FORMAT = {"Q4_K": "q4k", "Q5_K": "q5k", "Q6_K": "q6k", "Q5_0": "q5_0", "Q4_1": "q4_1", "Q5_1": "q5_1"}
# those a table (an embedding or output matrix looked up by rows, ``models/tables.py``) can also be kept in
TABLE_OWN = frozenset(k for k, f in OWN_FORMAT.items() if f in PACKED_KINDS)

_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",  # Qwen 3, Gemma 3
    # Gemma 3: ffn_norm is its norm before the MLP, under llama's name for that norm (transformers calls it
    # pre_feedforward_layernorm); the attention output's norm is named apart (``convert_hf_state_dict``)
    "post_attention_norm": "post_attention_norm", "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass
class Blocks:
    """A Q8_0/Q4_0 matrix as stored: integer blocks ``q`` [N, K/32, 32] and fp16 scales ``d`` [N, K/32]."""

    fmt: str
    q: torch.Tensor
    d: torch.Tensor

    def rows(self, index: torch.Tensor) -> "Blocks":
        return Blocks(self.fmt, self.q[index], self.d[index])


@dataclass
class GGUFCheckpoint:
    """What a GGUF file holds, in Hugging Face terms."""

    path: Path
    meta: dict[str, Any]
    hf_config: dict[str, Any]
    types: dict[str, str] = field(default_factory=dict)  # HF tensor name -> GGUF type name

    @property
    def matrix_types(self) -> set[str]:
        """The types of the decoder layers' matrices (what decides the default weight format)."""
        return {t for n, t in self.types.items() if n.startswith("model.layers.") and n.endswith("proj.weight")}

    def default_weight_format(self) -> Optional[str]:
        """int8/int4 when every layer matrix is Q8_0/Q4_0 (kept as stored); int8 for other block types
        (those with a kernel format of their own, ``OWN_FORMAT``, stay as stored; the rest, a 4/5/6-bit source,
        gains an 8-bit rounding of ~0.5% of its step, far below its own error, and runs at 8.5 bits a weight);
        None (dense, as stored) for F32/F16/BF16 files."""
        kinds = self.matrix_types
        if len(kinds) == 1 and next(iter(kinds)) in STORED_AS:
            return STORED_AS[next(iter(kinds))]
        if kinds and not kinds <= set(DENSE_TYPES):
            return "int8"
        return None

    @property
    def eos_ids(self) -> list[int]:
        ids = [self.meta.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id")]
        return sorted({int(i) for i in ids if i is not None})

    @property
    def chat_template(self) -> Optional[str]:
        t = self.meta.get("tokenizer.chat_template")
        return t if isinstance(t, str) and t.strip() else None

    def token_text(self, key: str) -> str:
        i, tokens = self.meta.get(key), self.meta.get("tokenizer.ggml.tokens") or []
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""


def read_gguf(path: str | Path) -> tuple[GGUFCheckpoint, list[GGUFTensor]]:
    """The checkpoint's metadata in HF terms, and its tensors (memory-mapped) for ``load_tensors``."""
    p = Path(path)
    try:
        meta, tensors = parse_gguf(p)
    except (ValueError, IndexError, OSError) as e:
        if isinstance(e, (GGUFError, UnsupportedModelError)):
            raise
        raise GGUFError(f"{p} is not a readable GGUF file ({type(e).__name__}: {e})") from e
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(f"GGUF architecture {arch!r} ({p.name}) is not supported; supported: "
                                    f"{', '.join(GGUF_ARCHITECTURES)}")
    ckpt = GGUFCheckpoint(p, meta, _hf_config(p, arch, meta, {t.name for t in tensors}))
    ckpt.types = {hf_name(t.name, p): t.tensor_type.name for t in tensors if t.name != "rope_freqs.weight"}
    return ckpt, tensors


def _hf_config(path: Path, arch: str, meta: dict[str, Any], names: set[str]) -> dict[str, Any]:
    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise GGUFError(f"{path.name} lacks the metadata key {arch}.{key}; is it a complete {arch} GGUF?")
        return meta[f"{arch}.{key}"]

    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(f"{path.name} carries rope_freqs (llama3-style RoPE scaling in GGUF), which is "
                                    "not supported from GGUF; load the Hugging Face checkpoint instead")
    n_heads = int(need("attention.head_count"))
    dim = int(need("embedding_length"))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    cfg: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "vocab_size": int(meta.get(f"{arch}.vocab_size") or len(tokens) or 0),
        "hidden_size": dim,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv") or n_heads),
        "head_dim": int(meta.get(f"{arch}.attention.key_length") or dim // n_heads),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length") or 2048),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if not cfg["vocab_size"]:
        raise GGUFError(f"{path.name} states no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise UnsupportedModelError(f"{path.name}: RoPE scaling {scaling!r} is not supported from GGUF; "
                                        "supported: none, linear")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    window = meta.get(f"{arch}.attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
    if arch == "gemma3":
        cfg.update(_gemma3_config(meta, cfg))
    return cfg


def _gemma3_config(meta: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """What a Gemma 3 GGUF leaves to llama.cpp's code, as its ``llama-model.cpp`` sets it: every 6th layer
    global (unless the file states a pattern), the sliding layers' RoPE base 10k, and attention scaled by
    head_dim ** -0.5 (hidden / heads for the 62-layer 27B model, whose query_pre_attn_scalar that is)."""
    n, pattern = cfg["num_hidden_layers"], meta.get("gemma3.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer, true = sliding
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["sliding_attention" if (i + 1) % int(pattern or 6) else "full_attention" for i in range(n)]
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if n == 62 else cfg["head_dim"]
    return {"layer_types": types, "query_pre_attn_scalar": scalar, "hidden_activation": "gelu_pytorch_tanh",
            "rope_theta": float(meta.get("gemma3.rope.freq_base") or 1e6),
            "rope_local_base_freq": float(meta.get("gemma3.rope.freq_base_swa") or 10000.0)}


def hf_name(name: str, path: Path) -> str:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP:
        return f"{_TOP[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"{path.name}: tensor {name!r} has no counterpart in our llama-family model")


def unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (pairs -> halves within each head)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _blocks(t: GGUFTensor, fmt: str) -> Blocks:
    return _raw_blocks(torch.from_numpy(np.array(t.data)).view(torch.uint8), fmt)


def _raw_blocks(raw: torch.Tensor, fmt: str) -> Blocks:
    """Q8_0/Q4_0 rows as stored ([N, nb * block bytes] uint8) as integer blocks and fp16 scales."""
    n = raw.shape[0]
    size = 34 if fmt == "int8" else 18
    b = raw.reshape(n, -1, size)
    d = b[..., :2].contiguous().view(torch.float16).reshape(n, -1)
    if fmt == "int8":
        q = b[..., 2:].contiguous().view(torch.int8)
    else:  # byte j: element j in the low nibble, element j + 16 in the high one
        nib = b[..., 2:]
        q = torch.cat([nib & 15, nib >> 4], dim=-1)
    return Blocks(fmt, q, d)


def dense_tensor(t: GGUFTensor) -> torch.Tensor:
    """A dense tensor: float types as stored, other block types dequantized by the ``gguf`` package."""
    name = t.tensor_type.name
    if name in ("F32", "F16"):
        return torch.from_numpy(np.array(t.data))
    if name == "BF16":
        return torch.from_numpy(np.array(t.data).view(np.int16)).view(torch.bfloat16)
    import gguf  # lazy: the package (~20 ms) is read for GGUF files only

    try:
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError as e:
        raise UnsupportedModelError(f"tensor {t.name}: GGUF type {name} cannot be dequantized by the installed "
                                    "gguf package; upgrade it (pip install -U gguf)") from e
    return torch.from_numpy(arr).reshape([int(d) for d in reversed(t.shape)])


def load_tensors(ckpt: GGUFCheckpoint, tensors: list[GGUFTensor], fmt: Optional[str]
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Blocks]]:
    """Every tensor as a dense HF-named tensor, plus those stored in ``fmt``'s blocks as ``Blocks``.

    The dense copy of a block matrix is its exact dequantization (what transformers computes with)."""
    arch = ckpt.meta["general.architecture"]
    cfg = ckpt.hf_config
    dense: dict[str, torch.Tensor] = {}
    blocks: dict[str, Blocks] = {}
    for t in tensors:
        if t.name == "rope_freqs.weight":
            continue
        name = hf_name(t.name, ckpt.path)
        kind = t.tensor_type.name
        if kind in STORED_AS:
            b = _blocks(t, STORED_AS[kind])
            w = (b.q.float() - (8 if b.fmt == "int4" else 0)) * b.d.float().unsqueeze(-1)
            w = w.reshape(b.q.shape[0], -1)
            if fmt is not None:  # kept as stored; the caller decides which fit (the head may differ)
                blocks[name] = b
        else:
            w = dense_tensor(t)
        heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}.get(
            name.split(".")[-2]) if arch in PERMUTED else None
        if heads is not None:
            idx = unpermute_index(w.shape[0], heads)
            w = w[idx]
            if name in blocks:
                blocks[name] = blocks[name].rows(idx)
        dense[name] = w
    return dense, blocks


def fuse_blocks(blocks: dict[str, Blocks], fused_names: dict[str, list[str]]) -> dict[str, Blocks]:
    """Our fused matrices (q|k|v, gate|up) from their parts' blocks, when every part is in ``blocks``."""
    out: dict[str, Blocks] = {}
    for ours, parts in fused_names.items():
        if all(p in blocks for p in parts):
            bs = [blocks[p] for p in parts]
            out[ours] = Blocks(bs[0].fmt, torch.cat([b.q for b in bs]), torch.cat([b.d for b in bs]))
    return out


def llama_fused_names(n_layers: int) -> dict[str, list[str]]:
    """Our llama module's matrix names -> the HF matrices each is made of (``convert_hf_state_dict``)."""
    out: dict[str, list[str]] = {}
    for i in range(n_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[f"layers.{i}.wqkv"] = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
        out[f"layers.{i}.wo"] = [a + "o_proj.weight"]
        out[f"layers.{i}.w13"] = [m + "gate_proj.weight", m + "up_proj.weight"]
        out[f"layers.{i}.w2"] = [m + "down_proj.weight"]
    return out
