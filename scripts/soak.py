"""Long soak of a real `specdecode serve`: mixed clients, disconnects, client timeouts, 429 storms.

The CI test (tests/server/test_server_soak.py) runs the same driver for ~30 s; this runs it for
``--duration`` seconds against a server it starts (``--target``, default: a tiny checkpoint built
in a temporary folder) or one already running (``--url``), then checks: no 5xx, no lost request
(every one completed, refused or cancelled, and /metrics agrees), RSS growth after warm-up, rows
back to zero, greedy outputs identical to lone requests. Writes a JSON summary with ``--out``.

    python scripts/soak.py --duration 600 --out runs/soak.json
    python scripts/soak.py --duration 600 --target models/TARGET -- --drafter model --draft models/DRAFT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT / "tests")]

from serve_process import ServeProcess  # noqa: E402
from soak_driver import check_against_metrics, soak  # noqa: E402

DEFAULT_SERVE = ["--drafter", "ngram", "--gamma", "4", "--max-batch-size", "8", "--max-queue", "8",
                 "--request-timeout", "60"]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (default: 600)")
    ap.add_argument("--url", help="soak a server that is already running (its model name from /v1/models)")
    ap.add_argument("--target", help="model directory to serve (default: a tiny llama built in a temp folder)")
    ap.add_argument("--workers", type=int, default=10, help="concurrent mixed clients (default: 10)")
    ap.add_argument("--storm-size", type=int, default=40, help="requests in each 429 storm (default: 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the summary as JSON here")
    ap.add_argument("serve_args", nargs="*", help="flags for `specdecode serve` after `--` "
                                                  f"(default: {' '.join(DEFAULT_SERVE)})")
    args = ap.parse_args(argv)

    srv: Optional[ServeProcess] = None
    tmp = tempfile.TemporaryDirectory()
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            target = args.target
            if target is None:
                from tiny import build_model

                target = str(build_model(Path(tmp.name) / "tiny-llama", "llama", seed=0, max_position_embeddings=4096))
            print(f"starting specdecode serve --target {target} ...", flush=True)
            srv = ServeProcess(Path(target), args.serve_args or DEFAULT_SERVE)
            url = srv.url
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        rss: list[tuple[float, int]] = []
        start = time.monotonic()

        def tick(left: float) -> None:
            if srv is not None:
                rss.append((round(time.monotonic() - start, 1), srv.rss_kb()))
            if left > 0 and int(left) % 30 == 0:
                print(f"  {left:.0f} s left", flush=True)

        before = httpx.get(url + "/metrics").text
        tally = asyncio.run(soak(url, model, args.duration, seed=args.seed, workers=args.workers,
                                 storm_size=args.storm_size, on_tick=tick))
        deadline = time.monotonic() + 30
        health = httpx.get(url + "/health").json()
        while (health["active_rows"] or health["queue_depth"]) and time.monotonic() < deadline:
            time.sleep(0.2)
            health = httpx.get(url + "/health").json()
        time.sleep(0.5)
        after = httpx.get(url + "/metrics").text
        problems = tally.problems + check_against_metrics(tally, before, after)
        if health["active_rows"] or health["queue_depth"]:
            problems.append(f"rows not back to zero: {health}")
        warm = [kb for t, kb in rss if t >= args.duration / 3]
        growth = (rss[-1][1] / warm[0] - 1.0) if warm and rss else None
        if growth is not None and growth > 0.05:
            problems.append(f"RSS grew {growth:.1%} after warm-up")
        summary: dict[str, Any] = {
            "duration_s": args.duration, "sent": tally.sent, "completed": tally.completed, "refused": tally.refused,
            "client_gave_up": tally.client_gave_up, "invalid": tally.invalid, "greedy_checked": tally.greedy_checked,
            "statuses": tally.statuses, "rss_kb_after_warmup": warm[0] if warm else None,
            "rss_kb_end": rss[-1][1] if rss else None, "rss_growth": growth, "problems": problems[:50],
        }
        print(json.dumps(summary, indent=2))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if problems else 0
    finally:
        if srv is not None:
            srv.kill()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
