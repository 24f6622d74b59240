"""The batched drafter protocol is what the core calls, no more: declared once, defaults in one base class."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pytest

import specdecode as sd
from specdecode.config import ConfigError, GenerationConfig, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.draft import Draft, DraftContext
from specdecode.drafters.base import BATCH_MEMBERS, Acceptance, BatchDrafter, as_batch_drafter


class Repeat(sd.BatchDrafterBase):
    """Proposes the last token again: no per-row state, so it states only γ, its evidence and the two calls."""

    gamma = 3

    def __init__(self) -> None:
        self.acceptance = Acceptance()

    def prepare_rows(self, target: sd.Model, rows: int, max_len: int) -> None: ...

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        return {r: Draft([c.tokens[-1]] * c.max_tokens) for r, c in contexts.items()}


def test_the_named_members_are_the_protocols() -> None:
    declared = set(BatchDrafter.__annotations__) | {n for n in vars(BatchDrafter) if not n.startswith("_")}
    assert set(BATCH_MEMBERS) == declared


def test_a_stateless_drafter_runs_in_a_batch_on_the_defaults(tiny_dirs: dict[str, Path]) -> None:
    """Rows come, go and move on the base's no-op row calls (the first request ends first, so the second moves
    into its row); the tokens are plain decoding's."""
    target = sd.load_model(tiny_dirs["llama"])
    prompts = [target.encode("def fib(n):"), target.encode("x = 1\ny = 2\n")]
    lengths = [5, 12]
    core = DecodeCore(target, {"repeat": Repeat()}, max_rows=2, context_len=128)
    rows = [core.add(Request(p, SamplingConfig(), GenerationConfig(max_new_tokens=n, ignore_eos=True), "repeat"))
            for p, n in zip(prompts, lengths)]
    out: dict[int, list[int]] = {}
    while core.rows:
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                out[id(row)] = ev.token_ids
    for p, n, row in zip(prompts, lengths, rows):
        assert out[id(row)] == sd.generate(target, p, max_new_tokens=n, ignore_eos=True).token_ids


def test_a_batched_drafter_missing_a_member_is_told_which() -> None:
    class Partial:
        gamma, wants_hidden = 2, False

        def __init__(self) -> None:
            self.acceptance = Acceptance()

        def prepare_rows(self, target: sd.Model, rows: int, max_len: int) -> None: ...

        def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
            return {}

    with pytest.raises(ConfigError, match=r"missing here: .*hidden_layers.*refine_costs.*BatchDrafterBase"):
        as_batch_drafter(Partial())  # type: ignore[arg-type]
    assert isinstance(as_batch_drafter(Repeat()), Repeat)
