"""Our runtime in the bench: ``specdecode.generate`` with a drafter, and the methods derived from the
drafter registry (each drafter's declared ``BenchVariant``s become method families here, so the
bench never names a drafter)."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..config import GenerationConfig, SamplingConfig, VerifyConfig
from ..drafters import BatchDrafter, DrafterOptions
from ..drafters.plugin import BenchVariant, DrafterSpec
from ..drafters.registry import PLAIN, REGISTRY, build_drafter, get_spec, missing
from ..rows import StepEvent
from ..engine import stream
from ..models import Model
from .methods import BenchContext, Method, MethodSpec, MethodUnavailable, RunOutput
from .stats import Step


class OursMethod:
    """``specdecode.generate`` with a given drafter (None = plain decoding in the same loop)."""

    runtime = "specdecode"

    def __init__(self, name: str, family: str, setting: Optional[int], target: Model,
                 drafter: Optional[BatchDrafter], ignore_eos: bool, sampling: Optional[SamplingConfig] = None,
                 verify: Optional[VerifyConfig] = None) -> None:
        self.name, self.family, self.setting = name, family, setting
        self.target, self.drafter, self.ignore_eos = target, drafter, ignore_eos
        self.sampling, self.verify = sampling or SamplingConfig(), verify or VerifyConfig()

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        generation = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=self.ignore_eos)
        steps: list[Step] = []
        t0 = time.perf_counter()
        for ev in stream(self.target, prompt, self.drafter, self.sampling, generation, self.verify):
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
                 sampling: Optional[SamplingConfig], forget: Callable[[], None]) -> None:
        super().__init__(name, family, None, target, drafter, ignore_eos, sampling)
        self._forget = forget
        self._seen: set[tuple[int, ...]] = set()

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        key = tuple(prompt)
        if key in self._seen:
            self._forget()
            self._seen.clear()
        self._seen.add(key)
        return super().run(prompt, max_new_tokens)


def method_name(v: BenchVariant, setting: Optional[int]) -> str:
    label = v.label or v.family
    if setting is None:
        return label
    return f"{label}/{'k' if v.sweep == 'lookup_tokens' else 'g'}{setting}"


def variant_factory(spec: DrafterSpec, v: BenchVariant) -> Callable[[BenchContext, Optional[int]], Method]:
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
            return HistoryMethod(name, v.family, target, drafter, ctx.ignore_eos, ctx.sampling, forget)
        return OursMethod(name, v.family, setting, target, drafter, ctx.ignore_eos, ctx.sampling, v.verify)

    return factory


def drafter_methods() -> dict[str, MethodSpec]:
    """Every registered drafter's bench variants, as method families (read at each call, so a drafter
    registered late, e.g. by a test, is benchmarked too)."""
    out: dict[str, MethodSpec] = {}
    for spec in REGISTRY.values():
        for v in spec.bench:
            out[v.family] = MethodSpec(v.family, OursMethod.runtime, v.sweep, variant_factory(spec, v), v.help,
                                       v.default, v.with_auto, v.with_sampling)
    return out


def baseline_family() -> str:
    """The method every speedup and exact-match check is relative to: plain decoding's bench variant."""
    return get_spec(PLAIN).bench[0].family
