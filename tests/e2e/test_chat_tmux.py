"""`specdecode chat` as a user meets it (issue 49): the interactive REPL in a real terminal (a detached tmux
pane), the real SmolLM2-135M-Instruct, three turns. Every reply arrives and ends before the 512-token budget
(a loop is ended by the repetition stop, which says so), and the `specdecode:` log lines never contradict
each other: a drafter reported as calibrated or used and then left out must have the reason stated, once.

Skipped where tmux is missing or the model has not been pulled (`specdecode pull smollm2-135m-instruct`);
the test never fetches it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from specdecode.chat_cli import CHAT_MAX_NEW_TOKENS, DEFAULT_CHAT_MODEL
from specdecode.models.catalog import model_file

ROOT = Path(__file__).resolve().parents[2]
TURNS = ("Write a Python function that counts the vowels in a string.",
         "Now add a docstring.",
         "Show an example call and its output.")
PROMPT = ">>> "
TURN_TIMEOUT_S = 300  # a reply on a busy 2-core machine, with the model's load before the first
STATS = re.compile(r"^\[([\d.]+) tok/s \| alpha [\d.]+ \| tau [\d.]+ tokens/pass \| (\d+) tokens, "
                   r"finish: (\w+)(.*)\]$")
POSITIVE = re.compile(r"\b(calibrated for|drafting with|using|used|available)\b")
NEGATIVE = re.compile(r"\b(left out|not available|unavailable|not used|dropped)\b")
# a reason that denies what a positive line of the same drafter said
DENIES = re.compile(r"\b(uncalibrated|not calibrated|no calibration|missing)\b")


def _tmux(socket: str, *args: str) -> str:
    done = subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
    return done.stdout


def _pane(socket: str) -> list[str]:
    """The whole pane history, wrapped lines joined, blank lines dropped."""
    text = _tmux(socket, "capture-pane", "-p", "-J", "-S", "-", "-t", "chat")
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _wait(socket: str, done: Callable[[list[str]], bool], what: str, timeout: float) -> list[str]:
    """Poll the pane until ``done(lines)`` holds; fail with the pane when it does not in time."""
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = _pane(socket)
        if done(lines):
            return lines
        if any(line.startswith("[chat exited") for line in lines):
            break
        time.sleep(1.0)
    raise AssertionError(f"{what} did not come in {timeout:.0f} s; the pane:\n" + "\n".join(lines[-60:]))


@pytest.fixture
def chat_pane(tmp_path: Path) -> Iterator[str]:
    """A detached tmux session running `specdecode chat` (no --prompt) from an empty cost cache, as on a
    fresh machine (the first start measures; its lines must not repeat); yields its private socket name."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    if not model_file(DEFAULT_CHAT_MODEL).is_file():
        pytest.skip(f"{DEFAULT_CHAT_MODEL} is not pulled (`specdecode pull {DEFAULT_CHAT_MODEL}`)")
    socket = f"specdecode-chat-test-{os.getpid()}"  # a private server: never touches a user's sessions
    command = (f"cd {shlex.quote(str(ROOT))} && SPECDECODE_CACHE={shlex.quote(str(tmp_path))} "
               f"{shlex.join([sys.executable, '-m', 'specdecode.cli', 'chat'])}; "
               "echo \"[chat exited $?]\"; sleep 600")
    _tmux(socket, "new-session", "-d", "-s", "chat", "-x", "220", "-y", "50", command)
    try:
        yield socket
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)


def _stats(lines: list[str]) -> list[re.Match[str]]:
    return [m for m in (STATS.match(line) for line in lines) if m]


def contradictions(log_lines: list[str]) -> list[str]:
    """The problems in chat's `specdecode:` lines: a drafter both reported usable (calibrated, used,
    available) and left out (left out, not available) where the leaving out states no reason, states it
    more than once, or denies the positive line; and any line printed twice."""
    problems = [f"printed {log_lines.count(line)} times: {line}" for line in sorted(set(log_lines))
                if log_lines.count(line) > 1]
    said: dict[str, tuple[list[str], list[str]]] = {}
    for line in log_lines:
        body = line.removeprefix("specdecode:").strip()
        # "auto: NAME left out (...)" speaks of NAME; "NAME: ..." speaks of NAME itself
        about = re.match(r"auto: ([\w-]+) ", body)
        name = about.group(1) if about else body.split(":", 1)[0]
        positive, negative = said.setdefault(name, ([], []))
        (negative if NEGATIVE.search(body) else positive if POSITIVE.search(body) else []).append(body)
    for name, (positive, negative) in said.items():
        if not positive or not negative:
            continue
        for line in negative:
            reasons = re.findall(r"\(([^()]+)\)", line)
            if not reasons:
                problems.append(f"{name} reported usable ({positive[0]!r}) and left out without a reason: {line!r}")
            elif DENIES.search(" ".join(reasons)):
                problems.append(f"{name}: {line!r} denies {positive[0]!r}")
        if len(negative) > 1:
            problems.append(f"{name} left out {len(negative)} times: {negative}")
    return problems


def test_contradictions_finds_a_reasonless_or_denying_leave_out() -> None:
    """The checker itself can fail (fast): the shapes of contradiction it exists to catch."""
    calibrated = "specdecode: layerskip: calibrated for this target (x.json): layers 3 of 30 skipped"
    assert contradictions([calibrated, "specdecode: auto: layerskip left out (its calibration says it does not "
                                       "pay on this target)"]) == []
    assert contradictions([calibrated, "specdecode: auto: layerskip is not available here"])
    assert contradictions([calibrated, "specdecode: auto: layerskip left out (uncalibrated for this target)"])
    assert contradictions([calibrated, calibrated])
    assert contradictions(["specdecode: auto: quant left out (it cannot pay on this target)"]) == []


@pytest.mark.slow
def test_chat_repl_in_a_terminal_answers_each_turn_without_contradicting_logs(chat_pane: str) -> None:
    socket = chat_pane
    _wait(socket, lambda lines: bool(lines) and lines[-1] == PROMPT.strip(), "the first prompt", TURN_TIMEOUT_S)
    for turn, message in enumerate(TURNS, start=1):
        _tmux(socket, "send-keys", "-t", "chat", "-l", message)
        _tmux(socket, "send-keys", "-t", "chat", "Enter")
        lines = _wait(socket, lambda lines, n=turn: len(_stats(lines)) == n and lines[-1] == PROMPT.strip(),
                      f"the reply to turn {turn} ({message!r})", TURN_TIMEOUT_S)
    pane = "\n".join(lines)
    stats = _stats(lines)
    assert len(stats) == len(TURNS), pane
    for turn, m in enumerate(stats, start=1):
        tok_s, tokens, finish, why = float(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        assert tok_s > 0 and tokens > 0, f"turn {turn} produced nothing:\n{pane}"
        # a reply that loops is ended by the repetition stop, never by the budget
        assert tokens < CHAT_MAX_NEW_TOKENS and finish in ("stop", "repetition"), f"turn {turn}: {m.group(0)}\n{pane}"
        assert finish != "repetition" or "loop" in why, f"turn {turn} stopped for repetition without saying so"
    # each reply has text between its echoed message and its figures
    for message in TURNS:
        at = next(i for i, line in enumerate(lines) if line == PROMPT + message)
        assert not STATS.match(lines[at + 1]), f"no reply text to {message!r}:\n{pane}"
    assert contradictions([line for line in lines if line.startswith("specdecode:")]) == [], pane
    assert not any("Traceback" in line or line.startswith("[chat exited") for line in lines), pane
