"""Variants of the EAGLE and Medusa drafters side by side, in one process: drafts, tree shapes, edge
calibrations, run-time weight formats (and training-free layer skip with gamma auto against plain).

The bench compares drafters by name; this compares settings that have no flag of their own, on the
same prompts, each prompt run by every variant in turn (order reversed on odd passes), the drafters
kept across prompts as a server keeps them. Every output is checked against plain decoding's. Prints
per category tok/s, the speedup over plain and tau.

    python scripts/drafter_variants.py eagle --shapes 1x1,2x2,4x4 --per-category 3 --reps 2
    python scripts/drafter_variants.py eagle --shapes 1x1,4x4 --heads-eagle models/code-eagle,runs/new-eagle

    python scripts/drafter_variants.py medusa --medusa tree-int8,tree-dense,chain-int8,chain-dense

A shape KxE is EAGLE-2's tree: K children per expanded node, E nodes expanded per level (1x1 is a
chain; the drafter's default is 4x4); KxEp uses one edge-calibration table for first and other
children alike (the drafter before session 9); KxEf expands every frontier node at every level
(the growth rule before session 10; now a level expands only the nodes that pay). A Medusa variant is SHAPE-FORMAT: tree or chain,
with the heads' run-time weights int8 (the default) or dense (the target's dtype).
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
import torch

import specdecode
from specdecode.drafters import DrafterOptions, build_drafter
from specdecode.drafters.eagle import EagleDrafter, EdgeCalibration
from specdecode.drafters.medusa import MedusaDrafter


class PooledEdges(EdgeCalibration):
    """The edge calibration before session 9: one table for a parent's first and other children."""

    def rate(self, p: float, first: bool = True) -> float:
        return super().rate(p, True)

    def observe(self, p: float, ok: bool, first: bool = True) -> None:
        super().observe(p, ok, True)


def full_levels(d: EagleDrafter) -> EagleDrafter:
    """The growth rule before session 10: a level expands every frontier node (up to ``expand``)."""

    def expansion(values: list[float], frontier: list[float], spent: float, cap: int) -> tuple[int, float]:
        m = len(frontier)
        hyp = sorted(values + [v * d._top1 for v in frontier], reverse=True)[:cap]
        return m, d._speedup(hyp, spent + d._level_cost(m))[1]

    d._expansion = expansion  # type: ignore[method-assign]
    return d


def variants(args: argparse.Namespace) -> dict[str, object]:
    """Plain decoding, then every (EAGLE directory, shape) pair or every Medusa variant."""
    out: dict[str, object] = {"plain": None}
    if args.kind == "layerskip":  # the training-free self-draft with its cost model's gamma
        out["layerskip auto"] = build_drafter("layerskip", DrafterOptions(gamma="auto"))
        return out
    if args.kind == "medusa":
        for v in args.medusa.split(","):
            shape, fmt = v.split("-")
            if shape not in ("tree", "chain") or fmt not in ("int8", "dense"):
                raise SystemExit(f"--medusa: a variant is tree|chain-int8|dense, got {v!r}")
            out[f"medusa {v}"] = MedusaDrafter.load(args.heads_medusa, tree=shape == "tree",
                                                    quant=None if fmt == "dense" else fmt)
        return out
    dirs = args.heads_eagle.split(",")
    for i, path in enumerate(dirs):
        for shape in args.shapes.split(","):
            flags = shape.lower().lstrip("0123456789x")
            k, e = (int(x) for x in shape.lower().rstrip("pf").split("x"))
            d = EagleDrafter.load(path)
            d.topk, d.expand = k, e
            if "p" in flags:
                d.edges = PooledEdges()
            if "f" in flags:
                full_levels(d)
            out[f"eagle{i if len(dirs) > 1 else ''} {k}x{e}{flags}"] = d
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["eagle", "medusa", "layerskip"],
                    help="the drafter whose variants are compared (layerskip: gamma auto against plain)")
    ap.add_argument("--shapes", default="1x1,2x2,4x4", help="tree shapes KxE, KxEp or KxEf (default: %(default)s)")
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--heads-eagle", default="models/code-eagle",
                    help="EAGLE directory; several, comma-separated, are compared (eagle0, eagle1, ...)")
    ap.add_argument("--heads-medusa", default="models/code-medusa", help="Medusa heads directory")
    ap.add_argument("--medusa", default="tree-int8,tree-dense,chain-int8",
                    help="Medusa variants SHAPE-FORMAT, comma-separated (default: %(default)s)")
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
            print(f"{cat:11s} {v:17s} {row['tok_s']:7.1f} tok/s  {row['speedup']:.3f}x  tau {row['tau']:.2f}{by}")
    print(f"outputs differing from plain decoding: {mismatches}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": report, "mismatches": mismatches},
                                              indent=2) + "\n")
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
