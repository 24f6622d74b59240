"""Layer-skip drafting in the server: concurrent greedy requests, batched in one core, give exactly the
single-request outputs of plain decoding, and drafts are accepted inside batched passes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import openai
import pytest
import torch

import specdecode
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from server_helpers import RunningServer, start_server
from tiny import build_model

PROMPTS = [f"def f{i}(x):\n    return" if i % 2 else f"class C{i}:\n" for i in range(6)]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> specdecode.Model:
    """A 4-layer target whose layers 2 and 3 are the identity: the early exit after layer 2 computes exactly
    what the target computes, so drafts are accepted and multi-token verification runs in batches."""
    m = specdecode.load_model(build_model(Path(tmp_path_factory.mktemp("ls")) / "t", "llama", seed=7, layers=4))
    with torch.no_grad():
        for i in (2, 3):
            m.module.layers[i].wo.zero_()
            m.module.layers[i].w2.zero_()
    return m


@pytest.fixture(scope="module")
def server(target: specdecode.Model) -> Iterator[RunningServer]:
    config = ServerConfig(max_batch_size=4, max_queue=16, request_timeout=60, speculation="always")
    running = start_server(make_state(target, None, config, default_drafter="layerskip", default_gamma=3,
                                      model_name="tiny", options={"exit_layer": 2}))
    try:
        yield running
    finally:
        running.stop()


async def _complete_all(url: str, max_tokens: list[int]) -> list[tuple[str, int]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(prompt: str, n: int) -> tuple[str, int]:
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0, stream=True)
        text, accepted = "", 0
        async for chunk in stream:
            text += chunk.choices[0].text
            accepted += sum(chunk.model_extra["specdecode"].get("from_draft", []))
        return text, accepted

    try:
        return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, max_tokens)))
    finally:
        await client.close()


def test_concurrent_layerskip_requests_equal_plain(server: RunningServer, target: specdecode.Model) -> None:
    max_tokens = [10 + 4 * i for i in range(len(PROMPTS))]  # rows finish at different steps and are compacted
    refs = [specdecode.generate(target, p, max_new_tokens=n).text for p, n in zip(PROMPTS, max_tokens)]
    outs = asyncio.run(_complete_all(server.url, max_tokens))
    assert [t for t, _ in outs] == refs
    assert sum(a for _, a in outs) > sum(max_tokens) // 3  # the exact early exit's drafts were accepted
    assert server.get("/health").json()["active_rows"] == 0
