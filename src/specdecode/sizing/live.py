"""A self-sizing drafter's measured costs checked against the live steps (issue #30: no measurement, taken
under whatever load the machine had, stays authoritative).

EAGLE, Medusa, suffix drafting and ``auto`` size their own drafts from the target's v(n) and their own
step costs, measured once per machine and cached; the γ policy, which checks a chain drafter's figures
against every pass, only caps them. So the decode core hands each of them the target's live single-row
pass timings after every finished request, every 64 passes and whenever a width's timings become trusted
(``refine_costs(passes)``: seconds by width, each a low quantile of at least ``TRUST`` passes), and a
drafter times its own steps as they run (``StepTimings``). As in the γ policy, a trusted live figure then
counts instead of the measured one (when they differ by more than ``FOLLOW``, so that noise does not re-plan
every tree); a pessimistic step cost is also bounded by a cheaper step that does more work, so it gets run
and measured. Past ``DISAGREE``× the drafter returns its figures for the core to write back to the cache. A
drafter given fixed costs keeps them.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence

from .costs import Costs, plausible

WINDOW = 16  # live timings kept per shape
QUANTILE = 0.25  # the estimate of a shape: this quantile of its window (a spike of load never sets it)
TRUST = 4  # live timings of a shape before they outrank an offline figure either way
DISAGREE = 1.5  # live/offline ratio (either way) past which a drafter's offline costs are replaced
MIN_DELTA_C = 0.02  # |c live − c offline| below this never counts as a disagreement (noise on tiny c)
FOLLOW = 1.1  # a trusted live figure replaces the one in use (in memory) when they differ by more than this



class Timings:
    """The one online timer's record: the last ``window`` timings of one thing (a pass shape, a drafter's
    step); ``estimate`` is their ``quantile`` (by default a low one: load only ever adds time)."""

    __slots__ = ("samples", "n", "quantile", "_est")

    def __init__(self, window: int = WINDOW, quantile: float = QUANTILE) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self.n = 0
        self.quantile = quantile
        self._est: Optional[float] = None

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.n += 1
        self._est = None

    @property
    def estimate(self) -> float:
        if self._est is None:
            xs = sorted(self.samples)
            self._est = xs[int(self.quantile * (len(xs) - 1))]
        return self._est


def overstated(offline: Sequence[float], live: Sequence[Optional[float]]) -> float:
    """The factor (≤ 1) by which the offline figures overstate the live ones (None: none), what the widths not yet
    run are scaled by. A cache timed while load came and went overstates many widths alike, and a width the cache
    makes look dear is never run, so never measured: with every width from 2 tokens cached 3x too dear, γ stays at
    1 for good on the bundled pair (59% of a fresh core's accepted tokens; with the scaling, 92% from the first
    request). The median ratio over the widths past the unit (width 1 is the unit, 1 by definition), and none
    within ``FOLLOW`` of 1: with the lowest ratio, one noisy reading scaled every other width."""
    ratios = [x / o for o, x in list(zip(offline, live))[1:] if x is not None and o > 0]
    if not ratios:
        return 1.0
    m = statistics.median(ratios)
    return m if m * FOLLOW < 1.0 else 1.0


def refined_v(costs: Costs, known: Sequence[Optional[float]]) -> tuple[list[float], tuple[float, ...]]:
    """``costs``'s v with the live figures ``known`` (None: a width not run) put in and the others scaled by
    ``overstated``, both against ``costs.measured_v`` (the measurement), never an earlier refinement; and that
    measurement, for the result to carry. Rescaling a rescaled table compounded: under a load of 0-12% alone a
    Gemma 3 table went to v = 1.0 at every width not run within 20 refinements (``auto`` then priced 11-token
    chains as free, and the figures were written back to the cache)."""
    base = costs.measured_v
    scale = overstated(base, known)
    return [k if k is not None else max(1.0, b * scale) for b, k in zip(base, known)], base


def capped(v: Sequence[float], i: int) -> bool:
    """Whether v's width i + 1 sits at ``plausible``'s cap, (i + 1) / i times the width below: a figure a load spike
    left so (a cache whose every wide width was timed 3x too dear reads 1, 2, 3, ... from width 1), so its scale
    against a live figure tells how much the cache overstated no better than that cap did."""
    return i > 0 and v[i] >= v[i - 1] * (i + 1) / i * (1 - 1e-9)


def flat_past_run(est: Sequence[float], known: Sequence[Optional[float]]) -> list[float]:
    """The widths not run (``known`` None) at most the dearest run width below them: the cheapest a wider pass can
    be, so that it gets run and measured. Where a run width's cached figure was only the cap, scaling the rest by
    it left them 1.5-2.2x too dear on the bundled pair (live v(2) 1.44 against a capped 2.0: widths 3-8 read
    2.2-3.8 where they cost 1.3), never run, so never corrected: ``auto`` drafted one token a step, request after
    request."""
    out, ceiling = [], 1.0
    for x, k in zip(est, known):
        if k is not None:
            ceiling = max(ceiling, k)
        out.append(x if k is not None else min(x, ceiling))
    return out


def differ(a: float, b: float, floor: float = 0.0, factor: float = DISAGREE) -> bool:
    """Whether two cost figures disagree: by more than ``factor``× and by more than ``floor``."""
    return abs(a - b) > floor and max(a, b) > factor * max(1e-12, min(a, b))


def follows(new_c: float, old_c: float) -> bool:
    """Whether a drafter's live step cost (over a one-token pass) should replace the one in use: past
    ``FOLLOW``× and past ``MIN_DELTA_C`` (noise on a tiny c)."""
    return differ(new_c, old_c, MIN_DELTA_C, FOLLOW)


def costs_differ(a: Costs, b: Costs, factor: float = DISAGREE) -> bool:
    """Whether any of v, c or a drafter's own step figures differ by more than ``factor``× (c and the steps
    also by more than ``MIN_DELTA_C``: noise on tiny figures)."""
    if any(differ(x, y, 0.0, factor) for x, y in zip(a.v, b.v)) or differ(a.c, b.c, MIN_DELTA_C, factor):
        return True
    steps = dict(b.extras)
    return any(differ(x, steps.get(k, 0.0), MIN_DELTA_C, factor) for k, x in a.extras)


def unit_seconds(costs: Costs, passes: Mapping[int, float]) -> Optional[float]:
    """Seconds of a one-token pass: the live one, else the trusted widths through ``costs``'s v (None: no
    trusted pass yet)."""
    if 1 in passes:
        return passes[1]
    return min((s / costs.v_at(w - 1) for w, s in passes.items()), default=None)


def live_v(costs: Costs, passes: Mapping[int, float], factor: float = FOLLOW) -> Optional[Costs]:
    """``costs`` with v(n) from the live passes, if one differs by more than ``factor``× (None: none does, or
    the one-token pass, their unit, is not trusted yet). The widths not run are scaled by how far the run
    ones show the measurement overstated (``refined_v``: as the γ policy does, else a width a pessimistic cache
    makes look dear is never run, so never corrected) and bounded by those run (``plausible``)."""
    t1 = passes.get(1)
    if not t1:
        return None
    base = costs.measured_v
    known: list[Optional[float]] = [1.0] + [None] * (len(base) - 1)
    for w, s in passes.items():
        if 1 < w <= len(known):
            known[w - 1] = max(1.0, s / t1)
    est, measured = refined_v(costs, known)
    if any(k is not None and capped(base, i) for i, k in enumerate(known)):
        est = flat_past_run(est, known)
    v = plausible(est, [k is not None for k in known])
    if not any(differ(a, b, 0.0, factor) for a, b in zip(v, costs.v)):
        return None
    return replace(costs, v=tuple(v), target_s=tuple(t1 * x for x in v), measured=measured)


class StepTimings:
    """A drafter's own steps timed as they run, by name, on the cost clock (``sizing.costs.cost_clock``)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._t: dict[str, Timings] = {}

    def add(self, name: str, seconds: float) -> None:
        t = self._t.get(name)
        if t is None:
            t = self._t[name] = Timings()
        t.add(seconds)

    def ratio(self, name: str, unit: float) -> Optional[float]:
        """The step's trusted estimate over ``unit`` seconds (None: fewer than ``TRUST`` timings)."""
        t = self._t.get(name)
        return t.estimate / unit if t is not None and t.n >= TRUST and unit > 0 else None


class Stored:
    """The figures a drafter's cache file holds, to rewrite it only when the ones in use have moved past
    ``DISAGREE``× from them."""

    def __init__(self, costs: Optional[Costs]) -> None:
        self.costs = costs

    def changed(self, now: Costs) -> list[Costs]:
        """``[now]`` to write (and remembered as written) when it differs from the file by ``DISAGREE``×."""
        if self.costs is not None and not costs_differ(now, self.costs):
            return []
        self.costs = now
        return [now]
