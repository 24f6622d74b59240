"""Measure the draft/target cost ratio c: time of one single-token decode step of each, KV cache warm.

    python scripts/measure_cost_ratio.py --target models/code-target --draft models/code-draft

Target and draft steps are interleaved so background load affects both alike;
the medians' ratio is c (Leviathan et al.'s cost coefficient).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdecode.cli import model_loader
from specdecode.config import ModelLoadConfig, add_dataclass_args, from_args
from specdecode.drafters.vocab import draft_vocab_for, parse_vocab_spec


def step_time(model, ctx: int, cache, head=None) -> float:
    tok = torch.tensor([[5]], device=model.device)
    cache.set_length(ctx)
    t = time.perf_counter()
    model.forward(tok, cache, head=head)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--draft", default="models/code-draft")
    add_dataclass_args(ap, ModelLoadConfig)  # --device, --dtype, --matmul, --no-fast-linear ...
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=128, help="tokens already in the KV cache")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--draft-vocab", default="auto",
                    help="the draft's output vocabulary: auto (its draft_vocab.json cut), full, or N (default: auto)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = from_args(ModelLoadConfig, args)
    load = model_loader(cfg)  # the CLI's runtime: fast kernel and fused ops unless --no-fast-linear
    models = {name: load(path) for name, path in (("target", args.target), ("draft", args.draft))}
    vocab = draft_vocab_for(models["draft"], parse_vocab_spec(args.draft_vocab))
    heads = {"target": None, "draft": vocab.head if vocab is not None else None}
    caches = {}
    for name, m in models.items():
        caches[name] = m.new_cache(1, args.context + 1)
        m.forward(torch.randint(1, m.vocab_size, (1, args.context), device=m.device), caches[name])
    times: dict[str, list[float]] = {n: [] for n in models}
    for i in range(args.reps + 20):
        for name, m in models.items():
            t = step_time(m, args.context, caches[name], heads[name])
            if i >= 20:
                times[name].append(t)
    med = {n: statistics.median(v) for n, v in times.items()}
    out = {"target_ms": med["target"] * 1e3, "draft_ms": med["draft"] * 1e3, "c": med["draft"] / med["target"],
           "threads": torch.get_num_threads(), "device": cfg.device, "matmul": cfg.matmul,
           "kernels": {n: m.kernels.describe() for n, m in models.items()},  # what each model ran with "context": args.context, "reps": args.reps,
           "draft_vocab": vocab.size if vocab is not None else models["draft"].vocab_size,
           "target_params": models["target"].num_parameters(), "draft_params": models["draft"].num_parameters()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
