"""Hostile connections (issue 49): slow headers and bodies time out, a huge declared body is refused before it
is read, a connection cap closes idle sockets first and refuses cleanly, without a traceback per socket.

The server here is made as `specdecode serve` makes it (``runner.make_server``), with short timeouts.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable, Iterator

import httpx
import pytest

from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig
from specdecode.server import runner
from specdecode.server.runner import DrainingServer, make_server, socket_budget

from server_helpers import MODEL_NAME, Models

HEADER_TIMEOUT, BODY_TIMEOUT, MAX_CONNECTIONS = 1.0, 1.5, 8


class Running:
    def __init__(self, server: DrainingServer, port: int, thread: threading.Thread) -> None:
        self.server, self.port, self.thread = server, port, thread
        self.url = f"http://127.0.0.1:{port}"

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s


@pytest.fixture(scope="module")
def guarded(models: Models) -> Iterator[Running]:
    config = ServerConfig(max_batch_size=2, header_timeout=HEADER_TIMEOUT, body_timeout=BODY_TIMEOUT,
                          max_connections=MAX_CONNECTIONS)
    state = make_state(models.target, None, config, default_drafter="ngram", model_name=MODEL_NAME)
    server = make_server(state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    yield Running(server, sock.getsockname()[1], thread)
    server.should_exit = True
    thread.join(30)


def read_until_closed(s: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or ``limit_s`` passes), and when it closed."""
    t0 = time.monotonic()
    data = b""
    s.settimeout(0.1)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - t0


def test_a_slow_header_client_is_closed_with_a_408_within_the_timeout(guarded: Running) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200
    closed_at: list[float] = []
    with guarded.connect() as s:
        t0 = time.monotonic()

        def drip() -> None:  # one byte every 0.3 s, as the probe did: never a whole header
            for b in request:
                try:
                    s.send(bytes([b]))
                except OSError:
                    return
                time.sleep(0.3)

        threading.Thread(target=drip, daemon=True).start()
        data, _ = read_until_closed(s, HEADER_TIMEOUT + 5)
        closed_at.append(time.monotonic() - t0)
    assert closed_at[0] <= HEADER_TIMEOUT + 1.0, closed_at
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"request_timeout" in data and b"Traceback" not in data


def test_a_slow_second_request_on_a_kept_alive_connection_gets_a_408(guarded: Running) -> None:
    with guarded.connect() as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first:
            first += s.recv(65536)
        head, _, body = first.partition(b"\r\n\r\n")
        length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        while len(body) < length:
            body += s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 12")  # and nothing more
        data, _ = read_until_closed(s, HEADER_TIMEOUT + 5)
        took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408") and took <= HEADER_TIMEOUT + 1.0, (data[:100], took)


def test_an_idle_connection_is_closed_quietly_at_the_header_timeout(guarded: Running) -> None:
    with guarded.connect() as s:
        data, took = read_until_closed(s, HEADER_TIMEOUT + 5)
    assert data == b"" and took <= HEADER_TIMEOUT + 1.0, (data, took)


def test_a_huge_declared_body_gets_a_413_before_it_is_read(guarded: Running) -> None:
    with guarded.connect() as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000\r\n\r\n" + b"{" * 1000)
        data, _ = read_until_closed(s, 5)
        took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b"body_too_large" in data and b"--max-body-bytes" in data
    assert took < 2.0, took  # answered at once and closed (100 MB is far past what is worth draining)


def test_a_slow_body_gets_a_408_within_the_timeout(guarded: Running) -> None:
    with guarded.connect() as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\": ")
        data, _ = read_until_closed(s, BODY_TIMEOUT + 5)
        took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert BODY_TIMEOUT - 0.1 <= took <= BODY_TIMEOUT + 1.0, took
    assert httpx.get(guarded.url + "/health", timeout=10).status_code == 200


def test_at_the_cap_idle_sockets_make_room_and_busy_ones_get_a_clean_503(guarded: Running,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    idle = [guarded.connect() for _ in range(MAX_CONNECTIONS + 4)]  # half-open: connected, nothing sent
    try:
        time.sleep(0.2)
        r = httpx.get(guarded.url + "/health", timeout=10)  # closes the oldest idle socket to get in
        assert r.status_code == 200, r.text
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    busy = [guarded.connect() for _ in range(MAX_CONNECTIONS)]
    try:
        for s in busy:  # a request in progress (its body half sent): never closed for a newcomer
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 50\r\n\r\n{")
        time.sleep(0.2)
        with guarded.connect() as extra:
            data, _ = read_until_closed(extra, 5)
        assert data.startswith(b"HTTP/1.1 503"), data[:200]
        assert b"server_busy" in data and b"retry-after: 1" in data.lower()
    finally:
        for s in busy:
            s.close()
    time.sleep(0.2)
    assert httpx.get(guarded.url + "/health", timeout=10).status_code == 200
    guard_lines = [r for r in caplog.records if "connection guard" in r.getMessage()]
    assert len(guard_lines) <= 1, [r.getMessage() for r in guard_lines]  # rate-limited, not one per socket
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]


def test_refusals_are_one_log_line_per_period(caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    scheduled: list[tuple[float, Callable[[], None]]] = []
    shared = runner._Shared(runner.ConnectionLimits(10.0, 30.0, 100), clock=lambda: clock[0],
                            call_later=lambda wait, fn: scheduled.append((wait, fn)))
    caplog.set_level(logging.WARNING, logger="specdecode.server")
    for _ in range(5000):
        shared.note("refused (every connection busy)")
    shared.note("timed out sending headers")
    assert [w for w, _ in scheduled] == [runner.LOG_EVERY_S]  # one flush pending, not one per event
    clock[0] += runner.LOG_EVERY_S
    scheduled[0][1]()
    lines = [r.getMessage() for r in caplog.records if "connection guard" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "1 refused" in lines[0] and "4999 refused" in lines[1] and "1 timed out sending headers" in lines[1]


def test_the_cap_fits_the_open_file_limit() -> None:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap, backlog = socket_budget(10**9)
    assert cap + backlog < soft
    assert socket_budget(8)[0] == 8
