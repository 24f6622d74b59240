"""Parity and hygiene: models.retrieve, Retry-After, metrics that count every request, quiet disconnects,
no schema unless asked, JSON-only POSTs, a drain that refuses queued requests."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from specdecode import core as core_module
from specdecode.config import ConfigError, GenerationConfig, SamplingConfig
from specdecode.server.config import ServerConfig
from specdecode.server.metrics import ServerMetrics
from specdecode.server.scheduler import Failure, FinishEvent, Request, RequestHandle, Scheduler

from server_helpers import MODEL_NAME, Models, RunningServer, serve
from test_server_api import _metric

OK = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2, "temperature": 0}
LONG = {**OK, "max_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def one_row(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(max_batch_size=1, max_queue=2, request_timeout=60), drafter="none")


def test_models_retrieve(one_row: RunningServer) -> None:
    c = openai.OpenAI(base_url=one_row.url + "/v1", api_key="x", max_retries=0)
    assert c.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.models.retrieve("gpt-4")


def test_openapi_only_when_asked(one_row: RunningServer, models: Models) -> None:
    assert one_row.get("/openapi.json").status_code == 404
    for running in serve(models, None, ServerConfig(openapi=True, max_batch_size=1), drafter="none"):
        schema = running.get("/openapi.json").json()
        assert "/v1/completions" in schema["paths"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_post_requires_json_content_type(one_row: RunningServer, ctype: str) -> None:
    headers = {"content-type": ctype} if ctype else {}
    r = httpx.post(one_row.url + "/v1/chat/completions", headers=headers, timeout=30,
                   content=b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}')
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert "application/json" in r.json()["error"]["message"]


def test_429_has_retry_after_and_metrics_count_every_request(models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is held at its first emitted token, so which request runs, which queue and which are refused
    does not depend on how fast this machine decodes (a fast CI machine once finished them all in time)."""
    for running in serve(models, None, ServerConfig(max_batch_size=1, max_queue=2, request_timeout=60),
                         drafter="none"):
        gate = threading.Event()
        original = core_module.emit

        def held(*args: Any) -> Any:
            gate.wait(30)
            return original(*args)

        monkeypatch.setattr(core_module, "emit", held)  # the core's one place that emits a row's tokens
        before = running.get("/metrics").text
        gave_up: list[int] = []

        def call() -> None:
            try:
                httpx.post(running.url + "/v1/completions", json=LONG, timeout=1.0)
            except httpx.ReadTimeout:  # the client gives up while queued or running: cancelled
                gave_up.append(1)

        def wait_for(key: str, n: int) -> None:
            deadline = time.monotonic() + 10
            while running.get("/health").json()[key] < n:
                assert time.monotonic() < deadline, key
                time.sleep(0.02)

        threads = [threading.Thread(target=call) for _ in range(3)]
        threads[0].start()
        wait_for("active_rows", 1)
        for t in threads[1:]:
            t.start()
        wait_for("queue_depth", 2)
        refused = [running.post("/v1/completions", LONG) for _ in range(5)]
        assert all(r.status_code == 429 and r.headers["retry-after"] == "1" for r in refused)
        for t in threads:
            t.join(30)
        assert len(gave_up) == 3
        gate.set()
        deadline = time.monotonic() + 10
        while running.get("/health").json()["active_rows"] or running.get("/health").json()["queue_depth"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # the engine thread records a queued cancellation on its next pass
        after = running.get("/metrics").text
        ended = _metric(after, "specdecode_requests_total") - _metric(before, "specdecode_requests_total")
        refused_m = (_metric(after, "specdecode_refused_requests_total")
                     - _metric(before, "specdecode_refused_requests_total"))
        assert refused_m == 5
        assert ended + refused_m == 8, (ended, refused_m)  # every request ended somewhere in the metrics
        cancelled = (_metric(after, 'specdecode_requests_total{finish_reason="cancelled"}')
                     - _metric(before, 'specdecode_requests_total{finish_reason="cancelled"}'))
        assert cancelled == 3


def test_a_disconnect_is_one_info_line(one_row: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="specdecode.server"):
        with httpx.stream("POST", one_row.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 10
        while not any("disconnected" in rec.getMessage() for rec in caplog.records):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)
    ours = [rec for rec in caplog.records if "disconnected" in rec.getMessage()]
    assert len(ours) == 1 and ours[0].levelno == logging.INFO and ours[0].exc_info is None
    assert not any(rec.levelno >= logging.WARNING for rec in caplog.records), [r.getMessage() for r in caplog.records]


def test_scheduler_drain_fails_queued_at_once_and_running_after_the_timeout(models: Models,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = ServerMetrics()
    sched = Scheduler(models.target, {}, max_batch_size=1, max_queue=4, metrics=metrics)
    emit = core_module.emit

    def slow(*args: Any) -> Any:  # 10 ms a token: the 4000-token request outlasts the 0.5 s drain on any machine
        time.sleep(0.01)          # (a fresh clone here decoded all of it in 0.48 s and finished it normally)
        return emit(*args)

    monkeypatch.setattr(core_module, "emit", slow)
    sched.start()

    async def run() -> tuple[list[object], list[object]]:
        loop = asyncio.get_running_loop()
        spec = Request([1, 2, 3], SamplingConfig(temperature=0.0),
                       GenerationConfig(max_new_tokens=4000, ignore_eos=True))
        running = RequestHandle(spec, loop, 60)
        queued = RequestHandle(spec, loop, 60)
        sched.submit(running)
        sched.submit(queued)
        while sched.active_rows == 0:
            await asyncio.sleep(0.01)
        sched.begin_drain(0.5)
        with pytest.raises(Exception, match="shutting down"):
            sched.submit(RequestHandle(spec, loop, 60))
        out: list[list[object]] = [[], []]
        for h, sink in ((queued, out[1]), (running, out[0])):
            while True:
                ev = await asyncio.wait_for(h.queue.get(), 30)
                sink.append(ev)
                if isinstance(ev, (Failure, FinishEvent)):
                    break
        return out[0], out[1]

    try:
        t0 = time.monotonic()
        ran, waited = asyncio.run(run())
        took = time.monotonic() - t0
    finally:
        sched.stop(1.0)
    assert len(waited) == 1 and isinstance(waited[0], Failure) and waited[0].kind == "shutdown"
    assert isinstance(ran[-1], Failure) and ran[-1].kind == "shutdown" and len(ran) > 1
    assert took < 20
    text = metrics.render().decode()
    assert _metric(text, 'specdecode_requests_total{finish_reason="shutdown"}') == 2


def test_the_engine_sets_its_torch_threads_on_its_own_thread(models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenMP team belongs to the thread that starts it: `serve` loads on one thread and the engine thread
    sets its own count (set on the main thread, it never reached the engine: a 2-core server decoded at half
    speed). ``threads`` None leaves the process's setting alone."""
    import torch

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append((threading.current_thread().name, n)))
    for threads, want in ((3, [("specdecode-engine", 3)]), (None, [])):
        calls.clear()
        sched = Scheduler(models.target, {}, max_batch_size=1, threads=threads)
        sched.start()
        sched.stop(drain_s=1.0)
        assert calls == want
    with pytest.raises(ConfigError, match="threads must be >= 1, got 0"):
        ServerConfig(threads=0)
