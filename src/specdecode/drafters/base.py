"""The one drafter protocol: every way of proposing tokens implements these three calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Protocol, runtime_checkable

import torch

from ..config import SamplingConfig

if TYPE_CHECKING:
    from ..models import Model


class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary, so draft tokens mean nothing to the target."""


@dataclass
class DraftContext:
    """What a drafter may look at when proposing.

    ``tokens`` is the whole sequence so far (prompt + generated); its last token
    is not yet in the target's cache. ``max_tokens`` is the most the engine can
    verify this step (token budget and context window). Extra inputs for heads
    (hidden states for Medusa/EAGLE) get typed fields here, never ``**kwargs``.
    """

    tokens: list[int]
    max_tokens: int
    sampling: SamplingConfig
    generator: Optional[torch.Generator]


@dataclass
class Draft:
    """Proposed tokens and, for stochastic drafters, the filtered law each was drawn from ([n, V])."""

    tokens: list[int] = field(default_factory=list)
    probs: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.tokens)


@runtime_checkable
class Drafter(Protocol):
    """``prepare`` once per target (checks + allocation), then ``propose``/``on_verified`` per step."""

    def prepare(self, target: "Model") -> None: ...

    def propose(self, ctx: DraftContext) -> Draft: ...

    def on_verified(self, n_accepted: int) -> None: ...

    def reset(self) -> None: ...
