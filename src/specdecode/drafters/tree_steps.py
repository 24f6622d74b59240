"""The steps a tree drafter (Medusa, EAGLE) hands the cost model: the target's passes as a tree step
runs them, and a tree step's extra cost over a chain step (``costmodel.CostSteps``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from ..costmodel import Step
from ..verify import tree_mask
from .base import Draft

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model

TREE_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)  # tree pass widths timed; the rest interpolated
TREE_PAIRS = 3  # chain and tree steps timed per round for a tree's extra cost (a difference of two noisy times)
MAX_WIDTH = 64  # the widest pass timed: the pending token plus the fused path's 63 tree nodes
CONTEXT = 192  # synthetic tokens in the cache while timing


def tree_extra(chain: float, tree: float) -> float:
    """What a tree step costs beyond a chain step of the same width (never below 0)."""
    return max(0.0, tree - chain)


def tree_widths(target: "Model", cache: "KVCache", probe: torch.Tensor, hidden_layers: Sequence[int] = ()
                ) -> tuple[dict[int, Step], dict[str, Step]]:
    """A tree drafter's target passes (``TREE_WIDTHS``, up to 64 tokens, as the core runs a tree step:
    a tree mask, hidden states and ``hidden_layers`` captured, logits read back, rolled back) and a
    chain step and a tree step of the same six tokens ("chain", "tree": their difference is what a
    tree costs beyond a chain, the core building the mask and compacting the accepted path with
    ``cache.keep``). ``cache``: the target's, prefilled; ``probe``: [1, 64] token ids."""
    dev, layers = target.device, tuple(hidden_layers)
    masks = {n: _synthetic_tree(n).to(dev) if n > 1 else None for n in TREE_WIDTHS}
    six = Draft([1, 2, 3, 4, 5], None, [-1, 0, 1, -1, 3])  # a two-branch tree over 6 tokens, rank-0 chain first

    def logits(n: int, mask: Optional[torch.Tensor]) -> float:
        return float(target.run(probe[:, :n], cache, tree_mask=mask, return_hidden=True,
                                hidden_layers=layers).logits[0, -1, 0])

    def width(n: int) -> Step:
        return Step(lambda: logits(n, masks[n]), lambda: cache.trim(n))

    def chain() -> None:  # a chain step of 6 tokens: pass, roll back the rejected tail
        logits(6, None)
        cache.trim(3)

    def tree() -> None:  # the same width as a tree: mask, pass, keep the accepted (rank-0) path
        logits(6, tree_mask([six], 6, dev))
        cache.keep([0, 1, 2], row=0)

    pairs = {"chain": Step(chain, lambda: cache.trim(3), samples=TREE_PAIRS),
             "tree": Step(tree, lambda: cache.trim(3), samples=TREE_PAIRS)}
    return {n: width(n) for n in TREE_WIDTHS}, pairs


def _synthetic_tree(n: int) -> torch.Tensor:
    """A Medusa-like tree mask over n new tokens (root, four children, then chains under them)."""
    anc = [[0]]
    for k in range(n - 1):
        parent = 0 if k < 4 else k - 3
        anc.append(anc[parent] + [k + 1])
    m = torch.zeros(1, n, n, dtype=torch.bool)
    for i, a in enumerate(anc):
        m[0, i, a] = True
    return m
