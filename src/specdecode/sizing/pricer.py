"""The pricer: what a drafter that sizes its own drafts asks instead of pricing itself.

The γ policy decides how much a chain drafter drafts; a drafter that plans its own trees (EAGLE, Medusa,
suffix) or chooses among members (``auto``) decides inside its own step, and it must decide by the same
rule. So the decode core hands every drafter the policy's ``Pricer`` when it prepares it, and a drafter
reads the margin from it rather than importing the policy's constants, and fetches its step costs through
it rather than from the cost book directly: configuring the policy configures every sizing decision at
once, costs included (a caller with figures of its own, a test on a tiny model, hands them here). Drafters
not prepared by a core (a bench replay) price with the default, the policy's own default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .book import CostSpec, get_costs
from .costs import Costs

if TYPE_CHECKING:
    from ..models import Model

SPECULATION_MARGIN = 1.08  # predicted tokens/s over plain decoding needed before speculating
CostSource = Callable[["Model", CostSpec], Costs]  # (target, a drafter's spec) -> its costs


@dataclass(frozen=True)
class Pricer:
    """``margin``: the predicted speedup over plain decoding a draft must beat; near break-even an
    estimate is as likely to lose as to win. ``book``: where a drafter's step costs come from (the cost
    book: cached per machine, else measured once)."""

    margin: float = SPECULATION_MARGIN
    book: CostSource = get_costs

    def pays(self, speedup: float) -> bool:
        """Whether a draft predicted at ``speedup`` over plain decoding is worth its pass."""
        return speedup > self.margin

    def costs(self, target: "Model", spec: CostSpec) -> Costs:
        """The costs of the steps ``spec`` declares, on ``target``."""
        return self.book(target, spec)


DEFAULT_PRICER = Pricer()
