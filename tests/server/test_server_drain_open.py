"""During the drain after SIGTERM the listener stays open: every request sent then, on a new connection or
on a keep-alive one, gets a 503 with Retry-After (none is refused at the connection), /health says
"draining", and the running streams end as before (a finish reason or an error event, then [DONE])."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from server_helpers import MODEL_NAME, Models
from serve_process import ServeProcess

pytestmark = pytest.mark.slow

LONG = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 4000, "ignore_eos": True, "temperature": 0,
        "stream": True}
NEW = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2}


def _stream(url: str, lines: list[str], errors: list[BaseException]) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", json=LONG, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
    except BaseException as e:  # noqa: BLE001 - a cut stream is asserted on
        errors.append(e)


def _classify(r: httpx.Response) -> tuple[int, str, Any]:
    return r.status_code, r.headers.get("retry-after", ""), r.json()


def test_requests_during_the_drain_get_503_not_a_refused_connection(models: Models) -> None:
    srv = ServeProcess(models.target_dir, ["--drafter", "ngram", "--max-batch-size", "4", "--drain-timeout", "3"])
    keep_alive = httpx.Client(timeout=30)
    try:
        assert keep_alive.post(srv.url + "/v1/completions", json=NEW).status_code == 200  # the connection is open
        streams = [([], []) for _ in range(2)]  # type: list[tuple[list[str], list[BaseException]]]
        threads = [threading.Thread(target=_stream, args=(srv.url, lines, errs), daemon=True)
                   for lines, errs in streams]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not all(lines for lines, _ in streams):
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
        srv.terminate()
        time.sleep(0.3)  # the signal is handled within uvicorn's 0.1 s tick
        outcomes: list[tuple[int, str, Any]] = []
        failures: list[BaseException] = []
        # well inside the 3 s drain, and only while the streams still run (the server exits once they end: here
        # they ran to the 3 s deadline, ~3,200 of their 4,000 tokens; a machine 2.5x faster ends them sooner)
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end and all(t.is_alive() for t in threads):
            try:
                outcomes.append(_classify(httpx.post(srv.url + "/v1/completions", json=NEW, timeout=30)))  # new conn
                outcomes.append(_classify(keep_alive.post(srv.url + "/v1/completions", json=NEW)))
                health = httpx.get(srv.url + "/health", timeout=30)
                assert health.status_code == 503 and health.json()["status"] == "draining", health.text
            except httpx.TransportError as e:
                failures.append(e)
            time.sleep(0.1)
        for t in threads:
            t.join(60)
        assert srv.wait(30) in (0, -15)
    finally:
        keep_alive.close()
        srv.kill()
    assert not failures, failures[:3]  # never a refused or reset connection during the drain
    assert len(outcomes) >= 4
    for status, retry_after, body in outcomes:
        assert status == 503 and retry_after == "5" and body["error"]["code"] == "shutting_down", (status, body)
    for lines, errs in streams:
        assert not errs and lines[-1] == "data: [DONE]", (errs, lines[-2:])
        assert '"code":"shutting_down"' in lines[-2] or '"finish_reason":"length"' in lines[-2], lines[-2]
    assert "Traceback" not in srv.log()
