"""OpenAI parity on the real server: response_format, logit_bias, logprobs/top_logprobs, n > 1, and
``chat_template.jinja``; streaming and not, with speculation (``server``: self-speculation with the
full γ, so drafts are accepted and verified in chains) and the official ``openai`` client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from specdecode.chat import ChatFormatter
from specdecode.server.choices import choice_seed

from server_helpers import MODEL_NAME, RunningServer
from tiny import build_model

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "tag", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
PROMPT = "def f(x):\n    return"


def _stream(server: RunningServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert all("error" not in c for c in chunks), chunks
    return chunks


def _texts(chunks: list[dict[str, Any]], key: str = "text") -> dict[int, str]:
    out: dict[int, str] = {}
    for c in chunks:
        for ch in c["choices"]:
            piece = ch[key] if key == "text" else ch["delta"].get("content", "")
            out[ch["index"]] = out.get(ch["index"], "") + piece
    return out


# -- response_format --------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=3)])
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_outputs_are_valid_with_speculation(server: RunningServer, sampling: dict[str, Any],
                                                        stream: bool) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "a thing"}], "max_tokens": 60,
            "response_format": FORMAT, **sampling}
    if stream:
        chunks = _stream(server, "/v1/chat/completions", body)
        text = _texts(chunks, "delta")[0]
        reason = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]][0]
        drafted = sum(1 for c in chunks for f in c.get("specdecode", {}).get("from_draft", []) if f)
    else:
        r = server.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        text, reason = r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"]
        drafted = sum(r.json()["specdecode"]["from_draft"])
    assert reason == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert drafted > 0  # speculation was on: accepted draft tokens went into the output


def test_json_object_starts_an_object_and_text_is_plain(server: RunningServer) -> None:
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                        "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["text"].startswith("{")
    if ch["finish_reason"] == "stop":
        assert isinstance(json.loads(ch["text"]), dict)
    plain = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8,
                                            "temperature": 0, "response_format": {"type": "text"}})
    ref = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert plain.json()["choices"][0]["text"] == ref.json()["choices"][0]["text"]


@pytest.mark.parametrize("fmt,words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
     "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"\ud800": 1}}}, "response_format"),
])
def test_bad_response_format_is_a_400_naming_it(server: RunningServer, fmt: dict[str, Any], words: str) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "response_format": fmt}
    r = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body).encode(),  # ASCII: lone surrogates
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("response_format") and words in err["message"], err
    assert "Traceback" not in err["message"] and "File \"" not in err["message"]


def test_response_format_with_ignore_eos_is_refused(server: RunningServer) -> None:
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "ignore_eos": True,
                                        "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos"


# -- logit_bias -------------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter", ["none", "model"])
def test_logit_bias_forces_a_token_on_target_and_draft(server: RunningServer, drafter: str) -> None:
    chunks = _stream(server, "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12,
                                                 "temperature": 0, "drafter": drafter, "ignore_eos": True,
                                                 "logit_bias": {"77": 100}})
    ids = [t for c in chunks for t in c.get("specdecode", {}).get("token_ids", [])]
    assert ids == [77] * 12
    if drafter == "model":  # the draft was biased too: it proposed 77 and the target accepted it
        assert any(f for c in chunks for f in c.get("specdecode", {}).get("from_draft", []))


@pytest.mark.parametrize("bias,words", [({"abc": 1}, "token ids"), ({"5": 1000}, "[-100, 100]"),
                                        ({"99999": 1}, "outside the vocabulary"), ({"5": "x"}, "numbers"),
                                        ({"5": True}, "numbers"), ({"5": 10**400}, "numbers")])
def test_bad_logit_bias_is_a_400_naming_it(server: RunningServer, bias: dict[str, Any], words: str) -> None:
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and words in err["message"], err


# -- logprobs -------------------------------------------------------------------------------------------
def _completion_logprobs(server: RunningServer, drafter: str, **kw: Any) -> dict[str, Any]:
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
                                        "logprobs": 3, "drafter": drafter, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.8, seed=11, top_k=50)])
def test_completion_logprobs_are_equal_with_and_without_speculation(server: RunningServer,
                                                                    sampling: dict[str, Any]) -> None:
    plain, spec = _completion_logprobs(server, "none", **sampling), _completion_logprobs(server, "model", **sampling)
    assert plain["text"] == spec["text"]
    a, b = plain["logprobs"], spec["logprobs"]
    assert set(a) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"] and len(a["tokens"]) == 12
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-4)
    for ta, tb in zip(a["top_logprobs"], b["top_logprobs"]):
        assert list(ta) == list(tb) and list(ta.values()) == pytest.approx(list(tb.values()), abs=1e-4)
        assert 1 <= len(ta) <= 3
    assert "".join(a["tokens"]) == plain["text"]  # ASCII tokens: token texts concatenate to the text
    assert a["text_offset"][0] == 0
    if sampling["temperature"] == 0:  # greedy: the chosen token is the most likely one
        assert a["token_logprobs"] == pytest.approx([max(t.values()) for t in a["top_logprobs"]], abs=1e-6)


def test_completion_logprobs_stream_equal_non_stream(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "logprobs": 2,
            "temperature": 0}
    whole = server.post("/v1/completions", body).json()["choices"][0]["logprobs"]
    parts = [ch["logprobs"] for c in _stream(server, "/v1/completions", body) for ch in c["choices"]
             if ch["logprobs"] is not None]
    merged = {k: [x for p in parts for x in p[k]] for k in whole}
    assert merged == whole


def test_chat_logprobs_shape_and_openai_client(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=4, extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 8
    # raw token bytes join up into the text, also where a token is part of a multi-byte character
    assert b"".join(bytes(c.bytes or []) for c in content).decode(errors="replace") == r.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 4 and c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)
        if "\ufffd" not in c.token:
            assert c.bytes == list(c.token.encode())
    plain = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=4,
                                           extra_body={"ignore_eos": True, "drafter": "none"})  # type: ignore[arg-type]
    assert [c.logprob for c in content] == pytest.approx(
        [c.logprob for c in plain.choices[0].logprobs.content], abs=1e-4)  # type: ignore[union-attr]
    stream = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=4, stream=True,
                                            extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    streamed = [c for chunk in stream for ch in chunk.choices if ch.logprobs and ch.logprobs.content
                for c in ch.logprobs.content]
    assert [c.model_dump() for c in streamed] == [c.model_dump() for c in content]
    comp = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == len(lp.token_logprobs or []) == len(lp.text_offset or [])
    no = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=3)
    assert no.choices[0].logprobs is None


def test_top_logprobs_without_logprobs_is_refused(server: RunningServer) -> None:
    r = server.post("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                                             "top_logprobs": 3})
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


# -- n > 1 ----------------------------------------------------------------------------------------------
def test_n_choices_are_seeded_rows(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "temperature": 1.0,
            "seed": 42}
    r = server.post("/v1/completions", {**body, "n": 3})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    texts = [c["text"] for c in choices]
    assert len(set(texts)) == 3  # distinct seeds: the choices differ
    for i in range(3):  # choice i is the single-choice request with seed + i
        alone = server.post("/v1/completions", {**body, "seed": 42 + i}).json()["choices"][0]["text"]
        assert alone == texts[i]
    assert r.json()["usage"]["completion_tokens"] == 30
    assert server.post("/v1/completions", {**body, "n": 3}).json()["choices"] == choices  # reproduces
    streamed = _texts(_stream(server, "/v1/completions", {**body, "n": 3,
                                                          "stream_options": {"include_usage": True}}))
    assert [streamed[i] for i in range(3)] == texts


def test_n_chat_stream_carries_index_and_summed_usage(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "ignore_eos": True, "temperature": 0, "n": 2, "stream_options": {"include_usage": True}}
    chunks = _stream(server, "/v1/chat/completions", body)
    texts = _texts(chunks, "delta")
    assert sorted(texts) == [0, 1] and texts[0] == texts[1]  # greedy: both choices alike
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    finishes = [ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert sorted(finishes) == [0, 1]


@pytest.mark.parametrize("n,status", [(9, 400), (0, 400), (True, 400), (2.0, 400), (17, 400)])
def test_bad_n_is_a_400_naming_it(server: RunningServer, n: Any, status: int) -> None:
    r = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": n})
    assert r.status_code == status and r.json()["error"]["param"] == "n"


def test_choice_seed_wraps_into_torch_range() -> None:
    assert choice_seed(None, 3) is None and choice_seed(7, 2) == 9 and choice_seed(-5, 1) == -4
    assert choice_seed(2**64 - 1, 1) == 0  # wraps past the largest seed torch takes


# -- chat_template.jinja --------------------------------------------------------------------------
def test_chat_template_jinja_beats_tokenizer_config(tmp_path: Path) -> None:
    d = build_model(tmp_path / "m", "llama", layers=1, hidden=32)
    cfg_file = d / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    cfg["chat_template"] = "CONFIG{% for m in messages %}{{ m['content'] }}{% endfor %}"
    cfg_file.write_text(json.dumps(cfg))
    msgs = [{"role": "user", "content": "hi"}]
    assert ChatFormatter.for_model(str(d)).render(msgs) == "CONFIGhi"
    (d / "chat_template.jinja").write_text("JINJA{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                                           "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    assert ChatFormatter.for_model(str(d)).render(msgs) == "JINJA<user>hi<assistant>"
