"""chat's repetition stop ends a looping reply early and never alters a token before the stop (issue 49);
chat's --help states the defaults the command really uses; --compare-plain's line says what it measured."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.chat_cli import CHAT_DRAFTER, CHAT_MAX_NEW_TOKENS, DEFAULT_CHAT_MODEL, compare_line
from specdecode.cli import build_parser
from specdecode.config import ConfigError, GenerationConfig, SamplingConfig
from specdecode.metrics import GenerationStats
from specdecode.repetition import REPETITION, RepetitionDetector, RepetitionStop, stop_runaway
from specdecode.rows import FinishEvent, StepEvent
from tiny import build_model

RULE = RepetitionStop()


def _first_stop(tokens: list[int], rule: RepetitionStop = RULE) -> int | None:
    """Index of the token at which the detector fires, or None."""
    det = RepetitionDetector(rule)
    return next((i for i, t in enumerate(tokens) if det.push(t)), None)


def _steps(tokens: list[int], width: int, finish: bool = True) -> list[StepEvent | FinishEvent]:
    """``tokens`` as a core would stream them, ``width`` per step (the first of each step drafted)."""
    events: list[StepEvent | FinishEvent] = []
    for i in range(0, len(tokens), width):
        chunk = tokens[i:i + width]
        events.append(StepEvent(chunk, [True] * (len(chunk) - 1), [f"<{t}>" for t in chunk], drafted=width))
    if finish:
        events.append(FinishEvent("length", list(tokens), "".join(f"<{t}>" for t in tokens), GenerationStats()))
    return events


PROSE = [(7 * i * i + 3 * i) % 997 for i in range(400)]  # no short cycle anywhere


def test_a_cycling_stream_stops_once_three_copies_span_the_minimum() -> None:
    for period in (1, 2, 5, 16, 40, 128):
        cycle = list(range(1000, 1000 + period))
        tokens = PROSE[:30] + cycle * (400 // period + 3)
        at = _first_stop(tokens)
        assert at is not None, period
        span = max(RULE.min_tokens, RULE.min_repeats * period)
        assert at == 30 + span - 1, period  # the first token that completes the required tail, not later


def test_a_non_repeating_stream_and_short_repeats_are_left_alone() -> None:
    assert _first_stop(PROSE) is None
    # legitimate short repeats: a markdown rule, a few identical lines, two copies of a long block
    rule_line = [5] * (RULE.min_tokens - 1)
    block = PROSE[100:190]
    assert _first_stop(PROSE[:20] + rule_line + PROSE[20:60]) is None
    assert _first_stop(PROSE[:20] + [9, 8, 7, 6] * 11 + PROSE[20:60]) is None  # 44 tokens < 48
    assert _first_stop(PROSE[:20] + block + block + PROSE[200:260]) is None  # two copies, not three
    assert _first_stop(PROSE[:10] + list(range(2000, 2200)) * 3) is None  # a period beyond max_period


def test_the_stop_cuts_mid_step_and_keeps_every_token_before_it() -> None:
    tokens = PROSE[:37] + [4, 8, 15, 16, 23, 42] * 30
    at = _first_stop(tokens)
    assert at is not None
    for width in (1, 3, 7):
        out = list(stop_runaway(_steps(tokens, width), RULE))
        finish = out[-1]
        assert isinstance(finish, FinishEvent) and finish.reason == REPETITION
        kept = [t for ev in out[:-1] if isinstance(ev, StepEvent) for t in ev.token_ids]
        assert kept == tokens[: at + 1] == finish.token_ids
        assert finish.text == "".join(f"<{t}>" for t in kept)
        assert finish.stats.generated_tokens == at + 1
        assert finish.stats.target_passes == len(out) - 1
        last = out[-2]
        assert isinstance(last, StepEvent) and len(last.from_draft) <= len(last.token_ids) == len(last.pieces)


def test_a_stream_that_never_loops_passes_through_unchanged() -> None:
    events = _steps(PROSE[:300], 4)
    assert list(stop_runaway(events, RULE)) == events
    looping = _steps([3] * 100, 4)
    assert list(stop_runaway(looping, None)) == looping  # --no-repetition-stop


def test_the_rule_refuses_values_that_cannot_work() -> None:
    with pytest.raises(ConfigError, match="min_repeats must be an integer >= 2"):
        RepetitionStop(min_repeats=1)
    with pytest.raises(ConfigError, match="max_period"):
        RepetitionStop(max_period=0)


def test_with_a_real_model_the_stopped_reply_is_a_prefix_of_the_full_one(tmp_path: Path) -> None:
    """A tiny random model with 16 tokens falls into an "8 11" loop under greedy decoding (for 36 tokens: the
    default rule lets it go, a stricter one stops it); stopped with and without speculation, the reply is
    the full run's own prefix."""
    model = sd.load_model(build_model(tmp_path / "m", "llama", seed=1, tokenizer=False, vocab_size=16))
    prompt, gen = [1, 2, 3], GenerationConfig(max_new_tokens=120, ignore_eos=True)
    full = sd.generate(model, prompt, max_new_tokens=120, ignore_eos=True).token_ids
    strict = RepetitionStop(min_tokens=24, max_period=16)
    at = _first_stop(full, strict)
    assert at is not None and at < 100  # the loop this test relies on
    for drafter in (None, sd.PromptLookupDrafter(max_ngram=3, num_draft_tokens=6)):
        events = list(stop_runaway(sd.stream(model, prompt, drafter, SamplingConfig(), gen), strict))
        finish = events[-1]
        assert isinstance(finish, FinishEvent) and finish.reason == REPETITION
        assert finish.token_ids == full[: at + 1]


def _chat_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chat = sub.choices["chat"]
    assert isinstance(chat, argparse.ArgumentParser)
    return chat


@pytest.mark.parametrize(("flag", "dest", "real"), [
    ("--target", "target", DEFAULT_CHAT_MODEL),
    ("--drafter", "drafter", CHAT_DRAFTER),
    ("--max-new-tokens", "max_new_tokens", CHAT_MAX_NEW_TOKENS),
])
def test_chat_help_states_the_defaults_chat_uses(flag: str, dest: str, real: object) -> None:
    chat = _chat_parser()
    assert getattr(chat.parse_args([]), dest) == real
    action = next(a for a in chat._actions if flag in a.option_strings)
    assert action.help is not None and f"(default: {real}" in action.help
    assert f"(default: {real}" in " ".join(chat.format_help().split())


def test_compare_line_reports_both_speeds_and_whether_the_texts_agree() -> None:
    def finish(ids: list[int], tokens_per_s: float) -> FinishEvent:
        stats = GenerationStats(generated_tokens=len(ids), decode_s=len(ids) / tokens_per_s)
        return FinishEvent("stop", ids, "", stats)

    greedy = SamplingConfig()
    line = compare_line(finish([1, 2, 3], 300.0), finish([1, 2, 3], 120.0), greedy)
    assert line == "speculative 300 tok/s, plain 120 tok/s on the same prompt: 2.50x, same text"
    line = compare_line(finish([1, 2, 3], 300.0), finish([1, 5, 3], 120.0), greedy)
    assert line.endswith("the texts differ from generated token 1")
    line = compare_line(finish([1, 2], 300.0), finish([1, 2, 3], 120.0), SamplingConfig(temperature=0.7))
    assert "differ from generated token 2 (sampling without --seed" in line
