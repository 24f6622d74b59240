"""A response_format too big for the grammar engine (llguidance's parser allows 2000 items in an
Earley row: an object of ~500 optional properties, an enum of ~2000 values) fails alone.

When its first tokens already exceed the limit, it is a 400 naming response_format before it takes a
row. When the limit is hit only partway through decoding, that request alone ends with a clear error
naming response_format (a 400 before any byte was sent, an error event in a stream), and the requests
beside it in the batch finish exactly as they would alone. No engine text reaches a client.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from specdecode import core as core_module

pytest.importorskip("llguidance")

from server_helpers import MODEL_NAME, RunningServer
from test_server_api import _metric

pytestmark = pytest.mark.slow  # a second each to compile the big grammars, plus long concurrent streams

# text only an engine or exception would put in a message
INTERNAL = ("Traceback", "Exception", "Parser Error", "<state>", "left-recursive", "grm_prefix", "RuntimeError",
            "internal", "Current row")

BIG_OBJECT = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
# the limit is hit only after a 48-character string: past the up-front check, partway through decoding
DEEP = {"type": "object", "properties": {"a": {"type": "string", "minLength": 48, "maxLength": 48}, "b": BIG_OBJECT},
        "required": ["a", "b"], "additionalProperties": False}
NORMAL = {"model": MODEL_NAME, "prompt": "def add(a, b):\n", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _chat(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "json please"}], "max_tokens": 200,
            "temperature": 0, "response_format": _fmt(schema), **extra}


def _clean(err: dict[str, Any]) -> None:
    assert err["param"] == "response_format", err
    assert err["message"].startswith("response_format"), err
    assert not any(w in err["message"] for w in INTERNAL), err
    assert len(err["message"]) < 600, err


@pytest.mark.parametrize("schema", [BIG_OBJECT, {"enum": [[] for _ in range(2500)]},
                                    {"enum": [[] for _ in range(5000)]},
                                    {"type": "object", "properties": {"x": BIG_OBJECT}, "required": ["x"]}],
                         ids=["1000-properties", "enum-2500", "enum-5000", "nested-1000-properties"])
def test_a_grammar_over_the_engine_limits_is_a_400_up_front(server: RunningServer, schema: dict[str, Any]) -> None:
    r = server.post("/v1/chat/completions", _chat(schema))
    assert r.status_code == 400, r.text
    _clean(r.json()["error"])
    assert server.get("/health").json()["active_rows"] == 0


def _stream(server: RunningServer, body: dict[str, Any], started: threading.Event, out: dict[str, Any]) -> None:
    text, reasons = "", []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += chunk["choices"][0]["text"]
            if chunk["choices"][0]["finish_reason"] is not None:
                reasons.append(chunk["choices"][0]["finish_reason"])
                out["finished_at"] = time.monotonic()
            started.set()
    out["text"], out["reasons"] = text, reasons
    started.set()


def test_a_grammar_failing_mid_decode_fails_alone(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = server.post("/v1/completions", NORMAL).json()["choices"][0]["text"]
    # each row's step takes 10 ms more from here on, so the normal request (hundreds of steps) is still decoding when
    # the big grammar (a second or more to compile) fails: on a fast machine it once finished first
    emit = core_module.emit

    def slow(*args: Any) -> Any:
        time.sleep(0.01)
        return emit(*args)

    monkeypatch.setattr(core_module, "emit", slow)
    before = server.get("/metrics").text
    started, out = threading.Event(), {}
    t = threading.Thread(target=_stream, args=(server, NORMAL, started, out))
    t.start()
    assert started.wait(60)  # the normal request holds a row and is decoding
    r = server.post("/v1/chat/completions", _chat(DEEP))
    failed_at = time.monotonic()
    t.join(120)
    assert r.status_code == 400, r.text
    _clean(r.json()["error"])
    assert out["status"] == 200 and out["reasons"] == ["length"] and out["text"] == alone
    assert out["finished_at"] > failed_at  # the two really shared the batch when the grammar gave up
    after = server.get("/metrics").text
    for reason, n in (("error", 1), ("length", 1)):  # each request ended in the metrics once
        name = f'specdecode_requests_total{{finish_reason="{reason}"}}'
        assert _metric(after, name) - _metric(before, name) == n, reason
    assert server.get("/health").json()["active_rows"] == 0
    assert server.post("/v1/completions", NORMAL).json()["choices"][0]["text"] == alone  # the engine is sound


def test_a_stream_whose_grammar_fails_mid_decode_ends_with_an_error_event(server: RunningServer) -> None:
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=_chat(DEEP, stream=True), timeout=120) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert "error" in events[-1] and all("error" not in e for e in events[:-1]), events[-3:]
    _clean(events[-1]["error"])
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices"))
    assert text.startswith('{"a": "') and len(text) > 7 + 32  # it decoded most of the string before the big object
    assert server.get("/health").json()["active_rows"] == 0
