"""Host header check for a server without an API key: the defence against DNS rebinding.

A web page on ``evil.example`` can make its own name resolve to 127.0.0.1 and then read a
keyless local server's answers as same-origin. The browser still sends ``Host: evil.example``,
so a keyless server answers only requests that name it: loopback names, the address it is
bound to, names given with ``--allowed-hosts``, and (when bound to every address, where it is
reached by whatever address the machine has) any IP literal, which no rebinding page can send
as its own origin. With an API key the key is the defence, and the check is off.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Optional

from .guard import ASGIApp, Receive, Scope, Send, error_json, send_json

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})


def host_name(header: str) -> str:
    """``Host`` without its port, lower-cased: ``[::1]:8000`` -> ``::1``, ``Example.com.:80`` -> ``example.com``."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware: 403 for a request whose Host names neither this server nor an allowed host."""

    def __init__(self, app: ASGIApp, bound_host: str, allowed: Optional[str]) -> None:
        self.app = app
        extra = {host_name(h) for h in (allowed or "").split(",") if h.strip()}
        self.any_host = "*" in extra
        self.wildcard = bound_host.strip() in WILDCARD_ADDRESSES
        self.names = LOOPBACK_NAMES | extra | {host_name(bound_host)}
        if self.wildcard:
            self.names |= {socket.gethostname().lower()}

    def allows(self, header: Optional[str]) -> bool:
        if self.any_host or header is None:  # no Host at all: HTTP/1.0, which no browser sends
            return True
        name = host_name(header)
        return name in self.names or (self.wildcard and is_ip(name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), None)
            if not self.allows(header):
                shown = (header or "")[:100]
                await send_json(send, 403, error_json(
                    f"Host {shown!r} is not a name of this server; this server has no API key, so it answers only "
                    "requests for localhost, its own address or a name allowed with `specdecode serve "
                    "--allowed-hosts NAME` (or set an API key with --api-key-file / $SPECDECODE_API_KEY)",
                    "host_not_allowed", "permission_error"), close=True)
                return
        await self.app(scope, receive, send)
