"""Soak and fault test on a real `specdecode serve`: ~30 s of mixed clients, disconnects, client
timeouts and 429 storms. No 5xx, no lost request (metrics agree with what clients saw), bounded RSS,
rows back to zero, greedy outputs identical to lone requests. `scripts/soak.py --duration N` is the
long variant."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from server_helpers import MODEL_NAME, Models
from serve_process import ServeProcess
from soak_driver import check_against_metrics, soak

pytestmark = pytest.mark.slow

DURATION_S = float(os.environ.get("SPECDECODE_SOAK_S", "30"))
SERVE_ARGS = ["--drafter", "ngram", "--gamma", "4", "--max-batch-size", "8", "--max-queue", "8",
              "--request-timeout", "60"]


def test_soak(models: Models) -> None:
    srv = ServeProcess(models.target_dir, SERVE_ARGS)
    try:
        rss: list[tuple[float, int]] = []
        start = time.monotonic()
        before = httpx.get(srv.url + "/metrics").text
        tally = asyncio.run(soak(srv.url, MODEL_NAME, DURATION_S, seed=1,
                                 on_tick=lambda left: rss.append((time.monotonic() - start, srv.rss_kb()))))
        deadline = time.monotonic() + 15
        while True:  # rows and queue back to zero once the clients are gone
            h = httpx.get(srv.url + "/health").json()
            if h["active_rows"] == 0 and h["queue_depth"] == 0:
                break
            assert time.monotonic() < deadline, h
            time.sleep(0.1)
        time.sleep(0.5)  # the engine thread records the last cancellations on its next pass
        after = httpx.get(srv.url + "/metrics").text
        final_rss = srv.rss_kb()
    finally:
        srv.kill()
    log = srv.log()
    assert not tally.problems, tally.problems[:20]
    assert not check_against_metrics(tally, before, after), (check_against_metrics(tally, before, after), tally)
    assert all(code < 500 for code in tally.statuses), tally.statuses
    # it really exercised every path
    assert tally.completed > 20 and tally.refused > 0 and tally.client_gave_up > 0 and tally.invalid > 0, tally
    assert tally.greedy_checked > 10, tally
    # RSS after the first third (allocator and caches warm) grows by at most 5 %
    warm = [kb for t, kb in rss if t >= DURATION_S / 3]
    assert warm, rss
    assert final_rss <= warm[0] * 1.05, (warm[0], final_rss, rss)
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
