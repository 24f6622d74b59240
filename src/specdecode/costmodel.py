"""A measured cost model for choosing γ: speedup(γ) = E(α, γ) / (γ c + v(γ)).

E(α, γ) = (1 − α^(γ+1)) / (1 − α) is Leviathan et al.'s expected tokens per
target pass; c is the draft pass cost relative to a target pass; v(γ) is what
a target pass over γ+1 tokens costs relative to a pass over one token (≈1 on a
GPU, 2–4 in eager PyTorch on a CPU: the hardware's share of the speedup).
v and c are measured once per machine, model pair, dtype and thread count,
and cached on disk so later runs start at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from . import ops
from .kernels import fast_linear_enabled, kernel_isa
from .kernels.fused import fused_ops

if TYPE_CHECKING:
    from .models import Model

MAX_GAMMA = 15
log = logging.getLogger(__name__)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ): expected tokens per target pass with γ draft tokens (γ=0 gives 1)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """E(α, γ) / (γ c + v(γ)): walltime speedup over plain decoding."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)


@dataclass(frozen=True)
class Costs:
    """c and v(k) for k = 0..MAX_GAMMA (v[0] = 1 by definition)."""

    c: float
    v: tuple[float, ...]

    def speedup(self, alpha: float, gamma: int) -> float:
        return predicted_speedup(alpha, gamma, self.c, self.v[min(gamma, len(self.v) - 1)])

    def best_gamma(self, alpha: float, max_gamma: int = MAX_GAMMA) -> int:
        """The γ in 0..max_gamma maximising the predicted speedup; 0 means speculation does not pay."""
        best, best_s = 0, 1.0
        for g in range(1, min(max_gamma, len(self.v) - 1) + 1):
            s = self.speedup(alpha, g)
            if s > best_s * 1.0001:
                best, best_s = g, s
        return best


def _clock(model: "Model"):
    """The timer for cost measurements: this thread's CPU time when the model runs single-threaded
    on the CPU (other processes then cannot inflate a measurement: a busy machine once gave
    v(1..5) = 1.0 and auto drafted 13 tokens a pass), wall time otherwise (GPU work, and intra-op
    threads whose CPU time the calling thread does not see)."""
    if model.device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _median_pass_time(model: "Model", n_tokens: int, reps: int, context: int = 192) -> float:
    # a typical context: a tiny draft's step grows with the cache it attends over (c at 64 tokens
    # read 0.20 where the benchmark's 188-token prompts gave 0.34, and auto then drafted too long)
    context = max(1, min(context, model.max_seq_len - n_tokens - 1))
    cache = model.new_cache(1, context + n_tokens + 1)
    with torch.inference_mode():
        model.forward(torch.arange(context, device=model.device).unsqueeze(0) % model.vocab_size, cache)
        ids = torch.arange(n_tokens, device=model.device).unsqueeze(0) % model.vocab_size
        times = []
        clock = _clock(model)
        for i in range(reps + 2):
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            t = clock()
            logits = model.forward(ids, cache)
            float(logits[0, -1, 0])  # the engine reads the logits back every step; so do we
            dt = clock() - t
            cache.trim(n_tokens)
            if i >= 2:
                times.append(dt)
    return statistics.median(times)


def measure_costs(target: "Model", draft: Optional["Model"], max_gamma: int = MAX_GAMMA, reps: int = 15,
                  draft_head: Optional[torch.Tensor] = None) -> Costs:
    """Time target passes over 1..max_gamma+1 tokens and one draft pass (c = 0 without a draft model).
    ``draft_head`` is the draft's restricted output matrix when it drafts over a subset of the vocabulary.

    v is kept as measured, not forced monotonic: the kernel's row blocking makes some widths
    genuinely cheaper than their neighbours (v(3) < v(2) on the bundled target), and the median
    of ``reps`` passes keeps noise below those differences."""
    t1 = _median_pass_time(target, 1, reps)
    v = [1.0] + [max(1.0, _median_pass_time(target, k + 1, reps) / t1) for k in range(1, max_gamma + 1)]
    c = _draft_step_time(target, draft, reps, head=draft_head) / t1 if draft is not None else 0.0
    return Costs(c=c, v=tuple(v))


def _draft_step_time(target: "Model", draft: "Model", reps: int, run: int = 4, context: int = 192,
                     head: Optional[torch.Tensor] = None) -> float:
    """Median seconds per draft step in runs of ``run`` steps, each run right after a target pass.

    That is how the engine drafts, and it costs more than back-to-back draft steps: the target's
    pass evicts the draft's weights from the caches (on the bundled pair, 0.18 of a target step
    against 0.11 measured back to back)."""
    context = max(1, min(context, target.max_seq_len - 2, draft.max_seq_len - run - 1))
    ids = torch.arange(context, device=target.device).unsqueeze(0) % min(target.vocab_size, draft.vocab_size)
    t_cache, d_cache = target.new_cache(1, context + 1), draft.new_cache(1, context + run)
    times = []
    clock = _clock(draft)
    with torch.inference_mode():
        target.forward(ids, t_cache)
        draft.forward(ids, d_cache)
        for i in range(reps + 2):
            float(target.forward(ids[:, :1], t_cache)[0, -1, 0])
            t_cache.trim(1)
            t = clock()
            for _ in range(run):
                float(draft.forward(ids[:, :1], d_cache, last_only=True, head=head)[0, -1, 0])
                d_cache.trim(1)
            if i >= 2:
                times.append((clock() - t) / run)
    return statistics.median(times)


def _fingerprint(models: Sequence[Optional["Model"]], extra: str = "") -> str:
    parts = [extra, platform.processor() or platform.machine(), cpu_name(), str(torch.get_num_threads()),
             torch.__version__, ops.linear_impl_name(), f"fused={fused_ops() is not None}",
             f"isa={kernel_isa() if fast_linear_enabled() else None}"]
    for m in models:
        if m is None:
            parts.append("none")
            continue
        weights = sorted(Path(m.path).glob("*.safetensors"))
        stamp = ",".join(f"{w.name}:{w.stat().st_size}:{int(w.stat().st_mtime)}" for w in weights)
        parts += [str(Path(m.path).resolve()), stamp, str(m.dtype), str(m.device)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name: part of the cost cache key, and recorded by the benchmark."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode")) / "costs"


_MEMO: dict[str, Costs] = {}


def load_or_measure_costs(target: "Model", draft: Optional["Model"],
                          draft_head: Optional[torch.Tensor] = None) -> Costs:
    """Costs for this machine and pair, measured on first use and cached as JSON (``draft_head``: the
    draft's restricted output matrix, whose size changes c)."""
    key = _fingerprint([target, draft], f"draft_head={None if draft_head is None else tuple(draft_head.shape)}")
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"{key}.json"
    if path.is_file():
        try:
            d = json.loads(path.read_text())
            _MEMO[key] = Costs(c=float(d["c"]), v=tuple(float(x) for x in d["v"]))
            return _MEMO[key]
        except (ValueError, KeyError):
            pass  # a corrupt cache file is re-measured
    log.info("gamma=auto: measuring target pass costs v(k) and draft cost c (once per machine and model pair)")
    costs = _MEMO[key] = measure_costs(target, draft, draft_head=draft_head)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(costs)))
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return costs


ALPHA_BUCKETS = 1024  # α resolution of AdaptiveGamma's γ choice


class AdaptiveGamma:
    """Picks γ each step from the running acceptance estimate and the measured costs.

    α is estimated as accepted / evaluated, where evaluated counts the accepted
    tokens plus the one rejected token per step (later draft tokens were never
    judged): the maximum-likelihood estimate for i.i.d. acceptance, over about the
    last ``memory`` judged tokens, so a change of workload shows within a few
    steps. A weak prior keeps the first steps sane.

    The evidence is about the drafter, not the sequence, so it carries over from
    one request to the next, and it fades with a half-life of ``half_life`` target
    passes. When no γ pays, that fading is what brings drafting back: the prior
    regains weight until one probe step drafts again and either confirms the
    drafter is useless (off for another stretch) or finds it useful. A useless
    draft therefore costs a probe every few hundred passes, wherever request
    boundaries fall, not a draft prefill per request.
    """

    def __init__(self, costs: Costs, max_gamma: int = MAX_GAMMA, prior_alpha: float = 0.7,
                 prior_weight: float = 2.0, memory: float = 100.0, half_life: float = 4096.0) -> None:
        if memory <= 0 or half_life <= 0:
            raise ValueError("memory and half_life must be positive")
        self.costs = costs
        self.max_gamma = max_gamma
        self.prior_alpha, self.prior_weight, self.memory = prior_alpha, prior_weight, memory
        self._fade = 0.5 ** (1.0 / half_life)
        self.accepted = 0.0
        self.evaluated = 0.0
        self.resuming = False  # the last choose() drafts after one or more plain steps: a probe
        self._last = 1  # the previous choice (a drafter's first request starts as if it had been drafting)
        self._best: dict[int, int] = {}  # best γ per α bucket: choose() runs every step, best_gamma costs ~20 µs

    def reset(self) -> None:
        """A new sequence. The evidence is kept: it describes the drafter, and it fades with time."""

    @property
    def alpha(self) -> float:
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.evaluated + self.prior_weight)

    def choose(self) -> int:
        """γ for the next target pass (0 = plain decoding); called once per pass."""
        self.accepted *= self._fade
        self.evaluated *= self._fade
        bucket = int(self.alpha * ALPHA_BUCKETS)
        g = self._best.get(bucket)
        if g is None:
            g = self._best[bucket] = self.costs.best_gamma((bucket + 0.5) / ALPHA_BUCKETS, self.max_gamma)
        self.resuming = g > 0 and self._last == 0
        self._last = g
        return g

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        self.accepted += n_accepted
        self.evaluated += n_accepted + (1 if n_accepted < n_drafted else 0)
        if self.evaluated > self.memory:
            keep = self.memory / self.evaluated
            self.accepted *= keep
            self.evaluated *= keep
