"""A drafter registered in this file alone is accepted by the CLI (generate's flags and output), the server
(its drafter and artifact, streaming) and the bench (its declared method), with no other change: the file
list of adding a drafter is its module (here: this file) plus its line in the conformance table.

The toy repeats the sequence's last token ``toy_copies`` times (an option, ``--toy-copies``) and reads
its draft length cap from a trained artifact, ``toy`` (``--toy-dir DIR``, or ``TARGET/drafters/toy/``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

import specdecode as sd
from specdecode.config import ConfigError
from specdecode.draft import Draft, DraftContext
from specdecode.drafters import Artifact, BenchVariant, DrafterOptions, DrafterSpec, Option, PerRowDrafters
from specdecode.drafters.plugin import has_file
from specdecode.drafters.registry import REGISTRY, register
from specdecode.server.config import ServerConfig
from specdecode.server.state import make_state

from server_helpers import start_server

NAME = "toy-repeat"


class RepeatLast:
    """One row: propose the last token again, ``copies`` times (capped by the artifact's ``max``)."""

    def __init__(self, copies: int) -> None:
        self.copies = copies

    def prepare(self, target: sd.Model) -> None: ...

    def reset(self) -> None: ...

    def on_verified(self, n_accepted: int) -> None: ...

    def propose(self, ctx: DraftContext) -> Draft:
        return Draft([ctx.tokens[-1]] * min(self.copies, ctx.max_tokens))


def _build(o: DrafterOptions) -> PerRowDrafters:
    path = o.artifact("toy")
    assert path is not None
    cap = int(json.loads((Path(path) / "toy.json").read_text())["max"])
    copies = min(int(o.options["toy_copies"]), cap)  # type: ignore[call-overload]
    return PerRowDrafters(lambda: RepeatLast(copies), copies)


TOY = DrafterSpec(
    NAME, "repeat the last token (a test's toy)", _build,
    options=(Option("toy_copies", int, 2, "toy-repeat: how many copies of the last token to propose"),),
    artifacts=(Artifact("toy", "a toy directory", "a toy directory", "echo '{\"max\": 3}' > DIR/toy.json",
                        has_file("toy.json"), "--toy-dir"),),
    bench=(BenchVariant("toy", "the toy, γ from --gammas", sweep="gammas"),))


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[Path]:
    register(TOY)
    d = tmp_path / "toy"
    d.mkdir()
    (d / "toy.json").write_text(json.dumps({"max": 3}))
    try:
        yield d
    finally:
        del REGISTRY[NAME]


def test_cli_generate_takes_the_toy_its_option_and_artifact(toy: Path, tiny_dirs: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    rest = ["--prompt", "def f", "--max-new-tokens", "12", "--ignore-eos", "--json"]
    base = ["generate", "--target", str(tiny_dirs["llama"]), *rest]
    assert main([*base, "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, "--drafter", NAME, "--toy-dir", str(toy), "--toy-copies", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"] and out["stats"]["drafted"] > 0
    # beside the target, found with no flag; and its own error when absent
    beside = tmp_target(tiny_dirs["llama"], toy.parent / "t")
    assert main(["generate", "--target", str(beside), *rest, "--drafter", NAME]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == plain["token_ids"]
    assert main([*base, "--drafter", NAME]) == 2
    assert "drafter 'toy-repeat' needs a toy directory" in capsys.readouterr().err


def tmp_target(src: Path, dst: Path) -> Path:
    """A copy of the target folder with the toy artifact in ``drafters/toy/``."""
    import shutil

    shutil.copytree(src, dst)
    (dst / "drafters" / "toy").mkdir(parents=True)
    (dst / "drafters" / "toy" / "toy.json").write_text(json.dumps({"max": 3}))
    return dst


def test_server_offers_the_toy(toy: Path, tiny_dirs: dict[str, Path]) -> None:
    import httpx

    from specdecode.cli import build_parser
    from specdecode.drafters.registry import artifacts_from_args, options_from_args

    args = build_parser().parse_args(["serve", "--target", str(tiny_dirs["llama"]), "--toy-dir", str(toy),
                                      "--toy-copies", "3"])
    target = sd.load_model(tiny_dirs["llama"])
    state = make_state(target, None, ServerConfig(max_batch_size=2, request_timeout=60), default_drafter=NAME,
                       options=options_from_args(args), artifacts=artifacts_from_args(args))
    assert NAME in state.scheduler.drafters
    running = start_server(state)
    try:
        texts = []
        for drafter in ("none", NAME):
            body = {"model": state.model_name, "prompt": "def f", "max_tokens": 12, "temperature": 0,
                    "drafter": drafter}
            r = httpx.post(running.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
        assert texts[0] == texts[1]
    finally:
        running.stop()
    with pytest.raises(ConfigError, match="default drafter 'toy-repeat' needs a toy directory"):
        make_state(target, None, ServerConfig(), default_drafter=NAME)


def test_bench_runs_the_toys_method(toy: Path, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from specdecode.cli import main

    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "e1", "category": "c", "prompt": "def f", "max_new_tokens": 12}) + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--target", str(tiny_dirs["llama"]), "--methods", "plain,toy", "--gammas", "2",
                 "--toy-dir", str(toy), "--workload", str(workload), "--threads", "1", "--reps", "1", "--out",
                 str(out), "--no-progress", "--no-plots", "--cost-repeats", "2"]) == 0
    names = {m["name"]: m for m in json.loads((out / "bench.json").read_text())["methods"]}
    assert names["toy/g2"]["status"] == "ok", names["toy/g2"]
    assert names["toy/g2"]["categories"]["overall"]["exact_match"] == 1.0
