"""Run the app under uvicorn with a drain that never cuts a stream nor refuses a connection.

On SIGTERM (or ``should_exit``) uvicorn closes its listening socket and waits for open
connections, then cancels whatever is left, which cuts streams mid-body. ``DrainingServer``
tells the scheduler first: queued requests end at once with a 503 (or an SSE error event),
running ones get ``drain_timeout`` seconds and then end with an SSE error event and
``[DONE]``. Until they have ended, the listener and keep-alive connections stay open, so a
request sent during the drain gets a 503 with ``Retry-After`` rather than a refused
connection. Only then does uvicorn close the listener; its own grace period is set past the
drain, so it never has to cancel a stream.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Optional

import uvicorn

from .app import ServerState, create_app

log = logging.getLogger("specdecode.server")

FLUSH_MARGIN_S = 10  # after the drain deadline: time for the last events to reach the clients


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

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


def make_server(state: ServerState, log_level: str = "warning") -> DrainingServer:
    cfg = state.config
    config = uvicorn.Config(create_app(state), host=cfg.host, port=cfg.port, log_level=log_level,
                            timeout_graceful_shutdown=int(cfg.drain_timeout) + FLUSH_MARGIN_S)
    return DrainingServer(config, state)
