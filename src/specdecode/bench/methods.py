"""The bench's method protocol: what a method is, what it returns, and the context every method is built from.

A method family maps a name to a factory ``(BenchContext, setting) -> Method``; the setting is the
family's one integer knob (γ, or the number of lookup tokens), or None. A factory that cannot build
its method (no draft model, no transformers, a drafter's missing artifact) raises
``MethodUnavailable`` and the report lists it as skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol

import torch

from ..config import SamplingConfig
from ..drafters.plugin import SWEEPS as DRAFTER_SWEEPS
from ..drafters.vocab import VocabSpec, draft_vocab_for
from ..models import Model, load_model
from ..sizing.pricer import DEFAULT_PRICER, Pricer
from .stats import Step

SWEEPS = (*DRAFTER_SWEEPS, "peer_gammas")  # the peers' γs: transformers' assisted generation and its eager match


class MethodUnavailable(Exception):
    """The method cannot run in this setup; the message says why (shown as 'skipped: ...')."""


@dataclass
class RunOutput:
    token_ids: list[int]
    seconds: float  # wall time of the whole request, prefill included
    steps: Optional[list[Step]]  # (drafted, accepted) per target pass; None when the runtime hides it
    draft_seconds: float = 0.0
    prefill_seconds: Optional[float] = None  # the prompt's prefill, inside ``seconds``; None when the runtime hides it


class Method(Protocol):
    name: str
    family: str
    runtime: str  # "specdecode" or "transformers"
    setting: Optional[int]  # γ or lookup tokens

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput: ...


@dataclass
class BenchContext:
    """Models and knobs shared by every method of one benchmark run."""

    target: Model
    draft: Optional[Model]
    target_path: str
    draft_path: Optional[str]
    ignore_eos: bool = True
    draft_vocab: VocabSpec = "auto"  # the draft methods' output vocabulary (drafters/vocab.py)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # every method's (greedy by default)
    options: Mapping[str, object] = field(default_factory=dict)  # the drafters' declared options, by key
    artifacts: Mapping[str, str] = field(default_factory=dict)  # trained drafter directories, by artifact name
    own_drafts: Mapping[str, Model] = field(default_factory=dict)  # drafter -> its own-tokenizer draft (else draft)
    auto_draft: bool = True  # auto takes ``draft`` (False: found beside a --target, which generate's auto skips)
    pricer: Pricer = DEFAULT_PRICER  # every method's γ margin and cost book (sizing/pricer.py)
    _hf: dict[str, object] = field(default_factory=dict)
    _eager: dict[str, Model] = field(default_factory=dict)

    def eager_model(self, path: str) -> Model:
        """The checkpoint on eager PyTorch (``fast=False``: F.linear and the eager layer ops) with weight
        matrices in the compute dtype, loaded once; it runs beside the fast models in this process."""
        if path not in self._eager:
            self._eager[path] = load_model(path, device=str(self.target.device), dtype=self.target.dtype,
                                           weight_dtype="same", fast=False)
        return self._eager[path]

    def draft_head(self) -> Optional[torch.Tensor]:
        """The draft's restricted output matrix under ``draft_vocab`` (None: the full vocabulary)."""
        if self.draft is None:
            return None
        vocab = draft_vocab_for(self.draft, self.draft_vocab)
        return vocab.head if vocab is not None else None

    def require_draft(self) -> Model:
        if self.draft is None:
            raise MethodUnavailable("no draft model (pass --draft DIR)")
        return self.draft

    def hf_model(self, path: Optional[str]) -> torch.nn.Module:
        """The checkpoint loaded by transformers (once), same dtype and device as our runtime."""
        if path is None:
            raise MethodUnavailable("no draft model (pass --draft DIR)")
        if path not in self._hf:
            try:
                import transformers  # lazy: the optional peer takes ~1 s to import
            except ImportError as e:
                raise MethodUnavailable(f"transformers is not installed ({e}); pip install 'specdecode[bench]'") from e
            transformers.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()
            try:
                m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=self.target.dtype)
            except Exception as e:  # any load failure means: this peer cannot run here
                raise MethodUnavailable(f"transformers cannot load {path}: {type(e).__name__}: {e}") from e
            m = m.to(self.target.device).eval()  # type: ignore[arg-type]  # transformers' decorated .to
            eos = sorted(self.target.eos_token_ids)
            m.generation_config.pad_token_id = eos[0] if eos else 0
            if self.ignore_eos:  # generate exactly the budget, as our runs with ignore_eos do
                m.generation_config.eos_token_id = None
            self._hf[path] = m
        return self._hf[path]  # type: ignore[return-value]


@dataclass(frozen=True)
class MethodSpec:
    family: str
    runtime: str
    sweep: str  # which settings list gives its variants: one of SWEEPS
    factory: Callable[[BenchContext, Optional[int]], Method]
    help: str
    default: bool = False  # among the methods run without --methods
    with_auto: Optional[str] = None  # the family 'auto' in --gammas adds beside this one
    with_sampling: Optional[str] = None  # the family --temperature > 0 adds beside this one
