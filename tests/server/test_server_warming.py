"""/health while a drafter is prepared (its costs measured): 200 with status "warming" and ``preparing`` naming
it, both at start-up (the CLI prepares its default drafter on the engine thread once the server listens) and
when a drafter is prepared at its first request; requests sent meanwhile wait and then complete (issue 30
item 2)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import httpx
import pytest

from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, Models, RunningServer, start_server


def _gate(state: Any, name: str) -> tuple[threading.Event, threading.Event]:
    """Hold drafter ``name``'s preparation until the returned ``release`` is set; ``entered`` says it began."""
    drafter = state.scheduler.core.drafters[name]
    prepare: Callable[..., Any] = drafter.prepare_rows
    entered, release = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(60), "the test never released the preparation"
        return prepare(*args, **kwargs)

    drafter.prepare_rows = held  # type: ignore[method-assign]
    return entered, release


def _post_in_background(server: RunningServer, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        out["status"], out["json"] = r.status_code, r.json()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _wait_ok(server: RunningServer) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        h = server.get("/health")
        if h.json()["status"] == "ok" or time.monotonic() > deadline:
            return {"code": h.status_code, **h.json()}
        time.sleep(0.05)


def test_health_warming_while_the_default_drafter_is_prepared_at_start(models: Models) -> None:
    state = make_state(models.target, models.draft, ServerConfig(max_batch_size=2, request_timeout=60),
                       default_drafter="model", model_name=MODEL_NAME, prepare_in_background=True)
    entered, release = _gate(state, "model")
    server = start_server(state)
    try:
        assert entered.wait(30)  # the engine thread prepares it, after the server started listening
        h = server.get("/health")
        assert h.status_code == 200 and h.json()["status"] == "warming" and h.json()["preparing"] == "model"
        t, out = _post_in_background(server, {"model": MODEL_NAME, "prompt": "def f(x):", "max_tokens": 6,
                                               "temperature": 0})
        time.sleep(0.3)
        assert t.is_alive() and server.get("/health").json()["queue_depth"] == 1  # queued while warming
        release.set()
        t.join(60)
        assert out["status"] == 200 and out["json"]["usage"]["completion_tokens"] == 6
        h2 = _wait_ok(server)
        assert h2["code"] == 200 and h2["status"] == "ok" and h2["preparing"] is None
    finally:
        release.set()
        server.stop()


def test_health_warming_while_a_drafter_is_prepared_at_its_first_request(models: Models) -> None:
    state = make_state(models.target, models.draft, ServerConfig(max_batch_size=2, request_timeout=60),
                       default_drafter="ngram", model_name=MODEL_NAME)
    server = start_server(state)
    try:
        assert server.get("/health").json()["status"] == "ok"  # the default was prepared before listening
        entered, release = _gate(state, "model")
        t, out = _post_in_background(server, {"model": MODEL_NAME, "prompt": "def f(x):", "max_tokens": 6,
                                               "temperature": 0, "drafter": "model"})
        assert entered.wait(30)
        h = server.get("/health")
        assert h.status_code == 200 and h.json()["status"] == "warming" and h.json()["preparing"] == "model"
        release.set()
        t.join(60)
        assert out["status"] == 200 and out["json"]["usage"]["completion_tokens"] == 6
        assert _wait_ok(server)["status"] == "ok"
    finally:
        release.set()
        server.stop()


def test_a_failed_preparation_at_start_leaves_the_server_serving(models: Models) -> None:
    state = make_state(models.target, models.draft, ServerConfig(max_batch_size=2, request_timeout=60),
                       default_drafter="model", model_name=MODEL_NAME, prepare_in_background=True)
    drafter = state.scheduler.core.drafters["model"]
    prepare = drafter.prepare_rows
    calls = []

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated failure while measuring costs")
        return prepare(*args, **kwargs)

    drafter.prepare_rows = fails_once  # type: ignore[method-assign]
    server = start_server(state)
    try:
        assert _wait_ok(server)["status"] == "ok"
        r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "def f(x):", "max_tokens": 4,
                                            "drafter": "none"})
        assert r.status_code == 200
        r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "def f(x):", "max_tokens": 4})
        assert r.status_code == 200 and len(calls) == 2  # tried again at its first request
    finally:
        server.stop()


@pytest.mark.parametrize("background", [False, True])
def test_warm_server_health_is_ok(models: Models, background: bool) -> None:
    state = make_state(models.target, models.draft, ServerConfig(max_batch_size=2), default_drafter="model",
                       model_name=MODEL_NAME, prepare_in_background=background)
    server = start_server(state)
    try:
        h = _wait_ok(server)
        assert h["code"] == 200 and h["status"] == "ok" and h["preparing"] is None
    finally:
        server.stop()


@pytest.mark.slow  # ~6 s: every bundled drafter's costs measured
def test_an_idle_server_prepares_every_other_drafter_so_no_first_request_measures_in_a_step(models: Models) -> None:
    state = make_state(models.target, models.draft, ServerConfig(max_batch_size=2, request_timeout=60),
                       default_drafter="model", model_name=MODEL_NAME, prepare_in_background=True)
    core = state.scheduler.core
    assert len(core.unprepared()) > 1
    server = start_server(state)
    try:
        deadline = time.monotonic() + 120
        while core.unprepared() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert core.unprepared() == []  # with no request sent
        assert _wait_ok(server)["code"] == 200
    finally:
        server.stop()
