"""Run the app under uvicorn with a drain that never cuts a stream.

On SIGTERM (or ``should_exit``) uvicorn closes its listening socket and waits for open
connections, then cancels whatever is left, which cuts streams mid-body. ``DrainingServer``
tells the scheduler first: queued requests end at once with a 503 (or an SSE error event),
running ones get ``drain_timeout`` seconds and then end with an SSE error event and
``[DONE]``. uvicorn's own grace period is set past that, so it never has to cancel a stream.
"""

from __future__ import annotations

import logging
import socket
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
        await super().shutdown(sockets)


def make_server(state: ServerState, log_level: str = "warning") -> DrainingServer:
    cfg = state.config
    config = uvicorn.Config(create_app(state), host=cfg.host, port=cfg.port, log_level=log_level,
                            timeout_graceful_shutdown=int(cfg.drain_timeout) + FLUSH_MARGIN_S)
    return DrainingServer(config, state)
