"""`specdecode bench busy`: decoding speed with default threads while other processes hold the cores.

A user's machine is rarely idle. This runs the same greedy chat request, as fresh processes, in three arms:

* **default**: `specdecode generate` as a user runs it (torch's thread count, the thread governor on);
* **1 thread**: the same command with ``OMP_NUM_THREADS=1`` (the count that never waits for a core);
* **api**: the documented Python API, ``load_model`` + ``generate`` and nothing else (plain decoding);

first on the machine as it is ("idle"), then with ``--hogs`` busy-loop processes running (each holds a core).
Arms alternate within each round so that they share the moment's load. Issue 49's goals: default ≥ 0.8× the
1-thread speed when busy and ≥ 0.95× when idle, and the API ≥ 0.95× the CLI's plain speed in both.

    specdecode bench busy --target smollm2-135m-instruct --hogs 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator, Optional

from ..chat import encode_chats
from ..engine import generate
from ..models import load_model

PROMPT = "Write a Python function that reverses a list, then explain it."
HOG = "while True: pass"


def _cli(target: str, drafter: str, tokens: int) -> list[str]:
    return [sys.executable, "-m", "specdecode.cli", "generate", "--target", target, "--chat", "--prompt", PROMPT,
            "--drafter", drafter, "--max-new-tokens", str(tokens), "--ignore-eos", "--json"]


def _api(target: str, tokens: int) -> list[str]:
    return [sys.executable, "-m", "specdecode.bench.busy", "--api-child", target, str(tokens)]


def _tok_s(cmd: list[str], env: dict[str, str]) -> float:
    """One run's decode tokens/s from its last JSON line."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({out.returncode}): {out.stderr[-2000:]}")
    stats = json.loads(out.stdout.strip().splitlines()[-1])["stats"]
    return float(stats["decode_tokens_per_s"])


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


def measure(target: str, drafters: list[str], tokens: int, rounds: int, n_hogs: int) -> list[dict[str, object]]:
    """Median decode tokens/s per (condition, drafter, arm), arms interleaved within each round."""
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    one = {**base, "OMP_NUM_THREADS": "1"}
    arms = [(d, "default", _cli(target, d, tokens), base) for d in drafters]
    arms += [(d, "1 thread", _cli(target, d, tokens), one) for d in drafters]
    arms.append(("none", "api", _api(target, tokens), base))
    rows: list[dict[str, object]] = []
    for condition, n in (("idle", 0), (f"{n_hogs} busy", n_hogs)):
        samples: dict[tuple[str, str], list[float]] = {(d, a): [] for d, a, _, _ in arms}
        with hogs(n):
            for _ in range(rounds):
                for d, a, cmd, env in arms:
                    samples[(d, a)].append(_tok_s(cmd, env))
        for (d, a), xs in samples.items():
            rows.append({"condition": condition, "drafter": d, "arm": a, "tok_s": statistics.median(xs),
                         "samples": xs})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    """Markdown: per condition and drafter, each arm's median and the goals' ratios."""
    by = {(r["condition"], r["drafter"], r["arm"]): float(r["tok_s"]) for r in rows}  # type: ignore[arg-type]
    lines = ["| condition | drafter | default tok/s | 1 thread tok/s | default / 1 thread | api tok/s | api / CLI |",
             "|---|---|---|---|---|---|---|"]
    for cond, drafter in dict.fromkeys((r["condition"], r["drafter"]) for r in rows):
        dflt, one = by[(cond, drafter, "default")], by[(cond, drafter, "1 thread")]
        api = by.get((cond, drafter, "api"))
        api_s = f"{api:.1f} | {api / dflt:.2f}" if api is not None else "– | –"
        lines.append(f"| {cond} | {drafter} | {dflt:.1f} | {one:.1f} | {dflt / one:.2f} | {api_s} |")
    return "\n".join(lines)


def cmd_busy(args: argparse.Namespace) -> int:
    rows = measure(args.target, [d for d in args.drafters.split(",") if d], args.max_new_tokens, args.rounds,
                   args.hogs)
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
