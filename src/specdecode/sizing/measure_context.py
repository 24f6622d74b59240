"""The synthetic context that every cost measurement on one target shares: one prefill, not one per drafter.

Preparing ``auto`` on a fresh machine measures the target's v(n), then EAGLE's, Medusa's and a tree step's
costs; each building and prefilling its own cache would be a large share of a cold server's first request.
Each measurement borrows this one prefilled cache and leaves it at the length it found it (its steps
roll back what they append); the decode core releases it once a drafter is prepared.

Only the first ``SEED`` positions are computed; the rest repeat them (keys, values and hidden states). A timed
pass attends over every entry whatever it holds, so its time is the same, and computing only ``SEED``
positions saves most of a cold start's measurement, where a wide prefill pass is bound by arithmetic.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model

CONTEXT = 192  # synthetic context tokens (a typical prompt: a tiny draft's step grows with the cache)
SEED = 16  # positions the prefill computes; the others repeat them
ROOM = 24  # tokens a measurement may append before rolling back: the widest chain pass (MAX_GAMMA + 1) and more


@dataclass
class MeasureContext:
    """``ids`` prefilled into ``cache`` (row 0), with the prefill's final normed hidden states (``hidden``,
    [T, dim]) and the residual stream after each captured layer (``layers``, [T, dim] each)."""

    ids: list[int]
    cache: "KVCache"
    hidden: torch.Tensor
    layers: dict[int, torch.Tensor]

    def probe(self, n: int) -> torch.Tensor:
        """[1, n] real token ids of the context to feed a timed pass (their values barely matter)."""
        reps = -(-n // len(self.ids))
        return torch.tensor([(self.ids * reps)[:n]], device=self.hidden.device)


_HELD: "weakref.WeakKeyDictionary[Model, MeasureContext]" = weakref.WeakKeyDictionary()


def context_ids(target: "Model") -> list[int]:
    """The synthetic context: ``CONTEXT`` token ids, fewer where the target's window is short."""
    return [i % target.vocab_size for i in range(max(1, min(CONTEXT, target.max_seq_len - ROOM - 1)))]


def borrow(target: "Model", hidden_layers: Sequence[int] = ()) -> MeasureContext:
    """The target's shared measurement context holding at least ``hidden_layers`` (prefilled again, with
    the union of the layers, when it lacks one). The caller's steps must roll back what they append."""
    held = _HELD.get(target)
    want = set(hidden_layers)
    if held is None or not want <= set(held.layers):
        layers = tuple(sorted(want | (set(held.layers) if held is not None else set())))
        ids = context_ids(target)
        seed = ids[:SEED]
        with torch.inference_mode():
            cache = target.new_cache(1, len(ids) + ROOM)
            # no logits worth computing (one output row stands in): the states are what is kept
            out = target.run(torch.tensor([seed], device=target.device), cache, return_hidden=True,
                             hidden_layers=layers, head=target.stand_in_head())
            cache.repeat_to(len(ids))
        assert out.hidden is not None
        held = _HELD[target] = MeasureContext(ids, cache, _repeat(out.hidden[0], len(ids)),
                                              {k: _repeat(v[0], len(ids)) for k, v in out.layers.items()})
    extra = held.cache.length() - len(held.ids)
    if extra:  # a measurement that failed midway left tokens behind: the prefix is intact
        held.cache.trim(extra)
    return held


def _repeat(states: torch.Tensor, n: int) -> torch.Tensor:
    """[n, dim]: the rows of ``states`` repeated in order."""
    reps = -(-n // states.shape[0])
    return states.repeat(reps, 1)[:n].contiguous()


def release(target: "Model") -> None:
    """Free the target's measurement context (its cache: ~10 MB for SmolLM2-135M)."""
    _HELD.pop(target, None)
