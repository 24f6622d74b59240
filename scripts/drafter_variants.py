"""Variants of the EAGLE drafter side by side, in one process: drafts, tree shapes, edge calibrations.

The bench compares drafters by name; this compares settings that have no flag of their own, on the
same prompts, each prompt run by every variant in turn (order reversed on odd passes), the drafters
kept across prompts as a server keeps them. Every output is checked against plain decoding's. Prints
per category tok/s, the speedup over plain and tau.

    python scripts/drafter_variants.py eagle --shapes 1x1,2x2,4x4 --per-category 3 --reps 2
    python scripts/drafter_variants.py eagle --shapes 1x1,4x4 --heads-eagle models/code-eagle,runs/new-eagle

A shape KxE is EAGLE-2's tree: K children per expanded node, E nodes expanded per level (1x1 is a
chain; the drafter's default is 4x4); KxEp uses one edge-calibration table for first and other
children alike (the drafter before session 9).
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
import torch

import specdecode
from specdecode.drafters.eagle import EagleDrafter, EdgeCalibration


class PooledEdges(EdgeCalibration):
    """The edge calibration before session 9: one table for a parent's first and other children."""

    def rate(self, p: float, first: bool = True) -> float:
        return super().rate(p, True)

    def observe(self, p: float, ok: bool, first: bool = True) -> None:
        super().observe(p, ok, True)


def variants(args: argparse.Namespace) -> dict[str, object]:
    """Plain decoding, then every (EAGLE directory, shape) pair."""
    out: dict[str, object] = {"plain": None}
    dirs = args.heads_eagle.split(",")
    for i, path in enumerate(dirs):
        for shape in args.shapes.split(","):
            pooled = shape.endswith("p")
            k, e = (int(x) for x in shape.rstrip("p").lower().split("x"))
            d = EagleDrafter.load(path)
            d.topk, d.expand = k, e
            if pooled:
                d.edges = PooledEdges()
            out[f"eagle{i if len(dirs) > 1 else ''} {k}x{e}{'p' if pooled else ''}"] = d
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["eagle"], help="the drafter whose variants are compared")
    ap.add_argument("--shapes", default="1x1,2x2,4x4", help="tree shapes KxE or KxEp (default: %(default)s)")
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--heads-eagle", default="models/code-eagle",
                    help="EAGLE directory; several, comma-separated, are compared (eagle0, eagle1, ...)")
    ap.add_argument("--workload", default="src/specdecode/bench/workloads/stdlib-heldout-v1.jsonl")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=384, help="cap on each prompt's own budget")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specdecode.load_model(args.target)
    rows = [json.loads(line) for line in Path(args.workload).read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[dict]] = collections.defaultdict(list)  # type: ignore[type-arg]
    for r in rows:
        by_cat[r["category"]].append(r)
    prompts = [r for c in by_cat.values() for r in c[: args.per_category]]
    ds = variants(args)
    # per (variant, category): tokens, target passes, seconds, accepted tokens by member
    stat = {(v, c): [0, 0, 0.0, collections.Counter()] for v in ds for c in by_cat}
    for d in ds.values():  # untimed: builds kernels and measures each drafter's costs once (cached on disk)
        specdecode.generate(target, prompts[0]["prompt"], drafter=d, max_new_tokens=8, ignore_eos=True)
    mismatches = 0
    for rep in range(args.reps):
        for d in ds.values():
            forget = getattr(d, "forget", None)
            if callable(forget):
                forget()
        for p in prompts:
            budget = min(int(p.get("max_new_tokens", 128)), args.max_new_tokens)
            ref = None
            for name in (list(ds) if rep % 2 == 0 else list(reversed(ds))):
                t0 = time.perf_counter()
                r = specdecode.generate(target, p["prompt"], drafter=ds[name], max_new_tokens=budget, ignore_eos=True)
                s = stat[(name, p["category"])]
                s[0] += len(r.token_ids)
                s[1] += r.stats.target_passes
                s[2] += time.perf_counter() - t0
                s[3].update(r.stats.accepted_by)
                if ref is None:
                    ref = r.token_ids
                elif r.token_ids != ref:
                    mismatches += 1
    report = []
    for cat in list(by_cat) + ["overall"]:
        base = None
        for v in ds:
            keys = [(v, c) for c in by_cat] if cat == "overall" else [(v, cat)]
            toks = sum(stat[k][0] for k in keys)
            passes = sum(stat[k][1] for k in keys)
            sec = sum(stat[k][2] for k in keys)
            acc: collections.Counter = collections.Counter()
            for k in keys:
                acc.update(stat[k][3])
            base = base or toks / sec
            row = {"category": cat, "variant": v, "tok_s": toks / sec, "speedup": toks / sec / base,
                   "tau": toks / passes, "accepted_by": dict(acc)}
            report.append(row)
            by = "" if v == "plain" or not acc else "  accepted by " + ", ".join(f"{n} {c}" for n, c in acc.items())
            print(f"{cat:11s} {v:12s} {row['tok_s']:7.1f} tok/s  {row['speedup']:.3f}x  tau {row['tau']:.2f}{by}")
    print(f"outputs differing from plain decoding: {mismatches}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": report, "mismatches": mismatches},
                                              indent=2) + "\n")
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
