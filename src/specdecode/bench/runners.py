"""What the benchmark runs: the table of methods (derived from the drafter registry, plus the peers)
and the timing loop.

The method protocol and context live in ``methods``, our runtime and the registry-derived methods in
``ours``, transformers' peers in ``peers``. ``REGISTRY`` holds the methods that are not a drafter's
variant (the peers, or one a caller adds with ``register``); ``method_table()`` is what ``--methods``
chooses from, read at each call so a drafter registered late is benchmarked too.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from ..config import ConfigError
from ..models import Model
from .methods import SWEEPS, BenchContext, Method, MethodSpec, MethodUnavailable, RunOutput
from .ours import HistoryMethod, OursMethod, drafter_methods
from .peers import PEER_METHODS, HFOptions, TransformersMethod
from .workloads import Workload

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["REGISTRY", "BenchContext", "HFOptions", "HistoryMethod", "Method", "MethodFailure", "MethodSpec",
           "MethodUnavailable", "OursMethod", "PreparedPrompt", "RunOutput", "RunRecord", "Skipped",
           "TransformersMethod", "build_methods", "default_methods", "method_table", "prepare_prompts", "register",
           "run_all", "warm_up"]

REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    """Add (or replace) a method family that is not a drafter's variant; it becomes selectable with ``--methods``."""
    if spec.sweep not in SWEEPS:
        raise ValueError(f"sweep must be one of {SWEEPS}, got {spec.sweep!r}")
    REGISTRY[spec.family] = spec


for _spec in PEER_METHODS:
    register(_spec)


def method_table() -> dict[str, MethodSpec]:
    """Every method family: the registered drafters' variants, then the others."""
    return {**drafter_methods(), **REGISTRY}


def default_methods() -> tuple[str, ...]:
    return tuple(f for f, spec in method_table().items() if spec.default)


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
    table = method_table()
    for fam in families:
        spec = table.get(fam)
        if spec is None:
            raise ConfigError(f"unknown method {fam!r} in --methods; known: {', '.join(table)}")
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
