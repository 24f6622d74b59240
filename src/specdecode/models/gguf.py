"""GGUF files as an input format: config, tensors, tokenizer and chat template from one file.
(Over 450 lines: the header reader, the per-type packing and the tokenizer metadata share one cursor.)

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

import ctypes
import ctypes.util
import mmap
import struct
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..kernels.quant import QUANT_FORMATS, pack_b32, pack_blocks, pack_gguf, pack_q4k, pack_q5k, pack_q6k, quantize
from ..kernels.quant_b32 import B32_FORMATS
from ..kernels.repack import DECODABLE, repack, round_int8
from .assemble import PackedWeights, assemble_model, assemble_packed
from .config import ModelConfig, UnsupportedModelError
from .gguf_tokenizer import tokenizer_from_gguf
from .llama import LlamaModel
from .pack_cache import CacheWriter, open_cached
from .tables import PACKED_KINDS, StoredRows, decode_rows

GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# llama.cpp permutes q/k rows for these (its LlamaModel converter); qwen2 keeps transformers' layout
_PERMUTED = {"llama", "mistral"}
DENSE_TYPES = ("F32", "F16", "BF16")
STORED_AS = {"Q8_0": "int8", "Q4_0": "int4"}  # block types our int8/int4 kernels read as stored
# block types with a kernel format of their own, used as stored under any quantized ``weight_dtype``
OWN_FORMAT = {"Q4_K": "q4k", "Q5_K": "q5k", "Q6_K": "q6k", "Q5_0": "q5_0", "Q4_1": "q4_1", "Q5_1": "q5_1"}
# those a table (an embedding or output matrix looked up by rows, ``models/tables.py``) can also be kept in
_TABLE_OWN = frozenset(k for k, f in OWN_FORMAT.items() if f in PACKED_KINDS)

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


class GGUFError(ValueError):
    """The file is not a GGUF we can run: the message names the architecture, tensor or key."""


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


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == b"GGUF"


@dataclass
class _Tensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: list[int]  # GGUF order: innermost dimension first
    data: np.ndarray  # [rows, row bytes] for block types, else the values in numpy order
    mapping: Optional[mmap.mmap] = None  # the file's memory map that ``data`` views
    offset: int = 0  # where ``data`` starts in it

    def release(self) -> None:
        """Drop this tensor's file pages from the process's resident memory once it has been read: they
        stay in the page cache, but a load that touched every page would otherwise count the whole file
        on top of what it built from it."""
        if self.mapping is None or not hasattr(self.mapping, "madvise"):
            return
        page = mmap.PAGESIZE
        start = self.offset // page * page
        end = min(len(self.mapping), self.offset + self.data.nbytes)
        self.mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


class _Cursor:
    """Reads GGUF's little-endian key/value section from a memory map.

    Why not ``gguf.GGUFReader``: it builds a numpy view per array element, which takes 5-15 s for a
    49k-token vocabulary; ``struct`` on the mapped bytes takes a fraction of a second."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return bool(v) if kind == 7 else v

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8 + n
        return bytes(self.buf[self.pos - n: self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind != 9:
            return self.scalar(kind)
        item, n = self.scalar(4), self.scalar(10)
        if item == 8:
            return [self.string() for _ in range(n)]
        if item == 9:
            return [self.value(9) for _ in range(n)]
        dt = np.dtype(_SCALARS[item])
        arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
        self.pos += n * dt.itemsize
        return [bool(x) for x in arr] if item == 7 else arr.tolist()


def _parse(path: Path) -> tuple[dict[str, Any], list[_Tensor]]:
    import gguf  # lazy: the package (~20 ms) is read for GGUF files only

    with path.open("rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file cannot be mapped
            raise GGUFError(f"{path} is not a GGUF file (empty)") from e
    buf = np.frombuffer(mm, dtype=np.uint8)
    c = _Cursor(mm)
    if mm[:4] != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (no GGUF magic)")
    c.pos = 4
    version = c.scalar(4)
    if version not in (2, 3):
        raise GGUFError(f"{path.name}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = c.scalar(10), c.scalar(10)
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.scalar(4))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.scalar(10) for _ in range(c.scalar(4))]
        kind, offset = c.scalar(4), c.scalar(10)
        infos.append((name, dims, kind, offset))
    align = int(meta.get("general.alignment", 32))
    start = (c.pos + align - 1) // align * align
    tensors = []
    for name, dims, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError as e:
            raise UnsupportedModelError(f"{path.name}: tensor {name} has GGUF type {kind}, unknown to the installed "
                                        "gguf package; upgrade it (pip install -U gguf)") from e
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * size
        raw = buf[start + offset: start + offset + rows * row_bytes]
        if qtype.name in DENSE_TYPES:
            np_dt = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qtype.name]
            data = raw.view(np_dt).reshape(list(reversed(dims)))
        else:
            data = raw.reshape(rows, row_bytes)
        tensors.append(_Tensor(name, qtype, dims, data, mm, start + offset))
    return meta, tensors


def read_gguf(path: str | Path) -> tuple[GGUFCheckpoint, list[_Tensor]]:
    """The checkpoint's metadata in HF terms, and its tensors (memory-mapped) for ``load_tensors``."""
    p = Path(path)
    try:
        meta, tensors = _parse(p)
    except (ValueError, IndexError, OSError) as e:
        if isinstance(e, (GGUFError, UnsupportedModelError)):
            raise
        raise GGUFError(f"{p} is not a readable GGUF file ({type(e).__name__}: {e})") from e
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(f"GGUF architecture {arch!r} ({p.name}) is not supported; supported: "
                                    f"{', '.join(GGUF_ARCHITECTURES)}")
    ckpt = GGUFCheckpoint(p, meta, _hf_config(p, arch, meta, {t.name for t in tensors}))
    ckpt.types = {_hf_name(t.name, p): t.tensor_type.name for t in tensors if t.name != "rope_freqs.weight"}
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


def _hf_name(name: str, path: Path) -> str:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP:
        return f"{_TOP[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"{path.name}: tensor {name!r} has no counterpart in our llama-family model")


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (pairs -> halves within each head)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _blocks(t: _Tensor, fmt: str) -> Blocks:
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


def _dense(t: _Tensor) -> torch.Tensor:
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


def load_tensors(ckpt: GGUFCheckpoint, tensors: list[_Tensor], fmt: Optional[str]
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
        name = _hf_name(t.name, ckpt.path)
        kind = t.tensor_type.name
        if kind in STORED_AS:
            b = _blocks(t, STORED_AS[kind])
            w = (b.q.float() - (8 if b.fmt == "int4" else 0)) * b.d.float().unsqueeze(-1)
            w = w.reshape(b.q.shape[0], -1)
            if fmt is not None:  # kept as stored; the caller decides which fit (the head may differ)
                blocks[name] = b
        else:
            w = _dense(t)
        heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}.get(
            name.split(".")[-2]) if arch in _PERMUTED else None
        if heads is not None:
            idx = _unpermute_index(w.shape[0], heads)
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


_OWN_PACKERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_K": pack_q4k, "Q5_K": pack_q5k, "Q6_K": pack_q6k,
    **{k: partial(pack_b32, fmt=f) for k, f in OWN_FORMAT.items() if f in B32_FORMATS}}
_CHUNK_ROWS = 1024  # rows decoded at a time when a matrix is rounded: a multiple of the packed layout's 16-row groups


@dataclass
class _Source:
    """One GGUF tensor as the rows of its Hugging Face tensor: the stored bytes of each row (still in the
    memory-mapped file), with llama.cpp's q/k row permutation undone by ``index``."""

    t: _Tensor
    index: Optional[torch.Tensor]

    @property
    def kind(self) -> str:
        return str(self.t.tensor_type.name)

    @property
    def rows(self) -> int:
        return int(np.prod(self.t.shape[1:])) if len(self.t.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.t.shape[0])

    def raw(self, a: int, b: int) -> torch.Tensor:
        """Stored bytes of rows a..b-1 as a new [b - a, row bytes] uint8 tensor."""
        data = np.asarray(self.t.data).view(np.uint8).reshape(self.rows, -1)
        rows = data[a:b] if self.index is None else data[self.index[a:b].numpy()]
        return torch.from_numpy(np.array(rows))

    def dense(self, a: int, b: int) -> torch.Tensor:
        return decode_rows(self.raw(a, b), self.kind, self.cols)


def _stacked(parts: list[_Source], a: int, b: int, read: Callable[[_Source, int, int], torch.Tensor]
             ) -> torch.Tensor:
    """Rows a..b-1 of the matrix that stacks ``parts``' rows (q|k|v, gate|up), each part's rows by ``read``."""
    pieces, off = [], 0
    for p in parts:
        lo, hi = max(a, off), min(b, off + p.rows)
        if lo < hi:
            pieces.append(read(p, lo - off, hi - off))
        off += p.rows
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _pack(parts: list[_Source], fmt: str, own_kinds: frozenset[str] = frozenset(OWN_FORMAT)) -> torch.Tensor:
    """The matrix stacking ``parts`` packed as ``fmt``: as stored when every part is in ``fmt``'s blocks (no
    rounding), or in one of ``own_kinds`` (a type with a kernel format of its own, ``OWN_FORMAT``, computed as
    stored), else decoded and rounded once. In one pass of the C++ repack (``kernels/repack.py``) where it builds;
    else in torch a chunk of rows at a time, into the result: the packed layout is local to groups of 16 rows, so
    chunks concatenate, and no copy of the whole matrix other than the result is ever made. Both give the same
    bytes."""
    n = sum(p.rows for p in parts)
    out: Optional[torch.Tensor] = None
    as_stored = all(STORED_AS.get(p.kind) == fmt for p in parts)
    kinds = {p.kind for p in parts}
    kind = next(iter(kinds))
    own = _OWN_PACKERS.get(kind) if len(kinds) == 1 and kind in own_kinds else None  # as stored whatever ``fmt``
    # one pass in C++ where it builds (the same bytes as below)
    stored = [(p.kind, np.asarray(p.t.data).view(np.uint8).reshape(p.rows, -1), p.index) for p in parts]
    if own is not None or as_stored:
        moved = repack(stored, parts[0].cols)
    elif fmt == "int8" and kinds <= DECODABLE and parts[0].cols % 32 == 0:
        moved = round_int8(stored, parts[0].cols)
    else:
        moved = None
    if moved is not None:
        return moved
    for a in range(0, n, _CHUNK_ROWS):
        b = min(n, a + _CHUNK_ROWS)
        if own is not None:
            chunk = own(_stacked(parts, a, b, _Source.raw))
        elif as_stored:
            chunk = pack_gguf(_stacked(parts, a, b, _Source.raw), fmt)
        else:
            chunk = quantize(_stacked(parts, a, b, _Source.dense), fmt)
        if out is None:
            out = torch.empty(n, chunk.shape[1], dtype=chunk.dtype)
        out[a:b] = chunk
        del chunk
        _return_freed_memory()
    assert out is not None
    return out


def _sources(ckpt: GGUFCheckpoint, tensors: list[_Tensor], cfg: ModelConfig) -> dict[str, _Source]:
    """Every tensor of the file by its Hugging Face name, rows in transformers' order."""
    arch = ckpt.meta["general.architecture"]
    heads = {"q_proj": cfg.n_heads, "k_proj": cfg.n_kv_heads}
    sources: dict[str, _Source] = {}
    for t in tensors:
        if t.name == "rope_freqs.weight":
            continue
        name = _hf_name(t.name, ckpt.path)
        n_heads = heads.get(name.split(".")[-2]) if arch in _PERMUTED else None
        src = _Source(t, None)
        sources[name] = _Source(t, _unpermute_index(src.rows, n_heads)) if n_heads is not None else src
    return sources


def pack_layers(path: Path, cfg: ModelConfig, fmt: str) -> dict[str, torch.Tensor]:
    """The first ``cfg.n_layers`` layers' matrices (our names) and the output matrix ("head") of a GGUF file
    packed as ``fmt``, straight from the file (a quantized copy of a model that is itself packed)."""
    ckpt, tensors = read_gguf(path)
    sources = _sources(ckpt, tensors, cfg)
    out = {ours: _pack([sources[p] for p in parts], fmt) for ours, parts in llama_fused_names(cfg.n_layers).items()}
    out["head"] = _pack([sources["model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]], fmt)
    return out


def _v_apart(parts: list[_Source], fmt: str) -> bool:
    """Whether q|k|v's parts are q and k of one type, v of another, each computed as stored (a K-quant file's
    layers whose v is Q6_K): held as one matrix they would be rounded to ``fmt``."""
    def as_stored(kind: str) -> bool:
        return kind in OWN_FORMAT or STORED_AS.get(kind) == fmt

    kinds = [p.kind for p in parts]
    return len(kinds) == 3 and kinds[0] == kinds[1] != kinds[2] and as_stored(kinds[0]) and as_stored(kinds[2])


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Why: each matrix leaves freed chunk buffers behind, and glibc, having seen large frees, serves later
    allocations from its heap between live tensors instead of fresh mappings; without a trim those holes
    stayed resident, 250 MB of a 1.7B model's 1.6 GB peak."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else False
            _libc = lib if lib and hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc: Any = None


def read_packed(ckpt: GGUFCheckpoint, tensors: list[_Tensor], cfg: ModelConfig, fmt: str,
                cache: bool = False) -> PackedWeights:
    """The file's weights in their runtime form, tensor by tensor (``PackedWeights``).

    Layer matrices are packed as ``fmt`` (as stored where their blocks are ``fmt``'s); the output matrix is
    packed as stored when it is Q8_0/Q4_0 (whatever ``fmt``), else rounded to int8; the embedding table
    stays in its stored format and is decoded row by row when looked up, and when it is also the output
    matrix, packed as stored, one copy serves both. Norms and biases are small and dense. ``cache``: the
    packed matrices come from the packed-weights cache where it holds this file (``pack_cache.py``), and are
    kept there when it does not."""
    sources = _sources(ckpt, tensors, cfg)
    cached = open_cached(ckpt.path, fmt) if cache else None
    writer = CacheWriter(ckpt.path, fmt) if cache and cached is None else None

    def pack(name: str, stack: list[_Source], as_fmt: str, own: frozenset[str] = frozenset(OWN_FORMAT)
             ) -> torch.Tensor:
        if cached is not None and name in cached.names():
            return cached.get(name)
        packed = _pack(stack, as_fmt, own)
        return writer.keep(name, packed) if writer is not None else packed  # the file's pages, once written

    fused = llama_fused_names(cfg.n_layers)
    matrices = {part for parts in fused.values() for part in parts}
    embed_name = "model.embed_tokens.weight"
    head_name = embed_name if cfg.tie_embeddings else "lm_head.weight"
    # norms, biases (and any small per-layer tensor) through the model's own name mapping; the matrices enter
    # it as empty stand-ins, since they are packed here
    small = {n: (torch.empty(0, 0) if n in matrices or n in (embed_name, head_name) else _dense(s.t))
             for n, s in sources.items()}
    converted = LlamaModel.convert_hf_state_dict(small, cfg)
    params = {n: v for n, v in converted.items() if n not in fused and n not in ("embed", "lm_head")}
    logical: dict[str, int] = {}
    for ours, parts in fused.items():
        srcs = [sources[p] for p in parts]
        # q|k|v whose v alone is of another type that the kernel computes as stored: v's rows held apart
        # (``LlamaBlock.wv``), so neither part is rounded
        stacks = [srcs[:-1], srcs[-1:]] if ours.endswith(".wqkv") and _v_apart(srcs, fmt) else [srcs]
        for name, stack in zip((ours, ours.removesuffix("wqkv") + "wv"), stacks):
            params[name] = pack(name, stack, fmt)
            logical[name] = sum(s.rows for s in stack) * stack[0].cols
        for s in srcs:
            s.t.release()
    head_src, emb = sources[head_name], sources[embed_name]
    # the head as stored where a kernel reads its type (whatever ``fmt``), else rounded to int8: the logits are
    # the most sensitive product, and 8 bits keep a 5-6-bit source's values to ~0.4% of its step
    stored = STORED_AS.get(head_src.kind) or (OWN_FORMAT[head_src.kind] if head_src.kind in _TABLE_OWN else None)
    head = pack("head", [head_src], stored or "int8", _TABLE_OWN)
    head_fmt = stored or "int8"
    tables: dict[str, StoredRows] = {}
    if cfg.tie_embeddings and stored is not None:  # one copy, packed as stored, serves both
        tables["embed"] = StoredRows(head_fmt, head, cfg.dim)
    else:
        tables["embed"] = StoredRows(emb.kind, emb.raw(0, emb.rows), cfg.dim)
    if not cfg.tie_embeddings:
        tables["lm_head"] = StoredRows(head_fmt, head, cfg.dim)
        params["lm_head"] = head
    params["embed"] = tables["embed"].data
    head_src.t.release()
    emb.t.release()
    logical.update({name: cfg.vocab_size * cfg.dim for name in tables})
    if writer is not None:
        writer.finish()
    return PackedWeights(fmt, params, tables, head, logical)


def load_gguf_model(path: Path, device: str, dtype: str | torch.dtype, weight_dtype: str | torch.dtype | None, *,
                    fast: bool, matmul: str, pack_cache: bool = False) -> Any:
    """``load_model`` for a GGUF file (see the module docstring for what happens to each tensor type).

    ``weight_dtype`` "auto" (the default) keeps Q8_0/Q4_0 files in int8/int4 as stored, holds other block
    types in int8 (``GGUFCheckpoint.default_weight_format``) and dense files as ``load_model`` would.
    ``pack_cache``: map the packed weights from (and keep them in) the packed-weights cache."""
    ckpt, tensors = read_gguf(path)
    cfg = ModelConfig.from_hf(ckpt.hf_config)
    if weight_dtype in (None, "auto") and torch.device(device).type == "cpu":
        weight_dtype = ckpt.default_weight_format() or weight_dtype
    fmt = weight_dtype if isinstance(weight_dtype, str) and weight_dtype in QUANT_FORMATS else None
    tokenizer = tokenizer_from_gguf(ckpt.meta)
    if fmt is not None and torch.device(device).type == "cpu" and cfg.family == "llama":
        weights = read_packed(ckpt, tensors, cfg, fmt, pack_cache)
        model = assemble_packed(cfg, weights, str(path), tokenizer, ckpt.eos_ids, dtype, fast=fast, matmul=matmul)
        return _with_chat_tokens(model, ckpt)
    dense, blocks = load_tensors(ckpt, tensors, fmt)
    packed: dict[str, torch.Tensor] = {}
    if fmt is not None:
        fused = fuse_blocks({n: b for n, b in blocks.items() if b.fmt == fmt}, llama_fused_names(cfg.n_layers))
        packed = {name: pack_blocks(b.q, b.d, fmt) for name, b in fused.items()}
        head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        if head in blocks:  # in its own block type: llama.cpp's Q4_0 files keep a Q8_0 output matrix
            packed["head"] = pack_blocks(blocks[head].q, blocks[head].d, blocks[head].fmt)
    model = assemble_model(cfg, dense, str(path), tokenizer, ckpt.eos_ids, device, dtype,
                           weight_dtype, fast=fast, matmul=matmul, packed=packed)
    return _with_chat_tokens(model, ckpt)


def _with_chat_tokens(model: Any, ckpt: GGUFCheckpoint) -> Any:
    model.chat_template = ckpt.chat_template
    model.bos_token = ckpt.token_text("tokenizer.ggml.bos_token_id")
    model.eos_token = ckpt.token_text("tokenizer.ggml.eos_token_id")
    scores = ckpt.meta.get("tokenizer.ggml.scores")
    if isinstance(scores, list) and len(set(scores[:1000])) > 1:  # BPE files write none, or all zeros
        model.token_scores = torch.tensor(scores, dtype=torch.float32)
    return model
