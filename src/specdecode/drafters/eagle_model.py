"""The EAGLE-3 draft network (Li et al., arXiv:2503.01840): weights, math, directory format.

One decoder layer on top of the frozen target. Its input at position p is the target's own
features there, fused from three layers (low, mid, high: the residual stream after layers
``aux_layers``) by ``fc`` [H, 3H], together with the embedding of the next token x_{p+1} (the
target's own embedding matrix, shared, not stored). Queries, keys and values read
[input_norm(embedding) ; hidden_norm(feature)] (2H wide); the residual is the feature itself.
The layer's pre-norm output h_p is the feature of the next draft step (EAGLE's "features
extrapolated"), and ``lm_head`` over a restricted draft vocabulary (``draft_ids``, EAGLE-3's
d2t) turns norm(h_p) into the law of x_{p+2}.

The directory is the layout vLLM and SGLang load for their EAGLE-3 method, so export only
rewrites the config (``train/export_engines.py``): ``config.json`` (a one-layer Llama config with
``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size`` and the aux layer ids) and
``model.safetensors`` with the reference checkpoints' tensor names (``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``). ``eagle_specdecode.json`` adds what only
our runtime reads: the target's fingerprint, the recipe and held-out acceptance by depth.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import ConfigError
from ..ops import rms_norm
from .medusa_heads import warn_if_other_weights

if TYPE_CHECKING:
    from ..models import Model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EXTRA_FILE = "eagle_specdecode.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"
FORMAT_VERSION = 1
log = logging.getLogger(__name__)


class EagleError(ConfigError):
    """An EAGLE directory is missing, malformed, or does not fit the target; the message says the fix."""


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high features as "residual after layer i" (0-based): the engines' default
    hook points (2, L//2, L-3) count "input of layer i", i.e. after layer i - 1."""
    hooks = [min(max(h, 1), n_layers) for h in (2, n_layers // 2, n_layers - 3)]
    return tuple(sorted(h - 1 for h in hooks))  # type: ignore[return-value]


@dataclass
class EagleConfig:
    """Shape of the draft layer and what it was trained for. ``aux_layers``: the target layers whose
    output residual is fused (0-based, "after layer i"). ``depth_acceptance[d]``: held-out chance
    that the draft's top-1 at depth d + 1 is the target's token given depths <= d were (the prior
    of the drafter's tree calibration)."""

    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...]
    target_layers: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    target: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    depth_acceptance: list[float] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_target(cls, target: "Model", draft_vocab_size: int, ffn: Optional[int] = None,
                   aux_layers: Optional[Sequence[int]] = None) -> "EagleConfig":
        c = target.config
        heads = c.n_heads if c.dim % c.n_heads == 0 else 1
        kv = c.n_kv_heads if heads % max(1, c.n_kv_heads) == 0 else heads
        aux = tuple(int(i) for i in aux_layers) if aux_layers is not None else default_aux_layers(c.n_layers)
        if len(aux) != 3 or any(not 0 <= i < c.n_layers for i in aux):
            raise EagleError(f"EAGLE-3 fuses exactly three target layers in 0..{c.n_layers - 1}, got {list(aux)}")
        return cls(dim=c.dim, n_heads=heads, n_kv_heads=kv, head_dim=c.dim // heads,
                   ffn=int(ffn or c.intermediate_size),
                   vocab_size=c.vocab_size, draft_vocab_size=int(draft_vocab_size), aux_layers=aux,
                   target_layers=c.n_layers, norm_eps=float(c.norm_eps),
                   rope_theta=float(getattr(c, "rope_theta", 10000.0) or 10000.0),
                   max_position_embeddings=int(target.max_seq_len))


def input_embedding(target: "Model") -> torch.Tensor:
    """The target's token embedding matrix [V, dim] (shared with the draft, as EAGLE does)."""
    return target.embedding_matrix()


def rope_table(hd: int, theta: float, length: int, device: torch.device) -> torch.Tensor:
    """[length, 2, hd] cos and sin of RoPE angles at positions 0..length-1 (transformers' convention)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    ang = torch.arange(length, dtype=torch.float32, device=device).unsqueeze(-1) * inv
    emb = torch.cat((ang, ang), dim=-1)
    return torch.stack([emb.cos(), emb.sin()], dim=1)


def rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [..., T, heads, hd] with ``table`` [..., T, 2, hd] (its positions' rows)."""
    cos, sin = table[..., 0:1, :].to(x.dtype), table[..., 1:2, :].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class EagleNet(nn.Module):
    """The draft layer's parameters and math; training runs it eagerly, the drafter through
    the target's kernels (``EagleDrafter``). ``draft_ids`` [N]: the target ids of the draft
    vocabulary, increasing."""

    draft_ids: torch.Tensor  # a buffer (register_buffer), declared for the type checker

    def __init__(self, cfg: EagleConfig, draft_ids: torch.Tensor) -> None:
        super().__init__()
        h, n = cfg.dim, cfg.draft_vocab_size
        if draft_ids.numel() != n:
            raise ValueError(f"draft_ids has {draft_ids.numel()} tokens, the config says {n}")
        self.cfg = cfg
        qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        std = 1.0 / math.sqrt(h)
        self.fc = nn.Parameter(torch.randn(h, 3 * h) * std / math.sqrt(3))
        self.input_norm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.post_norm = nn.Parameter(torch.ones(h))
        self.norm = nn.Parameter(torch.ones(h))
        self.wqkv = nn.Parameter(torch.randn(qkv, 2 * h) * std / math.sqrt(2))
        self.wo = nn.Parameter(torch.randn(h, cfg.n_heads * cfg.head_dim) * std * 0.5)
        self.w13 = nn.Parameter(torch.randn(2 * cfg.ffn, h) * std)
        self.w2 = nn.Parameter(torch.randn(h, cfg.ffn) / math.sqrt(cfg.ffn) * 0.5)
        self.lm_head = nn.Parameter(torch.zeros(n, h))
        self.register_buffer("draft_ids", draft_ids.to(torch.long).clone(), persistent=False)
        self._rope: dict[torch.device, torch.Tensor] = {}  # RoPE cos/sin by position, per device

    # -- the math, shared by training and drafting ------------------------------------------------
    def qkv(self, feat: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor, linear=F.linear
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [.., T, nh, hd], k and v [.., T, nkv, hd] (RoPE applied) for features and next-token embeddings."""
        c = self.cfg
        x = torch.cat([rms_norm(emb, self.input_norm, c.norm_eps), rms_norm(feat, self.hidden_norm, c.norm_eps)], -1)
        qkv = linear(x, self.wqkv).unflatten(-1, (c.n_heads + 2 * c.n_kv_heads, c.head_dim))
        table = self._rope.get(positions.device)
        top = int(positions.max()) + 1 if positions.numel() else 1
        if table is None or table.shape[0] < top:  # built once per device, grown as positions need
            table = self._rope[positions.device] = rope_table(c.head_dim, c.rope_theta, max(top, 1024),
                                                              positions.device)
        rows = table[positions]
        qk = rope(qkv[..., : c.n_heads + c.n_kv_heads, :], rows)  # q and k heads together
        return qk[..., : c.n_heads, :], qk[..., c.n_heads :, :], qkv[..., c.n_heads + c.n_kv_heads :, :]

    def finish(self, feat: torch.Tensor, attn: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """The layer's pre-norm output from its input feature and attention output [.., T, nh * hd]."""
        c = self.cfg
        x = feat + linear(attn, self.wo)
        gate, up = linear(rms_norm(x, self.post_norm, c.norm_eps), self.w13).split(c.ffn, dim=-1)
        return x + linear(F.silu(gate) * up, self.w2)

    def logits(self, h: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """Draft-vocabulary logits [.., N] of pre-norm outputs h."""
        return linear(rms_norm(h, self.norm, self.cfg.norm_eps), self.lm_head)

    def fuse(self, aux: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """[.., 3H] concatenated target layer states -> [.., H] the draft's input feature."""
        return linear(aux, self.fc)

    # -- training-time test ------------------------------------------------------------------------
    def unroll(self, aux: torch.Tensor, emb_next: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """EAGLE-3's training-time test on whole sequences: the pre-norm outputs of ``depth`` draft steps.

        aux [B, T, 3H]: target features at positions 0..T-1; emb_next [B, T, H]: the embedding of
        x_{p+1} at position p. Step 0 reads the target's features (causal). Step k >= 1 at position
        p stands for the depth-k node drafted after anchor p - k: its feature is step k - 1's output
        at p - 1 and it attends to step-0 keys at positions <= p - k plus step j's key at position
        p - k + j for j = 1..k: exactly what the drafter's tree attention sees at run time."""
        b, t, _ = aux.shape
        c = self.cfg
        pos = torch.arange(t, device=aux.device)
        feat = self.fuse(aux)
        outs: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for k in range(depth):
            if k > 0:
                feat = torch.cat([feat.new_zeros(b, 1, c.dim), outs[-1][:, :-1]], dim=1)
            q, kk, vv = self.qkv(feat, emb_next, pos.expand(b, t))
            keys.append(kk)
            values.append(vv)
            kcat = torch.cat(keys, dim=1).transpose(1, 2)  # [B, nkv, (k+1)T, hd]
            vcat = torch.cat(values, dim=1).transpose(1, 2)
            mask = torch.cat([pos.unsqueeze(0) <= (pos.unsqueeze(1) - k)]  # step 0: causal, shifted by k
                             + [pos.unsqueeze(0) == (pos.unsqueeze(1) - k + j) for j in range(1, k + 1)], dim=1)
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), kcat, vcat, attn_mask=mask,
                                                  enable_gqa=c.n_kv_heads != c.n_heads)
            outs.append(self.finish(feat, attn.transpose(1, 2).flatten(-2)))
        return outs


# -- the directory ------------------------------------------------------------------------------
def hf_config(cfg: EagleConfig, dtype: str = "bfloat16", aux_keys: str = "both") -> dict[str, Any]:
    """The EAGLE-3 ``config.json``. ``aux_keys``: "vllm" writes ``eagle_aux_hidden_state_layer_ids``
    at the top level in vLLM's convention (input of layer i, as transformers' hidden_states[i]);
    "sglang" writes ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's (output of layer i);
    "both" writes both (our own directory)."""
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": cfg.dim, "intermediate_size": cfg.ffn, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "num_hidden_layers": 1,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.dim, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
    }
    if aux_keys in ("vllm", "both"):
        out["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg.aux_layers]
    eagle: dict[str, Any] = {"use_aux_hidden_state": True}
    if aux_keys in ("sglang", "both"):
        eagle["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layers)
    out["eagle_config"] = eagle
    return out


def state_dict_hf(net: EagleNet, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our parameters under the reference EAGLE-3 checkpoints' tensor names (q/k/v and gate/up split)."""
    c = net.cfg
    q, k, v = net.wqkv.detach().split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                       c.n_kv_heads * c.head_dim])
    gate, up = net.w13.detach().split(c.ffn)
    ids = net.draft_ids.cpu()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    w = {"fc.weight": net.fc, "midlayer.input_layernorm.weight": net.input_norm,
         "midlayer.hidden_norm.weight": net.hidden_norm, "midlayer.post_attention_layernorm.weight": net.post_norm,
         "midlayer.self_attn.q_proj.weight": q, "midlayer.self_attn.k_proj.weight": k,
         "midlayer.self_attn.v_proj.weight": v, "midlayer.self_attn.o_proj.weight": net.wo,
         "midlayer.mlp.gate_proj.weight": gate, "midlayer.mlp.up_proj.weight": up,
         "midlayer.mlp.down_proj.weight": net.w2, "norm.weight": net.norm, "lm_head.weight": net.lm_head}
    out = {name: t.detach().to(dtype).contiguous().cpu() for name, t in w.items()}
    out["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)  # target id = draft id + d2t[draft id]
    out["t2d"] = t2d
    return out


def expected_shapes(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the directory with its shape (what the engines' loaders expect)."""
    h, nq, nkv = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"fc.weight": (h, 3 * h), "midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
            "midlayer.post_attention_layernorm.weight": (h,), "midlayer.self_attn.q_proj.weight": (nq, 2 * h),
            "midlayer.self_attn.k_proj.weight": (nkv, 2 * h), "midlayer.self_attn.v_proj.weight": (nkv, 2 * h),
            "midlayer.self_attn.o_proj.weight": (h, nq), "midlayer.mlp.gate_proj.weight": (cfg.ffn, h),
            "midlayer.mlp.up_proj.weight": (cfg.ffn, h), "midlayer.mlp.down_proj.weight": (h, cfg.ffn),
            "norm.weight": (h,), "lm_head.weight": (cfg.draft_vocab_size, h), "d2t": (cfg.draft_vocab_size,),
            "t2d": (cfg.vocab_size,)}


def save_eagle(out: Union[str, Path], net: EagleNet, dtype: torch.dtype = torch.bfloat16, aux_keys: str = "both",
               extras: bool = True) -> Path:
    """Write the directory (config.json, model.safetensors and, with ``extras``, eagle_specdecode.json)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
    save_file(state_dict_hf(net, dtype), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(net.cfg, name, aux_keys), indent=2) + "\n")
    if extras:
        (out / EXTRA_FILE).write_text(json.dumps(asdict(net.cfg), indent=2, default=str) + "\n")
    return out


def is_eagle_dir(path: Union[str, Path, None]) -> bool:
    """True when ``path`` holds an EAGLE-3 config.json (ours or an engine export)."""
    if path is None:
        return False
    f = Path(path) / CONFIG_FILE
    try:
        return f.is_file() and ARCHITECTURE in json.loads(f.read_text()).get("architectures", [])
    except (OSError, ValueError):
        return False


def _aux_from_config(raw: dict[str, Any], n_layers: int) -> tuple[int, ...]:
    eagle = raw.get("eagle_config") or {}
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) for i in eagle["eagle_aux_hidden_state_layer_ids"])
    if raw.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) - 1 for i in raw["eagle_aux_hidden_state_layer_ids"])
    return default_aux_layers(n_layers)


def load_eagle(path: Union[str, Path], target_layers: Optional[int] = None) -> EagleNet:
    """An EAGLE-3 directory (ours or exported for vLLM/SGLang) as an ``EagleNet`` in fp32.
    ``target_layers``: the target's depth, for directories that name no aux layers."""
    root = Path(path)
    fix = f"train one with `specdecode distill --method eagle --target TARGET --out {root}`"
    if not root.is_dir():
        raise EagleError(f"EAGLE directory {root} does not exist; {fix}, or pass --heads DIR")
    if not is_eagle_dir(root) or not (root / WEIGHTS_FILE).is_file():
        raise EagleError(f"{root} is not an EAGLE-3 directory (it needs {CONFIG_FILE} with architectures "
                         f"[{ARCHITECTURE}] and {WEIGHTS_FILE}); {fix}")
    raw = json.loads((root / CONFIG_FILE).read_text())
    extra_f = root / EXTRA_FILE
    extra = json.loads(extra_f.read_text()) if extra_f.is_file() else {}
    try:
        n_layers = int(extra.get("target_layers") or target_layers or 0)
        if int(raw.get("num_hidden_layers", 1)) != 1:
            raise ValueError("only one-layer EAGLE-3 drafts are supported")
        h = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        cfg = EagleConfig(dim=h, n_heads=heads, n_kv_heads=int(raw.get("num_key_value_heads", heads)),
                          head_dim=int(raw.get("head_dim") or h // heads), ffn=int(raw["intermediate_size"]),
                          vocab_size=int(raw["vocab_size"]),
                          draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
                          aux_layers=tuple(extra["aux_layers"]) if "aux_layers" in extra
                          else _aux_from_config(raw, n_layers),
                          target_layers=n_layers, norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
                          rope_theta=float(raw.get("rope_theta", 10000.0)),
                          max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                          target=extra.get("target", {}), recipe=extra.get("recipe", {}),
                          depth_acceptance=list(extra.get("depth_acceptance", [])))
    except (KeyError, ValueError, TypeError) as e:
        raise EagleError(f"{root / CONFIG_FILE} is malformed ({e}); {fix}") from e
    sd = load_file(str(root / WEIGHTS_FILE))
    want = expected_shapes(cfg)
    for name, shape in want.items():
        if name not in sd or tuple(sd[name].shape) != shape:
            got = tuple(sd[name].shape) if name in sd else "missing"
            raise EagleError(f"{root / WEIGHTS_FILE}: tensor {name!r} is {got}, expected {shape}; {fix}")
    d2t = sd["d2t"].to(torch.long)
    ids = torch.arange(cfg.draft_vocab_size) + d2t
    net = EagleNet(cfg, ids)
    f = {k: v.float() for k, v in sd.items() if v.is_floating_point()}
    with torch.no_grad():
        net.fc.copy_(f["fc.weight"])
        net.input_norm.copy_(f["midlayer.input_layernorm.weight"])
        net.hidden_norm.copy_(f["midlayer.hidden_norm.weight"])
        net.post_norm.copy_(f["midlayer.post_attention_layernorm.weight"])
        net.wqkv.copy_(torch.cat([f["midlayer.self_attn.q_proj.weight"], f["midlayer.self_attn.k_proj.weight"],
                                  f["midlayer.self_attn.v_proj.weight"]]))
        net.wo.copy_(f["midlayer.self_attn.o_proj.weight"])
        net.w13.copy_(torch.cat([f["midlayer.mlp.gate_proj.weight"], f["midlayer.mlp.up_proj.weight"]]))
        net.w2.copy_(f["midlayer.mlp.down_proj.weight"])
        net.norm.copy_(f["norm.weight"])
        net.lm_head.copy_(f["lm_head.weight"])
    return net.eval().requires_grad_(False)


def check_fits(cfg: EagleConfig, target: "Model", where: Union[str, Path]) -> None:
    """Raise unless the draft can run on ``target``; warn when it was trained for other weights."""
    fix = f"use an EAGLE draft trained for this target: `specdecode distill --method eagle --target {target.path}`"
    c = target.config
    if cfg.dim != c.dim:
        raise EagleError(f"EAGLE draft in {where} reads hidden states of size {cfg.dim} but {target.name} has "
                         f"{c.dim}; {fix}")
    if cfg.vocab_size != target.vocab_size:
        raise EagleError(f"EAGLE draft in {where} has a vocabulary of {cfg.vocab_size} tokens but {target.name} has "
                         f"{target.vocab_size}; {fix}")
    if any(not 0 <= i < c.n_layers for i in cfg.aux_layers):
        raise EagleError(f"EAGLE draft in {where} fuses target layers {list(cfg.aux_layers)} but {target.name} has "
                         f"{c.n_layers} layers; {fix}")
    warn_if_other_weights("the EAGLE draft", where, cfg.target, target)


__all__ = ["ARCHITECTURE", "EagleConfig", "EagleError", "EagleNet", "check_fits", "default_aux_layers",
           "expected_shapes", "hf_config", "input_embedding", "is_eagle_dir", "load_eagle", "save_eagle",
           "state_dict_hf"]
