"""A hostile client's corpus: every mistake is a 4xx naming the field, never a 5xx or internal text.

Rebuilds the outside probe's 148 requests (wrong types, huge numbers, bad Unicode, deep
nesting, missing and unknown fields, refused parameters, bad media types, bad methods and
paths) and checks that the server answers each with OpenAI's error body, stays healthy, and
gives the same greedy output afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import httpx
import pytest

from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, Models, RunningServer, serve

pytestmark = pytest.mark.slow  # full tier: make test-full

OK = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2, "temperature": 0}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
JSON = {"content-type": "application/json"}
# text that only an internal exception would put in a message
INTERNAL = ("Traceback", "Overflow", "recursion", "TextInputSequence", "long long", "object has no attribute",
            "NoneType", "errors.pydantic.dev", 'File "', "Exception", "internal server error")


@dataclass
class Case:
    name: str
    body: Union[dict[str, Any], bytes, None]
    status: Union[int, tuple[int, ...]] = 400
    param: Optional[str] = None  # the field the error must name (None: not checked)
    path: str = "/v1/completions"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {k: v for k, v in {**base, **changes}.items() if v is not ...}


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _nest(depth: int, leaf: Any = 1) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def corpus() -> list[Case]:
    cases: list[Case] = []
    # -- wrong types, field by field ------------------------------------------------------------
    wrong: dict[str, list[Any]] = {
        "model": [5, None, ["x"], {"a": 1}, True],
        "prompt": [5, None, True, {"text": "x"}, [1.5], [["a"]], ["a", 1], [True]],
        "max_tokens": ["ten", 1.5, True, [4], {"n": 4}, "4"],
        "temperature": ["hot", True, [0], {"t": 0}],
        "top_p": ["x", True, [1]],
        "top_k": ["x", 1.5, False],
        "min_p": ["x", True],
        "stop": [5, [5], [["x"]], {"s": "x"}, True],
        "seed": ["1", 1.5, True, [1]],
        "stream": ["yes", 1, [True]],
        "stream_options": ["yes", {"include_usage": "yes"}, {"bogus": True}, 5],
        "drafter": [5, ["ngram"]],
        "gamma": ["4", 4.5, True],
        "chain_rule": [1, ["block"]],
        "ignore_eos": ["yes", 1],
        "user": [5, {"id": 1}],
        "metadata": ["x", {"a": 1}],
    }
    for name, values in wrong.items():
        for i, v in enumerate(values):
            cases.append(Case(f"type-{name}-{i}", _with(OK, **{name: v}), param=name))
    # -- out of range and huge numbers ----------------------------------------------------------
    big: list[tuple[str, Any, Optional[str]]] = [
        ("max_tokens", 0, "max_tokens"), ("max_tokens", -5, "max_tokens"), ("max_tokens", 10**9, "max_tokens"),
        ("max_tokens", 10**30, "max_tokens"), ("max_tokens", 2**63, "max_tokens"),
        ("temperature", -0.1, "temperature"), ("temperature", 2.5, "temperature"),
        ("temperature", 1e308, "temperature"),
        ("temperature", 10**400, "temperature"),
        ("top_p", 0, "top_p"), ("top_p", 1.5, "top_p"), ("top_k", 0, "top_k"), ("top_k", 10**30, "top_k"),
        ("top_k", -1, "top_k"), ("min_p", -1, "min_p"), ("min_p", 2, "min_p"),
        ("seed", 2**64, "seed"), ("seed", -(2**63) - 1, "seed"), ("seed", 10**100, "seed"), ("seed", -(10**40), "seed"),
        ("gamma", 0, "gamma"), ("gamma", 33, "gamma"), ("gamma", 10**20, "gamma"),
        ("prompt", [10**6], "prompt"), ("prompt", [-1], "prompt"), ("prompt", [2**63], "prompt"),
        ("prompt", [2**70], "prompt"), ("prompt", [1] * 5000, "prompt"), ("prompt", "def " * 9000, "prompt"),
        ("prompt", "x" * 3_000_000, "prompt"),
    ]
    for i, (name, v, param) in enumerate(big):
        cases.append(Case(f"range-{name}-{i}", _with(OK, **{name: v}), param=param))
    cases += [
        Case("range-temperature-1e400-literal", _raw('{"model":"%s","prompt":"d","temperature":1e400}' % MODEL_NAME),
             param="temperature"),
        Case("json-nan", _raw('{"model":"%s","prompt":"d","temperature":NaN}' % MODEL_NAME)),
        Case("json-infinity", _raw('{"model":"%s","prompt":"d","top_p":Infinity}' % MODEL_NAME)),
        Case("json-neg-infinity", _raw('{"model":"%s","prompt":"d","seed":-Infinity}' % MODEL_NAME)),
        Case("json-5000-digit-int", _raw('{"model":"%s","prompt":"d","seed":%s}' % (MODEL_NAME, "9" * 5000))),
    ]
    # -- bad unicode ----------------------------------------------------------------------------
    uni = [
        ("prompt-lone-high", '{"model":"%s","prompt":"a\\ud800b"}' % MODEL_NAME, "prompt"),
        ("prompt-lone-low", '{"model":"%s","prompt":"\\udc00"}' % MODEL_NAME, "prompt"),
        ("prompt-list-lone", '{"model":"%s","prompt":["x\\udfff"]}' % MODEL_NAME, "prompt.0"),
        ("stop-lone", '{"model":"%s","prompt":"d","stop":"\\ud83d"}' % MODEL_NAME, "stop"),
        ("stop-list-lone", '{"model":"%s","prompt":"d","stop":["a","\\ud83d"]}' % MODEL_NAME, "stop.1"),
        ("model-lone", '{"model":"\\ud800","prompt":"d"}', "model"),
        ("user-lone", '{"model":"%s","prompt":"d","user":"\\udbff"}' % MODEL_NAME, "user"),
        ("key-lone", '{"model":"%s","prompt":"d","\\ud800":1}' % MODEL_NAME, None),
        ("drafter-lone", '{"model":"%s","prompt":"d","drafter":"\\ud800"}' % MODEL_NAME, "drafter"),
    ]
    cases += [Case(f"unicode-{n}", _raw(t), param=p) for n, t, p in uni]
    cases += [
        Case("unicode-chat-lone", _raw('{"model":"%s","messages":[{"role":"user","content":"\\ud800"}]}' % MODEL_NAME),
             path="/v1/chat/completions", param="messages.0.content"),
        Case("unicode-chat-part-lone",
             _raw('{"model":"%s","messages":[{"role":"user","content":[{"type":"text","text":"\\udc99"}]}]}'
                  % MODEL_NAME), path="/v1/chat/completions", param="messages.0.content.0.text"),
        Case("unicode-invalid-utf8", b'{"model":"' + MODEL_NAME.encode() + b'","prompt":"\xff\xfe"}'),
        Case("unicode-overlong-utf8", b'{"model":"' + MODEL_NAME.encode() + b'","prompt":"\xc0\xaf"}'),
        Case("unicode-utf16-body", json.dumps(OK).encode("utf-16"), status=(200, 400)),  # json detects UTF-16
        Case("unicode-truncated-utf8", b'{"model":"' + MODEL_NAME.encode() + b'","prompt":"\xe2\x82"}'),
        Case("unicode-nul-in-prompt", _with(OK, prompt="a\u0000b"), status=(200, 400)),
        Case("unicode-emoji-prompt", _with(OK, prompt="\U0001f600 def"), status=200),
        Case("unicode-rtl-controls", _with(OK, prompt="\u202edef\u202c"), status=200),
    ]
    # -- nesting --------------------------------------------------------------------------------
    cases += [
        Case("nest-100k-arrays", b"[" * 100_000 + b"]" * 100_000),
        Case("nest-100k-objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        Case("nest-deep-prompt", _with(OK, prompt=_nest(200)), param="prompt"),
        Case("nest-deep-metadata", _with(OK, metadata=_nest(50, {"a": "b"})), param="metadata"),
        Case("nest-deep-stop", _with(OK, stop=_nest(40, "x")), param="stop"),
        Case("nest-deep-messages", _with(CHAT, messages=_nest(100)), path="/v1/chat/completions", param="messages"),
        Case("nest-deep-unknown", _raw(json.dumps(OK)[:-1] + ', "extra": ' + "[" * 5000 + "]" * 5000 + "}"),
             param=None),  # json.loads gives up first: no field to name
        Case("nest-deep-content",
             _with(CHAT, messages=[{"role": "user", "content": _nest(60, "x")}]), path="/v1/chat/completions",
             param="messages"),
    ]
    # -- malformed JSON and non-objects ---------------------------------------------------------
    for i, raw in enumerate([b"", b"{", b"{not json", b'{"model": }', b"[1, 2]", b'"a string"', b"42", b"null",
                             b"true", b'{"model":"x",}', b'{"model":"x"} trailing', b"\x00", b"{'model': 'x'}",
                             b'{"a":1}{"b":2}']):
        cases.append(Case(f"malformed-{i}", raw))
    # -- missing fields -------------------------------------------------------------------------
    cases += [
        Case("missing-prompt", _with(OK, prompt=...), param="prompt"),
        Case("missing-model", _with(OK, model=...), param="model"),
        Case("missing-everything", {}, param=None),
        Case("missing-messages", _with(CHAT, messages=...), path="/v1/chat/completions", param="messages"),
        Case("missing-role", _with(CHAT, messages=[{"content": "x"}]), path="/v1/chat/completions",
             param="messages.0.role"),
        Case("missing-part-text", _with(CHAT, messages=[{"role": "user", "content": [{"type": "text"}]}]),
             path="/v1/chat/completions", param="messages.0.content"),
        Case("empty-prompt", _with(OK, prompt=""), param="prompt"),
        Case("empty-prompt-list", _with(OK, prompt=[]), param="prompt"),
        Case("empty-messages", _with(CHAT, messages=[]), path="/v1/chat/completions", param="messages"),
        Case("empty-stop", _with(OK, stop=[""]), param="stop"),
        Case("too-many-stops", _with(OK, stop=["x"] * 17), param="stop"),
        Case("batched-prompts", _with(OK, prompt=["a", "b"]), param=None),
    ]
    # -- unknown fields -------------------------------------------------------------------------
    for name in ("max_token", "temprature", "foo", "prompt_ids", "stream_option", "Model"):
        cases.append(Case(f"unknown-{name}", _with(OK, **{name: 1}), param=name))
    cases.append(Case("unknown-chat", _with(CHAT, foo="bar"), path="/v1/chat/completions", param="foo"))
    cases.append(Case("unknown-stream-options", _with(OK, stream_options={"include_usage": True, "x": 1}),
                      param="stream_options.x"))
    # -- parameters the server does not honour --------------------------------------------------
    refused = [
        ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
        ("functions", [{"name": "f"}]), ("function_call", "auto"), ("response_format", {"type": "xml"}),
        ("logit_bias", {"50": 1000}), ("logit_bias", {"x": 1}), ("top_logprobs", 5), ("top_logprobs", 21),
        ("n", 9), ("n", 0), ("n", True),
        ("presence_penalty", 1.0), ("frequency_penalty", -0.5), ("audio", {"voice": "x"}),
        ("modalities", ["text", "audio"]), ("prediction", {"type": "content"}), ("reasoning_effort", "high"),
        ("web_search_options", {}),
    ]
    for name, v in refused:
        cases.append(Case(f"refused-chat-{name}-{v!r}"[:60], _with(CHAT, **{name: v}), path="/v1/chat/completions",
                          param=name))
    for name, v in [("echo", True), ("suffix", "x"), ("best_of", 3), ("logprobs", 21), ("n", 9), ("tools", [{}]),
                    ("top_logprobs", 2)]:
        cases.append(Case(f"refused-completion-{name}", _with(OK, **{name: v}), param=name))
    # neutral values of refused parameters are fine
    for name, v in [("n", 1), ("logprobs", False), ("presence_penalty", 0), ("response_format", {"type": "text"}),
                    ("tools", []), ("logit_bias", {})]:
        cases.append(Case(f"neutral-chat-{name}", _with(CHAT, **{name: v}), status=200,
                          path="/v1/chat/completions"))
    # honoured now (test_server_openai_parity.py checks their values)
    for name, v in [("n", 2), ("logprobs", True), ("logit_bias", {"50": 100}),
                    ("response_format", {"type": "json_object"})]:
        cases.append(Case(f"honoured-chat-{name}", _with(CHAT, **{name: v}), status=200,
                          path="/v1/chat/completions"))
    for name, v in [("n", 2), ("logprobs", 2), ("logit_bias", {"50": -100})]:
        cases.append(Case(f"honoured-completion-{name}", _with(OK, **{name: v}), status=200))
    # -- semantic mistakes ----------------------------------------------------------------------
    cases += [
        Case("model-unknown", _with(OK, model="gpt-4"), param="model"),
        Case("model-empty", _with(OK, model=""), param="model"),
        Case("drafter-unknown", _with(OK, drafter="magic"), param="drafter"),
        Case("drafter-not-loaded", _with(OK, drafter="model"), param="drafter"),
        Case("chain-rule-unknown", _with(OK, chain_rule="greedy"), param="chain_rule"),
        Case("chat-role-unknown", _with(CHAT, messages=[{"role": "wizard", "content": "x"}]),
             path="/v1/chat/completions", param="messages.0.role"),
        Case("chat-image-part", _with(CHAT, messages=[{"role": "user", "content": [{"type": "image_url",
                                                                                      "image_url": {"url": "x"}}]}]),
             path="/v1/chat/completions", param="messages.0.content"),
        Case("chat-content-int", _with(CHAT, messages=[{"role": "user", "content": 5}]),
             path="/v1/chat/completions", param="messages.0.content"),
        Case("chat-messages-dict", _with(CHAT, messages={"role": "user", "content": "x"}),
             path="/v1/chat/completions", param="messages"),
        Case("chat-long", _with(CHAT, messages=[{"role": "user", "content": "def " * 9000}]),
             path="/v1/chat/completions", param="messages"),
        Case("chat-max-tokens-over", _with(CHAT, max_completion_tokens=10**7), path="/v1/chat/completions",
             param="max_tokens"),
        Case("chat-prompt-field", _with(CHAT, prompt="x"), path="/v1/chat/completions", param="prompt"),
        Case("completion-messages-field", _with(OK, messages=[]), param="messages"),
    ]
    # -- media types ----------------------------------------------------------------------------
    for i, ct in enumerate(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                            "application/xml", "", "application/jsonp", "text/json"]):
        hdr = {"content-type": ct} if ct else {}
        cases.append(Case(f"media-{i}-{ct or 'none'}", json.dumps(OK).encode(), status=415, headers=hdr))
    cases.append(Case("media-json-charset", json.dumps(OK).encode(), status=200,
                      headers={"content-type": "application/json; charset=utf-8"}))
    cases.append(Case("media-json-uppercase", json.dumps(OK).encode(), status=200,
                      headers={"content-type": "Application/JSON"}))
    # -- methods and paths ----------------------------------------------------------------------
    cases += [
        Case("method-get-completions", None, status=405, method="GET"),
        Case("method-put-completions", json.dumps(OK).encode(), status=405, method="PUT"),
        Case("method-delete-chat", None, status=405, method="DELETE", path="/v1/chat/completions"),
        Case("path-unknown", json.dumps(OK).encode(), status=404, path="/v1/engines/x/completions"),
        Case("path-traversal", None, status=404, method="GET", path="/static/../../etc/passwd"),
        Case("path-encoded-traversal", None, status=404, method="GET", path="/%2e%2e/%2e%2e/etc/passwd"),
        Case("path-model-unknown", None, status=404, method="GET", path="/v1/models/gpt-4"),
        Case("path-openapi", None, status=404, method="GET", path="/openapi.json"),
        Case("path-docs", None, status=404, method="GET", path="/docs"),
    ]
    return cases


CORPUS = corpus()


def test_the_corpus_is_the_probes_size() -> None:
    assert len(CORPUS) >= 148, len(CORPUS)
    assert len({c.name for c in CORPUS}) == len(CORPUS)


@pytest.fixture(scope="module")
def hostile_server(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(max_batch_size=4, max_queue=64, request_timeout=30), drafter="ngram")


def _send(client: httpx.Client, url: str, c: Case) -> httpx.Response:
    if isinstance(c.body, dict):
        content: Optional[bytes] = json.dumps(c.body).encode()
    else:
        content = c.body
    return client.request(c.method, url + c.path, content=content, headers=c.headers)


def check_error_response(r: httpx.Response) -> dict[str, Any]:
    """OpenAI's error body, and no internal text in it."""
    body = r.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, body
    assert isinstance(err["message"], str) and err["message"]
    assert not any(w in err["message"] for w in INTERNAL), err["message"]
    return err


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_hostile_request(hostile_server: RunningServer, case: Case) -> None:
    with httpx.Client(timeout=30) as client:
        r = _send(client, hostile_server.url, case)
    allowed = case.status if isinstance(case.status, tuple) else (case.status,)
    assert r.status_code in allowed, (r.status_code, r.text[:500])
    assert r.status_code < 500
    if r.status_code >= 400:
        err = check_error_response(r)
        if case.param is not None:
            assert err["param"] == case.param or (err["param"] or "").startswith(case.param + "."), err
            assert case.param.split(".")[0] in err["message"], err


def test_server_is_healthy_and_identical_after_the_corpus(hostile_server: RunningServer, models: Models) -> None:
    import specdecode

    with httpx.Client(timeout=30) as client:  # runs after the corpus, on the same server
        h = client.get(hostile_server.url + "/health").json()
        r = client.post(hostile_server.url + "/v1/completions",
                        json=_with(OK, prompt="def fib(n):", max_tokens=12))
    assert h["status"] == "ok" and h["active_rows"] == 0 and h["queue_depth"] == 0
    ref = specdecode.generate(models.target, "def fib(n):", max_new_tokens=12)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref.text
