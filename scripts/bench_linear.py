#!/usr/bin/env python
"""Micro-benchmark: eager F.linear vs specdecode's small-M CPU kernel, M = 1..9 rows.

For each weight shape it prints the median time per call of F.linear and of
fast_linear for M token rows, and both as a ratio to eager's M=1 time: the
verification cost v(gamma) = T(gamma+1 rows) / T(1 row) that speculative
decoding cares about.

By default the weights are "cold": each call uses the next of several copies of
the matrix, cycling through more memory than the L3 cache holds, as a decoder
does when it walks its layers (a model's weights are read once per forward, from
DRAM). ``--hot`` reuses one matrix (it then sits in cache: best case).

    .venv/bin/python scripts/bench_linear.py            # fp32 weights, cold
    .venv/bin/python scripts/bench_linear.py --bf16     # also bf16 weights through the kernel

"fast" is the kernel on its default code path (the best this CPU has, or
SPECDECODE_KERNEL_ISA). Further columns time each code path explicitly, as
"T(v)" with v = T / T(M=1) of that column: avx2 and avx512 with fp32 weights,
and with --bf16 also avx2_b / avx512_b (bf16 weights, fp32 x, exact products)
and dot_b (bf16-dot mode: x rounded to bf16, vdpbf16ps where the CPU has
AVX512_BF16, else the same math on the best path). ``--paths`` picks them
(default: all; a path this CPU lacks, e.g. avx512 on an AVX2-only CPU, shows as
"absent"; "none" for the original table only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specdecode import kernels
from specdecode.kernels import fast_linear, fast_linear_available, supported_isas

# (name, N = out features, K = in features) for a ~25M llama (dim 512, 4 heads x 128 q,
# 4 kv heads) and one 4096 x 4096 layer of a 7B-class model.
SHAPES = [
    ("qkv 512->1024", 1024, 512),
    ("o 512->512", 512, 512),
    ("w13 512->2816", 2816, 512),
    ("w2 1408->512", 512, 1408),
    ("lm_head 512->8192", 8192, 512),
    ("4096->4096", 4096, 4096),
]


def time_call(fn, xs, weights, bias, min_time: float, repeats: int, clock=time.perf_counter,
              stat=statistics.median) -> float:
    """Seconds per call: ``stat`` (median or min) over ``repeats`` runs of >= ``min_time`` seconds each."""
    nw = len(weights)
    for i in range(3):  # warm-up (and thread-pool wake-up)
        fn(xs, weights[i % nw], bias)
    # calibrate the number of calls per run
    n, t = 1, 0.0
    while True:
        t0 = clock()
        for i in range(n):
            fn(xs, weights[i % nw], bias)
        t = clock() - t0
        if t >= min_time / 4 or n >= 1 << 16:
            break
        n *= 2
    n = max(1, int(n * min_time / max(t, 1e-9)))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for i in range(n):
            fn(xs, weights[i % nw], bias)
        samples.append((clock() - t0) / n)
    return stat(samples)


# extra columns: name -> (isa, bf16 weights?, bf16-dot?)
PATHS = {
    "avx2": ("avx2", False, False),
    "avx512": ("avx512", False, False),
    "avx2_b": ("avx2", True, False),
    "avx512_b": ("avx512", True, False),
    "dot_b": ("auto", True, True),
}


def path_fn(ext, isa: str, bf16_dot: bool):
    """The kernel on one code path, called like F.linear on a [1, M, K] x."""
    def fn(x, w, b):
        return ext.smallm_linear(x.view(-1, x.shape[-1]), w, b, bf16_dot=bf16_dot, isa=isa)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-m", type=int, default=9)
    ap.add_argument("--hot", action="store_true", help="one weight copy (cache-resident) instead of cycling copies")
    ap.add_argument("--pool-mb", type=float, default=128.0, help="memory the cold weight copies span (default 128)")
    ap.add_argument("--bf16", action="store_true", help="also time the kernel with bf16 weights (fp32 x)")
    ap.add_argument("--min-time", type=float, default=0.02, help="seconds per timing run")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--stat", choices=["min", "median"], default="min",
                    help="statistic over the timing runs (min resists other processes on a shared CPU)")
    ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                    help="thread: this thread's CPU time (needs --threads 1); ignores time spent preempted")
    ap.add_argument("--shapes", default="", help="comma-separated substrings selecting shapes (default: all)")
    ap.add_argument("--paths", default="auto",
                    help=f"extra per-path columns, comma-separated from {','.join(PATHS)} (auto: all, those this "
                         "CPU lacks shown as absent; none)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.clock == "thread" and args.threads != 1:
        raise SystemExit("--clock thread measures one thread: use it with --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    stat = min if args.stat == "min" else statistics.median
    if not fast_linear_available():
        raise SystemExit("the fast linear kernel is not available here (see the warning above)")
    ext = kernels.load_extension()
    best = ext.best_isa()
    wanted = [] if args.paths == "none" else list(PATHS) if args.paths == "auto" else args.paths.split(",")
    for p in wanted:
        if p not in PATHS:
            raise SystemExit(f"unknown path {p!r}: choose from {', '.join(PATHS)}")
    paths = [p for p in wanted if args.bf16 or not PATHS[p][1]]  # bf16-weight columns need --bf16
    absent = {p for p in paths if PATHS[p][0] != "auto" and PATHS[p][0] not in supported_isas()}
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"weights={'hot (one copy)' if args.hot else f'cold (cycling ~{args.pool_mb:.0f} MB of copies)'}, "
          f"clock={args.clock}, {args.stat} of {args.repeats} runs")
    print(f"kernel: default path {ext.isa()}, best here {best}"
          + (f"; dot_b uses {'vdpbf16ps' if best == 'avx512bf16' else best + ' (no AVX512_BF16)'}" if "dot_b" in paths else "")
          + (f"; absent on this CPU: {', '.join(sorted(absent))}" if absent else ""))
    print("times in microseconds per call; r = T / T_eager(M=1); path columns: T(v), v = T / T(M=1) of that column")

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, n_out, k_in in SHAPES:
            if args.shapes and not any(s.strip() in name for s in args.shapes.split(",")):
                continue
            nbytes = n_out * k_in * 4
            copies = 1 if args.hot else max(2, int(args.pool_mb * 2**20 // nbytes) + 1)
            w32 = [torch.randn(n_out, k_in, generator=gen) * k_in**-0.5 for _ in range(copies)]
            w16 = [w.to(torch.bfloat16) for w in w32] if args.bf16 else []
            head = f"{'M':>3} {'eager':>9} {'fast':>9} {'r_eager':>8} {'r_fast':>8} {'speedup':>8}"
            if args.bf16:
                head += f" {'fast_bf16':>10} {'r_bf16':>7}"
            head += "".join(f" {p:>12}" for p in paths)
            print(f"\n{name}  (N={n_out}, K={k_in}, {copies} weight cop{'y' if copies == 1 else 'ies'})")
            print(head)
            t_eager1 = None
            t_path1: dict[str, float] = {}
            for m in range(1, args.max_m + 1):
                x = torch.randn(1, m, k_in, generator=gen)
                te = time_call(F.linear, x, w32, None, args.min_time, args.repeats, clock, stat)
                tf = time_call(fast_linear, x, w32, None, args.min_time, args.repeats, clock, stat)
                if t_eager1 is None:
                    t_eager1 = te
                row = f"{m:>3} {te * 1e6:>9.1f} {tf * 1e6:>9.1f} {te / t_eager1:>8.2f} {tf / t_eager1:>8.2f} {te / tf:>7.2f}x"
                if args.bf16:
                    tb = time_call(fast_linear, x, w16, None, args.min_time, args.repeats, clock, stat)
                    row += f" {tb * 1e6:>10.1f} {tb / t_eager1:>7.2f}"
                for p in paths:
                    if p in absent:
                        row += f" {'absent':>12}"
                        continue
                    isa, narrow, dot = PATHS[p]
                    tp = time_call(path_fn(ext, isa, dot), x, w16 if narrow else w32, None, args.min_time,
                                   args.repeats, clock, stat)
                    t_path1.setdefault(p, tp)
                    row += f" {f'{tp * 1e6:.1f}({tp / t_path1[p]:.2f})':>12}"
                print(row, flush=True)
            del w32, w16


if __name__ == "__main__":
    main()
