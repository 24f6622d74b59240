"""A hostile client for the half-open burst probe (issue 49): opens N sockets to a server as fast as it can,
sends nothing, holds them, then closes them. Run as its own process (``python half_open_burst.py HOST PORT N
HOLD_S``) so its file descriptors and CPU are not the prober's; prints one JSON line: how many sockets it
opened, how many the handshake completed for, when it started (``time.monotonic``) and how long it took."""

from __future__ import annotations

import errno
import json
import resource
import select
import socket
import sys
import time


def fd_room(reserve: int = 64) -> int:
    """How many sockets this process can open: the soft open-file limit raised to the hard one, less a reserve."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (1 << 20 if soft == resource.RLIM_INFINITY else soft) - reserve


def burst(host: str, port: int, n: int, hold_s: float) -> dict[str, float]:
    n = min(n, fd_room())
    socks: list[socket.socket] = []
    time.sleep(0.5)  # this interpreter's start-up (~0.1 s of CPU) is not part of the flood: keep them apart
    t0 = time.monotonic()  # CLOCK_MONOTONIC, the prober's clock too
    failed = 0
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            s.close()
            continue
        socks.append(s)
    opened = time.monotonic() - t0
    # a SYN the listen queue dropped is retried by the kernel: give the handshakes time to finish
    poller = select.epoll()
    for s in socks:
        poller.register(s.fileno(), select.EPOLLOUT)
    pending = {s.fileno(): s for s in socks}
    connected = 0
    deadline = time.monotonic() + max(hold_s, 1.0)
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.1):
            s = pending.pop(fd)
            poller.unregister(fd)
            connected += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    handshakes = time.monotonic() - t0
    time.sleep(max(0.0, hold_s - (time.monotonic() - t0)))
    for s in socks:
        s.close()
    return {"started_at": t0, "requested": n, "opened": len(socks), "failed": failed, "connected": connected,
            "open_s": round(opened, 3), "handshakes_s": round(handshakes, 3)}


if __name__ == "__main__":
    print(json.dumps(burst(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))), flush=True)
