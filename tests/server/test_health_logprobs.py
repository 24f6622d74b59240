"""`/health` stays fast while an ``n = 8``, ``top_logprobs = 20`` request runs (issue 49: it took 121-283 ms in
3 of 12 runs). Two things held the event loop: the whole answer's ~2 MB of JSON encoded in one call, and full
garbage collections (triggered by the answer's ~10^5 logprob dicts) walking every object the loaded model
made. The answer is now encoded in slices with the loop free between them, and serving freezes the startup
heap out of the collector's reach."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Iterator

import httpx
import pytest
from starlette.responses import JSONResponse

from specdecode.server.config import ServerConfig
from specdecode.server.relay import PIECE, SLICE_S, json_answer, json_pieces

from server_helpers import MODEL_NAME, HealthProbe, Models, RunningServer, baseline_latency, serve


def _entry(i: int) -> dict[str, Any]:
    return {"token": f"t\u00f6k\u2028{i}", "logprob": -1.2345678901234, "bytes": [116, 195, 182, 107]}


def _answer(choices: int = 8, tokens: int = 200) -> dict[str, Any]:
    """An n = 8 chat answer's shape with 20 alternatives a token (~2 MB of JSON)."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL_NAME,
            "choices": [{"index": c, "message": {"role": "assistant", "content": "x\"\n" * 80},
                         "logprobs": {"content": [{**_entry(t), "top_logprobs": [_entry(k) for k in range(20)]}
                                                  for t in range(tokens)]},
                         "finish_reason": "length"} for c in range(choices)],
            "usage": {"prompt_tokens": 5}, "specdecode": [{"drafted": 0}]}


@pytest.mark.parametrize("body", [_answer(), {}, {"a": []}, {"t": (1, 2.5, None, True)}, {1: "int key"},
                                  {"long": list(range(3 * PIECE + 1))}, {"deep": [[[[[[{"x": 1}]]]]]]}],
                         ids=["answer", "empty", "empty-list", "tuple", "int-key", "long-list", "deep"])
def test_the_pieces_are_jsonresponse_s_body_byte_for_byte(body: dict[Any, Any]) -> None:
    whole = JSONResponse(body).body
    assert "".join(json_pieces(body)).encode("utf-8") == whole
    got = asyncio.run(json_answer(body))
    assert got.body == whole and got.media_type == "application/json"


def test_no_piece_encodes_more_than_a_slice_of_the_answer() -> None:
    body = _answer()
    pieces = list(json_pieces(body))
    total = sum(map(len, pieces))
    assert total > 1_000_000
    assert max(map(len, pieces)) < total / 20  # one piece: at most PIECE entries, not a choice or the whole


def test_a_nan_is_refused_as_jsonresponse_refuses_it() -> None:
    for body in ({"x": float("nan")}, {"x": [float("inf")] * (PIECE + 5)}):
        with pytest.raises(ValueError):
            JSONResponse(body)
        with pytest.raises(ValueError):
            asyncio.run(json_answer(body))


def test_the_loop_runs_other_tasks_while_a_big_answer_is_encoded() -> None:
    """One encoder call over the answer would let nothing run until it ends (no tick)."""

    async def measure() -> tuple[int, float]:
        ticks, done = 0, False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                await asyncio.sleep(0)
                ticks += 1

        body = _answer()
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        start = time.perf_counter()
        await json_answer(body)
        elapsed = time.perf_counter() - start
        done = True
        await task
        return ticks, elapsed

    ticks, elapsed = asyncio.run(measure())
    assert ticks >= min(3, int(elapsed / SLICE_S) - 1), (ticks, elapsed)


@pytest.fixture(scope="module")
def lp_server(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, models.target, ServerConfig(max_batch_size=8, max_queue=16, request_timeout=120))


def test_serving_keeps_the_startup_heap_out_of_full_collections(lp_server: RunningServer) -> None:
    assert gc.get_freeze_count() > 0  # frozen at startup (unfrozen at shutdown, so a test process can collect)


def test_health_stays_fast_beside_n8_top_logprobs_20(lp_server: RunningServer) -> None:
    """Whole answers (the big JSON, the full collections their dicts trigger) and a stream, each 8 x 200
    tokens with 20 alternatives; /health polled all the while."""
    base = baseline_latency(lp_server.url)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "count the vowels"}], "n": 8,
            "logprobs": True, "top_logprobs": 20, "max_tokens": 200, "ignore_eos": True, "temperature": 0.8}
    with HealthProbe(lp_server.url) as probe, httpx.Client(timeout=120) as c:
        time.sleep(0.05)
        for k, stream in enumerate((False, False, False, True)):
            r = c.post(lp_server.url + "/v1/chat/completions", json={**body, "seed": k, "stream": stream})
            assert r.status_code == 200, r.text[:300]
            if not stream:
                choices = r.json()["choices"]
                assert [len(ch["logprobs"]["content"]) for ch in choices] == [200] * 8
                assert all(len(e["top_logprobs"]) == 20 for ch in choices for e in ch["logprobs"]["content"])
        time.sleep(0.05)
    assert probe.latencies and max(probe.latencies) <= 0.1 + base, (sorted(probe.latencies)[-3:], base)
