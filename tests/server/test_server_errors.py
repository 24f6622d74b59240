"""Bad requests get 4xx with OpenAI's error body and a message that names the problem; never 500 or a hang."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from specdecode import core as core_module
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.server.config import ServerConfig
from specdecode.server.scheduler import Failure, Request, RequestHandle, Scheduler

from server_helpers import MODEL_NAME, Models, RunningServer, serve
from test_server_api import _metric

OK = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 4, "temperature": 0}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not ...}


BAD_REQUESTS = [
    # (path, body, status, param, words in the message)
    ("/v1/completions", _with(OK, max_tokens="ten"), 400, "max_tokens", "integer"),
    ("/v1/completions", _with(OK, max_tokens=-5), 400, "max_tokens", "greater than or equal to 1"),
    ("/v1/completions", _with(OK, max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
    ("/v1/completions", _with(OK, max_tokens=10**9), 400, "max_tokens", "maximum context length"),
    ("/v1/completions", _with(OK, prompt="def " * 9000), 400, "prompt", "context window"),
    ("/v1/completions", _with(OK, prompt=...), 400, "prompt", "Field required"),
    ("/v1/completions", _with(OK, prompt=5), 400, "prompt", ""),
    ("/v1/completions", _with(OK, prompt=""), 400, "prompt", "empty"),
    ("/v1/completions", _with(OK, prompt=[10**6]), 400, "prompt", "outside the vocabulary"),
    ("/v1/completions", _with(OK, model="gpt-4"), 400, "model", "not served here"),
    ("/v1/completions", _with(OK, model=...), 400, "model", "Field required"),
    ("/v1/completions", _with(OK, n=9), 400, "n", "less than or equal to 8"),
    ("/v1/completions", _with(OK, temperature=5), 400, "temperature", "less than or equal to 2"),
    ("/v1/completions", _with(OK, temperature="hot"), 400, "temperature", ""),
    ("/v1/completions", _with(OK, top_p=0), 400, "top_p", "greater than 0"),
    ("/v1/completions", _with(OK, stop=[""]), 400, "stop", "non-empty"),
    ("/v1/completions", _with(OK, stream="yes"), 400, "stream", "boolean"),
    ("/v1/completions", _with(OK, logprobs=21), 400, "logprobs", "less than or equal to 20"),
    ("/v1/completions", _with(OK, drafter="magic"), 400, "drafter", ""),
    ("/v1/completions", _with(OK, gamma=0), 400, "gamma", "greater than or equal to 1"),
    ("/v1/completions", _with(OK, chain_rule="greedy"), 400, "chain_rule", "use one of: block, token"),
    ("/v1/completions", _with(OK, chain_rule=1), 400, "chain_rule", ""),
    ("/v1/completions", _with(OK, presence_penalty=1.0), 400, "presence_penalty", "not supported"),
    ("/v1/chat/completions", _with(CHAT, messages=[]), 400, "messages", "at least 1"),
    ("/v1/chat/completions", _with(CHAT, messages="hi"), 400, "messages", ""),
    ("/v1/chat/completions", _with(CHAT, messages=[{"role": "wizard", "content": "x"}]), 400, "messages.0.role", ""),
    ("/v1/chat/completions", _with(CHAT, n=0), 400, "n", "greater than or equal to 1"),
]


@pytest.mark.parametrize("path,body,status,param,words", BAD_REQUESTS)
def test_bad_request(server: RunningServer, path: str, body: dict[str, Any], status: int, param: str,
                     words: str) -> None:
    r = server.post(path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"\xff\xfe"])
def test_malformed_json(server: RunningServer, raw: bytes) -> None:
    r = httpx.post(server.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


def test_openai_client_raises_bad_request_with_our_message(server: RunningServer) -> None:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="less than or equal to 8"):
        c.completions.create(model=MODEL_NAME, prompt="def", n=9)
    with pytest.raises(openai.BadRequestError, match="not served here"):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


@pytest.fixture(scope="module")
def keyed_server(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(api_key="s3cret", max_batch_size=2), drafter="ngram")


@pytest.mark.parametrize("headers,status", [
    ({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": "s3cret"}, 401),
    ({"Authorization": "Bearer s3cret"}, 200),
])
def test_api_key(keyed_server: RunningServer, headers: dict[str, str], status: int) -> None:
    r = keyed_server.post("/v1/completions", OK, headers=headers)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["type"] == "authentication_error"
        assert keyed_server.get("/v1/models", headers=headers).status_code == 401
    assert keyed_server.get("/health").status_code == 200  # health and metrics stay open


def test_draft_model_requested_but_not_loaded(keyed_server: RunningServer) -> None:
    r = keyed_server.post("/v1/completions", _with(OK, drafter="model"), headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 400 and "is not loaded on this server" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def tiny_server(models: Models) -> Iterator[RunningServer]:
    """One row and a one-slot queue: the third concurrent request must be refused."""
    yield from serve(models, None, ServerConfig(max_batch_size=1, max_queue=1, request_timeout=60), drafter="none")


def test_full_queue_gives_429(tiny_server: RunningServer) -> None:
    body = _with(OK, max_tokens=400, ignore_eos=True)
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        r = httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=60)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = sorted(r.status_code for r in results)
    assert len(codes) == 6 and 200 in codes and 429 in codes and set(codes) == {200, 429}, codes
    err = next(r for r in results if r.status_code == 429).json()["error"]
    assert err["code"] == "queue_full" and "retry" in err["message"]


def _wait_rows_free(server: RunningServer, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.get("/health").json()["active_rows"] == 0:
            return True
        time.sleep(0.02)
    return False


def test_disconnect_mid_stream_cancels_and_frees_the_row(tiny_server: RunningServer) -> None:
    before = _metric(tiny_server.get("/metrics").text, 'specdecode_requests_total{finish_reason="cancelled"}')
    body = _with(OK, max_tokens=1000, ignore_eos=True, stream=True)
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert tiny_server.get("/health").json()["active_rows"] == 1
    # 1000 tokens take seconds; the row must be free long before the generation could have ended
    assert _wait_rows_free(tiny_server, timeout=10)
    after = _metric(tiny_server.get("/metrics").text, 'specdecode_requests_total{finish_reason="cancelled"}')
    assert after == before + 1
    # and the freed row serves the next request
    assert tiny_server.post("/v1/completions", OK).status_code == 200


def test_disconnect_while_waiting_for_a_non_streaming_answer(tiny_server: RunningServer) -> None:
    before = _metric(tiny_server.get("/metrics").text, 'specdecode_requests_total{finish_reason="cancelled"}')
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(tiny_server.url + "/v1/completions", json=_with(OK, max_tokens=4000, ignore_eos=True), timeout=0.3)
    assert _wait_rows_free(tiny_server, timeout=10)
    after = _metric(tiny_server.get("/metrics").text, 'specdecode_requests_total{finish_reason="cancelled"}')
    assert after == before + 1


def test_request_timeout_is_a_504(models: Models) -> None:
    # 4000 tokens of the tiny model take well over 50 ms even on a fast machine (~0.1 ms a step)
    for running in serve(models, None, ServerConfig(max_batch_size=1, request_timeout=0.05), drafter="none"):
        r = running.post("/v1/completions", _with(OK, max_tokens=4000, ignore_eos=True))
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert _wait_rows_free(running)
        with httpx.stream("POST", running.url + "/v1/completions", json=_with(OK, max_tokens=4000, ignore_eos=True,
                                                                              stream=True), timeout=30) as s:
            lines = [ln for ln in s.iter_lines() if ln]
        assert lines[-1] == "data: [DONE]" and '"request_timeout"' in lines[-2]


def test_scheduler_times_out_a_request_that_waited_too_long(models: Models) -> None:
    sched = Scheduler(models.target, {}, max_batch_size=1)
    sched.start()
    try:
        async def run() -> object:
            h = RequestHandle(Request([1, 2, 3], SamplingConfig(), GenerationConfig(max_new_tokens=4)),
                              asyncio.get_running_loop(), timeout_s=0.0)
            sched.submit(h)
            return await asyncio.wait_for(h.queue.get(), 10)

        ev = asyncio.run(run())
        assert isinstance(ev, Failure) and ev.kind == "timeout"
    finally:
        sched.stop()


def test_graceful_shutdown_finishes_running_requests(models: Models) -> None:
    gen = serve(models, None, ServerConfig(max_batch_size=2), drafter="none")
    running = next(gen)
    body = _with(OK, max_tokens=150, ignore_eos=True, stream=True)
    with httpx.stream("POST", running.url + "/v1/completions", json=body, timeout=30) as r:
        it = r.iter_lines()
        assert next(it).startswith("data: ")
        running.server.should_exit = True  # like SIGTERM: stop accepting, drain, then stop the engine
        rest = [ln for ln in it if ln]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
    running.thread.join(30)
    assert not running.thread.is_alive()
    assert running.state.scheduler._thread is not None and not running.state.scheduler._thread.is_alive()
    with pytest.raises(StopIteration):
        next(gen)



def test_an_engine_error_fails_only_the_running_requests(models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    for running in serve(models, None, ServerConfig(max_batch_size=2), drafter="none"):
        original = core_module.emit
        calls = {"n": 0}

        def broken(*args: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return original(*args)

        monkeypatch.setattr(core_module, "emit", broken)  # the core's one place that emits a row's tokens
        r = running.post("/v1/completions", OK)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and "internal error" in err["message"]
        assert "boom" not in err["message"]  # no internal exception text reaches a client
        assert _wait_rows_free(running)
        assert running.post("/v1/completions", OK).status_code == 200  # the engine thread survived
