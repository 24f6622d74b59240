"""Medusa heads (Cai et al., arXiv:2401.10774, Medusa-1): the weights, their directory, their checks.

Head k (k = 1..K) is one residual block on the target's final normed hidden state h, feeding the
target's own (frozen) output matrix: logits_k = W_out · (SiLU(W_k h + b_k) + h). On the hidden
state whose logits gave the newest token x_n it predicts x_{n+k}. W_k starts at zero, so an
untrained head is the target's own next-token head (the paper's initialisation).

A heads directory holds ``medusa_config.json`` (K, dim, the target it was trained for, the
training recipe, held-out acceptance by depth and rank) and ``medusa_heads.safetensors``
(``weight`` [K, dim, dim], ``bias`` [K, dim]); optionally ``draft_vocab.json`` (the token ranking
``drafters/vocab.py`` reads) so proposals can use a restricted output matrix.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import ConfigError

if TYPE_CHECKING:
    from ..models import Model

CONFIG_FILE = "medusa_config.json"
WEIGHTS_FILE = "medusa_heads.safetensors"
FORMAT_VERSION = 1
log = logging.getLogger(__name__)


class MedusaHeadsError(ConfigError):
    """The heads directory is missing, malformed, or does not fit the target; the message says the fix."""


@dataclass
class MedusaConfig:
    """What ``medusa_config.json`` records. ``rank_acceptance[d][r]``: held-out probability that the
    target's token d + 1 steps ahead is head d + 1's rank-r candidate, given that every earlier head
    had the target's token among its top ``len(rank_acceptance[d])`` (the drafter's prior)."""

    num_heads: int
    dim: int
    vocab_size: int
    target: dict[str, Any] = field(default_factory=dict)  # path, name, fingerprint, architecture, layers
    recipe: dict[str, Any] = field(default_factory=dict)  # the training command's settings and time
    rank_acceptance: list[list[float]] = field(default_factory=list)
    alpha: list[float] = field(default_factory=list)  # held-out top-1 accuracy of each head (greedy path)
    format_version: int = FORMAT_VERSION


def target_fingerprint(target: "Model") -> str:
    """A short hash of the target's output matrix as this run holds it (int8/int4 storage changes it): kept for
    directories written before ``target_sketch``."""
    rows = target.output_rows(torch.arange(min(64, target.vocab_size))).detach().float().cpu().contiguous()
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]


def target_sketch(target: "Model") -> list[float]:
    """64 numbers that identify the target's output matrix in any weight format: its first 64 rows projected on
    one fixed random direction. int8/int4 rounding moves them by well under 1%; other weights are uncorrelated."""
    w = target.output_rows(torch.arange(min(64, target.vocab_size))).detach().float().cpu()
    direction = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(0))
    return [round(float(x), 6) for x in w @ direction]


def same_weights(recorded: dict[str, Any], target: "Model") -> bool:
    """Whether ``target`` holds the weights a drafter was trained for (``describe_target``'s record): the
    sketches agree to a correlation of 0.99 (any weight format), else, in older records, the exact hash."""
    sketch = recorded.get("sketch")
    if sketch:
        a, b = torch.tensor(sketch), torch.tensor(target_sketch(target))
        return a.shape == b.shape and float(torch.corrcoef(torch.stack([a, b]))[0, 1]) >= 0.99
    fp = recorded.get("fingerprint")
    return not fp or fp == target_fingerprint(target)


def warn_if_other_weights(what: str, where: Union[str, Path], recorded: dict[str, Any], target: "Model") -> None:
    """A warning, not an error: a drafter trained for other weights of the same shape stays exact, only slower."""
    if not same_weights(recorded, target):
        log.warning("%s in %s was trained for %s, whose output matrix is not %s's: outputs stay exact, but "
                    "acceptance may be low", what, where, recorded.get("path") or "another model", target.path)


def describe_target(target: "Model") -> dict[str, Any]:
    c = target.config
    return {"path": str(target.path), "name": target.name, "fingerprint": target_fingerprint(target),
            "sketch": target_sketch(target), "architecture": c.architecture, "layers": c.n_layers, "dim": c.dim,
            "vocab_size": c.vocab_size}


class MedusaHeads(nn.Module):
    """K residual blocks h -> SiLU(W_k h + b_k) + h, stacked so all heads run as one product."""

    def __init__(self, num_heads: int, dim: int) -> None:
        super().__init__()
        if num_heads < 1 or dim < 1:
            raise ValueError(f"need at least one head of positive width, got {num_heads} heads of dim {dim}")
        self.num_heads, self.dim = num_heads, dim
        self.weight = nn.Parameter(torch.zeros(num_heads, dim, dim))
        self.bias = nn.Parameter(torch.zeros(num_heads, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., dim] -> features [..., K, dim], the inputs of the output matrix (training: eager)."""
        z = torch.einsum("...d,ked->...ke", h, self.weight) + self.bias
        return F.silu(z) + h.unsqueeze(-2)


def save_heads(out: Union[str, Path], heads: MedusaHeads, config: MedusaConfig, dtype: torch.dtype = torch.bfloat16
               ) -> Path:
    """Write the heads directory (weights in ``dtype``; config as JSON)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {"weight": heads.weight.detach().to(dtype).contiguous().cpu(),
          "bias": heads.bias.detach().float().contiguous().cpu()}
    save_file(sd, str(out / WEIGHTS_FILE), metadata={"format": "specdecode-medusa", "version": str(FORMAT_VERSION)})
    (out / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2, default=str) + "\n")
    return out


def read_config(path: Union[str, Path]) -> MedusaConfig:
    """The heads directory's config, with errors that name the fix."""
    root = Path(path)
    if not root.is_dir():
        raise MedusaHeadsError(f"Medusa heads directory {root} does not exist; train heads with `specdecode distill "
                               f"--method medusa --target TARGET --out {root}` or pass --heads DIR")
    cfg_file = root / CONFIG_FILE
    if not cfg_file.is_file() or not (root / WEIGHTS_FILE).is_file():
        raise MedusaHeadsError(f"{root} is not a Medusa heads directory (it needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                               "write one with `specdecode distill --method medusa --target TARGET --out DIR`")
    try:
        raw = json.loads(cfg_file.read_text())
        known = set(MedusaConfig.__dataclass_fields__)
        cfg = MedusaConfig(**{k: v for k, v in raw.items() if k in known})
        if int(cfg.num_heads) < 1 or int(cfg.dim) < 1 or int(cfg.vocab_size) < 1:
            raise ValueError("num_heads, dim and vocab_size must be positive")
    except (OSError, ValueError, TypeError) as e:
        raise MedusaHeadsError(f"{cfg_file} is malformed ({e}); retrain the heads with `specdecode distill "
                               "--method medusa`") from e
    return cfg


def load_heads(path: Union[str, Path]) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
    """Config and raw tensors (``weight`` [K, dim, dim], ``bias`` [K, dim]) of a heads directory."""
    cfg = read_config(path)
    sd = load_file(str(Path(path) / WEIGHTS_FILE))
    want = {"weight": (cfg.num_heads, cfg.dim, cfg.dim), "bias": (cfg.num_heads, cfg.dim)}
    for name, shape in want.items():
        if name not in sd or tuple(sd[name].shape) != shape:
            got = tuple(sd[name].shape) if name in sd else "missing"
            raise MedusaHeadsError(f"{Path(path) / WEIGHTS_FILE}: tensor {name!r} is {got}, expected {shape} from "
                                   f"{CONFIG_FILE}; the directory is inconsistent, retrain the heads")
    return cfg, sd


def check_fits(cfg: MedusaConfig, target: "Model", where: Union[str, Path]) -> None:
    """Raise unless heads of ``cfg`` can run on ``target`` (hidden size and vocabulary); warn when they
    were trained for a different target of the same shape."""
    trained = cfg.target.get("path") or "another model"
    fix = (f"use heads trained for this target, or train them: `specdecode distill --method medusa "
           f"--target {target.path} --out DIR`")
    if cfg.dim != target.config.dim:
        raise MedusaHeadsError(f"Medusa heads in {where} read hidden states of size {cfg.dim} (trained for "
                               f"{trained}) but {target.name} has hidden size {target.config.dim}; {fix}")
    if cfg.vocab_size != target.vocab_size:
        raise MedusaHeadsError(f"Medusa heads in {where} were trained over a vocabulary of {cfg.vocab_size} tokens "
                               f"({trained}) but {target.name} has {target.vocab_size}; {fix}")
    warn_if_other_weights("Medusa heads", where, cfg.target, target)


__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "MedusaConfig", "MedusaHeads", "MedusaHeadsError", "check_fits",
           "describe_target", "load_heads", "read_config", "same_weights", "save_heads", "target_fingerprint",
           "target_sketch", "warn_if_other_weights"]
