"""Plain decode speed, ours against llama.cpp's, on the same GGUF files: interleaved, decode only.

    specdecode bench llamacpp-decode --llama-cpp DIR --gguf A.gguf [--gguf B.gguf ...] \\
        [--threads 1] [--context 512] [--n 128] [--rounds 3] [--json OUT.json]

Each round runs, per file, ours then llama.cpp (A B A B ...), each in its own process:

* **ours**: ``load_model(FILE)`` (Q8_0/Q4_0 read into our int8/int4 kernels as stored), a warm-up,
  then one greedy run of ``--n`` tokens (EOS ignored) after a ``--context``-token prompt; tok/s =
  n / the run's decode time (``GenerationStats.decode_s``: the n one-token passes, prefill excluded).
* **llama.cpp**: ``llama-bench -m FILE -t T -p 0 -n N -d C -r 1 -o json``: its ``tg`` test, n one-token
  passes after a C-token context (``-d``, untimed), after llama-bench's own warm-up run.

Both time the same thing: n decode steps at a context of C..C+n tokens, load and prefill excluded.
Prints per file and round the two tok/s and the ratio ours / theirs, then min / median / max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ..engine import generate
from ..models import load_model
from .llamacpp import BENCH_BIN, locate


def ours(gguf: str, threads: int, context: int, n: int) -> dict[str, Any]:
    """One timed run in this process (the child side)."""
    torch.set_num_threads(threads)

    model = load_model(gguf)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, min(vocab, 30000), (context,), generator=g).tolist()
    generate(model, prompt[:64], max_new_tokens=8, ignore_eos=True)  # warm-up: first-call allocations
    r = generate(model, prompt, max_new_tokens=n, ignore_eos=True)
    s = r.stats
    return {"tokens": s.generated_tokens, "decode_s": s.decode_s, "prefill_s": s.prefill_s,
            "tokens_per_s": s.generated_tokens / s.decode_s, "weight_format": model.weight_format,
            "threads": torch.get_num_threads()}


def _ours_child(gguf: str, threads: int, context: int, n: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specdecode.bench.llamacpp_decode", "--child", gguf, "--threads", str(threads),
           "--context", str(context), "--n", str(n)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"ours on {gguf} failed: {p.stderr[-1500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def theirs(bench: Path, gguf: str, threads: int, context: int, n: int) -> dict[str, Any]:
    cmd = [str(bench), "-m", gguf, "-t", str(threads), "-p", "0", "-n", str(n), "-d", str(context), "-r", "1",
           "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"llama-bench on {gguf} failed: {(p.stdout + p.stderr)[-1500:]}")
    tests = json.loads(p.stdout[p.stdout.index("["):])
    t = next(x for x in tests if x["n_gen"] == n)
    return {"tokens": n, "decode_s": t["samples_ns"][0] / 1e9, "tokens_per_s": n / (t["samples_ns"][0] / 1e9),
            "model_type": t.get("model_type"), "threads": t.get("n_threads"), "cpu_info": t.get("cpu_info"),
            "n_depth": t.get("n_depth")}


def _mmm(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("llamacpp-decode", help="plain decode tok/s, ours against llama.cpp's llama-bench, on the "
                                                "same GGUF files, interleaved",
                        description=__doc__.split("\n\n")[0])
    _add_arguments(ap)
    ap.set_defaults(func=lambda a: run(a, ap))


def main(argv: list[str] | None = None) -> int:
    """``python -m specdecode.bench.llamacpp_decode``: the same command (and its per-run child process)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _add_arguments(ap)
    return run(ap.parse_args(argv), ap)


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--llama-cpp", help="llama.cpp build (scripts/build_llama_cpp.sh) or its bin folder")
    ap.add_argument("--gguf", action="append", default=[], help="GGUF file (repeat for several)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="tokens in the context before decoding")
    ap.add_argument("--n", type=int, default=128, help="tokens decoded")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--child", help=argparse.SUPPRESS)


def run(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    if a.child:
        print(json.dumps(ours(a.child, a.threads, a.context, a.n)))
        return 0
    if not a.llama_cpp or not a.gguf:
        ap.error("--llama-cpp and at least one --gguf are needed")
    bench = locate(a.llama_cpp).binary(BENCH_BIN)
    assert bench is not None
    samples: dict[str, list[dict[str, Any]]] = {g: [] for g in a.gguf}
    print(f"load average {os.getloadavg()[0]:.2f}; {a.threads} thread(s), context {a.context}, {a.n} tokens",
          file=sys.stderr)
    for r in range(a.rounds):
        for g in a.gguf:
            o = _ours_child(g, a.threads, a.context, a.n)
            t = theirs(bench, g, a.threads, a.context, a.n)
            samples[g].append({"round": r, "ours": o, "theirs": t, "ratio": o["tokens_per_s"] / t["tokens_per_s"],
                               "load_average": os.getloadavg()[0]})
            print(f"round {r} {Path(g).name}: ours ({o['weight_format']}) {o['tokens_per_s']:.1f} tok/s, llama.cpp "
                  f"({t['model_type']}) {t['tokens_per_s']:.1f} tok/s, ratio {samples[g][-1]['ratio']:.2f}"
                  f" (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    print(f"{'file':40s} {'ours tok/s min/med/max':>24s} {'llama.cpp tok/s':>24s} {'ours/theirs':>20s}")
    for g, ss in samples.items():
        print(f"{Path(g).name:40s} {_mmm([s['ours']['tokens_per_s'] for s in ss]):>24s} "
              f"{_mmm([s['theirs']['tokens_per_s'] for s in ss]):>24s} {_mmm([s['ratio'] for s in ss]):>20s}")
    if a.json:
        Path(a.json).write_text(json.dumps({"threads": a.threads, "context": a.context, "n": a.n,
                                            "rounds": a.rounds, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
