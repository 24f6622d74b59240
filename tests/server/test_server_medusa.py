"""Medusa trees under continuous batching: 4 and 8 concurrent greedy streams, rows of trees padded
together, give exactly what ``generate`` gives alone; the chain variant too."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import openai
import pytest

import specdecode
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from medusa_util import make_heads
from pricing import FREE
from server_helpers import MODEL_NAME, Models, RunningServer, start_server
from test_server_api import _metric

PROMPTS = [f"def f{i}(x{'y' * (i % 4)}):\n    return" if i % 2 else f"class C{i}:\n" for i in range(8)]


@pytest.fixture(scope="module")
def heads(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_heads(tmp_path_factory.mktemp("medusa") / "heads", models.target.config.dim, models.target.vocab_size)


@pytest.fixture(scope="module")
def medusa_server(models: Models, heads: Path) -> Iterator[RunningServer]:
    """Free tree nodes (flat costs, the server's pricer), so every step verifies a tree of up to 6 nodes per row."""
    state = make_state(models.target, None, ServerConfig(max_batch_size=8, max_queue=16, request_timeout=60,
                                                         speculation="always"),
                       default_drafter="medusa", default_gamma=6, model_name=MODEL_NAME,
                       artifacts={"medusa": str(heads)}, pricer=FREE)
    running = start_server(state)
    try:
        yield running
    finally:
        running.stop()


async def _stream_all(url: str, max_tokens: list[int], drafter: str) -> list[tuple[str, list[bool]]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(prompt: str, n: int) -> tuple[str, list[bool]]:
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0,
                                                 stream=True, extra_body={"drafter": drafter})
        text, flags = "", []
        async for chunk in stream:
            text += chunk.choices[0].text
            if chunk.choices[0].finish_reason is None:
                flags += chunk.model_extra["specdecode"].get("from_draft", [])
        return text, flags

    try:
        return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, max_tokens)))
    finally:
        await client.close()


@pytest.mark.parametrize(("drafter", "streams"), [("medusa", 4), ("medusa", 8), ("medusa-chain", 8)])
def test_concurrent_medusa_streams_equal_generate(drafter: str, streams: int, models: Models,
                                                  medusa_server: RunningServer) -> None:
    # rows finish at different steps: trees of different rows, and batches narrowing as rows leave
    max_tokens = [16 + 5 * (i % 4) for i in range(streams)]
    refs = [specdecode.generate(models.target, p, max_new_tokens=n).text for p, n in zip(PROMPTS, max_tokens)]
    before = medusa_server.get("/metrics").text
    outs = asyncio.run(_stream_all(medusa_server.url, max_tokens, drafter))
    after = medusa_server.get("/metrics").text
    assert [t for t, _ in outs] == refs
    bucket = 'specdecode_batch_size_bucket{le="1.0"}'
    singles = _metric(after, bucket) - _metric(before, bucket)
    steps = _metric(after, "specdecode_batch_size_count") - _metric(before, "specdecode_batch_size_count")
    assert steps > 0 and singles < steps  # rows shared batched passes
    assert sum(sum(f) for _, f in outs) > 0  # draft tokens were accepted inside batched tree passes
    core = medusa_server.state.scheduler.core
    d = core.drafters[drafter]
    assert d.tree == (drafter == "medusa") and d.last_plan.paths
    assert medusa_server.get("/health").json()["active_rows"] == 0
