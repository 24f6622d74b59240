"""Ending a reply that has fallen into a loop, without changing a token of it.

Greedy decoding of a small model can lock into a cycle (the same docstring or line again and
again) and then spends the whole token budget on it. ``RepetitionStop`` says when a reply counts
as runaway: its last tokens are one cycle of at most ``max_period`` tokens repeated ``min_repeats``
times back to back, spanning at least ``min_tokens`` tokens. ``stop_runaway`` watches an event
stream and, at the token that completes such a tail, ends it with finish reason ``"repetition"``.
The tokens it keeps are exactly the run's own: the stop only ends a reply early, so the text is
always a prefix of what the same request decodes without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from .config import ConfigError
from .metrics import GenerationStats
from .rows import FinishEvent, StepEvent

REPETITION = "repetition"  # the finish reason of a reply ended by the stop


@dataclass(frozen=True)
class RepetitionStop:
    """When a reply's tail counts as a runaway cycle (see the module docstring).

    The defaults leave ordinary answers alone: 48 tokens is longer than a legitimate run of one
    repeated token or short pattern (a table rule, an indented block), and three back-to-back
    copies of a longer block are a loop rather than an answer."""

    min_repeats: int = 3
    min_tokens: int = 48
    max_period: int = 128

    def __post_init__(self) -> None:
        for name, low in (("min_repeats", 2), ("min_tokens", 1), ("max_period", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"repetition stop: {name} must be an integer >= {low}, got {value!r}")

    def describe(self) -> str:
        return (f"a cycle of up to {self.max_period} tokens repeated {self.min_repeats} times back to back, "
                f"spanning at least {self.min_tokens} tokens")


class RepetitionDetector:
    """Tokens in, one at a time; ``push`` says when they end in a runaway cycle.

    For every period p it keeps how many trailing tokens equal the token p before them, so the
    tail is p-periodic over that count plus p tokens: O(max_period) per token, no rescans."""

    def __init__(self, rule: RepetitionStop) -> None:
        self.rule = rule
        self._tail: list[int] = []  # the last max_period tokens
        self._runs = [0] * (rule.max_period + 1)  # index p: trailing tokens equal to the one p before

    def push(self, token: int) -> bool:
        tail, runs, rule = self._tail, self._runs, self.rule
        fired = False
        for p in range(1, len(tail) + 1):
            if tail[-p] == token:
                runs[p] += 1
                span = runs[p] + p
                if span >= rule.min_tokens and span >= rule.min_repeats * p:
                    fired = True
            else:
                runs[p] = 0
        tail.append(token)
        if len(tail) > rule.max_period:
            del tail[0]
        return fired


def stop_runaway(events: Iterable[StepEvent | FinishEvent],
                 rule: Optional[RepetitionStop]) -> Iterator[StepEvent | FinishEvent]:
    """``events`` as they come until the reply's tokens end in a runaway cycle; then that step cut after
    the token that completed it and a ``FinishEvent`` with reason ``"repetition"``. Its stats count the
    kept tokens over the wall time since the first event was asked for (prefill included, as the core's
    ``tokens_per_s``). ``rule`` None passes everything through."""
    if rule is None:
        yield from events
        return
    detector = RepetitionDetector(rule)
    stats = GenerationStats()
    ids: list[int] = []
    text: list[str] = []
    start = time.perf_counter()
    for ev in events:
        if not isinstance(ev, StepEvent):
            yield ev
            return
        cut = next((k + 1 for k, t in enumerate(ev.token_ids) if detector.push(t)), None)
        stats.record_step(ev.drafted, sum(ev.from_draft), len(ev.token_ids) if cut is None else cut)
        if cut is None:
            ids.extend(ev.token_ids)
            text.extend(ev.pieces)
            yield ev
            continue
        kept = StepEvent(ev.token_ids[:cut], ev.from_draft[:cut], ev.pieces[:cut], ev.drafted,
                         ev.logprobs[:cut] if ev.logprobs is not None else None, ev.proposed, ev.parents, ev.path)
        ids.extend(kept.token_ids)
        text.extend(kept.pieces)
        yield kept
        stats.decode_s = time.perf_counter() - start
        yield FinishEvent(REPETITION, ids, "".join(text), stats)
        return


__all__ = ["REPETITION", "RepetitionDetector", "RepetitionStop", "stop_runaway"]
