"""`specdecode bench busy`: decoding speed with default threads while other processes hold the cores.

A user's machine is rarely idle. This runs the same greedy chat request, as fresh processes, through each entry
point a user meets (``--entries``: `specdecode generate`, `specdecode chat --prompt`, one request to `specdecode
serve`), in two arms each:

* **default**: the command as a user runs it (torch's thread count, the thread governor on);
* **1 thread**: the same command with ``OMP_NUM_THREADS=1`` (the count that never waits for a core);

and **api**, the documented Python API, ``load_model`` + ``generate`` and nothing else (plain decoding); first on
the machine as it is ("idle"), then with ``--hogs`` busy-loop processes running (each holds a core). Arms
alternate within each round so that they share the moment's load. Issue 49's goals: default ≥ 0.8× the 1-thread
speed when busy and ≥ 0.95× when idle, and the API ≥ 0.95× the CLI's plain speed in both.

    specdecode bench busy --target smollm2-135m-instruct --hogs 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import httpx

from ..chat import encode_chats
from ..engine import generate
from ..models import load_model

PROMPT = "Write a Python function that reverses a list, then explain it."
HOG = "while True: pass"


ENTRIES = ("generate", "chat", "serve")
CHAT_FIGURES = re.compile(r"\[([0-9.]+) tok/s \|")  # the line chat prints after a reply
Run = Callable[[dict[str, str]], float]  # one fresh process's tokens/s under an environment


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... failed ({out.returncode}): {out.stderr[-2000:]}")
    return out


def _cli(entry: str, target: str, drafter: str, tokens: int) -> list[str]:
    args = ["generate", "--chat", "--json"] if entry == "generate" else ["chat", "--no-repetition-stop", "--no-color"]
    return [sys.executable, "-m", "specdecode.cli", *args, "--target", target, "--prompt", PROMPT,
            "--drafter", drafter, "--max-new-tokens", str(tokens), "--ignore-eos"]


def generate_run(target: str, drafter: str, tokens: int) -> Run:
    """`specdecode generate --json`: decode tokens/s from its last JSON line."""
    cmd = _cli("generate", target, drafter, tokens)
    return lambda env: float(json.loads(_run(cmd, env).stdout.strip().splitlines()[-1])["stats"]
                             ["decode_tokens_per_s"])


def chat_run(target: str, drafter: str, tokens: int) -> Run:
    """`specdecode chat --prompt`: the tokens/s of the figures line it prints after the reply."""
    cmd = _cli("chat", target, drafter, tokens)

    def one(env: dict[str, str]) -> float:
        found = CHAT_FIGURES.findall(_run(cmd, env).stderr)
        if not found:
            raise RuntimeError("specdecode chat printed no figures line")
        return float(found[-1])
    return one


def serve_run(target: str, drafter: str, tokens: int) -> Run:
    """A fresh `specdecode serve`, one chat completion through its HTTP API: the decode tokens/s the server
    reports for it (``specdecode.decode_tokens_per_s``)."""
    def one(env: dict[str, str]) -> float:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        log = tempfile.TemporaryFile("w+")  # a file, not a pipe: nobody reads the log while it serves
        proc = subprocess.Popen([sys.executable, "-m", "specdecode.cli", "serve", "--target", target, "--drafter",
                                 drafter, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"specdecode serve exited ({proc.returncode}): {log.read()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("specdecode serve did not answer /health in 600 s")
                time.sleep(0.2)
            r = httpx.post(url + "/v1/chat/completions", timeout=900, json={
                "model": target, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                "temperature": 0.0, "ignore_eos": True})
            r.raise_for_status()
            return float(r.json()["specdecode"]["decode_tokens_per_s"])
        finally:
            proc.kill()
            proc.wait()
            log.close()
    return one


def api_run(target: str, tokens: int) -> Run:
    """The Python API in a fresh process (``--api-child``): its decode tokens/s."""
    cmd = [sys.executable, "-m", "specdecode.bench.busy", "--api-child", target, str(tokens)]
    return lambda env: float(json.loads(_run(cmd, env).stdout.strip().splitlines()[-1])["stats"]
                             ["decode_tokens_per_s"])


RUNS = {"generate": generate_run, "chat": chat_run, "serve": serve_run}


@contextmanager
def hogs(n: int) -> Iterator[None]:
    """``n`` processes that each keep a core busy for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def measure(target: str, entries: list[str], drafters: list[str], tokens: int, rounds: int,
            n_hogs: int) -> list[dict[str, object]]:
    """Median tokens/s per (condition, entry, drafter, arm), arms interleaved within each round."""
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    one = {**base, "OMP_NUM_THREADS": "1"}
    arms = [(e, d, a, RUNS[e](target, d, tokens), env) for e in entries for d in drafters
            for a, env in (("default", base), ("1 thread", one))]
    arms.append(("api", "none", "default", api_run(target, tokens), base))
    rows: list[dict[str, object]] = []
    for condition, n in (("idle", 0), (f"{n_hogs} busy", n_hogs)):
        samples: dict[tuple[str, str, str], list[float]] = {(e, d, a): [] for e, d, a, _, _ in arms}
        with hogs(n):
            for _ in range(rounds):
                for e, d, a, run, env in arms:
                    samples[(e, d, a)].append(run(env))
        for (e, d, a), xs in samples.items():
            rows.append({"condition": condition, "entry": e, "drafter": d, "arm": a,
                         "tok_s": statistics.median(xs), "samples": xs})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    """Markdown: per condition, entry and drafter, both arms' medians and the goals' ratios (the API's row is
    set against `generate`'s plain default)."""
    by = {(r["condition"], r["entry"], r["drafter"], r["arm"]): float(r["tok_s"])  # type: ignore[arg-type]
          for r in rows}
    lines = ["| condition | entry | drafter | default tok/s | 1 thread tok/s | default / 1 thread |",
             "|---|---|---|---|---|---|"]
    for cond, entry, drafter in dict.fromkeys((r["condition"], r["entry"], r["drafter"]) for r in rows):
        dflt = by[(cond, entry, drafter, "default")]
        if entry == "api":
            cli = by.get((cond, "generate", "none", "default"))
            vs = f"{dflt / cli:.2f} of `generate`'s default" if cli else "–"
            lines.append(f"| {cond} | api | none | {dflt:.1f} | – | {vs} |")
            continue
        one = by[(cond, entry, drafter, "1 thread")]
        lines.append(f"| {cond} | {entry} | {drafter} | {dflt:.1f} | {one:.1f} | {dflt / one:.2f} |")
    return "\n".join(lines)


def cmd_busy(args: argparse.Namespace) -> int:
    entries = [e for e in args.entries.split(",") if e]
    unknown = sorted(set(entries) - set(ENTRIES))
    if unknown:
        print(f"specdecode bench busy: error: --entries {','.join(unknown)} unknown; choose from "
              f"{','.join(ENTRIES)}", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request to the servers it starts
    rows = measure(args.target, entries, [d for d in args.drafters.split(",") if d], args.max_new_tokens,
                   args.rounds, args.hogs)
    print(f"bench busy: {args.target}, {args.max_new_tokens} tokens, {args.rounds} rounds, {os.cpu_count()} CPUs")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "hogs": args.hogs, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("busy", help="default threads against 1 thread and the Python API, on an idle machine and "
                                     "with busy processes holding the cores",
                        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct", help="a target with a chat template "
                                                                      "(default: %(default)s)")
    ap.add_argument("--entries", default=",".join(ENTRIES), help="comma-separated entry points to run: "
                                                                  f"{', '.join(ENTRIES)} (default: %(default)s)")
    ap.add_argument("--drafters", default="none,auto", help="comma-separated drafters for the CLI arms "
                                                             "(default: %(default)s)")
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes in the busy condition "
                                                        "(default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per run (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per arm and condition (default: %(default)s)")
    ap.add_argument("--json", help="also write every run's tokens/s to this JSON file")
    ap.set_defaults(func=cmd_busy)


def _api_child(target_name: str, tokens: int) -> None:
    """The Python API as its documentation shows it, nothing else: load_model + generate."""
    target = load_model(target_name)
    ids = encode_chats(target, [(("user", PROMPT),)])[0]
    r = generate(target, ids, max_new_tokens=tokens, ignore_eos=True)
    print(json.dumps({"stats": {"decode_tokens_per_s": r.stats.decode_tokens_per_s}}))


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "--api-child":
        _api_child(argv[1], int(argv[2]))
    else:
        raise SystemExit("usage: specdecode bench busy ... (this module's entry point is for its own children)")


if __name__ == "__main__":
    main()
