"""Property: no generated request body gets a 5xx or internal exception text (Hypothesis, ≥ 500 bodies).

Bodies mix the real fields with random JSON values, unknown keys, lone surrogates and
nesting, on both POST endpoints. A small context window keeps any body that happens to be
valid quick to answer.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specdecode.server.config import ServerConfig  # noqa: E402

from server_helpers import MODEL_NAME, Models, RunningServer, serve  # noqa: E402
from test_server_hostile import check_error_response  # noqa: E402

pytestmark = pytest.mark.slow  # full tier: make test-full

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "stop", "seed", "n", "stream", "stream_options", "drafter", "gamma", "chain_rule", "ignore_eos",
          "logprobs", "top_logprobs", "tools", "tool_choice", "response_format", "logit_bias", "echo", "suffix",
          "best_of", "presence_penalty", "frequency_penalty", "user", "metadata"]

text = st.one_of(st.text(max_size=12), st.sampled_from([MODEL_NAME, "def", "ngram", "none", "model", "block",
                                                        "token", "user", "text", "\ud800", "a\udfffb", ""]))
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.integers(-3, 40),
                    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0, 1, 2, 2**63, 2**64, -1]))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(text, inner, max_size=4)), max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
                                optional={"content": st.one_of(text, values,
                                                               st.lists(st.fixed_dictionaries(
                                                                   {"type": st.just("text"), "text": text})))})
field_value = {
    "model": st.one_of(st.just(MODEL_NAME), values),
    "prompt": st.one_of(text, st.lists(st.integers(-5, 400), max_size=8), st.lists(text, max_size=2), values),
    "messages": st.one_of(st.lists(message, min_size=1, max_size=3), values),
    "max_tokens": st.one_of(st.integers(-2, 4), values),
    "max_completion_tokens": st.one_of(st.integers(-2, 4), values),
    "stream": st.one_of(st.booleans(), values),
    # honoured fields: near-valid shapes reach the schema compiler, the bias parser and the row bound
    "response_format": st.one_of(values, st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "json_object",
                                                                                         "text"])},
                                                               optional={"json_schema": st.fixed_dictionaries(
                                                                   {"name": text}, optional={"schema": values})})),
    "logit_bias": st.one_of(values, st.dictionaries(st.one_of(text, st.integers(-5, 400).map(str)), numbers,
                                                    max_size=4)),
    "n": st.one_of(st.integers(-1, 10), values),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 25), values),
    "top_logprobs": st.one_of(st.integers(-1, 25), values),
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    if draw(st.integers(0, 9)) == 0:  # now and then: any JSON at all
        return path, json.dumps(draw(values)).encode("utf-8", "surrogatepass")
    keys = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=8))
    body: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 2}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "def"
    for k in keys:
        body[k] = draw(field_value.get(k, values))
    if draw(st.booleans()):
        body[draw(text)] = draw(values)  # an unknown (or odd) key
    return path, json.dumps(body).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def fuzz_server(models: Models) -> Iterator[RunningServer]:
    # a 48-token window: a valid body generates at most a few dozen tokens
    yield from serve(models, None, ServerConfig(max_batch_size=4, max_queue=64, request_timeout=30, max_context=48),
                     drafter="ngram")


@pytest.fixture(scope="module")
def http(fuzz_server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.url, timeout=30, headers={"content-type": "application/json"}) as c:
        yield c


SEEN: list[int] = []


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(req=bodies())
def test_no_generated_body_gets_a_5xx(http: httpx.Client, req: tuple[str, bytes]) -> None:
    path, raw = req
    r = http.post(path, content=raw)
    SEEN.append(r.status_code)
    assert r.status_code < 500, (raw[:300], r.text[:300])
    if r.status_code >= 400:
        check_error_response(r)
    else:
        assert r.status_code == 200


def test_the_fuzz_sent_enough_and_the_server_is_fine(http: httpx.Client) -> None:
    assert len(SEEN) >= 500
    assert any(c == 200 for c in SEEN) and any(c == 400 for c in SEEN)  # it explored both sides
    h = http.get("/health").json()
    assert h["status"] == "ok" and h["active_rows"] == 0
