"""What a verified step hands the client: the one place for EOS, stop strings, detokenisation and stats
(``emit``), and the raw facts a step's event carries on request (``annotate``: the web page's per-pass card,
logprobs). The decode core (core.py) calls both once per row per step."""

from __future__ import annotations

import time
from typing import Optional

import torch

from .draft import Draft
from .logprobs import token_logprobs
from .rows import Event, FinishEvent, Row, StepEvent
from .text import find_stop, truncate_pieces
from .verify import VerifyResult


def emit(r: Row, accepted: list[int], res: VerifyResult, drafted: int, events: list[tuple[Row, Event]]) -> bool:
    """Append the step's tokens to the row: EOS cut, text, stop strings, stats. True if it finished."""
    new = accepted + [res.next_token]
    flags = [True] * len(accepted) + [False]
    reason: Optional[str] = None
    for k, t in enumerate(new):
        if t in r.eos:
            new, flags, reason = new[: k + 1], flags[: k + 1], "stop"
            break
    r.stats.record_step(drafted, len(accepted), len(new))
    r.tokens.extend(new)
    r.generated.extend(new)
    detok = r.detok
    pieces = [detok.push(t) for t in new] if detok is not None else [""] * len(new)
    if reason is not None and detok is not None:
        pieces[-1] += detok.flush()
    stop = r.request.generation.stop
    if stop and detok is not None:
        cut = find_stop(r.text, "".join(pieces), stop)
        if cut is not None:
            pieces = truncate_pieces(pieces, cut - len(r.text))
            reason = "stop"
    r.text += "".join(pieces)
    events.append((r, StepEvent(new, flags, pieces, drafted)))
    if reason is None and r.room() <= 0:
        reason = "length"
    if reason is None:
        return False
    if reason == "length" and detok is not None:
        tail = detok.flush()
        if tail:
            r.text += tail
            events.append((r, StepEvent([], [], [tail])))
    r.stats.decode_s = time.perf_counter() - r.decode_start
    events.append((r, FinishEvent(reason, list(r.generated), r.text, r.stats)))
    return True


def annotate(ev: Event, r: Row, d: Draft, res: VerifyResult, kept: Optional[list[int]], logits: torch.Tensor,
             i: int) -> None:
    """The step's first event (``emit``'s ``StepEvent``) gets what was proposed (a drafted step: for the server's
    per-pass card) and the tokens' logprobs when the request asks, read off row ``i`` of the pass's ``logits``
    at the positions it kept (``kept``: a tree's accepted path, root included; None: a chain)."""
    assert isinstance(ev, StepEvent)
    if d.tokens:
        ev.proposed = list(d.tokens)
        if d.parents is not None:
            ev.parents, ev.path = list(d.parents), list(res.path or ())
    if r.request.logprobs is not None:
        pos = kept if kept is not None else list(range(res.n_accepted + 1))
        ev.logprobs = token_logprobs(logits[i, pos[: len(ev.token_ids)]], ev.token_ids, r.sampling,
                                     r.request.logprobs)
