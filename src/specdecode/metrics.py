"""Per-run speculation statistics: what the paper's symbols look like on a real run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

# the source of draft tokens a grammar forces (structured output): judged like a drafter's, made by none
FORCED_SOURCE = "grammar"


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_passes: int = 0  # decode passes of the target (prefill not counted)
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    # per source of draft tokens (a drafter, auto's member, or FORCED_SOURCE): they sum to drafted and accepted
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    chooser: Optional[str] = None  # the drafter that chose among the sources (auto), never a source itself

    def record_source(self, source: str, n_drafted: int, n_accepted: int, chooser: Optional[str] = None) -> None:
        """One verified draft's tokens, to the source that made them; ``chooser``: the composite drafter that
        picked that source, kept apart so the per-source counts hold only what was really drafted."""
        self.drafted_by[source] = self.drafted_by.get(source, 0) + n_drafted
        self.accepted_by[source] = self.accepted_by.get(source, 0) + n_accepted
        if chooser is not None:
            self.chooser = chooser

    def record_forced(self, n_drafted: int, n_accepted: int) -> None:
        """Draft tokens a grammar forced: counted in the totals, so counted here under their own source."""
        self.record_source(FORCED_SOURCE, n_drafted, n_accepted)

    def record_step(self, n_drafted: int, n_accepted: int, n_emitted: int) -> None:
        self.target_passes += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.generated_tokens += n_emitted
        if n_drafted > len(self.drafted_by_position):
            grow = n_drafted - len(self.drafted_by_position)
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(n_drafted):
            self.drafted_by_position[i] += 1
        for i in range(n_accepted):
            self.accepted_by_position[i] += 1

    @property
    def alpha(self) -> float:
        """Empirical acceptance rate α̂: accepted / drafted draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens produced per target pass (plain decoding = 1.00)."""
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the whole wall time (prefill included)."""
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(alpha=self.alpha, tau=self.tau, acceptance_by_position=self.acceptance_by_position,
                 tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s, total_s=self.total_s)
        return d

    def summary(self) -> str:
        return (f"{self.generated_tokens} tokens in {self.total_s:.2f}s: {self.tokens_per_s:.1f} tok/s | "
                f"target passes {self.target_passes} | tau {self.tau:.2f} tokens/pass | "
                f"alpha {self.alpha:.2f} ({self.accepted}/{self.drafted} drafted accepted)"
                + (" | accepted by " + ", ".join(f"{k} {v}" for k, v in self.accepted_by.items())
                   + (f" (chosen by {self.chooser})" if self.chooser else "")
                   if len(self.accepted_by) > 1 or self.chooser else ""))
