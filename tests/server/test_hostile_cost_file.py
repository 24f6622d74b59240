"""A cost cache file spoiled with NaN and infinity (issue 49): the server answers /health 200 from its first
call, and the file is measured again and rewritten as strict JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import specdecode.sizing.book as cm
from specdecode.server.config import ServerConfig

from server_helpers import Models, serve


def _strict(text: str) -> Any:
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a JSON answer or file"))


def test_a_nan_cost_file_is_measured_again_and_health_stays_200(models: Models, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(cm, "_MEMO", {})
    config = ServerConfig(max_batch_size=2)
    for running in serve(models, models.draft, config):  # measures the pair's costs and writes the file
        assert running.get("/health").status_code == 200
    files = sorted((tmp_path / "costs").glob("*.json"))
    assert files
    for f in files:  # spoiled as the probe spoiled it: json.dumps writes NaN and Infinity
        d = json.loads(f.read_text())
        f.write_text(json.dumps({**d, "c": float("nan"), "v": [1.0, float("inf"), *d["v"][2:]]}))
    monkeypatch.setattr(cm, "_MEMO", {})
    for running in serve(models, models.draft, config):
        r = running.get("/health")
        assert r.status_code == 200, r.text
        offline = _strict(r.text)["speculation"]["offline"]
        assert offline is not None and all(c == c and c >= 0 for c in offline["c"].values()), offline
    for f in files:
        d = _strict(f.read_text())
        assert d["c"] >= 0 and d["v"][1] < float("inf"), d


def test_health_writes_what_is_not_finite_as_null() -> None:
    from specdecode.server.app import finite

    body = {"c": {"model": float("nan")}, "v": [1.0, float("inf"), -float("inf")], "n": 3, "s": "x"}
    assert finite(body) == {"c": {"model": None}, "v": [1.0, None, None], "n": 3, "s": "x"}
    _strict(json.dumps(finite(body)))
