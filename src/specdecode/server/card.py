"""The web page's per-pass card, built from a core ``StepEvent``: what the target's pass did with the
draft, read along the *verified path*.

* A chain: the path is the whole chain. The target keeps the accepted prefix, rejects the next
  proposal (if any) and writes its own token; every position of the chain counts in the bars.
* A tree: the path runs from the root through the accepted nodes. Where it stops, the target
  disagreed with every child of the last accepted node (the rejected candidates, the drafter's first
  one shown); if that node is a leaf, the whole proposed path was accepted and the target's token is a
  bonus. Nodes off the path were never reached: they are neither accepted nor rejected, and the bars
  count only the path's nodes (accepted ones, then the rejected candidate's position).

A pass cut short (EOS or a stop string inside the accepted tokens) has no target token: nothing after
the cut is judged, so it shows neither a rejection nor a bonus."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..rows import StepEvent


@dataclass
class PassView:
    verified: list[bool] = field(default_factory=list)  # per draft position on the verified path: accepted?
    rejected: list[int] = field(default_factory=list)  # candidates rejected at the first disagreement
    bonus: bool = False  # the whole proposed path was accepted: the target's token is a bonus


def pass_view(ev: StepEvent) -> PassView:
    """The verified path of one pass (``ev.drafted`` > 0), from the core's raw facts: the proposal
    (``proposed``, with ``parents`` and the accepted node ``path`` for a tree) and the emitted tokens."""
    n_acc = sum(ev.from_draft)
    own = len(ev.token_ids) == n_acc + 1  # the target's token was emitted (no EOS / stop cut inside the draft)
    if ev.proposed is None:  # no proposal recorded: count what was emitted
        return PassView([True] * n_acc + ([False] if own and n_acc < ev.drafted else []))
    if ev.parents is None:  # a chain
        if not own:
            return PassView([True] * n_acc)
        if n_acc < len(ev.proposed):
            return PassView([True] * n_acc + [False] * (len(ev.proposed) - n_acc), [ev.proposed[n_acc]])
        return PassView([True] * n_acc, bonus=True)
    path = list(ev.path or ())
    if not own:
        return PassView([True] * n_acc)
    node = path[n_acc - 1] if n_acc > 0 else -1
    children = [k for k, p in enumerate(ev.parents) if p == node]
    if children:
        return PassView([True] * n_acc + [False], [ev.proposed[k] for k in children])
    return PassView([True] * n_acc, bonus=True)


def card_fields(ev: StepEvent, token_text: Callable[[int], str]) -> dict[str, object]:
    """The stream's card fields for a drafted pass: ``rejected`` (the first rejected candidate's text, or
    None), ``rejected_also`` (other rejected siblings of a tree), ``bonus`` and ``verified``."""
    if not ev.drafted:
        return {"rejected": None}
    v = pass_view(ev)
    rejected: Optional[str] = token_text(v.rejected[0]) if v.rejected else None
    out: dict[str, object] = {"rejected": rejected, "bonus": v.bonus, "verified": v.verified,
                              "tree": ev.parents is not None}
    if len(v.rejected) > 1:
        out["rejected_also"] = [token_text(t) for t in v.rejected[1:]]
    return out
