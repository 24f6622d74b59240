"""GPT-2 in plain PyTorch: learned positions, LayerNorm, fused qkv, tied head.

HF stores GPT-2 projections as Conv1D ([in, out]); we transpose once at load
time so every projection is the same ``linear(x, W[out, in])`` as in llama.
"""

from __future__ import annotations

from typing import Optional, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..cache import AttentionMeta, KVCache
from ..kernels import EAGER, Kernels
from .config import ModelConfig
from .tables import StoredRows


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x)
    return F.gelu(x, approximate="tanh")  # gelu_new / gelu_pytorch_tanh


class GPT2Block(nn.Module):
    kernels: Kernels = EAGER  # set per loaded model (kernels.install_kernels)

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        d, f = cfg.dim, cfg.intermediate_size
        self.layer, self.n_heads, self.hd = layer, cfg.n_heads, cfg.head_dim
        self.eps, self.act = cfg.norm_eps, cfg.activation
        self.ln1_w, self.ln1_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.wqkv, self.bqkv = nn.Parameter(torch.empty(3 * d, d)), nn.Parameter(torch.empty(3 * d))
        self.wo, self.bo = nn.Parameter(torch.empty(d, d)), nn.Parameter(torch.empty(d))
        self.ln2_w, self.ln2_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.wfc, self.bfc = nn.Parameter(torch.empty(f, d)), nn.Parameter(torch.empty(f))
        self.wproj, self.bproj = nn.Parameter(torch.empty(d, f)), nn.Parameter(torch.empty(d))

    def forward(self, x: torch.Tensor, meta: AttentionMeta, cache: KVCache) -> torch.Tensor:
        linear = self.kernels.linear
        b, t, d = x.shape
        h = F.layer_norm(x, (d,), self.ln1_w, self.ln1_b, self.eps)
        q, k, v = linear(h, self.wqkv, self.bqkv).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, self.hd).transpose(1, 2) for z in (q, k, v))
        keys, values = cache.update(self.layer, k, v, meta)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=meta.mask)
        x = x + linear(attn.transpose(1, 2).reshape(b, t, d), self.wo, self.bo)
        h = F.layer_norm(x, (d,), self.ln2_w, self.ln2_b, self.eps)
        return x + linear(_act(self.act, linear(h, self.wfc, self.bfc)), self.wproj, self.bproj)


class GPT2Model(nn.Module):
    kernels: Kernels = EAGER  # set per loaded model (kernels.install_kernels)

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab_size, cfg.dim))
        self.wpe = nn.Parameter(torch.empty(cfg.max_position_embeddings, cfg.dim))
        self.layers = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg.n_layers))
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(cfg.dim)), nn.Parameter(torch.zeros(cfg.dim))
        self.tables: dict[str, StoredRows] = {}  # never kept as stored here (GPT-2 is not read from GGUF)

    def output_matrix(self) -> torch.Tensor:
        return self.wte

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte.index_select(0, ids)

    def embedding_matrix(self) -> torch.Tensor:
        return self.wte

    def forward(self, tokens: torch.Tensor, meta: AttentionMeta, cache: KVCache,
                last_only: bool = False, head: Optional[torch.Tensor] = None,
                layers: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Logits for ``tokens`` [B, T]; ``meta`` carries positions, a tree mask and what to capture
        (``meta.hidden``: after ln_f; ``meta.layer_states[i]``: the residual stream after block i).
        ``layers``: run only these blocks (a layer-skip draft; block i keeps cache layer i)."""
        x = (F.embedding(tokens, self.wte) + F.embedding(meta.positions, self.wpe)).to(self.lnf_w.dtype)
        capture = meta.capture
        blocks = cast(Sequence[GPT2Block], self.layers if layers is None else [self.layers[i] for i in layers])
        if capture:
            meta.layer_states = {}
            for layer in blocks:
                x = layer(x, meta, cache)
                if layer.layer in capture:
                    meta.layer_states[layer.layer] = x[:, -1:] if last_only else x
        else:
            for layer in blocks:
                x = layer(x, meta, cache)
        if last_only:
            x = x[:, -1:]
        x = F.layer_norm(x, (self.cfg.dim,), self.lnf_w, self.lnf_b, self.cfg.norm_eps)
        if capture is not None:
            meta.hidden = x
        return self.kernels.linear(x, self.wte if head is None else head)

    @staticmethod
    def convert_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
        out = {"wte": sd["wte.weight"], "wpe": sd["wpe.weight"], "lnf_w": sd["ln_f.weight"], "lnf_b": sd["ln_f.bias"]}
        for i in range(cfg.n_layers):
            p = f"h.{i}."
            q = f"layers.{i}."
            out[q + "ln1_w"], out[q + "ln1_b"] = sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]
            out[q + "ln2_w"], out[q + "ln2_b"] = sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]
            out[q + "wqkv"], out[q + "bqkv"] = sd[p + "attn.c_attn.weight"].t().contiguous(), sd[p + "attn.c_attn.bias"]
            out[q + "wo"], out[q + "bo"] = sd[p + "attn.c_proj.weight"].t().contiguous(), sd[p + "attn.c_proj.bias"]
            out[q + "wfc"], out[q + "bfc"] = sd[p + "mlp.c_fc.weight"].t().contiguous(), sd[p + "mlp.c_fc.bias"]
            out[q + "wproj"], out[q + "bproj"] = sd[p + "mlp.c_proj.weight"].t().contiguous(), sd[p + "mlp.c_proj.bias"]
        return out
