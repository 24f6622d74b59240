"""Core events -> HTTP: a non-streaming answer collected, or server-sent events relayed as they come.

A whole answer is encoded in slices of ``SLICE_S`` on the event loop (``json_answer``): with ``n = 8``
and ``top_logprobs = 20`` a 200-token answer is ~2 MB of JSON, 40-60 ms in one call of json's C
encoder, all that time with ``/health`` waiting (the rest of its 121-283 ms were full garbage
collections: see app.py's lifespan). A worker thread does not free the loop: the C encoder holds
the GIL for its whole call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..rows import FinishEvent, StepEvent
from .card import card_fields
from .choices import Choice, ChoiceGroup
from .protocol import error_body
from .translate import ClientGone, failure_error, summary, usage_all, usage_one

log = logging.getLogger("specdecode.server")


LogprobFormat = Callable[[int, StepEvent], Optional[dict[str, Any]]]


async def collect(group: ChoiceGroup, request: Request, lp: LogprobFormat) -> list[Choice]:
    """Wait for every choice of a non-streaming request, cancelling them all if the client goes away."""
    n = len(group.handles)
    flags: list[list[bool]] = [[] for _ in range(n)]
    lps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    fins: dict[int, FinishEvent] = {}
    tokens = 0
    next_check = time.monotonic() + 0.25
    try:
        while len(fins) < n:
            got = await group.next_event(0.25)
            if time.monotonic() >= next_check:  # events may never pause, so check on a clock
                next_check = time.monotonic() + 0.25
                if await request.is_disconnected():
                    raise ClientGone(f"request {group.handles[0].id} cancelled after {tokens} tokens")
            if got is None:
                continue
            i, ev = got
            if isinstance(ev, StepEvent):
                flags[i].extend(ev.from_draft)
                tokens += len(ev.token_ids)
                formatted = lp(i, ev)
                if formatted is not None:
                    lps[i].append(formatted)
            elif isinstance(ev, FinishEvent):
                fins[i] = ev
                group.close(i)
            else:
                raise failure_error(ev)
        return [Choice(fins[i], flags[i], lps[i]) for i in range(n)]
    except BaseException:
        group.cancel()
        raise


SLICE_S = 0.002  # the longest the loop encodes an answer before it serves other requests
PIECE = 64  # list items per encoder call: ~64 logprob entries with 20 alternatives each take ~1.5 ms
WALK_DEPTH = 4  # containers walked item by item down to this depth (an answer's logprobs sit at depth 4)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # as JSONResponse's


def json_pieces(obj: Any, depth: int = 0) -> Iterator[str]:
    """``JSONResponse(obj).body``'s text, in pieces of at most ``PIECE`` list items each."""
    if isinstance(obj, (list, tuple)) and len(obj) > PIECE:
        yield "["
        for at in range(0, len(obj), PIECE):
            yield ("," if at else "") + _ENCODER.encode(list(obj[at:at + PIECE]))[1:-1]
        yield "]"
    elif depth < WALK_DEPTH and isinstance(obj, (list, tuple)) and obj:
        yield "["
        for k, item in enumerate(obj):
            if k:
                yield ","
            yield from json_pieces(item, depth + 1)
        yield "]"
    elif depth < WALK_DEPTH and isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        yield "{"
        for k, (key, value) in enumerate(obj.items()):
            yield ("," if k else "") + _ENCODER.encode(key) + ":"
            yield from json_pieces(value, depth + 1)
        yield "}"
    else:
        yield _ENCODER.encode(obj)


async def json_answer(body: dict[str, Any]) -> Response:
    """A whole answer as JSONResponse would send it, byte for byte, encoded in slices of ``SLICE_S`` with
    the loop free for other requests between them."""
    out: list[str] = []
    last = time.perf_counter()
    for piece in json_pieces(body):
        out.append(piece)
        if time.perf_counter() - last >= SLICE_S:
            await asyncio.sleep(0)
            last = time.perf_counter()
    return Response("".join(out).encode("utf-8"), media_type="application/json")


ChunkFn = Callable[[int, str, Optional[str], Optional[dict[str, Any]], Optional[dict[str, Any]]], dict[str, Any]]


def sse_response(group: ChoiceGroup, chunk: ChunkFn, lp: LogprobFormat, first: Optional[list[dict[str, Any]]],
         include_usage: bool, rid: str, created: int, model: str, obj: str,
         token_text: Callable[[int], str]) -> StreamingResponse:
    """Server-sent events: one chunk per target pass and choice (``index``), carrying per-token origin in
    ``specdecode`` and, for a drafted pass, the page's per-pass card read along the verified path (``card.py``):
    the first rejected candidate, whether the target's token is a bonus, and each path position's outcome."""

    def line(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    async def events() -> AsyncIterator[bytes]:
        done = False
        n = len(group.handles)
        fins: dict[int, FinishEvent] = {}
        sent = 0
        try:
            for c in first or []:
                yield line(c)
            while True:
                got = await group.next_event(1.0)
                if got is None:
                    continue
                i, ev = got
                if isinstance(ev, StepEvent):
                    from_draft = ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))
                    sent += len(ev.token_ids)
                    yield line(chunk(i, ev.text, None, {"pieces": ev.pieces, "from_draft": from_draft,
                                                        "token_ids": ev.token_ids, "drafted": ev.drafted,
                                                        **card_fields(ev, token_text)}, lp(i, ev)))
                elif isinstance(ev, FinishEvent):
                    fins[i] = ev
                    group.close(i)
                    yield line(chunk(i, "", ev.reason, {**summary(ev, []), "usage": usage_one(ev)}, None))
                    if len(fins) < n:
                        continue
                    if include_usage:
                        yield line({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                    "usage": usage_all([fins[k] for k in range(n)])})
                    done = True
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    e = failure_error(ev)
                    done = True
                    group.cancel()
                    yield line(error_body(e.message, e.type, e.param, e.code))
                    yield b"data: [DONE]\n\n"
                    return
        finally:
            if not done:  # the client went away: free the rows now
                group.cancel()
                log.info("client disconnected from stream %d after %d tokens; cancelled", group.handles[0].id, sent)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
