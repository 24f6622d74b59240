"""`specdecode bench ops`: operators and host time per plain decode step on the eager path a GPU runs.

On a GPU a small model's step is bound by the host: each ``aten::`` operator is a kernel launch and some
Python, so the count per step is the figure to bring down. This counts them on the CPU's eager path
(``fast=False``), which runs the same operators CUDA does: the profiler's ``aten::`` events of a generate with
``--tokens`` + 1 new tokens less those of one with 1 (the prompt's prefill and the set-up cancel), over
``--tokens``, every nesting level counted. Host time per step is the same difference of wall times.

    specdecode bench ops --target smollm2-135m-instruct --dtype bf16 --weight-dtype bf16
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from ..engine import generate
from ..models import load_model

PROMPT = "def fib(n):"


def count_ops(target: Any, new_tokens: int) -> tuple[Counter[str], float]:
    """``aten::`` events by name, and wall seconds, of one greedy generate of ``new_tokens`` tokens."""
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(target, PROMPT, max_new_tokens=new_tokens, ignore_eos=True)
    wall = time.perf_counter() - t0
    names = Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return names, wall


def per_step(target: Any, tokens: int) -> dict[str, Any]:
    """Operators and host seconds per decode step: (tokens + 1)-token run less a 1-token run, over tokens."""
    count_ops(target, 2)  # first-call allocations and lazy set-up out of the way
    long_ops, long_s = count_ops(target, tokens + 1)
    short_ops, short_s = count_ops(target, 1)
    diff = long_ops - short_ops
    return {"aten_per_step": round(sum(diff.values()) / tokens, 1),
            "gemm_per_step": round((diff["aten::mm"] + diff["aten::addmm"]) / tokens, 1),  # linear's nested too
            "host_ms_per_step": round((long_s - short_s) / tokens * 1e3, 3),
            "top": [(name, round(n / tokens, 1)) for name, n in diff.most_common(15)]}


def cmd_ops(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    target = load_model(args.target, dtype=args.dtype, weight_dtype=args.weight_dtype, fast=False,
                        fixed_rows=args.fixed_rows)
    out = {"target": args.target, "dtype": args.dtype, "weight_dtype": args.weight_dtype,
           "fixed_rows": args.fixed_rows, "tokens": args.tokens, **per_step(target, args.tokens)}
    print(f"bench ops: {args.target} eager (fast=False), {args.dtype} activations, {args.weight_dtype} weights, "
          f"fixed rows {args.fixed_rows}: {out['aten_per_step']} aten:: events and "
          f"{out['host_ms_per_step']} ms per plain decode step")
    for name, n in out["top"]:
        print(f"  {n:8.1f}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("ops", help="aten:: operators and host time per plain decode step on the eager path "
                                    "(what a GPU step launches)",
                        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct", help="the model (default: %(default)s)")
    ap.add_argument("--dtype", default="bf16", help="activations (default: %(default)s)")
    ap.add_argument("--weight-dtype", default="bf16", help="weights (default: %(default)s)")
    ap.add_argument("--fixed-rows", default="auto", help="load_model's fixed_rows (default: %(default)s: on for "
                                                        "bf16 activations)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps counted (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.set_defaults(func=cmd_ops)

