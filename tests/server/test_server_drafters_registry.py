"""`serve` with default flags offers every registered drafter (the bundled artifacts each from its own
default, exactly as `generate` finds them), and each one's greedy output equals plain decoding's;
artifact flags never unload each other."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from specdecode.bundled import default_model_dir
from specdecode.cli import build_parser
from specdecode.config import ConfigError
from specdecode.drafters.eagle_model import ARCHITECTURE
from specdecode.drafters.registry import REGISTRY, all_artifacts, artifacts_from_args

from server_helpers import RunningServer, start_server

BUNDLED = {a.name: str(default_model_dir(a.bundled)) for a in all_artifacts().values() if a.bundled}
needs_bundled = pytest.mark.skipif(not BUNDLED or not all(Path(p).is_dir() for p in BUNDLED.values()),
                                   reason="the bundled drafter artifacts are not in models/")


def _args(*flags: str, command: str = "serve") -> argparse.Namespace:
    return build_parser().parse_args([command, *flags])


@needs_bundled
def test_default_flags_resolve_every_bundled_artifact() -> None:
    assert artifacts_from_args(_args()) == BUNDLED


@needs_bundled
def test_serve_loads_every_bundled_drafter_generate_loads() -> None:
    """Issue #28 item 8: serve and generate resolve artifacts by one function, so with default flags
    serve offers every drafter generate can build (the exit adapter was once missing)."""
    generate = artifacts_from_args(_args("--prompt", "x", command="generate"))
    assert artifacts_from_args(_args()) == generate == BUNDLED
    assert {"exit-adapter", "medusa", "eagle"} <= set(generate)


@needs_bundled
@pytest.mark.parametrize("kind", sorted(BUNDLED))
def test_shared_heads_flag_fills_its_own_kind_and_keeps_the_others(kind: str) -> None:
    assert artifacts_from_args(_args("--heads", BUNDLED[kind])) == BUNDLED


@needs_bundled
def test_own_flags_win_and_a_wrong_kind_is_named(tmp_path: Path) -> None:
    flags = [x for a in all_artifacts().values() if a.name in BUNDLED for x in (a.flag, BUNDLED[a.name])]
    assert artifacts_from_args(_args(*flags)) == BUNDLED
    with pytest.raises(ConfigError, match="--exit-adapter .*not an exit adapter directory"):
        artifacts_from_args(_args("--exit-adapter", BUNDLED["eagle"]))
    with pytest.raises(ConfigError, match="--eagle-draft .*not an EAGLE-3 draft directory"):
        artifacts_from_args(_args("--eagle-draft", str(tmp_path)))


def test_another_target_gets_no_bundled_artifacts(tmp_path: Path) -> None:
    assert artifacts_from_args(_args("--target", str(tmp_path))) == {}


def test_artifacts_found_beside_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TARGET/drafters/<artifact>/ for a target folder, a GGUF file's folder, and a catalogued name's
    models/<name>/ (where trained drafters for a pulled model live)."""
    from specdecode.models.catalog import CATALOG

    def kit(folder: Path) -> dict[str, str]:
        out = {}
        for a in all_artifacts().values():
            d = folder / "drafters" / a.name
            d.mkdir(parents=True)
            marker = {"medusa": "medusa_config.json", "exit-adapter": "exit_adapter.json"}.get(a.name)
            if marker:
                (d / marker).write_text("{}")
            else:  # an EAGLE-3 config
                (d / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE]}))
            if a.accepts(d):
                out[a.name] = str(d)
        return out

    found = kit(tmp_path / "t")
    assert found and artifacts_from_args(_args("--target", str(tmp_path / "t"))) == found
    (tmp_path / "t" / "model.gguf").write_bytes(b"GGUF")
    assert artifacts_from_args(_args("--target", str(tmp_path / "t" / "model.gguf"))) == found
    name = next(iter(CATALOG))
    monkeypatch.setenv("SPECDECODE_MODELS_DIR", str(tmp_path / "repo-models"))
    beside_name = kit(tmp_path / "repo-models" / name)
    assert beside_name and artifacts_from_args(_args("--target", name)) == beside_name


@pytest.fixture(scope="module")
def bundled_server() -> Iterator[RunningServer]:
    from specdecode.server.startup import build_state

    if not (default_model_dir("code-target") / "config.json").is_file():
        pytest.skip("the bundled target is not in models/")
    running = start_server(build_state(_args()))
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
@needs_bundled
def test_every_registered_drafter_serves_with_default_flags_and_equals_plain(bundled_server: RunningServer) -> None:
    health = bundled_server.get("/health").json()
    assert set(health["drafters"]) == set(REGISTRY) - {"none"}, health["drafters"]
    prompts = ["def fib(n):", "import os\n\ndef main():\n    "]

    def complete(client: httpx.Client, prompt: str, drafter: str) -> str:
        r = client.post(bundled_server.url + "/v1/completions", json={
            "model": health["model"], "prompt": prompt, "max_tokens": 12, "temperature": 0, "drafter": drafter})
        assert r.status_code == 200, (drafter, r.text)
        return str(r.json()["choices"][0]["text"])

    # a drafter's first request prepares it (its costs are measured once per machine): minutes on a cold cache
    with httpx.Client(timeout=900) as client:
        plain = [complete(client, p, "none") for p in prompts]
        for name in REGISTRY:
            assert [complete(client, p, name) for p in prompts] == plain, name
        # as with `serve --drafter layerskip-adapter`: a request without a drafter field gets the default
        bundled_server.state.default_drafter = "layerskip-adapter"
        r = client.post(bundled_server.url + "/v1/completions", json={
            "model": health["model"], "prompt": prompts[0], "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain[0], r.text
        assert r.json()["usage"]["speculative"]["drafted_by"].keys() <= {"layerskip-adapter"}, r.json()["usage"]


def test_serve_with_a_target_and_no_draft_defaults_to_auto_as_generate_does(tiny_dirs: dict[str, Path]) -> None:
    """`serve --target X` once stopped with "--target given without --draft" where `generate --target X`
    ran auto; both now take the same default."""
    from specdecode.cli import default_drafter_name
    from specdecode.server.startup import build_state

    args = _args("--target", str(tiny_dirs["llama"]))
    state = build_state(args)
    assert state.default_drafter == default_drafter_name(args) == "auto"
    assert state.default_drafter == default_drafter_name(_args("--target", str(tiny_dirs["llama"]), "--prompt", "x",
                                                               command="generate"))


def test_python_dash_m_prints_a_cli_error_without_a_traceback(tmp_path: Path) -> None:
    """The bench starts servers with `python -m specdecode.cli`; an error raised in a subcommand's module is one
    clean line and rc 2 there too (it escaped as a traceback: that file ran as a second copy, __main__)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, SPECDECODE_MODELS_DIR=str(tmp_path))  # no bundled models: `serve` raises CLIError
    out = subprocess.run([sys.executable, "-m", "specdecode.cli", "serve"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "specdecode: error: no --target given and the bundled default model is missing" in out.stderr
