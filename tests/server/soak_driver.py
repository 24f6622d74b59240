"""Soak and fault load against a running server: mixed clients, disconnects, timeouts, 429 storms.

Every request the driver sends is accounted for: completed (200 with a finish reason), refused
(429/503), rejected as invalid (4xx, sent on purpose) or given up by the client (a disconnect or a
client timeout: the server must cancel it). ``soak`` returns the tallies and the problems it saw;
the caller checks them against ``/metrics`` (used by tests/server/test_server_soak.py and
scripts/soak.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx

PROMPTS = ["def fib(n):", "class Point:\n    def", "def add(a, b):\n    return", "import os\n"]
LENGTHS = (8, 24, 48)
BAD_BODIES = [b'{"model": 5}', b"{not json", b'{"model": "M", "prompt": "x", "seed": 99999999999999999999999}',
              b'{"model": "M", "prompt": "a\\ud800"}', b'[' * 5000 + b']' * 5000,
              b'{"model": "M", "prompt": "x", "tools": [{}]}']


@dataclass
class Tally:
    sent: int = 0  # valid requests (the server's metrics must count each exactly once)
    completed: int = 0
    refused: int = 0
    client_gave_up: int = 0  # disconnects and client timeouts
    invalid: int = 0  # deliberately bad bodies (never reach the scheduler)
    greedy_checked: int = 0
    problems: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    def status(self, code: int) -> None:
        self.statuses[code] = self.statuses.get(code, 0) + 1
        if code >= 500:
            self.problems.append(f"HTTP {code}")


def body(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


async def references(client: httpx.AsyncClient, model: str, t: Tally) -> dict[tuple[str, int], str]:
    """What each greedy request gives when it runs alone."""
    out = {}
    for p in PROMPTS:
        for n in LENGTHS:
            t.sent += 1
            r = await client.post("/v1/completions", json=body(model, p, n))
            r.raise_for_status()
            t.completed += 1
            out[(p, n)] = r.json()["choices"][0]["text"]
    return out


async def _stream(client: httpx.AsyncClient, payload: dict[str, Any], t: Tally, stop_after: Optional[int] = None,
                  ) -> Optional[str]:
    """A streaming completion; returns the text (None when refused or given up)."""
    t.sent += 1
    text, events = [], 0
    async with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as r:
        t.status(r.status_code)
        if r.status_code in (429, 503):
            t.refused += 1
            if "retry-after" not in r.headers:
                t.problems.append(f"{r.status_code} without Retry-After")
            return None
        if r.status_code != 200:
            t.problems.append(f"stream got {r.status_code}: {(await r.aread())[:200]!r}")
            return None
        last = ""
        async for line in r.aiter_lines():
            if not line:
                continue
            last = line
            if line == "data: [DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                t.problems.append(f"stream error event: {ev['error']}")
                return None
            text.append(ev["choices"][0]["text"])
            events += 1
            if stop_after is not None and events >= stop_after:
                t.client_gave_up += 1
                return None  # leaving the block closes the connection mid-stream
        if last != "data: [DONE]":
            t.problems.append("a stream ended without [DONE]")
            return None
    t.completed += 1
    return "".join(text)


async def _post(client: httpx.AsyncClient, payload: dict[str, Any], t: Tally,
                timeout: Optional[httpx.Timeout] = None) -> Optional[str]:
    t.sent += 1
    try:
        r = await client.post("/v1/completions", json=payload, timeout=timeout or client.timeout)
    except httpx.TimeoutException:
        t.client_gave_up += 1
        return None
    t.status(r.status_code)
    if r.status_code in (429, 503):
        t.refused += 1
        if "retry-after" not in r.headers:
            t.problems.append(f"{r.status_code} without Retry-After")
        return None
    if r.status_code != 200:
        t.problems.append(f"post got {r.status_code}: {r.text[:200]}")
        return None
    t.completed += 1
    return str(r.json()["choices"][0]["text"])


async def soak(url: str, model: str, duration_s: float, seed: int = 0, workers: int = 10, storm_every_s: float = 5.0,
               storm_size: int = 40, on_tick: Optional[Callable[[float], None]] = None) -> Tally:
    """Run mixed clients against ``url`` for ``duration_s``; ``on_tick`` is called about once a second."""
    t = Tally()
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=workers + storm_size + 8, max_keepalive_connections=workers + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        refs = await references(client, model, t)
        end = time.monotonic() + duration_s

        async def greedy_check(p: str, n: int, got: Optional[str]) -> None:
            if got is not None:
                t.greedy_checked += 1
                if got != refs[(p, n)]:
                    t.problems.append(f"greedy output differs from the lone request for {p!r}/{n}")

        async def worker(i: int) -> None:
            r = random.Random(seed * 1000 + i)
            while time.monotonic() < end:
                try:
                    await one(r)
                except httpx.HTTPError as e:  # a reset or cut connection is a failure, not a crash of the driver
                    t.problems.append(f"connection error: {type(e).__name__}: {e}")

        async def one(r: random.Random) -> None:
            kind = r.choice(["stream", "stream", "post", "post", "disconnect", "timeout", "sampled", "bad"])
            p, n = r.choice(PROMPTS), r.choice(LENGTHS)
            if kind == "stream":
                await greedy_check(p, n, await _stream(client, body(model, p, n), t))
            elif kind == "post":
                await greedy_check(p, n, await _post(client, body(model, p, n), t))
            elif kind == "disconnect":
                await _stream(client, body(model, p, 400, ignore_eos=True), t, stop_after=r.randint(1, 5))
            elif kind == "timeout":
                await _post(client, body(model, p, 2000, ignore_eos=True), t,
                            timeout=httpx.Timeout(120, read=r.uniform(0.05, 0.5)))
            elif kind == "sampled":
                await _post(client, body(model, p, n, temperature=0.8, seed=r.randint(0, 2**31)), t)
            else:
                raw = r.choice(BAD_BODIES).replace(b'"M"', json.dumps(model).encode())
                resp = await client.post("/v1/completions", content=raw,
                                         headers={"content-type": "application/json"})
                t.status(resp.status_code)
                t.invalid += 1
                if not 400 <= resp.status_code < 500:
                    t.problems.append(f"bad body got {resp.status_code}")

        async def storms() -> None:
            while time.monotonic() < end - 1:
                await asyncio.sleep(storm_every_s)
                p = rng.choice(PROMPTS)
                outcomes = await asyncio.gather(*(_post(client, body(model, p, 8), t) for _ in range(storm_size)),
                                                return_exceptions=True)
                t.problems += [f"storm: {type(e).__name__}: {e}" for e in outcomes if isinstance(e, BaseException)]

        async def ticks() -> None:
            while time.monotonic() < end:
                await asyncio.sleep(1.0)
                if on_tick is not None:
                    on_tick(end - time.monotonic())

        await asyncio.gather(*(worker(i) for i in range(workers)), storms(), ticks())
    return t


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus series (all label sets) in a /metrics scrape."""
    return sum(float(ln.split()[-1]) for ln in text.splitlines()
               if ln.startswith(name + " ") or ln.startswith(name + "{"))


def check_against_metrics(t: Tally, before: str, after: str) -> list[str]:
    """Every valid request ended exactly once in the server's metrics, as the clients saw it end."""
    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    problems = []
    ended, refused = delta("specdecode_requests_total"), delta("specdecode_refused_requests_total")
    if ended + refused != t.sent:
        problems.append(f"lost requests: sent {t.sent}, metrics ended {ended:.0f} + refused {refused:.0f}")
    # a client that gave up (timeout, disconnect) may have been refused without reading the 429
    if not t.refused <= refused <= t.refused + t.client_gave_up:
        problems.append(f"refusals: clients saw {t.refused} (+{t.client_gave_up} given up), metrics {refused:.0f}")
    finished = delta('specdecode_requests_total{finish_reason="stop"}') + \
        delta('specdecode_requests_total{finish_reason="length"}')
    if not t.completed <= finished <= t.completed + t.client_gave_up:
        problems.append(f"completions: clients saw {t.completed} (+{t.client_gave_up} given up), "
                        f"metrics {finished:.0f}")
    return problems
