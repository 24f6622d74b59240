"""What the core runs: a ``Request`` (one sequence's ask, validated), its ``Row`` (tokens, generator,
detokenizer, stats, acceptance evidence) and the events a step yields (``StepEvent``, ``FinishEvent``,
``Failure``). ``DecodeCore`` (core.py) advances rows; the engine and the server read the events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

import torch

from .config import GenerationConfig, SamplingConfig, VerifyConfig
from .constraints import row_state
from .drafters.base import BatchDrafter
from .sizing.gamma import Gamma, Speculation
from .logprobs import TokenLogprob
from .metrics import GenerationStats
from .models import Model
from .sizing.estimate import RowEvidence
from .sampling import CoupledNoise, make_generator
from .text import IncrementalDetokenizer

if TYPE_CHECKING:
    from .constraints import Constraint


# -- events ------------------------------------------------------------------------------------
@dataclass
class StepEvent:
    """Tokens produced by one target pass, with their text pieces and origin."""

    token_ids: list[int]
    from_draft: list[bool]  # True: a draft token the target accepted
    pieces: list[str]  # text delta per token ('' while a multi-byte character is incomplete)
    drafted: int = 0  # draft tokens the target judged for this step
    logprobs: Optional[list[TokenLogprob]] = None  # per token, when the request asks (``Request.logprobs``)
    proposed: Optional[list[int]] = None  # the draft for this pass (a chain, or a tree's nodes; None: no draft)
    parents: Optional[list[int]] = None  # a tree draft: each node's parent in ``proposed`` (-1: the root)
    path: Optional[list[int]] = None  # a tree draft: the accepted nodes' indices in ``proposed``, root to leaf

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class FinishEvent:
    reason: str  # "stop" (EOS or stop string) or "length" (token budget or context window)
    token_ids: list[int]
    text: str
    stats: GenerationStats


@dataclass
class Failure:
    """A request ended without a normal finish; ``kind`` is timeout, shutdown, internal, or constraint
    (the grammar engine gave up on the row's structured output: ``message`` says so for the user)."""

    kind: str
    message: str


Event = Union[StepEvent, FinishEvent, Failure]


# -- rows ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """What one sequence asks of the core (already validated).

    ``drafter`` names one of the core's drafters (None: plain decoding). ``gamma`` (N, "auto", or
    None for the drafter's own) and ``adaptive`` (None: adaptive exactly for "auto") are resolved to a
    cap and whether the policy may draft fewer by ``gamma.resolve_gamma``, as every command's are.
    ``verify`` picks the sampled rule (by default the Gumbel-max coupling for a seeded request, else
    block verification)."""

    prompt_ids: list[int]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    drafter: Optional[str] = None
    gamma: Optional[Gamma] = None
    adaptive: Optional[bool] = None
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    constraint: Optional["Constraint"] = None  # structured output (constraints.py): a token mask per step
    logit_bias: Optional[Mapping[int, float]] = None  # token id -> added to its logit, target and draft alike
    logprobs: Optional[int] = None  # report each token's log-probability and this many top alternatives


class Row:
    """A running sequence: its tokens, generator, detokenizer and stats (one cache row)."""

    def __init__(self, request: Request, target: Model, max_len: int, drafter: Optional[BatchDrafter],
                 speculation: Speculation, owner: Any) -> None:
        self.request = request
        self.owner = owner  # whatever the caller ties to the row (the server: its request handle)
        self.tokens = list(request.prompt_ids)
        self.n_prompt = len(self.tokens)
        self.max_len = max_len
        self.sampling = request.sampling
        self.drafter = drafter
        self.speculation = speculation  # its γ, resolved (gamma.resolve_gamma): a cap and whether it adapts
        self.gen = make_generator(request.sampling.seed, target.device)
        self.noise = coupled_noise(request, target.vocab_size, self.gen)
        self.detok = IncrementalDetokenizer(target, self.tokens) if target.tokenizer is not None else None
        self.eos = frozenset() if request.generation.ignore_eos else target.eos_token_ids
        self.constraint = row_state(request.constraint, request.logit_bias, target.vocab_size)
        self.stats = GenerationStats(prompt_tokens=self.n_prompt)
        # this request's own acceptance evidence and probe schedule (the drafter's history: a prior)
        self.evidence = RowEvidence(drafter.acceptance) if drafter is not None else None
        self.probing = False  # this pass drafts because the row's probe schedule said so
        self.hidden: Optional[torch.Tensor] = None
        self.layers: Optional[dict[int, torch.Tensor]] = None  # residual after layer i, same tokens as hidden
        self.generated: list[int] = []
        self.text = ""
        self.decode_start = 0.0

    def room(self) -> int:
        """Tokens this row may still produce (token budget and context window)."""
        return min(self.request.generation.max_new_tokens - len(self.generated), self.max_len - len(self.tokens))


def coupled_noise(request: Request, vocab: int, gen: torch.Generator) -> Optional[CoupledNoise]:
    """The row's Gumbel-max noise when it samples by the coupled rule (``VerifyConfig.coupled``), keyed
    by its seed (``accept_rule="coupled"`` without one: a seed drawn from the row's generator)."""
    if not request.verify.coupled(request.sampling):
        return None
    seed = request.sampling.seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device))
    return CoupledNoise(seed, vocab, gen.device)
