"""One γ policy for every path: the draft length that maximises expected tokens per second.

    tokens(γ)  = Σ_rows E(α_row, min(γ, cap_row))                  (rows without a drafter give 1)
    seconds(γ) = t_target(B, 1 + widest draft) + Σ_drafters t_draft(drafter, rows drafting) · depth

B, the batch width, is an input: ``generate`` is the case B = 1, the server any B. Costs come
from two sources, used in one unit:

* offline (``costmodel.load_or_measure_costs``): v(k) of the target and c of a draft model, timed
  once per machine and pair with the thread's CPU clock, so background load cannot flatten them.
  They describe B = 1; at B = 1 every term is a multiple of one target pass, so the choice is
  E(α, γ) / (γ c + v(γ)) exactly (Leviathan et al.).
* online: every pass the core runs is timed (EMA per batch B and width), read through a monotone
  envelope (a shape costs at least the dearest measured shape it dominates, so noise cannot make a
  wider pass look cheaper, and an unmeasured shape gets a lower bound: tried once, then known).

α is the drafter's running acceptance (``drafters.base.Acceptance``: it carries over between
requests and fades, so a switched-off drafter gets a probe now and then). Leaving plain decoding needs a clear predicted
win (``margin``): near break-even an estimate is as likely to lose (measured: 0.93× at 16 rows
without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from .costmodel import MAX_GAMMA, expected_tokens

if TYPE_CHECKING:
    from .costmodel import Costs

SPECULATION_MARGIN = 1.08  # predicted tokens/s over plain decoding needed before speculating
ALPHA_BUCKETS = 1024  # α resolution of the memoised single-row choice


@dataclass
class RowPlan:
    """What the policy needs to know of one row this step."""

    drafter: Optional[str]  # the row's drafter name (None: plain decoding)
    cap: int  # most draft tokens the row may take now (γ of the request, room, context)
    auto: bool  # False: a fixed γ, drafted whenever there is room
    alpha: float  # the acceptance estimate of the row's drafter
    # the drafter sizes its own drafts (trees from its own cost model): an auto row gets its whole cap
    # or nothing, since a chain γ from chain-shaped α would cut a tree the drafter sized to pay
    sizes_itself: bool = False


class GammaPolicy:
    """Chooses each row's draft length for one batched step (see the module docstring)."""

    def __init__(self, margin: float = SPECULATION_MARGIN, ema: float = 0.2, max_gamma: int = MAX_GAMMA) -> None:
        self.margin, self.ema, self.max_gamma = margin, ema, max_gamma
        self._t: dict[tuple[int, int], float] = {}  # (batch, width) -> seconds
        self._draft: dict[tuple[str, int], float] = {}  # (drafter, rows drafting) -> seconds per draft position
        # offline v(k) of the target (B = 1) as each drafter measured it (a chain pass, a tree pass with
        # hidden states: not the same pass), and c per drafter; both keyed by drafter so the order in
        # which drafters are prepared cannot change a choice
        self._v: dict[str, tuple[float, ...]] = {}
        self._c: dict[str, float] = {}
        self._memo: dict[tuple[str, int, int], int] = {}  # offline single-row choices

    # -- measurements -------------------------------------------------------------------------
    def set_offline(self, drafter: str, costs: "Costs") -> None:
        """Offline single-row costs of ``drafter`` with this target (v is the target's, c the drafter's)."""
        self._v[drafter] = tuple(costs.v)
        self._c[drafter] = costs.c
        self._memo.clear()

    def _update(self, table: dict, key: object, value: float) -> None:  # type: ignore[type-arg]
        old = table.get(key)
        table[key] = value if old is None else old + self.ema * (value - old)

    def record_target(self, batch: int, width: int, seconds: float) -> None:
        self._update(self._t, (batch, width), seconds)

    def record_draft(self, drafter: str, rows: int, depth: int, seconds: float) -> None:
        """``rows`` rows drafted up to ``depth`` tokens each in ``seconds``."""
        self._update(self._draft, (drafter, rows), seconds / max(1, depth))

    # -- estimates ----------------------------------------------------------------------------
    def _scale(self, drafter: str) -> float:
        """Seconds of one single-row, one-token target pass: what ``drafter``'s offline ratios are multiples of."""
        v = self._v.get(drafter)
        if v is None:
            return 1.0
        measured = [s / v[min(w - 1, len(v) - 1)] for (b, w), s in self._t.items() if b == 1]
        return min(measured) if measured else 1.0

    def target_seconds(self, batch: int, width: int, drafter: Optional[str] = None) -> float:
        """Cost of a [batch, width] pass: offline at B = 1 when ``drafter`` measured it, else the online envelope."""
        v = self._v.get(drafter) if batch == 1 and drafter is not None else None
        if v is not None:
            return self._scale(drafter) * v[min(width - 1, len(v) - 1)]  # type: ignore[arg-type]
        bound = [v for (b, w), v in self._t.items() if b <= batch and w <= width]
        return max(bound) if bound else 0.0

    def draft_seconds(self, drafter: str, rows: int) -> float:
        """Seconds per draft position when ``rows`` rows of ``drafter`` draft together."""
        if rows == 1 and drafter in self._c:
            return self._c[drafter] * self._scale(drafter)
        bound = [v for (k, r), v in self._draft.items() if k == drafter and r <= rows]
        return max(bound) if bound else 0.0

    def snapshot(self) -> dict[str, object]:
        """The measured costs, for /health and debugging."""
        return {
            "target_seconds": {f"{b}x{w}": round(v, 6) for (b, w), v in sorted(self._t.items())},
            "draft_seconds": {f"{k}:{r}rows": round(v, 6) for (k, r), v in sorted(self._draft.items())},
            "offline": {"v": dict(self._v), "c": dict(self._c)} if self._v else None,
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

    def choose(self, plans: Sequence[RowPlan]) -> list[int]:
        """Draft length per row for this step: a fixed γ gets its cap; every auto row gets min(γ, cap)
        for the one best γ, since the padded pass costs the widest row's width anyway."""
        if len(plans) == 1:  # generate(): offline costs make the choice a function of α alone, memoised
            p = plans[0]
            if not p.auto or p.cap == 0 or p.drafter is None or p.sizes_itself:
                out = [p.cap if p.drafter is not None else 0]  # a lone self-sizing row: its own margin decides
            elif p.drafter in self._v and p.drafter in self._c:
                key = (p.drafter, p.cap, int(p.alpha * ALPHA_BUCKETS))
                g = self._memo.get(key)
                if g is None:
                    alpha = (key[2] + 0.5) / ALPHA_BUCKETS
                    g = self._memo[key] = self._best(plans, [alpha])
                out = [g]
            else:
                out = [self._best(plans, [p.alpha])]
        else:
            alphas = [p.alpha for p in plans]
            g = self._best(plans, alphas) if any(p.auto and p.cap for p in plans) else 0
            out = [(((p.cap if g else 0) if p.sizes_itself else min(g, p.cap)) if p.auto else p.cap)
                   if p.drafter is not None else 0 for p in plans]
        return out
