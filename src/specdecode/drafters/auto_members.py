"""What ``AutoDrafter`` knows of each member: its costs, running acceptance and realised rate (across requests
and per request), and when a losing member is tried again. Every figure is one of the sizing layer's
estimators (``sizing/estimate.py``, ``sizing/live.py``)."""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict

from ..sizing.costs import MAX_GAMMA, Costs
from ..sizing.estimate import Estimate, ProbeSchedule, RowEvidence
from ..sizing.live import Timings
from .base import BatchDrafter

CHEAP = 0.1  # a self-sizing member costing less than this share of a target pass per row proposes every step
PRIOR_ALPHA, PRIOR_WEIGHT = 0.75, 6.0  # a member's α before evidence: optimistic, worth a few steps (exploration)
COST_SAMPLES = 9  # a member's cost c is the median of its last this many proposals (one-offs do not move it)
OPTIMISTIC = 3.0  # a self-sizing member's rate before it has drafted (so each is tried once)
RATE_EMA = 0.1  # least weight of one step in a member's realised rate (its memory: 1 / RATE_EMA steps)
PROBE_FIRST, PROBE_MAX = 32, 1024  # steps before a losing dear self-sizing member is tried again (doubling)
PROBE_WEIGHT = 0.3  # weight of a probe's step in that member's rate (news after a long pause)
# a realised rate: OPTIMISTIC worth one step (so each member is tried), then each step weighs ≥ RATE_EMA
_rate = functools.partial(Estimate, OPTIMISTIC, 1.0, 1.0 / RATE_EMA - 1.0, forgets_prior=True)
_probes = functools.partial(ProbeSchedule, PROBE_FIRST, 2, PROBE_MAX)


@dataclasses.dataclass
class Member:
    """One drafter inside ``AutoDrafter`` and what auto knows of it."""

    name: str
    drafter: BatchDrafter
    costs: Costs | None = None  # offline c and v(γ) (chain drafters); None: it sizes its own drafts
    rates: Estimate = dataclasses.field(default_factory=_rate)  # realised speedup per step drafted (self-sizing)
    sampled: bool = False  # it was seen proposing sampled drafts: never chosen by content
    steps: int = 0  # steps it drafted (the first few weigh more: the optimistic start is one observation)
    timings: Timings = dataclasses.field(default_factory=lambda: Timings(COST_SAMPLES, 0.5))  # its recent costs
    c: float = 0.0  # measured cost per row and step it follows, in one-token target passes
    accepted: int = 0  # accepted draft tokens, all rows and requests (for /health and tests)
    probes: ProbeSchedule = dataclasses.field(default_factory=_probes)  # when a losing dear member is tried again
    probing: bool = False  # this step's drafts are a probe
    # per row, its request's own evidence: what its drafts are valued by, so that no request inherits another's
    # verdict (junk requests before it, all rejections, would otherwise set what a new request tries: issue 49)
    evidence: dict[int, RowEvidence] = dataclasses.field(default_factory=dict)  # α (the history a bounded prior)
    row_rates: dict[int, Estimate] = dataclasses.field(default_factory=lambda: defaultdict(_rate))  # self-sizing

    @property
    def alpha(self) -> float:
        """The member's running acceptance with an optimistic prior, so one unlucky step does not
        rule out a member that is then never tried again."""
        return self.drafter.acceptance.estimate.mean_with(PRIOR_ALPHA, PRIOR_WEIGHT)

    def row_evidence(self, row: int) -> RowEvidence:
        ev = self.evidence.get(row)
        if ev is None:
            ev = self.evidence[row] = RowEvidence(self.drafter.acceptance, prior=(PRIOR_ALPHA, PRIOR_WEIGHT))
        return ev

    def rate_at(self, row: int) -> float:
        """A self-sizing member's realised rate in this row's request: optimistic until it drafts here,
        as on a fresh server."""
        return self.row_rates[row].mean if row in self.row_rates else OPTIMISTIC

    def drop_row(self, row: int) -> None:
        self.evidence.pop(row, None)
        self.row_rates.pop(row, None)

    def move_row(self, src: int, dst: int) -> None:
        self.drop_row(dst)
        if src in self.evidence:
            self.evidence[dst] = self.evidence.pop(src)
        if src in self.row_rates:
            self.row_rates[dst] = self.row_rates.pop(src)

    @property
    def cheap(self) -> bool:
        """Proposes before the others: self-sizing, deterministic, and cheaper than ``CHEAP``."""
        return self.costs is None and not self.sampled and self.c < CHEAP

    def worth(self, cap: int, row: int | None = None) -> tuple[float, int]:
        """(predicted speedup over plain decoding, draft length to ask for) for ``row`` (None: any row, from
        the evidence of every request: the order members are asked in)."""
        if self.costs is None:
            g = self.drafter.gamma
            return self.rates.mean if row is None else self.rate_at(row), min(cap, g if isinstance(g, int) else cap)
        alpha = self.alpha if row is None else self.row_evidence(row).alpha
        g = self.costs.best_gamma(alpha, min(cap, MAX_GAMMA))
        return (self.costs.speedup(alpha, g) if g else 0.0), g

    # -- a dear self-sizing member's probes ------------------------------------------------------------
    @property
    def probe_due(self) -> bool:
        """A losing self-sizing member is tried again after ``interval`` idle steps."""
        return self.costs is None and self.steps > 0 and self.probes.due()
