"""One γ policy for every path: the draft length that maximises expected tokens per second.

    tokens(γ)  = Σ_rows E(α_row, min(γ, cap_row))                  (rows without a drafter give 1)
    seconds(γ) = t_target(B, 1 + widest draft) + Σ_drafters t_draft(drafter, rows drafting) · depth

B, the batch width, is an input: ``generate`` is the case B = 1, the server any B. Neither a
client nor one bad measurement can switch speculation off for good (issue #30):

* **Costs are checked against the passes actually run.** Every pass is timed; a shape's estimate
  is a low quantile (``QUANTILE``) of its last ``WINDOW`` timings, since load only ever adds time.
  Offline figures (``sizing.costs``: v(k) of the target, c of the draft, quick-measured or cached)
  only fill the shapes not yet seen, scaled down by the most the live passes show them overstated
  (``overstated``: a width the cache makes look dear is never run, so never measured). Until a
  shape has ``TRUST`` live timings the cheaper of the two counts (an optimistic figure gets tried,
  which measures it; a pessimistic one would never be); after that the live one does. Offline
  figures that disagree with live ones by more than ``DISAGREE``× are replaced by the live ones
  (``take_refined``: the core rewrites the cache file).
* **Acceptance evidence is per row** (``RowEvidence``): a row starts from the drafter's own prior
  plus its history across requests, weighted at most ``HISTORY_WEIGHT`` judged tokens, so three
  junk requests (or a hundred) move a new request's start by a bounded amount.
* **A switched-off row is probed on a fixed schedule of its own**: at its first pass, then after
  ``PROBE_GAPS[0]`` plain passes, doubling each time, with the draft length a fresh drafter would
  take. No request inherits "off" from another.

At B = 1 every term is a multiple of one target pass, so the choice is E(α, γ) / (γ c + v(γ))
(Leviathan et al.); leaving plain decoding needs a clear predicted win (``margin``): near
break-even an estimate is as likely to lose (measured: 0.93× at 16 rows without it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from .costs import MAX_GAMMA, Costs, expected_tokens, plausible
from .live import DISAGREE, MIN_DELTA_C, TRUST, Timings, overstated, refined_v
from .pricer import DEFAULT_PRICER, Pricer

ALPHA_BUCKETS = 1024  # α resolution of the memoised single-row choice
REFRESH = 16  # timings between rebuilds of the single-row cost table (and its memoised choices)

@dataclass
class RowPlan:
    """What the policy needs to know of one row this step."""

    drafter: Optional[str]  # the row's drafter name (None: plain decoding)
    cap: int  # most draft tokens the row may take now (γ of the request, room, context)
    auto: bool  # the row's ``Speculation.adaptive`` (sizing/gamma.py); False: the cap, drafted whenever there is room
    alpha: float  # the row's acceptance estimate
    # the drafter sizes its own drafts (trees from its own cost model): an auto row gets its whole cap
    # or nothing, since a chain γ from chain-shaped α would cut a tree the drafter sized to pay
    sizes_itself: bool = False


class GammaPolicy:
    """Chooses each row's draft length for one batched step (see the module docstring)."""

    def __init__(self, pricer: Pricer = DEFAULT_PRICER, max_gamma: int = MAX_GAMMA) -> None:
        self.margin, self.max_gamma = pricer.margin, max_gamma
        self.pricer = pricer  # the same rule and cost book, handed to every drafter the core prepares
        self._t: dict[tuple[int, int], Timings] = {}  # (batch, width) -> target pass seconds
        self._draft: dict[tuple[str, int], Timings] = {}  # (drafter, rows drafting) -> seconds per position
        # offline single-row costs per drafter (a chain pass, a tree pass with hidden states: each
        # drafter's own v), keyed by drafter so the order of preparation cannot change a choice
        self._offline: dict[str, Costs] = {}
        self._tables: dict[str, tuple[tuple[float, ...], float]] = {}  # drafter -> (target s by width, draft s)
        self._memo: dict[tuple[str, int, int], int] = {}  # single-row choices, valid until the next refresh
        self._records = 0
        # single-row pass widths whose live timings became trusted: the core's cue to refine the self-sizing
        # drafters at once (``trusted_passes`` changed), not at the request's end
        self.trust_events = 0
        self._refined: dict[str, Costs] = {}  # replaced offline costs not yet handed out (take_refined)

    # -- measurements -------------------------------------------------------------------------
    def set_offline(self, drafter: str, costs: Costs) -> None:
        """Offline single-row costs of ``drafter`` with this target (v is the target's, c the drafter's)."""
        self._offline[drafter] = costs
        self._refresh()

    def offline(self, drafter: str) -> Optional[Costs]:
        return self._offline.get(drafter)

    def _record(self, table: dict, key: object, seconds: float) -> Timings:
        t = table.get(key)
        if t is None:
            t = table[key] = Timings()
        t.add(seconds)
        self._records += 1
        if t.n == 1 or t.n == TRUST or self._records % REFRESH == 0:
            self._refresh()
        return t

    def record_target(self, batch: int, width: int, seconds: float) -> None:
        if self._record(self._t, (batch, width), seconds).n == TRUST and batch == 1:
            self.trust_events += 1

    def record_draft(self, drafter: str, rows: int, depth: int, seconds: float) -> None:
        """``rows`` rows drafted up to ``depth`` tokens each in ``seconds``."""
        self._record(self._draft, (drafter, rows), seconds / max(1, depth))

    def _refresh(self) -> None:
        """Rebuild the single-row tables from the live timings; replace offline costs they contradict."""
        self._tables.clear()
        self._memo.clear()
        for name, costs in list(self._offline.items()):
            live = self._live_costs(name, costs)
            if live is not None and disagree(costs, live):
                self._offline[name] = self._refined[name] = live

    def take_refined(self) -> dict[str, Costs]:
        """Offline costs replaced by live ones since the last call (the caller persists them)."""
        out, self._refined = self._refined, {}
        return out

    # -- estimates ----------------------------------------------------------------------------
    def _trusted(self, t: Optional[Timings]) -> Optional[float]:
        return t.estimate if t is not None and t.n >= TRUST else None

    def _live_costs(self, name: str, costs: Costs) -> Optional[Costs]:
        """``costs`` with every figure the live timings know well enough put in (None: not enough yet).
        The unit is the trusted one-token pass, else the trusted widths through the offline v."""
        trusted = self.trusted_passes()
        if not trusted:
            return None
        t1 = trusted.get(1) or min(s / costs.v_at(w - 1) for w, s in trusted.items())
        d = self._trusted(self._draft.get((name, 1)))
        v, measured = list(costs.v), costs.measured
        if 1 in trusted:  # v(k) needs the one-token pass itself; else only c can be checked
            known: list[Optional[float]] = [None] * len(v)
            for w, s in trusted.items():
                if w - 1 < len(v):
                    known[w - 1] = max(1.0, s / t1)
            v, measured = refined_v(costs, known)
        elif d is None:
            return None
        return replace(costs, v=tuple(v), c=d / t1 if d is not None else costs.c, measured=measured,
                       target_s=tuple(t1 * x for x in v), draft_s=d if d is not None else costs.draft_s)

    def trusted_passes(self) -> dict[int, float]:
        """Seconds of a single-row target pass by width, for the widths with ``TRUST`` live timings (what a
        self-sizing drafter checks its measured v(n) against: ``sizing/live.py``)."""
        return {w: s for (b, w), t in self._t.items() if b == 1 and (s := self._trusted(t)) is not None}

    def _unit(self, v: Sequence[float]) -> float:
        """Seconds of a one-token single-row pass: what offline ratios are multiples of."""
        t = self._t.get((1, 1))
        if t is not None:
            return t.estimate
        seen = [t.estimate / v[min(w - 1, len(v) - 1)] for (b, w), t in self._t.items() if b == 1]
        return min(seen) if seen else 1.0

    def _table(self, name: str) -> tuple[tuple[float, ...], float]:
        """Single-row seconds of a target pass by width (1..) and of one draft position, for ``name``."""
        got = self._tables.get(name)
        if got is not None:
            return got
        costs = self._offline[name]
        unit = self._unit(costs.v)
        live = [self._t.get((1, w)) for w in range(1, self.max_gamma + 2)]
        trusted = [t is not None and t.n >= TRUST for t in live]
        offline = [unit * costs.v_at(w) for w in range(len(live))]
        # a width timed even once bounds the cache's error (load only adds time); a pass is never below the unit
        scale = overstated(offline, [max(unit, t.estimate) if t is not None else None for t in live])
        widths = tuple(plausible([blend(t, x * scale) for t, x in zip(live, offline)], trusted))
        got = self._tables[name] = (widths, blend(self._draft.get((name, 1)), unit * costs.c))
        return got

    def target_seconds(self, batch: int, width: int, drafter: Optional[str] = None) -> float:
        """Cost of a [batch, width] pass: at B = 1 with ``drafter``'s offline costs, the blended table;
        else the live envelope (a shape costs at least the dearest measured shape it dominates)."""
        if batch == 1 and drafter in self._offline:
            table = self._table(drafter)[0]
            return table[min(width, len(table)) - 1]
        t = self._t.get((batch, width))
        bound = [x.estimate for (b, w), x in self._t.items() if b <= batch and w <= width]
        if t is not None and t.n >= TRUST:
            return t.estimate
        return max(bound) if bound else 0.0

    def draft_seconds(self, drafter: str, rows: int) -> float:
        """Seconds per draft position when ``rows`` rows of ``drafter`` draft together."""
        if rows == 1 and drafter in self._offline:
            return self._table(drafter)[1]
        bound = [t.estimate for (k, r), t in self._draft.items() if k == drafter and r <= rows]
        return max(bound) if bound else 0.0

    def snapshot(self) -> dict[str, object]:
        """The measured costs, for /health and debugging."""
        return {
            "target_seconds": {f"{b}x{w}": round(t.estimate, 6) for (b, w), t in sorted(self._t.items())},
            "draft_seconds": {f"{k}:{r}rows": round(t.estimate, 6) for (k, r), t in sorted(self._draft.items())},
            "offline": {"v": {k: list(c.v) for k, c in self._offline.items()},
                        "c": {k: c.c for k, c in self._offline.items()}} if self._offline else None,
        }

    # -- decision -----------------------------------------------------------------------------
    def _rate(self, plans: Sequence[RowPlan], lengths: Sequence[int], alphas: Sequence[float]) -> float:
        tokens = 0.0
        depth: dict[str, int] = {}
        rows: dict[str, int] = {}
        for p, g, a in zip(plans, lengths, alphas):
            tokens += expected_tokens(a, g)
            if g and p.drafter is not None:
                depth[p.drafter] = max(depth.get(p.drafter, 0), g)
                rows[p.drafter] = rows.get(p.drafter, 0) + 1
        only = plans[0].drafter if len(plans) == 1 else None
        seconds = self.target_seconds(len(plans), 1 + max(lengths, default=0), only)
        seconds += sum(self.draft_seconds(k, rows[k]) * d for k, d in depth.items())
        return tokens / max(seconds, 1e-12)

    def _best(self, plans: Sequence[RowPlan], alphas: Sequence[float]) -> int:
        top = min(self.max_gamma, max((p.cap for p in plans if p.auto), default=0))
        best_g, best_rate = 0, -1.0
        for g in range(top + 1):
            lengths = [min(g, p.cap) if p.auto else p.cap for p in plans]
            rate = self._rate(plans, lengths, alphas)
            if rate > best_rate * (self.margin if best_g == 0 else 1.0001):
                best_g, best_rate = g, rate
        return best_g

    def _single(self, p: RowPlan, alpha: float) -> int:
        """The memoised single-row choice (costs fixed until the next refresh make it a function of α)."""
        key = (p.drafter or "", p.cap, min(ALPHA_BUCKETS - 1, int(alpha * ALPHA_BUCKETS)))
        g = self._memo.get(key)
        if g is None:
            g = self._memo[key] = self._best([p], [(key[2] + 0.5) / ALPHA_BUCKETS])
        return g

    def choose(self, plans: Sequence[RowPlan]) -> list[int]:
        """Draft length per row for this step: a fixed γ gets its cap; every auto row gets min(γ, cap)
        for the one best γ, since the padded pass costs the widest row's width anyway."""
        if len(plans) == 1:
            p = plans[0]
            if not p.auto or p.cap == 0 or p.drafter is None or p.sizes_itself:
                return [p.cap if p.drafter is not None else 0]  # a lone self-sizing row: its own margin decides
            if p.drafter in self._offline:
                return [self._single(p, p.alpha)]
            return [self._best(plans, [p.alpha])]
        alphas = [p.alpha for p in plans]
        g = self._best(plans, alphas) if any(p.auto and p.cap for p in plans) else 0
        return [(((p.cap if g else 0) if p.sizes_itself else min(g, p.cap)) if p.auto else p.cap)
                if p.drafter is not None else 0 for p in plans]

    def probe_length(self, plan: RowPlan, fresh_alpha: float) -> int:
        """A probe's draft length: what the row would draft at a fresh drafter's α (``fresh_alpha``,
        or its own when higher), at least 1, so a probe sees what a fresh start would."""
        if plan.sizes_itself or plan.drafter is None:
            return plan.cap
        alpha = max(plan.alpha, fresh_alpha)
        if plan.drafter in self._offline:
            g = self._single(replace(plan, alpha=alpha), alpha)
        else:
            g = self._best([plan], [alpha])
        return max(1, min(plan.cap, g))


def blend(live: Optional[Timings], offline: float) -> float:
    """One shape's seconds from its live timings and an offline figure: the live estimate once
    trusted, before that the cheaper of the two (so a pessimistic figure gets tested)."""
    if live is None:
        return offline
    if live.n >= TRUST:
        return live.estimate
    return min(live.estimate, offline)


def disagree(offline: Costs, live: Costs) -> bool:
    """Whether live figures contradict offline ones by more than ``DISAGREE``× (c or any v(k))."""
    if abs(live.c - offline.c) > MIN_DELTA_C and max(live.c, offline.c) > DISAGREE * max(1e-9, min(live.c, offline.c)):
        return True
    return any(max(a, b) > DISAGREE * min(a, b) for a, b in zip(offline.v, live.v))
