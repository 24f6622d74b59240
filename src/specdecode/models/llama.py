"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, Gemma 3 text) in plain PyTorch, gpt-fast style.

q/k/v and gate/up projections are fused into one matrix each: fewer kernel
launches per layer, which is most of the cost of a small model on a CPU.
RoPE follows transformers' rotate-half convention so HF weights load as is.

Qwen 3 adds an RMSNorm on each q/k head; Gemma 3 adds that too, plus norms on the attention and MLP
outputs, a GELU gate, a scaled embedding, its own softmax scale, and sliding-window layers with their
own RoPE base (``ModelConfig``'s fields after ``eos_token_ids``). On the CPU every block runs on the fused
CPU ops (``llama_fused.py``: the plain Llama block's whole stack in one call, the others' blocks as a stack of
their own); elsewhere, the cached eager pass (``eager_pass.py``) or, without a cache, the layer below.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence, cast
import torch
import torch.nn.functional as F
from torch import nn

from ..cache import AttentionMeta, KVCache
from ..kernels import EAGER, Kernels
from ..ops import rms_norm
from . import eager_pass, llama_fused
from .eager_pass import project_qkv
from .config import ModelConfig
from .tables import StoredRows


# KV-cache storage dtypes the fused CPU attention reads (``decode_ops.cpp``); others run eager.
FUSED_KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """On the CPU even under a ``torch.device("meta")`` context: arithmetic on meta tensors first imports
    torch's symbolic-shape machinery (sympy, 800 modules: 1.1-1.3 s of every model load here)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device="cpu").float() / d))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by `factor`, blend in between.
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(cfg: ModelConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = rope_inv_freq(cfg)
    t = torch.arange(max_len, dtype=torch.float32, device="cpu")
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; cos/sin: [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    kernels: Kernels = EAGER  # set per loaded model (kernels.install_kernels)
    wv: Optional[nn.Parameter]  # v's rows when held in another format than q|k's (``project_qkv``); else None

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv_out = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.wqkv = nn.Parameter(torch.empty(qkv_out, cfg.dim))
        self.bqkv = nn.Parameter(torch.empty(qkv_out)) if cfg.qkv_bias else None
        self.register_parameter("wv", None)
        self.wo = nn.Parameter(torch.empty(cfg.dim, cfg.n_heads * cfg.head_dim))
        self.w13 = nn.Parameter(torch.empty(2 * cfg.intermediate_size, cfg.dim))
        self.w2 = nn.Parameter(torch.empty(cfg.dim, cfg.intermediate_size))
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.mlp_norm = nn.Parameter(torch.ones(cfg.dim))
        self.eps = cfg.norm_eps
        self.ffn = cfg.intermediate_size
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.post_attn_norm = nn.Parameter(torch.ones(cfg.dim)) if cfg.sandwich_norms else None
        self.post_mlp_norm = nn.Parameter(torch.ones(cfg.dim)) if cfg.sandwich_norms else None
        self.sliding = layer in cfg.sliding_layers  # its own RoPE base and, with a window, a window mask
        self.scale = cfg.attn_scale
        self.gelu = cfg.activation == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: Optional[AttentionMeta], cache: Optional[KVCache],
                window_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``window_mask`` ([B, 1, T, keys] bool, True = attend) replaces the causal/tree mask: a sliding
        layer's when the sequence has outgrown its window (``LlamaModel.window_mask``)."""
        linear = self.kernels.linear
        b, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, self.eps)
        qkv = project_qkv(linear, h, self.wqkv, self.bqkv, self.wv).view(b, t, self.n_heads + 2 * self.n_kv, self.hd)
        if self.q_norm is not None:
            qkv = self._qk_norm(qkv)
        qkv = qkv.transpose(1, 2)
        # RoPE on q and k heads together: one set of ops per layer instead of two
        qk = apply_rope(qkv[:, : self.n_heads + self.n_kv], cos, sin)
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
        v = qkv[:, self.n_heads + self.n_kv :]
        if cache is None or meta is None:  # training / scoring: full causal attention, no cache
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask, is_causal=window_mask is None,
                                                  scale=self.scale, enable_gqa=self.n_kv != self.n_heads)
        else:
            keys, values = cache.update(self.layer, k, v, meta)
            attn = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=meta.mask if window_mask is None else window_mask, scale=self.scale,
                enable_gqa=self.n_kv != self.n_heads
            )
        out = linear(attn.transpose(1, 2).reshape(b, t, self.n_heads * self.hd), self.wo)
        if self.post_attn_norm is not None:
            out = rms_norm(out, self.post_attn_norm, self.eps)
        x = x + out
        h = rms_norm(x, self.mlp_norm, self.eps)
        gate, up = linear(h, self.w13).split(self.ffn, dim=-1)
        out = linear((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up, self.w2)
        if self.post_mlp_norm is not None:
            out = rms_norm(out, self.post_mlp_norm, self.eps)
        return x + out

    def _qk_norm(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen 3 / Gemma 3: each q and k head ([B, T, heads, D]) RMS-normed with its weights, before RoPE."""
        assert self.q_norm is not None and self.k_norm is not None
        q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=2)
        return torch.cat([rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps), v], dim=2)


class LlamaModel(nn.Module):
    kernels: Kernels = EAGER  # set per loaded model (kernels.install_kernels)
    rope_cos: torch.Tensor  # buffers (register_buffer), declared for the type checker
    rope_sin: torch.Tensor
    rope_local_cos: torch.Tensor  # only with ``cfg.rope_local_theta`` (Gemma 3)
    rope_local_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.dim))
        self.layers = nn.ModuleList(LlamaBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.lm_head = None if cfg.tie_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.dim))
        # "embed" / "lm_head" kept as stored (a GGUF's blocks): the parameter then holds the stored bytes
        self.tables: dict[str, StoredRows] = {}
        cos, sin = rope_tables(cfg, max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.fusable = cfg.plain_llama  # the fused CPU ops implement this block (else the eager layer runs)
        if cfg.rope_local_theta is not None:  # Gemma 3's sliding layers: their own base, never scaled
            cos, sin = rope_tables(replace(cfg, rope_theta=cfg.rope_local_theta, rope_scaling=None), max_len)
            self.register_buffer("rope_local_cos", cos, persistent=False)
            self.register_buffer("rope_local_sin", sin, persistent=False)

    def output_matrix(self) -> torch.Tensor:
        """The [V, dim] output matrix; a new fp32 copy when it is kept as stored (see ``output_rows``)."""
        name = "embed" if self.lm_head is None else "lm_head"
        if name in self.tables:
            return self.tables[name].dense()
        return self.embed if self.lm_head is None else self.lm_head

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the output matrix, without decoding the rest of a table kept as stored."""
        table = self.tables.get("embed" if self.lm_head is None else "lm_head")
        return table.rows(ids) if table is not None else self.output_matrix().index_select(0, ids)

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings [*tokens.shape, dim] (fp32 when the table is kept as stored)."""
        table = self.tables.get("embed")
        return table.rows(tokens).to(tokens.device) if table is not None else F.embedding(tokens, self.embed)

    def embedding_matrix(self) -> torch.Tensor:
        """The [V, dim] input embedding; a new fp32 copy when it is kept as stored."""
        table = self.tables.get("embed")
        return table.dense() if table is not None else self.embed

    def forward(self, tokens: torch.Tensor, meta: Optional[AttentionMeta] = None, cache: Optional[KVCache] = None,
                last_only: bool = False, head: Optional[torch.Tensor] = None,
                layers: Optional[Sequence[int]] = None, blocks: Sequence[LlamaBlock] = ()) -> torch.Tensor:
        """Logits for ``tokens`` [B, T]; without a cache, plain causal attention from position 0 (training).
        ``head`` replaces the output matrix (a draft's restricted vocabulary). ``meta`` carries the
        optional positions and tree mask, and ``meta.capture`` asks for hidden states, which are
        left in ``meta.hidden`` (final normed) and ``meta.layer_states`` (residual after layer i).
        ``layers`` (increasing layer numbers) runs only those layers, then the final norm and the
        output layer: a layer-skip draft (an early exit or a skip set). Layer i still reads and
        writes cache layer i, so a draft can attend over the target's own entries. ``blocks``: extra
        decoder blocks of this model's head shape run after ``layers`` (before the final norm), each
        on cache layer ``block.layer`` (>= n_layers) with this model's RoPE: an exit adapter."""
        ext = self.kernels.fused
        if ext is not None and cache is not None and meta is not None and meta.fixed is None \
                and tokens.device.type == "cpu" and not self.fusable and self.norm.dtype == torch.float32 \
                and cache.dtype in FUSED_KV_DTYPES and self._window_covers_trees(meta, tokens.shape[1]):
            run = [*(self.layers if layers is None else [self.layers[i] for i in layers]), *blocks]
            return llama_fused.forward_blocks(self, ext, cast(list[LlamaBlock], run), tokens, meta, cache, last_only,
                                              self.output_matrix() if head is None else head)
        if ext is not None and cache is not None and meta is not None and meta.fixed is None \
                and tokens.device.type == "cpu" and self.fusable:
            plan = llama_fused.fused_plan(self)
            # fp32 activations; the KV cache fp32, fp16 or bf16 (the kernel widens it on load)
            if plan.norm.dtype == torch.float32 and cache.dtype in FUSED_KV_DTYPES:
                if layers is not None or blocks:
                    plan = plan.subset(tuple(range(self.cfg.n_layers)) if layers is None else tuple(layers), blocks)
                return llama_fused.forward_fused(self, ext, plan, tokens, meta, cache, last_only,
                                                 llama_fused.fused_head(plan, head))
        head = self.output_matrix() if head is None else head
        x = self.embed_rows(tokens).to(self.norm.dtype)  # weights may be stored narrower
        if self.cfg.embed_scale != 1.0:  # Gemma: as transformers, a multiply in the activation dtype
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        if meta is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        else:
            positions = meta.positions
        run = [*(self.layers if layers is None else [self.layers[i] for i in layers]), *blocks]
        if meta is not None and cache is not None:  # inference over a cache: the same layers in fewer operators
            x = eager_pass.layers_pass(self, cast(list[LlamaBlock], run), x, positions, meta, cache, last_only)
            if meta.capture is not None:
                meta.hidden = x
            return eager_pass.head_pass(self, x, head)
        cos = self.rope_cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.rope_sin[positions].unsqueeze(1).to(x.dtype)
        full: tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]] = (cos, sin, None)
        local = self._sliding_args(positions, meta, x.dtype) if self.cfg.sliding_layers else full
        capture = meta.capture if meta is not None else None
        if capture:
            assert meta is not None  # capture comes from meta
            meta.layer_states = {}
            for layer in run:
                c, s, window = local if layer.sliding else full
                x = layer(x, c, s, meta, cache, window)  # a new tensor per layer: no copy needed
                if layer.layer in capture:
                    meta.layer_states[layer.layer] = x[:, -1:] if last_only else x
        else:
            for layer in run:
                c, s, window = local if layer.sliding else full
                x = layer(x, c, s, meta, cache, window)
        if last_only:
            x = x[:, -1:]
        x = rms_norm(x, self.norm, self.cfg.norm_eps)
        if meta is not None and capture is not None:
            meta.hidden = x
        return self.kernels.linear(x, head)

    def _window_covers_trees(self, meta: AttentionMeta, n_new: int) -> bool:
        """Whether a tree pass's own keys all lie within the sliding window (real windows: 512+ positions
        against at most 64 tree nodes), as the C++ attention's window assumes; else the eager layer runs."""
        w = self.cfg.sliding_window
        return meta.tree is None or not w or w > n_new

    def _sliding_args(self, positions: torch.Tensor, meta: Optional[AttentionMeta], dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(cos, sin, window mask) of the sliding layers for this pass (see ``window_mask``)."""
        cos_t, sin_t = self.local_rope()
        cos = cos_t[positions].unsqueeze(1).to(dtype)
        sin = sin_t[positions].unsqueeze(1).to(dtype)
        return cos, sin, self.window_mask(positions, meta)

    def local_rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The sliding layers' RoPE tables (cos, sin): their own base where the model has one (Gemma 3)."""
        if self.cfg.rope_local_theta is None:
            return self.rope_cos, self.rope_sin
        if self.rope_local_cos.device != self.rope_cos.device:  # the loader moves rope_cos/rope_sin only
            self.rope_local_cos = self.rope_local_cos.to(self.rope_cos.device)
            self.rope_local_sin = self.rope_local_sin.to(self.rope_cos.device)
        return self.rope_local_cos, self.rope_local_sin

    def window_mask(self, positions: torch.Tensor, meta: Optional[AttentionMeta]) -> Optional[torch.Tensor]:
        """The sliding layers' attention mask: the pass's own (causal or tree) mask, less the keys
        ``sliding_window`` or more positions behind the query (transformers' ``kv > q - window``).
        None while every query is younger than the window (then the window masks nothing).

        A key's position is its cache slot, except the keys this pass writes, which are at their
        tokens' positions (a tree's depths): what the cache holds before a pass is always a chain."""
        w = self.cfg.sliding_window
        if w is None:
            return None
        if meta is None:  # no cache: causal over the tokens from position 0
            t = positions.shape[1]
            if t <= w:
                return None
            ar = torch.arange(t, device=positions.device)
            back = ar.view(-1, 1) - ar.view(1, -1)
            return ((back >= 0) & (back < w)).view(1, 1, t, t)
        pos = meta.explicit_positions
        top = max(meta.starts) + meta.n_new - 1 if pos is None else int(pos.max())
        if top < w:
            return None
        n_keys = meta.kv_len if meta.fixed is None else meta.arange.numel()
        key_pos = meta.arange[:n_keys].expand(len(meta.starts), n_keys)
        if meta.tree is not None or pos is not None:
            key_pos = key_pos.clone().scatter_(1, meta.slots, positions[:, : meta.n_new])
        near = (positions.unsqueeze(-1) - key_pos.unsqueeze(1) < w).unsqueeze(1)  # [B, 1, T, keys]
        base = meta.mask
        return near if base is None else base & near

    @staticmethod
    def convert_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """Map transformers' parameter names onto ours, fusing q/k/v and gate/up.

        Gemma's norms compute x * (1 + w): we hold 1 + w (computed in fp32 as transformers does, so the
        products are the same). A Gemma GGUF's tensors (``gguf._LAYER``) hold 1 + w already, and name
        its norm before the MLP ``post_attention_layernorm`` (llama's name for it) and the norm of the
        attention output ``post_attention_norm``."""
        gguf_gemma = cfg.sandwich_norms and "model.layers.0.post_attention_norm.weight" in sd
        offset = 0.0 if gguf_gemma else cfg.norm_offset

        def norm(name: str) -> torch.Tensor:
            return sd[name] if offset == 0.0 else sd[name].float() + offset

        out: dict[str, torch.Tensor] = {"embed": sd["model.embed_tokens.weight"], "norm": norm("model.norm.weight")}
        if not cfg.tie_embeddings:
            out["lm_head"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            out[f"layers.{i}.wqkv"] = torch.cat(
                [sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]])
            if cfg.qkv_bias:
                out[f"layers.{i}.bqkv"] = torch.cat(
                    [sd[a + "q_proj.bias"], sd[a + "k_proj.bias"], sd[a + "v_proj.bias"]])
            out[f"layers.{i}.wo"] = sd[a + "o_proj.weight"]
            out[f"layers.{i}.w13"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
            out[f"layers.{i}.w2"] = sd[p + "mlp.down_proj.weight"]
            out[f"layers.{i}.attn_norm"] = norm(p + "input_layernorm.weight")
            if cfg.qk_norm:
                out[f"layers.{i}.q_norm"] = norm(a + "q_norm.weight")
                out[f"layers.{i}.k_norm"] = norm(a + "k_norm.weight")
            if not cfg.sandwich_norms:
                out[f"layers.{i}.mlp_norm"] = norm(p + "post_attention_layernorm.weight")
            elif gguf_gemma:
                out[f"layers.{i}.post_attn_norm"] = norm(p + "post_attention_norm.weight")
                out[f"layers.{i}.mlp_norm"] = norm(p + "post_attention_layernorm.weight")
                out[f"layers.{i}.post_mlp_norm"] = norm(p + "post_feedforward_layernorm.weight")
            else:
                out[f"layers.{i}.post_attn_norm"] = norm(p + "post_attention_layernorm.weight")
                out[f"layers.{i}.mlp_norm"] = norm(p + "pre_feedforward_layernorm.weight")
                out[f"layers.{i}.post_mlp_norm"] = norm(p + "post_feedforward_layernorm.weight")
        return out


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Inverse of ``convert_hf_state_dict``: our fused names back to transformers' (for saving)."""
    if cfg.sandwich_norms or cfg.norm_offset:
        raise NotImplementedError(f"saving {cfg.architecture} weights in transformers' names is not supported")
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": sd["embed"], "model.norm.weight": sd["norm"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head"]
    for i in range(cfg.n_layers):
        p, a, ours = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"layers.{i}."
        q, k, v = sd[ours + "wqkv"].split([q_out, kv_out, kv_out])
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = q, k, v
        if cfg.qkv_bias:
            qb, kb, vb = sd[ours + "bqkv"].split([q_out, kv_out, kv_out])
            out[a + "q_proj.bias"], out[a + "k_proj.bias"], out[a + "v_proj.bias"] = qb, kb, vb
        out[a + "o_proj.weight"] = sd[ours + "wo"]
        gate, up = sd[ours + "w13"].split(cfg.intermediate_size)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = sd[ours + "w2"]
        out[p + "input_layernorm.weight"] = sd[ours + "attn_norm"]
        out[p + "post_attention_layernorm.weight"] = sd[ours + "mlp_norm"]
        if cfg.qk_norm:
            out[a + "q_norm.weight"], out[a + "k_norm.weight"] = sd[ours + "q_norm"], sd[ours + "k_norm"]
    return {k: v.contiguous() for k, v in out.items()}


def llama_param_count(cfg: ModelConfig) -> int:
    per_layer = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * cfg.dim + cfg.n_heads * cfg.head_dim * cfg.dim
    per_layer += 3 * cfg.intermediate_size * cfg.dim + (4 if cfg.sandwich_norms else 2) * cfg.dim
    per_layer += 2 * cfg.head_dim if cfg.qk_norm else 0
    emb = cfg.vocab_size * cfg.dim * (1 if cfg.tie_embeddings else 2)
    return cfg.n_layers * per_layer + emb + cfg.dim


__all__ = ["FUSED_KV_DTYPES", "LlamaModel", "llama_param_count", "rope_tables", "apply_rope", "to_hf_state_dict"]

