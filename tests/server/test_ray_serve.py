"""`specdecode serve --ray` end to end: a local Ray cluster with 2 replicas of a tiny model, started by the CLI.

The same answers as the single-process server, follow-up turns on the replica that served the first, a
replica killed with SIGKILL under load (every request answered, or ended with an error event and
[DONE], or refused with 503 and Retry-After; the replica comes back), and a scale-up under queue pressure.
Slow (a Ray cluster starts in ~15 s); skipped where the `ray` extra is not installed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: `serve --ray` is the optional extra "
                                        "specdecode[ray] (pip install 'specdecode[ray]')")

import serve_process
from specdecode.server.config import ServerConfig
from serve_process import ServeProcess
from server_helpers import Models, serve

pytestmark = pytest.mark.slow

REPLICA = "ServeReplica:specdecode:DecodeReplica"
COMMON = ["--drafter", "model", "--gamma", "4", "--threads", "1"]


def health(url: str) -> dict[str, Any]:
    return httpx.get(url + "/health", timeout=10).json()


def wait_live(url: str, n: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            body = health(url)
            if body.get("replicas_live", 0) >= n:
                return body
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{n} replicas did not report within {timeout} s")
        time.sleep(0.5)


def port_ray_leaves_alone() -> int:
    """A free port below the ephemeral range, where Ray picks its own processes' ports as it starts (a port
    found free there before the start may be Ray's by the time its HTTP proxy binds)."""
    while True:
        port = random.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


def start(models: Models, tmp: Path, extra: list[str], api_key: str = "") -> ServeProcess:
    draft = models.target_dir.parent / "draft"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve_process, "free_port", port_ray_leaves_alone)
        mp.setenv("SPECDECODE_API_KEY", api_key)
        return ServeProcess(models.target_dir, ["--draft", str(draft), *COMMON, "--ray", *extra],
                            log_path=tmp / "serve-ray.log", startup_timeout=240)


def stop(srv: ServeProcess) -> None:
    try:
        srv.proc.send_signal(signal.SIGINT)  # as Ctrl-C: serve.shutdown and ray.shutdown run
        srv.wait(90)
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def ray_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    srv = start(models, tmp_path_factory.mktemp("ray"), ["--replicas", "2", "--max-batch-size", "4"])
    try:
        wait_live(srv.url, 2, 120)
        yield srv
    finally:
        stop(srv)


def complete(url: str, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=timeout)


def test_same_routes_limits_and_errors(ray_server: ServeProcess) -> None:
    url = ray_server.url
    body = health(url)
    assert body["status"] in ("ok", "warming") and body["replicas_live"] == 2 and len(body["replicas"]) == 2
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    bad = complete(url, {"model": model, "prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert httpx.get(url + "/v1/models", headers={"host": "evil.example"}, timeout=10).status_code == 403
    big = httpx.post(url + "/v1/completions", content=b"x" * (5 << 20),
                     headers={"content-type": "application/json"}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    assert big.headers["x-content-type-options"] == "nosniff"
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]" and len(events) >= 4
    ok = complete(url, {"model": model, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
    time.sleep(2.5)  # the replicas report each second
    merged = httpx.get(url + "/metrics", timeout=10).text
    assert "specdecode_generated_tokens_total" in merged and 'replica="' not in merged
    assert 'replica="' in httpx.get(url + "/metrics/replicas", timeout=10).text


def test_a_client_that_goes_away_frees_its_row(ray_server: ServeProcess) -> None:
    url = ray_server.url
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": "def f(x):", "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    def cancelled() -> float:
        text = httpx.get(url + "/metrics", timeout=10).text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith('specdecode_requests_total{finish_reason="cancelled"}'))

    before = cancelled()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        deadline = time.monotonic() + 20
        while sum(rep["active_rows"] or 0 for rep in health(url)["replicas"]) == 0:  # seen decoding
            assert next(lines) is not None and time.monotonic() < deadline
    deadline = time.monotonic() + 20
    while sum(rep["active_rows"] or 0 for rep in health(url)["replicas"]) > 0:
        assert time.monotonic() < deadline, "a stream whose client left still decodes"
        time.sleep(0.3)
    time.sleep(1.5)  # the next report
    assert cancelled() == before + 1


def test_greedy_and_seeded_outputs_match_the_single_process_server(ray_server: ServeProcess, models: Models) -> None:
    model = httpx.get(ray_server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    drafters = health(ray_server.url)["drafters"]  # every drafter the flags load, as `serve` loads them
    assert {"model", "ngram", "suffix"} <= set(drafters)
    cases = [{"drafter": d, "temperature": t, "seed": 7} for d in drafters for t in (0, 0.9)]
    got_ray = [complete(ray_server.url, {"model": model, "prompt": "def add(a, b):", "max_tokens": 48, **c}).json()
               for c in cases]
    for one in serve(models, models.draft, ServerConfig(max_batch_size=4, request_timeout=60), gamma=4):
        assert sorted(one.state.scheduler.drafters) == sorted(drafters)
        got_one = [one.post("/v1/completions", {"model": one.state.model_name, "prompt": "def add(a, b):",
                                                "max_tokens": 48, **c}).json() for c in cases]
    for c, a, b in zip(cases, got_ray, got_one):
        assert a["choices"][0]["text"] == b["choices"][0]["text"], c


def test_follow_up_turns_stay_on_their_replica(ray_server: ServeProcess) -> None:
    url, model = ray_server.url, "x"
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def turn(messages: list[dict[str, str]]) -> tuple[str, str]:
        r = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 4,
                                                           "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        return r.headers["x-specdecode-replica"], r.json()["choices"][0]["message"]["content"]

    for k in range(4):
        messages = [{"role": "user", "content": f"conversation {k}"}]
        first, answer = turn(messages)
        time.sleep(1.5)  # the replica's conversations reach the router about once a second
        for j in range(2):
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"more {j}"}]
            served, answer = turn(messages)
            assert served == first, f"conversation {k}, follow-up {j}: {served} != {first}"


def replica_pids(root: int) -> list[int]:
    """The decode replicas' processes among ``root``'s descendants (Ray names them in their command line)."""
    parent, cmd = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    return sorted(p for p, c in cmd.items() if REPLICA in c and under(p))


def one_request(url: str, model: str, i: int, headers: Optional[dict[str, str]] = None) -> str:
    """What became of request ``i``: "ok", "error_event" (a stream ended by an error event and [DONE]) or "503"."""
    body: dict[str, Any] = {"model": model, "max_tokens": 300, "temperature": 0, "stream": i % 2 == 0}
    path = "/v1/completions"
    if i % 4 == 0:  # every other stream is a chat stream: its opening role chunk is held back until a token
        body["messages"], path = [{"role": "user", "content": f"def f{i}(x):"}], "/v1/chat/completions"
    else:
        body["prompt"] = f"def f{i}(x):"
    if not body["stream"]:
        r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120)
        if r.status_code == 503:
            assert r.headers.get("retry-after"), r.text
            return "503"
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
        return "ok"
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=120) as r:
        if r.status_code == 503:
            assert r.headers.get("retry-after")
            return "503"
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream {i} ended without [DONE]: {events[-3:]}"
    last = json.loads(events[-2])
    if "error" in last:
        return "error_event"
    assert last["choices"][0]["finish_reason"] in ("length", "stop"), last
    return "ok"


def test_a_replica_killed_mid_load_loses_no_request(ray_server: ServeProcess) -> None:
    url = ray_server.url
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    pids = replica_pids(ray_server.proc.pid)
    assert len(pids) == 2, pids
    before = {r["replica"] for r in health(url)["replicas"]}
    with ThreadPoolExecutor(8) as pool:
        first = [pool.submit(one_request, url, model, i) for i in range(48)]  # 64 in all, as the goal
        deadline = time.monotonic() + 60
        while not all((r["active_rows"] or 0) > 0 for r in health(url)["replicas"]):  # both busy: mid-load
            assert time.monotonic() < deadline, "the load never reached both replicas"
            time.sleep(0.1)
        os.kill(pids[0], signal.SIGKILL)
        killed_at = time.monotonic()
        after = [pool.submit(one_request, url, model, 100 + i) for i in range(16)]
        outcomes = [f.result(timeout=300) for f in first]
        later = [f.result(timeout=300) for f in after]
    assert set(later) <= {"ok", "503"}, later  # sent after the kill: answered, or 503 with Retry-After
    assert set(outcomes) <= {"ok", "error_event", "503"}
    assert outcomes.count("ok") + later.count("ok") >= 48, (outcomes, later)
    print("before the kill:", outcomes, "after:", later)
    while True:  # Ray replaces the killed replica: a new one reports, and the killed one's reports go stale
        live = {r["replica"] for r in health(url)["replicas"]}
        if len(live) == 2 and live != before:
            break
        assert time.monotonic() - killed_at < 60, f"the killed replica was not replaced within 60 s: {live}"
        time.sleep(0.5)


def test_scale_up_under_queue_pressure(models: Models, tmp_path: Path) -> None:
    """Also: an API key from $SPECDECODE_API_KEY reaches every replica, the one added included."""
    srv = start(models, tmp_path, ["--min-replicas", "1", "--max-replicas", "2", "--max-batch-size", "1"],
                api_key="k-51")
    key = {"Authorization": "Bearer k-51"}
    try:
        wait_live(srv.url, 1, 120)
        assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 401
        model = httpx.get(srv.url + "/v1/models", headers=key, timeout=10).json()["data"][0]["id"]
        deadline = time.monotonic() + 90
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(one_request, srv.url, model, 2 * i + 1, key) for i in range(6)]
            while health(srv.url)["replicas_live"] < 2:
                assert time.monotonic() < deadline, "no second replica under a queue of 6 on 1 row"
                if all(f.done() for f in futures):
                    futures = [pool.submit(one_request, srv.url, model, 2 * i + 1, key) for i in range(6)]
                time.sleep(0.5)
            assert all(f.result(timeout=300) == "ok" for f in futures)
        with ThreadPoolExecutor(4) as pool:  # both replicas hold the key
            assert list(pool.map(lambda i: one_request(srv.url, model, 2 * i + 1, key), range(8))) == ["ok"] * 8
        assert httpx.post(srv.url + "/v1/completions", json={"model": model, "prompt": "x"},
                          timeout=30).status_code == 401
    finally:
        stop(srv)
