"""`make run`'s command with the real SmolLM2-135M-Instruct (issue 49): the answer is right, and one line gives
the speculative and the plain speed of the same request with the texts compared. Skipped where the model has
not been pulled (`specdecode pull smollm2-135m-instruct`); the test never fetches it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdecode.chat_cli import DEFAULT_CHAT_MODEL
from specdecode.models.catalog import model_file

ROOT = Path(__file__).resolve().parents[2]
SPEEDS = re.compile(r"speculative (\d+) tok/s, plain (\d+) tok/s on the same prompt: ([\d.]+)x, (same text|.*differ.*)")
BUDGET_S = 40  # what a user waits for `make run` once the model is pulled and the kernels are built


def _run_command() -> list[str]:
    """The `specdecode chat ...` arguments of the Makefile's `run` target, with its RUN_PROMPT filled in."""
    text = (ROOT / "Makefile").read_text()
    prompt = re.search(r"^RUN_PROMPT \?= (.+)$", text, re.M)
    line = re.search(r"^\t@\$\(VENV\)/bin/specdecode (chat .*?); rc=", text, re.M)
    assert prompt and line, "the Makefile's run target no longer has the shape this test reads"
    return shlex.split(line.group(1).replace("$(RUN_PROMPT)", prompt.group(1)))


def _first_function(answer: str) -> tuple[str, str]:
    """(code, name) of the first fenced Python block that defines a function."""
    for block in re.findall(r"```(?:python)?\n(.*?)```", answer, re.S):
        name = re.search(r"^def (\w+)\(", block, re.M)
        if name:
            return block, name.group(1)
    raise AssertionError(f"no function in the answer:\n{answer}")


@pytest.mark.slow
def test_make_run_answers_correctly_and_prints_both_speeds() -> None:
    if not model_file(DEFAULT_CHAT_MODEL).is_file():
        pytest.skip(f"{DEFAULT_CHAT_MODEL} is not pulled (`specdecode pull {DEFAULT_CHAT_MODEL}`)")
    args = _run_command()
    assert args[0] == "chat" and "--compare-plain" in args
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "specdecode.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    # the answer's function really counts vowels (run apart: it is the model's code)
    code, name = _first_function(done.stdout)
    check = f"{code}\nassert [{name}(s) for s in ('Hello World', 'rhythm', 'banana', '')] == [3, 0, 3, 0]\n"
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, f"the answer's {name} is wrong: {ran.stderr}\n{done.stdout}"
    assert "Output: 3" in done.stdout  # its example call states the right count
    speeds = SPEEDS.search(done.stderr)
    assert speeds, done.stderr[-2000:]
    fast, slow, ratio, same = speeds.groups()
    assert int(fast) > 0 and int(slow) > 0 and float(ratio) > 0
    assert same == "same text"  # greedy decoding: speculation must not change a token
    assert elapsed <= BUDGET_S, f"`make run`'s command took {elapsed:.0f} s (budget {BUDGET_S} s)"
