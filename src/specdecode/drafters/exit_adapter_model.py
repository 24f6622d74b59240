"""The exit adapter's module and its directory (``ExitAdapterDrafter`` in ``exit_adapter.py`` drafts with it).

An adapter directory holds ``exit_adapter.json`` (the exit layer, the shape, the target it was
trained for, the recipe, held-out α and τ) and ``exit_adapter.safetensors`` (the layer's
``wqkv``, ``wo``, ``w13``, ``w2``, ``attn_norm``, ``mlp_norm`` and ``vocab_ids``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..cache import KVCache
from ..config import ConfigError
from ..kernels import Kernels
from ..models.config import ModelConfig
from ..models.llama import LlamaBlock, rope_tables
from ..ops import rms_norm
from .layerskip import check_family
from .medusa_heads import warn_if_other_weights

if TYPE_CHECKING:
    from ..models import Model

CONFIG_FILE = "exit_adapter.json"
WEIGHTS_FILE = "exit_adapter.safetensors"
FORMAT_VERSION = 2
BLOCK_WEIGHTS = ("wqkv", "wo", "w13", "w2", "attn_norm", "mlp_norm")
log = logging.getLogger(__name__)

_TRAIN_HINT = "`specdecode distill --method early-exit --target TARGET --out DIR`"


class ExitAdapterError(ConfigError):
    """The adapter directory is missing, malformed, or does not fit the target; the message says the fix."""


@dataclass
class ExitAdapterConfig:
    """What ``exit_adapter.json`` records."""

    exit_layer: int  # the draft runs the target's layers 0 .. exit_layer - 1, then the adapter
    dim: int
    width: int  # the adapter layer's MLP width
    n_layers: int  # the target's layer count
    vocab_size: int  # the target's vocabulary
    n_heads: int
    n_kv_heads: int
    head_dim: int
    draft_vocab: int  # proposal vocabulary: the first ``draft_vocab`` of the tokens the target writes most
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target: dict[str, Any] = field(default_factory=dict)  # path, name, fingerprint, architecture, layers
    recipe: dict[str, Any] = field(default_factory=dict)  # the training command's settings and time
    alpha: Optional[float] = None  # held-out greedy acceptance of one draft token (top-1 agreement)
    alpha_training_free: Optional[float] = None  # the same exit without the adapter, same positions
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_target(cls, target: "Model", exit_layer: int, width: int, draft_vocab: int) -> "ExitAdapterConfig":
        """The adapter's attention has the target's head shape: its cache layer sits beside the target's."""
        c = target.config
        return cls(exit_layer=exit_layer, dim=c.dim, width=width, n_layers=c.n_layers, vocab_size=c.vocab_size,
                   n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, draft_vocab=draft_vocab,
                   norm_eps=c.norm_eps, rope_theta=c.rope_theta)

    def block_config(self) -> ModelConfig:
        """The adapter layer's shape as a one-layer Llama config (its module is ``LlamaBlock``)."""
        return ModelConfig(architecture="ExitAdapter", family="llama", vocab_size=self.vocab_size, dim=self.dim,
                           n_layers=1, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                           intermediate_size=self.width, max_position_embeddings=0, norm_eps=self.norm_eps,
                           tie_embeddings=True, rope_theta=self.rope_theta)


class ExitAdapter(nn.Module):
    """One Llama decoder layer on the residual after the exit layer; it keeps cache layer ``n_layers``."""

    rope_cos: torch.Tensor  # buffers (register_buffer), declared for the type checker
    rope_sin: torch.Tensor
    vocab_ids: torch.Tensor

    def __init__(self, cfg: ExitAdapterConfig, vocab_ids: torch.Tensor, max_len: int) -> None:
        super().__init__()
        if cfg.dim < 1 or cfg.width < 1:
            raise ValueError(f"an exit adapter needs a positive dim and width, got {cfg.dim} and {cfg.width}")
        self.cfg = cfg
        self.block = LlamaBlock(cfg.block_config(), layer=cfg.n_layers)
        with torch.no_grad():  # zero output projections: an untrained adapter is the identity (the plain exit)
            for name, p in self.block.named_parameters():
                if name in ("wo", "w2"):
                    p.zero_()
                elif p.dim() == 2:
                    p.normal_(0.0, 0.02)
                else:
                    p.fill_(1.0)
        cos, sin = rope_tables(cfg.block_config(), max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long).clone(), persistent=False)

    def use_kernels(self, kernels: Kernels) -> None:
        """Run the layer's matrices with the target's kernels (its fast CPU linear) instead of eager."""
        self.block.kernels = kernels

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: Any = None,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """h [B, T, dim] at ``positions`` [B, T] -> the adapted residual; without a cache, causal attention
        over ``h`` itself (training and evaluation), with one, over the cache's adapter layer too."""
        cos = self.rope_cos[positions].unsqueeze(1).to(h.dtype)
        sin = self.rope_sin[positions].unsqueeze(1).to(h.dtype)
        return self.block(h, cos, sin, meta, cache)


def final_norm(target: "Model", x: torch.Tensor) -> torch.Tensor:
    """The target's own final norm (RMSNorm for the llama family, LayerNorm for gpt2)."""
    m, cfg = target.module, target.config
    if cfg.family == "gpt2":
        return torch.nn.functional.layer_norm(x, (cfg.dim,), cast(torch.Tensor, m.lnf_w), cast(torch.Tensor, m.lnf_b),
                                              cfg.norm_eps)
    return rms_norm(x, cast(torch.Tensor, m.norm), cfg.norm_eps)


def proposal_head(target: "Model", vocab_ids: torch.Tensor) -> torch.Tensor:
    """The target's output rows of the proposal vocabulary (all of it: the matrix itself)."""
    w = target.output_matrix()
    if len(vocab_ids) == w.shape[0]:
        return w
    return w.index_select(0, vocab_ids.to(w.device)).contiguous()


def full_vocab_logits(restricted: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over the proposal vocabulary -> over the whole vocabulary (-inf elsewhere: probability 0)."""
    if restricted.shape[-1] == vocab_size:
        return restricted
    out = restricted.new_full((*restricted.shape[:-1], vocab_size), float("-inf"))
    out[..., vocab_ids] = restricted
    return out


# -- the directory -----------------------------------------------------------------------------
def is_exit_adapter_dir(path: Union[str, Path, None]) -> bool:
    return path is not None and (Path(path) / CONFIG_FILE).is_file()


def save_adapter(out: Union[str, Path], adapter: ExitAdapter, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the adapter directory (matrices in ``dtype``, norms in fp32; ``adapter.cfg`` as JSON)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {name: p.detach().to(dtype if p.dim() == 2 else torch.float32).contiguous().cpu()
          for name, p in adapter.block.named_parameters() if p is not None}
    sd["vocab_ids"] = adapter.vocab_ids.detach().to(torch.int64).contiguous().cpu()
    save_file(sd, str(out / WEIGHTS_FILE),
              metadata={"format": "specdecode-exit-adapter", "version": str(FORMAT_VERSION)})
    (out / CONFIG_FILE).write_text(json.dumps(asdict(adapter.cfg), indent=2, default=str) + "\n")
    return out


def load_adapter(path: Union[str, Path], max_len: int = 4096) -> ExitAdapter:
    """The adapter directory's module (fp32, eval mode), with errors that name the fix."""
    root = Path(path)
    if not root.is_dir():
        raise ExitAdapterError(f"exit adapter directory {root} does not exist; train one with {_TRAIN_HINT} "
                               "or pass the directory that holds exit_adapter.json")
    cfg_file, w_file = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not cfg_file.is_file() or not w_file.is_file():
        raise ExitAdapterError(f"{root} is not an exit adapter directory (it needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                               f"write one with {_TRAIN_HINT}")
    try:
        raw = json.loads(cfg_file.read_text())
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format version {raw.get('format_version')}, this specdecode reads {FORMAT_VERSION}")
        known = set(ExitAdapterConfig.__dataclass_fields__)
        cfg = ExitAdapterConfig(**{k: v for k, v in raw.items() if k in known})
        for name in ("exit_layer", "dim", "width", "n_layers", "vocab_size", "n_heads", "n_kv_heads", "head_dim",
                     "draft_vocab"):
            if int(getattr(cfg, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    except (OSError, ValueError, TypeError) as e:
        raise ExitAdapterError(f"{cfg_file} is malformed ({e}); retrain the adapter with {_TRAIN_HINT}") from e
    try:
        sd = load_file(str(w_file))
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise ExitAdapterError(f"{w_file} is unreadable ({e}); retrain the adapter with {_TRAIN_HINT}") from e
    ids = sd.pop("vocab_ids", None)
    if ids is None or tuple(ids.shape) != (cfg.draft_vocab,) or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ExitAdapterError(f"{w_file}: 'vocab_ids' must hold {cfg.draft_vocab} token ids below {cfg.vocab_size} "
                               f"(from {CONFIG_FILE}); the directory is inconsistent, retrain the adapter with "
                               f"{_TRAIN_HINT}")
    adapter = ExitAdapter(cfg, ids, max_len)
    want = {name: tuple(p.shape) for name, p in adapter.block.named_parameters()}
    for name, shape in want.items():
        if name not in sd or tuple(sd[name].shape) != shape:
            got = tuple(sd[name].shape) if name in sd else "missing"
            raise ExitAdapterError(f"{w_file}: tensor {name!r} is {got}, expected {shape} from {CONFIG_FILE}; the "
                                   f"directory is inconsistent, retrain the adapter with {_TRAIN_HINT}")
    adapter.block.load_state_dict({k: v.float() for k, v in sd.items() if k in want})
    return adapter.eval().requires_grad_(False)


def check_fits(cfg: ExitAdapterConfig, target: "Model", where: Union[str, Path]) -> None:
    """Raise unless the adapter can run on ``target`` (layers, hidden size, vocabulary); warn when it was
    trained for other weights of the same shape."""
    check_family(target)
    c = target.config
    trained = cfg.target.get("path") or "another model"
    fix = f"use an adapter trained for this target, or train one: `specdecode distill --method early-exit " \
          f"--target {target.path} --out DIR`"
    for what, mine, theirs in (("layers", cfg.n_layers, c.n_layers), ("hidden size", cfg.dim, c.dim),
                               ("vocabulary", cfg.vocab_size, c.vocab_size), ("KV heads", cfg.n_kv_heads, c.n_kv_heads),
                               ("head size", cfg.head_dim, c.head_dim)):
        if mine != theirs:
            raise ExitAdapterError(f"the exit adapter in {where} was trained for a target with {what} {mine} "
                                   f"({trained}) but {target.name} has {theirs}; {fix}")
    if not 1 <= cfg.exit_layer < c.n_layers:
        raise ExitAdapterError(f"the exit adapter in {where} exits after layer {cfg.exit_layer}, outside "
                               f"1..{c.n_layers - 1}; retrain it with {_TRAIN_HINT} --exit-layer K")
    warn_if_other_weights("the exit adapter", where, cfg.target, target)


__all__ = ["BLOCK_WEIGHTS", "CONFIG_FILE", "FORMAT_VERSION", "WEIGHTS_FILE", "ExitAdapter", "ExitAdapterConfig",
           "ExitAdapterError", "check_fits", "final_norm", "full_vocab_logits", "is_exit_adapter_dir", "load_adapter",
           "proposal_head", "save_adapter"]
