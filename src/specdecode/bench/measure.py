"""Measure the hardware's side of the cost model: c and v(γ), with the engine's own forward calls.

c    = T_draft(1 token) / T_target(1 token)
v(γ) = T_target(γ+1 tokens) / T_target(1 token)

Both are timed at a realistic context length (the workload's mean prompt), by
appending tokens to a prefilled cache and rolling them back, which is exactly
what a decode step does. Sizes are interleaved and the median kept, so a burst
of background load hits every size alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..models import Model


DRAFT_RUN = 4  # draft steps per timing sample (a typical γ)


@dataclass
class Costs:
    context_len: int
    repeats: int
    target_s: dict[int, float] = field(default_factory=dict)  # tokens per forward -> median seconds
    draft_s: Optional[float] = None  # one-token draft forward, median seconds

    @property
    def c(self) -> Optional[float]:
        return self.draft_s / self.target_s[1] if self.draft_s is not None else None

    def v(self, gamma: int) -> float:
        """T(γ+1)/T(1); beyond the measured range, extrapolated linearly from the last two points."""
        if gamma + 1 in self.target_s:
            return self.target_s[gamma + 1] / self.target_s[1]
        top = max(self.target_s)
        slope = (self.target_s[top] - self.target_s[top - 1]) / self.target_s[1] if top > 1 else 0.0
        return self.target_s[top] / self.target_s[1] + slope * (gamma + 1 - top)

    def to_dict(self) -> dict[str, object]:
        return {"context_len": self.context_len, "repeats": self.repeats,
                "target_forward_s": {str(k): v for k, v in sorted(self.target_s.items())},
                "draft_forward_s": self.draft_s, "c": self.c,
                "v": {str(g): self.v(g) for g in range(0, max(self.target_s))}}


@torch.inference_mode()
def measure_costs(target: Model, draft: Optional[Model], context: list[int], max_tokens: int,
                  repeats: int = 20, draft_head: Optional[torch.Tensor] = None) -> Costs:
    """Median forward times of the target for 1..max_tokens new tokens and of the draft for one token
    (``draft_head``: the restricted output matrix the draft methods use)."""
    limit = target.max_seq_len - max_tokens - 1
    if draft is not None:
        limit = min(limit, draft.max_seq_len - 2)
    ctx = context[:max(1, min(len(context), limit))]
    out = Costs(context_len=len(ctx), repeats=repeats)
    t_cache = target.new_cache(1, len(ctx) + max_tokens)
    target.forward(torch.tensor([ctx]), t_cache, last_only=True)
    d_cache = None
    if draft is not None:
        d_cache = draft.new_cache(1, len(ctx) + 1)
        draft.forward(torch.tensor([ctx]), d_cache, last_only=True)
    sizes = list(range(1, max_tokens + 1))
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    d_samples: list[float] = []
    probe = torch.tensor([(ctx * -(-max_tokens // len(ctx)))[:max_tokens]])  # real tokens; values barely matter
    for r in range(repeats + 1):  # the first round warms caches and allocator; not kept
        for n in (sizes if r % 2 == 0 else sizes[::-1]):
            t0 = time.perf_counter()
            target.forward(probe[:, :n], t_cache)  # all logits, as the engine's verification pass
            dt = time.perf_counter() - t0
            t_cache.trim(n)
            if r:
                samples[n].append(dt)
        if draft is not None and d_cache is not None:
            # A run of DRAFT_RUN one-token steps right after target passes, as the engine drafts:
            # the first step finds the draft's weights evicted by the target's, the rest do not.
            t0 = time.perf_counter()
            for _ in range(DRAFT_RUN):
                draft.forward(probe[:, :1], d_cache, last_only=True, head=draft_head)  # as DraftModelDrafter does
                d_cache.trim(1)
            dt = (time.perf_counter() - t0) / DRAFT_RUN
            if r:
                d_samples.append(dt)
    out.target_s = {n: statistics.median(s) for n, s in samples.items()}
    out.draft_s = statistics.median(d_samples) if d_samples else None
    return out
