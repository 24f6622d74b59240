"""A request's ``n`` choices as batch rows, and OpenAI's logprobs shapes.

Each choice is its own core row (``RequestHandle``); ``ChoiceGroup`` merges their events in
arrival order, tagged with the choice's index. A seeded request gives choice ``i`` the seed
``seed + i`` (wrapped into the range torch accepts), so the choices differ from one another and
each one reproduces: choice 0 of an ``n`` request is the same text as the single-choice request.

Logprobs are the core's (``StepEvent.logprobs``, exact under speculation); this module only
reshapes them: completions get ``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets
count characters from the start of the completion text), chat gets ``{content: [{token, logprob,
bytes, top_logprobs}]}``. A token's text is its own decoding (a lone byte of a multi-byte
character shows as U+FFFD); ``bytes`` are the token's raw bytes from the tokenizer (so the
pieces of a multi-byte character join up), or its text's UTF-8 without a tokenizer.json.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..rows import Event, Failure, FinishEvent
from ..logprobs import TokenLogprob
from .scheduler import RequestHandle

UINT64_MAX = 2**64 - 1


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    """Choice ``index``'s seed: ``seed + index``, wrapped by 2**64 past the largest seed torch takes."""
    if seed is None:
        return None
    s = seed + index
    return s - 2**64 if s > UINT64_MAX else s


@dataclass
class Choice:
    """One finished choice of a non-streaming request, as the relay collected it."""

    fin: FinishEvent
    flags: list[bool]  # per token: whether it came from the draft
    logprobs: list[dict[str, Any]]  # formatted per step event


class ChoiceGroup:
    """The rows of one request; events come out as (choice index, event)."""

    def __init__(self, handles: Sequence[RequestHandle]) -> None:
        self.handles = list(handles)
        self._gets: dict[int, asyncio.Task[Event]] = {}
        self._open = set(range(len(self.handles)))

    def close(self, index: int) -> None:
        """Choice ``index`` has finished: stop listening to it."""
        self._open.discard(index)

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()
        for t in self._gets.values():
            t.cancel()
        self._gets.clear()

    async def next_event(self, wait: float) -> Optional[tuple[int, Event]]:
        """The next event of any open choice, or None after ``wait`` seconds without one."""
        for i in self._open:
            if i not in self._gets:
                self._gets[i] = asyncio.ensure_future(self.handles[i].queue.get())
        done, _ = await asyncio.wait(self._gets.values(), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        for i, t in list(self._gets.items()):
            if t in done:
                del self._gets[i]
                return i, t.result()
        if time.monotonic() > min(h.deadline for h in self.handles) + 5.0:  # the engine missed the deadline
            self.cancel()
            return 0, Failure("timeout", "the request timed out")
        return None


def completion_logprobs(lps: Sequence[TokenLogprob], pieces: Sequence[str], offset: int,
                        token_text: Callable[[int], str]) -> dict[str, Any]:
    """OpenAI completions' logprobs object for these tokens; ``offset``: characters already sent."""
    offsets = []
    for i in range(len(lps)):
        offsets.append(offset)
        offset += len(pieces[i]) if i < len(pieces) else 0
    return {"tokens": [token_text(t.token) for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [_top_dict(t.top, token_text) for t in lps], "text_offset": offsets}


def _top_dict(top: Sequence[tuple[int, float]], token_text: Callable[[int], str]) -> dict[str, float]:
    """Text -> logprob, best first; two tokens with the same text (e.g. U+FFFD) keep the likelier one."""
    out: dict[str, float] = {}
    for tok, lp in top:
        out.setdefault(token_text(tok), lp)
    return out


def merge_completion_logprobs(parts: Sequence[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not parts:
        return None
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_logprobs(lps: Sequence[TokenLogprob], token_text: Callable[[int], str],
                  token_bytes: Callable[[int], Optional[bytes]]) -> list[dict[str, Any]]:
    """OpenAI chat's ``logprobs.content`` entries for these tokens (``token_bytes``: a token's raw bytes,
    None where unknown, then the UTF-8 of its text)."""

    def entry(tok: int, logprob: float) -> dict[str, Any]:
        text = token_text(tok)
        raw = token_bytes(tok)
        return {"token": text, "logprob": logprob,
                "bytes": list(raw if raw is not None else text.encode("utf-8", "surrogatepass"))}

    return [{**entry(t.token, t.logprob), "top_logprobs": [entry(tok, lp) for tok, lp in t.top]} for t in lps]
