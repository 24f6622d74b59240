"""Send the hostile-client corpus (tests/server/test_server_hostile.py, ~150 requests) to a server.

For probing a deployed `specdecode serve` the way the test suite probes its own: every request
should get a 4xx with OpenAI's error body naming the field (or a 2xx where the corpus allows one),
never a 5xx or internal exception text. Prints one line per unexpected answer and a summary.

    python scripts/probe_corpus.py --url http://127.0.0.1:8000 [--api-key KEY]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT / "tests")]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' when the server wants one")
    args = ap.parse_args(argv)
    url = args.url.rstrip("/")
    model = httpx.get(url + "/v1/models", headers=_auth(args.api_key)).json()["data"][0]["id"]

    import test_server_hostile as hostile

    hostile.MODEL_NAME = model  # the corpus is written for the test server's model name
    hostile.OK["model"] = hostile.CHAT["model"] = model
    cases = hostile.corpus()
    bad = 0
    counts: dict[int, int] = {}
    with httpx.Client(timeout=60) as client:
        for c in cases:
            c.headers.update(_auth(args.api_key))
            try:
                r = hostile._send(client, url, c)
            except httpx.HTTPError as e:
                bad += 1
                print(f"{c.name}: connection error {type(e).__name__}")
                continue
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            allowed = c.status if isinstance(c.status, tuple) else (c.status,)
            try:
                if r.status_code >= 400:
                    hostile.check_error_response(r)
                ok = r.status_code in allowed and r.status_code < 500
            except (AssertionError, ValueError, KeyError) as e:
                ok = False
                print(f"{c.name}: bad error body: {e}")
            if not ok:
                bad += 1
                print(f"{c.name}: HTTP {r.status_code} (expected {allowed}): {r.text[:200]}")
    print(f"{len(cases)} requests, {bad} unexpected; statuses: {dict(sorted(counts.items()))}")
    return 1 if bad else 0


def _auth(key: Optional[str]) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


if __name__ == "__main__":
    sys.exit(main())
