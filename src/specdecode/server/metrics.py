"""Prometheus metrics of the server, in their own registry (so tests and embedders never collide).

Counters hold the raw sums; the paper's quantities (α̂, mean accepted per pass,
τ, acceptance by draft position) are gauges computed from those sums at scrape
time, so they always agree with each other.
"""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..metrics import GenerationStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self, max_positions: int = 32) -> None:
        r = self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._sums = {"row_passes": 0, "generated": 0, "drafted": 0, "accepted": 0}
        self._max_positions = max_positions
        self._pos = [[0, 0] for _ in range(max_positions)]  # per draft position: [drafted, accepted]
        self.requests = Counter("specdecode_requests", "Admitted requests that ended, by finish reason (including "
                                "cancelled/timeout/shutdown while queued)", ["finish_reason"], registry=r)
        self.refused = Counter("specdecode_refused_requests", "Valid requests refused at admission (429 queue_full, "
                               "503 shutting_down)", ["code"], registry=r)
        self.prompt_tokens = Counter("specdecode_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generated_tokens = Counter("specdecode_generated_tokens", "Tokens generated (all requests)", registry=r)
        self.row_passes = Counter("specdecode_target_row_passes",
                                  "Target passes summed over requests (one per row per batched forward)", registry=r)
        self.forwards = Counter("specdecode_target_forwards", "Batched target forward passes (decode)", registry=r)
        self.drafted = Counter("specdecode_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specdecode_accepted_tokens", "Draft tokens accepted by the target", registry=r)
        # per source, at a request's end (its stats hold them): a drafter, one of auto's members (chooser="auto")
        # or "grammar" (tokens a response_format forced). Once no request runs, the drafted ones sum to
        # specdecode_draft_tokens; the accepted ones also count accepted draft tokens after an EOS (as usage does)
        self.drafted_by_source = Counter("specdecode_draft_tokens_by_source", "Draft tokens of ended requests, by "
                                         "source (a drafter, auto's member, or grammar) and chooser (auto or empty)",
                                         ["source", "chooser"], registry=r)
        self.accepted_by_source = Counter("specdecode_accepted_tokens_by_source", "Accepted draft tokens of ended "
                                          "requests, by source and chooser", ["source", "chooser"], registry=r)
        self.acceptance_by_position = Gauge("specdecode_acceptance_rate_by_position",
                                            "Accepted / drafted at each draft position (0-based)", ["position"],
                                            registry=r)
        self.acceptance_rate = Gauge("specdecode_acceptance_rate", "alpha-hat: accepted / drafted tokens", registry=r)
        self.acceptance_rate.set_function(lambda: self._ratio("accepted", "drafted"))
        self.accepted_per_pass = Gauge("specdecode_mean_accepted_per_pass",
                                       "Accepted draft tokens per target row pass", registry=r)
        self.accepted_per_pass.set_function(lambda: self._ratio("accepted", "row_passes"))
        self.tau = Gauge("specdecode_tokens_per_pass", "tau: generated tokens per target row pass (plain = 1)",
                         registry=r)
        self.tau.set_function(lambda: self._ratio("generated", "row_passes"))
        self.batch_size = Histogram("specdecode_batch_size", "Rows per batched target forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.gamma = Histogram("specdecode_step_gamma", "Draft length chosen per step (0 = plain decoding)",
                               buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.active_rows = Gauge("specdecode_active_rows", "Requests decoding now (cache rows in use)", registry=r)
        self.queue_depth = Gauge("specdecode_queue_depth", "Requests waiting for a free row", registry=r)
        self.ttft = Histogram("specdecode_time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("specdecode_request_latency_seconds", "Arrival to last token",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens_per_s = Gauge("specdecode_tokens_per_second", "Generated tokens per second over the last 10 s",
                                  registry=r)
        self.tokens_per_s.set_function(self._recent_rate)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def _ratio(self, num: str, den: str) -> float:
        with self._lock:
            d = self._sums[den]
            return self._sums[num] / d if d else 0.0

    def _recent_rate(self, window: float = 10.0) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - window:
                self._recent.popleft()
            total = sum(n for _, n in self._recent)
        return total / window

    # -- called by the scheduler thread ---------------------------------------------------------
    def observe_step(self, gamma: int, rows: list[tuple[int, int, int, list[bool]]]) -> None:
        """One batched forward; ``rows`` holds (drafted, accepted, emitted, verified) per row: ``verified`` the
        outcome of each draft position on the pass's verified path (``card.pass_view``; a tree's nodes off the
        path were never judged, so they count at no position)."""
        drafted = sum(r[0] for r in rows)
        accepted = sum(r[1] for r in rows)
        emitted = sum(r[2] for r in rows)
        self.forwards.inc()
        self.batch_size.observe(len(rows))
        self.gamma.observe(gamma)
        self.row_passes.inc(len(rows))
        self.generated_tokens.inc(emitted)
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, emitted))
            self._sums["row_passes"] += len(rows)
            self._sums["generated"] += emitted
            self._sums["drafted"] += drafted
            self._sums["accepted"] += accepted
            for _, _, _, verified in rows:
                for i, ok in enumerate(verified[: self._max_positions]):
                    self._pos[i][0] += 1
                    self._pos[i][1] += int(ok)
            positions = [(i, d, a) for i, (d, a) in enumerate(self._pos) if d]
        for i, d, a in positions:
            self.acceptance_by_position.labels(position=str(i)).set(a / d)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_finish(self, reason: str, stats: GenerationStats, seconds: float) -> None:
        self.requests.labels(finish_reason=reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        chooser = stats.chooser or ""
        for source, n in stats.drafted_by.items():
            self.drafted_by_source.labels(source=source, chooser=chooser).inc(n)
            self.accepted_by_source.labels(source=source, chooser=chooser).inc(stats.accepted_by.get(source, 0))
        self.latency.observe(seconds)

    def observe_dropped(self, reason: str, seconds: float) -> None:
        """A queued request that ended before it got a row (cancelled, timed out, shut down, failed prefill)."""
        self.requests.labels(finish_reason=reason).inc()
        self.latency.observe(seconds)

    def observe_refused(self, code: str) -> None:
        self.refused.labels(code=code).inc()

    def set_occupancy(self, active: int, queued: int) -> None:
        self.active_rows.set(active)
        self.queue_depth.set(queued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
