"""`--drafter medusa --heads DIR` through generate (subprocess) and its errors naming the fix (bench, serve and
the registry-wide checks: tests/conformance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.cli import main

from medusa_util import make_heads
from test_cli_generate import PROMPT, run


@pytest.fixture(scope="module")
def heads(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = sd.load_model(tiny_dirs["llama"])
    return make_heads(tmp_path_factory.mktemp("medusa") / "heads", target.config.dim, target.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["medusa", "medusa-chain"])
def test_generate_with_heads_equals_plain(drafter: str, tiny_dirs: dict[str, Path], heads: Path) -> None:
    p = run("generate", "--target", str(tiny_dirs["llama"]), "--drafter", drafter, "--heads", str(heads),
            "--prompt", PROMPT, "--max-new-tokens", "24", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    ref = sd.generate(sd.load_model(tiny_dirs["llama"]), PROMPT, max_new_tokens=24, ignore_eos=True)
    out = json.loads(p.stdout)
    assert out["token_ids"] == ref.token_ids


def test_generate_errors_name_the_fix(tiny_dirs: dict[str, Path], heads: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    def error(*args: str) -> str:
        assert main(["generate", "--prompt", "x", "--max-new-tokens", "2", *args]) == 2
        return capsys.readouterr().err

    target = ["--target", str(tiny_dirs["llama"]), "--drafter", "medusa"]
    assert "needs Medusa heads (--heads DIR)" in error(*target)
    msg = error(*target, "--heads", str(tmp_path / "nowhere"))
    assert "does not exist" in msg and "distill --method medusa" in msg
    # hidden size 32, heads trained for 64
    msg = error("--target", str(tiny_dirs["gpt2_draft"]), "--drafter", "medusa", "--heads", str(heads))
    assert msg.startswith("specdecode: error:") and "hidden size" in msg and msg.count("\n") == 1


