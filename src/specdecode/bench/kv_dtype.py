"""`specdecode bench kv-dtype`: decode step time against context length, per KV-cache storage dtype.

What ``load_model(..., kv_dtype=)`` / ``--kv-dtype`` buys at long contexts, where a decode step reads
the whole cache. Each context length is timed as single-token steps over a cache filled to that
length (random keys and values: a step's cost does not depend on them), the storage dtypes
alternating step by step (A B B A ...) so a noisy machine's slow phases hit both alike; the speedup
is the median of the per-pair ratios.

    specdecode bench kv-dtype [--target smollm2-135m-instruct] [--weight-dtype int4] \\
        [--contexts 512,2048,4096,8160] [--kv fp32,fp16] [--pairs 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..cache import KVCache
from ..config import ConfigError
from ..models import load_model
from .flags import parse_int_list

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("kv-dtype", help="decode step time per KV-cache storage dtype at several context lengths",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="model (default: %(default)s)")
    p.add_argument("--weight-dtype", default="int4", help="its weight format (default: %(default)s)")
    p.add_argument("--contexts", default="512,2048,4096,8160", help="cache lengths timed (default: %(default)s)")
    p.add_argument("--kv", default="fp32,fp16", help="two storage dtypes to compare: fp32, fp16, bf16 "
                                                     "(default: %(default)s)")
    p.add_argument("--pairs", type=int, default=40, help="timed step pairs per context (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    p.set_defaults(func=cmd_kv_dtype)


def cmd_kv_dtype(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.kv.split(",") if n.strip()]
    if len(names) != 2 or any(n not in DTYPES for n in names):
        raise ConfigError(f"--kv: two of {', '.join(DTYPES)}, comma-separated; got {args.kv!r}")
    ctxs = parse_int_list(args.contexts, "--contexts")
    torch.set_num_threads(args.threads)
    model = load_model(args.target, weight_dtype=args.weight_dtype)
    c = model.config
    size = min(model.max_seq_len, max(ctxs) + 1)
    g = torch.Generator().manual_seed(0)
    caches = {}
    for n in names:
        cache = KVCache(c.n_layers, 1, c.n_kv_heads, size, c.head_dim, DTYPES[n], model.device)
        cache.k.copy_(torch.randn(cache.k.shape, generator=g))
        cache.v.copy_(torch.randn(cache.v.shape, generator=g))
        caches[n] = cache
    tok = torch.tensor([[42]])
    print(f"{args.target} ({model.weight_format} weights), {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.1f}")
    with torch.inference_mode():
        for x in ctxs:
            ts: dict[str, list[float]] = {n: [] for n in names}
            for n in names:  # warm
                caches[n].lengths[0] = x
                model.forward(tok, caches[n])
            for i in range(args.pairs):
                for n in names if i % 2 == 0 else names[::-1]:
                    caches[n].lengths[0] = x
                    t0 = time.perf_counter()
                    model.forward(tok, caches[n])
                    ts[n].append(time.perf_counter() - t0)
            ratio = statistics.median(a / b for a, b in zip(ts[names[0]], ts[names[1]]))
            cols = "  ".join(f"{n} {1 / statistics.median(ts[n]):6.1f} tok/s" for n in names)
            print(f"context {x:5d}: {cols}  {names[1]} vs {names[0]}: {ratio:.2f}x")
    for n in names:
        per_token = c.n_layers * c.n_kv_heads * c.head_dim * 2 * caches[n].k.element_size()
        print(f"{n}: {per_token} KV bytes per token ({per_token * size / 2**20:.0f} MiB at {size} tokens)")
    return 0
