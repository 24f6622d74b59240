"""Prefill a prompt into one cache row, whole or a slice at a time between the other rows' passes.

A server row's prompt was prefilled in one pass while every other row waited: an 8,000-token prompt froze a
running stream for 40 s. ``Filling`` holds a row whose prompt is still going in; the decode core feeds it one
chunk before each pass of the running rows (all of it when no row is running), and the chunk's length
follows the time the last one took, so a pass of the others never waits more than about ``slice_s``. A
chunk is computed as the same positions of a whole prefill would be (every kernel works row by row, and
attention reads the cache in position order), so the row's tokens are the same whichever way it went in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .cache import KVCache
from .models import Model
from .rows import Row


def prefill(target: Model, cache: KVCache, slot: int, ids: list[int],
            hidden_layers: tuple[int, ...] = ()) -> tuple[Optional[torch.Tensor], dict[int, torch.Tensor]]:
    """Append ``ids`` to cache row ``slot``; with ``hidden_layers``, return their final and layer states
    (a drafter reading hidden states drafts from the prompt's)."""
    x = torch.tensor([ids], dtype=torch.long, device=target.device)
    if not hidden_layers:
        target.forward(x, cache, rows=slice(slot, slot + 1), last_only=True)
        return None, {}
    # every position's states, but no logits worth computing (one output row stands in)
    out = target.run(x, cache, rows=slice(slot, slot + 1), return_hidden=True, hidden_layers=hidden_layers,
                     head=target.stand_in_head())
    assert out.hidden is not None
    return out.hidden[0], {k: v[0] for k, v in out.layers.items()}


@dataclass
class Filling:
    """A row whose prompt is going into cache row ``slot`` a chunk at a time (``done`` tokens in so far)."""

    row: Row
    slot: int
    slice_s: float = 0.1  # the time one chunk may hold the other rows' next pass
    chunk: int = 64  # tokens in the next chunk, resized after each to take about slice_s
    done: int = 0
    hidden: list[torch.Tensor] = field(default_factory=list)
    layers: list[dict[int, torch.Tensor]] = field(default_factory=list)

    @property
    def todo(self) -> int:
        return self.row.n_prompt - 1 - self.done  # the last prompt token is fed with the first pass

    def feed(self, target: Model, cache: KVCache, hidden_layers: tuple[int, ...], everything: bool) -> bool:
        """One chunk (every remaining token when ``everything``); True once the prompt is in, the row's
        states and prefill time set."""
        n = self.todo if everything else min(self.todo, self.chunk)
        t0 = time.perf_counter()
        if n > 0:
            h, layers = prefill(target, cache, self.slot, self.row.tokens[self.done : self.done + n], hidden_layers)
            if h is not None:
                self.hidden.append(h)
                self.layers.append(layers)
            self.done += n
        dt = time.perf_counter() - t0
        self.row.stats.prefill_s += dt
        if not everything and n > 0:
            self.chunk = max(16, min(4096, int(n * self.slice_s / max(dt, 1e-6))))
        if self.todo > 0:
            return False
        if self.hidden:
            self.row.hidden = torch.cat(self.hidden) if len(self.hidden) > 1 else self.hidden[0]
            self.row.layers = {k: torch.cat([p[k] for p in self.layers]) for k in self.layers[0]}
        self.row.decode_start = time.perf_counter()
        return True
