"""A client's explicit ``gamma`` is honoured under the cost-based policy (issue 30: it once was only a cap)."""

from __future__ import annotations

import openai
import pytest

from server_helpers import MODEL_NAME, RunningServer


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.slow  # a server of its own: ~10 s
def test_explicit_gamma_drafts_even_where_the_policy_would_not(auto_server: RunningServer) -> None:
    c = client(auto_server)
    for _ in range(3):  # junk first: the random draft's rejections must not switch a client's gamma off
        c.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2, temperature=0, extra_body={"drafter": "model"})
    r = c.completions.create(model=MODEL_NAME, prompt="def fib(n):", max_tokens=24, temperature=0,
                             extra_body={"drafter": "model", "gamma": 4})
    spec = r.usage.model_extra["speculative"]
    passes = spec["target_passes"]
    assert spec["drafted"] >= 4 * (passes - 5), spec  # gamma tokens each pass, fewer where the budget ends
