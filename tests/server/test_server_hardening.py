"""Hardening from an outside probe: Host check without a key (DNS rebinding), the key from a file or the
environment, UTF-8-only bodies, no Content-Length with Transfer-Encoding, and error texts that read right."""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from specdecode.cli import build_parser
from specdecode.config import ConfigError, GenerationConfig, SamplingConfig, from_args
from specdecode.server.config import API_KEY_ENV, ServerConfig, resolve_api_key
from specdecode.server.hosts import HostCheck, host_name
from specdecode.server.metrics import ServerMetrics
from specdecode.server.scheduler import QueueFullError, Request, RequestHandle, Scheduler

from server_helpers import MODEL_NAME, Models, RunningServer, serve

OK = {"model": MODEL_NAME, "prompt": "def", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def keyless(models: Models) -> Iterator[RunningServer]:
    yield from serve(models, None, ServerConfig(max_batch_size=2, allowed_hosts="api.internal,Other.Example."),
                     drafter="ngram")


# -- Host header -----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["rebind.evil.example", "rebind.evil.example:8000", "localhost.evil.example",
                                  "127.0.0.1.nip.io"])
def test_a_keyless_server_refuses_a_foreign_host(keyless: RunningServer, host: str) -> None:
    for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/"), ("GET", "/health")):
        r = httpx.request(method, keyless.url + path, json=OK if method == "POST" else None, headers={"host": host},
                          timeout=30)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
        err = r.json()["error"]
        assert err["code"] == "host_not_allowed" and "--allowed-hosts" in err["message"], err


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:{port}", "127.0.0.1:{port}", "[::1]:{port}", "api.internal",
                                  "other.example:{port}"])
def test_a_keyless_server_answers_its_own_names_and_allowed_ones(keyless: RunningServer, host: str) -> None:
    port = keyless.url.rsplit(":", 1)[1]
    r = httpx.post(keyless.url + "/v1/completions", json=OK, headers={"host": host.format(port=port)}, timeout=30)
    assert r.status_code == 200, r.text


def test_host_rules_when_bound_to_every_address() -> None:
    check = HostCheck(lambda *a: None, bound_host="0.0.0.0", allowed=None)  # type: ignore[arg-type,return-value]
    assert check.allows("10.1.2.3:8000") and check.allows("[fe80::1]:80") and check.allows("localhost")
    assert not check.allows("rebind.evil.example")
    assert HostCheck(lambda *a: None, "127.0.0.1", "*").allows("anything.example")  # type: ignore[arg-type,return-value]
    assert not HostCheck(lambda *a: None, "127.0.0.1", None).allows("10.1.2.3")  # type: ignore[arg-type,return-value]
    assert host_name("[::1]:8000") == "::1" and host_name("Example.COM.:80") == "example.com"


def test_a_keyed_server_does_not_check_the_host(models: Models) -> None:
    for running in serve(models, None, ServerConfig(api_key="k3y", max_batch_size=1), drafter="ngram"):
        r = httpx.post(running.url + "/v1/completions", json=OK, timeout=30,
                       headers={"host": "api.example.com", "authorization": "Bearer k3y"})
        assert r.status_code == 200, r.text


# -- API key from a file or the environment --------------------------------------------------------

def _config(*flags: str) -> ServerConfig:
    return from_args(ServerConfig, build_parser().parse_args(["serve", *flags]))


def test_api_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert resolve_api_key(_config(), {}).api_key is None
    assert resolve_api_key(_config(), {API_KEY_ENV: "from-env\n"}).api_key == "from-env"
    f = tmp_path / "key"
    f.write_text("from-file\n")
    assert resolve_api_key(_config("--api-key-file", str(f)), {API_KEY_ENV: "from-env"}).api_key == "from-file"
    assert resolve_api_key(_config("--api-key", "flag"), {API_KEY_ENV: "from-env"}).api_key == "flag"
    with pytest.raises(ConfigError, match="not both"):
        resolve_api_key(_config("--api-key", "a", "--api-key-file", str(f)), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        resolve_api_key(_config("--api-key-file", str(tmp_path / "empty")), {})
    with pytest.raises(ConfigError, match="cannot read it"):
        resolve_api_key(_config("--api-key-file", str(tmp_path / "missing")), {})


# -- bodies and framing ----------------------------------------------------------------------------

@pytest.mark.parametrize("encoding,words", [
    ("utf-16", "UTF-16 or UTF-32"), ("utf-16-le", "UTF-16 or UTF-32"), ("utf-16-be", "UTF-16 or UTF-32"),
    ("utf-32", "UTF-16 or UTF-32"), ("utf-8-sig", "byte-order mark"),
])
def test_a_body_that_is_not_plain_utf8_is_refused(keyless: RunningServer, encoding: str, words: str) -> None:
    raw = json.dumps(OK).encode(encoding)
    r = httpx.post(keyless.url + "/v1/completions", content=raw, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and words in err["message"] and "UTF-8" in err["message"], err
    assert raw.startswith((codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in raw[:4]


def test_invalid_utf8_names_the_offset(keyless: RunningServer) -> None:
    raw = b'{"model":"' + MODEL_NAME.encode() + b'","prompt":"\xff"}'
    r = httpx.post(keyless.url + "/v1/completions", content=raw, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["error"]["message"], r.text


def _raw_request(url: str, head: bytes, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + body)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:  # the server closed the connection after answering
                break
            chunks.append(data)
    return b"".join(chunks)


def test_content_length_with_transfer_encoding_is_refused(keyless: RunningServer) -> None:
    body = json.dumps(OK).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    reply = _raw_request(keyless.url, head, chunked)
    status, _, rest = reply.partition(b"\r\n")
    assert b" 400 " in status, reply[:300]
    body_out = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body_out["error"]["code"] == "ambiguous_framing", body_out
    assert "Content-Length and Transfer-Encoding" in body_out["error"]["message"]


# -- messages that read right ----------------------------------------------------------------------

def test_queue_full_text_is_consistent_and_says_what_to_do(models: Models) -> None:
    sched = Scheduler(models.target, {}, max_batch_size=2, max_queue=3, metrics=ServerMetrics())  # not started

    async def fill() -> str:
        loop = asyncio.get_running_loop()
        spec = Request([1, 2, 3], SamplingConfig(temperature=0.0), GenerationConfig(max_new_tokens=2))
        for _ in range(5):  # 2 free rows + 3 queue places
            sched.submit(RequestHandle(spec, loop, 60))
        with pytest.raises(QueueFullError) as e:
            sched.submit(RequestHandle(spec, loop, 60))
        return str(e.value)

    msg = asyncio.run(fill())
    assert "it holds 5 requests (0 decoding, 5 waiting to start)" in msg, msg
    assert "2 decoding (--max-batch-size) plus 3 queued (--max-queue)" in msg and "retry" in msg, msg


def test_a_too_long_conversation_is_named_in_good_grammar(keyless: RunningServer) -> None:
    state = keyless.state
    chars = state.scheduler.context_len * state.max_token_chars
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "z" * chars}]}
    r = httpx.post(keyless.url + "/v1/chat/completions", json=body, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded", err
    assert err["message"].startswith("the conversation in messages has "), err
    assert "the messages has" not in err["message"]


def test_an_oversized_response_format_is_refused_before_compiling(keyless: RunningServer) -> None:
    from specdecode.server.translate import MAX_SCHEMA_ITEMS

    schema = {"enum": [[]] * (MAX_SCHEMA_ITEMS + 1)}
    body = {**OK, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = httpx.post(keyless.url + "/v1/completions", json=body, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "response_format", err
    assert f"more than {MAX_SCHEMA_ITEMS} items" in err["message"] and "simplify it" in err["message"], err
