"""`serve` with default flags offers every registered drafter (the bundled artifacts each from its own
default), and each one's greedy output equals plain decoding's; artifact flags never unload each other."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from specdecode.cli import DEFAULT_EAGLE, DEFAULT_EXIT_ADAPTER, DEFAULT_HEADS, build_parser, default_model_dir
from specdecode.config import ConfigError
from specdecode.drafters.registry import REGISTRY
from specdecode.server.cli import resolve_artifacts

from server_helpers import RunningServer, start_server

BUNDLED = {k: str(default_model_dir(d)) for k, d in
           (("heads", DEFAULT_HEADS), ("eagle", DEFAULT_EAGLE), ("exit_adapter", DEFAULT_EXIT_ADAPTER))}
needs_bundled = pytest.mark.skipif(not all(Path(p).is_dir() for p in BUNDLED.values()),
                                   reason="the bundled drafter artifacts are not in models/")


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


@needs_bundled
def test_default_flags_resolve_every_bundled_artifact() -> None:
    a = resolve_artifacts(_args())
    assert (a.heads, a.eagle, a.exit_adapter) == (BUNDLED["heads"], BUNDLED["eagle"], BUNDLED["exit_adapter"])


@needs_bundled
@pytest.mark.parametrize("kind", ["heads", "eagle", "exit_adapter"])
def test_shared_heads_flag_fills_its_own_kind_and_keeps_the_others(kind: str) -> None:
    a = resolve_artifacts(_args("--heads", BUNDLED[kind]))
    assert (a.heads, a.eagle, a.exit_adapter) == (BUNDLED["heads"], BUNDLED["eagle"], BUNDLED["exit_adapter"])


@needs_bundled
def test_own_flags_win_and_a_wrong_kind_is_named(tmp_path: Path) -> None:
    a = resolve_artifacts(_args("--exit-adapter", BUNDLED["exit_adapter"], "--eagle-draft", BUNDLED["eagle"],
                                "--medusa-heads", BUNDLED["heads"]))
    assert a.exit_adapter == BUNDLED["exit_adapter"] and a.eagle == BUNDLED["eagle"] and a.heads == BUNDLED["heads"]
    with pytest.raises(ConfigError, match="--exit-adapter .*not an exit adapter directory"):
        resolve_artifacts(_args("--exit-adapter", BUNDLED["eagle"]))
    with pytest.raises(ConfigError, match="--eagle-draft .*not an EAGLE-3 draft directory"):
        resolve_artifacts(_args("--eagle-draft", str(tmp_path)))


def test_another_target_gets_no_bundled_artifacts(tmp_path: Path) -> None:
    a = resolve_artifacts(_args("--target", str(tmp_path)))
    assert (a.heads, a.eagle, a.exit_adapter) == (None, None, None)


@pytest.fixture(scope="module")
def bundled_server() -> Iterator[RunningServer]:
    from specdecode.server.cli import build_state

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
