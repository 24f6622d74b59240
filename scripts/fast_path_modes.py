#!/usr/bin/env python
"""Whole-model step costs on the CPU per runtime mode: the target's pass over 1..9 tokens, v(γ), and the draft's step.

    python scripts/fast_path_modes.py                  # bundled pair, 1 thread
    python scripts/fast_path_modes.py --context 400    # a longer KV cache

Modes: eager PyTorch (F.linear, eager layer ops); fused decode ops with the small-M kernel
on its AVX2 and AVX-512 paths (exact fp32 products); and the bf16-dot mode (``--matmul
bf16``, the CLI default). Rounds alternate the modes so background load hits all alike; each
number is the minimum over rounds of the median of ``--reps`` passes, in thread CPU time.
The draft step is timed as the engine drafts: a run of 4 steps right after a target pass,
over the full vocabulary and over the draft's restricted one (its draft_vocab.json, if any).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdecode import ops
from specdecode.kernels import enable_fast_linear, fast_linear_available, set_kernel_isa
from specdecode.kernels.fused import enable_fused_ops
from specdecode.drafters.vocab import draft_vocab_for
from specdecode.models import load_model

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9)


def set_mode(mode: str) -> None:
    if mode == "eager":
        ops.set_linear_impl(None)
        enable_fused_ops(False)
        return
    isa, dot = {"avx2": ("avx2", False), "avx512": ("avx512", False), "bf16-dot": ("auto", True)}[mode]
    set_kernel_isa(isa)
    enable_fast_linear(True, bf16_dot=dot)
    enable_fused_ops(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--draft", default="models/code-draft")
    ap.add_argument("--context", type=int, default=192, help="tokens already in the KV cache")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not fast_linear_available():
        raise SystemExit("the fast kernel cannot be built here")
    enable_fast_linear(True)  # load with bf16 weights kept (weight_dtype auto)
    target, draft = load_model(args.target), load_model(args.draft)
    eager_target, eager_draft = (load_model(p, weight_dtype="fp32") for p in (args.target, args.draft))
    subsets = {id(m): draft_vocab_for(m, "auto") for m in (draft, eager_draft)}
    n_sub = next((v.size for v in subsets.values() if v is not None), None)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(1, target.vocab_size, (1, args.context), generator=gen)
    probe = torch.randint(1, target.vocab_size, (1, max(WIDTHS)), generator=gen)
    modes = ["eager", "avx2", "avx512", "bf16-dot"]
    best: dict[tuple[str, str, int], float] = {}
    for _ in range(args.rounds):
        for mode in modes:
            set_mode(mode)
            t, d = (eager_target, eager_draft) if mode == "eager" else (target, draft)
            tc, dc = t.new_cache(1, args.context + 16), d.new_cache(1, args.context + 16)
            t.forward(ctx, tc)
            d.forward(ctx, dc)
            for n in WIDTHS:
                times = []
                for _ in range(args.reps):
                    s = time.thread_time()
                    t.forward(probe[:, :n], tc)
                    times.append(time.thread_time() - s)
                    tc.trim(n)
                key = (mode, "t", n)
                best[key] = min(best.get(key, float("inf")), statistics.median(times))
            sub = subsets[id(d)]
            for kind, head in (("d", None), ("dv", sub.head if sub is not None else None)):
                times = []
                for _ in range(args.reps):
                    t.forward(probe[:, :1], tc)
                    tc.trim(1)
                    s = time.thread_time()
                    for _ in range(4):
                        d.forward(probe[:, :1], dc, last_only=True, head=head)
                        dc.trim(1)
                    times.append((time.thread_time() - s) / 4)
                best[(mode, kind, 1)] = min(best.get((mode, kind, 1), float("inf")), statistics.median(times))
    print(f"context {args.context} tokens, 1 thread, min over {args.rounds} rounds of the median of {args.reps}")
    vocab = f"top {n_sub}" if n_sub else "no draft_vocab.json"
    head = ("| mode | target, 1 token (ms) | " + " | ".join(f"v({n - 1})" for n in WIDTHS[1:])
            + f" | draft step, full vocab (ms) | c | draft step, {vocab} (ms) | c |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode in modes:
        t1 = best[(mode, "t", 1)]
        vs = " | ".join(f"{best[(mode, 't', n)] / t1:.2f}" for n in WIDTHS[1:])
        d1, dv = best[(mode, "d", 1)], best[(mode, "dv", 1)]
        print(f"| {mode} | {t1 * 1e3:.3f} | {vs} | {d1 * 1e3:.3f} | {d1 / t1:.3f} | {dv * 1e3:.3f} | {dv / t1:.3f} |")


if __name__ == "__main__":
    main()
