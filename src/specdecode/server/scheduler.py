"""Continuous batching with speculation: one engine thread, one batched KV cache, many requests.

The loop thread owns the target's cache (one row per running request, rows
0..B-1 always contiguous) and repeats: admit waiting requests into free rows
(each prefilled alone), drop cancelled or timed-out ones, then one step:

    draft: draft-model rows together (``BatchedDraftModel``: γ batched forwards),
           n-gram rows one by one -> pad to [B, 1+γ] -> ONE target forward over the rows
    per row: verify (greedy or rejection sampling with the request's generator)
             -> cache.trim(row) by that row's rejected count -> emit events

A finished row is filled by moving the last row into it (target and draft
caches alike), so the running rows stay a contiguous slice. Prefill is not
chunked: a long prompt pauses the other rows for its prefill.

Each row follows exactly the per-request logic of ``engine.stream`` (same
invariant: the cache holds every token but the last), so a greedy request gives
the tokens ``specdecode generate`` gives, alone or beside others. Events reach
the HTTP side through the request's ``asyncio.Queue`` via
``loop.call_soon_threadsafe``.

How long to draft is decided per step by ``SpeculationPolicy`` from measured
costs: a batched pass of B rows is not free on a CPU, so at some batch sizes
speculation loses and the policy falls back to γ = 0 (plain decoding).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

import torch

from ..config import GenerationConfig, SamplingConfig
from ..drafters import Draft, DraftContext, Drafter, PromptLookupDrafter
from ..drafters.vocab import VocabSpec
from ..engine import FinishEvent, IncrementalDetokenizer, StepEvent, find_stop, truncate_pieces
from ..metrics import GenerationStats
from ..models import Model
from ..ops import argmax_list
from ..sampling import make_generator, probs_from_logits
from ..verify import VerifyResult, greedy_verify, rejection_sample
from .batch_draft import BatchedDraftModel, move_row

if TYPE_CHECKING:
    from .metrics import ServerMetrics

log = logging.getLogger("specdecode.server")

DRAFTER_KINDS = ("model", "ngram", "none")
SPECULATION_MARGIN = 1.08  # predicted tokens/s over plain decoding needed before speculating
PERFECT_ALPHA = 0.95  # "every draft accepted", for deciding whether probing can ever pay


class QueueFullError(RuntimeError):
    """Every row is busy and the waiting queue is full."""


class SchedulerClosedError(RuntimeError):
    """The scheduler is shutting down and takes no new requests."""


@dataclass(frozen=True)
class RequestSpec:
    """What one request asks the engine for (already validated by the API layer)."""

    prompt_ids: list[int]
    sampling: SamplingConfig
    generation: GenerationConfig
    drafter: str  # one of DRAFTER_KINDS
    gamma: int


@dataclass
class Failure:
    """A request ended without a normal finish; ``kind`` is timeout, shutdown or internal."""

    kind: str
    message: str


@dataclass
class ServedStep(StepEvent):
    """A StepEvent plus how many tokens were drafted for it (the page shows α̂ live)."""

    drafted: int = 0


Event = Union[StepEvent, FinishEvent, Failure]

_ids = itertools.count(1)


class RequestHandle:
    """The HTTP side of one request: the engine thread pushes events into ``queue``."""

    def __init__(self, spec: RequestSpec, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.id = next(_ids)
        self.spec = spec
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.submitted = time.monotonic()
        self.deadline = self.submitted + timeout_s
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to stop this request and free its row (client gone, or timeout)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()


@dataclass
class _Slot:
    """A running request: its sequence, drafter, generator and stats (one cache row)."""

    handle: RequestHandle
    tokens: list[int]
    n_prompt: int
    max_len: int
    drafter: Optional[Drafter]
    gen: torch.Generator
    detok: Optional[IncrementalDetokenizer]
    eos: frozenset[int]
    stats: GenerationStats
    decode_start: float
    generated: list[int] = field(default_factory=list)
    text: str = ""
    accepted: int = 0  # α estimate of this request: accepted draft tokens ...
    rejected: int = 0  # ... and rejections (at most one per step)

    @property
    def spec(self) -> RequestSpec:
        return self.handle.spec

    def room(self) -> int:
        return min(self.spec.generation.max_new_tokens - len(self.generated), self.max_len - len(self.tokens))


def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al.: expected tokens per target pass, (1 - α^(γ+1)) / (1 - α)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class SpeculationPolicy:
    """Chooses the step's draft length: the γ that maximises expected tokens per second.

        tokens(γ)  = Σ_rows E(α_row, min(γ, cap_row))             (rows without a drafter give 1)
        seconds(γ) = t_target(B, 1+γ) + Σ_kinds t_draft(kind, rows drafting) · (deepest draft)

    t_target is measured online (an EMA per batch size B and width T) and read through a monotone
    envelope: a shape costs at least the dearest measured shape it dominates (B' <= B, T' <= T).
    An unmeasured shape therefore gets a lower bound, so the policy tries it once and then knows.
    t_draft (seconds per draft token position for that many rows: one batched draft-model forward,
    or the per-row n-gram lookups) is measured and bounded the same way. α_row blends the request's
    own acceptance with its drafter kind's recent acceptance. When γ = 0 wins, one probe step drafts
    one token for one row every ``probe_interval`` steps, so α stays current at a bounded price.
    """

    def __init__(self, mode: str = "auto", probe_interval: int = 64, ema: float = 0.2, prior_weight: float = 8.0) -> None:
        self.mode = mode
        self.probe_interval = probe_interval
        self.ema = ema
        self.prior_weight = prior_weight
        self._t: dict[tuple[int, int], float] = {}
        self._draft: dict[tuple[str, int], float] = {}  # (kind, rows drafting) -> seconds per draft position
        self._kind_acc: dict[str, list[float]] = {}  # kind -> [decayed accepted, decayed rejected]
        self._since_draft = 0
        self._probe_turn = 0

    # -- measurements -------------------------------------------------------------------------
    def _update(self, table: dict, key: object, value: float) -> None:  # type: ignore[type-arg]
        old = table.get(key)
        table[key] = value if old is None else old + self.ema * (value - old)

    def record_target(self, batch: int, width: int, seconds: float) -> None:
        self._update(self._t, (batch, width), seconds)

    def record_draft(self, kind: str, rows: int, depth: int, seconds: float) -> None:
        """``rows`` rows drafted up to ``depth`` tokens each in ``seconds``."""
        self._update(self._draft, (kind, rows), seconds / max(1, depth))

    def record_verify(self, kind: str, n_drafted: int, n_accepted: int) -> None:
        acc = self._kind_acc.setdefault(kind, [1.0, 1.0])  # prior α = 0.5
        acc[0] = 0.98 * acc[0] + n_accepted
        acc[1] = 0.98 * acc[1] + (1.0 if n_accepted < n_drafted else 0.0)

    # -- estimates ----------------------------------------------------------------------------
    def kind_alpha(self, kind: str) -> float:
        a, r = self._kind_acc.get(kind, [1.0, 1.0])
        return a / (a + r)

    def row_alpha(self, kind: str, accepted: int, rejected: int) -> float:
        prior = self.kind_alpha(kind)
        k = self.prior_weight
        return min(0.99, (accepted + k * prior) / (accepted + rejected + k))

    def target_seconds(self, batch: int, width: int) -> float:
        """Measured cost of a [batch, width] pass, never below a smaller shape's (noise must not make
        a wider pass look cheaper than a narrower one)."""
        bound = [v for (b, w), v in self._t.items() if b <= batch and w <= width]
        return max(bound) if bound else 0.0

    def draft_seconds(self, kind: str, rows: int) -> float:
        """Seconds per draft position when ``rows`` rows of this kind draft (same envelope)."""
        bound = [v for (k, r), v in self._draft.items() if k == kind and r <= rows]
        return max(bound) if bound else 0.0

    # -- decision -----------------------------------------------------------------------------
    def choose(self, caps: list[int], kinds: list[str], alphas: list[float]) -> list[int]:
        """Draft length per row for this step, given each row's cap (0 = no drafter or no room).

        Every row gets min(γ, cap) for the one best γ, since the padded pass costs the widest
        row's width anyway. A probe (when γ = 0 has won ``probe_interval`` times running) drafts
        one token for one row only, round robin, so probing costs one draft token per interval."""
        top = max(caps, default=0)
        if top == 0:
            return [0] * len(caps)
        if self.mode == "always":
            return list(caps)
        batch = len(caps)
        best_g, best_rate = 0, -1.0
        for g in range(top + 1):
            tokens = 0.0
            drafting: dict[str, list[int]] = {}
            for cap, kind, alpha in zip(caps, kinds, alphas):
                gi = min(g, cap)
                tokens += expected_tokens(alpha, gi)
                if gi:
                    drafting.setdefault(kind, []).append(gi)
            seconds = self.target_seconds(batch, 1 + g)
            seconds += sum(self.draft_seconds(k, len(gs)) * max(gs) for k, gs in drafting.items())
            rate = tokens / max(seconds, 1e-9)
            # ties go to the shorter draft; leaving plain decoding needs a clear predicted win, since
            # a near break-even estimate is as likely to lose (measured: 0.93x at 16 rows without it)
            margin = SPECULATION_MARGIN if best_g == 0 else 1.0001
            if rate > best_rate * margin:
                best_g, best_rate = g, rate
        if best_g > 0:
            self._since_draft = 0
            return [min(best_g, c) for c in caps]
        self._since_draft += 1
        out = [0] * batch
        if self._since_draft >= self.probe_interval and self._could_pay(caps, kinds):
            self._since_draft = 0
            candidates = [i for i, c in enumerate(caps) if c > 0]
            self._probe_turn += 1
            out[candidates[self._probe_turn % len(candidates)]] = 1
        return out

    def _could_pay(self, caps: list[int], kinds: list[str]) -> bool:
        """Whether drafting could win at this batch even if every draft were accepted.

        A probe only refreshes α; where a measured wider pass costs more than perfect drafts
        could repay (a large batch on a compute-bound CPU), probing is pure loss: the one probing
        row widens the whole padded pass."""
        batch = len(caps)
        plain = batch / max(self.target_seconds(batch, 1), 1e-9)
        for g in range(1, max(caps) + 1):
            if (batch, 1 + g) not in self._t:
                return True  # unmeasured: cannot rule it out
            drafting: dict[str, int] = {}
            for cap, kind in zip(caps, kinds):
                if min(g, cap):
                    drafting[kind] = drafting.get(kind, 0) + 1
            seconds = self.target_seconds(batch, 1 + g)
            seconds += sum(self.draft_seconds(k, n) * g for k, n in drafting.items())
            tokens = sum(expected_tokens(PERFECT_ALPHA, min(g, c)) for c in caps)
            if tokens / max(seconds, 1e-9) > plain * SPECULATION_MARGIN:
                return True
        return False

    def snapshot(self) -> dict[str, object]:
        """The measured costs and acceptance, for /health and debugging."""
        return {
            "target_seconds": {f"{b}x{w}": round(v, 6) for (b, w), v in sorted(self._t.items())},
            "draft_seconds": {f"{k}:{r}rows": round(v, 6) for (k, r), v in sorted(self._draft.items())},
            "alpha_by_drafter": {k: round(self.kind_alpha(k), 4) for k in self._kind_acc},
        }


class Scheduler:
    """Owns the target, its batched cache and the engine thread; the API layer only submits."""

    def __init__(self, target: Model, draft_model: Optional[Model] = None, *, max_batch_size: int = 16,
                 max_queue: int = 64, speculation: str = "auto", max_context: Optional[int] = None,
                 ngram_max: int = 3, ngram_min: int = 1, metrics: Optional["ServerMetrics"] = None,
                 draft_vocab: VocabSpec = "auto") -> None:
        self.target = target
        self.draft_model = draft_model
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.context_len = min(target.max_seq_len, max_context or target.max_seq_len)
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.metrics = metrics
        self.policy = SpeculationPolicy(speculation)
        self.cache = target.new_cache(max_batch_size, self.context_len)
        # fails at startup (vocabulary, device), not at the first request
        self.drafts = (BatchedDraftModel(draft_model, target, max_batch_size, self.context_len, draft_vocab)
                       if draft_model else None)
        self._pending: collections.deque[RequestHandle] = collections.deque()
        self._active: list[_Slot] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._abort = False
        self._thread: Optional[threading.Thread] = None
        self.forward_passes = 0

    # -- API side (any thread) -------------------------------------------------------------------
    @property
    def active_rows(self) -> int:
        return len(self._active)

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specdecode-engine", daemon=True)
        self._thread.start()

    def submit(self, handle: RequestHandle) -> None:
        """Queue a request; raises QueueFullError or SchedulerClosedError instead of waiting."""
        if handle.spec.drafter == "model" and self.draft_model is None:
            raise ValueError("this server has no draft model loaded; use drafter 'ngram' or 'none'")
        with self._cond:
            if self._stopping:
                raise SchedulerClosedError("the server is shutting down")
            free_rows = self.max_batch_size - len(self._active)
            if len(self._pending) >= self.max_queue + max(0, free_rows):
                raise QueueFullError(f"server busy: {len(self._active)} requests running and "
                                     f"{len(self._pending)} waiting (max_queue={self.max_queue}); retry later")
            self._pending.append(handle)
            self._cond.notify()

    def stop(self, drain_s: float = 10.0) -> None:
        """Refuse new requests, let running ones finish for up to ``drain_s``, then fail the rest."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(drain_s)
            if self._thread.is_alive():
                with self._cond:
                    self._abort = True
                    self._cond.notify()
                self._thread.join(5.0)

    # -- engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._active and not self._stopping:
                    self._cond.wait()
                if self._abort or (self._stopping and not self._pending and not self._active):
                    break
                admit: list[RequestHandle] = []
                while self._pending and len(self._active) + len(admit) < self.max_batch_size:
                    admit.append(self._pending.popleft())
            for h in admit:
                try:
                    self._admit(h)
                except Exception as e:  # a request that cannot start fails alone
                    log.exception("prefill failed")
                    self.cache.reset(len(self._active))
                    h.emit(Failure("internal", f"internal error while reading the prompt: {e}"))
            try:
                self._reap()
                if self._active:
                    self._step()
            except Exception as e:  # never leave clients hanging on an engine bug
                log.exception("engine step failed")
                for s in list(self._active):
                    s.handle.emit(Failure("internal", f"internal error in the engine: {e}"))
                    self._finish_metrics("error", s)
                    self._free(s)
                self.cache.reset()
            self._update_gauges()
        with self._cond:
            leftovers = list(self._pending)
            self._pending.clear()
        for h in leftovers:
            h.emit(Failure("shutdown", "the server shut down before this request started"))
        for s in list(self._active):
            s.handle.emit(Failure("shutdown", "the server shut down during this request"))
            self._free(s)

    def _row_drafter(self, spec: RequestSpec) -> Optional[Drafter]:
        """A per-row drafter; draft-model rows use the shared batched drafter instead (None here)."""
        if spec.drafter != "ngram":
            return None
        d = PromptLookupDrafter(self.ngram_max, self.ngram_min, num_draft_tokens=spec.gamma)
        d.prepare(self.target)
        return d

    def _admit(self, h: RequestHandle) -> None:
        if h.cancelled:
            return
        if time.monotonic() > h.deadline:
            h.emit(Failure("timeout", "the request timed out while waiting for a free slot"))
            return
        spec = h.spec
        row = len(self._active)
        tokens = list(spec.prompt_ids)
        t0 = time.perf_counter()
        self.cache.reset(row)
        if self.drafts is not None:
            self.drafts.reset(row)
        if len(tokens) > 1:
            ids = torch.tensor([tokens[:-1]], dtype=torch.long, device=self.target.device)
            self.target.forward(ids, self.cache, rows=slice(row, row + 1), last_only=True)
        stats = GenerationStats(prompt_tokens=len(tokens))
        now = time.perf_counter()
        stats.prefill_s = now - t0
        slot = _Slot(
            handle=h, tokens=tokens, n_prompt=len(tokens),
            max_len=min(self.context_len, len(tokens) + spec.generation.max_new_tokens),
            drafter=self._row_drafter(spec), gen=make_generator(spec.sampling.seed, self.target.device),
            detok=IncrementalDetokenizer(self.target, tokens) if self.target.tokenizer is not None else None,
            eos=frozenset() if spec.generation.ignore_eos else self.target.eos_token_ids,
            stats=stats, decode_start=now,
        )
        self._active.append(slot)

    def _reap(self) -> None:
        """Free rows of cancelled or timed-out requests; fail waiting requests that timed out."""
        now = time.monotonic()
        for s in list(self._active):
            if s.handle.cancelled:
                self._finish_metrics("cancelled", s)
                self._free(s)
            elif now > s.handle.deadline:
                s.handle.emit(Failure("timeout", f"the request timed out after {len(s.generated)} tokens"))
                self._finish_metrics("timeout", s)
                self._free(s)
        with self._cond:
            keep = collections.deque(h for h in self._pending if not h.cancelled and now <= h.deadline)
            dropped = [h for h in self._pending if h not in keep]
            self._pending = keep
        for h in dropped:
            if not h.cancelled:
                h.emit(Failure("timeout", "the request timed out while waiting for a free slot"))

    def _free(self, slot: _Slot) -> None:
        i = self._active.index(slot)
        last = len(self._active) - 1
        if i != last:
            move_row(self.cache, last, i)
            if self.drafts is not None:
                self.drafts.move(last, i)
            self._active[i] = self._active[last]
        self._active.pop()
        self.cache.reset(last)
        if self.drafts is not None:
            self.drafts.reset(last)
        slot.drafter = None

    def _draft_room(self, s: _Slot) -> int:
        """How many tokens this row's drafter could propose at all (0: none, or no room in its cache)."""
        if s.spec.drafter == "model" and self.drafts is not None:
            return self.drafts.max_len - len(s.tokens)
        return s.spec.gamma if s.drafter is not None else 0

    @torch.inference_mode()
    def _step(self) -> None:
        active = self._active
        batch = len(active)
        room_ctx = min(self.cache.max_len - self.cache.lengths[i] for i in range(batch)) - 1
        caps = [max(0, min(s.spec.gamma, s.room() - 1, room_ctx, self._draft_room(s))) for s in active]
        kinds = [s.spec.drafter for s in active]
        alphas = [self.policy.row_alpha(s.spec.drafter, s.accepted, s.rejected) for s in active]
        lengths = self.policy.choose(caps, kinds, alphas)
        gamma = max(lengths, default=0)

        drafts = [Draft() for _ in active]
        proposed = [False] * batch
        batched = {i: DraftContext(s.tokens, g, s.spec.sampling, s.gen)
                   for i, (s, g) in enumerate(zip(active, lengths)) if g > 0 and s.spec.drafter == "model"}
        if batched and self.drafts is not None:
            t0 = time.perf_counter()
            for i, d in self.drafts.propose(batched).items():
                drafts[i], proposed[i] = d, True
            dt = time.perf_counter() - t0
            if self.drafts.last_catch_up <= 2:  # steady state; a catch-up after idle steps is a one-off
                self.policy.record_draft("model", len(batched), max(c.max_tokens for c in batched.values()), dt)
            for i in batched:
                active[i].stats.draft_s += dt / len(batched)
        per_row = [(i, s, g) for i, (s, g) in enumerate(zip(active, lengths)) if g > 0 and s.drafter is not None]
        if per_row:
            start = time.perf_counter()
            for i, s, g in per_row:
                t0 = time.perf_counter()
                drafts[i] = s.drafter.propose(DraftContext(s.tokens, g, s.spec.sampling, s.gen))  # type: ignore[union-attr]
                s.stats.draft_s += time.perf_counter() - t0
                proposed[i] = True
            self.policy.record_draft("ngram", len(per_row), max(g for _, _, g in per_row), time.perf_counter() - start)
        for d, g in zip(drafts, lengths):
            if len(d) > g:
                raise RuntimeError(f"drafter proposed {len(d)} tokens but at most {g} were allowed")

        width = 1 + max(len(d) for d in drafts)
        rows = [[s.tokens[-1]] + d.tokens + [s.tokens[-1]] * (width - 1 - len(d)) for s, d in zip(active, drafts)]
        t0 = time.perf_counter()
        ids = torch.tensor(rows, dtype=torch.long, device=self.target.device)
        logits = self.target.forward(ids, self.cache, rows=slice(0, batch))
        flat = argmax_list(logits.reshape(batch * width, -1))
        argmax = [flat[i * width : (i + 1) * width] for i in range(batch)]
        self.policy.record_target(batch, width, time.perf_counter() - t0)
        self.forward_passes += 1

        finished: list[tuple[_Slot, str]] = []
        observed: list[tuple[int, int, int]] = []
        for i, (s, d) in enumerate(zip(active, drafts)):
            g = len(d)
            res = self._verify(s, d, logits[i, : g + 1], argmax[i][: g + 1])
            self.cache.trim(width - 1 - res.n_accepted, row=i)
            if proposed[i]:
                if s.drafter is not None:
                    s.drafter.on_verified(res.n_accepted)
                elif self.drafts is not None:
                    self.drafts.on_verified(i, res.n_accepted)
                if g > 0:
                    self.policy.record_verify(s.spec.drafter, g, res.n_accepted)
                    s.accepted += res.n_accepted
                    s.rejected += int(res.n_accepted < g)
            reason, emitted = self._emit(s, d, res)
            observed.append((g, res.n_accepted, emitted))
            if reason is not None:
                finished.append((s, reason))
        if self.metrics is not None:
            self.metrics.observe_step(gamma, observed)
        for s, reason in finished:
            self._finish(s, reason)

    def _verify(self, s: _Slot, d: Draft, logits: torch.Tensor, argmax: list[int]) -> VerifyResult:
        if s.spec.sampling.greedy:
            return greedy_verify(argmax, d.tokens)
        draft_ids = torch.tensor(d.tokens, dtype=torch.long, device=logits.device)
        return rejection_sample(probs_from_logits(logits, s.spec.sampling), draft_ids, d.probs, s.gen)

    def _emit(self, s: _Slot, d: Draft, res: VerifyResult) -> tuple[Optional[str], int]:
        """Append the step's tokens to the request exactly as ``engine.stream`` does; returns (finish reason, n)."""
        new = d.tokens[: res.n_accepted] + [res.next_token]
        flags = [True] * res.n_accepted + [False]
        reason: Optional[str] = None
        for i, t in enumerate(new):
            if t in s.eos:
                new, flags, reason = new[: i + 1], flags[: i + 1], "stop"
                break
        first = not s.generated
        s.stats.record_step(len(d), res.n_accepted, len(new))
        s.tokens.extend(new)
        s.generated.extend(new)
        pieces = [s.detok.push(t) for t in new] if s.detok is not None else [""] * len(new)
        if reason is not None and s.detok is not None:
            pieces[-1] += s.detok.flush()
        stop = s.spec.generation.stop
        if stop and s.detok is not None:
            cut = find_stop(s.text, "".join(pieces), stop)
            if cut is not None:
                pieces = truncate_pieces(pieces, cut - len(s.text))
                reason = "stop"
        s.text += "".join(pieces)
        s.handle.emit(ServedStep(new, flags, pieces, drafted=len(d)))
        if first and self.metrics is not None:
            self.metrics.observe_first_token(time.monotonic() - s.handle.submitted)
        if reason is None and s.room() <= 0:
            reason = "length"
        return reason, len(new)

    def _finish(self, s: _Slot, reason: str) -> None:
        if reason == "length" and s.detok is not None:
            tail = s.detok.flush()
            if tail:
                s.text += tail
                s.handle.emit(StepEvent([], [], [tail]))
        s.stats.decode_s = time.perf_counter() - s.decode_start
        s.handle.emit(FinishEvent(reason, list(s.generated), s.text, s.stats))
        self._finish_metrics(reason, s)
        self._free(s)

    def _finish_metrics(self, reason: str, s: _Slot) -> None:
        if self.metrics is not None:
            self.metrics.observe_finish(reason, s.stats, time.monotonic() - s.handle.submitted)

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.set_occupancy(len(self._active), len(self._pending))
