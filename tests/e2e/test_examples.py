"""The programs in examples/ run as a user runs them, and print what they promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME ARGS`` in a bare environment that keeps this run's kernel and cost caches."""
    keep = {k: os.environ[k] for k in ("HOME", "TORCH_EXTENSIONS_DIR", "SPECDECODE_CACHE") if k in os.environ}
    p = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                       timeout=timeout, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **keep})
    assert p.returncode == 0, f"examples/{name} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def test_library_bundled_pair_is_exact_and_drafts() -> None:
    out = run("library.py", "--prompt", "def fibonacci(n):", "--max-new-tokens", "32").stdout
    assert out.startswith("def fibonacci(n):") and "identical to plain decoding: True" in out
    tau = float(re.search(r"speculative: .*tau ([\d.]+) tokens/pass", out).group(1))  # type: ignore[union-attr]
    assert tau > 1.5, out  # the bundled draft model is accepted well above one token a pass


@pytest.mark.slow  # a third example process, and the auto drafter's first cost measurement on a new target
def test_library_takes_a_target_of_ones_own(tiny_dirs: dict[str, Path]) -> None:
    """--target with no --draft: auto drafts with no second model, and the output stays plain decoding's."""
    out = run("library.py", "--target", str(tiny_dirs["llama"]), "--max-new-tokens", "16").stdout
    assert "identical to plain decoding: True" in out and "speculative: 16 tokens" in out


def test_streaming_marks_accepted_draft_tokens() -> None:
    out = run("streaming.py", "--max-new-tokens", "48").stdout
    passes, tokens = map(int, re.search(r"(\d+) target passes for (\d+) tokens", out).groups())  # type: ignore[union-attr]
    assert tokens == 48 and passes < tokens, out  # fewer target passes than tokens: drafts were accepted
    assert re.search(r"\[[^\]]+\]", out), out  # and shown in brackets


@pytest.mark.slow  # starts a real `specdecode serve` (3-6 s)
def test_server_client_with_openai() -> None:
    out = run("server_client.py", "--max-tokens", "24").stdout
    one, streamed = re.search(r"one request ---\n(.*)\nusage: .*\n--- the same request, streamed[^\n]*\n(.*)\n\Z",
                              out, re.S).groups()  # type: ignore[union-attr]
    assert one.startswith("def is_palindrome(s):") and len(one) > len("def is_palindrome(s):")
    assert streamed == one  # greedy: the stream writes the same text
    assert re.search(r"usage: 24 tokens; speculative: \{.*'accepted': \d+", out), out
