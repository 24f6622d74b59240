"""The server with the `openai` client: start `specdecode serve`, send a completion and a streamed one.

    python examples/server_client.py                      # starts a server on the bundled code pair, then stops it
    python examples/server_client.py --target smollm2-135m-instruct --chat --prompt "Name three primes."
    python examples/server_client.py --url http://127.0.0.1:8000   # a server you started yourself

The server speaks OpenAI's API, so any OpenAI client works; each response's ``usage`` also carries
``speculative``: how many tokens were drafted and accepted, per drafter. `openai` is in the dev extra
(`pip install openai` otherwise).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(target: Optional[str], timeout: float = 180.0) -> Iterator[str]:
    """A `specdecode serve` child on a free local port until the block ends; yields its URL once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--port", str(port)]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen(cmd + (["--target", target] if target else []), stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"specdecode serve exited with {proc.returncode}:\n{log.read()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"specdecode serve did not answer {url}/health within {timeout:.0f} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # SIGTERM: the server drains, then exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def run(url: str, prompt: str, chat: bool, max_tokens: int) -> None:
    client = OpenAI(base_url=url + "/v1", api_key="unused")  # the server checks a key only when started with one
    model = client.models.list().data[0].id
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    if chat:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
        text, usage = reply.choices[0].message.content or "", reply.usage
    else:
        done = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        text, usage = prompt + done.choices[0].text, done.usage
    print(f"--- {model}, one request ---\n{text}")
    speculative = (usage.model_extra or {}).get("speculative") if usage else None
    print(f"usage: {usage.completion_tokens if usage else '?'} tokens; speculative: {speculative}")

    print("--- the same request, streamed (greedy: the same text) ---")
    if chat:
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                    temperature=0, stream=True):
            if chunk.choices:
                print(chunk.choices[0].delta.content or "", end="", flush=True)
    else:
        print(prompt, end="")
        for part in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                              stream=True):
            if part.choices:
                print(part.choices[0].text, end="", flush=True)
    print()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="talk to specdecode serve with the openai client")
    ap.add_argument("--target", help="model the started server loads (default: the bundled models/code-target)")
    ap.add_argument("--url", help="use this running server instead of starting one")
    ap.add_argument("--prompt", default="def is_palindrome(s):", help="prompt (default: %(default)s)")
    ap.add_argument("--chat", action="store_true", help="ask /v1/chat/completions (an instruct model) instead")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per answer (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.url:
        run(args.url.rstrip("/"), args.prompt, args.chat, args.max_tokens)
    else:
        with serve(args.target) as url:
            run(url, args.prompt, args.chat, args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
