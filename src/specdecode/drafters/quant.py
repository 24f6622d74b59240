"""Quantized self-drafting: the target's own int4 copy drafts for it (ML-SpecQD, arXiv:2503.13565).

No training and no second checkpoint: at the first ``prepare_rows`` the drafter quantizes the
target's layer matrices to int4 (``models.loading.quantized_copy``; embeddings, norms, RoPE tables
and tokenizer are shared, so memory grows by one packed copy, ~0.28 bytes per weight) and drafts
with it exactly as ``DraftModelDrafter`` drafts with a separate small model: its own KV cache, γ
autoregressive steps, one batched forward for every drafting row. It agrees with the target far
more often than a small trained draft (same weights, rounded), and costs what the int4 bytes cost
(c ~ 0.3-0.6 of a bf16 step when weight bandwidth rules). Its measured c and v(k) enter
``gamma="auto"`` through ``DraftModelDrafter.costs_for`` (the cost cache tells the copy from the
target by its kernels label). Verification is the target's own, so the output law is the
target's whatever the copy proposes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from ..config import ConfigError
from ..costmodel import MAX_GAMMA, Costs
from .base import Acceptance, Draft, DraftContext, Gamma, RowZeroAdapter, check_gamma
from .model import DraftModelDrafter
from .vocab import VocabSpec

if TYPE_CHECKING:
    from ..models import Model

DRAFT_FORMAT = "int4"
# The γ policy's acceptance prior for this drafter. The generic prior (0.7) describes a small trained
# draft; an int4 copy of the target agrees with it far more often (α ~ 0.95 greedy on the bundled
# target), and with the generic prior γ auto never tried it at c ~ 0.4: E(0.7, γ) / (γ c + v(γ))
# stays under the policy's margin, so no evidence ever came in. The prior weighs two judged tokens,
# so a copy that agrees less is found out within a step or two (``drafters.base.Acceptance``).
PRIOR_ALPHA = 0.9


class QuantDrafter(RowZeroAdapter):
    """``DraftModelDrafter`` over an int4 copy of whichever target it is prepared for."""

    wants_hidden = False

    def __init__(self, gamma: Gamma = "auto", max_gamma: int = MAX_GAMMA, vocab: VocabSpec = "auto",
                 fmt: str = DRAFT_FORMAT) -> None:
        self.gamma = check_gamma(gamma)
        self.max_gamma = max_gamma
        self.fmt = fmt
        self._vocab = vocab
        self.acceptance = Acceptance(prior_alpha=PRIOR_ALPHA)
        self._target: Optional["Model"] = None
        self._inner: Optional[DraftModelDrafter] = None
        self._unusable: Optional[str] = None  # why this target cannot have a quantized copy (GPU, bf16 compute)

    @property
    def model(self) -> Optional["Model"]:
        """The quantized copy (None before the first ``prepare_rows``)."""
        return self._inner.model if self._inner is not None else None

    @property
    def last_catch_up(self) -> int:
        return self._inner.last_catch_up if self._inner is not None else 0

    @property
    def max_len(self) -> int:
        return self._drafter().max_len

    def _drafter(self) -> DraftModelDrafter:
        if self._unusable is not None:
            raise ConfigError(f"drafter 'quant': {self._unusable}")
        if self._inner is None:
            raise RuntimeError("QuantDrafter.prepare_rows(target, ...) must be called before drafting")
        return self._inner

    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Quantize ``target`` once (per target), then size the copy's cache for ``rows`` rows. A target
        that cannot have a quantized copy (CUDA, bf16 compute, no kernel) fails at the first proposal,
        not here: the server prepares every registered drafter."""
        if target is not self._target:
            from ..models.loading import quantized_copy

            self._target, self._inner, self._unusable = target, None, None
            try:
                copy = quantized_copy(target, self.fmt)
            except ConfigError as e:
                self._unusable = str(e)
                return
            self._inner = DraftModelDrafter(copy, gamma=self.gamma, max_gamma=self.max_gamma, vocab=self._vocab)
            self._inner.acceptance = self.acceptance  # the core reads and updates ours
        if self._unusable is None:
            self._drafter().prepare_rows(target, rows, max_len)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        if self.gamma != "auto":
            return None
        if target is not self._target:
            self.prepare_rows(target, 1, target.max_seq_len)
        return None if self._unusable is not None else self._drafter().costs_for(target)

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        return self._drafter().propose_rows(contexts)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        self._drafter().on_verified_row(row, n_accepted)

    def reset_row(self, row: int) -> None:
        if self._inner is not None:
            self._inner.reset_row(row)

    def move_row(self, src: int, dst: int) -> None:
        if self._inner is not None:
            self._inner.move_row(src, dst)

