"""Decode steps alone, ours against llama.cpp's ``llama-bench -n N`` (tg), interleaved round by round.

Why a separate script: ``specdecode bench --llama-cpp`` times prefill plus generation, and on some
machines ``llama-bench`` crashes as soon as it processes a prompt in Q8_0/Q4_0 (docs/lab-notes.md,
the Intel machine); decode alone (``-p 0``) runs. Each round times one ``llama-bench`` run and then
our median single-token step with a warm KV cache (``costmodel.measure_costs``, which also gives
v(1..4)), so slow phases of a noisy machine hit both sides alike. GGUFs come from the bench's cache
(``bench/llamacpp.gguf_path``: converted and quantized on first use).

    python scripts/decode_vs_llamacpp.py --target runs/qwen05b-shape --llama-cpp /work/llamacpp \\
        --formats bf16,int8,int4 --threads 1 --rounds 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import torch

from specdecode.bench.llamacpp import BENCH_BIN, gguf_path, locate, parse_llama_bench_json
from specdecode.costmodel import measure_costs
from specdecode.models import load_model

GGUF_FORMAT = {"bf16": "bf16", "int8": "q8_0", "int4": "q4_0"}  # our --weight-dtype -> llama.cpp's type


def llama_tok_s(bench: Path, gguf: Path, threads: int, n_gen: int) -> float:
    """tok/s of one ``llama-bench`` decode-only run (mean over its ``n_gen`` tokens)."""
    out = subprocess.run([str(bench), "-m", str(gguf), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "1",
                          "-o", "json"], capture_output=True, text=True, check=True).stdout
    sample = parse_llama_bench_json(out)[0]
    return n_gen / (statistics.mean(sample.samples_ns) / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/qwen05b-shape", help="Hugging Face checkpoint directory")
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp checkout with its build (scripts/build_llama_cpp.sh)")
    ap.add_argument("--formats", default="bf16,int8,int4", help="our weight formats (llama.cpp: BF16, Q8_0, Q4_0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds per format")
    ap.add_argument("--n-gen", type=int, default=64, help="tokens per llama-bench run")
    ap.add_argument("--json", default=None, help="write every round here")
    args = ap.parse_args()
    build = locate(args.llama_cpp)
    bench = build.binary(BENCH_BIN)
    if bench is None:
        raise SystemExit(f"no {BENCH_BIN} in {build.bin_dir}")
    torch.set_num_threads(args.threads)
    rows = []
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        gguf = gguf_path(build, Path(args.target), GGUF_FORMAT[fmt])
        model = load_model(args.target, weight_dtype=fmt)
        ours, theirs, vs = [], [], []
        for r in range(args.rounds):
            theirs.append(llama_tok_s(bench, gguf, args.threads, args.n_gen))
            costs = measure_costs(model, None, max_gamma=4, reps=15)
            ours.append(1 / costs.target_s[0])
            vs.append([round(v, 3) for v in costs.v[1:5]])
            print(f"{fmt} round {r}: ours {ours[-1]:.1f} tok/s, llama.cpp {theirs[-1]:.1f}, "
                  f"ratio {ours[-1] / theirs[-1]:.2f}, v(1..4) {vs[-1]}", flush=True)
        ratios = [a / b for a, b in zip(ours, theirs)]
        v_med = [round(statistics.median(v[i] for v in vs), 2) for i in range(4)]
        print(f"== {fmt}, {args.threads} thread(s): ours {statistics.median(ours):.1f} tok/s, llama.cpp "
              f"{statistics.median(theirs):.1f}, ours/theirs min/median/max {min(ratios):.2f}/"
              f"{statistics.median(ratios):.2f}/{max(ratios):.2f}; our v(1..4) {v_med}", flush=True)
        rows.append({"format": fmt, "gguf": GGUF_FORMAT[fmt], "threads": args.threads, "ours_tok_s": ours,
                     "llamacpp_tok_s": theirs, "v1_4": vs, "kernels": model.kernels.describe(),
                     "llama_cpp": build.version})
        del model
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
