"""A GGUF file into the runtime: each matrix from the memory-mapped file to the kernels' packed form, tensor by
tensor (``read_packed``; the embedding table kept in its stored format), or through dense tensors
(``load_tensors``) where the model runs dense; ``load_gguf_model`` picks."""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..kernels.quant import QUANT_FORMATS, pack_b32, pack_blocks, pack_gguf, pack_q4k, pack_q5k, pack_q6k, quantize
from ..kernels.quant_b32 import B32_FORMATS
from ..kernels.repack import DECODABLE, repack, round_int8
from .assemble import PackedWeights, assemble_model, assemble_packed
from .config import ModelConfig
from .gguf import (PERMUTED, TABLE_OWN, OWN_FORMAT, STORED_AS, GGUFCheckpoint, dense_tensor, fuse_blocks, hf_name,
                   llama_fused_names, load_tensors, read_gguf, unpermute_index)
from .gguf_file import GGUFTensor
from .gguf_tokenizer import tokenizer_from_gguf
from .llama import LlamaModel
from .pack_cache import CacheWriter, open_cached
from .tables import StoredRows, decode_rows


_OWN_PACKERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_K": pack_q4k, "Q5_K": pack_q5k, "Q6_K": pack_q6k,
    **{k: partial(pack_b32, fmt=f) for k, f in OWN_FORMAT.items() if f in B32_FORMATS}}
_CHUNK_ROWS = 1024  # rows decoded at a time when a matrix is rounded: a multiple of the packed layout's 16-row groups


@dataclass
class _Source:
    """One GGUF tensor as the rows of its Hugging Face tensor: the stored bytes of each row (still in the
    memory-mapped file), with llama.cpp's q/k row permutation undone by ``index``."""

    t: GGUFTensor
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


def _sources(ckpt: GGUFCheckpoint, tensors: list[GGUFTensor], cfg: ModelConfig) -> dict[str, _Source]:
    """Every tensor of the file by its Hugging Face name, rows in transformers' order."""
    arch = ckpt.meta["general.architecture"]
    heads = {"q_proj": cfg.n_heads, "k_proj": cfg.n_kv_heads}
    sources: dict[str, _Source] = {}
    for t in tensors:
        if t.name == "rope_freqs.weight":
            continue
        name = hf_name(t.name, ckpt.path)
        n_heads = heads.get(name.split(".")[-2]) if arch in PERMUTED else None
        src = _Source(t, None)
        sources[name] = _Source(t, unpermute_index(src.rows, n_heads)) if n_heads is not None else src
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


def read_packed(ckpt: GGUFCheckpoint, tensors: list[GGUFTensor], cfg: ModelConfig, fmt: str,
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
    small = {n: (torch.empty(0, 0) if n in matrices or n in (embed_name, head_name) else dense_tensor(s.t))
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
    stored = STORED_AS.get(head_src.kind) or (OWN_FORMAT[head_src.kind] if head_src.kind in TABLE_OWN else None)
    head = pack("head", [head_src], stored or "int8", TABLE_OWN)
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
