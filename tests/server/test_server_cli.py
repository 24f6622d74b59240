"""`specdecode serve` as a user runs it: flags, model loading, a request, and SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

import specdecode
from specdecode.cli import build_parser

from server_helpers import Models


def test_serve_flags_come_from_the_server_config() -> None:
    args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "ngram", "--max-batch-size", "3",
                                      "--api-key", "k", "--request-timeout", "5", "--speculation", "always"])
    assert (args.host, args.port, args.max_batch_size, args.api_key, args.request_timeout, args.speculation) == \
        ("127.0.0.1", 8000, 3, "k", 5.0, "always")


def test_bad_server_flag_is_a_one_line_error(capsys) -> None:  # type: ignore[no-untyped-def]
    from specdecode.cli import main

    assert main(["serve", "--target", "nowhere", "--drafter", "none", "--max-batch-size", "0"]) == 2
    assert "max_batch_size must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_subprocess_answers_then_shuts_down_on_sigterm(models: Models) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--target", str(models.target_dir), "--drafter", "ngram",
           "--port", str(port), "--max-batch-size", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        body = {"model": models.target_dir.name, "prompt": "def fib(n):", "max_tokens": 10, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        expected = specdecode.generate(models.target, "def fib(n):", max_new_tokens=10).text
        assert r.json()["choices"][0]["text"] == expected
        # SIGTERM mid-stream: the running request still ends normally, then the process exits
        stream_body = {**body, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=stream_body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
        # uvicorn re-raises the signal after its graceful shutdown, so -SIGTERM is a clean exit too
        assert proc.wait(30) in (0, -signal.SIGTERM)
        assert b"Traceback" not in (proc.stderr.read() if proc.stderr else b"")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
