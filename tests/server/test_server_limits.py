"""Request handling off the hot path: body limit (413), early context check, tokenising off the loop."""

from __future__ import annotations

import statistics
import time
from typing import Iterator

import httpx
import pytest

from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, HealthProbe, Models, RunningServer, baseline_latency, serve


@pytest.fixture(scope="module")
def limited(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(max_batch_size=2), drafter="ngram")  # default 4 MB limit


def test_a_10mb_body_gets_a_quick_413_and_health_stays_fast(limited: RunningServer) -> None:
    base = baseline_latency(limited.url)
    body = b'{"model": "' + MODEL_NAME.encode() + b'", "prompt": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    with HealthProbe(limited.url) as probe:
        time.sleep(0.1)
        with httpx.Client(timeout=30) as c:
            t0 = time.perf_counter()
            r = c.post(limited.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            took = time.perf_counter() - t0
        time.sleep(0.1)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "body_too_large" and "--max-body-bytes" in r.json()["error"]["message"]
    assert took <= 0.5 + base, took
    assert probe.latencies and max(probe.latencies) <= 0.1 + base, (max(probe.latencies), base)


def test_a_chunked_body_over_the_limit_gets_a_413(limited: RunningServer) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body arrives
        yield b'{"model": "' + MODEL_NAME.encode() + b'", "prompt": "'
        for _ in range(80):
            yield b"y" * 65536
        yield b'"}'

    r = httpx.post(limited.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert limited.get("/health").json()["status"] == "ok"


def test_a_body_under_the_limit_still_works(limited: RunningServer) -> None:
    r = limited.post("/v1/completions", {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2, "user": "u" * 100_000})
    assert r.status_code == 200, r.text


def test_a_prompt_too_long_for_the_window_is_refused_before_tokenising(limited: RunningServer) -> None:
    state = limited.state
    chars = state.scheduler.context_len * state.max_token_chars
    assert 0 < chars < 3_000_000
    t0 = time.perf_counter()
    r = limited.post("/v1/completions", {"model": MODEL_NAME, "prompt": "z" * chars})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt" and "context window" in r.json()["error"]["message"]
    assert time.perf_counter() - t0 < 5  # tokenising would take far longer on a busy machine; this is a sanity cap


@pytest.mark.slow
def test_tokenising_a_huge_prompt_does_not_block_health(models: Models) -> None:
    """Without the early check (max_token_chars = 0) a 3 MB prompt is tokenised for seconds: off the loop."""
    for running in serve(models, None, ServerConfig(max_batch_size=2, max_body_bytes=16 * 1024 * 1024),
                         drafter="ngram"):
        running.state.max_token_chars = 0
        base = baseline_latency(running.url)
        prompt = "def fib(n): return n " * 150_000  # ~3 MB, about a million tokens
        with HealthProbe(running.url) as probe:
            t0 = time.perf_counter()
            r = running.post("/v1/completions", {"model": MODEL_NAME, "prompt": prompt})
            took = time.perf_counter() - t0
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert len(probe.latencies) >= 5, (took, probe.latencies)  # health answered all along
        # on the loop, tokenising blocked /health for the whole ~10 s; a single C call (json.loads of the body,
        # the list of a million ids) still holds the GIL for a moment, hence the looser bound on the worst one
        assert statistics.median(probe.latencies) <= 0.1 + base and max(probe.latencies) <= 1.0 + base, \
            (took, sorted(probe.latencies)[-5:], base)


def test_max_body_bytes_is_validated() -> None:
    from specdecode.config import ConfigError

    with pytest.raises(ConfigError, match="max_body_bytes"):
        ServerConfig(max_body_bytes=10)
    with pytest.raises(ConfigError, match="drain_timeout"):
        ServerConfig(drain_timeout=-1)
