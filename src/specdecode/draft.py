"""What a drafter sees and what it returns: ``DraftContext`` in, ``Draft`` out.

These sit below ``verify.py`` and ``constraints.py`` (both read a ``Draft``) and below every
drafter, so the verifier and the grammar never import the drafters to know what a draft is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional, Protocol

import torch

from .config import SamplingConfig
from .sampling import CoupledNoise, draw

if TYPE_CHECKING:
    from .cache import KVCache


class DraftConstraint(Protocol):
    """A row's grammar (structured output) as a drafter sees it (``constraints.ConstraintState``).

    A drafter that samples or takes an argmax passes its logits [V] (target vocabulary) through
    ``mask`` and reports the law of the masked logits, then ``push``es the token it chose, so its
    next position is masked in the grammar state after it; the core rolls the pushes back. A
    drafter that ignores ``DraftContext.constraint`` stays exact: the core cuts its draft at the
    first forbidden token, so it only loses acceptance."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor: ...

    def push(self, token: int) -> bool: ...


@dataclass
class DraftContext:
    """What a drafter may look at when proposing for one row.

    ``tokens`` is the whole sequence so far (prompt + generated); its last token is not yet in
    the target's cache. ``max_tokens`` is how many draft nodes the core will verify this step.
    ``hidden`` (for heads: Medusa, EAGLE) holds the target's final normed hidden states of the
    tokens it verified at the last pass, [k, dim]: the pending token's and each accepted draft
    token's, the last being the state whose logits gave the newest token; None before the first
    pass or when the drafter does not ask for them (``wants_hidden``). ``probe`` is True when
    this proposal follows plain steps only to refresh the acceptance estimate: a drafter may then
    look at a shorter context. ``target_cache`` is the target's KV cache, whose row number is the
    key of this context in ``propose_rows`` (None outside the decode core): a self-drafter that
    computes some layers exactly as the target does (layer skip) attends over the target's own
    entries for them instead of recomputing them. It may write entries past the row's length
    (the next target pass overwrites them before reading) and must leave the lengths and every
    entry below them as it found them. ``noise`` is set when the row samples by the Gumbel-max
    coupling: a drafter that samples then draws its token for sequence position i (the first
    draft token's is ``len(tokens)``) as ``noise.draw(q, i)`` instead of from ``generator``
    (``draw_token`` does either), which is what makes its tokens agree with the target's draws.
    """

    tokens: list[int]
    max_tokens: int
    sampling: SamplingConfig
    generator: Optional[torch.Generator]
    hidden: Optional[torch.Tensor] = None
    probe: bool = False
    target_cache: Optional["KVCache"] = None
    noise: Optional[CoupledNoise] = None
    constraint: Optional["DraftConstraint"] = None
    # EAGLE-3: residual after layer i, [k, dim], same tokens as hidden
    layers: Optional[Mapping[int, torch.Tensor]] = None


def draw_token(q: torch.Tensor, ctx: DraftContext, index: int) -> int:
    """A sampling drafter's token ``index`` (0: the one after ``ctx.tokens``) from its filtered law
    ``q`` [1, V]: the coupled draw when the row is coupled, else a draw from the row's generator."""
    if ctx.noise is not None:
        return ctx.noise.draw(q, len(ctx.tokens) + index)
    return int(draw(q, ctx.generator)[0])


@dataclass
class Draft:
    """Proposed tokens and, for stochastic drafters, the filtered law each was drawn from ([n, V]).

    ``parents`` makes the draft a tree: ``parents[i]`` is the index of node i's parent in
    ``tokens``, or -1 for a child of the pending token; parents come before their children.
    ``None`` is a chain (each token follows the previous one), the common case. ``source`` names
    the drafter that made it when a composite (``--drafter auto``) chose among several: the stats
    count accepted tokens per source. ``expected``: the drafter's own prediction of the tokens this
    step yields (accepted + 1), when it has one; auto weighs deterministic drafts with it.
    """

    tokens: list[int] = field(default_factory=list)
    probs: Optional[torch.Tensor] = None
    parents: Optional[list[int]] = None
    source: Optional[str] = None
    expected: Optional[float] = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def first_path(self) -> "Draft":
        """The chain from the root through each node's first child (a tree lists its likeliest child
        first): what a target whose kernels round a tree's rows unlike a chain's verifies instead
        (``Model.exact_trees``)."""
        if self.parents is None:
            return self
        picked, at = [], -1
        for i, parent in enumerate(self.parents):  # parents come before children: one scan finds the path
            if parent == at:
                picked.append(i)
                at = i
        probs = self.probs[picked] if self.probs is not None else None
        return Draft([self.tokens[i] for i in picked], probs, None, self.source)
