"""The pricer: what a drafter that sizes its own drafts asks instead of pricing itself.

The γ policy decides how much a chain drafter drafts; a drafter that plans its own trees (EAGLE, Medusa,
suffix) or chooses among members (``auto``) decides inside its own step, and it must decide by the same
rule. So the decode core hands every drafter the policy's ``Pricer`` when it prepares it, and a drafter
reads the margin from it rather than importing the policy's constants: configuring the policy configures
every sizing decision at once. Drafters not prepared by a core (a test, a bench replay) price with the
default, the policy's own default.
"""

from __future__ import annotations

from dataclasses import dataclass

SPECULATION_MARGIN = 1.08  # predicted tokens/s over plain decoding needed before speculating


@dataclass(frozen=True)
class Pricer:
    """``margin``: the predicted speedup over plain decoding a draft must beat; near break-even an
    estimate is as likely to lose as to win."""

    margin: float = SPECULATION_MARGIN

    def pays(self, speedup: float) -> bool:
        """Whether a draft predicted at ``speedup`` over plain decoding is worth its pass."""
        return speedup > self.margin


DEFAULT_PRICER = Pricer()
