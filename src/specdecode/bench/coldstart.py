"""`specdecode bench coldstart`: what a user's first `specdecode serve` costs, with an empty cost cache.

It starts ``specdecode serve`` with ``SPECDECODE_CACHE`` pointing at a new empty folder (no cached pass
costs: the policy measures them quickly and refines them from live passes), then times:

* **/health**: seconds from launching the process to the first 200 (its state may be ``warming``);
* **first answer**: seconds from launch to the end of the first greedy request;
* **cold requests**: the first ``--requests`` greedy requests, one after another, with the server's default
  drafter, as a fresh deployment would serve them;
* **warm**: as many other requests of the same kinds with the default drafter (costs measured and refined,
  and the first answers in suffix drafting's index);
* **plain**: each request again with ``"drafter": "none"`` (plain decoding in the same server) right after
  it, so that each pair shares the machine's load of the moment (the speculative one first: suffix
  drafting never sees a request's own answer before it runs);
* **restarted**: a second server on the cost cache the first one measured and refined (a warm start),
  the cold requests again, each speculative then plain: what a warm server does with the same requests.

Speedup = plain seconds / speculative seconds over the same requests (``ignore_eos``: equal token counts).
The server's logs go to ``server.log`` and ``server-restart.log`` in the cache folder. Issue #30's goals:
/health within 10 s, the first answer within 15 s, and the cold requests' speedup within 10% of a warm
server's (the restarted one's, on the same requests).

    specdecode bench coldstart --target smollm2-135m-instruct --weight-dtype int4 --requests 10
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from .load import _free_port

# Two sets of short chat requests matched kind by kind (code, chat, edit, reasoning): the cold requests take the
# first, the warm ones the second, since suffix drafting remembers every answer and a repeated request would be
# drafted from its own earlier answer.
COLD = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the difference between a list and a tuple in Python?",
    "Explain in three sentences why the sky is blue.",
    "Rewrite this sentence to be more formal: gonna grab food, back soon.",
    "A train leaves at 3 pm and travels 120 km at 60 km/h. When does it arrive?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give three tips for writing clear documentation.",
    "Summarize what a hash table is for a beginner.",
    "Write a shell command that counts the lines of every .py file in a folder.",
    "Tom has 5 apples and gives away 2, then buys 7. How many does he have?",
)
WARM = (
    "Write a Python function that returns the factorial of n.",
    "What is the difference between a set and a dictionary in Python?",
    "Explain in three sentences why leaves change colour in autumn.",
    "Rewrite this sentence to be more polite: send me the file now.",
    "A car travels 150 km at 50 km/h, leaving at 9 am. When does it arrive?",
    "Write a Python function that counts the vowels in a string.",
    "Give three tips for naming variables well.",
    "Summarize what a linked list is for a beginner.",
    "Write a shell command that lists the five largest files in a folder.",
    "Anna has 12 pencils, loses 4, then gets 6 more. How many does she have?",
)


def _request(client: httpx.Client, url: str, model: str, question: str, max_tokens: int,
             drafter: Optional[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": question}],
                            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if drafter is not None:
        body["drafter"] = drafter
    t0 = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body)
    secs = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"request failed ({r.status_code}): {r.text[:500]}")
    return {"seconds": secs, "tokens": r.json()["usage"]["completion_tokens"]}


class _Server:
    """``specdecode serve`` in a subprocess with ``env``; ``health``: seconds from launch to the first
    /health 200 and its status; stopped on exit."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], log_path: Path) -> None:
        self.args, self.env, self.log_path = args, env, log_path
        self.url = ""
        self.t0 = 0.0
        self.health: tuple[float, Optional[str]] = (0.0, None)

    def __enter__(self) -> "_Server":
        args = self.args
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--port", str(port), "--target", args.target,
               "--drafter", args.drafter]
        if args.weight_dtype:
            cmd += ["--weight-dtype", args.weight_dtype]
        self.t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise SystemExit(f"server exited; its log ({self.log_path}) ends: "
                                     f"{self.log_path.read_text()[-2000:]}")
                if time.perf_counter() - self.t0 > args.start_timeout:
                    raise SystemExit(f"no /health 200 within {args.start_timeout:.0f} s (server log: {self.log_path})")
                try:
                    r = httpx.get(self.url + "/health", timeout=1)
                    if r.status_code == 200:
                        self.health = (time.perf_counter() - self.t0, r.json().get("status"))
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _paired(client: httpx.Client, url: str, model: str, questions: list[str], max_tokens: int,
            spec: Optional[list[dict[str, Any]]] = None, plain: Optional[list[dict[str, Any]]] = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each question with the server's default drafter, then at once plain (appended to ``spec`` and
    ``plain``): a pair shares the machine's load of the moment, so the speedup follows the server, not the
    noise (two blocks of ten a minute apart differed by up to 20% in plain speed here)."""
    spec, plain = ([] if spec is None else spec), ([] if plain is None else plain)
    for q in questions:
        spec.append(_request(client, url, model, q, max_tokens, None))
        plain.append(_request(client, url, model, q, max_tokens, "none"))
    return spec, plain


def _seconds(xs: list[dict[str, Any]]) -> float:
    return sum(r["seconds"] for r in xs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="specdecode-coldstart-"))
    env = dict(os.environ, SPECDECODE_CACHE=str(cache))
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    cold_q = [COLD[i % len(COLD)] for i in range(args.requests)]
    warm_q = [WARM[i % len(WARM)] for i in range(args.requests)]
    with _Server(args, env, cache / "server.log") as srv, httpx.Client(timeout=args.start_timeout) as client:
        model = client.get(srv.url + "/v1/models").json()["data"][0]["id"]

        cold, plain_cold = [_request(client, srv.url, model, cold_q[0], args.max_tokens, None)], []
        first = time.perf_counter() - srv.t0
        plain_cold.append(_request(client, srv.url, model, cold_q[0], args.max_tokens, "none"))
        _paired(client, srv.url, model, cold_q[1:], args.max_tokens, cold, plain_cold)
        warm, plain_warm = _paired(client, srv.url, model, warm_q, args.max_tokens)
    # a restart on the costs the first server measured and refined: the same requests, the same
    # empty suffix index and acceptance history; only the cost cache differs from the cold start
    with _Server(args, env, cache / "server-restart.log") as again, \
            httpx.Client(timeout=args.start_timeout) as client:
        restart, plain_restart = _paired(client, again.url, model, cold_q, args.max_tokens)
    s_cold, p_cold = _seconds(cold), _seconds(plain_cold)
    speedup_restart = _seconds(plain_restart) / _seconds(restart)
    return {"command": sys.argv, "target": args.target, "drafter": args.drafter, "weight_dtype": args.weight_dtype,
            "threads": args.threads, "machine_load": os.getloadavg()[0], "server_log": str(srv.log_path),
            "health_s": srv.health[0], "health_status": srv.health[1], "first_answer_s": first,
            "restart_health_s": again.health[0], "requests": args.requests, "max_tokens": args.max_tokens,
            "cold": cold, "warm": warm, "plain_cold": plain_cold, "plain_warm": plain_warm, "restart": restart,
            "plain_restart": plain_restart, "speedup_cold": p_cold / s_cold,
            "speedup_cold_after_first": _seconds(plain_cold[1:]) / max(1e-9, _seconds(cold[1:])),
            "speedup_warm": _seconds(plain_warm) / _seconds(warm), "speedup_restart": speedup_restart,
            "cold_over_restart": (p_cold / s_cold) / speedup_restart}


def cmd_coldstart(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    rounds = []
    for i in range(args.rounds):
        if args.rounds > 1:
            print(f"round {i + 1} of {args.rounds}")
        rounds.append(_report(run(args)))
    summary: dict[str, Any] = {"rounds": rounds}
    if args.rounds > 1:
        summary |= {k: statistics.median(r[k] for r in rounds) for k in SUMMARY}
        print("median over the rounds: " + ", ".join(f"{k} {summary[k]:.3f}" for k in SUMMARY))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


SUMMARY = ("health_s", "first_answer_s", "speedup_cold", "speedup_restart", "cold_over_restart", "speedup_warm")


def _report(res: dict[str, Any]) -> dict[str, Any]:
    print(f"/health 200 after {res['health_s']:.1f} s (status {res['health_status']!r}); first answer after "
          f"{res['first_answer_s']:.1f} s")
    print(f"first {res['requests']} requests: speedup {res['speedup_cold']:.2f}x over plain ("
          f"{res['speedup_cold_after_first']:.2f}x without the first); the same requests after a restart on the "
          f"measured costs: {res['speedup_restart']:.2f}x; cold / restarted {res['cold_over_restart']:.3f}")
    print(f"{res['requests']} later requests of the same kinds on the first server: {res['speedup_warm']:.2f}x "
          f"(its suffix index holds the first answers)")
    print(f"machine load {res['machine_load']:.1f}")
    return res


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return n


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("coldstart", help="a first `specdecode serve` with an empty cost cache: seconds to /health "
                                          "and to the first answer, and the first requests' speedup against warm",
                        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct",
                    help="a target with a chat template (default: %(default)s)")
    ap.add_argument("--drafter", default="auto", help="the server's default drafter (default: %(default)s)")
    ap.add_argument("--weight-dtype", default=None, help="the server's --weight-dtype (default: serve's)")
    ap.add_argument("--requests", type=_positive, default=10, help="cold requests, then as many warm and plain "
                                                             "(default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default: %(default)s)")
    ap.add_argument("--rounds", type=_positive, default=1, help="cold starts (each with its restart) to run; "
                    "more than one also prints the medians, since two servers' plain speeds differ by noise "
                    "(default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="the server's OMP threads (default: %(default)s)")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for /health 200")
    ap.add_argument("--json", help="also write the result (every request's seconds) to this JSON file")
    ap.set_defaults(func=cmd_coldstart)
