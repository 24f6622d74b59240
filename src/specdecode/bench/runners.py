"""What the benchmark runs: a registry of methods (ours and transformers' peers) and the timing loop.

A method family maps a name to a factory ``(BenchContext, setting) -> Method``;
the setting is the family's one integer knob (γ, or the number of lookup
tokens), or None. New drafters plug in with ``register(MethodSpec(...))``
without touching the loop. A factory that cannot build its method (no draft
model, no transformers) raises ``MethodUnavailable`` and the report lists it
as skipped with the reason.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

import torch

from ..config import ConfigError, GenerationConfig, SamplingConfig, VerifyConfig
from ..drafters import BatchDrafter, DrafterOptions, build_drafter
from ..drafters.base import Gamma
from ..drafters.registry import get_spec
from ..drafters.vocab import VocabSpec, draft_vocab_for
from ..engine import StepEvent, stream
from ..models import Model
from .stats import Step
from .workloads import Workload

if TYPE_CHECKING:
    from tqdm import tqdm


class MethodUnavailable(Exception):
    """The method cannot run in this setup; the message says why (shown as 'skipped: ...')."""


@dataclass
class RunOutput:
    token_ids: list[int]
    seconds: float  # wall time of the whole request, prefill included
    steps: Optional[list[Step]]  # (drafted, accepted) per target pass; None when the runtime hides it
    draft_seconds: float = 0.0


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
    lookup_max_ngram: int = 3
    lookup_min_ngram: int = 1
    draft_vocab: VocabSpec = "auto"  # the draft methods' output vocabulary (drafters/vocab.py)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # every method's (greedy by default)
    heads: Optional[str] = None  # Medusa heads directory (the medusa methods)
    eagle: Optional[str] = None  # EAGLE-3 draft directory (the eagle method)
    exit_adapter: Optional[str] = None  # exit adapter directory (the layerskip-adapter methods)
    crosstok_draft: Optional[Model] = None  # the crosstok method's draft, own tokenizer (default: the draft)
    _hf: dict[str, object] = field(default_factory=dict)
    _eager: dict[str, Model] = field(default_factory=dict)

    def eager_model(self, path: str) -> Model:
        """The checkpoint on eager PyTorch (``fast=False``: F.linear and the eager layer ops) with weight
        matrices in the compute dtype, loaded once; it runs beside the fast models in this process."""
        if path not in self._eager:
            from ..models import load_model

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
                import transformers
            except ImportError as e:
                raise MethodUnavailable(f"transformers is not installed ({e}); pip install 'specdecode[bench]'") from e
            transformers.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()
            try:
                m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=self.target.dtype)
            except Exception as e:  # any load failure means: this peer cannot run here
                raise MethodUnavailable(f"transformers cannot load {path}: {type(e).__name__}: {e}") from e
            m = m.to(self.target.device).eval()
            eos = sorted(self.target.eos_token_ids)
            m.generation_config.pad_token_id = eos[0] if eos else 0
            if self.ignore_eos:  # generate exactly the budget, as our runs with ignore_eos do
                m.generation_config.eos_token_id = None
            self._hf[path] = m
        return self._hf[path]  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# Our runtime
# ---------------------------------------------------------------------------

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
        return RunOutput(fin.token_ids, dt, steps, fin.stats.draft_s)


def _eager_plain(ctx: BenchContext, setting: Optional[int]) -> Method:
    """Plain decoding on models loaded with ``fast=False``: eager and fast runs interleave in one
    benchmark, each model with its own kernels, and compare as a ratio measured side by side."""
    return OursMethod("eager-plain", "eager-plain", None, ctx.eager_model(ctx.target_path), None, ctx.ignore_eos,
                      ctx.sampling)


def _eager_draft(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    draft = ctx.eager_model(ctx.draft_path) if ctx.draft_path else ctx.require_draft()
    return OursMethod(f"eager-draft/g{setting}", "eager-draft", setting, ctx.eager_model(ctx.target_path),
                      _ours(ctx, "model", setting, ctx.draft_vocab, draft=draft), ctx.ignore_eos, ctx.sampling)


def _ours(ctx: BenchContext, drafter: str, gamma: Gamma, vocab: VocabSpec = "auto",
          draft: Optional[Model] = None) -> Optional[BatchDrafter]:
    """A registered drafter (``drafters/registry.py``), built as generate and serve build it."""
    spec = get_spec(drafter)
    if spec.needs_heads and ctx.heads is None:
        raise MethodUnavailable("no Medusa heads (pass --heads DIR)")
    if spec.needs_eagle and ctx.eagle is None:
        raise MethodUnavailable("no EAGLE-3 draft (pass --heads DIR with an EAGLE directory)")
    if spec.needs_exit_adapter and ctx.exit_adapter is None:
        raise MethodUnavailable("no exit adapter (pass --heads DIR with an exit adapter directory)")
    options = DrafterOptions(draft=(draft or ctx.require_draft()) if spec.needs_draft_model else None, gamma=gamma,
                             vocab=vocab, ngram_max=ctx.lookup_max_ngram, ngram_min=ctx.lookup_min_ngram,
                             heads=ctx.heads, eagle=ctx.eagle, exit_adapter=ctx.exit_adapter)
    return build_drafter(drafter, options)


def _draft_auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("draft/auto", "draft-auto", None, ctx.target, _ours(ctx, "model", "auto", ctx.draft_vocab),
                      ctx.ignore_eos, ctx.sampling)


def _plain(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("plain", "plain", None, ctx.target, _ours(ctx, "none", "auto"), ctx.ignore_eos, ctx.sampling)


def _draft(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"draft/g{setting}", "draft", setting, ctx.target, _ours(ctx, "model", setting, ctx.draft_vocab),
                      ctx.ignore_eos, ctx.sampling, VerifyConfig(accept_rule="rejection"))  # also under --seed


def _draft_token(ctx: BenchContext, setting: Optional[int]) -> Method:
    """The draft family verified token by token: beside 'draft' (block verification, the default) the
    table shows what block verification gains. Greedy decoding has one rule, so only under sampling."""
    assert setting is not None
    if ctx.sampling.greedy:
        raise MethodUnavailable("greedy decoding has one verification rule; pass --temperature > 0 to compare "
                                "token-by-token with block verification")
    return OursMethod(f"draft-token/g{setting}", "draft-token", setting, ctx.target,
                      _ours(ctx, "model", setting, ctx.draft_vocab), ctx.ignore_eos, ctx.sampling,
                      VerifyConfig(chain_rule="token", accept_rule="rejection"))


def _draft_coupled(ctx: BenchContext, setting: Optional[int]) -> Method:
    """The draft family under the Gumbel-max coupling (the default rule for seeded requests): beside
    'draft-token' (Leviathan's rule) and 'draft' (block) the table shows what drafter-invariant seeds
    cost in acceptance and speed. Without --seed each request draws its own seed."""
    assert setting is not None
    if ctx.sampling.greedy:
        raise MethodUnavailable("greedy decoding has one verification rule; pass --temperature > 0 to compare "
                                "the coupled rule with rejection sampling")
    return OursMethod(f"draft-coupled/g{setting}", "draft-coupled", setting, ctx.target,
                      _ours(ctx, "model", setting, ctx.draft_vocab), ctx.ignore_eos, ctx.sampling,
                      VerifyConfig(accept_rule="coupled"))


def _draft_fullvocab(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"draft-fullvocab/g{setting}", "draft-fullvocab", setting, ctx.target,
                      _ours(ctx, "model", setting, "full"), ctx.ignore_eos, ctx.sampling)


def _medusa(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("medusa", "medusa", None, ctx.target, _ours(ctx, "medusa", "auto"), ctx.ignore_eos, ctx.sampling)


def _eagle(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("eagle", "eagle", None, ctx.target, _ours(ctx, "eagle", "auto"), ctx.ignore_eos, ctx.sampling)


def _medusa_chain(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("medusa-chain", "medusa-chain", None, ctx.target, _ours(ctx, "medusa-chain", "auto"),
                      ctx.ignore_eos, ctx.sampling)


def _layerskip(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"layerskip/g{setting}", "layerskip", setting, ctx.target, _ours(ctx, "layerskip", setting),
                      ctx.ignore_eos, ctx.sampling)


def _layerskip_auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("layerskip/auto", "layerskip-auto", None, ctx.target, _ours(ctx, "layerskip", "auto"),
                      ctx.ignore_eos, ctx.sampling)


def _layerskip_adapter(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"layerskip-adapter/g{setting}", "layerskip-adapter", setting, ctx.target,
                      _ours(ctx, "layerskip-adapter", setting), ctx.ignore_eos, ctx.sampling)


def _layerskip_adapter_auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("layerskip-adapter/auto", "layerskip-adapter-auto", None, ctx.target,
                      _ours(ctx, "layerskip-adapter", "auto"), ctx.ignore_eos, ctx.sampling)


def _quant(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"quant/g{setting}", "quant", setting, ctx.target, _ours(ctx, "quant", setting),
                      ctx.ignore_eos, ctx.sampling)


def _quant_auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    return OursMethod("quant/auto", "quant-auto", None, ctx.target, _ours(ctx, "quant", "auto"),
                      ctx.ignore_eos, ctx.sampling)


def _crosstok(ctx: BenchContext, setting: Optional[int]) -> Method:
    """A draft with its own tokenizer (--crosstok-draft; else --draft, through text), γ target tokens per step."""
    assert setting is not None
    draft = ctx.crosstok_draft or ctx.require_draft()
    return OursMethod(f"crosstok/g{setting}", "crosstok", setting, ctx.target, _ours(ctx, "crosstok", setting, draft=draft),
                      ctx.ignore_eos, ctx.sampling)


def _lookup(ctx: BenchContext, setting: Optional[int]) -> Method:
    assert setting is not None
    return OursMethod(f"lookup/k{setting}", "lookup", setting, ctx.target, _ours(ctx, "ngram", setting),
                      ctx.ignore_eos, ctx.sampling)


class HistoryMethod(OursMethod):
    """A drafter that remembers earlier requests (suffix, auto): its history restarts whenever a prompt
    comes round again (after the warm-up, at the next repetition), so no run drafts from its own
    earlier copy; within a repetition the prompts run in file order, as a session's turns do."""

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


def _history(ctx: BenchContext, name: str, drafter: Optional[BatchDrafter]) -> Method:
    forget = getattr(drafter, "forget", None)
    assert callable(forget), f"{name} has no forget()"
    return HistoryMethod(name, name, ctx.target, drafter, ctx.ignore_eos, ctx.sampling, forget)


def _suffix(ctx: BenchContext, setting: Optional[int]) -> Method:
    return _history(ctx, "suffix", _ours(ctx, "suffix", "auto"))


def _auto(ctx: BenchContext, setting: Optional[int]) -> Method:
    options = DrafterOptions(draft=ctx.draft, gamma="auto", vocab=ctx.draft_vocab, ngram_max=ctx.lookup_max_ngram,
                             ngram_min=ctx.lookup_min_ngram, heads=ctx.heads, eagle=ctx.eagle)
    return _history(ctx, "auto", build_drafter("auto", options))


# ---------------------------------------------------------------------------
# transformers' generate as the peer
# ---------------------------------------------------------------------------

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
    opts = HFOptions(prompt_lookup_num_tokens=setting, max_matching_ngram_size=ctx.lookup_max_ngram,
                     sampling=ctx.sampling)
    return TransformersMethod(f"hf-lookup/k{setting}", "hf-lookup", setting, ctx.hf_model(ctx.target_path), opts)


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

SWEEPS = ("none", "gammas", "lookup_tokens", "peer_gammas")


@dataclass(frozen=True)
class MethodSpec:
    family: str
    runtime: str
    sweep: str  # which settings list gives its variants: one of SWEEPS
    factory: Callable[[BenchContext, Optional[int]], Method]
    help: str


REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    """Add (or replace) a method family; it becomes selectable with ``--methods``."""
    if spec.sweep not in SWEEPS:
        raise ValueError(f"sweep must be one of {SWEEPS}, got {spec.sweep!r}")
    REGISTRY[spec.family] = spec


for _spec in (
    MethodSpec("plain", "specdecode", "none", _plain, "our decode loop with no drafter: the baseline"),
    MethodSpec("draft", "specdecode", "gammas", _draft,
               "draft model, γ from --gammas (sampled chains: block verification, the default rule)"),
    MethodSpec("draft-token", "specdecode", "gammas", _draft_token,
               "draft model verified token by token, γ from --gammas (sampling only; added beside 'draft' "
               "when --temperature > 0)"),
    MethodSpec("draft-coupled", "specdecode", "gammas", _draft_coupled,
               "draft model under the Gumbel-max coupled rule (drafter-invariant seeds; the default when a request "
               "has a seed), γ from --gammas (sampling only)"),
    MethodSpec("draft-auto", "specdecode", "none", _draft_auto,
               "draft model with gamma='auto': γ chosen every step from measured costs and running α̂"),
    MethodSpec("draft-fullvocab", "specdecode", "gammas", _draft_fullvocab,
               "draft model over its full output vocabulary (the ablation of draft_vocab.json), γ from --gammas"),
    MethodSpec("lookup", "specdecode", "lookup_tokens", _lookup, "prompt lookup, k from --lookup-tokens"),
    MethodSpec("crosstok", "specdecode", "gammas", _crosstok,
               "a draft with its own tokenizer (--crosstok-draft DIR, else --draft), re-tokenized as text (SLEM), "
               "γ from --gammas"),
    MethodSpec("layerskip", "specdecode", "gammas", _layerskip,
               "layer-skip self-speculation (the target's calibrated layers, `specdecode calibrate`), γ from --gammas"),
    MethodSpec("layerskip-auto", "specdecode", "none", _layerskip_auto,
               "layer-skip self-speculation with gamma='auto' (the γ policy, from the partial model's measured c)"),
    MethodSpec("layerskip-adapter", "specdecode", "gammas", _layerskip_adapter,
               "layer-skip early exit through a trained exit adapter (--heads DIR from `distill --method early-exit`; "
               "bundled models/code-exit-adapter with the bundled target), γ from --gammas"),
    MethodSpec("layerskip-adapter-auto", "specdecode", "none", _layerskip_adapter_auto,
               "the exit adapter's draft with gamma='auto' (the γ policy, from its measured c, adapter included)"),
    MethodSpec("quant", "specdecode", "gammas", _quant,
               "quantized self-draft (--drafter quant): the target's int4 copy drafts, γ from --gammas"),
    MethodSpec("quant-auto", "specdecode", "none", _quant_auto,
               "quantized self-draft with gamma='auto' (the γ policy, from the int4 copy's measured c)"),
    MethodSpec("medusa", "specdecode", "none", _medusa,
               "Medusa heads (--heads DIR), a token tree sized each step by the measured v(nodes) and running α by depth"),
    MethodSpec("medusa-chain", "specdecode", "none", _medusa_chain,
               "Medusa heads (--heads DIR), top-1 of each head as a chain, length by the same cost model"),
    MethodSpec("eagle", "specdecode", "none", _eagle,
               "EAGLE-3 draft layer (--heads DIR: an EAGLE directory; bundled models/code-eagle with the bundled "
               "target), EAGLE-2 dynamic trees sized by the measured costs"),
    MethodSpec("suffix", "specdecode", "none", _suffix,
               "suffix drafting: frequency-ranked trees from the sequence and earlier outputs (history restarts "
               "per repetition)"),
    MethodSpec("auto", "specdecode", "none", _auto,
               "--drafter auto: per step, the member the cost model ranks first (draft model with --draft, heads "
               "with --heads, calibrated layer skip, suffix, lookup); plain when none pays"),
    MethodSpec("eager-plain", "specdecode", "none", _eager_plain,
               "plain decoding on PyTorch's eager F.linear with fp32 weights (the fast kernel off)"),
    MethodSpec("eager-draft", "specdecode", "peer_gammas", _eager_draft,
               "draft model on the eager path, γ from --peer-gammas"),
    MethodSpec("hf-plain", "transformers", "none", _hf_plain, "transformers generate, greedy"),
    MethodSpec("hf-assisted", "transformers", "peer_gammas", _hf_assisted,
               "transformers assistant_model, constant γ from --peer-gammas"),
    MethodSpec("hf-assisted-auto", "transformers", "none", _hf_assisted_auto,
               "transformers assistant_model with its default adaptive schedule"),
    MethodSpec("hf-lookup", "transformers", "lookup_tokens", _hf_lookup,
               "transformers prompt_lookup_num_tokens, k from --lookup-tokens"),
):
    register(_spec)

DEFAULT_METHODS = ("plain", "draft", "draft-auto", "lookup", "eager-plain", "hf-plain", "hf-assisted", "hf-lookup")


@dataclass(frozen=True)
class Skipped:
    name: str
    family: str
    runtime: str
    reason: str


def build_methods(ctx: BenchContext, families: Sequence[str], settings: dict[str, list[int]]
                  ) -> tuple[list[Method], list[Skipped]]:
    """Instantiate every variant of the chosen families; unavailable ones become ``Skipped`` entries."""
    methods: list[Method] = []
    skipped: list[Skipped] = []
    for fam in families:
        spec = REGISTRY.get(fam)
        if spec is None:
            raise ConfigError(f"unknown method {fam!r} in --methods; known: {', '.join(REGISTRY)}")
        variants: list[Optional[int]] = [None] if spec.sweep == "none" else list(settings.get(spec.sweep, []))
        for s in variants:
            try:
                methods.append(spec.factory(ctx, s))
            except MethodUnavailable as e:
                label = fam if s is None else f"{fam}/{s}"
                skipped.append(Skipped(label, fam, spec.runtime, str(e)))
    return methods, skipped


# ---------------------------------------------------------------------------
# The timing loop
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PreparedPrompt:
    workload: Workload
    ids: list[int]
    max_new_tokens: int
    truncated: int  # prompt tokens dropped from the left to fit the context window
    requested_new_tokens: int  # the workload's budget; max_new_tokens is less when the window is too small


def prepare_prompts(workloads: Sequence[Workload], target: Model, draft: Optional[Model]) -> list[PreparedPrompt]:
    """Tokenise once for every method and fit prompt + budget into both models' context windows.

    Left-truncation keeps the leading BOS/EOT token, so the prompt still looks like a document start.
    """
    limit = target.max_seq_len if draft is None else min(target.max_seq_len, draft.max_seq_len)
    out = []
    for w in workloads:
        ids = target.encode(w.prompt)
        budget = w.max_new_tokens
        dropped = 0
        if len(ids) + budget > limit:
            keep = max(limit - budget, limit // 4)
            if len(ids) > keep:
                head = ids[:1] if ids[0] in target.eos_token_ids else []
                dropped = len(ids) - keep
                ids = head + ids[len(ids) - keep + len(head):]
            budget = min(budget, limit - len(ids))
        out.append(PreparedPrompt(w, ids, budget, dropped, w.max_new_tokens))
    return out


@dataclass
class RunRecord:
    method: str
    workload: str
    category: str
    rep: int
    output: RunOutput


@dataclass
class MethodFailure:
    """A benchmark method that raised on a workload (reported, and the method dropped from the run)."""

    method: str
    workload: str
    error: str


def warm_up(methods: Sequence[Method], prompt: PreparedPrompt, n_tokens: int = 16) -> list[MethodFailure]:
    """One short untimed run per method: first-call allocations, lazy imports, caches."""
    failures = []
    for m in methods:
        try:
            m.run(prompt.ids, min(n_tokens, prompt.max_new_tokens))
        except Exception as e:  # a broken method is reported, not allowed to sink the run
            failures.append(MethodFailure(m.name, prompt.workload.id, f"{type(e).__name__}: {e}"))
    return failures


def run_all(methods: Sequence[Method], prompts: Sequence[PreparedPrompt], reps: int,
            progress: Optional["tqdm"] = None) -> tuple[list[RunRecord], list[MethodFailure]]:
    """Every method on every prompt, ``reps`` times, interleaved per prompt.

    Methods run back to back on the same prompt, in an order rotated per prompt
    and repetition, so slow drifts of the machine (thermal, background jobs) hit
    all methods alike instead of whichever ran last.
    """
    records: list[RunRecord] = []
    failures: list[MethodFailure] = []
    broken: set[str] = set()
    k = 0
    for rep in range(reps):
        for p in prompts:
            order = list(methods[k % len(methods):]) + list(methods[:k % len(methods)]) if methods else []
            k += 1
            for m in order:
                if progress is not None:
                    progress.set_postfix_str(f"{m.name} on {p.workload.id}"[:60], refresh=False)
                if m.name not in broken:
                    gc.collect()
                    try:
                        out = m.run(p.ids, p.max_new_tokens)
                    except Exception as e:
                        broken.add(m.name)
                        failures.append(MethodFailure(m.name, p.workload.id, f"{type(e).__name__}: {e}"))
                    else:
                        records.append(RunRecord(m.name, p.workload.id, p.workload.category, rep, out))
                if progress is not None:
                    progress.update(1)
    return records, failures
