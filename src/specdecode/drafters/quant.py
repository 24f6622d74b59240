"""Quantized self-drafting: the target's own int4 copy drafts for it (ML-SpecQD, arXiv:2503.13565).

No training and no second checkpoint: at the first ``prepare_rows`` the drafter quantizes the
target's layer matrices to int4 (``models.loading.quantized_copy``; embeddings, norms, RoPE tables
and tokenizer are shared, so memory grows by one packed copy, ~0.28 bytes per weight). It agrees
with the target far more often than a small trained draft (same weights, rounded), and costs what
the int4 bytes cost (c ~ 0.3-0.5 of a bf16 step where weight bandwidth rules).

**One cache.** The copy has the target's shape, so it drafts on the target's own KV cache, the way a
layer-skip draft shares the layers it runs (``LayerSkipDrafter`` with every layer shared): its
queries attend to the entries the target wrote for the verified tokens, and its own draft tokens'
entries go to the slots after them, which the target's verification pass then overwrites. So the
copy never prefills the prompt, never catches up on accepted tokens, and keeps no cache of its own:
a draft step is the copy's forward over the one pending token and then over its own tokens. Its
measured c and the target's v(k) enter ``gamma="auto"``. Verification is the target's own, so the
output law is the target's whatever the copy proposes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ..cache import KVCache
from ..config import ConfigError
from ..sizing.book import chain_spec
from ..sizing.costs import Costs
from .base import Acceptance, Gamma
from .layerskip import DraftLayers, LayerSkipDrafter, check_family
from .plugin import AutoMember, BenchVariant, DrafterOptions, DrafterSpec
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


class QuantDrafter(LayerSkipDrafter):
    """A ``BatchDrafter``: every layer of the target, run by its packed copy on the target's cache.

    ``share_cache=False`` gives the copy a cache of its own (caught up with the verified tokens):
    the reference the shared cache is tested against."""

    def __init__(self, gamma: Gamma = "auto", fmt: str = DRAFT_FORMAT, share_cache: bool = True,
                 draft_vocab: VocabSpec = "auto") -> None:
        super().__init__(gamma=gamma, share_cache=share_cache, draft_vocab=draft_vocab)
        self.fmt = fmt
        self.acceptance = Acceptance(prior_alpha=PRIOR_ALPHA)
        self._copy: Optional["Model"] = None

    @property
    def model(self) -> Optional["Model"]:
        """The quantized copy (None before the first ``prepare_rows``)."""
        return self._copy

    def resolve(self, target: "Model") -> DraftLayers:
        """Every layer, run by a packed copy made here (a ConfigError where the target cannot have one:
        CUDA, bf16 activations, no kernel; the drafter then fails at its first proposal)."""
        from ..models.loading import quantized_copy

        check_family(target)
        self.calibration = None
        self._copy = None
        try:
            self._copy = quantized_copy(target, self.fmt)
        except ConfigError as e:
            raise ConfigError(f"drafter 'quant': {e}") from e
        return DraftLayers.every(target.config.n_layers)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """c of the copy's step and v(k) of the target, measured once per machine and pair."""
        if self.gamma != "auto":
            return None
        if target is not self._target:
            self.prepare_rows(target, 1, target.max_seq_len)
        if self._copy is None:
            return None
        if self._costs is None or self._costs[0] is not target:
            spec = chain_spec(target, self._copy, draft_head=self.cut_head, label="the int4 copy's")
            self._costs = (target, (), self.pricer.costs(target, spec))
        return self._costs[2]

    def cut_rows(self, target: "Model", ids: torch.Tensor) -> torch.Tensor:
        """The cut's output rows in the copy's own format."""
        from ..kernels.quant import quantize

        return quantize(target.output_rows(ids), self.fmt)

    def _partial_logits(self, ids: torch.Tensor, view: KVCache, rows: slice, last_only: bool) -> torch.Tensor:
        if self._copy is None:
            raise ConfigError("drafter 'quant': the quantized copy is missing; call prepare_rows(target, ...) first")
        return self._copy.forward(ids, view, rows=rows, last_only=last_only, head=self.cut_head)


def _build(o: DrafterOptions) -> QuantDrafter:
    return QuantDrafter(o.gamma, draft_vocab=o.vocab)


def _fits(target: "Model") -> bool:
    """An int4 copy drafts for a wider target only: of an int4 target it costs what the target does (c ~ 1.15
    on SmolLM2), of an int8 one c ~ 1.4 was measured, so auto never chose it and preparing it cost ~3 s."""
    return target.weight_format not in ("int4", "int8")


# The int4 copy joins auto only when there is no draft model: it costs ~0.28 bytes per weight of memory and its
# quantization at load, and a draft model (c ~ 0.05 of a target pass on the bundled pair against the copy's ~0.35)
# beats it unless its acceptance is far lower. Without one (a user with one checkpoint) it is the strongest
# training-free member: 1.5x plain on the bundled target, where suffix and lookup need repeats.
SPECS = (DrafterSpec(
    "quant", "self-speculation: an int4 copy of the target drafts (quantized at load; no training, no second "
    "checkpoint; CPU)", _build, auto=AutoMember(4, only_without_draft_model=True, fits=_fits),
    bench=(BenchVariant("quant", "quantized self-draft (--drafter quant): the target's int4 copy drafts, γ from "
                        "--gammas", sweep="gammas"),)),)
