"""Pricers for tests: step costs handed to the drafters through the γ policy, never patched into modules."""

from __future__ import annotations

from specdecode.sizing.costs import Costs
from specdecode.sizing.pricer import Pricer

FLAT = Costs(c=0.0, v=(1.0,) * 64)  # every node free: the tree drafters always draft a full tree


def fixed(costs: Costs, margin: float = Pricer.margin) -> Pricer:
    """A pricer whose book returns ``costs`` for every drafter's spec (no timing, no cache)."""
    return Pricer(margin, lambda target, spec: costs)


FREE = fixed(FLAT)  # random heads and trees on a tiny target lose to plain decoding by measured costs
