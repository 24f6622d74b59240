"""Hostile requests (issue 49): the model may be named as `specdecode pull` names it, nothing a client sends
comes back whole in an error, logit_bias keys are plain token ids, a body in another charset is refused,
every answer carries nosniff and no-framing headers, and a recursive schema is refused before it compiles."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import pytest

from specdecode.constraint_spec import recursive_ref
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig
from specdecode.server.state import served_names

from server_helpers import MODEL_NAME, Models, RunningServer, baseline_latency, start_server

ALIAS = "tiny-llama-instruct"
OK = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2, "temperature": 0}
BIG = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def hostile(models: Models) -> Iterator[RunningServer]:
    state = make_state(models.target, None, ServerConfig(max_batch_size=2), default_drafter="ngram",
                       model_name=MODEL_NAME, aliases=(ALIAS,))
    running = start_server(state)
    try:
        yield running
    finally:
        running.stop()


def _err(r: httpx.Response) -> dict[str, Any]:
    err: dict[str, Any] = r.json()["error"]
    return err


# -- model names ------------------------------------------------------------------------------------
def test_the_catalogue_name_and_the_file_name_both_name_a_pulled_model(tmp_path: Path) -> None:
    target = SimpleNamespace(path=str(tmp_path / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    names = served_names(target, "SmolLM2-135M-Instruct.Q4_1.gguf")  # type: ignore[arg-type]
    assert names == ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct")
    other = SimpleNamespace(path=str(tmp_path / "my-model"))
    assert served_names(other, "my-model", ("org/my-model",)) == ("my-model", "org/my-model")  # type: ignore[arg-type]


def test_every_accepted_name_is_listed_and_served(hostile: RunningServer) -> None:
    listed = [m["id"] for m in hostile.get("/v1/models").json()["data"]]
    assert listed == [MODEL_NAME, ALIAS]
    for name in listed:
        r = hostile.post("/v1/completions", {**OK, "model": name})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == MODEL_NAME
        assert hostile.get(f"/v1/models/{name}").json()["id"] == name
    r = hostile.post("/v1/completions", {**OK, "model": "gpt-4"})
    assert r.status_code == 400 and _err(r)["param"] == "model"
    assert MODEL_NAME in _err(r)["message"] and ALIAS in _err(r)["message"]


# -- nothing echoed whole -----------------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    {**OK, "model": "m" * BIG},
    {**OK, "logit_bias": {"k" * BIG: 1}},
    {**OK, "logit_bias": {"5": "v" * BIG}},
    {**OK, "k" * BIG: 1},
    {**OK, "drafter": "d" * BIG},
    {**OK, "response_format": {"type": "t" * BIG}},
], ids=["model", "logit_bias-key", "logit_bias-value", "field-name", "drafter", "response_format-type"])
def test_a_3mb_value_is_not_echoed_back(hostile: RunningServer, body: dict[str, Any]) -> None:
    r = hostile.post("/v1/completions", body)
    assert r.status_code == 400, r.text[:300]
    assert len(r.content) < 3000, r.text[:300]


def test_a_long_model_path_is_not_echoed_back(hostile: RunningServer) -> None:
    r = hostile.get("/v1/models/" + "m" * 10_000)  # what fits the 16 KB header limit
    assert r.status_code == 404 and len(r.content) < 3000, r.text[:300]


# -- logit_bias keys --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [" 5 ", "1_0", "\u0665", "+5", "5.0", "0x5", "-1", ""])
def test_a_logit_bias_key_that_is_not_plain_digits_is_refused(hostile: RunningServer, key: str) -> None:
    r = hostile.post("/v1/completions", {**OK, "logit_bias": {key: 5}})
    assert r.status_code == 400, r.text
    assert _err(r)["param"] == "logit_bias" and repr(key) in _err(r)["message"], _err(r)


def test_a_plain_logit_bias_key_still_works(hostile: RunningServer) -> None:
    assert hostile.post("/v1/completions", {**OK, "logit_bias": {"5": 5, "007": -5}}).status_code == 200


# -- charset and headers ----------------------------------------------------------------------------
def test_a_latin1_body_is_refused_with_a_415_naming_the_header(hostile: RunningServer) -> None:
    body = '{"model": "%s", "prompt": "caf\u00e9", "max_tokens": 2}' % MODEL_NAME
    r = httpx.post(hostile.url + "/v1/completions", content=body.encode("latin-1"),
                   headers={"content-type": "application/json; charset=latin-1"})
    assert r.status_code == 415, r.text
    assert "Content-Type" in _err(r)["message"] and "UTF-8" in _err(r)["message"]
    for declared in ("application/json; charset=utf-8", "application/json;charset=\"UTF-8\""):
        r = httpx.post(hostile.url + "/v1/completions", content=body.encode("utf-8"),
                       headers={"content-type": declared})
        assert r.status_code == 200, (declared, r.text)


@pytest.mark.parametrize("method,path", [("GET", "/"), ("GET", "/health"), ("GET", "/v1/models"),
                                         ("POST", "/v1/completions"), ("GET", "/nowhere")])
def test_every_answer_says_nosniff_and_no_framing(hostile: RunningServer, method: str, path: str) -> None:
    r = httpx.request(method, hostile.url + path, json={} if method == "POST" else None, timeout=30)
    assert r.headers["x-content-type-options"] == "nosniff", (path, r.headers)
    assert r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


# -- recursive schemas ------------------------------------------------------------------------------
RECURSIVE = {  # the probe's shape: a required property that is the schema itself
    "type": "object", "required": ["a", "b", "c", "d", "e", "f"],
    "properties": {k: {"$ref": "#"} for k in "abcdef"},
}


@pytest.mark.parametrize("schema,ref", [
    (RECURSIVE, "#"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}, "#/$defs/n"),
    ({"$defs": {"a": {"properties": {"b": {"$ref": "#/$defs/b"}}}, "b": {"items": {"$ref": "#/$defs/a"}}},
      "$ref": "#/$defs/a"}, "#/$defs/a"),
    ({"properties": {"x": {"$anchor": "node", "items": {"$ref": "#node"}}}}, "#node"),
    ({"$defs": {"a/b": {"items": {"$ref": "#/$defs/a~1b"}}}, "$ref": "#/$defs/a~1b"}, "#/$defs/a~1b"),
], ids=["root", "defs", "mutual", "anchor", "escaped-pointer"])
def test_recursive_refs_are_found(schema: dict[str, Any], ref: str) -> None:
    assert recursive_ref(schema) == ref


@pytest.mark.parametrize("schema", [
    {"$defs": {"s": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/s"}, "y": {"$ref": "#/$defs/s"}}},
    {"properties": {"x": {"type": "string"}, "y": {"$ref": "#/properties/x"}}},
    {"enum": [{"$ref": "#"}]},  # data, not a schema
    {"$ref": "https://example.com/other.json#"},
])
def test_schemas_without_recursion_pass(schema: dict[str, Any]) -> None:
    assert recursive_ref(schema) is None


def test_a_recursive_schema_is_a_quick_400_naming_the_field(hostile: RunningServer) -> None:
    base = baseline_latency(hostile.url)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "json"}], "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": RECURSIVE}}}
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        r = hostile.post("/v1/chat/completions", body)
        took.append(time.perf_counter() - t0)
        assert r.status_code == 400, r.text
        assert _err(r)["param"] == "response_format"
        assert _err(r)["message"].startswith("response_format.json_schema: recursive $ref is not supported")
    assert min(took) < 0.05 + base, (took, base)  # refused before the grammar engine sees it
