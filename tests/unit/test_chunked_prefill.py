"""Chunked prefill: a long prompt goes in a chunk per step while other rows run, and changes no token."""

from __future__ import annotations

import pytest

import specdecode as sd
from specdecode.bundled import DEFAULT_TARGET, default_model_dir
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request, StepEvent
from specdecode.drafters import DrafterOptions, build_drafter

LONG = "def add(a, b):\n    return a + b\n\n" * 30  # several chunks of the first 64 tokens
SHORT = "def fib(n):"


@pytest.fixture(scope="module")
def target() -> sd.Model:
    return sd.load_model(default_model_dir(DEFAULT_TARGET), weight_dtype="int8")


def _request(target: sd.Model, text: str, drafter: str | None, n: int = 24) -> Request:
    return Request(target.encode(text), SamplingConfig(), GenerationConfig(max_new_tokens=n, ignore_eos=True),
                   drafter)


def _eagle() -> sd.EagleDrafter:
    return sd.EagleDrafter.load(default_model_dir("code-eagle"))


@pytest.mark.parametrize("drafter", [None, "ngram", "eagle"])
def test_a_long_prompt_goes_in_by_chunks_between_passes_with_the_same_tokens(target: sd.Model,
                                                                            drafter: str | None) -> None:
    drafters = {"ngram": build_drafter("ngram", DrafterOptions(gamma=4)), "eagle": _eagle()}
    core = DecodeCore(target, drafters, max_rows=3, context_len=512)
    core.prefill_slice_s = 1e-9  # the smallest chunks: 16 tokens a step, a boundary every 16 positions
    running = core.add(_request(target, SHORT, drafter, n=200))
    core.step()
    long_row = core.add(_request(target, LONG, drafter), chunked=True)
    assert core.filling is not None and core.live_rows() == [running, long_row]
    passes_while_filling = 0
    out: dict[int, list[int]] = {}
    while core.live_rows():
        filling = core.filling is not None
        for row, ev in core.step():
            if filling and row is running and isinstance(ev, StepEvent):
                passes_while_filling += 1
            if isinstance(ev, FinishEvent):
                out[id(row)] = ev.token_ids
    assert passes_while_filling >= 10  # the running row was not held for the whole prefill
    for row, text, n in ((running, SHORT, 200), (long_row, LONG, 24)):
        d = None if drafter is None else (_eagle() if drafter == "eagle" else drafters["ngram"])
        alone = sd.generate(target, text, d, max_new_tokens=n, ignore_eos=True).token_ids
        assert out[id(row)] == alone


def test_a_finished_row_moves_the_filling_prompt_down(target: sd.Model) -> None:
    core = DecodeCore(target, {}, max_rows=3, context_len=512)
    a = core.add(_request(target, SHORT, None, n=2))
    b = core.add(_request(target, "x = 1\n", None, n=200))
    core.step()
    c = core.add(_request(target, LONG, None), chunked=True)
    assert core.filling is not None and core.filling.slot == 2
    out: dict[int, list[int]] = {}
    while core.live_rows():
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                out[id(row)] = ev.token_ids
        if a not in core.live_rows() and core.filling is not None:
            assert core.filling.slot == len(core.rows) == 1
    assert out[id(c)] == sd.generate(target, LONG, max_new_tokens=24, ignore_eos=True).token_ids
    assert out[id(b)] == sd.generate(target, "x = 1\n", max_new_tokens=200, ignore_eos=True).token_ids


def test_a_filling_prompt_can_be_removed_and_only_one_fills_at_a_time(target: sd.Model) -> None:
    core = DecodeCore(target, {}, max_rows=3, context_len=512)
    core.add(_request(target, SHORT, None, n=50))
    core.step()
    c = core.add(_request(target, LONG, None), chunked=True)
    with pytest.raises(RuntimeError, match="still being prefilled"):
        core.add(_request(target, SHORT, None))
    core.step()
    core.remove(c)
    assert core.filling is None and len(core.live_rows()) == 1
    d = core.add(_request(target, LONG, None), chunked=True)
    out = []
    while core.live_rows():
        out += [ev.token_ids for row, ev in core.step() if row is d and isinstance(ev, FinishEvent)]
    assert out == [sd.generate(target, LONG, max_new_tokens=24, ignore_eos=True).token_ids]


def test_alone_a_prompt_goes_in_at_once(target: sd.Model) -> None:
    core = DecodeCore(target, {}, max_rows=2, context_len=512)
    core.add(_request(target, LONG, None), chunked=True)
    assert core.filling is None and len(core.rows) == 1
