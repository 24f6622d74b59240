"""A cached inference pass of the Llama-family layers in few operators: what a GPU runs when nothing is captured.

Why: on a GPU a small model's step is bound by the host, each ``aten::`` operator being a kernel launch and some
Python (``bench ops`` counts them on the CPU's eager path, which runs the same operators). ``LlamaBlock.forward``
is written for training (autograd, no cache); a pass over a cache needs none of that, so here:

- activations stay [rows, dim], projections are ``mm`` on transposed weight views made once per module, and each
  residual add is the ``addmm`` of the projection that feeds it (one rounding instead of two);
- RMSNorm: the inverse RMS from an fp32 vector norm (``addcmul``, ``rsqrt_``), rounded once into a buffer of the
  compute dtype, then two multiplies: 10 events against ~23 for transformers' widen / square / mean / narrow chain;
- RoPE on the q and k heads together, in place in the q|k|v product: rotate-half is a flip of the two halves, its
  minus folded into a signed sin table made once per pass;
- the pass's mask additive (0 / -inf) in the compute dtype, made once per pass (SDPA converts a bool mask in
  every layer), and keys and values written together by one ``index_copy_`` (``KVCache.write_pair``).

Every op is row by row, or under fixed rows one shape whatever the pass holds: batch-invariant as before. The
numbers differ from the training layer's by rounding only (SmolLM2 in bf16: as close to fp32's logits as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch
import torch.nn.functional as F

from ..cache import AttentionMeta, KVCache
from ..kernels import EAGER, Kernels
from .config import ModelConfig


class Block(Protocol):
    """What the pass reads of a decoder block (``llama.LlamaBlock``; a protocol, so this module needs not import
    the one that calls it)."""

    @property
    def layer(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv(self) -> int: ...
    @property
    def hd(self) -> int: ...
    @property
    def ffn(self) -> int: ...
    @property
    def eps(self) -> float: ...
    @property
    def scale(self) -> Optional[float]: ...
    @property
    def sliding(self) -> bool: ...
    @property
    def gelu(self) -> bool: ...
    @property
    def kernels(self) -> Kernels: ...
    @property
    def wqkv(self) -> torch.Tensor: ...
    @property
    def bqkv(self) -> Optional[torch.Tensor]: ...
    @property
    def wv(self) -> Optional[torch.Tensor]: ...
    @property
    def wo(self) -> torch.Tensor: ...
    @property
    def w13(self) -> torch.Tensor: ...
    @property
    def w2(self) -> torch.Tensor: ...
    @property
    def attn_norm(self) -> torch.Tensor: ...
    @property
    def mlp_norm(self) -> torch.Tensor: ...
    @property
    def q_norm(self) -> Optional[torch.Tensor]: ...
    @property
    def k_norm(self) -> Optional[torch.Tensor]: ...
    @property
    def post_attn_norm(self) -> Optional[torch.Tensor]: ...
    @property
    def post_mlp_norm(self) -> Optional[torch.Tensor]: ...
    @property
    def _parameters(self) -> dict[str, Optional[torch.nn.Parameter]]: ...


class Stack(Protocol):
    """What the pass reads of the model (``llama.LlamaModel``)."""

    @property
    def cfg(self) -> ModelConfig: ...
    @property
    def kernels(self) -> Kernels: ...
    @property
    def norm(self) -> torch.Tensor: ...
    @property
    def rope_cos(self) -> torch.Tensor: ...
    @property
    def rope_sin(self) -> torch.Tensor: ...

    def local_rope(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def window_mask(self, positions: torch.Tensor, meta: Optional[AttentionMeta]) -> Optional[torch.Tensor]: ...


@dataclass
class Rope:
    """One RoPE base's tables for this pass's positions: [B, T, 1, 2, head_dim / 2] (the two halves) in the compute
    dtype, sin signed."""

    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class PassTables:
    """What every layer of one pass shares, made once per pass."""

    rope: Rope
    local: Rope  # the sliding layers' (Gemma 3: their own base); else ``rope``
    mask: Optional[torch.Tensor]  # [B, 1, T, keys] additive, or None (one query over everything before it)
    local_mask: Optional[torch.Tensor]  # the sliding layers' (their window), else ``mask``
    eps: torch.Tensor  # the norms' epsilon, a 0-d fp32 tensor
    scale: torch.Tensor  # [B·T, 1] in the compute dtype: each norm's inverse RMS, rounded once (``norm``)


@dataclass
class _Weights:
    """A block's projections as the pass runs them: transposed views for ``mm`` (None: the model's kernel takes the
    weight as stored), and what they were made from."""

    key: tuple  # whether the kernels are eager, and each weight's identity and storage
    qkv: Optional[torch.Tensor]
    o: Optional[torch.Tensor]
    gate_up: Optional[torch.Tensor]
    down: Optional[torch.Tensor]


def rope_tables(model: Stack, local: bool, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
    """Rows ``positions`` ([B, T]) of the model's RoPE tables (``local``: the sliding layers' base) in ``dtype``,
    with rotate-half's minus on the first half of sin. The whole tables are converted once and kept on the
    module (made again if its fp32 tables were replaced, e.g. moved to another device)."""
    cos_table, sin_table = model.local_rope() if local else (model.rope_cos, model.rope_sin)
    kept: dict[tuple[bool, torch.dtype], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    kept = model.__dict__.setdefault("_eager_rope", {})
    entry = kept.get((local, dtype))
    if entry is None or entry[0] is not cos_table:
        sin = sin_table.to(dtype, copy=True)
        sin[:, : sin.shape[1] // 2].neg_()
        entry = (cos_table, cos_table.to(dtype), sin)
        kept[(local, dtype)] = entry
    b, t = positions.shape
    flat = positions.reshape(-1)
    cos, sin = (table.index_select(0, flat).view(b, t, 1, 2, -1) for table in entry[1:])
    return Rope(cos, sin)


def additive(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A bool mask (True = attend) as 0 / -inf in ``dtype``, SDPA's own conversion done once per pass."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))


def norm(x: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, scale: Optional[torch.Tensor] = None,
         out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RMSNorm of the last dimension: the inverse RMS in fp32 (``eps`` a 0-d fp32 tensor), rounded once to ``x``'s
    dtype (into ``scale``, a buffer of its shape, where given: one op, where a cast takes three), then two
    multiplies in ``x``'s dtype (``out``: the second writes there, a view such as a q|k|v product's q heads).
    Computing the inverse in the narrow dtype saves five ops but doubled bf16's error on SmolLM2's logits."""
    ss = torch.linalg.vector_norm(x, 2, -1, True, dtype=torch.float32)
    inv = torch.addcmul(eps, ss, ss, value=1.0 / x.shape[-1]).rsqrt_()
    if inv.dtype != x.dtype:
        inv = scale.copy_(inv) if scale is not None and scale.shape == inv.shape else inv.to(x.dtype)
    return torch.mul(x * inv, weight, out=out) if out is not None else (x * inv).mul_(weight)


def _view(x: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """A view of contiguous ``x`` in one op, where slicing and transposing would take two to six (each a host
    dispatch on a GPU)."""
    return x.as_strided(size, stride, x.storage_offset() + offset)


def project_qkv(linear: Callable[..., torch.Tensor], h: torch.Tensor, wqkv: torch.Tensor,
                bqkv: Optional[torch.Tensor], wv: Optional[torch.Tensor]) -> torch.Tensor:
    """q|k|v of ``h``: one product, or, where v's rows are held apart (``wv``: a K-quant file keeps some layers'
    v in Q6_K, computed as stored beside q|k's Q4_K), two products joined; the bias is added after the join, the
    same one fp32 addition the kernel makes."""
    if wv is None:
        return linear(h, wqkv, bqkv)
    out = torch.cat([linear(h, wqkv), linear(h, wv)], dim=-1)
    return out if bqkv is None else out.add_(bqkv)


def _weights(block: Block) -> _Weights:
    """The block's transposed views, made again when a weight or its storage changed (``param.data = ...``, a move
    to another device) or other kernels were installed: a check of four pointers per layer."""
    params = block._parameters
    eager = block.kernels is EAGER
    key = (eager, *(_where(params[n]) for n in _PROJECTIONS))
    w: Optional[_Weights] = block.__dict__.get("_eager_pass")
    if w is None or w.key != key:
        w = _Weights(key, *(_transposed(params[n]) if eager else None for n in _PROJECTIONS))
        block.__dict__["_eager_pass"] = w
    return w


_PROJECTIONS = ("wqkv", "wo", "w13", "w2")


def _where(p: Optional[torch.Tensor]) -> tuple[int, int]:
    return (id(p), p.data_ptr() if p is not None else 0)


def _transposed(p: Optional[torch.Tensor]) -> torch.Tensor:
    assert p is not None  # a block always has its four projections
    return p.t()


def _project(block: Block, x: torch.Tensor, weight: torch.Tensor, t: Optional[torch.Tensor],
             bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    if t is None:
        return block.kernels.linear(x, weight, bias)
    return torch.mm(x, t) if bias is None else torch.addmm(bias, x, t)


def _residual(block: Block, x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor,
              t: Optional[torch.Tensor], post: Optional[torch.Tensor], tables: PassTables) -> torch.Tensor:
    """x + a·Wᵀ, with the output normed first where the model has a sandwich norm (Gemma 3)."""
    if post is None and t is not None:
        return torch.addmm(x, a, t)
    out = _project(block, a, weight, t)
    if post is not None:
        out = norm(out, post, tables.eps, tables.scale)
    return x + out


def block_pass(block: Block, x: torch.Tensor, shape: tuple[int, int], tables: PassTables,
               meta: AttentionMeta, cache: KVCache) -> torch.Tensor:
    """One decoder block over the residual stream ``x`` ([B·T, dim]) on ``cache``; a new tensor (never in place:
    a captured layer state stays as it was)."""
    b, t = shape
    w = _weights(block)
    n_h, n_kv, hd, eps = block.n_heads, block.n_kv, block.hd, tables.eps
    h = norm(x, block.attn_norm, eps, tables.scale)
    if block.wv is None:
        qkv = _project(block, h, block.wqkv, w.qkv, block.bqkv)
    else:  # v held apart (a K-quant file's Q6_K v): the model's kernel joins the two products
        qkv = project_qkv(block.kernels.linear, h, block.wqkv, block.bqkv, block.wv)
    qkv = qkv.contiguous()  # a new product: already so (the views below assume it)
    width = qkv.shape[1]
    if block.q_norm is not None and block.k_norm is not None:  # Qwen 3 / Gemma 3: each q and k head, before RoPE
        heads = qkv.view(b, t, n_h + 2 * n_kv, hd)
        norm(heads[:, :, :n_h], block.q_norm, eps, out=heads[:, :, :n_h])
        norm(heads[:, :, n_h : n_h + n_kv], block.k_norm, eps, out=heads[:, :, n_h : n_h + n_kv])
    rope, hk = tables.local if block.sliding else tables.rope, n_h + n_kv
    # q and k heads as their two halves, [B, T, heads, 2, hd / 2]: rotate-half is a flip of that axis
    qk = _view(qkv, (b, t, hk, 2, hd // 2), (t * width, width, hd, hd // 2, 1), 0)
    torch.addcmul(qk.flip(-2).mul_(rope.sin), qk, rope.cos, out=qk)
    # k and v heads of the real rows, [2, B, kv_heads, rows, hd]
    kv = _view(qkv, (2, b, n_kv, meta.n_new, hd), (n_kv * hd, t * width, hd, width, 1), n_h * hd)
    if not cache.write_pair(block.layer, kv, meta):
        heads = qkv.view(b, t, n_h + 2 * n_kv, hd)
        cache.update(block.layer, heads[:, :, n_h : n_h + n_kv].transpose(1, 2),
                     heads[:, :, n_h + n_kv :].transpose(1, 2), meta)
    keys, values = cache.views(block.layer, meta, x.dtype)
    q = _view(qkv, (b, n_h, t, hd), (t * width, hd, width, 1), 0)
    mask = tables.local_mask if block.sliding else tables.mask
    attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=block.scale, enable_gqa=n_kv != n_h)
    if attn.stride() == (t * n_h * hd, hd, n_h * hd, 1):  # [B, H, T, hd] laid out as [B, T, H, hd] (CPU flash)
        attn = _view(attn, (b * t, n_h * hd), (n_h * hd, 1), 0)
    else:
        attn = attn.transpose(1, 2).reshape(b * t, n_h * hd)
    x = _residual(block, x, attn, block.wo, w.o, block.post_attn_norm, tables)
    h = norm(x, block.mlp_norm, eps, tables.scale)
    gate_up = _project(block, h, block.w13, w.gate_up).contiguous()
    ffn = block.ffn
    gate, up = _view(gate_up, (b * t, ffn), (2 * ffn, 1), 0), _view(gate_up, (b * t, ffn), (2 * ffn, 1), ffn)
    act = F.gelu(gate, approximate="tanh").mul_(up) if block.gelu else F.silu(gate).mul_(up)
    return _residual(block, x, act, block.w2, w.down, block.post_mlp_norm, tables)


def layers_pass(model: Stack, run: Sequence[Block], x: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMeta, cache: KVCache, last_only: bool) -> torch.Tensor:
    """The blocks ``run`` over embeddings ``x`` ([B, T, dim]) on ``cache``, then the final norm: [B, T or 1, dim]
    (``meta.layer_states`` filled where ``meta.capture`` asks)."""
    b, t, d = x.shape
    dtype = x.dtype
    rope = rope_tables(model, False, positions, dtype)
    mask = additive(meta.mask, dtype)
    local, local_mask = rope, mask
    if model.cfg.sliding_layers:
        if model.cfg.rope_local_theta is not None:
            local = rope_tables(model, True, positions, dtype)
        window = model.window_mask(positions, meta)
        local_mask = additive(window, dtype) if window is not None else mask
    eps = torch.full((), model.cfg.norm_eps, dtype=torch.float32, device=x.device)
    tables = PassTables(rope, local, mask, local_mask, eps, torch.empty(b * t, 1, dtype=dtype, device=x.device))
    capture = meta.capture
    states: dict[int, torch.Tensor] = {}
    h = x.reshape(b * t, d)
    for block in run:
        h = block_pass(block, h, (b, t), tables, meta, cache)
        if capture and block.layer in capture:
            state = h.view(b, t, d)
            states[block.layer] = state[:, -1:] if last_only else state
    if capture:
        meta.layer_states = states
    if last_only:
        return norm(h.view(b, t, d)[:, -1:], model.norm, eps)
    return norm(h, model.norm, eps, tables.scale).view(b, t, d)


def head_pass(model: Stack, x: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Logits of the final normed states ``x`` [B, T, dim] through ``head`` [V, dim] (``mm`` on its transposed
    view where the model runs eager kernels)."""
    if model.kernels is not EAGER:
        return model.kernels.linear(x, head)
    b, t, d = x.shape
    return torch.mm(x.reshape(b * t, d), head.t()).view(b, t, -1)
