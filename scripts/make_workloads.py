"""Regenerate the bundled benchmark workloads from the held-out split of the training corpus.

    .venv/bin/python scripts/make_workloads.py            # writes src/specdecode/bench/workloads/stdlib-heldout-v1.jsonl
    .venv/bin/python scripts/make_workloads.py --check    # exit 1 if the file on disk differs

Deterministic: the held-out files are chosen by a hash of their paths
(specdecode.train.data) and every choice here uses a seeded RNG. The held-out
text is the running interpreter's stdlib, so regenerate with the same Python
minor version (the file records it) or bump the version in the file name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdecode.bench.workloads import DEFAULT_WORKLOAD, SourceFile, build_default_workloads, save_workloads
from specdecode.train.data import held_out_files, read_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_WORKLOAD)
    ap.add_argument("--corpus", action="append", help="corpus spec as for `specdecode train` (default: the stdlib)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with the file on disk instead of writing")
    args = ap.parse_args()
    files = [SourceFile(f.rel, read_text(f)) for f in held_out_files(args.corpus)]
    workloads = build_default_workloads(files, seed=args.seed)
    text = "".join(w.to_json() + "\n" for w in workloads)
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    save_workloads(workloads, args.out)
    counts: dict[str, int] = {}
    for w in workloads:
        counts[w.category] = counts.get(w.category, 0) + 1
    print(f"wrote {len(workloads)} workloads {counts} from {len(files)} held-out files "
          f"(Python {sys.version_info.major}.{sys.version_info.minor}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
