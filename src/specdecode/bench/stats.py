"""Speculation statistics from per-pass traces: τ, α̂, per-position acceptance, and the i.i.d. α.

A trace is one ``(drafted, accepted)`` pair per target pass (``drafted = 0`` for a
pass with no draft). Everything the report prints is arithmetic on these pairs,
kept here as pure functions so tests can check them on hand-built traces.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

Step = tuple[int, int]  # (draft tokens verified in this pass, how many the target accepted)


@dataclass
class Counts:
    passes: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # passes that stopped at a rejected draft token (accepted < drafted)
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    draft_length_hist: list[int] = field(default_factory=list)  # [g] = passes that verified g draft tokens

    def add_step(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"a pass cannot accept {accepted} of {drafted} draft tokens")
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += accepted < drafted
        _grow(self.drafted_by_position, drafted)
        _grow(self.accepted_by_position, drafted)
        _grow(self.draft_length_hist, drafted + 1)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1
        self.draft_length_hist[drafted] += 1

    def merge(self, other: "Counts") -> None:
        self.passes += other.passes
        self.generated += other.generated
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.rejections += other.rejections
        for mine, theirs in ((self.drafted_by_position, other.drafted_by_position),
                             (self.accepted_by_position, other.accepted_by_position),
                             (self.draft_length_hist, other.draft_length_hist)):
            _grow(mine, len(theirs))
            for i, x in enumerate(theirs):
                mine[i] += x

    @property
    def tau(self) -> float:
        """Tokens emitted per target pass (plain decoding = 1.00)."""
        return self.generated / self.passes if self.passes else 0.0

    @property
    def alpha_hat(self) -> float:
        """Accepted / drafted draft tokens (the library's α̂; below Leviathan's α since a rejection ends a block)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha_iid(self) -> float:
        """Per-token acceptance under Leviathan's i.i.d. model: accepted / tokens the target actually judged.

        A block of γ is judged token by token until the first rejection, so each
        accepted token is a success and each rejection a failure; this is the
        maximum-likelihood α of that model, the one E(α, γ) expects.
        """
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft token i accepted | i was drafted): falls with i when errors compound."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    def mean_pass_cost(self, c: float, v: Callable[[int], float]) -> float:
        """Mean cost of a pass in target-forward units: g·c drafting plus v(g) verification, over the g seen."""
        if not self.passes:
            return 0.0
        return sum(n * (g * c + v(g)) for g, n in enumerate(self.draft_length_hist) if n) / self.passes


def counts_from_steps(steps: Iterable[Step], generated: int) -> Counts:
    """Counts of one run; ``generated`` is the tokens it emitted (an EOS or the budget may cut the last pass)."""
    out = Counts()
    for d, a in steps:
        out.add_step(d, a)
    out.generated = generated
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; NaN for none)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def first_mismatch(expected: Sequence[int], got: Sequence[int]) -> int:
    """Index of the first differing token, len of the shorter when one is a prefix, -1 when equal."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return -1 if len(expected) == len(got) else min(len(expected), len(got))


def _grow(xs: list[int], n: int) -> None:
    if n > len(xs):
        xs.extend([0] * (n - len(xs)))
