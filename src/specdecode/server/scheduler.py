"""Continuous batching: one engine thread runs the decode core; the HTTP side only submits.

The thread repeats: admit waiting requests into free rows (``DecodeCore.add``, each prefilled
alone), drop cancelled or timed-out ones (``DecodeCore.remove``), then one ``DecodeCore.step``
over every running row, and hand each row's events to its request. Drafting, verification,
EOS, stop strings, detokenisation and the γ policy are the core's (``core.py``), the same code
``specdecode generate`` runs, so a greedy request gives the same tokens alone or beside others.

Events reach the HTTP side through the request's ``asyncio.Queue`` via
``loop.call_soon_threadsafe``. While other rows run, a long prompt goes in a chunk per step
(``prefill.py``), so its prefill never holds their next pass for long; the requests behind it wait
until it is in.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import torch

from ..core import DecodeCore
from ..rows import Event, Failure, FinishEvent, Request, Row, StepEvent
from ..drafters.base import BatchDrafter
from ..models import Model
from ..sizing.policy import GammaPolicy
from ..sizing.pricer import DEFAULT_PRICER, Pricer
from .card import pass_view

if TYPE_CHECKING:
    from .metrics import ServerMetrics

log = logging.getLogger("specdecode.server")

__all__ = ["Event", "Failure", "QueueFullError", "Request", "RequestHandle", "Scheduler", "SchedulerClosedError"]


class QueueFullError(RuntimeError):
    """Every row is busy and the waiting queue is full."""


class SchedulerClosedError(RuntimeError):
    """The scheduler is shutting down and takes no new requests."""


_ids = itertools.count(1)


class RequestHandle:
    """The HTTP side of one request: the engine thread pushes events into ``queue``."""

    def __init__(self, spec: Request, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.id = next(_ids)
        self.spec = spec
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.submitted = time.monotonic()
        self.deadline = self.submitted + timeout_s
        self.started = False  # a first token went out (time to first token is observed once)
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


class Scheduler:
    """Owns the decode core and the engine thread; the API layer only submits."""

    def __init__(self, target: Model, drafters: Mapping[str, BatchDrafter], *, max_batch_size: int = 16,
                 max_queue: int = 64, max_context: Optional[int] = None,
                 metrics: Optional["ServerMetrics"] = None, prepare: Optional[Sequence[str]] = None,
                 prepare_in_background: bool = False, threads: Optional[int] = None,
                 pricer: Pricer = DEFAULT_PRICER) -> None:
        """``prepare``: the drafters prepared before the first request (buffers, measured costs), here or, with
        ``prepare_in_background``, on the engine thread as it starts, while /health answers "warming".
        ``threads``: the engine thread's torch threads, set on that thread (None: as the process has them).
        ``pricer``: the γ policy's margin and cost book (``sizing/pricer.py``)."""
        self.target = target
        self._threads = threads
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.metrics = metrics
        # the drafters the engine thread prepares before it serves (a list read by /health from any thread)
        self._warmup: list[str] = list(prepare or []) if prepare_in_background else []
        # then, whenever the engine is idle, the other drafters one by one: a drafter's first request would
        # otherwise measure its costs inside a step and freeze every running stream for 0.5-4 s
        self._idle_prepare = prepare_in_background
        # built here so a bad pair fails at startup (vocabulary, device), not at the first request
        self.core = DecodeCore(target, drafters, max_rows=max_batch_size,
                               context_len=min(target.max_seq_len, max_context or target.max_seq_len),
                               policy=GammaPolicy(pricer), prepare=[] if prepare_in_background else prepare)
        self._pending: collections.deque[RequestHandle] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._drain_deadline = float("inf")
        self._abort = False
        self._thread: Optional[threading.Thread] = None

    # -- API side (any thread) -------------------------------------------------------------------
    @property
    def context_len(self) -> int:
        return self.core.context_len

    @property
    def drafters(self) -> Mapping[str, BatchDrafter]:
        return self.core.drafters

    @property
    def policy(self) -> GammaPolicy:
        return self.core.policy

    @property
    def forward_passes(self) -> int:
        return self.core.forward_passes

    @property
    def preparing(self) -> Optional[str]:
        """The drafter being prepared now (its costs measured), or waiting to be at start-up: /health's "warming"."""
        name = self.core.preparing
        if name is None:
            try:
                name = self._warmup[0]  # the engine thread pops it only once prepared
            except IndexError:
                pass
        return name

    @property
    def active_rows(self) -> int:
        return len(self.core.rows)

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specdecode-engine", daemon=True)
        self._thread.start()

    def submit(self, handle: RequestHandle) -> None:
        """Queue a request; raises QueueFullError or SchedulerClosedError instead of waiting."""
        name = handle.spec.drafter
        if name is not None and name not in self.core.drafters:
            raise ValueError(f"drafter {name!r} is not loaded on this server; loaded: "
                             f"{', '.join(sorted(self.core.drafters)) or 'none'}")
        with self._cond:
            if self._stopping:
                raise SchedulerClosedError("the server is shutting down")
            free_rows = self.max_batch_size - len(self.core.rows)
            if len(self._pending) >= self.max_queue + max(0, free_rows):
                running, waiting = len(self.core.rows), len(self._pending)
                raise QueueFullError(f"server busy: it holds {running + waiting} requests ({running} decoding, "
                                     f"{waiting} waiting to start), its limit of {self.max_batch_size} decoding "
                                     f"(--max-batch-size) plus {self.max_queue} queued (--max-queue); retry after "
                                     "the Retry-After delay, or start the server with a larger --max-queue")
            self._pending.append(handle)
            self._cond.notify()

    @property
    def draining(self) -> bool:
        return self._stopping

    @property
    def drained(self) -> bool:
        """Draining, and the engine has ended every request (finished, or failed at the drain deadline)."""
        return self._stopping and (self._thread is None or not self._thread.is_alive())

    @property
    def drain_deadline(self) -> float:
        return self._drain_deadline

    def begin_drain(self, timeout_s: float) -> None:
        """Stop admitting (new requests: SchedulerClosedError; waiting ones fail with "shutdown" now);
        running ones have ``timeout_s`` to finish, then fail with "shutdown". Returns at once."""
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._drain_deadline = time.monotonic() + timeout_s
            self._cond.notify()

    def stop(self, drain_s: float = 10.0) -> None:
        """Drain (see ``begin_drain``; an earlier drain keeps its deadline) and wait for the engine thread."""
        self.begin_drain(drain_s)
        if self._thread is not None:
            self._thread.join(max(0.0, self._drain_deadline - time.monotonic()) + 10.0)
            if self._thread.is_alive():
                with self._cond:
                    self._abort = True
                    self._cond.notify()
                self._thread.join(5.0)

    # -- engine thread ---------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """Prepare the start-up drafters; requests queue meanwhile. A drafter that fails here is logged and
        tried again at its first request (which then fails alone)."""
        while self._warmup and not self._abort:
            name = self._warmup[0]
            try:
                self.core.prepare(name)
            except Exception as e:
                log.exception("preparing drafter %r failed: %s", name, e)
            finally:
                self._warmup.pop(0)

    def _idle_work(self) -> bool:
        return self._idle_prepare and bool(self.core.unprepared())

    def _prepare_one(self) -> None:
        """Prepare one drafter no request has used yet; one that fails is left to fail at its first request."""
        name = self.core.unprepared()[0]
        try:
            self.core.prepare(name)
        except Exception as e:
            log.warning("preparing drafter %r while idle failed (%r); its first request tries again", name, e)
            self._idle_prepare = False

    def _run(self) -> None:
        core = self.core
        if self._threads is not None:
            # on this thread: an OpenMP team belongs to the thread that starts it (``server/cli.py``)
            torch.set_num_threads(self._threads)
        self._warm_up()
        while True:
            with self._cond:
                idle = not self._pending and not core.rows and core.filling is None and not self._stopping
                while idle and not self._idle_work():
                    self._cond.wait()
                    idle = not self._pending and not core.rows and core.filling is None and not self._stopping
                refused: list[RequestHandle] = []
                if self._stopping:  # draining: nothing waiting starts any more
                    refused = list(self._pending)
                    self._pending.clear()
                admit: list[RequestHandle] = []
                while (self._pending and core.filling is None
                       and len(core.rows) + len(admit) < self.max_batch_size):
                    admit.append(self._pending.popleft())
                stop = self._abort or (self._stopping and (not (core.rows or core.filling)
                                                           or time.monotonic() > self._drain_deadline))
            for h in refused:
                self._drop(h, "shutdown", "the server is shutting down and did not start this request; retry later")
            if stop:
                break
            if idle:
                self._prepare_one()
                continue
            for k, h in enumerate(admit):
                if core.filling is not None:  # a long prompt goes in a chunk a step: the rest wait their turn
                    with self._cond:
                        self._pending.extendleft(reversed(admit[k:]))
                    break
                self._admit(h)
            try:
                self._reap()
                if core.rows or core.filling is not None:
                    self._step()
            except Exception as e:  # never leave clients hanging on an engine bug
                log.exception("engine step failed: %s", e)
                for r in core.live_rows():
                    r.owner.emit(Failure("internal", "internal error in the engine; the request was stopped"))
                    self._finish_metrics("error", r)
                core.clear()
            self._update_gauges()
        with self._cond:
            leftovers = list(self._pending)
            self._pending.clear()
        for h in leftovers:
            self._drop(h, "shutdown", "the server shut down before this request started; retry later")
        for r in core.live_rows():
            if not r.owner.cancelled:
                r.owner.emit(Failure("shutdown", f"the server shut down during this request (drain timeout) after "
                                                 f"{len(r.generated)} tokens"))
            self._finish_metrics("cancelled" if r.owner.cancelled else "shutdown", r)
            core.remove(r)
        self._update_gauges()

    def _drop(self, h: RequestHandle, reason: str, message: Optional[str] = None) -> None:
        """End a request that never got a row; every request ends in the metrics exactly once."""
        if h.cancelled:
            reason = "cancelled"
        elif message is not None:
            h.emit(Failure("internal" if reason == "error" else reason, message))
        if self.metrics is not None:
            self.metrics.observe_dropped(reason, time.monotonic() - h.submitted)

    def _admit(self, h: RequestHandle) -> None:
        if h.cancelled:
            self._drop(h, "cancelled")
            return
        if time.monotonic() > h.deadline:
            self._drop(h, "timeout", "the request timed out while waiting for a free slot")
            return
        try:
            self.core.add(h.spec, owner=h, chunked=True)
        except Exception as e:  # a request that cannot start fails alone
            log.exception("prefill failed: %s", e)
            self._drop(h, "error", "internal error while reading the prompt; the request was stopped")

    def _reap(self) -> None:
        """Free rows of cancelled or timed-out requests; fail waiting requests that timed out."""
        now = time.monotonic()
        for r in self.core.live_rows():
            h: RequestHandle = r.owner
            if h.cancelled:
                self._finish_metrics("cancelled", r)
                self.core.remove(r)
            elif now > h.deadline:
                h.emit(Failure("timeout", f"the request timed out after {len(r.generated)} tokens"))
                self._finish_metrics("timeout", r)
                self.core.remove(r)
        with self._cond:
            keep = collections.deque(h for h in self._pending if not h.cancelled and now <= h.deadline)
            dropped = [h for h in self._pending if h not in keep]
            self._pending = keep
        for h in dropped:
            self._drop(h, "timeout", "the request timed out while waiting for a free slot")

    def _step(self) -> None:
        events = self.core.step()
        observed: list[tuple[int, int, int, list[bool]]] = []
        for r, ev in events:
            h: RequestHandle = r.owner
            h.emit(ev)
            if isinstance(ev, StepEvent) and ev.token_ids:
                verified = pass_view(ev).verified if ev.drafted else []
                observed.append((ev.drafted, sum(ev.from_draft), len(ev.token_ids), verified))
                if not h.started:
                    h.started = True
                    if self.metrics is not None:
                        self.metrics.observe_first_token(time.monotonic() - h.submitted)
            elif isinstance(ev, FinishEvent):
                self._finish_metrics(ev.reason, r)
            elif isinstance(ev, Failure):  # one row failed (its grammar engine gave up); the core removed it
                self._finish_metrics("error", r)
        if self.metrics is not None and observed:
            self.metrics.observe_step(max(o[0] for o in observed), observed)

    def _finish_metrics(self, reason: str, r: Row) -> None:
        if self.metrics is not None:
            self.metrics.observe_finish(reason, r.stats, time.monotonic() - r.owner.submitted)

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.set_occupancy(len(self.core.rows), len(self._pending))
