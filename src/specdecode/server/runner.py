"""Run the app under uvicorn with a drain that never cuts a stream nor refuses a connection.

On SIGTERM (or ``should_exit``) uvicorn closes its listening socket and waits for open
connections, then cancels whatever is left, which cuts streams mid-body. ``DrainingServer``
tells the scheduler first: queued requests end at once with a 503 (or an SSE error event),
running ones get ``drain_timeout`` seconds and then end with an SSE error event and
``[DONE]``. Until they have ended, the listener and keep-alive connections stay open, so a
request sent during the drain gets a 503 with ``Retry-After`` rather than a refused
connection. Only then does uvicorn close the listener; its own grace period is set past the
drain, so it never has to cancel a stream.

Connections are guarded (``GuardedH11``): uvicorn alone never times out a client that sends its
headers one byte at a time, nor caps connections, so half-open sockets could take every file
descriptor (then accept() fails in a loop, a traceback each time, and /health is unreachable).
Here a request's headers must arrive within ``header_timeout`` and its body within
``body_timeout`` (else HTTP 408 and the connection is closed), and past ``max_connections`` a new
connection closes the oldest one that has no request in progress (one never answered first, so a burst of
half-open sockets closes its own kind before a kept-alive client), or is refused with HTTP 503. A burst of
connections is accepted ``ACCEPTS_PER_TICK`` per pass of the event loop, so requests are read between them,
and at the cap the ones that have sent nothing are closed as they are accepted (``SheddingSocket``).
Refusals are logged as one line per ``LOG_EVERY_S`` at most.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import resource
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import ServerState, create_app
from .guard import SECURITY_HEADERS, error_json
from .hosts import is_ip

log = logging.getLogger("specdecode.server")

FLUSH_MARGIN_S = 10  # after the drain deadline: time for the last events to reach the clients
LOG_EVERY_S = 10.0  # at most one line per this many seconds about refused or timed-out connections
FD_RESERVE = 64  # open files kept for everything but client sockets (models, logs, the listener)
MAX_BACKLOG = 4096  # the kernel's usual somaxconn: at 2,048 a 20k flood filled it and dropped new SYNs (1 s each)
ACCEPTS_PER_TICK = 16  # asyncio accepts up to its "backlog" sockets per event-loop pass; see widen_listen_queue
SHED_PER_ACCEPT = 8  # at most this many sockets closed by one accept() call (SheddingSocket) before it yields


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    max_connections: int


class _Shared:
    """One server's connections that have no request in progress, oldest first (the ones a new connection
    may close at the cap): ``fresh`` have never had an answer (a half-open socket, a slow header), ``idle``
    are kept alive after one. A burst of sockets that send nothing then closes its own kind first, and a
    client between two requests keeps its connection. Also the counts behind the rate-limited log line: the first
    event is logged at once, later ones summed into one line per ``LOG_EVERY_S``. ``clock`` and
    ``call_later`` are the event loop's unless given (tests)."""

    def __init__(self, limits: ConnectionLimits, clock: Callable[[], float] = time.monotonic,
                 call_later: Optional[Callable[[float, Callable[[], None]], object]] = None) -> None:
        self.limits = limits
        self.open = 0  # connections with a protocol (made, not yet lost)
        self.fresh: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()
        self.idle: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()
        self.counts: collections.Counter[str] = collections.Counter()
        self.logged = -LOG_EVERY_S
        self.clock, self.call_later = clock, call_later
        self.pending = False

    def note(self, what: str) -> None:
        self.counts[what] += 1
        if self.pending:
            return
        wait = self.logged + LOG_EVERY_S - self.clock()
        if wait <= 0:
            self.flush()
            return
        self.pending = True
        (self.call_later or asyncio.get_running_loop().call_later)(wait, self.flush)

    def flush(self) -> None:
        self.pending = False
        if not self.counts:
            return
        now, lim = self.clock(), self.limits
        log.warning("connection guard: %s in the last %.0f s (at most %d connections, headers within %g s, "
                    "bodies within %g s)", ", ".join(f"{n} {w}" for w, n in sorted(self.counts.items())),
                    min(now - self.logged, LOG_EVERY_S), lim.max_connections, lim.header_timeout, lim.body_timeout)
        self.counts.clear()
        self.logged = now


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with header and body timeouts and a connection cap (see the module's
    docstring); ``guarded_protocol`` makes the class for one server, with its ``shared`` state."""

    shared: ClassVar[_Shared]
    _timer: Optional[asyncio.TimerHandle] = None
    _timer_kind = ""
    _answered = False  # a response has completed on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sh = self.shared
        sh.open += 1
        if len(self.connections) > sh.limits.max_connections:
            victim = next(iter(sh.fresh), None) or next(iter(sh.idle), None)
            if victim is None:
                sh.note("refused (every connection busy)")
                self._answer(503, "server_busy", "this server has as many connections as it takes, each with a "
                                                 "request in progress; retry shortly", b"retry-after: 1\r\n")
                return
            sh.note("idle closed for new ones")
            victim._close()
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._answered:
            self._answered = True
            self.shared.fresh.pop(self, None)
        self._arm()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        self.shared.open -= 1
        super().connection_lost(exc)
        # asyncio's socket transport (CPython 3.11) keeps a bound method of itself, so a closed one is freed
        # only by a cyclic collection; a burst of half-open sockets left thousands in the oldest generation,
        # and each full collection walked them (10-30 ms of a stalled loop, several times a second)
        if self.transport.is_closing() and hasattr(self.transport, "_read_ready_cb"):
            self.transport._read_ready_cb = None

    def _arm(self) -> None:
        """The timer for what the client owes now: headers (no request in progress), a body, or nothing."""
        state = self.conn.their_state
        if self.transport.is_closing() or state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()
            return
        kind = "headers" if state is h11.IDLE else "body"
        sh = self.shared
        if kind == "headers":
            (sh.idle if self._answered else sh.fresh).setdefault(self, None)
        else:
            sh.idle.pop(self, None)
            sh.fresh.pop(self, None)
        if self._timer_kind != kind:
            if self._timer is not None:
                self._timer.cancel()
            limits = self.shared.limits
            wait = limits.header_timeout if kind == "headers" else limits.body_timeout
            self._timer, self._timer_kind = self.loop.call_later(wait, self._expired, kind), kind

    def _disarm(self) -> None:
        self.shared.idle.pop(self, None)
        self.shared.fresh.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_kind = None, ""

    def _expired(self, kind: str) -> None:
        self._timer, self._timer_kind = None, ""
        if self.transport.is_closing():
            return
        if kind == "headers" and not self.conn.trailing_data[0]:
            self._close()  # an idle connection: nothing was asked, nothing to answer
            return
        self.shared.note(f"timed out sending {kind}")
        if kind == "body" and self.cycle is not None and self.cycle.response_started:
            self._close()  # answered already (a 413 before the body): only the rest of the body is late
            return
        limits = self.shared.limits
        wait = limits.header_timeout if kind == "headers" else limits.body_timeout
        self._answer(408, "request_timeout", f"the request's {kind} did not arrive within {wait:g} s; send "
                                             "the whole request at once")

    def _answer(self, status: int, code: str, message: str, extra: bytes = b"") -> None:
        """Write a whole JSON answer and close: for when no request (or no app) is there to answer."""
        body = error_json(message, code)
        phrase = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
                % (status, phrase, len(body)))
        head += b"".join(k + b": " + v + b"\r\n" for k, v in SECURITY_HEADERS) + extra
        self.transport.write(head + b"\r\n" + body)
        self._close()

    def _close(self) -> None:
        self._disarm()
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app, if it is waiting for the body, sees a disconnect
        self.transport.close()


class SheddingSocket(socket.socket):
    """The listening socket `serve` binds: during a burst, at the cap, a connection that has sent nothing by the
    time it is accepted is closed here, in a few microseconds, before asyncio builds a transport and a protocol
    for it (and before it closes an older connection to make room): a flood of half-open sockets then costs
    the event loop little, and the listen queue empties fast enough that a client connecting meanwhile is not
    kept waiting behind it. A burst is a queue that has held connections for more than one pass of the loop;
    otherwise a new connection is taken as usual (at the cap it closes the oldest idle one), so a client whose
    request is a moment behind its handshake is not turned away on a calm server."""

    guard: Optional[_Shared] = None
    _streak = 0  # connections accepted since the queue was last found empty

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(SHED_PER_ACCEPT):
            try:
                conn, addr = super().accept()
            except BlockingIOError:
                self._streak = 0
                raise
            self._streak += 1
            if not self._shed(conn):
                return conn, addr
            conn.close()
        raise BlockingIOError(errno.EAGAIN, "shed a few; asyncio accepts again on its next pass")

    def _shed(self, conn: socket.socket) -> bool:
        sh = self.guard
        if sh is None or self._streak <= ACCEPTS_PER_TICK or sh.open < sh.limits.max_connections:
            return False
        try:
            sent = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = b""
        except OSError:
            return False  # let the protocol see the error as it would
        if sent:
            return False
        sh.note("closed at once (a burst at the cap, nothing sent)")
        return True


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11]:
    """A ``GuardedH11`` class for one server: its connections share the idle lists and the log counts."""
    return type("GuardedH11", (GuardedH11,), {"shared": _Shared(limits)})


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (a cap on sockets is then the only
    cap that matters); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the kernel's usual nr_open
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def socket_budget(max_connections: int) -> tuple[int, int]:
    """(connection cap, listen backlog) that fit the open-file limit: accept() takes up to a backlog's
    worth of sockets before any connection's code runs, so cap + backlog + a reserve must fit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return max_connections, MAX_BACKLOG
    backlog = max(16, min(MAX_BACKLOG, soft // 4))
    return max(8, min(max_connections, soft - backlog - FD_RESERVE)), backlog


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: accept() out of file descriptors is one line per
    ``LOG_EVERY_S`` (asyncio logs a traceback on each retry); the rest goes to the default handler."""
    if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
        now = time.monotonic()
        if now - _accept_errors_logged[0] >= LOG_EVERY_S:
            _accept_errors_logged[0] = now
            log.warning("accept() failed: %s (out of file descriptors; lower --max-connections or raise "
                        "`ulimit -n`)", context.get("exception"))
        return
    loop.default_exception_handler(context)


_accept_errors_logged = [-LOG_EVERY_S]


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, listen_backlog: int = MAX_BACKLOG,
                 guard: Optional[_Shared] = None) -> None:
        super().__init__(config)
        self.state, self.listen_backlog, self.guard = state, listen_backlog, guard

    def run(self, sockets: Optional[list[socket.socket]] = None) -> None:
        """Serve; without ``sockets`` and on an IP address, from a ``SheddingSocket`` bound as uvicorn binds one
        (a host name may stand for several addresses: uvicorn binds them; sockets passed in are the caller's)."""
        cfg = self.config
        if sockets is None and is_ip(cfg.host) and cfg.uds is None and cfg.fd is None \
                and hasattr(socket, "MSG_DONTWAIT"):
            plain = cfg.bind_socket()
            sock = SheddingSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
            sock.set_inheritable(False)  # a subprocess (a kernel build) must not hold the port open
            sock.guard = self.guard
            sockets = [sock]
        super().run(sockets)

    async def startup(self, sockets: Optional[list[socket.socket]] = None) -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_accept_errors)
        await super().startup(sockets)
        widen_listen_queue(self.servers, self.listen_backlog)

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        s = self.state.scheduler
        log.info("shutting down: refusing new requests, failing %d queued, giving %d running up to %.0f s",
                 s.queue_depth, s.active_rows, self.state.config.drain_timeout)
        s.begin_drain(self.state.config.drain_timeout)
        # keep accepting (and answering 503) until every running request has ended; the bound covers an
        # engine step that overruns the deadline
        give_up = max(s.drain_deadline, time.monotonic()) + FLUSH_MARGIN_S
        while not s.drained and not self.force_exit and time.monotonic() < give_up:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


def widen_listen_queue(servers: list[Any], backlog: int) -> None:
    """Give the kernel's listen queue ``backlog`` places after asyncio has listened with ``ACCEPTS_PER_TICK``.

    asyncio uses one number for both the listen queue and how many sockets it accepts in one pass of the
    event loop before anything else runs. At 2048, a burst of connections was taken 2048 at a time: the loop
    then built and ran 2048 protocols (and closed as many idle sockets at the cap) before reading the next
    request, and /health waited up to 0.8 s. A few per pass keep every pass short; the kernel still holds a
    burst's SYNs, so a client connecting during it is not dropped (a dropped SYN is retried after 1 s)."""
    for server in servers:
        for ts in server.sockets:
            dup = socket.socket(ts.family, ts.type, fileno=socket.dup(ts.fileno()))
            try:
                dup.listen(backlog)  # the same socket: listen() again only resizes its queue
            finally:
                dup.close()


def make_server(state: ServerState, log_level: str = "warning") -> DrainingServer:
    cfg = state.config
    cap, backlog = socket_budget(cfg.max_connections)
    if cap < cfg.max_connections:
        log.warning("max_connections %d lowered to %d to fit the open-file limit (`ulimit -n`)",
                    cfg.max_connections, cap)
    limits = ConnectionLimits(cfg.header_timeout, cfg.body_timeout, cap)
    http = guarded_protocol(limits)
    config = uvicorn.Config(create_app(state), host=cfg.host, port=cfg.port, log_level=log_level,
                            timeout_graceful_shutdown=int(cfg.drain_timeout) + FLUSH_MARGIN_S,
                            http=http, backlog=min(backlog, ACCEPTS_PER_TICK),
                            loop="asyncio")  # the guard is written for asyncio's loop (the ray extra brings uvloop)
    return DrainingServer(config, state, listen_backlog=backlog, guard=http.shared)
