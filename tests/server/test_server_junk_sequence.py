"""Issue #30 item 1 through the server: the outside probe's sequence (three junk requests whose one
draft token is rejected, then a real greedy request) drafts and accepts as on a fresh server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import specdecode
from specdecode.server.config import ServerConfig
from server_helpers import MODEL_NAME, Models, serve

MODELS = Path(__file__).resolve().parents[2] / "models"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (MODELS / "code-draft" / "config.json").is_file(), reason="bundled models absent")]


def _spec(url: str, body: dict[str, object]) -> dict[str, int]:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["speculative"]


@pytest.fixture(scope="module")
def bundled() -> Models:
    return Models(specdecode.load_model(MODELS / "code-target"), specdecode.load_model(MODELS / "code-draft"),
                  MODELS / "code-target")


def _run(models: Models, junk: int) -> dict[str, int]:
    config = ServerConfig(max_batch_size=4, max_queue=8, request_timeout=120, speculation="auto")  # the policy's
    for running in serve(models, models.draft, config):
        for _ in range(junk):
            _spec(running.url, {"prompt": "x", "max_tokens": 2})
        real = {"prompt": "def fib(n):", "max_tokens": 64, "temperature": 0}
        runs = [_spec(running.url, real) for _ in range(3)]
        assert all(r["drafted"] > 0 for r in runs), runs  # every real request speculates
        return {k: sum(r[k] for r in runs) for k in ("target_passes", "drafted", "accepted")}
    raise AssertionError("server did not start")


def _best(models: Models, junk: int) -> dict[str, int]:
    """The better of two servers' runs: γ follows live pass timings, so one server in ten or so runs slow by
    load alone, fresh or after junk alike (10 pairs in one process on a 2-core EPYC: 104-131 accepted in 61-88
    passes fresh, 111-132 in 60-81 after junk; CI once saw 12% fewer accepted, 24% more passes). What junk
    would do if it switched speculation off is systematic: both of its runs would take ~190 passes."""
    return max((_run(models, junk) for _ in range(2)), key=lambda r: r["accepted"])


def test_junk_requests_do_not_switch_speculation_off(bundled: Models) -> None:
    fresh = _best(bundled, junk=0)
    after = _best(bundled, junk=3)
    assert fresh["accepted"] > 0
    # within 10% of a fresh server (issue 49; 131-132 against 132-133 accepted on a loaded 2-core EPYC).
    # Switched off, the 3 × 64 tokens would take ~190 passes against ~65. The bounded effect of junk on a row's
    # prior is pinned exactly in tests/unit/test_policy_poisoning.py.
    assert after["accepted"] >= 0.9 * fresh["accepted"], (fresh, after)
    assert after["target_passes"] <= 1.4 * fresh["target_passes"], (fresh, after)
