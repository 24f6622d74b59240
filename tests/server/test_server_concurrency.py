"""Continuous batching: 16 concurrent streams give exactly their single-request outputs."""

from __future__ import annotations

import asyncio

import openai
import pytest

import specdecode

from server_helpers import MODEL_NAME, Models, RunningServer
from test_server_api import _metric

PROMPTS = [f"def f{i}(x{'y' * (i % 4)}):\n    return" if i % 2 else f"class C{i}:\n" for i in range(16)]


async def _stream_all(url: str, max_tokens: list[int]) -> list[tuple[str, list[bool]]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(prompt: str, n: int) -> tuple[str, list[bool]]:
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0,
                                                 stream=True)
        text, flags = "", []
        async for chunk in stream:
            text += chunk.choices[0].text
            flags += chunk.model_extra["specdecode"].get("from_draft", []) if chunk.choices[0].finish_reason is None \
                else []
        return text, flags

    try:
        return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, max_tokens)))
    finally:
        await client.close()


@pytest.mark.parametrize("which", ["server", "auto_server"])
def test_16_concurrent_streams_equal_single_requests(which: str, models: Models,
                                                     request: pytest.FixtureRequest) -> None:
    server: RunningServer = request.getfixturevalue(which)
    # different lengths, so requests finish at different steps and rows are freed and compacted mid-batch
    max_tokens = [12 + 3 * (i % 5) for i in range(16)]
    refs = [specdecode.generate(models.target, p, max_new_tokens=n).text for p, n in zip(PROMPTS, max_tokens)]
    before = server.get("/metrics").text
    outs = asyncio.run(_stream_all(server.url, max_tokens))
    after = server.get("/metrics").text
    assert [t for t, _ in outs] == refs
    assert _metric(after, "specdecode_requests_total") - _metric(before, "specdecode_requests_total") == 16
    bucket = 'specdecode_batch_size_bucket{le="1.0"}'
    singles = _metric(after, bucket) - _metric(before, bucket)
    steps = _metric(after, "specdecode_batch_size_count") - _metric(before, "specdecode_batch_size_count")
    assert steps > 0 and singles < steps  # requests really shared batched forwards
    assert server.get("/health").json()["active_rows"] == 0
    if which == "server":  # self-speculation: drafts were accepted inside batched passes
        assert any(any(f) for _, f in outs)
