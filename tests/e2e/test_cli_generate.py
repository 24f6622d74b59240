"""`specdecode generate` end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specdecode as sd

PROMPT = "def fib(n):"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A bare environment (no venv on PATH), keeping where this run's caches are: without HOME the CLI found
    another home's kernel folder and compiled all three kernels there (~60 s in a clean-HOME `.ci/run`)."""
    keep = {k: os.environ[k] for k in ("HOME", "TORCH_EXTENSIONS_DIR", "SPECDECODE_CACHE") if k in os.environ}
    return subprocess.run([sys.executable, "-m", "specdecode.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **keep})


def test_json_output_equals_library(tiny_dirs: dict[str, Path]) -> None:
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["draft"]), "--gamma", "3",
            "--prompt", PROMPT, "--max-new-tokens", "12", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    ref = sd.generate(sd.load_model(tiny_dirs["llama"]), PROMPT, max_new_tokens=12, ignore_eos=True)
    assert out["token_ids"] == ref.token_ids and out["text"] == ref.text
    assert out["stats"]["target_passes"] >= 1 and "alpha" in out["stats"] and "tau" in out["stats"]


@pytest.mark.slow
def test_stdin_prompt_ngram_and_summary(tiny_dirs: dict[str, Path]) -> None:
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--drafter", "ngram", "--max-new-tokens", "8",
            "--ignore-eos", "--stream", stdin=PROMPT)
    assert p.returncode == 0, p.stderr
    assert "[ngram]" in p.stderr and "tok/s" in p.stderr and "tau" in p.stderr


@pytest.mark.slow
def test_cli_errors_are_one_line(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    p = run("generate", "--target", str(tmp_path / "missing"), "--prompt", "x")
    assert p.returncode == 2 and p.stderr.startswith("specdecode: error: model") and "Traceback" not in p.stderr
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--drafter", "none", "--prompt", "x", "--top-p", "0")
    assert p.returncode == 2 and "top_p must be in (0, 1]" in p.stderr
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--prompt", "x", "--max-new-tokens", "4")
    assert p.returncode == 0 and "[auto]" in p.stderr  # a target of one's own drafts with auto, no artifact needed
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--prompt-file", str(tmp_path / "none.txt"))
    assert p.returncode == 2 and "cannot read --prompt-file" in p.stderr


@pytest.mark.slow
def test_chain_rule_flag_reaches_generate(tiny_dirs: dict[str, Path]) -> None:
    """--chain-rule token samples exactly as generate(..., chain_rule="token") with the same seed; a bad
    value is a one-line error naming the choices."""
    args = ["generate", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["draft"]), "--gamma", "3",
            "--prompt", PROMPT, "--max-new-tokens", "12", "--ignore-eos", "--temperature", "1", "--seed", "5"]
    p = run(*args, "--chain-rule", "token", "--accept-rule", "rejection", "--json")
    assert p.returncode == 0, p.stderr
    drafter = sd.DraftModelDrafter(sd.load_model(tiny_dirs["draft"]), 3)
    ref = sd.generate(sd.load_model(tiny_dirs["llama"]), PROMPT, drafter, max_new_tokens=12, ignore_eos=True,
                      temperature=1.0, seed=5, chain_rule="token", accept_rule="rejection")
    assert json.loads(p.stdout)["token_ids"] == ref.token_ids
    p = run(*args, "--chain-rule", "tree")
    assert p.returncode == 2 and "chain_rule must be one of block, token" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_draft_of_another_architecture_with_the_same_tokenizer(tiny_dirs: dict[str, Path]) -> None:
    """A GPT-2 draft for a llama target works when they share the tokenizer; output is the target's."""
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["gpt2_draft"]),
            "--prompt", PROMPT, "--max-new-tokens", "10", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    ref = sd.generate(sd.load_model(tiny_dirs["llama"]), PROMPT, max_new_tokens=10, ignore_eos=True)
    assert json.loads(p.stdout)["token_ids"] == ref.token_ids


def test_help_explains() -> None:
    p = run("generate", "--help")
    assert p.returncode == 0 and "--gamma" in p.stdout and "greedy" in p.stdout
