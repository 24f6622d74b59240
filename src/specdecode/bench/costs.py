"""`specdecode bench costs`: v(n) of the target's verify pass per weight format, kernel path and thread count.

v(n) = time of a target pass over n new tokens / time of a one-token pass (a decode step), with the
engine's own forward calls on a warm cache (``sizing.costs.measure_costs``, the figures ``gamma="auto"``
uses). Speculation pays only while v stays low: verifying a draft of gamma tokens costs v(gamma + 1)
decode steps. So anyone can check on their own CPU how the bf16, int8 and int4 paths, and each SIMD
path the kernels offer there (``--isas``), price a verification pass. Paths are timed round by round in
alternating order in one process, the median kept, so background load hits every path alike; with
1 thread the timer is this thread's CPU time. With ``--draft`` each row also gives c, a draft model's
step (over its ``draft_vocab.json`` cut, as the drafter runs it) over the target's one-token pass.
With ``--floor`` each int8/int4 row also gives the kernel's arithmetic floor per token row (``arithmetic_floor``)
and the lower bound on v(n) it sets, whatever the memory system does.

    specdecode bench costs [--target DIR] [--formats bf16,int8,int4] [--threads 1,2] [--max-tokens 16]
    specdecode bench costs --draft models/code-draft --formats bf16 --json runs/cost.json
    specdecode bench costs --target smollm2-135m-instruct --formats int8,int4 --isas avx2 --floor
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, Optional

import torch

from ..cli import resolve_target
from ..config import ConfigError
from ..drafters.vocab import draft_vocab_for
from ..kernels import fast_linear_available, set_kernel_isa, supported_isas
from ..kernels.quant import load_quant_extension, quantize, set_quant_isa
from ..models import load_model
from ..sizing.costs import measure_costs
from .flags import parse_int_list

FORMATS = ("bf16", "int8", "int4")


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    c = sub.add_parser("costs", help="v(1..16) of a verify pass per weight format and kernel path (this CPU)",
                       description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--target", help="target model directory (default: bundled models/code-target)")
    c.add_argument("--draft", help="also time this draft model's step: c = draft step / one-token target pass")
    c.add_argument("--formats", default=",".join(FORMATS), help="weight formats (default: %(default)s)")
    c.add_argument("--isas", default=None,
                   help="kernel paths to compare, comma-separated, for each format where the CPU has them: "
                        "bf16: avx2, avx512, avx512bf16, amx; int8/int4: avx2, avxvnni, vnni512; 'auto' = the best "
                        "(default: every SIMD path this CPU has)")
    c.add_argument("--threads", default="1", help="torch thread counts, comma-separated (default: %(default)s)")
    c.add_argument("--max-tokens", type=int, default=16, help="widest pass timed, in new tokens (default: 16)")
    c.add_argument("--context", type=int, default=200, help="tokens already in the cache (default: 200)")
    c.add_argument("--rounds", type=int, default=3, help="rounds over the paths, alternating order (default: 3)")
    c.add_argument("--reps", type=int, default=5, help="timed samples per pass width per round (default: 5)")
    c.add_argument("--floor", action="store_true",
                   help="int8/int4: also time the kernel's arithmetic per token row with the weights resident in "
                        "L2 (no memory traffic) and print the lower bound on v(n) it sets")
    c.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    c.set_defaults(func=cmd_costs)


def _paths(fmt: str, wanted: Optional[list[str]]) -> list[str]:
    """This CPU's SIMD paths for ``fmt``'s kernel (or the wanted ones it has, 'auto' always)."""
    if fmt == "bf16":
        have = [i for i in supported_isas() if i != "scalar"] or ["auto"]
    else:
        have = [i for i in load_quant_extension().supported_isas() if i != "scalar"] or ["auto"]
    if wanted is None:
        return have
    return [i for i in wanted if i in have or i == "auto"]


def _set_path(fmt: str, isa: str) -> None:
    if fmt == "bf16":
        if fast_linear_available():
            set_kernel_isa(isa)
    else:
        set_quant_isa(isa)


def arithmetic_floor(macs: int, dim: int, fmt: str, isa: str, calls: int = 200, rounds: int = 7) -> float:
    """Seconds of the quantized kernel's arithmetic per token row for ``macs`` multiply-adds a token: the
    marginal cost of a row (16 rows against 8) on one [1024, dim] matrix that stays in L2, scaled up.

    Why: with no weight traffic left, what a further row costs is its integer dot products, their
    conversions and scaling; a pass over n rows does n rows of that, so n * floor / (one-token pass)
    bounds v(n) from below however well loads and arithmetic overlap."""
    ext = load_quant_extension()
    gen = torch.Generator().manual_seed(0)
    w = quantize(torch.randn(1024, dim, generator=gen) * 0.02, fmt)
    per_m: dict[int, float] = {}
    for m in (8, 16):
        x = torch.randn(m, dim, generator=gen)
        for _ in range(calls // 4):
            ext.quant_linear(x, w, None, isa)
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                ext.quant_linear(x, w, None, isa)
            samples.append((time.perf_counter() - t0) / calls)
        per_m[m] = statistics.median(samples)
    return max(0.0, per_m[16] - per_m[8]) / 8 / (1024 * dim) * macs


def measure(target: str, formats: list[str], isas: Optional[list[str]], threads: list[int], max_tokens: int,
            context: int, rounds: int, reps: int, log: Callable[[str], None] = print,
            draft: Optional[str] = None, floor: bool = False) -> list[dict[str, Any]]:
    """One row per (format, path, threads): median seconds of passes over 1..max_tokens new tokens and v(n)
    (with ``draft``: also its step's median seconds and c; with ``floor``: int8/int4 rows also give
    ``arithmetic_floor`` and the bound n * floor / one-token pass on v(n))."""
    draft_model = load_model(draft) if draft else None
    cut = draft_vocab_for(draft_model) if draft_model is not None else None
    draft_head = cut.head if cut is not None else None

    rows: list[dict[str, Any]] = []
    before = torch.get_num_threads()
    try:
        for fmt in formats:
            model = load_model(target, weight_dtype=fmt)
            ids = [(300 + i) % model.vocab_size for i in range(context)]
            paths = _paths(fmt, isas)
            if not paths:
                log(f"{fmt}: none of the paths {','.join(isas or [])} runs on this CPU; skipped")
                continue
            for nt in threads:
                torch.set_num_threads(nt)
                times: dict[str, list[tuple[float, ...]]] = {p: [] for p in paths}
                draft_times: dict[str, list[float]] = {p: [] for p in paths}
                for r in range(rounds):
                    for isa in paths if r % 2 == 0 else paths[::-1]:
                        _set_path(fmt, isa)
                        c = measure_costs(model, draft_model, max_gamma=max_tokens - 1, reps=reps, context=ids,
                                          draft_head=draft_head)
                        times[isa].append(tuple(c.target_s))
                        if c.draft_s is not None:
                            draft_times[isa].append(c.draft_s)
                for isa in paths:
                    med = [statistics.median(t[n] for t in times[isa]) for n in range(max_tokens)]
                    row = {"format": fmt, "isa": isa, "threads": nt, "pass_s": med,
                           "v": [m / med[0] for m in med], "kernels": model.kernels.describe()}
                    if draft_times[isa]:
                        step = statistics.median(draft_times[isa])
                        row.update(draft_step_s=step, c=step / med[0])
                    if floor and model.quant is not None:
                        macs = sum(model.quant.logical.values()) + model.output_matrix().numel()
                        row_s = arithmetic_floor(macs, model.config.dim, fmt, isa)
                        row.update(floor_row_s=row_s, macs_per_token=macs,
                                   v_floor=[max(1.0, n * row_s / med[0]) for n in range(1, max_tokens + 1)])
                    rows.append(row)
                _set_path(fmt, "auto")
            del model
    finally:
        torch.set_num_threads(before)
    return rows


def format_table(rows: list[dict[str, Any]], max_tokens: int) -> str:
    head = (f"{'format':<7}{'path':<12}{'thr':>4}{'1-token ms':>11}  "
            + " ".join(f"{n:>5d}" for n in range(2, max_tokens + 1)))
    lines = [head, f"{'':<34}v(n): a pass over n new tokens / a one-token pass"]
    for r in rows:
        lines.append(f"{r['format']:<7}{r['isa']:<12}{r['threads']:>4}{1e3 * r['pass_s'][0]:>11.2f}  "
                     + " ".join(f"{v:5.2f}" for v in r["v"][1:])
                     + (f"   c {r['c']:.4f} (draft step {1e3 * r['draft_step_s']:.3f} ms)" if "c" in r else ""))
        if "v_floor" in r:
            lines.append(f"{'':<7}{'floor':<12}{'':>4}{1e3 * r['floor_row_s']:>11.2f}  "
                         + " ".join(f"{v:5.2f}" for v in r["v_floor"][1:])
                         + f"   (arithmetic per row, {r['macs_per_token'] / 1e6:.0f}M multiply-adds, weights in L2)")
    return "\n".join(lines)


def cmd_costs(args: argparse.Namespace) -> int:
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ConfigError(f"--formats: unknown {', '.join(bad)}; use some of {', '.join(FORMATS)}")
    if args.max_tokens < 2:
        raise ConfigError("--max-tokens must be at least 2")
    isas = [i.strip() for i in args.isas.split(",") if i.strip()] if args.isas else None
    threads = parse_int_list(args.threads, "--threads")
    target = resolve_target(args)
    rows = measure(target, formats, isas, threads, args.max_tokens, args.context, args.rounds, args.reps,
                   draft=args.draft, floor=args.floor)
    print(f"{target}: {args.context}-token context, median of {args.rounds} rounds x {args.reps} samples")
    print(format_table(rows, args.max_tokens))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": target, "draft": args.draft, "context": args.context, "rows": rows}, f, indent=2)
    return 0
