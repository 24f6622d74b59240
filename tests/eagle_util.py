"""Random EAGLE-3 drafts for tests (no training): the draft head starts as the target's own output rows,
so on a looping tiny model some proposals are accepted and some rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from specdecode.sizing.costs import Costs
from specdecode.drafters.eagle_model import EagleConfig, EagleNet, save_eagle

FLAT = Costs(c=0.0, v=(1.0,) * 64)  # every node free: the cost model always drafts a big tree


def make_eagle(out: Path, target, seed: int = 0, draft_vocab: Optional[int] = None, scale: float = 0.3,
               aux_layers: Optional[tuple[int, ...]] = None) -> Path:
    """A random EAGLE-3 directory for ``target`` (a loaded Model) over its first ``draft_vocab`` tokens."""
    torch.manual_seed(seed)
    n = draft_vocab or target.vocab_size
    cfg = EagleConfig.for_target(target, n, ffn=2 * target.config.dim, aux_layers=aux_layers)
    cfg.depth_acceptance = [0.5, 0.4, 0.3]
    ids = torch.randperm(target.vocab_size)[:n].sort().values if n < target.vocab_size else torch.arange(n)
    net = EagleNet(cfg, ids)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.mul_(scale)
        net.lm_head.copy_(target.output_matrix().float()[ids])
    return save_eagle(out, net, torch.float32)
