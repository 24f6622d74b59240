"""`--drafter medusa --heads DIR` through generate (subprocess), bench and the serve flags; clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.cli import build_parser, main
from specdecode.config import ConfigError
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from medusa_util import make_heads
from test_cli_generate import PROMPT, run


def _workload(tmp_path: Path) -> Path:
    f = tmp_path / "tiny.jsonl"
    rows = [("c1", "completion", "def add(a, b):\n    return", 16), ("l1", "long", "class Point:\n", 24)]
    f.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p, "max_new_tokens": n}) + "\n"
                         for i, c, p, n in rows))
    return f


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


def test_bench_medusa_methods(tiny_dirs: dict[str, Path], heads: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(tiny_dirs["llama"]), "--heads", str(heads), "--methods",
               "plain,medusa,medusa-chain", "--workload", str(_workload(tmp_path)), "--threads", "1", "--reps", "1",
               "--out", str(out), "--no-progress", "--no-plots", "--cost-repeats", "2"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    names = {m["name"]: m for m in data["methods"]}
    for name in ("medusa", "medusa-chain"):
        assert names[name]["status"] == "ok", names[name]["reason"]
        assert names[name]["categories"]["overall"]["exact_match"] == 1.0


def test_bench_skips_medusa_without_heads(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["bench", "--target", str(tiny_dirs["llama"]), "--methods", "plain,medusa", "--workload",
                 str(_workload(tmp_path)), "--threads", "1", "--reps", "1", "--out", str(out), "--no-progress",
                 "--no-plots", "--cost-repeats", "2"]) == 0
    names = {m["name"]: m for m in json.loads((out / "bench.json").read_text())["methods"]}
    assert names["medusa"]["status"] == "skipped" and "--heads" in names["medusa"]["reason"]


def test_serve_flags_and_state(tiny_dirs: dict[str, Path], heads: Path) -> None:
    args = build_parser().parse_args(["serve", "--drafter", "medusa", "--heads", str(heads)])
    assert args.drafter == "medusa" and args.heads == str(heads)
    target = sd.load_model(tiny_dirs["llama"])
    state = make_state(target, None, ServerConfig(), default_drafter="medusa", artifacts={"medusa": str(heads)})
    assert {"medusa", "medusa-chain"} <= set(state.scheduler.drafters)
    with pytest.raises(ConfigError, match="needs Medusa heads"):
        make_state(target, None, ServerConfig(), default_drafter="medusa")
    assert "medusa" not in make_state(target, None, ServerConfig(), default_drafter="ngram").scheduler.drafters
