"""Run requests through one decode core as a server does: added every other step, finishing at different steps
(so a later row moves into a freed one). Shared by the conformance suite and the fixed-shape tests."""

from __future__ import annotations

from typing import Optional, Sequence

import specdecode as sd
from specdecode.config import GenerationConfig
from specdecode.core import DecodeCore
from specdecode.rows import Request


def run_rows(core: DecodeCore, target: sd.Model, prompts: Sequence[str], budgets: Sequence[int],
             drafter: Optional[str]) -> list[list[int]]:
    """Each prompt's greedy tokens (EOS ignored), in prompt order."""
    out: dict[int, list[int]] = {}
    rows: dict[int, int] = {}
    pending, step = list(range(len(prompts))), 0
    while pending or core.rows:
        if pending and step % 2 == 0:
            i = pending.pop(0)
            gen = GenerationConfig(max_new_tokens=budgets[i], ignore_eos=True)
            rows[id(core.add(Request(target.encode(prompts[i]), generation=gen, drafter=drafter)))] = i
        for row, ev in core.step():
            if isinstance(ev, sd.FinishEvent):
                out[rows[id(row)]] = ev.token_ids
        step += 1
    return [out[i] for i in range(len(prompts))]
