"""Our runtime in the bench: ``specdecode.generate`` with a drafter, and the methods derived from the
drafter registry, so the bench never names a drafter.

A drafter declares one family (``BenchVariant``: its name, help, size knob and whether it remembers
requests). The comparisons are the bench's and are applied here to every drafter that fits, in this
order after the drafter's own family:

- verification rules, on the paired default drafter (the bundled pair's; one drafter is enough to
  compare rules): its own family pinned to rejection sampling (block verification), ``-token``
  (token by token) and ``-coupled`` (Gumbel-max coupling), the last two only with --temperature > 0;
- ``-auto``, γ chosen by the γ policy, beside every γ-swept family whose drafter shares the target's
  tokenizer (a pair of tokenizers has no cost model: its γ 'auto' is a fixed count, nothing to compare);
- ``-fullvocab``, the paired default over its draft's whole output vocabulary (the ablation of
  draft_vocab.json);
- ``eager-``, plain decoding and the paired default on eager PyTorch with fp32 weights (the fast kernel
  off: the like-for-like of transformers' peers, so a swept one takes the peers' γs).

The default set is the one the peers mirror (plain decoding, the paired default, prompt lookup: the
family swept over lookup tokens), plain decoding's eager copy (the peers' fp32 reference) and the
paired default's ``-auto``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from ..config import GenerationConfig, SamplingConfig, VerifyConfig
from ..drafters import BatchDrafter, DrafterOptions
from ..drafters.plugin import BenchVariant, DrafterSpec
from ..drafters.registry import PAIRED_DEFAULT, PLAIN, REGISTRY, build_drafter, get_spec, missing
from ..drafters.vocab import VocabSpec
from ..rows import StepEvent
from ..engine import stream
from ..models import Model
from ..sizing.pricer import DEFAULT_PRICER, Pricer
from .methods import BenchContext, Method, MethodSpec, MethodUnavailable, RunOutput
from .stats import Step


class OursMethod:
    """``specdecode.generate`` with a given drafter (None = plain decoding in the same loop)."""

    runtime = "specdecode"

    def __init__(self, name: str, family: str, setting: Optional[int], target: Model,
                 drafter: Optional[BatchDrafter], ignore_eos: bool, sampling: Optional[SamplingConfig] = None,
                 verify: Optional[VerifyConfig] = None, pricer: Pricer = DEFAULT_PRICER) -> None:
        self.name, self.family, self.setting = name, family, setting
        self.pricer = pricer
        self.target, self.drafter, self.ignore_eos = target, drafter, ignore_eos
        self.sampling, self.verify = sampling or SamplingConfig(), verify or VerifyConfig()

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        generation = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=self.ignore_eos)
        steps: list[Step] = []
        t0 = time.perf_counter()
        for ev in stream(self.target, prompt, self.drafter, self.sampling, generation, self.verify,
                         pricer=self.pricer):
            if isinstance(ev, StepEvent):
                if ev.token_ids:
                    steps.append((ev.drafted, sum(ev.from_draft)))
            else:
                fin = ev
        dt = time.perf_counter() - t0
        return RunOutput(fin.token_ids, dt, steps, fin.stats.draft_s, fin.stats.prefill_s)


class HistoryMethod(OursMethod):
    """A drafter that remembers earlier requests (``BenchVariant.history``): its history restarts
    whenever a prompt comes round again (after the warm-up, at the next repetition), so no run drafts
    from its own earlier copy; within a repetition the prompts run in file order, as a session's turns do."""

    def __init__(self, name: str, family: str, target: Model, drafter: Optional[BatchDrafter], ignore_eos: bool,
                 sampling: Optional[SamplingConfig], forget: Callable[[], None], pricer: Pricer) -> None:
        super().__init__(name, family, None, target, drafter, ignore_eos, sampling, pricer=pricer)
        self._forget = forget
        self._seen: set[tuple[int, ...]] = set()

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        key = tuple(prompt)
        if key in self._seen:
            self._forget()
            self._seen.clear()
        self._seen.add(key)
        return super().run(prompt, max_new_tokens)


@dataclass(frozen=True)
class BenchFamily:
    """One method family of ours: a drafter's declared family with one of the bench's comparisons applied."""

    family: str  # its name in --methods
    drafter: str  # the registered drafter it builds
    help: str
    sweep: str  # one of methods.SWEEPS
    label: str  # the method's name (a swept one gets /g<γ> or /k<k>)
    verify: VerifyConfig = VerifyConfig()
    vocab: Optional[VocabSpec] = None  # None: the bench's --draft-vocab
    sampled_only: bool = False  # compares verification rules: only with --temperature > 0
    history: bool = False  # remembers earlier requests: forgets when a prompt comes round again
    eager: bool = False  # runs on the eager (fast=False) copies of the models
    with_auto: Optional[str] = None  # the family 'auto' in --gammas adds beside this one
    with_sampling: Optional[str] = None  # the family --temperature > 0 adds beside this one
    default: bool = False  # among the bench's default methods


BLOCK = VerifyConfig(accept_rule="rejection")  # block verification, whatever the seed
TOKEN = VerifyConfig(chain_rule="token", accept_rule="rejection")
COUPLED = VerifyConfig(accept_rule="coupled")
EAGER_SWEEP = {"gammas": "peer_gammas"}  # an eager copy takes the peers' γs (else its own family's knob)


def derive(spec: DrafterSpec, v: BenchVariant) -> Iterator[BenchFamily]:
    """``v``, then the comparisons that fit its drafter, in the order of the module docstring."""
    f = v.family
    paired, baseline = spec.name == PAIRED_DEFAULT, spec.name == PLAIN
    policy = v.sweep == "gammas" and not spec.own_tokenizer
    own = BenchFamily(f, spec.name, v.help, v.sweep, f, history=v.history)
    yield dataclasses.replace(own, verify=BLOCK if paired else own.verify, with_auto=f"{f}-auto" if policy else None,
                              with_sampling=f"{f}-token" if paired else None,
                              default=paired or baseline or v.sweep == "lookup_tokens",
                              help=f"{v.help} (sampled chains: block verification, the default rule)" if paired
                              else v.help)
    if paired:
        yield dataclasses.replace(own, family=f"{f}-token", label=f"{f}-token", verify=TOKEN, sampled_only=True,
                                  help=f"{f!r} verified token by token, γ from --gammas (sampling only; added beside "
                                       f"{f!r} when --temperature > 0)")
        yield dataclasses.replace(own, family=f"{f}-coupled", label=f"{f}-coupled", verify=COUPLED,
                                  sampled_only=True, help=f"{f!r} under the Gumbel-max coupled rule (drafter-invariant "
                                  "seeds; the default when a request has a seed), γ from --gammas (sampling only)")
    if policy:
        yield dataclasses.replace(own, family=f"{f}-auto", label=f"{f}/auto", sweep="none", default=paired,
                                  help=f"{f!r} with gamma='auto': γ chosen every step by the γ policy from its "
                                       "measured costs and running α̂")
    if paired:
        yield dataclasses.replace(own, family=f"{f}-fullvocab", label=f"{f}-fullvocab", vocab="full",
                                  help=f"{f!r} over the draft's full output vocabulary (the ablation of "
                                       "draft_vocab.json), γ from --gammas")
    if paired or baseline:
        sweep = EAGER_SWEEP.get(v.sweep, v.sweep)
        yield dataclasses.replace(own, family=f"eager-{f}", label=f"eager-{f}", sweep=sweep, eager=True,
                                  default=baseline, help=f"{f!r} on eager PyTorch's F.linear with fp32 weights (the "
                                  f"fast kernel off){', γ from --peer-gammas' if sweep == 'peer_gammas' else ''}")


def bench_families() -> list[BenchFamily]:
    """Every registered drafter's families, comparisons included, in registry order."""
    return [b for spec in REGISTRY.values() for v in spec.bench for b in derive(spec, v)]


def method_name(v: BenchFamily, setting: Optional[int]) -> str:
    if setting is None:
        return v.label
    return f"{v.label}/{'k' if v.sweep == 'lookup_tokens' else 'g'}{setting}"


def variant_factory(spec: DrafterSpec, v: BenchFamily) -> Callable[[BenchContext, Optional[int]], Method]:
    """The factory of one drafter's bench variant: the drafter built as generate and serve build it."""

    def factory(ctx: BenchContext, setting: Optional[int]) -> Method:
        if v.sampled_only and ctx.sampling.greedy:
            raise MethodUnavailable(f"greedy decoding has one verification rule; pass --temperature > 0 to compare "
                                    f"{v.family} with the default rule")
        target = ctx.eager_model(ctx.target_path) if v.eager else ctx.target
        takes_draft = spec.needs_draft_model or (spec.uses_draft_model and ctx.auto_draft)
        draft = (ctx.own_drafts.get(spec.name) or ctx.draft) if takes_draft else None
        if v.eager and draft is not None and ctx.draft_path:
            draft = ctx.eager_model(ctx.draft_path)
        if spec.needs_draft_model and draft is None:
            raise MethodUnavailable("no draft model (pass --draft DIR)")
        vocab = v.vocab if v.vocab is not None else (ctx.draft_vocab if takes_draft else "auto")
        options = DrafterOptions(draft=draft, gamma=setting if setting is not None else "auto", vocab=vocab,
                                 options=ctx.options, artifacts=ctx.artifacts)
        why = missing(spec.name, options)
        if why is not None:
            raise MethodUnavailable(why)
        drafter = build_drafter(spec.name, options)
        name = method_name(v, setting)
        if v.history:
            forget = getattr(drafter, "forget", None)
            assert callable(forget), f"{name} has no forget()"
            return HistoryMethod(name, v.family, target, drafter, ctx.ignore_eos, ctx.sampling, forget, ctx.pricer)
        return OursMethod(name, v.family, setting, target, drafter, ctx.ignore_eos, ctx.sampling, v.verify, ctx.pricer)

    return factory


def drafter_methods() -> dict[str, MethodSpec]:
    """Every registered drafter's families as methods (read at each call, so a drafter registered late,
    e.g. by a test, is benchmarked too)."""
    return {b.family: MethodSpec(b.family, OursMethod.runtime, b.sweep, variant_factory(get_spec(b.drafter), b),
                                 b.help, b.default, b.with_auto, b.with_sampling) for b in bench_families()}


def baseline_family() -> str:
    """The method every speedup and exact-match check is relative to: plain decoding's family."""
    return get_spec(PLAIN).bench[0].family


def eager_baseline_family() -> str:
    """Plain decoding on the eager path: the reference for runs in fp32 arithmetic (eager, transformers)."""
    return next(b.family for b in bench_families() if b.drafter == PLAIN and b.eager)


def paired_families() -> tuple[str, Optional[str]]:
    """The paired default drafter's own family and its gamma='auto' companion (None: it has none)."""
    own = next(b for b in bench_families() if b.drafter == PAIRED_DEFAULT)
    return own.family, own.with_auto
