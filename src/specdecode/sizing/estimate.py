"""The one estimator and the one probe schedule behind every acceptance and calibration table.

Every figure the sizing layer learns online is the same thing: a running mean of what was observed
(accepted tokens over judged ones, a realised speedup per step), started from a prior so the first
steps are sane, over a bounded memory so a change of workload shows within a few steps.
``Estimate`` is that mean; a table of them (per bucket, per depth and rank) is a list of
``Estimate``. ``ProbeSchedule`` says when something switched off is tried again: rarely enough that
exploring a loser costs little, never so rarely that a winner stays unseen.

Leaf module: imports nothing of the project, so drafters may use it without reaching up.
"""

from __future__ import annotations

import math
from typing import Optional, Protocol

__all__ = ["Estimate", "ProbeSchedule", "RowEvidence", "judged"]


def judged(drafted: int, accepted: int) -> int:
    """Draft tokens the target judged in one chain step: the accepted ones and the first rejected one
    (tokens after a rejection were never compared). Accepted over judged is the maximum-likelihood
    estimate of the acceptance rate for i.i.d. acceptance."""
    return accepted + (1 if accepted < drafted else 0)


class Estimate:
    """A running mean: ``mean = (hits + prior · weight) / (trials + weight)``.

    ``hits``/``trials`` are the evidence: successes over trials, or a sum of real-valued samples
    over their count. ``memory`` bounds the evidence: when ``trials`` passes it both sums are scaled
    down to it, so old observations lose weight geometrically and the mean follows a change within
    about ``memory`` trials.

    The prior is either kept (its weight never fades, however much evidence arrives: a drafter's
    α keeps a floor of sanity across requests) or, with ``forgets_prior``, entered as evidence at
    the start (``weight`` pseudo-trials at mean ``prior``) and forgotten like any other observation
    once the memory is full (a table whose later evidence should fully replace its starting guess).
    """

    __slots__ = ("prior", "weight", "memory", "hits", "trials", "_start")

    def __init__(self, prior: float, weight: float, memory: float = math.inf, *, forgets_prior: bool = False) -> None:
        if weight < 0 or memory <= 0:
            raise ValueError("an estimate needs weight >= 0 and memory > 0")
        self.prior, self.memory = prior, memory
        start = (prior * weight, weight) if forgets_prior else (0.0, 0.0)
        self.weight = 0.0 if forgets_prior else weight  # the kept prior's weight
        self.hits, self.trials = start
        self._start = start  # what ``age`` returns the evidence toward

    @property
    def mean(self) -> float:
        total = self.trials + self.weight
        return (self.hits + self.prior * self.weight) / total if total > 0 else self.prior

    def mean_with(self, prior: float, weight: float) -> float:
        """The evidence read under another prior: a reader with its own view of a fresh start (auto's
        optimistic α for its members) or a prior that depends on the query (EAGLE's a(p) = p)."""
        total = self.trials + weight
        return (self.hits + prior * weight) / total if total > 0 else prior

    def add(self, hits: float, trials: float = 1.0, share: float = 0.0) -> None:
        """Observe ``hits`` over ``trials``. ``share``: the least share of the new mean this sample
        takes (news after a long pause, such as a probe's, outweighs what its trials alone would give
        it); it still counts as ``trials`` toward the memory, so later samples weigh as before."""
        new_trials = self.trials + trials
        total = new_trials + self.weight
        if trials > 0 and share * total > trials:
            mean = self.mean
            mean += share * (hits / trials - mean)
            self.hits = mean * total - self.prior * self.weight
        else:
            self.hits += hits
        self.trials = new_trials
        if new_trials > self.memory:
            keep = self.memory / new_trials
            self.hits *= keep
            self.trials *= keep

    def fade(self, factor: float) -> None:
        """Scale the evidence by ``factor`` (< 1): once per pass, a half-life in passes, so evidence
        that is no longer renewed (a switched-off drafter) loses its say and a probe follows."""
        self.hits *= factor
        self.trials *= factor

    def age(self, rate: float) -> None:
        """Move the evidence ``rate`` of the way back to where it started (the prior): for a bucket
        not drafted on, which would otherwise never gather the evidence to recover from a low read."""
        self.hits += rate * (self._start[0] - self.hits)
        self.trials += rate * (self._start[1] - self.trials)

    def set_mean(self, value: float) -> None:
        """Put the mean at ``value`` without changing its weight (a known state, e.g. in a test)."""
        self.hits = value * (self.trials + self.weight) - self.prior * self.weight

    def __repr__(self) -> str:
        return f"Estimate(mean={self.mean:.4g}, trials={self.trials:.4g}, prior={self.prior:.4g}@{self.weight:g})"


class ProbeSchedule:
    """When to try again something the policy switched off: after ``gap`` plain steps, the gap
    starting at ``first`` and multiplied by ``growth`` (up to ``cap``) at every probe, so exploring a
    loser costs a few steps per thousand while one that turned good is found within a bounded wait.

    ``at_start``: due at once, before anything was drafted (a request's first pass shows what its
    text makes of the drafter, whatever came before); that first draft does not lengthen the gap.
    """

    __slots__ = ("first", "growth", "cap", "gap", "idle", "started")

    def __init__(self, first: int, growth: float = 2.0, cap: float = math.inf, *, at_start: bool = False) -> None:
        if first < 0 or growth < 1 or cap < first:
            raise ValueError("a probe schedule needs first >= 0, growth >= 1 and cap >= first")
        self.first, self.growth, self.cap = first, growth, cap
        self.gap: float = first
        self.idle = 0  # plain steps since it last drafted
        self.started = not at_start

    def due(self) -> bool:
        return not self.started or self.idle >= self.gap

    def plain(self) -> None:
        """A step without drafting."""
        self.idle += 1

    def drafted(self, probe: bool = False) -> None:
        """It drafted: the wait starts over; ``probe`` (the schedule, not merit, made it draft): the next
        probe waits longer."""
        if probe and self.started:
            self.grow()
        self.started, self.idle = True, 0

    def grow(self) -> None:
        """Lengthen the gap (a probe was made, even one that then drafted nothing)."""
        self.gap = min(self.cap, self.gap * self.growth)

    def restart(self) -> None:
        """Back to the first gap: chosen on merit, so the next losing spell starts probing often again."""
        self.gap = self.first

    def __repr__(self) -> str:
        return f"ProbeSchedule(idle={self.idle}, gap={self.gap:g})"


HISTORY_WEIGHT = 0.5  # judged tokens the drafter's history across requests adds to a new row's prior mean
PROBE_GAPS = (8, 2)  # a switched-off row probes after 8 plain passes, then 16, 32, ... (per request)


class History(Protocol):
    """What a row reads of its drafter's evidence (``drafters.base.Acceptance``)."""

    estimate: Estimate


class RowEvidence:
    """One row's acceptance estimate and its probe schedule.

    α = accepted / judged, judged = accepted tokens plus the one rejected per step (the
    maximum-likelihood estimate for i.i.d. acceptance) over about the last ``memory`` judged tokens,
    started from a prior worth the prior's weight that the row's own evidence then replaces. The prior
    is the drafter's own (its α prior and weight; ``prior``: the reader's own instead, e.g. auto's
    optimistic one) plus its history across requests at weight ≤ ``HISTORY_WEIGHT``: a prior, never a
    verdict, so junk requests before this one barely move it."""

    __slots__ = ("estimate", "fresh_alpha", "probes")

    def __init__(self, history: History, memory: float = 100.0, prior: Optional[tuple[float, float]] = None) -> None:
        past = history.estimate
        alpha0, weight0 = prior if prior is not None else (past.prior, past.weight)
        w = min(HISTORY_WEIGHT, past.trials)
        seen = past.hits / past.trials if past.trials > 0 else 0.0
        self.fresh_alpha = alpha0
        # a fresh row's confidence is the prior's weight; the history only moves its mean
        self.estimate = Estimate((alpha0 * weight0 + seen * w) / (weight0 + w), weight0, memory, forgets_prior=True)
        self.probes = ProbeSchedule(PROBE_GAPS[0], PROBE_GAPS[1], at_start=True)

    @property
    def alpha(self) -> float:
        return self.estimate.mean

    def update(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.estimate.add(accepted, judged(drafted, accepted))

    def probe_due(self) -> bool:
        """Whether a plain pass for this row should be a probe instead (its schedule, not another's)."""
        return self.probes.due()

    def step(self, drafted: int, probe: bool) -> None:
        """Record this pass's draft length; ``probe``: the schedule, not the policy, made it draft."""
        if drafted > 0:
            self.probes.drafted(probe)
        else:
            self.probes.plain()

    # views by the names the core and tests use
    @property
    def plain(self) -> int:
        """Plain passes since the row last drafted."""
        return self.probes.idle

    @property
    def started(self) -> bool:
        """Drafted at least once in this request."""
        return self.probes.started

    @started.setter
    def started(self, value: bool) -> None:
        self.probes.started = value

    @property
    def accepted(self) -> float:
        return self.estimate.hits

    @property
    def evaluated(self) -> float:
        return self.estimate.trials

    @evaluated.setter
    def evaluated(self, value: float) -> None:
        self.estimate.trials = value
