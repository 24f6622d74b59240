"""A toy language model for the verifier tests: a next-token law for every prefix, enumerable.

The laws depend on the whole prefix (not only on the position), so a rule that looks at the
draft's path (block verification's running weight, a tree's branches) is tested where it matters.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import torch

from specdecode.config import SamplingConfig
from specdecode.sampling import probs_from_logits


class PrefixLaws:
    """Filtered next-token laws over ``vocab`` tokens for every prefix of up to ``max_len`` tokens.

    ``like`` makes a correlated model (a draft that resembles a target): its logits plus
    ``noise`` times fresh Gaussian logits, so acceptance is neither ~0 nor ~1."""

    def __init__(self, vocab: int, max_len: int, setting: SamplingConfig, seed: int, scale: float = 1.5,
                 like: Optional["PrefixLaws"] = None, noise: float = 1.0) -> None:
        self.vocab, self.max_len = vocab, max_len
        prefixes = [p for n in range(max_len + 1) for p in itertools.product(range(vocab), repeat=n)]
        self.index = {p: i for i, p in enumerate(prefixes)}
        gen = torch.Generator().manual_seed(seed)
        fresh = torch.randn(len(prefixes), vocab, generator=gen) * scale
        self.logits = fresh if like is None else like.logits + noise * fresh
        self.probs = probs_from_logits(self.logits, setting)

    def __call__(self, prefix: Sequence[int]) -> torch.Tensor:
        return self.probs[self.index[tuple(prefix)]]

    def along(self, context: Sequence[int], tokens: Sequence[int], extra: int = 1) -> torch.Tensor:
        """[len(tokens) + extra, V]: the laws after context + tokens[:i] (as a target pass scores a chain)."""
        ctx = tuple(context)
        return torch.stack([self(ctx + tuple(tokens[:i])) for i in range(len(tokens) + extra)])

    def sequence_law(self, length: int) -> dict[tuple[int, ...], float]:
        """The exact law of the first ``length`` tokens sampled from the empty prefix."""
        law = {}
        p64 = self.probs.double()
        for seq in itertools.product(range(self.vocab), repeat=length):
            pr = 1.0
            for i, t in enumerate(seq):
                pr *= float(p64[self.index[seq[:i]], t])
            law[seq] = pr
        return law
