"""Suffix and auto drafters in the batched decode core (the server's path): rows join, finish and move while
others run; greedy tokens equal plain decoding's; one suffix index serves every row."""

from __future__ import annotations

from pathlib import Path

import specdecode as sd
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.sizing.costs import Costs
from specdecode.drafters import DrafterOptions, build_drafter
from specdecode.drafters.suffix import SuffixDrafter

PROMPTS = ["def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\ndef fib(n):\n",
           "class Point:\n    def __init__(self):\n",
           "x = 1\ny = 2\n" * 3, "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\ndef fib(n):\n"]
CHEAP = Costs(c=0.0, v=tuple(1.0 + 0.05 * k for k in range(64)))


def test_suffix_and_auto_rows_in_one_batch(tiny_dirs: dict[str, Path]) -> None:
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])
    gen = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    suffix = SuffixDrafter(costs=CHEAP)
    auto = build_drafter("auto", DrafterOptions(draft=draft, options={"exit_layer": 1}))
    names = ["suffix", "auto", "suffix", "auto", "suffix"]
    requests = [Request(target.encode(PROMPTS[i % len(PROMPTS)]), SamplingConfig(), gen, name)
                for i, name in enumerate(names)]
    core = DecodeCore(target, {"suffix": suffix, "auto": auto}, max_rows=3, context_len=128)
    pending = list(range(len(requests)))
    done: dict[int, list[int]] = {}
    rows = {}
    by_source: dict[str, int] = {}
    while pending or core.rows:
        while pending and len(core.rows) < core.max_rows:  # a finished row's place is taken at once
            i = pending.pop(0)
            rows[id(core.add(requests[i]))] = i
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                done[rows[id(row)]] = ev.token_ids
                for k, v in ev.stats.accepted_by.items():
                    by_source[k] = by_source.get(k, 0) + v
    for i, req in enumerate(requests):
        assert done[i] == sd.generate(target, req.prompt_ids, max_new_tokens=24, ignore_eos=True).token_ids, i
    assert suffix.shared.n_tokens > 0 and len(suffix.shared.docs) >= 3  # every row's output in one index
    assert "suffix" in by_source and set(by_source) <= {"suffix"} | set(auto.names)
