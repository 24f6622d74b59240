"""`generate --chat`: the prompt goes in as one user message in the target's own template, so an instruct
model answers it (plain text it would only continue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from gguf_util import tiny_gguf


def test_chat_flag_renders_the_prompt_with_the_targets_template(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    _, gguf = tiny_gguf(tmp_path)
    m = sd.load_model(gguf)
    rendered = "<|im_start|>user\ndef fib(n):<|im_end|>\n<|im_start|>assistant\n"  # gguf_util's template
    want = sd.generate(m, m.encode(rendered, add_special_tokens=False), max_new_tokens=8, ignore_eos=True)
    raw = sd.generate(m, "def fib(n):", max_new_tokens=8, ignore_eos=True)
    args = ["generate", "--target", str(gguf), "--prompt", "def fib(n):", "--max-new-tokens", "8", "--ignore-eos",
            "--drafter", "ngram", "--json"]
    assert main(args + ["--chat"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["token_ids"] == want.token_ids
    assert got["stats"]["prompt_tokens"] == len(m.encode(rendered, add_special_tokens=False))
    assert main(args) == 0  # without it the text is continued as it stands
    assert json.loads(capsys.readouterr().out)["token_ids"] == raw.token_ids
