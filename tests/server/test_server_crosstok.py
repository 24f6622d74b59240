"""The server batches cross-tokenizer drafting (drafters/crosstok.py): concurrent greedy requests with a draft
that has its own tokenizer give exactly `generate`'s plain output, and drafts are really accepted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

import specdecode
from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, Models, serve, start_server
from tiny import build_model, build_tokenizer

PROMPTS = [f"def f{i}(x{'y' * (i % 4)}):\n    return" if i % 2 else f"class C{i}:\n    def __init__(self"
           for i in range(8)]
BUNDLED = Path(__file__).resolve().parents[2] / "models"


async def _complete_all(url: str, max_tokens: list[int]) -> list[tuple[str, list[bool]]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(prompt: str, n: int) -> tuple[str, list[bool]]:
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0,
                                                 stream=True, extra_body={"drafter": "crosstok"})
        text, flags = "", []
        async for chunk in stream:
            text += chunk.choices[0].text
            flags += (chunk.model_extra or {}).get("specdecode", {}).get("from_draft", [])
        return text, flags

    try:
        return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, max_tokens)))
    finally:
        await client.close()


def _check(server_url: str, target: specdecode.Model, accepted_somewhere: bool) -> None:
    max_tokens = [10 + 3 * (i % 4) for i in range(len(PROMPTS))]
    refs = [specdecode.generate(target, p, max_new_tokens=n).text for p, n in zip(PROMPTS, max_tokens)]
    outs = asyncio.run(_complete_all(server_url, max_tokens))
    assert [t for t, _ in outs] == refs
    if accepted_somewhere:
        assert any(any(f) for _, f in outs)  # multi-token acceptance in batched steps really happened


def test_batched_greedy_with_another_tokenizer(models: Models, tmp_path: Path) -> None:
    d = build_model(tmp_path / "draft", "llama", seed=9, layers=1, hidden=32)
    build_tokenizer(d, vocab_size=280)
    draft = specdecode.load_model(d)
    assert draft.tokenizer.get_vocab() != models.target.tokenizer.get_vocab()
    with pytest.raises(specdecode.ConfigError, match="--drafter crosstok"):
        make_state(models.target, draft, ServerConfig(), default_drafter="model")
    for running in serve(models, draft, ServerConfig(max_batch_size=8, request_timeout=60, speculation="always"),
                         drafter="crosstok"):
        assert "model" not in running.state.scheduler.drafters  # it cannot use this draft; crosstok can
        _check(running.url, models.target, accepted_somewhere=False)


@pytest.mark.skipif(not (BUNDLED / "code-target" / "config.json").is_file(), reason="bundled models not present")
def test_batched_greedy_on_the_bundled_pair_accepts_drafts() -> None:
    target = specdecode.load_model(BUNDLED / "code-target")
    draft = specdecode.load_model(BUNDLED / "code-draft")  # through text: its tokenizer is not consulted as shared
    state = make_state(target, draft, ServerConfig(max_batch_size=8, request_timeout=120, speculation="always"),
                       default_drafter="crosstok", model_name=MODEL_NAME)
    running = start_server(state)
    try:
        _check(running.url, target, accepted_somewhere=True)
    finally:
        running.stop()
