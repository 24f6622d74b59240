"""`specdecode bench load`: `specdecode serve`'s throughput and latency per concurrency, speculation on vs off.

Each cell runs ``concurrency`` streaming clients that send greedy completions back to back for
``--duration`` seconds (requests still in flight are then cut off), with speculation on (the
server's default drafter) or off (``"drafter": "none"``: the same server and batch machinery, so
only speculation differs). It prints one row per cell and, per concurrency, each mode's throughput
over the first mode's, plus tokens per server CPU second (robust to other load on a shared machine).

``--modes`` compares other things the same way: each mode is ``off``, ``on`` or a drafter name sent
as the request's ``drafter`` field (two drafters in one server, alternating per repeat).

    specdecode bench load --url http://127.0.0.1:8000                  # a running server
    specdecode bench load --target DIR --draft DIR --concurrency 1 4 16
    specdecode bench load --drafter NAME --modes NAME_A NAME_B --repeats 2 --json out.json

Without ``--url`` it starts ``specdecode serve`` itself (``--max-batch-size`` = the largest
concurrency) and passes ``--target``, ``--draft``, ``--drafter``, ``--gamma``, ``--speculation`` on.

``--ray N`` compares servers instead of modes: ``serve`` with one engine of ``--server-threads``
threads (1 by default) against ``serve --ray --replicas N`` with N such replicas (the ``ray`` extra),
both started here and loaded in alternation; each cell's "mode" is then the server, and server CPU
counts every process under it (Ray's replicas included).

    specdecode bench load --ray 2 --concurrency 8 --duration 30 --repeats 2   # on an idle machine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

PROMPTS = [
    "def fibonacci(n):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "def quicksort(items):\n    ",
    "import os\n\ndef list_files(path):\n    ",
    "def add(a, b):\n    return",
    "class Point:\n    def __init__(self, x, y):\n",
    "def is_prime(n):\n    ",
    "for i in range(10):\n    ",
]


@dataclass
class Cell:
    concurrency: int
    mode: str  # "on" (the server's default drafter), "off" (none) or a drafter name
    latencies: list[float] = field(default_factory=list)  # completed requests only
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0  # tokens streamed inside the window (requests still running at its end included)
    done_tokens: int = 0  # tokens of completed requests, for tau
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    errors: int = 0
    wall: float = 0.0
    server_cpu_s: float = 0.0  # CPU time the server process used during the cell (0 = unknown)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        """Robust to other load on a shared machine: work per token, not waiting for a core."""
        return self.tokens / self.server_cpu_s if self.server_cpu_s else 0.0


def process_cpu_s(pid: Optional[int]) -> float:
    """User + system CPU seconds of a process, all threads (Linux /proc); 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(pid: Optional[int]) -> float:
    """``process_cpu_s`` of ``pid`` and every process under it (a Ray cluster's replicas run as its
    grandchildren); processes that ended during the cell are not counted, so take it across short cells."""
    if pid is None:
        return 0.0
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(process_cpu_s(p) for p in tree)


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, object], cell: Cell) -> None:
    t0 = time.perf_counter()
    first: Optional[float] = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            cell.errors += 1
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                cell.errors += 1
                return
            sd = chunk.get("specdecode") or {}
            n = len(sd.get("token_ids") or [])
            cell.tokens += n
            if first is None and n:
                first = time.perf_counter() - t0
            if "usage" in sd:
                u = sd["usage"]
                cell.done_tokens += u["completion_tokens"]
                cell.drafted += u["speculative"]["drafted"]
                cell.accepted += u["speculative"]["accepted"]
                cell.passes += u["speculative"]["target_passes"]
    cell.latencies.append(time.perf_counter() - t0)
    if first is not None:
        cell.ttfts.append(first)


async def run_cell(url: str, model: str, concurrency: int, mode: str, duration: float, max_tokens: int,
                   api_key: Optional[str]) -> Cell:
    """``concurrency`` clients send requests back to back; at the end of the window the requests in
    flight are cut off (their streams closed), so throughput is tokens streamed inside the window."""
    cell = Cell(concurrency, mode)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, headers=headers, limits=limits) as client:
        t0 = time.perf_counter()
        stop_at = t0 + duration

        async def worker(k: int) -> None:
            i = k
            while (left := stop_at - time.perf_counter()) > 0:
                body: dict[str, object] = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)],
                                           "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                           "stream": True}
                if mode != "on":  # "off" -> "none": the same server and batching, no speculation
                    body["drafter"] = "none" if mode == "off" else mode
                try:
                    await asyncio.wait_for(_one(client, url, body, cell), timeout=left)
                except asyncio.TimeoutError:
                    return
                i += concurrency

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        cell.wall = time.perf_counter() - t0
    return cell


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def print_table(cells: list[Cell]) -> None:
    print(f"{'conc':>4} {'spec':>4} {'reqs':>5} {'tokens':>7} {'tok/s':>8} {'tok/cpu-s':>9} {'p50 lat':>8} "
          f"{'p95 lat':>8} {'p50 ttft':>8} {'alpha':>6} {'tau':>5} {'err':>4}")
    for c in cells:
        alpha = c.accepted / c.drafted if c.drafted else 0.0
        tau = c.done_tokens / c.passes if c.passes else 0.0
        print(f"{c.concurrency:>4} {c.mode:>4} {len(c.latencies):>5} {c.tokens:>7} {c.tokens_per_s:>8.1f} "
              f"{c.tokens_per_cpu_s:>9.1f} {_pct(c.latencies, .5):>8.3f} {_pct(c.latencies, .95):>8.3f} "
              f"{_pct(c.ttfts, .5):>8.3f} "
              f"{alpha:>6.2f} {tau:>5.2f} {c.errors:>4}")
    print()
    for r in ratios(cells):
        flag = "" if r["tokens_per_s_ratio"] >= 0.95 else f"   <-- {r['mode']} more than 5% slower"
        line = (f"concurrency {r['concurrency']:>3}: {r['mode']}/{r['baseline']} tok/s = {r['tokens_per_s'][0]:.1f}/"
                f"{r['tokens_per_s'][1]:.1f} = {r['tokens_per_s_ratio']:.3f}{flag}")
        if r["tokens_per_cpu_s_ratio"] is not None:
            line += (f" | tok/cpu-s = {r['tokens_per_cpu_s'][0]:.1f}/{r['tokens_per_cpu_s'][1]:.1f} = "
                     f"{r['tokens_per_cpu_s_ratio']:.3f}")
        print(line)


def ratios(cells: list[Cell]) -> list[dict[str, Any]]:
    """Per concurrency, every mode against the first mode run (the baseline): mean tok/s over its
    cells, and tokens per server CPU second pooled over them (None when the server's CPU is unknown)."""
    by: dict[int, dict[str, list[Cell]]] = {}
    for c in cells:
        by.setdefault(c.concurrency, {}).setdefault(c.mode, []).append(c)
    out: list[dict[str, Any]] = []
    for conc, modes in sorted(by.items()):
        names = list(modes)
        base = names[0]
        for mode in names[1:]:
            a, b = modes[mode], modes[base]
            tps = (statistics.mean(c.tokens_per_s for c in a), statistics.mean(c.tokens_per_s for c in b))
            row: dict[str, Any] = {"concurrency": conc, "mode": mode, "baseline": base, "tokens_per_s": tps,
                                   "tokens_per_s_ratio": tps[0] / tps[1] if tps[1] else float("nan"),
                                   "tokens_per_cpu_s": None, "tokens_per_cpu_s_ratio": None}
            if all(c.server_cpu_s for c in a + b):
                cpu = (sum(c.tokens for c in a) / sum(c.server_cpu_s for c in a),
                       sum(c.tokens for c in b) / sum(c.server_cpu_s for c in b))
                row.update(tokens_per_cpu_s=cpu, tokens_per_cpu_s_ratio=cpu[0] / cpu[1])
            out.append(row)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(serve_args: list[str], port: int, threads: Optional[int], timeout: float = 120.0,
                 replicas: int = 0) -> subprocess.Popen[bytes]:
    """``specdecode serve`` on ``port``, once /health says 200 (and, with ``replicas``, that many report)."""
    cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--port", str(port), *serve_args]
    env = dict(os.environ)
    if threads is not None:  # on a shared machine, fewer intra-op threads spin less under contention
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            if r.status_code == 200 and r.json().get("replicas_live", 0) >= replicas:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start within {timeout:.0f} s (first start measures costs; see --start-timeout)")


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("load", help="throughput and latency of `specdecode serve` under concurrent clients, "
                                     "speculation on vs off",
                        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (otherwise one is started)")
    ap.add_argument("--api-key")
    ap.add_argument("--target", help="target model for the server this command starts (default: the bundled one)")
    ap.add_argument("--draft", help="draft model directory for that server")
    ap.add_argument("--drafter", default=None, help="that server's default drafter (default: serve's)")
    ap.add_argument("--modes", nargs="+", default=["off", "on"],
                    help="what each cell runs: off (no drafter), on (the server's default) or a drafter name sent "
                         "per request; ratios are against the first (default: off on)")
    ap.add_argument("--gamma", default="4", help="the server's --gamma: N or auto, the most tokens a pass (default: 4)")
    ap.add_argument("--speculation", default="auto",
                    help="the server's --speculation: auto (the cost policy may draft fewer than --gamma, as "
                         "earlier load figures did) or always (default: auto)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="(default: 1 4 16)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load per cell (default: 10)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: 64)")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the modes this many times per concurrency")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of untimed load per mode before the cells")
    ap.add_argument("--server-threads", type=int, help="OMP/MKL threads of the server this command starts")
    ap.add_argument("--ray", type=int, metavar="N",
                    help="compare `serve` (one engine) with `serve --ray --replicas N` (N engines of --server-threads "
                         "threads each, 1 by default), both started here, instead of modes (needs the ray extra)")
    ap.add_argument("--json", help="also write the cells to this JSON file")
    ap.add_argument("--start-timeout", type=float, default=300.0,
                    help="seconds to wait for the server this command starts (its first start measures pass costs)")
    ap.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise, under the CLI's logging
    if args.ray is not None:
        return cmd_load_ray(args)
    proc: Optional[subprocess.Popen[bytes]] = None
    url = args.url
    try:
        if url is None:
            serve_args = _serve_args(args)
            port = _free_port()
            proc = start_server(serve_args, port, args.server_threads, args.start_timeout)
            url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(url + "/v1/models", headers=headers).json()["data"][0]["id"]
        load_start = os.getloadavg()[0]
        print(f"server {url}, model {model}, {args.duration:.0f}s per cell, {args.max_tokens} tokens per request, "
              f"torch threads per process as configured, machine load {load_start:.1f}", flush=True)
        # warm-up: lets the server's policy measure pass costs (every batch width) before anything is timed
        for mode in args.modes:
            for conc in sorted(set(args.concurrency), reverse=True):
                asyncio.run(run_cell(url, model, conc, mode, min(args.warmup, args.duration), args.max_tokens,
                                     args.api_key))
        cells: list[Cell] = []
        for conc in args.concurrency:
            for r in range(args.repeats):
                for mode in (args.modes if r % 2 == 0 else args.modes[::-1]):  # alternate to spread drift
                    cpu0 = process_cpu_s(proc.pid if proc else None)
                    cell = asyncio.run(run_cell(url, model, conc, mode, args.duration, args.max_tokens, args.api_key))
                    cell.server_cpu_s = process_cpu_s(proc.pid if proc else None) - cpu0
                    cells.append(cell)
                    print(f"  done: concurrency {conc}, mode {mode}: {cells[-1].tokens_per_s:.1f} tok/s", flush=True)
        print()
        print_table(cells)
        health = httpx.get(url + "/health", headers=headers).json()
        print("\nserver policy:", json.dumps(health.get("speculation", {})))
        if args.json:
            Path(args.json).write_text(json.dumps({
                "command": sys.argv, "machine_load_start": load_start, "modes": args.modes,
                "cells": [{**c.__dict__, "tokens_per_s": c.tokens_per_s, "tokens_per_cpu_s": c.tokens_per_cpu_s}
                          for c in cells],
                "ratios": ratios(cells), "server_policy": health.get("speculation", {})}, indent=1))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def _serve_args(args: argparse.Namespace) -> list[str]:
    out = ["--max-batch-size", str(max(args.concurrency)), "--speculation", args.speculation,
           "--gamma", str(args.gamma)]
    for flag, value in (("--target", args.target), ("--draft", args.draft), ("--drafter", args.drafter)):
        if value:
            out += [flag, value]
    return out


def _port_ray_leaves_alone() -> int:
    """A free port below the ephemeral range, where a starting Ray cluster takes its own ports."""
    for port in range(23000, 24000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    return _free_port()


def cmd_load_ray(args: argparse.Namespace) -> int:
    """``--ray N``: one `serve` against `serve --ray --replicas N`, the same engine threads per replica, each
    cell's mode the server; requests use the last of --modes (default: on, the servers' default drafter)."""
    if args.url:
        raise SystemExit("--ray starts both servers itself; leave out --url")
    threads = args.server_threads or 1
    base = _serve_args(args) + ["--threads", str(threads)]
    labels = ["serve", f"ray x{args.ray}"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls: dict[str, str] = {}
    mode = args.modes[-1]
    try:
        for label, extra, replicas in ((labels[0], [], 0), (labels[1], ["--ray", "--replicas", str(args.ray)],
                                                            args.ray)):
            port = _free_port() if not extra else _port_ray_leaves_alone()
            procs[label] = start_server(base + extra, port, threads, args.start_timeout, replicas)
            urls[label] = f"http://127.0.0.1:{port}"
        model = httpx.get(urls[labels[0]] + "/v1/models").json()["data"][0]["id"]
        load_start = os.getloadavg()[0]
        print(f"serve vs serve --ray --replicas {args.ray}, {threads} thread(s) per engine, mode {mode}, "
              f"{args.duration:.0f}s per cell, machine load {load_start:.1f} (compare only on an idle machine)",
              flush=True)
        for label in labels:  # warm-up: each replica measures its pass costs before anything is timed
            for conc in sorted(set(args.concurrency), reverse=True):
                asyncio.run(run_cell(urls[label], model, conc, mode, min(args.warmup, args.duration),
                                     args.max_tokens, args.api_key))
        cells: list[Cell] = []
        for conc in args.concurrency:
            for r in range(args.repeats):
                for label in (labels if r % 2 == 0 else labels[::-1]):
                    cpu0 = tree_cpu_s(procs[label].pid)
                    cell = asyncio.run(run_cell(urls[label], model, conc, mode, args.duration, args.max_tokens,
                                                args.api_key))
                    cell.server_cpu_s = tree_cpu_s(procs[label].pid) - cpu0
                    cell.mode = label
                    cells.append(cell)
                    print(f"  done: concurrency {conc}, {label}: {cell.tokens_per_s:.1f} tok/s", flush=True)
        print()
        print_table(cells)
        if args.json:
            Path(args.json).write_text(json.dumps({
                "command": sys.argv, "machine_load_start": load_start, "servers": labels, "mode": mode,
                "cells": [{**c.__dict__, "tokens_per_s": c.tokens_per_s, "tokens_per_cpu_s": c.tokens_per_cpu_s}
                          for c in cells], "ratios": ratios(cells)}, indent=1))
    finally:
        for proc in procs.values():
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0
