"""Helpers for the server tests: a server on a free loopback port in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import uvicorn

from specdecode.sizing.gamma import Gamma
from specdecode.models import Model
from specdecode.server.app import ServerState, make_state
from specdecode.server.config import ServerConfig
from specdecode.server.runner import make_server

MODEL_NAME = "tiny-llama"


@dataclass
class Models:
    target: Model
    draft: Model  # a different random model: acceptance ~0
    target_dir: Path


@dataclass
class RunningServer:
    url: str
    state: ServerState
    server: uvicorn.Server
    thread: threading.Thread

    def get(self, path: str, headers: Optional[dict[str, str]] = None) -> httpx.Response:
        return httpx.get(self.url + path, headers=headers, timeout=30)

    def post(self, path: str, body: object, headers: Optional[dict[str, str]] = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=headers, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(state: ServerState) -> RunningServer:
    """``state`` served on a free loopback port from a background thread, once it listens."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(state)  # as `specdecode serve` makes it: the connection guard included
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", state, server, thread)


def serve(models: Models, draft: Optional[Model], config: ServerConfig, drafter: str = "model",
          gamma: Gamma = 4) -> Iterator[RunningServer]:
    state = make_state(models.target, draft, config, default_drafter=drafter, default_gamma=gamma,
                       model_name=MODEL_NAME)
    running = start_server(state)
    try:
        yield running
    finally:
        running.stop()


class HealthProbe:
    """Polls /health from a thread on its own connection and records each latency."""

    def __init__(self, url: str) -> None:
        self.url, self._stop = url, threading.Event()
        self.latencies: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                assert c.get(self.url + "/health").status_code == 200
                self.latencies.append(time.perf_counter() - t0)
                time.sleep(0.01)

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(30)


def baseline_latency(url: str) -> float:
    """The machine's own /health latency now (CI machines are busy): the bound is on what a request adds."""
    with httpx.Client(timeout=30) as c:
        lat = []
        for _ in range(10):
            t0 = time.perf_counter()
            c.get(url + "/health")
            lat.append(time.perf_counter() - t0)
    return max(lat)
