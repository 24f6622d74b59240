"""A measured cost model for choosing γ: speedup(γ) = E(α, γ) / (γ c + v(γ)).

E(α, γ) = (1 − α^(γ+1)) / (1 − α) is Leviathan et al.'s expected tokens per
target pass; c is the draft pass cost relative to a target pass; v(γ) is what
a target pass over γ+1 tokens costs relative to a pass over one token (≈1 on a
GPU, 2–4 in eager PyTorch on a CPU: the hardware's share of the speedup).

This module holds the figures (``Costs``) and the one timer (``time_steps``, ``measure_steps``) over
what a drafter declares (``CostSteps``: the target's passes per width, its own named ``Step``s);
``book.py`` keys, caches and fetches them, and the γ policy (``sizing/policy.py``) checks them
against every pass it runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

import torch

from . import measure_context
from ..config import ConfigError
from .gamma import DEFAULT_CAP

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model

MAX_GAMMA = DEFAULT_CAP  # widest draft timed: "auto"'s cap (sizing/gamma.py), so every γ it may pick is measured
DEFAULT_CONTEXT = measure_context.CONTEXT  # context tokens when no real prompt is given (see measure_costs)
DRAFT_RUN = 4  # draft steps per timing sample (a typical γ)
WARMUP_ROUNDS = 2  # untimed rounds: first-call allocations, caches


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ) = (1 − α^(γ+1)) / (1 − α): expected tokens per target pass with γ draft tokens each
    accepted i.i.d. with probability α (γ = 0 gives 1). The one definition: the γ policy, the
    bench's prediction and ``specdecode theory`` all call it."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha (acceptance rate) must be in [0, 1], got {alpha}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ConfigError(f"gamma (draft length) must be an integer >= 0, got {gamma!r}")
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """E(α, γ) / (γ c + v(γ)): walltime speedup over plain decoding."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)


@dataclass(frozen=True)
class Costs:
    """The hardware's side of the speedup: c and v(k) for k = 0..len(v) - 1 (v[0] = 1 by definition).

    ``target_s``, ``draft_s``, ``context_len`` and ``repeats`` are the measurement behind c and v
    (``measure_costs``; empty for costs written by hand): the bench reports them, the γ policy
    needs only c and v."""

    c: float  # draft step / one-token target pass; 0 without a draft model
    v: tuple[float, ...]
    target_s: tuple[float, ...] = ()  # median seconds of a target pass over k + 1 new tokens, k = 0, 1, ...
    draft_s: Optional[float] = None  # median seconds of one draft step (None: no draft model)
    context_len: int = 0  # tokens in the cache during the measurement
    repeats: int = 0  # timed samples per size
    key: str = ""  # the cost cache entry these came from ("" for costs not cached), for ``book.store_costs``
    # a drafter's own steps (``CostSteps.draft`` other than "draft"), each over a one-token target pass
    extras: tuple[tuple[str, float], ...] = ()
    # v as measured (``measure_costs``), before any live refinement; () = v. A refinement starts from it, never
    # from an earlier refinement, so that refinements do not compound (``sizing.live.refined_v``)
    measured: tuple[float, ...] = ()

    @property
    def measured_v(self) -> tuple[float, ...]:
        """v as measured (``measured``): what every live refinement starts from."""
        return self.measured or self.v

    @classmethod
    def from_times(cls, target_s: Sequence[float], draft_s: Optional[float], context_len: int,
                   repeats: int, key: str = "", extras: Optional[Mapping[str, float]] = None) -> "Costs":
        """c and v from median pass times. v is kept as measured, not forced monotonic: the kernel's
        row blocking makes some widths genuinely cheaper than their neighbours (v(3) < v(2) on the
        bundled target); only v >= 1 is imposed, since a wider pass cannot really be cheaper."""
        t1 = target_s[0]
        v = (1.0,) + tuple(max(1.0, t / t1) for t in target_s[1:])
        return cls(c=draft_s / t1 if draft_s is not None else 0.0, v=v, target_s=tuple(target_s), draft_s=draft_s,
                   context_len=context_len, repeats=repeats, key=key,
                   extras=tuple(sorted((k, t / t1) for k, t in (extras or {}).items())))

    def extra(self, name: str) -> float:
        """A drafter step's measured cost over a one-token target pass (0 when it was not measured)."""
        return dict(self.extras).get(name, 0.0)

    def v_at(self, gamma: int) -> float:
        """v(γ); beyond the measured range, extrapolated linearly from the last two points."""
        if gamma < len(self.v):
            return self.v[gamma]
        top = len(self.v) - 1
        slope = self.v[top] - self.v[top - 1] if top > 0 else 0.0
        return self.v[top] + slope * (gamma - top)

    def speedup(self, alpha: float, gamma: int) -> float:
        return predicted_speedup(alpha, gamma, self.c, self.v_at(gamma))

    def best_gamma(self, alpha: float, max_gamma: int = MAX_GAMMA) -> int:
        """The γ in 0..max_gamma maximising the predicted speedup; 0 means speculation does not pay."""
        best, best_s = 0, 1.0
        for g in range(1, min(max_gamma, len(self.v) - 1) + 1):
            s = self.speedup(alpha, g)
            if s > best_s * 1.0001:
                best, best_s = g, s
        return best

    def to_dict(self) -> dict[str, object]:
        """The measurement as the bench's JSON records it."""
        return {"context_len": self.context_len, "repeats": self.repeats,
                "target_forward_s": {str(k + 1): t for k, t in enumerate(self.target_s)},
                "draft_forward_s": self.draft_s, "c": self.c if self.draft_s is not None else None,
                "v": {str(g): v for g, v in enumerate(self.v)}}


def cost_clock(model: "Model") -> Callable[[], float]:
    """The timer for cost measurements: this thread's CPU time when the model runs single-threaded
    on the CPU (other processes then cannot inflate a measurement: a busy machine once gave
    v(1..5) = 1.0 and auto drafted 13 tokens a pass), wall time otherwise (GPU work, and intra-op
    threads whose CPU time the calling thread does not see)."""
    if model.device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


# -- the one timer ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One thing to time. ``run`` is timed (it reads its result back, as the engine does); ``undo``
    is not (it rolls a cache back). ``per``: ``run`` does this many of the unit timed (a run of draft
    steps), so its time is divided by it; ``samples``: runs per round (cheap or noisy steps get more)."""

    run: Callable[[], object]
    undo: Optional[Callable[[], object]] = None
    per: int = 1
    samples: int = 1


@dataclass(frozen=True)
class CostSteps:
    """What a drafter hands the cost model to time: ``widths[n]``, a target pass over n new tokens as
    the drafter's steps run it (v is interpolated over 1..``n_max`` from the widths timed, which must
    include 1 and ``n_max``); ``draft``, the drafter's own steps, in order, right after the passes:
    the one named "draft" gives c, the others ``Costs.extras``. ``done``: called after timing (state
    the steps left behind)."""

    widths: Mapping[int, Step]
    n_max: int
    context_len: int
    draft: Mapping[str, Step] = field(default_factory=dict)
    done: Optional[Callable[[], object]] = None
    # the passes wider than one token cost what the target's own (chain) passes do, so v(n) is taken
    # from the target's shared measurement (``book.target_spec``) and ``widths``
    # need hold only the one-token pass (the unit of ``draft``): each drafter timing its own passes
    # cost a server's first request ~1.5 s per tree drafter
    target_v: bool = False


def time_steps(widths: Mapping[int, Step], steps: Mapping[str, Step], clock: Callable[[], float],
               device: torch.device, reps: int, statistic: Callable[[list[float]], float] = statistics.median,
               warmup: int = WARMUP_ROUNDS) -> tuple[dict[int, float], dict[str, float]]:
    """The one timing loop: ``warmup`` untimed rounds, then ``reps`` rounds; per round every width
    (in alternating order, so a burst of background load hits every width alike), then each step of
    ``steps`` in order (``Step.samples`` times, interleaved with the others'). Returns the
    ``statistic`` of each width's and step's samples. On CUDA the device is synchronised before each
    clock read, so a timing holds the work it launched."""
    order = sorted(widths)
    w_samples: dict[int, list[float]] = {n: [] for n in order}
    s_samples: dict[str, list[float]] = {k: [] for k in steps}
    rounds = max((s.samples for s in steps.values()), default=0)
    cuda = device.type == "cuda"

    def timed(step: Step) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = clock()
        step.run()
        if cuda:
            torch.cuda.synchronize(device)
        dt = clock() - t0
        if step.undo is not None:
            step.undo()
        return dt / step.per

    with torch.inference_mode():
        for r in range(reps + warmup):
            for n in order if r % 2 == 0 else order[::-1]:
                dt = timed(widths[n])
                if r >= warmup:
                    w_samples[n].append(dt)
            for i in range(rounds):
                for k, step in steps.items():
                    if i < step.samples:
                        dt = timed(step)
                        if r >= warmup:
                            s_samples[k].append(dt)
    return ({n: statistic(x) for n, x in w_samples.items()},
            {k: statistic(x) for k, x in s_samples.items() if x})


def measure_steps(steps: CostSteps, target: "Model", reps: int,
                  statistic: Callable[[list[float]], float] = statistics.median, warmup: int = WARMUP_ROUNDS) -> Costs:
    """``Costs`` from a drafter's ``CostSteps``, in the target's cost clock."""
    try:
        widths, own = time_steps(steps.widths, steps.draft, cost_clock(target), target.device, reps, statistic,
                                 warmup)
    finally:
        if steps.done is not None:
            steps.done()
    draft = own.pop("draft", None)
    return Costs.from_times(plausible(interpolate(widths, steps.n_max)), draft, steps.context_len, reps, extras=own)


def chain_steps(target: "Model", draft: Optional["Model"], max_gamma: int = MAX_GAMMA,
                draft_head: Optional[torch.Tensor] = None, context: Optional[Sequence[int]] = None,
                draft_layers: Optional[tuple[int, ...]] = None, widths: Optional[Sequence[int]] = None,
                draft_runs: int = 1, draft_run: int = DRAFT_RUN) -> CostSteps:
    """A chain drafter's steps, with the engine's own forward calls: target passes over 1..max_gamma+1
    new tokens appended to a prefilled cache, logits read back, then rolled back, as a decode step
    does (``widths``: only these, the others interpolated); and (with a ``draft`` model) ``draft_runs``
    runs of ``draft_run`` draft steps per round, right after the target's passes, as the engine drafts:
    the target's pass evicts the draft's weights from the caches (on the bundled pair 0.18 of a target
    step, against 0.11 back to back).

    ``draft_head``: the draft's restricted output matrix when it drafts over a subset of the vocabulary.
    ``context``: the tokens in the cache (real ones, e.g. the workload's mean prompt); by default
    ``DEFAULT_CONTEXT`` synthetic ones, since a tiny draft's step grows with the cache it attends over
    (c at 64 tokens read 0.20 where the benchmark's 188-token prompts gave 0.34). ``draft_layers``:
    the draft step runs only these layers of ``draft`` (a layer-skip draft, ``draft`` the target)."""
    n_max = max_gamma + 1
    sizes = sorted({n for n in (widths or range(1, n_max + 1)) if 1 <= n <= n_max} | {1, n_max})
    if draft is None and not context and n_max <= measure_context.ROOM:  # the target's shared context
        shared = measure_context.borrow(target)
        t_cache, probe = shared.cache, shared.probe(n_max)
        return CostSteps({n: _width(target, t_cache, probe, n) for n in sizes}, n_max, len(shared.ids))
    limit = target.max_seq_len - n_max - 1
    vocab = target.vocab_size
    if draft is not None:
        limit, vocab = min(limit, draft.max_seq_len - DRAFT_RUN - 1), min(vocab, draft.vocab_size)
    ids = list(context) if context else [i % vocab for i in range(DEFAULT_CONTEXT)]
    ids = ids[:max(1, min(len(ids), limit))]
    dev = target.device
    prompt = torch.tensor([ids], device=dev)
    probe = torch.tensor([(ids * -(-n_max // len(ids)))[:n_max]], device=dev)  # real tokens; values barely matter
    with torch.inference_mode():
        t_cache = target.new_cache(1, len(ids) + n_max)
        target.forward(prompt, t_cache, last_only=True)
        own: dict[str, Step] = {}
        if draft is not None:
            d_cache = draft.new_cache(1, len(ids) + 1)
            draft.forward(prompt, d_cache, last_only=True, layers=draft_layers)

            def draft_steps() -> None:
                for _ in range(draft_run):
                    float(draft.forward(probe[:, :1], d_cache, last_only=True, head=draft_head,
                                        layers=draft_layers)[0, -1, 0])
                    d_cache.trim(1)

            own["draft"] = Step(draft_steps, per=draft_run, samples=draft_runs)

    return CostSteps({n: _width(target, t_cache, probe, n) for n in sizes}, n_max, len(ids), own)


def _width(target: "Model", cache: "KVCache", probe: torch.Tensor, n: int) -> Step:
    """A target pass over ``probe``'s first n tokens, logits read back as the engine does, rolled back."""
    return Step(lambda: float(target.forward(probe[:, :n], cache)[0, -1, 0]), lambda: cache.trim(n))


def measure_costs(target: "Model", draft: Optional["Model"], max_gamma: int = MAX_GAMMA, reps: int = 15,
                  draft_head: Optional[torch.Tensor] = None, context: Optional[Sequence[int]] = None,
                  draft_layers: Optional[tuple[int, ...]] = None, widths: Optional[Sequence[int]] = None,
                  statistic: Callable[[list[float]], float] = statistics.median, draft_runs: int = 1,
                  draft_run: int = DRAFT_RUN, warmup: int = WARMUP_ROUNDS) -> Costs:
    """c and v(1..max_gamma) of a chain drafter (``chain_steps``, c = 0 without a draft model), the
    ``statistic`` (median by default) of ``reps`` samples each."""
    steps = chain_steps(target, draft, max_gamma, draft_head, context, draft_layers, widths, draft_runs, draft_run)
    return measure_steps(steps, target, reps, statistic, warmup)


def interpolate(points: dict[int, float], n: int) -> list[float]:
    """Values at 1..n, linear between the given widths (which include 1 and n)."""
    xs = sorted(points)
    out = []
    for w in range(1, n + 1):
        hi = next(x for x in xs if x >= w)
        lo = max(x for x in xs if x <= w)
        f = 0.0 if hi == lo else (w - lo) / (hi - lo)
        out.append(points[lo] + f * (points[hi] - points[lo]))
    return out


def plausible(times: Sequence[float], fixed: Sequence[bool] = ()) -> list[float]:
    """Pass times by width (1, 2, ...) with what load added taken out, as far as physics tells: a pass
    over n tokens costs at most n/m times a pass over m < n (the same work per token at worst), and
    no more than a wider pass. On a loaded 2-core machine a 3-sample minimum read 7.5x the one-token
    pass at width 2 while its neighbours read 1-3x, and 6x from width 5 on: left so, the wider
    widths would never be tried and so never measured. ``fixed[i]``: keep width i + 1 as given (a
    figure the live passes established), while it still bounds the others."""
    out = list(times)
    keep = list(fixed) + [False] * (len(out) - len(fixed))
    for i in range(1, len(out)):
        if not keep[i]:
            out[i] = min(out[i], out[i - 1] * (i + 1) / i)
    for i in range(len(out) - 2, -1, -1):
        if not keep[i]:
            out[i] = min(out[i], out[i + 1])
    return out
