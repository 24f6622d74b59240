"""The OpenAI-compatible API through the official `openai` client: outputs equal `specdecode.generate`."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import specdecode
from specdecode.chat import PLAIN_TEMPLATE, ChatFormatter

from server_helpers import MODEL_NAME, Models, RunningServer

PROMPTS = ["def fib(n):", "class Point:\n    def", "def add(a, b):\n    return"]


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_model(server: RunningServer) -> None:
    ids = [m.id for m in client(server).models.list().data]
    assert ids == [MODEL_NAME]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_generate(server: RunningServer, models: Models, prompt: str) -> None:
    ref = specdecode.generate(models.target, prompt, max_new_tokens=20)
    r = client(server).completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0)
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.prompt_tokens == len(models.target.encode(prompt))
    spec = r.usage.model_extra["speculative"]
    # draft = target and speculation "always": every drafted token is accepted, so passes < tokens
    assert spec["drafted"] > 0 and spec["accepted"] == spec["drafted"]
    assert spec["target_passes"] < r.usage.completion_tokens
    assert sum(spec["drafted_by"].values()) == spec["drafted"] and sum(spec["accepted_by"].values()) == spec["accepted"]
    n_draft = sum(r.model_extra["specdecode"]["from_draft"])
    # accepted draft tokens after an EOS are counted as accepted but not emitted
    assert n_draft == spec["accepted"] if ref.finish_reason == "length" else 0 < n_draft <= spec["accepted"]


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_every_drafter_gives_the_same_greedy_text(server: RunningServer, models: Models, drafter: str) -> None:
    ref = specdecode.generate(models.target, PROMPTS[0], max_new_tokens=20)
    r = client(server).completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                          extra_body={"drafter": drafter, "gamma": 3})
    assert r.choices[0].text == ref.text
    if drafter == "none":
        assert r.usage.model_extra["speculative"]["drafted"] == 0


def test_token_id_prompt(server: RunningServer, models: Models) -> None:
    ids = models.target.encode(PROMPTS[1])
    ref = specdecode.generate(models.target, ids, max_new_tokens=12)
    r = client(server).completions.create(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0)
    assert r.choices[0].text == ref.text


def test_streaming_completion_equals_generate(server: RunningServer, models: Models) -> None:
    ref = specdecode.generate(models.target, PROMPTS[0], max_new_tokens=24)
    stream = client(server).completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                               stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [ref.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    pieces = [p for c in chunks if c.choices and c.choices[0].finish_reason is None
              for p in c.model_extra["specdecode"]["pieces"]]
    flags = [f for c in chunks if c.choices and c.choices[0].finish_reason is None
             for f in c.model_extra["specdecode"]["from_draft"]]
    assert "".join(pieces) == ref.text and len(flags) == len(pieces)
    assert any(flags) and not all(flags)  # accepted draft tokens and target tokens both appear


def test_stream_ends_with_done(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")


def test_chat_uses_the_plain_template_and_equals_generate(server: RunningServer, models: Models) -> None:
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib"}]
    prompt = ChatFormatter(PLAIN_TEMPLATE).render(messages)
    assert prompt == "System: You write Python.\nUser: def fib\nAssistant:"
    ref = specdecode.generate(models.target, prompt, max_new_tokens=16)
    c = client(server)
    r = c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.completion_tokens == len(ref.token_ids)
    chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_chat_template_from_tokenizer_config(tmp_path) -> None:
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    fmt = ChatFormatter.for_model(str(tmp_path))
    assert fmt.render([{"role": "user", "content": "hi"}]) == "<s><|user|>hi</s><|assistant|>"
    assert ChatFormatter.for_model(str(tmp_path / "missing")).source == PLAIN_TEMPLATE


def test_seeded_sampling_is_reproducible(server: RunningServer) -> None:
    c = client(server)
    kw = dict(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=1.0, seed=1234)
    a, b = c.completions.create(**kw), c.completions.create(**kw)
    other = c.completions.create(**{**kw, "seed": 99})
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].text != other.choices[0].text


def test_stop_string_cuts_the_text(server: RunningServer, models: Models) -> None:
    full = specdecode.generate(models.target, PROMPTS[0], max_new_tokens=30).text
    stop = next(full[i : i + 2] for i in range(3, len(full) - 2) if full[i : i + 2].isascii())
    ref = specdecode.generate(models.target, PROMPTS[0], max_new_tokens=30, stop=[stop])
    assert ref.finish_reason == "stop" and stop not in ref.text and len(ref.text) < len(full)
    r = client(server).completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=30, temperature=0,
                                          stop=[stop])
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == "stop"


def _metric(text: str, name: str) -> float:
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ") or
               ln.startswith(name + "{"))


def test_health_and_metrics(server: RunningServer) -> None:
    h = server.get("/health").json()
    assert h["status"] == "ok" and h["model"] == MODEL_NAME and h["active_rows"] == 0
    before = server.get("/metrics").text
    r = client(server).completions.create(model=MODEL_NAME, prompt="def", max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
    after = server.get("/metrics").text
    for name in ("specdecode_requests_total", "specdecode_generated_tokens_total", "specdecode_acceptance_rate",
                 "specdecode_mean_accepted_per_pass", "specdecode_acceptance_rate_by_position",
                 "specdecode_batch_size_bucket", "specdecode_queue_depth", "specdecode_time_to_first_token_seconds",
                 "specdecode_tokens_per_second", "specdecode_tokens_per_pass"):
        assert name in after, name
    spec = r.usage.model_extra["speculative"]

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    assert delta("specdecode_requests_total") == 1
    assert delta("specdecode_generated_tokens_total") == r.usage.completion_tokens == 8
    assert delta("specdecode_draft_tokens_total") == spec["drafted"] > 0
    assert delta("specdecode_accepted_tokens_total") == spec["accepted"]
    assert delta("specdecode_target_row_passes_total") == spec["target_passes"]
    assert 0 < _metric(after, "specdecode_acceptance_rate") <= 1


def test_seeded_sampling_equals_generate_with_the_same_drafter(server: RunningServer, models: Models) -> None:
    """With speculation "always" the server drafts and draws exactly as `generate` does (same order of
    draws from the request's own generator), so a seed reproduces `generate`'s sampled output."""
    ref = specdecode.generate(models.target, PROMPTS[1], specdecode.DraftModelDrafter(models.target, 4),
                              max_new_tokens=24, temperature=0.9, top_p=0.95, seed=7)
    c = client(server)
    kw = dict(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0.9, top_p=0.95, seed=7)
    assert c.completions.create(**kw).choices[0].text == ref.text


def test_chain_rule_extension_reaches_the_decode_request(server: RunningServer, models: Models) -> None:
    """``chain_rule`` (block by default, or token) is a per-request extension: validated, then carried
    to the core's Request; a seeded token-by-token request reproduces ``generate`` with that rule."""
    from specdecode.server.translate import build_specs
    from specdecode.server.protocol import CompletionRequest

    for given, expected in ((None, "block"), ("block", "block"), ("token", "token")):
        body = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 4, "temperature": 1.0, "chain_rule": given}
        req = CompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        assert build_specs(server.state, req, [1, 2], 4, None, "prompt", None, None)[0].verify.chain_rule == expected
    for given, expected in ((None, "auto"), ("rejection", "rejection"), ("coupled", "coupled")):
        body = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 4, "accept_rule": given}
        req = CompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        assert build_specs(server.state, req, [1, 2], 4, None, "prompt", None, None)[0].verify.accept_rule == expected
    # a seeded request defaults to the coupled rule; ask for rejection sampling to exercise the token chain rule
    ref = specdecode.generate(models.target, PROMPTS[1], specdecode.DraftModelDrafter(models.target, 4),
                              max_new_tokens=24, temperature=0.9, seed=7, chain_rule="token", accept_rule="rejection")
    r = client(server).completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0.9, seed=7,
                                          extra_body={"chain_rule": "token", "accept_rule": "rejection"})
    assert r.choices[0].text == ref.text
