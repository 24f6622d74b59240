"""A self-sizing drafter's measured costs checked against the live steps (issue #30: no measurement, taken
under whatever load the machine had, stays authoritative).

EAGLE, Medusa, suffix drafting and ``auto`` size their own drafts from the target's v(n) and their own
step costs, measured once per machine and cached; the γ policy, which checks a chain drafter's figures
against every pass, only caps them. So the decode core hands each of them the target's live single-row
pass timings after every finished request (``refine_costs(passes)``: seconds by width, each a low quantile
of at least ``policy.TRUST`` passes), and a drafter times its own steps as they run (``StepTimings``). A
figure the live ones contradict by more than ``policy.DISAGREE``× is replaced (a pessimistic step cost is
also bounded by a cheaper step that does more work, so it gets run and measured), and the drafter returns
its updated costs for the core to write back to the cache. A drafter given fixed costs keeps them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Optional

from ..costmodel import Costs, plausible
from ..policy import DISAGREE, TRUST, Timings


def differ(a: float, b: float, floor: float = 0.0) -> bool:
    """Whether two cost figures disagree: by more than ``DISAGREE``× and by more than ``floor``."""
    return abs(a - b) > floor and max(a, b) > DISAGREE * max(1e-12, min(a, b))


def unit_seconds(costs: Costs, passes: Mapping[int, float]) -> Optional[float]:
    """Seconds of a one-token pass: the live one, else the trusted widths through ``costs``'s v (None: no
    trusted pass yet)."""
    if 1 in passes:
        return passes[1]
    return min((s / costs.v_at(w - 1) for w, s in passes.items()), default=None)


def live_v(costs: Costs, passes: Mapping[int, float]) -> Optional[Costs]:
    """``costs`` with v(n) from the live passes, if they contradict it (None: they do not, or the one-token
    pass, their unit, is not trusted yet). The widths not run are bounded by those run (``plausible``)."""
    t1 = passes.get(1)
    if not t1:
        return None
    v, fixed = list(costs.v), [True] + [False] * (len(costs.v) - 1)
    for w, s in passes.items():
        if 1 < w <= len(v):
            v[w - 1], fixed[w - 1] = max(1.0, s / t1), True
    v = plausible(v, fixed)
    if not any(differ(a, b) for a, b in zip(v, costs.v)):
        return None
    return replace(costs, v=tuple(v), target_s=tuple(t1 * x for x in v))


class StepTimings:
    """A drafter's own steps timed as they run, by name, on the cost clock (``costmodel.cost_clock``)."""

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
