"""Drafters by name: ``generate``, ``serve`` and ``bench`` list and build the same ones.

A new drafter adds one ``register(DrafterSpec(...))`` here (or in its own module) and nothing
else: the CLI's ``--drafter`` choices, the server's per-request ``drafter`` field and the
bench's methods all read this table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..config import ConfigError
from .base import BatchDrafter, Gamma, PerRowDrafters
from .eagle import EagleDrafter
from .exit_adapter import ExitAdapterDrafter, is_exit_adapter_dir
from .medusa import MedusaDrafter
from .crosstok import CrossTokenizerDrafter
from .layerskip import LayerSkipDrafter
from .model import DraftModelDrafter
from .ngram import PromptLookupDrafter
from .quant import QuantDrafter
from .suffix import SuffixDrafter
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
    heads: Optional[str] = None  # a Medusa heads directory (``distill --method medusa``)
    exit_layer: Optional[int] = None  # layer skip: draft with the first N layers (overrides the calibration)
    skip_layers: Optional[tuple[int, ...]] = None  # layer skip: draft without these layers (likewise)
    eagle: Optional[str] = None  # an EAGLE-3 draft directory (``distill --method eagle``; the CLI's --heads DIR)
    exit_adapter: Optional[str] = None  # an exit adapter directory (``distill --method early-exit``; --heads DIR)


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    help: str  # one line for --help and the server's error messages
    needs_draft_model: bool
    build: Callable[[DrafterOptions], Optional[BatchDrafter]]  # None: plain decoding, or what it needs is absent
    needs_heads: bool = False  # Medusa: a heads directory (--heads DIR)
    uses_draft_model: bool = False  # takes a draft model when there is one (auto): the CLI loads the bundled one
    needs_eagle: bool = False  # EAGLE: an EAGLE-3 draft directory (--heads DIR)
    needs_exit_adapter: bool = False  # layerskip-adapter: an exit adapter directory (--heads DIR)
    own_tokenizer: bool = False  # takes a draft model whose tokenizer differs from the target's (crosstok)


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
    if spec.needs_heads and options.heads is None:
        raise ConfigError(f"drafter {name!r} needs Medusa heads (--heads DIR); train them with `specdecode distill "
                          "--method medusa --target TARGET --out DIR`")
    if spec.needs_eagle and options.eagle is None:
        raise ConfigError(f"drafter {name!r} needs an EAGLE-3 draft directory (--heads DIR); train one with "
                          "`specdecode distill --method eagle --target TARGET --out DIR`")
    if spec.needs_exit_adapter and exit_adapter_dir(options) is None:
        raise ConfigError(f"drafter {name!r} needs an exit adapter directory (--heads DIR); train one with "
                          "`specdecode distill --method early-exit --target TARGET --out DIR`")
    return spec.build(options)


def exit_adapter_dir(o: DrafterOptions) -> Optional[str]:
    """The exit adapter to draft with: ``exit_adapter``, else ``heads`` when it holds one (the server and
    the CLI pass every ``--heads DIR`` as ``heads``)."""
    if o.exit_adapter is not None:
        return o.exit_adapter
    return o.heads if is_exit_adapter_dir(o.heads) else None


def _model(o: DrafterOptions) -> BatchDrafter:
    assert o.draft is not None
    return DraftModelDrafter(o.draft, gamma=o.gamma, vocab=o.vocab)


def _ngram(o: DrafterOptions) -> BatchDrafter:
    k = LOOKUP_GAMMA if o.gamma == "auto" else int(o.gamma)
    PromptLookupDrafter(o.ngram_max, o.ngram_min, k)  # validate the options now, not at the first request
    return PerRowDrafters(lambda: PromptLookupDrafter(o.ngram_max, o.ngram_min, k), k)


def _layerskip(o: DrafterOptions) -> BatchDrafter:
    return LayerSkipDrafter(exit_layer=o.exit_layer, skip_layers=o.skip_layers, gamma=o.gamma)


def _exit_adapter(o: DrafterOptions) -> Optional[BatchDrafter]:
    path = exit_adapter_dir(o)
    return ExitAdapterDrafter.load(path, gamma=o.gamma) if path is not None else None


def _medusa(tree: bool) -> Callable[[DrafterOptions], Optional[BatchDrafter]]:
    def build(o: DrafterOptions) -> Optional[BatchDrafter]:
        if o.heads is None or is_exit_adapter_dir(o.heads):
            return None  # the server builds every drafter it can: without heads, not this one
        return MedusaDrafter.load(o.heads, tree=tree, gamma=o.gamma, vocab=o.vocab)

    return build


register(DrafterSpec("model", "a separate small draft model (--draft DIR)", True, _model))
register(DrafterSpec("crosstok", "a draft model with its OWN tokenizer (--draft DIR): its text is re-tokenized for "
                     "the target (SLEM, arXiv:2502.05202), exact as a deterministic draft", True,
                     lambda o: CrossTokenizerDrafter(o.draft, gamma=o.gamma) if o.draft is not None else None,
                     own_tokenizer=True))
register(DrafterSpec("ngram", "prompt lookup: copy what followed the last match of the recent tokens", False, _ngram))
register(DrafterSpec("layerskip", "self-speculation: the target's own first layers (or all but a skip set) draft; "
                     "`specdecode calibrate` picks them", False, _layerskip))
register(DrafterSpec("layerskip-adapter", "self-speculation: the target's first layers plus a trained exit adapter "
                     "(--heads DIR from `specdecode distill --method early-exit`; the bundled target's by default)",
                     False, _exit_adapter, needs_exit_adapter=True))
register(DrafterSpec("medusa", "Medusa heads on the target's hidden state (--heads DIR): a token tree sized by "
                                "the cost model", False, _medusa(True), needs_heads=True))
register(DrafterSpec("medusa-chain", "Medusa heads, top-1 of each head as a chain (--heads DIR)", False,
                     _medusa(False), needs_heads=True))
register(DrafterSpec("suffix", "suffix drafting: trees of the most frequent continuations of the longest match in "
                     "the sequence and in earlier outputs (shared by all requests)", False,
                     lambda o: SuffixDrafter(o.gamma)))
register(DrafterSpec("eagle", "EAGLE-3 draft layer on the target's low/mid/high features (--heads DIR): an EAGLE-2 "
                     "dynamic tree sized by the cost model", False,
                     lambda o: EagleDrafter.load(o.eagle, gamma=o.gamma) if o.eagle is not None else None,
                     needs_eagle=True))
AUTO_MEMBERS = ("model", "eagle", "medusa", "layerskip", "quant", "suffix", "ngram")  # candidates, preferred first on ties
# The target's int4 copy ("quant") joins only when there is no draft model: it costs ~0.28 bytes per weight of
# memory and its quantization at load, and a draft model (c ~ 0.05 of a target pass on the bundled pair against
# the copy's ~0.35) beats it unless its acceptance is far lower. Without one (a user with one checkpoint) it is
# the strongest training-free member: 1.5x plain on the bundled target, where suffix and lookup need repeats.


def _auto(o: DrafterOptions) -> Optional[BatchDrafter]:
    """Every candidate this run can build (a draft model only with --draft, heads only with --heads)."""
    from .auto import AutoDrafter  # lazy: auto composes the registry's own drafters

    members: dict[str, BatchDrafter] = {}
    for name in AUTO_MEMBERS:
        if name not in REGISTRY or (name == "quant" and "model" in members):
            continue
        try:  # each member sizes its own drafts; the request's gamma still caps them
            d = build_drafter(name, dataclasses.replace(o, gamma="auto"))
        except (ConfigError, OSError, ValueError, KeyError):  # it lacks what it needs, or --heads holds another kind
            continue
        if d is not None:
            members[name] = d
    explicit = o.exit_layer is not None or o.skip_layers is not None
    usable = {"layerskip": lambda d: explicit or getattr(d, "calibration", None) is not None}
    return AutoDrafter(members, usable=usable)


register(DrafterSpec("auto", "choose per request and step among the drafters available (draft model, heads, "
                     "calibrated layer skip, the target's int4 copy when there is no draft model, suffix, prompt "
                     "lookup) by the cost model; plain when none pays", False,
                     _auto, uses_draft_model=True))
register(DrafterSpec("quant", "self-speculation: an int4 copy of the target drafts (quantized at load; no training, "
                     "no second checkpoint; CPU)", False, lambda o: QuantDrafter(o.gamma)))
register(DrafterSpec("none", "plain decoding (no drafts)", False, lambda o: None))
