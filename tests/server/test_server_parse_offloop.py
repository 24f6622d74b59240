"""Bodies just under the 4 MiB limit that hold millions of tiny JSON items (token ids, chat messages)
are refused from cheap bounds before json.loads and validation, so /health stays under 100 ms."""

from __future__ import annotations

import json
import time
from typing import Iterator

import httpx
import pytest

from specdecode.server.config import ServerConfig
from specdecode.server.guard import BadBody, check_item_count

from server_helpers import MODEL_NAME, HealthProbe, Models, RunningServer, baseline_latency, serve

LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def limited(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(max_batch_size=2), drafter="ngram")  # default 4 MiB limit


def _ids_body(n: int) -> bytes:
    return b'{"model":"' + MODEL_NAME.encode() + b'","prompt":[' + b",".join([b"17"] * n) + b'],"max_tokens":1}'


def _messages_body(n: int) -> bytes:
    return json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}] * n}).encode()


@pytest.mark.parametrize("kind", ["ids", "messages"])
def test_a_body_of_millions_of_items_is_refused_and_health_stays_fast(limited: RunningServer, kind: str) -> None:
    body = _ids_body(1_390_000) if kind == "ids" else _messages_body(115_000)
    assert len(body) < LIMIT
    path = "/v1/completions" if kind == "ids" else "/v1/chat/completions"
    base = baseline_latency(limited.url)
    with HealthProbe(limited.url) as probe:
        time.sleep(0.1)
        with httpx.Client(timeout=30) as c:
            r = c.post(limited.url + path, content=body, headers={"content-type": "application/json"})
        time.sleep(0.1)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "too_many_items" and "context window" in err["message"], err
    assert "shorten the prompt or send fewer messages" in err["message"]
    assert probe.latencies and max(probe.latencies) <= 0.1 + base, (sorted(probe.latencies)[-3:], base)


@pytest.mark.parametrize("kind", ["ids", "messages"])
def test_too_many_ids_or_messages_under_the_item_bound_are_refused_before_validation(
        limited: RunningServer, kind: str) -> None:
    ctx = limited.state.scheduler.context_len
    body = _ids_body(ctx + 5) if kind == "ids" else _messages_body(ctx)
    path = "/v1/completions" if kind == "ids" else "/v1/chat/completions"
    r = httpx.post(limited.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded", err
    assert err["param"] == ("prompt" if kind == "ids" else "messages") and str(ctx) in err["message"], err


def test_item_count_ignores_commas_and_quotes_inside_strings() -> None:
    text = json.dumps({"prompt": 'a, "b", \\, ' * 10_000}).encode()  # 30k commas, all inside one string
    check_item_count(text, 1000, "why")
    with pytest.raises(BadBody, match="more than 1000 JSON items"):
        check_item_count(json.dumps(list(range(2000))).encode(), 1000, "why")
    with pytest.raises(BadBody, match="more than 1000 JSON items"):
        check_item_count(json.dumps(["a,"] * 2100).encode(), 1000, "why")  # many strings: refused by their count
