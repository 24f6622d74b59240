"""A user with one checkpoint: ``--drafter auto`` with no draft model and no heads, against its members alone.

Auto's members are then what needs nothing but the target: calibrated layer skip, the target's int4
copy (``quant``), suffix drafting and prompt lookup (``drafters/registry.py``). The script times
plain decoding, ``quant``, ``suffix`` and ``auto`` on the same prompts, in turn prompt by prompt
(greedy, EOS ignored, the drafters kept across prompts as a server keeps them), checks that every
output equals plain decoding's, and prints tok/s, the ratio to plain and which members auto's
accepted tokens came from.

    python scripts/auto_one_checkpoint.py --workload src/specdecode/bench/workloads/mixed-heldout-v1.jsonl \\
        --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import specdecode
from specdecode.drafters import DrafterOptions, build_drafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--workload", default="src/specdecode/bench/workloads/mixed-heldout-v1.jsonl")
    ap.add_argument("--prompts", type=int, default=0, help="the workload's first N prompts (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1, help="passes over the prompts; from the second on, suffix drafting "
                    "recalls the first pass's outputs (its index is shared across requests), which flatters it")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specdecode.load_model(args.target)
    rows = [json.loads(line) for line in Path(args.workload).read_text().splitlines() if line.strip()]
    rows = rows[:args.prompts] if args.prompts else rows
    drafters = {"plain": None, "quant": build_drafter("quant", DrafterOptions()),
                "suffix": build_drafter("suffix", DrafterOptions()), "auto": build_drafter("auto", DrafterOptions())}
    kw = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    for d in drafters.values():  # warm-up: kernels, quantized copy, cost measurements
        specdecode.generate(target, rows[0]["prompt"], drafter=d, **kw)
    seconds = dict.fromkeys(drafters, 0.0)
    tokens = dict.fromkeys(drafters, 0)
    accepted_by: dict[str, int] = {}
    for _ in range(args.reps):
        for row in rows:
            reference = None
            for name, d in drafters.items():
                t0 = time.perf_counter()
                r = specdecode.generate(target, row["prompt"], drafter=d, **kw)
                seconds[name] += time.perf_counter() - t0
                tokens[name] += len(r.token_ids)
                reference = r.token_ids if reference is None else reference
                if r.token_ids != reference:
                    raise SystemExit(f"{name} changed the output of {row['id']}: a bug")
                if name == "auto":
                    for src, n in r.stats.accepted_by.items():
                        accepted_by[src] = accepted_by.get(src, 0) + n
    rate = {k: tokens[k] / seconds[k] for k in drafters}
    members = [m.name for m in drafters["auto"].members]  # type: ignore[union-attr]
    print(f"auto's members here: {', '.join(members)}")
    print("  ".join(f"{k} {rate[k]:.1f} tok/s ({rate[k] / rate['plain']:.2f}x)" for k in drafters))
    print(f"auto's accepted tokens by member: {accepted_by}; every output equals plain decoding's")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "workload": args.workload,
                                               "prompts": len(rows), "reps": args.reps, "tok_s": rate,
                                               "speedup": {k: rate[k] / rate["plain"] for k in rate},
                                               "auto_members": members, "auto_accepted_by": accepted_by}, indent=1))


if __name__ == "__main__":
    main()
