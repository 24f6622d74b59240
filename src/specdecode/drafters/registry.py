"""Drafters by name: ``generate``, ``serve`` and ``bench`` list and build the same ones.

A new drafter adds one ``register(DrafterSpec(...))`` here (or in its own module) and nothing
else: the CLI's ``--drafter`` choices, the server's per-request ``drafter`` field and the
bench's methods all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..config import ConfigError
from .base import BatchDrafter, Gamma, PerRowDrafters
from .model import DraftModelDrafter
from .ngram import PromptLookupDrafter
from .vocab import VocabSpec

if TYPE_CHECKING:
    from ..models import Model

LOOKUP_GAMMA = 10  # prompt lookup's draft length when γ is "auto" (its drafts cost microseconds)


@dataclass(frozen=True)
class DrafterOptions:
    """Everything a registered drafter may be built from (each takes what it needs)."""

    draft: Optional["Model"] = None  # a separate draft model sharing the target's tokenizer
    gamma: Gamma = "auto"
    vocab: VocabSpec = "auto"  # a draft model's proposal vocabulary (FR-Spec)
    ngram_max: int = 3
    ngram_min: int = 1


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    help: str  # one line for --help and the server's error messages
    needs_draft_model: bool
    build: Callable[[DrafterOptions], Optional[BatchDrafter]]  # None: plain decoding


REGISTRY: dict[str, DrafterSpec] = {}


def register(spec: DrafterSpec) -> None:
    if spec.name in REGISTRY:
        raise ValueError(f"drafter {spec.name!r} is already registered")
    REGISTRY[spec.name] = spec


def drafter_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get_spec(name: str) -> DrafterSpec:
    if name not in REGISTRY:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def build_drafter(name: str, options: DrafterOptions) -> Optional[BatchDrafter]:
    """The named drafter (None for plain decoding), with a clear error when it lacks a draft model."""
    spec = get_spec(name)
    if spec.needs_draft_model and options.draft is None:
        raise ConfigError(f"drafter {name!r} needs a draft model (--draft DIR); or choose one of: "
                          f"{', '.join(n for n, s in REGISTRY.items() if not s.needs_draft_model)}")
    return spec.build(options)


def _model(o: DrafterOptions) -> BatchDrafter:
    assert o.draft is not None
    return DraftModelDrafter(o.draft, gamma=o.gamma, vocab=o.vocab)


def _ngram(o: DrafterOptions) -> BatchDrafter:
    k = LOOKUP_GAMMA if o.gamma == "auto" else int(o.gamma)
    PromptLookupDrafter(o.ngram_max, o.ngram_min, k)  # validate the options now, not at the first request
    return PerRowDrafters(lambda: PromptLookupDrafter(o.ngram_max, o.ngram_min, k), k)


register(DrafterSpec("model", "a separate small draft model (--draft DIR)", True, _model))
register(DrafterSpec("ngram", "prompt lookup: copy what followed the last match of the recent tokens", False, _ngram))
register(DrafterSpec("none", "plain decoding (no drafts)", False, lambda o: None))
