"""`--drafter eagle --heads DIR` through generate (subprocess) and its errors naming the fix (bench, serve and
the registry-wide checks: tests/conformance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.cli import main

from eagle_util import make_eagle
from test_cli_generate import PROMPT, run


@pytest.fixture(scope="module")
def eagle(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_eagle(tmp_path_factory.mktemp("eagle") / "eagle", sd.load_model(tiny_dirs["llama"]), draft_vocab=200)


def test_generate_with_eagle_equals_plain(tiny_dirs: dict[str, Path], eagle: Path) -> None:
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--drafter", "eagle", "--heads", str(eagle),
            "--prompt", PROMPT, "--max-new-tokens", "24", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    ref = sd.generate(sd.load_model(tiny_dirs["llama"]), PROMPT, max_new_tokens=24, ignore_eos=True)
    assert json.loads(p.stdout)["token_ids"] == ref.token_ids


def test_generate_errors_name_the_fix(tiny_dirs: dict[str, Path], eagle: Path, capsys) -> None:
    def error(*args: str) -> str:
        assert main(["generate", "--prompt", "x", "--max-new-tokens", "2", *args]) == 2
        return capsys.readouterr().err

    target = ["--target", str(tiny_dirs["llama"]), "--drafter", "eagle"]
    assert "needs an EAGLE-3 draft directory (--heads DIR)" in error(*target)
    msg = error("--target", str(tiny_dirs["gpt2_draft"]), "--drafter", "eagle", "--heads", str(eagle))
    assert msg.startswith("specdecode: error:") and "hidden states of size" in msg and msg.count("\n") == 1


