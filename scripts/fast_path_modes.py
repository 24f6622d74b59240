#!/usr/bin/env python
"""Whole-model step costs on the CPU per runtime mode: the target's pass over 1..9 tokens, v(γ), and the draft's step.

    python scripts/fast_path_modes.py                  # bundled pair, 1 thread
    python scripts/fast_path_modes.py --context 400    # a longer KV cache

Modes: eager PyTorch (models loaded with ``fast=False``: F.linear, eager layer ops); fused
decode ops with the small-M kernel on its AVX2 and AVX-512 paths (``matmul="fp32"``, exact fp32
products); and the bf16-dot mode (``matmul="bf16"``, the default). A path this CPU lacks (AVX-512
on an AVX2-only CPU, or every fast path where the kernel cannot build) is shown as absent.
Rounds alternate the modes so background load hits all alike; each number is the minimum over
rounds of the median of ``--reps`` passes, in thread CPU time. The draft step is timed as the
engine drafts: a run of 4 steps right after a target pass, over the full vocabulary and over the
draft's restricted one (its draft_vocab.json, if any).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch

from specdecode.drafters.vocab import DraftVocab, draft_vocab_for
from specdecode.kernels import Kernels, select_kernels, set_kernel_isa, supported_isas
from specdecode.models import Model, load_model

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9)


@dataclass(frozen=True)
class Mode:
    name: str
    isa: Optional[str]  # the kernel's code path ("auto": the best here); None for eager
    matmul: str


MODES = (Mode("eager", None, "fp32"), Mode("avx2", "avx2", "fp32"), Mode("avx512", "avx512", "fp32"),
         Mode("bf16-dot", "auto", "bf16"))


def available(mode: Mode) -> bool:
    """Whether this CPU (and a kernel that built) can run the mode."""
    return mode.isa is None or (mode.isa == "auto" and bool(supported_isas())) or mode.isa in supported_isas()


def kernels_for(mode: Mode) -> Kernels:
    """The mode's kernels for the fast models; the kernel's code path is the extension's, set here."""
    set_kernel_isa(mode.isa or "auto")
    return select_kernels(True, mode.matmul, torch.device("cpu"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--draft", default="models/code-draft")
    ap.add_argument("--context", type=int, default=192, help="tokens already in the KV cache")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    modes = [m for m in MODES if available(m)]
    target, draft = load_model(args.target), load_model(args.draft)  # fast when the kernel builds: bf16 weights kept
    eager_target, eager_draft = (load_model(p, weight_dtype="fp32", fast=False) for p in (args.target, args.draft))
    subsets = {id(m): draft_vocab_for(m, "auto") for m in (draft, eager_draft)}
    n_sub = next((v.size for v in subsets.values() if v is not None), None)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(1, target.vocab_size, (1, args.context), generator=gen)
    probe = torch.randint(1, target.vocab_size, (1, max(WIDTHS)), generator=gen)
    best: dict[tuple[str, str, int], float] = {}
    for _ in range(args.rounds):
        for mode in modes:
            t, d = (eager_target, eager_draft) if mode.isa is None else (target, draft)
            if mode.isa is not None:
                t.kernels = d.kernels = kernels_for(mode)
            time_mode(mode.name, t, d, subsets[id(d)], ctx, probe, args.reps, best)
    print(f"context {args.context} tokens, 1 thread, min over {args.rounds} rounds of the median of {args.reps}")
    vocab = f"top {n_sub}" if n_sub else "no draft_vocab.json"
    head = ("| mode | target, 1 token (ms) | " + " | ".join(f"v({n - 1})" for n in WIDTHS[1:])
            + f" | draft step, full vocab (ms) | c | draft step, {vocab} (ms) | c |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode in MODES:
        if mode not in modes:
            print(f"| {mode.name} | " + " | ".join(["absent"] * (head.count("|") - 2)) + " |")
            continue
        t1 = best[(mode.name, "t", 1)]
        vs = " | ".join(f"{best[(mode.name, 't', n)] / t1:.2f}" for n in WIDTHS[1:])
        d1, dv = best[(mode.name, "d", 1)], best[(mode.name, "dv", 1)]
        print(f"| {mode.name} | {t1 * 1e3:.3f} | {vs} | {d1 * 1e3:.3f} | {d1 / t1:.3f} | {dv * 1e3:.3f} | {dv / t1:.3f} |")
    absent = [m.name for m in MODES if m not in modes]
    if absent:
        print(f"absent here: {', '.join(absent)} (this CPU's kernel paths: {', '.join(supported_isas()) or 'none'})")


def time_mode(name: str, t: Model, d: Model, sub: Optional[DraftVocab], ctx: torch.Tensor, probe: torch.Tensor, reps: int,
              best: dict[tuple[str, str, int], float]) -> None:
    """One round of one mode: target passes over each width, then draft runs after a target pass."""
    tc, dc = t.new_cache(1, ctx.shape[1] + 16), d.new_cache(1, ctx.shape[1] + 16)
    t.forward(ctx, tc)
    d.forward(ctx, dc)
    for n in WIDTHS:
        times = []
        for _ in range(reps):
            s = time.thread_time()
            t.forward(probe[:, :n], tc)
            times.append(time.thread_time() - s)
            tc.trim(n)
        key = (name, "t", n)
        best[key] = min(best.get(key, float("inf")), statistics.median(times))
    for kind, head in (("d", None), ("dv", sub.head if sub is not None else None)):
        times = []
        for _ in range(reps):
            t.forward(probe[:, :1], tc)
            tc.trim(1)
            s = time.thread_time()
            for _ in range(4):
                d.forward(probe[:, :1], dc, last_only=True, head=head)
                dc.trim(1)
            times.append((time.thread_time() - s) / 4)
        best[(name, kind, 1)] = min(best.get((name, kind, 1), float("inf")), statistics.median(times))


if __name__ == "__main__":
    main()
