"""``generate``/``stream``: the decode core (``core.py``) with one row.

Plain decoding is the same loop with no drafter, so every speedup we report is measured
against the same runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from .constraints import Constraint, GrammarLimitError, bind, parse_logit_bias, spec_from_args
from .logprobs import TokenLogprob
from .config import ConfigError, GenerationConfig, SamplingConfig, VerifyConfig
from .core import DecodeCore
from .rows import Failure, FinishEvent, Request, StepEvent
from .text import Prompt, prompt_ids
from .drafters.base import BatchDrafter, Drafter, as_batch_drafter
from .sizing.gamma import Gamma
from .sizing.policy import GammaPolicy
from .sizing.pricer import DEFAULT_PRICER, Pricer
from .metrics import GenerationStats
from .models import Model

__all__ = ["GenerationResult", "generate", "stream"]

_DRAFTER = "drafter"  # the one drafter's name inside a single-row core


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only (EOS included when it ended the run)
    text: str
    stats: GenerationStats
    finish_reason: str
    from_draft: list[bool] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token, when ``logprobs`` was asked


def stream(
    target: Model,
    prompt: Prompt,
    drafter: Optional[Union[Drafter, BatchDrafter]] = None,
    sampling: Optional[SamplingConfig] = None,
    generation: Optional[GenerationConfig] = None,
    verify: Optional[VerifyConfig] = None,
    constraint: Optional[Constraint] = None,
    logit_bias: Optional[Mapping[int, float]] = None,
    logprobs: Optional[int] = None,
    gamma: Optional[Gamma] = None,
    pricer: Pricer = DEFAULT_PRICER,
) -> Iterator[StepEvent | FinishEvent]:
    """Generate from ``target``, yielding a ``StepEvent`` per target pass and a final ``FinishEvent``.
    ``verify`` picks the sampled rule (default: the Gumbel-max coupling when seeded, else block verification).
    ``gamma``: N drafts N tokens a pass, "auto" lets the cost policy pick 0..cap, None keeps the drafter's
    own γ (``gamma.resolve_gamma``, the rule ``--gamma`` follows in every command). ``pricer``: the margin
    a draft must beat and where step costs come from (``sizing/pricer.py``; default: the cost book).
    A constraint the grammar engine gives up on partway raises ConfigError (``constraints.GrammarLimitError``)."""
    sampling = sampling or SamplingConfig()
    generation = generation or GenerationConfig()
    verify = verify or VerifyConfig()
    ids = prompt_ids(target, prompt)
    drafters = {_DRAFTER: as_batch_drafter(drafter)} if drafter is not None else {}
    core = DecodeCore(target, drafters, max_rows=1,
                      context_len=min(target.max_seq_len, len(ids) + generation.max_new_tokens),
                      policy=GammaPolicy(pricer))
    core.add(Request(ids, sampling, generation, _DRAFTER if drafter is not None else None, gamma=gamma, verify=verify,
                     constraint=constraint, logit_bias=parse_logit_bias(logit_bias, target.vocab_size),
                     logprobs=logprobs))
    while core.rows:
        for _, ev in core.step():
            if isinstance(ev, Failure):  # the only one a lone row meets: its grammar engine gave up
                raise GrammarLimitError(ev.message) if ev.kind == "constraint" else ConfigError(ev.message)
            yield ev


def generate(
    target: Model,
    prompt: Prompt,
    drafter: Optional[Union[Drafter, BatchDrafter]] = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    seed: Optional[int] = None,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
    chain_rule: str = VerifyConfig.chain_rule,
    accept_rule: str = VerifyConfig.accept_rule,
    json_schema: Union[None, str, Mapping[str, Any]] = None,
    regex: Optional[str] = None,
    grammar: Optional[str] = None,
    logit_bias: Optional[Mapping[int, float]] = None,
    logprobs: Optional[int] = None,
    gamma: Optional[Gamma] = None,
    pricer: Pricer = DEFAULT_PRICER,
) -> GenerationResult:
    """Run ``stream`` to the end and collect tokens, text and stats. ``accept_rule``: "auto" (the
    Gumbel-max coupling when ``seed`` is set: the same text for a seed whatever the drafter or γ;
    else rejection sampling), "coupled" or "rejection". ``chain_rule``: "block" (block verification)
    or "token" (token by token) for rejection-sampled chain drafts. All are exact. At most one of
    ``json_schema`` (a dict or its JSON text), ``regex`` and ``grammar`` (Lark) constrains the output
    (structured output, ``constraints.py``): every position follows the target's masked law, drafts
    included, so speculation stays exact; the output ends with EOS once the grammar is complete.
    ``logit_bias`` ({token id: bias in [-100, 100]}) shifts the target's and the draft's logits alike.
    ``logprobs`` = k reports each token's log-probability under the target's law and its k most
    likely alternatives (``GenerationResult.logprobs``), exact under speculation. ``gamma``, ``pricer``: as
    ``stream``'s."""
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    generation = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, stop=tuple(stop))
    verify = VerifyConfig(chain_rule=chain_rule, accept_rule=accept_rule)
    spec = spec_from_args(json_schema=json_schema, regex=regex, grammar=grammar)
    constraint = bind(spec, target) if spec is not None else None
    flags: list[bool] = []
    lps: list[TokenLogprob] = []
    for ev in stream(target, prompt, drafter, sampling, generation, verify, constraint, logit_bias, logprobs,
                     gamma, pricer):
        if isinstance(ev, StepEvent):
            flags.extend(ev.from_draft)
            lps.extend(ev.logprobs or ())
        else:
            return GenerationResult(ev.token_ids, ev.text, ev.stats, ev.reason, flags, lps)
    raise RuntimeError("stream ended without a FinishEvent")  # pragma: no cover
