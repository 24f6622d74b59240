"""SIGTERM on a real `specdecode serve`: no cut connection, every stream ends with a reason or an error event."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx
import pytest

from server_helpers import MODEL_NAME, Models
from serve_process import ServeProcess

pytestmark = pytest.mark.slow

LONG = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}


@dataclass
class Outcome:
    lines: list[str] = field(default_factory=list)
    status: Optional[int] = None
    headers: dict[str, str] = field(default_factory=dict)
    error: Optional[BaseException] = None  # a cut connection shows up here
    body: Any = None


def _stream(url: str, path: str, body: dict[str, Any], out: Outcome, started: threading.Event) -> None:
    try:
        with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
            out.status = r.status_code
            for line in r.iter_lines():
                if line:
                    out.lines.append(line)
                    started.set()
    except BaseException as e:  # noqa: BLE001 - recorded and asserted on
        out.error = e


def _post(url: str, body: dict[str, Any], out: Outcome) -> None:
    try:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        out.status, out.headers, out.body = r.status_code, dict(r.headers), r.json()
    except BaseException as e:  # noqa: BLE001
        out.error = e


def _wait(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_sigterm_drains_without_cutting_a_stream(models: Models) -> None:
    srv = ServeProcess(models.target_dir, ["--drafter", "ngram", "--gamma", "4", "--max-batch-size", "16",
                                           "--max-queue", "8", "--drain-timeout", "1.5"])
    try:
        running = [Outcome() for _ in range(16)]
        queued_streams = [Outcome() for _ in range(3)]
        queued_posts = [Outcome() for _ in range(3)]
        threads = []
        for o in running:
            ev = threading.Event()
            t = threading.Thread(target=_stream, args=(srv.url, "/v1/completions", LONG, o, ev), daemon=True)
            t.start()
            threads.append(t)
        assert _wait(lambda: httpx.get(srv.url + "/health").json()["active_rows"] == 16, 60), srv.log()
        for o in queued_streams:
            chat = {**LONG, "messages": [{"role": "user", "content": "hi"}]}
            chat.pop("prompt")
            t = threading.Thread(target=_stream, args=(srv.url, "/v1/chat/completions", chat, o, threading.Event()),
                                 daemon=True)
            t.start()
            threads.append(t)
        for o in queued_posts:
            t = threading.Thread(target=_post, args=(srv.url, LONG, o), daemon=True)
            t.start()
            threads.append(t)
        assert _wait(lambda: httpx.get(srv.url + "/health").json()["queue_depth"] == 6, 30), srv.log()
        assert all(o.lines for o in running)  # every running stream has sent tokens
        srv.terminate()
        t0 = time.monotonic()
        for t in threads:
            t.join(60)
        drained_in = time.monotonic() - t0
        assert srv.wait(30) in (0, -15)  # uvicorn re-raises the SIGTERM it handled, once drained
    finally:
        srv.kill()
    log = srv.log()
    for o in running + queued_streams:
        assert o.error is None, (o.error, o.lines[-2:])  # never a cut connection
        assert o.status == 200 and o.lines[-1] == "data: [DONE]", o.lines[-3:]
        last = o.lines[-2]
        assert '"finish_reason":"length"' in last or '"code":"shutting_down"' in last, last
    # 4000 tokens take far longer than the 1.5 s drain: the running streams end with the error event
    assert sum('"code":"shutting_down"' in o.lines[-2] for o in running) >= 1
    for o in queued_streams:  # queued streams never started: an error event at once, no tokens
        assert '"code":"shutting_down"' in o.lines[-2] and "retry" in o.lines[-2]
    for o in queued_posts:
        assert o.error is None and o.status == 503, (o.status, o.body, o.error)
        assert o.body["error"]["code"] == "shutting_down" and o.headers.get("retry-after") == "5"
    assert drained_in < 1.5 + 10, drained_in
    assert "shutting down: refusing new requests, failing 6 queued, giving 16 running up to 2 s" in log, log
    assert "Traceback" not in log and "Cancel" not in log, log
