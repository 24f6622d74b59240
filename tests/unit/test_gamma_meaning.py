"""γ means one thing (issue 48): ``--gamma N`` drafts N tokens every pass in ``generate`` and in ``serve``,
``--gamma auto`` lets the cost policy pick 0..cap with the same cap in both, all by ``gamma.resolve_gamma``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest

from specdecode import core as core_module
from specdecode import cli as cli_module
from specdecode import engine
from specdecode.rows import StepEvent
from specdecode.cli import build_parser, main
from specdecode.config import ConfigError
from specdecode.sizing.gamma import DEFAULT_CAP, Gamma, Speculation, parse_gamma, resolve_gamma, speculation_flag
from specdecode.server.startup import build_state
from specdecode.server.config import ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_helpers import start_server  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "models"
PROMPT = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib2(n):"
TOKENS = 40
bundled = pytest.mark.skipif(not (MODELS / "code-draft" / "config.json").is_file(), reason="bundled models absent")


# -- the rule --------------------------------------------------------------------------------------
@pytest.mark.parametrize("requested,own,adaptive,expected", [
    (4, "auto", None, Speculation(4, False)),  # a number: that many every pass
    (4, 10, None, Speculation(4, False)),  # whatever the drafter's own cap
    ("auto", "auto", None, Speculation(DEFAULT_CAP, True)),  # auto: the policy, up to the shared cap
    ("auto", 10, None, Speculation(10, True)),  # ... or up to the drafter's own cap (prompt lookup's 10)
    (None, "auto", None, Speculation(DEFAULT_CAP, True)),  # none asked: the drafter's own γ
    (None, 7, None, Speculation(7, False)),
    ("auto", "auto", False, Speculation(DEFAULT_CAP, False)),  # --speculation always
    (4, "auto", True, Speculation(4, True)),  # --speculation auto with --gamma 4
])
def test_resolve_gamma(requested: Optional[Gamma], own: Gamma, adaptive: Optional[bool],
                       expected: Speculation) -> None:
    assert resolve_gamma(requested, own, adaptive) == expected


def test_a_bad_gamma_or_speculation_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-2", "four", "1.5"):
        with pytest.raises(ConfigError, match="positive integer or 'auto'"):
            parse_gamma(bad)
    with pytest.raises(ConfigError, match="positive integer or 'auto'"):
        resolve_gamma(0, "auto")
    with pytest.raises(ConfigError, match="speculation must be one of auto, always"):
        ServerConfig(speculation="sometimes")
    assert [speculation_flag(s) for s in (None, "auto", "always")] == [None, True, False]
    for command in ("generate", "serve"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--gamma", "0"])
        assert "gamma must be a positive integer or 'auto', got '0'" in capsys.readouterr().err


def test_both_commands_default_to_auto_and_say_what_gamma_means() -> None:
    parser = build_parser()
    for command in ("generate", "serve"):
        assert parser.parse_args([command]).gamma == "auto"
    assert parser.parse_args(["serve"]).speculation is None  # unset: follows --gamma
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c: next(a.help for a in sub.choices[c]._actions if "--gamma" in a.option_strings)
             for c in ("generate", "serve")}
    assert helps["generate"] == helps["serve"] and "every target pass" in str(helps["generate"])
    assert f"0 to {DEFAULT_CAP}" in str(helps["generate"])


# -- generate and serve, end to end ------------------------------------------------------------------
def _flags(drafter: str, gamma: str) -> list[str]:
    return ["--target", str(MODELS / "code-target"), "--draft", str(MODELS / "code-draft"), "--drafter", drafter,
            "--gamma", gamma]


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Speculation]]:
    """Every row the decode core admits, as (cap, adaptive): generate's and the server's go through one core."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    seen: list[Speculation] = []
    add = core_module.DecodeCore.add

    def recording(self: core_module.DecodeCore, request: Any, owner: Any = None, chunked: bool = False) -> Any:
        row = add(self, request, owner, chunked)
        seen.append(row.speculation)
        return row

    monkeypatch.setattr(core_module.DecodeCore, "add", recording)
    yield seen


def _generate(monkeypatch: pytest.MonkeyPatch, flags: list[str], capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """``specdecode generate FLAGS`` greedy, run in-process: each pass's (token ids, drafted, from_draft)."""
    passes: list[Any] = []
    inner = engine.stream

    def recording(*args: Any, **kw: Any) -> Iterator[Any]:
        for ev in inner(*args, **kw):
            if isinstance(ev, StepEvent):
                passes.append((ev.token_ids, ev.drafted, ev.from_draft))
            yield ev

    with monkeypatch.context() as m:
        m.setattr(cli_module, "stream", recording)
        assert main(["generate", *flags, "--prompt", PROMPT, "--max-new-tokens", str(TOKENS), "--ignore-eos",
                     "--temperature", "0", "--json"]) == 0
    json.loads(capsys.readouterr().out)
    return passes


def _serve(flags: list[str]) -> list[Any]:
    """``specdecode serve FLAGS`` and one streamed greedy completion: each pass's (token ids, drafted, from_draft)."""
    state = build_state(build_parser().parse_args(["serve", *flags]))
    running = start_server(state)
    try:
        body = {"model": state.model_name, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True}
        passes = []
        with httpx.stream("POST", running.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for text in r.iter_lines():
                if not text.startswith("data: {"):
                    continue
                c = json.loads(text[len("data: "):]).get("specdecode") or {}  # a pass's card fields
                if c.get("token_ids"):
                    passes.append((c["token_ids"], c["drafted"], c["from_draft"][:len(c["token_ids"])]))
        return passes
    finally:
        running.stop()


@bundled  # the tiny bundled pair: ~1 s a case
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_generate_and_serve_gamma_n_draft_the_same_tokens(drafter: str, rows: list[Speculation],
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The same greedy request, pass by pass: as many drafted, the same accepted, the same tokens."""
    flags = _flags(drafter, "4")
    generated = _generate(monkeypatch, flags, capsys)
    served = _serve(flags)
    assert rows == [Speculation(4, False), Speculation(4, False)]  # 4 every pass in both
    assert served == generated
    assert max(n for _, n, _ in generated) == 4  # at most 4 (lookup: fewer where its match ends)
    assert sum(n for _, n, _ in generated) >= 20 and any(any(f) for _, _, f in generated)  # it drafted, some kept


@bundled
@pytest.mark.parametrize("drafter,cap", [("model", DEFAULT_CAP), ("ngram", 10)])
def test_auto_caps_at_the_same_number_in_generate_and_serve(drafter: str, cap: int, rows: list[Speculation],
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    flags = _flags(drafter, "auto")
    _generate(monkeypatch, flags, capsys)
    _serve(flags)
    assert rows == [Speculation(cap, True), Speculation(cap, True)]


@bundled
@pytest.mark.parametrize("gamma,expected", [("3", Speculation(3, False)), ("auto", Speculation(DEFAULT_CAP, True))])
def test_chat_reads_gamma_as_generate_does(gamma: str, expected: Speculation, rows: list[Speculation],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``chat --gamma N`` drafts N every pass, as ``generate --gamma N`` does, with its default drafter (auto) too."""
    assert main(["chat", *_flags("auto", gamma), "--prompt", "def add(a, b):", "--max-new-tokens", "8",
                 "--temperature", "0", "--no-color"]) == 0
    capsys.readouterr()
    assert rows == [expected]
