"""Random Medusa heads for tests (no training): near the identity, so an untrained head predicts the
target's own next token, which a looping tiny model often repeats: drafts get accepted and rejected."""

from __future__ import annotations

from pathlib import Path

import torch

from specdecode.sizing.costs import Costs
from specdecode.drafters.medusa_heads import MedusaConfig, MedusaHeads, save_heads

FLAT = Costs(c=0.0, v=(1.0,) * 64)  # every node free: the cost model always drafts a full tree


def make_heads(out: Path, dim: int, vocab: int, num_heads: int = 3, scale: float = 0.02, seed: int = 0,
               target: str = "tiny") -> Path:
    torch.manual_seed(seed)
    heads = MedusaHeads(num_heads, dim)
    with torch.no_grad():
        heads.weight.normal_(0, scale)
        heads.bias.normal_(0, scale)
    cfg = MedusaConfig(num_heads, dim, vocab, target={"path": target},
                       rank_acceptance=[[0.5, 0.2, 0.1, 0.05]] * num_heads)
    return save_heads(out, heads, cfg, torch.float32)
