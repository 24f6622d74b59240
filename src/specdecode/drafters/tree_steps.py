"""What a tree drafter (Medusa, EAGLE) hands the cost model besides its own steps (``sizing.costs.CostSteps``):
the target's one-token pass as a tree step runs it (the unit of the drafter's steps), and, measured once
per target and shared by every tree drafter, a tree step's extra cost over a chain step (``TreeStep``).

A tree pass over n tokens costs what the target's chain pass over n tokens costs (within 5% from 1 to 16
tokens on SmolLM2-135M int4, and linear in n up to 64 tokens at the same slope), so the passes' v(n) is
the target's shared measurement (``CostSteps.target_v``). Each tree drafter timing 15 tree widths up to
64 tokens and its own chain/tree pairs took 2 s of a server's first request, per drafter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..sizing import measure_context
from ..sizing.book import CostSpec
from ..sizing.pricer import Pricer
from ..sizing.costs import CostSteps, Step
from ..verify import tree_mask
from ..draft import Draft

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model

PROBE = 6  # the widest pass timed (the chain and tree steps)
TREE_PAIRS = 2  # chain and tree steps timed per round (their difference is small: 0.02-0.09 of a pass)


def tree_extra(chain: float, tree: float) -> float:
    """What a tree step costs beyond a chain step of the same width (never below 0)."""
    return max(0.0, tree - chain)


def one_token_pass(target: "Model", cache: "KVCache", probe: torch.Tensor, hidden_layers: Sequence[int] = ()
                   ) -> dict[int, Step]:
    """A tree drafter's one-token target pass as the core runs a tree step (hidden states and
    ``hidden_layers`` captured, logits read back, rolled back): the unit its own steps are measured in.
    ``cache``: the target's, prefilled; ``probe``: [1, 1+] token ids."""
    layers = tuple(hidden_layers)

    def run() -> float:
        return float(target.run(probe[:, :1], cache, return_hidden=True, hidden_layers=layers).logits[0, -1, 0])

    return {1: Step(run, lambda: cache.trim(1))}


class TreeStep:
    """What the cost book times for a tree step's extra over a chain step on a target: a chain step and a
    tree step of the same six tokens ("chain", "tree"); their difference is the core building the
    mask and compacting the accepted path with ``cache.keep``, the same for every tree drafter."""

    def cost_spec(self, target: "Model") -> CostSpec:
        return CostSpec("tree-step", (target,), steps=lambda: self.cost_steps(target), label="the tree bookkeeping's")

    def cost_steps(self, target: "Model") -> CostSteps:
        shared = measure_context.borrow(target)
        cache, probe, dev = shared.cache, shared.probe(PROBE), target.device
        six = Draft([1, 2, 3, 4, 5], None, [-1, 0, 1, -1, 3])  # a two-branch tree over 6 tokens, rank-0 chain first

        def logits(mask: "torch.Tensor | None") -> float:
            return float(target.run(probe, cache, tree_mask=mask, return_hidden=True).logits[0, -1, 0])

        def chain() -> None:  # a chain step of 6 tokens: pass, roll back the rejected tail
            logits(None)
            cache.trim(3)

        def tree() -> None:  # the same width as a tree: mask, pass, keep the accepted (rank-0) path
            logits(tree_mask([six], PROBE, dev))
            cache.keep([0, 1, 2], row=0)

        pairs = {"chain": Step(chain, lambda: cache.trim(3), samples=TREE_PAIRS),
                 "tree": Step(tree, lambda: cache.trim(3), samples=TREE_PAIRS)}
        return CostSteps(one_token_pass(target, cache, probe), 1, len(shared.ids), pairs, target_v=True)


def measured_tree_extra(target: "Model", pricer: Pricer) -> float:
    """A tree step's extra over a chain step on ``target``, over a one-token pass (from ``pricer``'s cost
    book: measured once per machine and target, then cached)."""
    costs = pricer.costs(target, TreeStep().cost_spec(target))
    return tree_extra(costs.extra("chain"), costs.extra("tree"))
