"""Regenerate the repetitive and mixed benchmark workloads from the held-out split of the training corpus.

    .venv/bin/python scripts/make_repetitive_workload.py          # writes repetitive-heldout-v1.jsonl, mixed-heldout-v1.jsonl
    .venv/bin/python scripts/make_repetitive_workload.py --check  # exit 1 if the files on disk differ

``repetitive``: multi-turn edits of one function and agent tool-call loops (specdecode.bench.repetitive).
``mixed``: the default workload (``--mixed-per-category`` prompts of each of its categories) followed
by the repetitive one, for comparing ``--drafter auto`` with every single drafter. Deterministic, like
scripts/make_workloads.py (same Python minor version, or bump the version in the names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdecode.bench.repetitive import build_repetitive_workloads, mixed
from specdecode.bench.workloads import (
    DEFAULT_WORKLOAD,
    WORKLOAD_DIR,
    SourceFile,
    load_workloads,
    save_workloads,
)
from specdecode.train.data import held_out_files, read_text

REPETITIVE_WORKLOAD = WORKLOAD_DIR / "repetitive-heldout-v1.jsonl"
MIXED_WORKLOAD = WORKLOAD_DIR / "mixed-heldout-v1.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPETITIVE_WORKLOAD)
    ap.add_argument("--mixed-out", type=Path, default=MIXED_WORKLOAD)
    ap.add_argument("--mixed-per-category", type=int, default=6)
    ap.add_argument("--corpus", action="append", help="corpus spec as for `specdecode train` (default: the stdlib)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args()
    files = [SourceFile(f.rel, read_text(f)) for f in held_out_files(args.corpus)]
    rep = build_repetitive_workloads(files, seed=args.seed)
    mix = mixed(load_workloads(DEFAULT_WORKLOAD), rep, args.mixed_per_category)
    status = 0
    for path, records in ((args.out, rep), (args.mixed_out, mix)):
        text = "".join(w.to_json() + "\n" for w in records)
        if args.check:
            same = path.is_file() and path.read_text(encoding="utf-8") == text
            print(f"{path}: {'up to date' if same else 'DIFFERS from a fresh build'}")
            status |= 0 if same else 1
            continue
        save_workloads(records, path)
        counts: dict[str, int] = {}
        for w in records:
            counts[w.category] = counts.get(w.category, 0) + 1
        print(f"wrote {len(records)} workloads {counts} (Python {sys.version_info.major}.{sys.version_info.minor}) "
              f"to {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
