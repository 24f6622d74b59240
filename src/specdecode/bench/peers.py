"""transformers' ``generate`` as the bench's peer runtime: plain, assisted (a draft model) and prompt lookup."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import SamplingConfig
from ..drafters.registry import all_options
from .methods import BenchContext, Method, MethodSpec, RunOutput

PEER_NGRAM_OPTION = "ngram_max"  # our prompt lookup's option its peer matches (the longest n-gram)


@dataclass(frozen=True)
class HFOptions:
    """The few generate() arguments the peers differ in (None = leave transformers' default)."""

    assistant: Optional[torch.nn.Module] = None
    num_assistant_tokens: Optional[int] = None
    fixed_schedule: bool = True  # constant γ and no confidence cut-off, so γ means what it means for us
    prompt_lookup_num_tokens: Optional[int] = None
    max_matching_ngram_size: Optional[int] = None
    sampling: SamplingConfig = SamplingConfig()  # frozen, so a shared default is safe


class TransformersMethod:
    runtime = "transformers"

    def __init__(self, name: str, family: str, setting: Optional[int], model: torch.nn.Module,
                 options: HFOptions) -> None:
        self.name, self.family, self.setting = name, family, setting
        self.model, self.options = model, options

    def _generate_args(self) -> dict[str, object]:
        o = self.options
        args: dict[str, object] = {"do_sample": False}
        s = o.sampling
        if not s.greedy:  # the same filters as ours; top_k=0 / top_p=1.0 switch transformers' defaults off
            args.update(do_sample=True, temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p or 1.0,
                        min_p=s.min_p)
        if o.assistant is not None:
            args["assistant_model"] = o.assistant
            if o.num_assistant_tokens is not None:
                args["num_assistant_tokens"] = o.num_assistant_tokens
            if o.fixed_schedule:
                args["num_assistant_tokens_schedule"] = "constant"
                args["assistant_confidence_threshold"] = 0.0
        if o.prompt_lookup_num_tokens is not None:
            args["prompt_lookup_num_tokens"] = o.prompt_lookup_num_tokens
            args["max_matching_ngram_size"] = o.max_matching_ngram_size
        return args

    @torch.inference_mode()
    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        device = next(self.model.parameters()).device
        x = torch.tensor([prompt], device=device)
        mask = torch.ones_like(x)
        args = self._generate_args()
        if self.options.sampling.seed is not None:
            torch.manual_seed(self.options.sampling.seed)  # transformers draws from the global generator
        t0 = time.perf_counter()
        out = self.model.generate(x, attention_mask=mask, max_new_tokens=max_new_tokens, **args)  # type: ignore[operator]
        dt = time.perf_counter() - t0
        return RunOutput(out[0, len(prompt):].tolist(), dt, None)


def _hf_plain(ctx: BenchContext, setting: Optional[int]) -> Method:
    return TransformersMethod("hf-plain", "hf-plain", None, ctx.hf_model(ctx.target_path),
                              HFOptions(sampling=ctx.sampling))


def _hf_assisted(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    ctx.require_draft()
    opts = HFOptions(assistant=ctx.hf_model(ctx.draft_path), num_assistant_tokens=setting, sampling=ctx.sampling)
    return TransformersMethod(f"hf-assisted/g{setting}", "hf-assisted", setting, ctx.hf_model(ctx.target_path), opts)


def _hf_assisted_auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    ctx.require_draft()
    opts = HFOptions(assistant=ctx.hf_model(ctx.draft_path), fixed_schedule=False, sampling=ctx.sampling)
    return TransformersMethod("hf-assisted/auto", "hf-assisted-auto", None, ctx.hf_model(ctx.target_path), opts)


def _hf_lookup(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    ngram = ctx.options.get(PEER_NGRAM_OPTION, all_options()[PEER_NGRAM_OPTION].default)
    opts = HFOptions(prompt_lookup_num_tokens=setting, max_matching_ngram_size=int(ngram),  # type: ignore[call-overload]
                     sampling=ctx.sampling)
    return TransformersMethod(f"hf-lookup/k{setting}", "hf-lookup", setting, ctx.hf_model(ctx.target_path), opts)


PEER_METHODS = (
    MethodSpec("hf-plain", "transformers", "none", _hf_plain, "transformers generate, greedy", default=True),
    MethodSpec("hf-assisted", "transformers", "peer_gammas", _hf_assisted,
               "transformers assistant_model, constant γ from --peer-gammas", default=True),
    MethodSpec("hf-assisted-auto", "transformers", "none", _hf_assisted_auto,
               "transformers assistant_model with its default adaptive schedule"),
    MethodSpec("hf-lookup", "transformers", "lookup_tokens", _hf_lookup,
               "transformers prompt_lookup_num_tokens, k from --lookup-tokens", default=True),
)
