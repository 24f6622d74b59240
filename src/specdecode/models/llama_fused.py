"""The Llama family's forward on the fused CPU ops (``kernels/decode_ops.cpp``): the plain Llama block's whole
stack (``forward_fused``, from what ``fused_plan`` gathers once), and the blocks that call does not implement
(Qwen 3's and Gemma 3's) layer by layer or as one stack of their own (``forward_blocks``). ``LlamaModel.forward``
picks; every op here is row by row, so a row's logits never depend on the pass's width (speculation stays exact)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..cache import AttentionMeta, KVCache
from .eager_pass import Block, Stack, project_qkv
from .tables import StoredRows


class FusedModel(Stack, Protocol):
    """What the fused passes read of the model (``llama.LlamaModel``; a protocol, so this module needs not import
    the one that calls it): ``eager_pass.Stack`` and the parameters, tables and RoPE buffers themselves."""

    rope_local_cos: torch.Tensor  # moved to the CPU here where the loader left them elsewhere
    rope_local_sin: torch.Tensor

    @property
    def embed(self) -> torch.Tensor: ...
    @property
    def lm_head(self) -> Optional[torch.Tensor]: ...
    @property
    def layers(self) -> nn.ModuleList: ...
    @property
    def tables(self) -> dict[str, StoredRows]: ...
    @property
    def _parameters(self) -> dict[str, Optional[nn.Parameter]]: ...
    @property
    def _buffers(self) -> dict[str, Optional[torch.Tensor]]: ...

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def output_matrix(self) -> torch.Tensor: ...


@dataclass
class FusedPlan:
    """A Llama module's tensors as the fused forward uses them (see ``fused_plan``)."""

    layers: list[tuple]  # (wqkv, bqkv, wo, w13, w2, mlp_norm, wv, next norm) per layer
    attn_norms: list[torch.Tensor]
    embed: torch.Tensor
    lm_head: Optional[torch.Tensor]
    head: Optional[torch.Tensor]  # the output matrix (lm_head, or embed when tied); None when kept as stored
    norm: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    wqkv0: torch.Tensor  # the first layer's projection: its identity tells a reassigned weight
    stack: Optional[object] = None  # the C++ Stack, built on first use
    index: Optional[tuple[int, ...]] = None  # the module's layer numbers of ``layers`` (None: all, in order)
    # plans over layer subsets, keyed by (layers, identities of the extra blocks' weights)
    subsets: dict[tuple[tuple[int, ...], tuple[int, ...]], "FusedPlan"] = field(default_factory=dict)

    def subset(self, layers: tuple[int, ...], blocks: Sequence["Block"] = ()) -> "FusedPlan":
        """The plan over some of the layers (a layer-skip draft), then ``blocks`` (an exit adapter's
        layers, each on its own cache layer ``block.layer``), built once per subset: each layer's
        residual add is fused into the norm of the next layer *run*, and the C++ Stack is made of the
        same weight tensors (no copy)."""
        key = (layers, tuple(id(b.wqkv) for b in blocks))  # a block's weights reassigned: a new plan
        sub = self.subsets.get(key)
        if sub is None:
            n = len(self.layers)
            if not layers or any(not 0 <= i < n for i in layers) or list(layers) != sorted(set(layers)):
                raise ValueError(f"layers must be distinct increasing layer numbers in 0..{n - 1}, got {list(layers)}")
            if any(b.layer < n for b in blocks):
                raise ValueError(
                    f"extra blocks need cache layers after the model's {n}, got {[b.layer for b in blocks]}")
            norms = [self.attn_norms[i] for i in layers] + [b.attn_norm for b in blocks]
            own = ([self.layers[i][:7] for i in layers]
                   + [(b.wqkv, b.bqkv, b.wo, b.w13, b.w2, b.mlp_norm, b.wv) for b in blocks])
            per_layer = [cols + (nxt,) for cols, nxt in zip(own, norms[1:] + [self.norm])]
            sub = FusedPlan(per_layer, norms, self.embed, self.lm_head, self.head, self.norm, self.rope_cos,
                            self.rope_sin, self.wqkv0, index=layers + tuple(b.layer for b in blocks))
            self.subsets[key] = sub
        return sub



def fused_plan(model: FusedModel) -> FusedPlan:
    """What a fused forward reads from the module, gathered once: nn.Module attribute lookups
    cost ~1 µs each, a measurable share of a small draft's ~70 µs step. Rebuilt when a weight
    was reassigned (an identity check per call; in-place updates need nothing)."""
    plan: Optional[FusedPlan] = model.__dict__.get("_plan")
    params, first = model._parameters, model.layers._modules["0"]._parameters
    if (plan is None or first["wqkv"] is not plan.wqkv0 or params["embed"] is not plan.embed
            or params["norm"] is not plan.norm or params.get("lm_head") is not plan.lm_head
            or model._buffers["rope_cos"] is not plan.rope_cos):
        layers = cast("list[Block]", list(model.layers))
        nexts = [layer.attn_norm for layer in layers[1:]] + [model.norm]
        per_layer = [(lay.wqkv, lay.bqkv, lay.wo, lay.w13, lay.w2, lay.mlp_norm, lay.wv, nxt)
                     for lay, nxt in zip(layers, nexts)]
        stored = ("embed" if model.lm_head is None else "lm_head") in model.tables
        plan = FusedPlan(per_layer, [lay.attn_norm for lay in layers], model.embed, model.lm_head,
                         None if stored else model.output_matrix(), model.norm, model.rope_cos, model.rope_sin,
                         layers[0].wqkv)
        model.__dict__["_plan"] = plan
    return plan


def fused_head(plan: FusedPlan, head: Optional[torch.Tensor]) -> torch.Tensor:
    """The output matrix a fused pass multiplies by: ``head`` where given (a draft's cut), else the plan's."""
    if head is not None:
        return head
    if plan.head is None:  # a model with a stored table multiplies by its packed copy (``Model.run``)
        raise ValueError("this model keeps its output matrix as stored: pass head (Model.run does)")
    return plan.head


def forward_fused(model: FusedModel, ext: Any, plan: FusedPlan, tokens: torch.Tensor, meta: AttentionMeta,
                  cache: KVCache, last_only: bool, head: torch.Tensor) -> torch.Tensor:
    """The same layer math with the fused CPU ops (``kernels/decode_ops.cpp``): per layer four
    projections plus three ops, each residual add fused into the norm that follows it; the whole
    stack in one C++ call when the installed linear is one C++ can call (else a Python loop)."""
    cfg, linear = model.cfg, model.kernels.linear
    eps, hd = cfg.norm_eps, cfg.head_dim
    scale = 1.0 / math.sqrt(hd)
    row0 = meta.rows.indices(cache.batch_size)[0]
    if "embed" in model.tables:
        x = model.tables["embed"].rows(tokens)
    elif plan.embed.dtype in (torch.float32, torch.bfloat16):
        x = ext.embed(tokens, plan.embed)  # a new fp32 tensor, updated in place below
    else:
        x = F.embedding(tokens, plan.embed).to(torch.float32)
    native = model.kernels.native
    # a tree (ancestor mask, at most 64 new tokens) and explicit positions go to the C++ attention
    # as they are; with a tree and no positions it derives start + depth itself
    tree, positions, capture = meta.tree, meta.explicit_positions, meta.capture
    index = plan.index
    if native is not None:  # the whole stack in one C++ call
        if plan.stack is None:
            cols = [list(col) for col in zip(*plan.layers)]
            plan.stack = ext.Stack(*cols[:5], plan.attn_norms, cols[5], plan.norm, cols[6])
        k_layers, v_layers = cache.k_layers(), cache.v_layers()
        if index is not None:  # a layer subset: its own layers' caches, in the stack's order
            k_layers, v_layers = [k_layers[i] for i in index], [v_layers[i] for i in index]
        if capture is not None:
            at = list(capture) if index is None else [index.index(c) for c in capture if c in index]
            h, states = ext.stack_forward_states(
                plan.stack, x, plan.rope_cos, plan.rope_sin, k_layers, v_layers, row0,
                meta.starts, cfg.n_heads, cfg.n_kv_heads, hd, eps, scale, last_only, native[0], native[1],
                positions, tree, at)
            names = capture if index is None else [index[a] for a in at]
            meta.hidden, meta.layer_states = h, dict(zip(names, states))
        elif tree is None and positions is None:  # the hot path: exactly the causal call
            h = ext.stack_forward(plan.stack, x, plan.rope_cos, plan.rope_sin, k_layers, v_layers, row0,
                                  meta.starts, cfg.n_heads, cfg.n_kv_heads, hd, eps, scale, last_only,
                                  native[0], native[1])
        else:
            h = ext.stack_forward(plan.stack, x, plan.rope_cos, plan.rope_sin, k_layers, v_layers, row0,
                                  meta.starts, cfg.n_heads, cfg.n_kv_heads, hd, eps, scale, last_only,
                                  native[0], native[1], positions, tree)
        return linear(h, head)
    h = ext.rms_norm(x, plan.attn_norms[0], eps)
    last = len(plan.layers) - 1
    states = {}
    for i, (wqkv, bqkv, wo, w13, w2, mlp_norm, wv, next_norm) in enumerate(plan.layers):
        n = i if index is None else index[i]  # the module's layer number (its cache layer)
        qkv = project_qkv(linear, h, wqkv, bqkv, wv)
        attn = ext.attention(qkv, plan.rope_cos, plan.rope_sin, cache.k_layer(n), cache.v_layer(n), row0,
                             meta.starts, cfg.n_heads, cfg.n_kv_heads, hd, scale, positions, tree)
        h = ext.add_rms_norm_(x, linear(attn, wo), mlp_norm, eps)
        down = linear(ext.silu_mul(linear(h, w13)), w2)
        if i < last or not last_only:
            h = ext.add_rms_norm_(x, down, next_norm, eps)
        else:
            x.add_(down)
            h = ext.rms_norm(x[:, -1:].contiguous(), plan.norm, eps)
        if capture and n in capture:  # x is updated in place: copy
            states[n] = (x[:, -1:] if last_only else x).clone()
    if capture is not None:
        meta.hidden, meta.layer_states = h, states
    return linear(h, head)


def forward_blocks(model: FusedModel, ext: Any, run: Sequence[Block], tokens: torch.Tensor, meta: AttentionMeta,
                   cache: KVCache, last_only: bool, head: torch.Tensor) -> torch.Tensor:
    """Blocks the whole-stack C++ call does not implement (Qwen 3's and Gemma 3's), layer by layer on the
    fused CPU ops: the small-M linear and the C++ attention, which sums each query's keys one by one
    (with Gemma's sliding window as a first key). Why not the eager layer: torch's SDPA does not promise
    a row the same bits whatever the pass's width, and then verifying a draft can flip a near-tie that
    plain decoding would not (a greedy Gemma 3 answer changed under layer skip). Here, as on the plain
    Llama path, every op is row by row, so speculation is exact."""
    cfg, linear = model.cfg, model.kernels.linear
    eps, hd, n_h, n_kv = cfg.norm_eps, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(hd)
    row0 = meta.rows.indices(cache.batch_size)[0]
    x = model.embed_rows(tokens).to(torch.float32)
    if cfg.embed_scale != 1.0:  # as the eager path: a multiply in the activation dtype
        x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype)
    x = x.contiguous()  # the residual stream, updated in place below
    if cfg.rope_local_theta is not None and model.rope_local_cos.device != model.rope_cos.device:
        model.rope_local_cos, model.rope_local_sin = model.rope_local_cos.cpu(), model.rope_local_sin.cpu()
    capture, states = meta.capture, {}
    native = model.kernels.native
    if native is not None and not capture:  # the same ops in one C++ call (decode_ops.cpp blocks_forward)
        own = cfg.rope_local_theta is not None  # sliding layers with a RoPE base of their own
        local_cos = model.rope_local_cos if own else model.rope_cos
        local_sin = model.rope_local_sin if own else model.rope_sin
        h = ext.blocks_forward(_block_stack(model, ext, run), x, model.rope_cos, model.rope_sin, local_cos, local_sin,
                               [cache.k_layer(b.layer) for b in run], [cache.v_layer(b.layer) for b in run],
                               row0, meta.starts, n_h, n_kv, hd, eps, scale, last_only, native[0], native[1],
                               meta.explicit_positions, meta.tree)
        if capture is not None:
            meta.hidden, meta.layer_states = h, {}
        return linear(h, head)
    h = ext.rms_norm(x, run[0].attn_norm, eps)
    for i, block in enumerate(run):
        qkv = project_qkv(linear, h, block.wqkv, block.bqkv, block.wv)
        if block.q_norm is not None and block.k_norm is not None:  # each q and k head, before RoPE
            heads = qkv.view(*qkv.shape[:2], n_h + 2 * n_kv, hd)
            heads[:, :, :n_h] = ext.rms_norm(heads[:, :, :n_h].contiguous(), block.q_norm, eps)
            heads[:, :, n_h:n_h + n_kv] = ext.rms_norm(heads[:, :, n_h:n_h + n_kv].contiguous(), block.k_norm, eps)
        local = block.sliding and cfg.rope_local_theta is not None
        cos, sin = (model.rope_local_cos, model.rope_local_sin) if local else (model.rope_cos, model.rope_sin)
        window = (cfg.sliding_window or 0) if block.sliding else 0
        attn = ext.attention(qkv, cos, sin, cache.k_layer(block.layer), cache.v_layer(block.layer), row0,
                             meta.starts, n_h, n_kv, hd, scale, meta.explicit_positions, meta.tree, window)
        out = linear(attn, block.wo)
        if block.post_attn_norm is not None:
            out = ext.rms_norm(out, block.post_attn_norm, eps)
        h = ext.add_rms_norm_(x, out, block.mlp_norm, eps)
        gate_up = linear(h, block.w13)
        if block.gelu:
            act = F.gelu(gate_up[..., :block.ffn], approximate="tanh") * gate_up[..., block.ffn:]
        else:
            act = ext.silu_mul(gate_up)
        down = linear(act, block.w2)
        if block.post_mlp_norm is not None:
            down = ext.rms_norm(down, block.post_mlp_norm, eps)
        if i + 1 < len(run):
            h = ext.add_rms_norm_(x, down, run[i + 1].attn_norm, eps)
        else:
            x.add_(down)
        if capture and block.layer in capture:  # x is updated in place: copy
            states[block.layer] = (x[:, -1:] if last_only else x).clone()
    h = ext.rms_norm((x[:, -1:] if last_only else x).contiguous(), model.norm, eps)
    if capture is not None:
        meta.hidden, meta.layer_states = h, states
    return linear(h, head)


def _block_stack(model: FusedModel, ext: Any, run: Sequence[Block]) -> object:
    """The C++ BlockStack of these blocks, built once per run of layers (a reassigned weight: a new one)."""
    cfg = model.cfg
    key = tuple((id(b), id(b.wqkv), id(b.w13)) for b in run)
    stacks = model.__dict__.setdefault("_block_stacks", {})
    if key not in stacks:
        cols = [[b.wqkv for b in run], [b.bqkv for b in run], [b.wo for b in run], [b.w13 for b in run],
                [b.w2 for b in run], [b.attn_norm for b in run], [b.mlp_norm for b in run], [b.wv for b in run],
                [b.q_norm for b in run], [b.k_norm for b in run], [b.post_attn_norm for b in run],
                [b.post_mlp_norm for b in run]]
        stacks[key] = ext.BlockStack(
            cols, model.norm, [(cfg.sliding_window or 0) if b.sliding else 0 for b in run],
            [b.sliding and cfg.rope_local_theta is not None for b in run], [b.gelu for b in run])
    return stacks[key]
