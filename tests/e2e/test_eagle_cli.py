"""`--drafter eagle --heads DIR` through generate (subprocess), bench and the server's state; clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.config import ConfigError
from specdecode.cli import main
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from eagle_util import make_eagle
from test_cli_generate import PROMPT, run
from test_medusa_cli import _workload


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


def test_bench_eagle_method(tiny_dirs: dict[str, Path], eagle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(tiny_dirs["llama"]), "--heads", str(eagle), "--methods", "plain,eagle,medusa",
               "--workload", str(_workload(tmp_path)), "--threads", "1", "--reps", "1", "--out", str(out),
               "--no-progress", "--no-plots", "--cost-repeats", "2"])
    assert rc == 0
    names = {m["name"]: m for m in json.loads((out / "bench.json").read_text())["methods"]}
    assert names["eagle"]["status"] == "ok", names["eagle"]["reason"]
    assert names["eagle"]["categories"]["overall"]["exact_match"] == 1.0
    assert names["medusa"]["status"] == "skipped"  # --heads named an EAGLE directory, not Medusa heads


def test_server_state_loads_eagle(tiny_dirs: dict[str, Path], eagle: Path) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    state = make_state(target, None, ServerConfig(), default_drafter="eagle", artifacts={"eagle": str(eagle)})
    assert "eagle" in state.scheduler.drafters
    with pytest.raises(ConfigError, match="needs an EAGLE-3 draft"):
        make_state(target, None, ServerConfig(), default_drafter="eagle")
